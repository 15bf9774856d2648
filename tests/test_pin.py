"""pin_memory: torch's pinning rule, the fallbacks without an accelerator, pinned slots.

What needs no GPU runs everywhere: the container and custom-type rule against torch's own
``pin_memory`` function, the one warning and unpinned batches without an accelerator (for
0, thread and process workers, as torch), ``pin_memory_device`` checks, and that slot
registration never starts without CUDA. The tests marked ``cuda`` run where CUDA is:
every leaf pinned, slots registered once and batches not copied, the device honoured.
"""

from __future__ import annotations

import collections
import warnings
from typing import Any

import numpy as np
import pytest

import stoker
from gpu.run_gpu_checks import DictSamples, Pair, copies_read_their_own_batch, tensor_leaves
from stoker._engine import _pin, _segments

torch = pytest.importorskip("torch")
from torch.utils.data._utils.pin_memory import pin_memory as torch_pin  # noqa: E402

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA: pinned memory is a CUDA feature")
MODES: list[tuple[int, str | None]] = [(0, None), (2, "thread"), (2, "process")]


class Pinnable:
    """A batch part with its own pin_memory(), as torch's rule allows."""

    def __init__(self, value: int) -> None:
        self.value = value
        self.pinned = False

    def pin_memory(self) -> Pinnable:
        out = Pinnable(self.value)
        out.pinned = True
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Pinnable) and (other.value, other.pinned) == (
            self.value,
            self.pinned,
        )

    __hash__ = None  # type: ignore[assignment]


class Tagged(dict):  # type: ignore[type-arg]
    """A dict subclass with an attribute its constructor does not set."""

    tag = "class"


class Items(list):  # type: ignore[type-arg]
    pass


def _structure(x: Any) -> Any:
    """What a user observes of a pinned batch: types, values, attributes, recursively."""
    if isinstance(x, np.ndarray):
        return ("ndarray", x.dtype.str, x.tolist())
    if isinstance(x, dict):
        return (type(x).__name__, getattr(x, "tag", None), {k: _structure(v) for k, v in x.items()})
    if isinstance(x, (list, tuple, range)):
        return (type(x).__name__, [_structure(v) for v in x])
    return (type(x).__name__, x)


def _batch() -> Any:
    tagged = Tagged(a=Pinnable(1))
    tagged.tag = "instance"
    return {
        "custom": Pinnable(0),
        "pair": Pair(Pinnable(2), [Pinnable(3), "text"]),
        "tagged": tagged,
        "ordered": collections.OrderedDict(b=Pinnable(4)),
        "default": collections.defaultdict(list, c=[Pinnable(5)]),
        "items": Items([Pinnable(6), b"raw"]),
        "tuple": (Pinnable(7), 8),
        "range": range(3),
        "array": np.arange(3),
    }


def test_pin_follows_torchs_rule_for_containers_and_custom_types() -> None:
    """Differential: stoker's pin gives what torch's pin_memory gives, type for type: each
    pin_memory() called, namedtuples, mapping and sequence subclasses kept (with their
    attributes), strings, bytes, ranges and arrays left as they are."""
    batch = _batch()
    ours, theirs = _pin.pin(batch, "cuda"), torch_pin(_batch(), "cuda")
    assert _structure(ours) == _structure(theirs)
    assert ours["custom"].pinned and ours["pair"].second[0].pinned
    assert not batch["custom"].pinned  # the input is not changed
    assert (
        type(ours["default"]) is collections.defaultdict and ours["default"].default_factory is list
    )
    assert ours["tagged"].tag == "instance"


@pytest.mark.skipif(CUDA, reason="checks the fallback without an accelerator")
@pytest.mark.parametrize(("workers", "mode"), MODES)
def test_without_an_accelerator_one_warning_and_unpinned_batches(
    workers: int, mode: str | None
) -> None:
    """As torch: pin_memory=True without an accelerator warns (a UserWarning naming
    pin_memory) and gives the unpinned batches; stoker warns once per loader, over two
    epochs, and never starts registering slots."""
    ds = stoker.TensorDataset(np.arange(24, dtype=np.float32).reshape(12, 2))
    kw: dict[str, Any] = {} if mode is None else {"worker_mode": mode}
    loader = stoker.DataLoader(
        ds, batch_size=4, num_workers=workers, pin_memory=True, tensor_type="torch", **kw
    )
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        it = iter(loader)
        if mode == "process":
            assert all(w.slots.maps.pins is None for w in it._pool.workers)  # type: ignore[attr-defined]
        first = list(it)
        second = list(loader)
    ours = [w for w in seen if "pin_memory" in str(w.message)]
    assert len(ours) == 1 and ours[0].category is UserWarning
    assert "no accelerator" in str(ours[0].message)
    plain = list(stoker.DataLoader(ds, batch_size=4, tensor_type="torch"))
    for got in (first, second):
        assert [b[0].tolist() for b in got] == [b[0].tolist() for b in plain]
        assert not any(b[0].is_pinned() for b in got)
    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter("always")
        torch_batches = list(torch.utils.data.DataLoader(ds, batch_size=4, pin_memory=True))
    assert any(w.category is UserWarning and "pin_memory" in str(w.message) for w in theirs)
    assert [b[0].tolist() for b in torch_batches] == [b[0].tolist() for b in plain]


