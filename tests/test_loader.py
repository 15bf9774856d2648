"""DataLoader in the main process: validation, batching, ordering, lengths, pinning."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

import stoker
from stoker import DataLoader, IterableDataset, Subset, TensorDataset
from stoker._engine._pin import pin


def _data(n: int = 10) -> TensorDataset:
    return TensorDataset(np.arange(n * 2, dtype=np.float32).reshape(n, 2), np.arange(n))


class _Range(IterableDataset):
    def __init__(self, n: int, claimed_len: int | None = None) -> None:
        self.n = n
        self.claimed_len = n if claimed_len is None else claimed_len

    def __iter__(self) -> Any:
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.claimed_len


class _CountingDataset:
    """A plain map-style dataset (no base class) that counts its calls."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.getitems_calls = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        raise AssertionError("__getitems__ should be used")

    def __getitems__(self, indices: list[int]) -> list[int]:
        assert all(type(i) is int for i in indices)  # plain datasets get Python ints
        self.getitems_calls += 1
        return [i * 10 for i in indices]


def test_sequential_batches_and_numpy_types() -> None:
    """NumPy data gives NumPy batches, in order, the last one partial."""
    batches = list(DataLoader(_data(10), batch_size=4))
    assert [b[1].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    x, y = batches[0]
    assert isinstance(x, np.ndarray) and x.dtype == np.float32 and x.shape == (4, 2)
    assert y.dtype == np.int64


def test_same_batches_as_torch() -> None:
    """On torch tensors, batches equal torch's DataLoader's, tensor for tensor."""
    torch = pytest.importorskip("torch")
    x = torch.arange(60, dtype=torch.float32).reshape(30, 2)
    y = torch.arange(30)
    for kwargs in [{"batch_size": 7}, {"batch_size": 7, "drop_last": True}, {"batch_size": None}]:
        ours = list(DataLoader(TensorDataset(x, y), **kwargs))
        theirs = list(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), **kwargs))
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            assert type(a) is type(b)
            for ta, tb in zip(a, b, strict=True):
                assert isinstance(ta, torch.Tensor) and ta.dtype == tb.dtype
                assert torch.equal(ta, tb)


def test_torch_dataset_instances_are_accepted() -> None:
    """A torch map-style or iterable Dataset works unchanged."""
    torch = pytest.importorskip("torch")

    class Squares(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 5

        def __getitem__(self, i: int) -> int:
            return i * i

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self) -> Any:
            return iter(range(5))

    assert [b.tolist() for b in DataLoader(Squares(), batch_size=2)] == [[0, 1], [4, 9], [16]]
    assert [b.tolist() for b in DataLoader(Stream(), batch_size=2)] == [[0, 1], [2, 3], [4]]


def test_getitems_called_once_per_batch() -> None:
    """A dataset with __getitems__ is asked once per batch, with Python ints."""
    ds = _CountingDataset(10)
    batches = list(DataLoader(ds, batch_size=4, shuffle=True, generator=1))
    assert ds.getitems_calls == 3
    assert sorted(np.concatenate(batches).tolist()) == [i * 10 for i in range(10)]


def test_shuffle_repeats_with_seed_and_changes_per_epoch() -> None:
    """An int generator gives the same run twice; each epoch is a new permutation."""

    def run() -> list[list[int]]:
        loader = DataLoader(_data(50), batch_size=50, shuffle=True, generator=3)
        return [next(iter(loader))[1].tolist() for _ in range(3)]

    first, second = run(), run()
    assert first == second
    assert first[0] != first[1]
    assert all(sorted(epoch) == list(range(50)) for epoch in first)


@pytest.mark.parametrize(
    "make_gen", [lambda: 5, lambda: np.random.default_rng(5), "torch"], ids=["int", "np", "torch"]
)
def test_generator_kinds(make_gen: Any) -> None:
    """int, NumPy and torch generators are accepted and make shuffling repeatable."""
    if make_gen == "torch":
        torch = pytest.importorskip("torch")

        def make_gen() -> Any:
            return torch.Generator().manual_seed(5)

    def order() -> list[int]:
        loader = DataLoader(_data(20), batch_size=None, shuffle=True, generator=make_gen())
        return [int(y) for _, y in loader]

    assert order() == order()
    assert sorted(order()) == list(range(20))


class _Draws(stoker.Dataset[Any]):
    """Each sample draws from Python's, NumPy's and torch's global RNGs."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        import random

        import torch

        return random.random(), np.random.rand(), torch.rand(()).item()


def test_loading_in_process_leaves_the_loops_randomness_to_its_seeds() -> None:
    """With a fixed loader seed, the loop's draws still follow the user's own seeds (torch's
    exactly as if nothing was loaded), and the batches do not depend on them."""
    import random

    torch = pytest.importorskip("torch")

    def run(user_seed: int) -> tuple[list[Any], list[Any]]:
        random.seed(user_seed)
        np.random.seed(user_seed)
        torch.manual_seed(user_seed)
        batches, loop = [], []
        for batch in DataLoader(_Draws(), batch_size=4, generator=0):
            batches.append([b.tolist() for b in batch])
            loop.append((random.random(), np.random.rand(), torch.rand(()).item()))
        return batches, loop

    (b1, loop1), (b2, loop2) = run(1), run(2)
    assert b1 == b2  # the loader's seed decides the samples' draws
    assert all(x != y for a, b in zip(loop1, loop2, strict=True) for x, y in zip(a, b, strict=True))
    assert run(1) == (b1, loop1)
    torch.manual_seed(1)
    assert [t for _, _, t in loop1] == [torch.rand(()).item() for _ in loop1]


def test_array_datasets_load_without_touching_the_global_rngs() -> None:
    """Batches of stoker's array datasets (which draw nothing) are not seeded in process:
    the loop's Python and NumPy streams go on as if nothing was loaded, as with torch."""
    import random

    loader = DataLoader(Subset(_data(30), range(20)), batch_size=4, shuffle=True, generator=0)
    random.seed(3)
    np.random.seed(3)
    expected = (random.random(), np.random.rand())
    random.seed(3)
    np.random.seed(3)
    assert len(list(loader)) == 5
    assert (random.random(), np.random.rand()) == expected


def test_global_seed_makes_default_shuffle_repeatable() -> None:
    """Without a generator, np.random.seed makes the shuffle repeatable (torch not imported)."""
    import sys

    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        orders = []
        for _ in range(2):
            torch.manual_seed(11)
            orders.append(next(iter(DataLoader(_data(30), batch_size=30, shuffle=True)))[1])
    else:
        orders = []
        for _ in range(2):
            np.random.seed(11)
            orders.append(next(iter(DataLoader(_data(30), batch_size=30, shuffle=True)))[1])
    assert orders[0].tolist() == orders[1].tolist()


def test_no_auto_batching_converts_samples() -> None:
    """batch_size=None yields samples one by one, arrays unbatched."""
    samples = list(DataLoader(_data(3), batch_size=None))
    assert len(samples) == 3
    assert samples[2][0].tolist() == [4.0, 5.0] and int(samples[2][1]) == 2


def test_batch_sampler_and_sampler_iterables() -> None:
    """A list as sampler and a list of lists as batch_sampler work, as in torch."""
    ds = _data(6)
    by_sampler = [b[1].tolist() for b in DataLoader(ds, batch_size=2, sampler=[5, 4, 3])]
    assert by_sampler == [[5, 4], [3]]
    by_batches = [b[1].tolist() for b in DataLoader(ds, batch_sampler=[[0, 5], [2]])]
    assert by_batches == [[0, 5], [2]]


@pytest.mark.parametrize(
    ("n", "bs", "drop_last", "expected"),
    [(10, 3, False, 4), (10, 3, True, 3), (9, 3, True, 3), (0, 3, False, 0)],
)
def test_len(n: int, bs: int, drop_last: bool, expected: int) -> None:
    """len(loader) counts batches, as torch does."""
    loader = DataLoader(_data(n), batch_size=bs, drop_last=drop_last)
    assert len(loader) == expected == len(list(loader))
    assert len(DataLoader(_Range(n), batch_size=bs, drop_last=drop_last)) == expected