@pytest.mark.parametrize("name", ["xpu", "cpu", "not a device"])
def test_pin_memory_device_must_name_the_current_accelerator(name: str) -> None:
    """pin_memory_device naming another device than the accelerator's is a ValueError that
    says what must hold, and what to write instead."""
    with pytest.raises(ValueError, match="pin_memory_device must") as err:
        _pin._checked_device(torch, name, "cuda")
    assert repr(name) in str(err.value) and "leave it ''" in str(err.value)


def test_pin_memory_device_index_must_exist() -> None:
    """A device index past the accelerator's count is refused with the count."""
    count = torch.accelerator.device_count()
    with pytest.raises(ValueError, match="must name an existing device"):
        _pin._checked_device(torch, f"cuda:{count}", "cuda")


def test_slots_are_registered_only_for_cuda() -> None:
    """No pinning, or an accelerator other than CUDA: no slot registration (nothing of
    CUDA is called), and slot maps free their slots directly."""
    assert _pin.slot_pins(None) is None
    assert _pin.slot_pins("mps") is None
    maps = _segments.SegmentMaps()

    def free(sid: int) -> None:
        pass

    assert maps.freeing("stoker_none", free) is free


# -- on CUDA ----------------------------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize(("workers", "mode"), MODES)
def test_every_tensor_leaf_is_pinned(workers: int, mode: str | None) -> None:
    """pin_memory=True: every tensor leaf of every batch is pinned, for 0, thread and
    process workers, through dicts and namedtuples; values as unpinned."""
    kw: dict[str, Any] = {} if mode is None else {"worker_mode": mode}
    pinned = stoker.DataLoader(
        DictSamples(), batch_size=8, num_workers=workers, pin_memory=True, **kw
    )
    plain = stoker.DataLoader(DictSamples(), batch_size=8, num_workers=workers, **kw)
    for got, want in zip(pinned, plain, strict=True):
        leaves = tensor_leaves(got)
        assert leaves and all(leaf.is_pinned() for leaf in leaves)
        assert all(torch.equal(a, b) for a, b in zip(leaves, tensor_leaves(want), strict=True))


@needs_cuda
def test_process_slots_are_registered_once_and_batches_not_copied() -> None:
    """Process workers: each slot is registered once; batch leaves are views of it (pinned
    with no copy: their memory lies inside the slot), and a copy to the GPU is exact."""
    ds = stoker.TensorDataset(torch.arange(64 * 1024, dtype=torch.float32).reshape(64, 1024))
    loader = stoker.DataLoader(
        ds, batch_size=8, num_workers=2, pin_memory=True, persistent_workers=True
    )
    for _ in range(2):
        it = iter(loader)
        for k, (x,) in enumerate(it):
            assert x.is_pinned()
            assert torch.equal(
                x.to("cuda", non_blocking=True).cpu(), ds.tensors[0][8 * k : 8 * k + 8]
            )
    pins = it._pool.workers[0].slots.maps.pins  # type: ignore[attr-defined]
    assert pins is not None and pins.failure is None and pins.registered > 0
    assert _pin.in_registered_slot(x.data_ptr())  # the leaf is the slot's memory: no copy


@needs_cuda
def test_a_slot_is_not_refilled_while_a_non_blocking_copy_reads_it() -> None:
    """Batches dropped right after .to("cuda", non_blocking=True), behind queued GPU work:
    every copy still holds its own batch (the slot comes back once the copy is done)."""
    assert copies_read_their_own_batch() == 16


@needs_cuda
def test_pin_memory_device_is_honoured() -> None:
    """pin_memory_device='cuda:0' pins for that device; another type is refused."""
    loader = stoker.DataLoader(
        DictSamples(), batch_size=8, pin_memory=True, pin_memory_device="cuda:0"
    )
    assert all(leaf.is_pinned() for leaf in tensor_leaves(next(iter(loader))))
    with pytest.raises(ValueError, match="pin_memory_device must"):
        next(
            iter(
                stoker.DataLoader(
                    DictSamples(), batch_size=8, pin_memory=True, pin_memory_device="xpu"
                )
            )
        )