def test_iterable_dataset_batches_and_drop_last() -> None:
    """An iterable dataset is batched in its own order; drop_last drops the partial batch."""
    assert [b.tolist() for b in DataLoader(_Range(5), batch_size=2)] == [[0, 1], [2, 3], [4]]
    assert [b.tolist() for b in DataLoader(_Range(5), batch_size=2, drop_last=True)] == [
        [0, 1],
        [2, 3],
    ]


def test_iterable_len_warning_when_more_is_yielded() -> None:
    """An iterable dataset yielding more than len() said triggers torch's warning."""
    loader = DataLoader(_Range(6, claimed_len=2), batch_size=2)
    assert len(loader) == 1
    with pytest.warns(UserWarning, match="was reported to be 1"):
        batches = list(loader)
    assert len(batches) == 3


BAD_ARGS: list[tuple[dict[str, Any], type[Exception]]] = [
    ({"num_workers": -1}, ValueError),
    ({"timeout": -1}, ValueError),
    ({"prefetch_factor": 2}, ValueError),
    ({"persistent_workers": True}, ValueError),
    ({"shuffle": True, "sampler": [0, 1]}, ValueError),
    ({"batch_sampler": [[0]], "batch_size": 2}, ValueError),
    ({"batch_sampler": [[0]], "shuffle": True}, ValueError),
    ({"batch_sampler": [[0]], "sampler": [0]}, ValueError),
    ({"batch_sampler": [[0]], "drop_last": True}, ValueError),
    ({"batch_size": None, "drop_last": True}, ValueError),
    ({"multiprocessing_context": "spawn"}, ValueError),
    ({"num_workers": 1, "multiprocessing_context": "nope"}, ValueError),
    ({"num_workers": 1, "multiprocessing_context": 3}, TypeError),
    ({"num_workers": 1, "prefetch_factor": -1}, ValueError),
]


@pytest.mark.parametrize(("kwargs", "exc"), BAD_ARGS, ids=[str(k) for k, _ in BAD_ARGS])
def test_validation_matches_torch(kwargs: dict[str, Any], exc: type[Exception]) -> None:
    """Each invalid argument set raises the exception type torch raises for it."""
    with pytest.raises(exc):
        DataLoader(_data(4), **kwargs)
    torch = pytest.importorskip("torch")
    tds = torch.utils.data.TensorDataset(torch.zeros(4))
    with pytest.raises(exc):
        torch.utils.data.DataLoader(tds, **kwargs)


@pytest.mark.parametrize("kwargs", [{"shuffle": True}, {"sampler": [0]}, {"batch_sampler": [[0]]}])
def test_iterable_dataset_rejects_ordering_options(kwargs: dict[str, Any]) -> None:
    """An iterable dataset takes no shuffle, sampler or batch_sampler (ValueError)."""
    with pytest.raises(ValueError, match="IterableDataset"):
        DataLoader(_Range(3), **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [{"tensor_type": "jax"}, {"worker_mode": "fiber"}, {"generator": "seed"}, {"num_workers": 1.5}],
)
def test_stoker_options_are_validated(kwargs: dict[str, Any]) -> None:
    """stoker's own options reject bad values with ValueError or TypeError."""
    with pytest.raises((ValueError, TypeError)):
        DataLoader(_data(4), **kwargs)


@pytest.mark.parametrize(
    "attr", ["batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"]
)
def test_frozen_attributes(attr: str) -> None:
    """Attributes that define the iteration cannot be reassigned after construction."""
    loader = DataLoader(_data(4))
    with pytest.raises(ValueError, match=attr):
        setattr(loader, attr, None)


def test_tensor_type_forces_kind() -> None:
    """tensor_type='torch' gives tensors from NumPy data; 'numpy' gives arrays from tensors."""
    torch = pytest.importorskip("torch")
    x, _ = next(iter(DataLoader(_data(4), batch_size=2, tensor_type="torch")))
    assert isinstance(x, torch.Tensor) and x.dtype == torch.float32
    tds = TensorDataset(torch.ones(4, 2))
    (x,) = next(iter(DataLoader(tds, batch_size=2, tensor_type="numpy")))
    assert isinstance(x, np.ndarray) and x.dtype == np.float32


def test_pin_memory_without_accelerator_warns_once() -> None:
    """pin_memory=True without an accelerator warns once per loader and yields the data."""
    torch = pytest.importorskip("torch")
    if torch.accelerator.is_available():
        pytest.skip("an accelerator is present")
    loader = DataLoader(_data(4), batch_size=2, pin_memory=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        epochs = [list(loader), list(loader)]
    assert len([w for w in caught if "pin_memory" in str(w.message)]) == 1
    assert [b[1].tolist() for b in epochs[1]] == [[0, 1], [2, 3]]


def test_pin_uses_objects_own_pin_memory() -> None:
    """pin() calls a custom batch's pin_memory() and rebuilds containers around it."""

    class Batch:
        pinned = False

        def pin_memory(self) -> Batch:
            self.pinned = True
            return self

    batch = {"a": [Batch(), "text"], "b": np.zeros(2)}
    out = pin(batch, "cpu")
    assert out["a"][0].pinned and out["a"][1] == "text"
    assert out["b"] is batch["b"]


def test_get_worker_info_is_none_in_main_process() -> None:
    """get_worker_info() is None outside workers, also inside __getitem__ at num_workers=0."""
    seen = []

    class Probe(stoker.Dataset[int]):
        def __len__(self) -> int:
            return 2

        def __getitem__(self, i: int) -> int:
            seen.append(stoker.get_worker_info())
            return i

    list(DataLoader(Probe()))
    assert seen == [None, None]


class _Keyed:
    """A map-style dataset keyed by anything: each sample is the key it was given, as
    its repr (so that collate keeps it as it came)."""

    def __getitem__(self, key: Any) -> str:
        return repr(key)

    def __len__(self) -> int:
        return 5


class _KeyedBatches(_Keyed):
    """The same, loaded a batch at a time through ``__getitems__``."""

    def __getitems__(self, keys: Any) -> list[str]:
        assert isinstance(keys, list), type(keys)
        return [f"items:{k!r}" for k in keys]


def _as_is(batch: Any) -> Any:
    return batch


_KEYS = ["a", ("c", 1), "b", True, 3, frozenset({"x"})]


@pytest.mark.parametrize(
    "workers", [{}, {"num_workers": 2}, {"num_workers": 2, "worker_mode": "thread"}],
    ids=["in_process", "processes", "threads"],
)  # fmt: skip
@pytest.mark.parametrize("dataset", [_Keyed, _KeyedBatches])
@pytest.mark.parametrize("how", ["sampler", "batch_sampler", "no_batching"])
def test_non_integer_keys_pass_through_as_in_torch(
    how: str, dataset: type[_Keyed], workers: dict[str, Any]
) -> None:
    """Keys of any type from a custom sampler or batch sampler reach __getitem__ /
    __getitems__ unchanged, as torch passes them (issue #20: int() was applied)."""
    torch = pytest.importorskip("torch")
    arguments: dict[str, Any] = {
        "sampler": {"batch_size": 2, "sampler": _KEYS},
        "batch_sampler": {"batch_sampler": [_KEYS[:2], _KEYS[2:5], _KEYS[5:]]},
        "no_batching": {"batch_size": None, "sampler": _KEYS},
    }[how]
    theirs = list(
        torch.utils.data.DataLoader(
            dataset(), collate_fn=_as_is, **arguments, num_workers=workers.get("num_workers", 0)
        )
    )
    ours = list(DataLoader(dataset(), collate_fn=_as_is, **arguments, **workers))
    assert ours == theirs
    assert "'a'" in str(ours[0]) and "('c', 1)" in str(ours[0 if how != "no_batching" else 1])
