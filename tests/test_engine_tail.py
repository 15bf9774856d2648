"""The tail of an epoch split across worker processes (``stoker._engine._tail``).

The datasets here wait a few milliseconds per sample, as I/O would: batches must take
``TAIL_SPLIT_MIN_S`` or more to be split. Nothing waits to synchronise.
"""

from __future__ import annotations

import os
import time
from collections import namedtuple
from typing import Any

import numpy as np
import pytest

from stoker import DataLoader
from stoker._collate import collate
from stoker._engine._buffers import BufferPool
from stoker._engine._tail import concat, mergeable, plan
from stoker._policy import TAIL_SPLIT_MIN_S
from stoker.errors import WorkerError

WAIT_S = 0.004
BATCH = 8  # 8 x 4 ms = 32 ms per batch, above TAIL_SPLIT_MIN_S
Point = namedtuple("Point", ["xy", "name"])
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker")


class Waits:
    """Samples that take ``WAIT_S`` each; the second field is the pid that loaded it.
    Worker agnostic (it promises its samples do not depend on the worker): stoker may
    split its batches (a dataset of the user's gets torch's assignment, whole batches)."""

    _stoker_worker_agnostic = True

    def __init__(
        self, n: int = 5 * BATCH, draw: bool = False, bad: int = -1, floats: int = 3
    ) -> None:
        self.n, self.draw, self.bad, self.floats = n, draw, bad, floats

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        time.sleep(WAIT_S)
        if i == self.bad:
            raise ValueError(f"bad sample {i}")
        extra = np.random.randint(1000) if self.draw else 0
        return {"x": np.full(self.floats, i, np.float32), "extra": extra, "pid": os.getpid()}


def _epoch(dataset: Any, workers: int, **kw: Any) -> list[Any]:
    loader = DataLoader(dataset, batch_size=BATCH, num_workers=workers, **kw)
    return [loader, *list(loader), *list(loader)]  # two epochs: the first measures


def _pids(batches: list[Any]) -> list[int]:
    return [len(set(b["pid"].tolist())) for b in batches]


def test_tail_batches_are_split_and_equal_to_one_process() -> None:
    """With 4 workers and 5 slow batches, the last ones are loaded by several workers and
    the batches equal those of num_workers=0."""
    assert BATCH * WAIT_S >= TAIL_SPLIT_MIN_S
    loader, *got = _epoch(Waits(), 4, persistent_workers=True)
    want = list(DataLoader(Waits(), batch_size=BATCH))
    assert loader._memory.rng_untouched is True
    second = got[5:]
    assert max(_pids(second)) >= 2  # some batch came from two processes
    for a, b in zip(second, want, strict=True):
        np.testing.assert_array_equal(a["x"], b["x"])
        np.testing.assert_array_equal(a["extra"], b["extra"])
    del loader


def test_joins_reuse_the_loaders_memory() -> None:
    """A joined batch of large leaves is written into memory the loader keeps: once the
    loop dropped it, later epochs' joins use the buffers earlier joins used (no fresh page
    faults)."""
    loader = DataLoader(Waits(floats=1 << 17), batch_size=BATCH, num_workers=4)
    used = _joined_addresses(loader, split=False)  # measures the batches: the next split
    first = _joined_addresses(loader)  # the batches die here: their buffers return
    used |= first
    second = _joined_addresses(loader)
    # How many batches are split, and which kept buffer each takes, depends on timing;
    # only joins beyond the buffers already made may take fresh memory.
    assert first and len(second - used) <= max(0, len(second) - len(used)), (used, second)
    del loader


def _joined_addresses(loader: DataLoader[Any], split: bool = True) -> set[int]:
    """Where the epoch's joined batches (loaded by several workers) keep their samples."""
    batches = list(loader)
    assert max(_pids(batches)) >= 2 or not split
    return {b["x"].ctypes.data for b in batches if len(set(b["pid"].tolist())) > 1}


def test_warming_the_pool_keeps_what_is_written_after() -> None:
    """``BufferPool.warm`` rewrites free buffers in a thread; a buffer taken meanwhile is
    handed out only once that thread is done with it, so what the caller writes stays."""
    pool = BufferPool(keep=2)
    a = pool.alloc((1 << 20,), np.dtype(np.float32))
    b = pool.alloc((1 << 20,), np.dtype(np.float32))
    del a, b  # both return to the pool
    pool.warm()
    c = pool.alloc((1 << 20,), np.dtype(np.float32))
    c[:] = 7
    pool.warm()  # rewrites the one free buffer, never the one c holds
    d = pool.alloc((1 << 20,), np.dtype(np.float32))
    d[:] = 9
    assert (c == 7).all() and (d == 9).all()
    assert c.ctypes.data != d.ctypes.data


def test_no_split_when_the_dataset_draws_from_the_global_rng() -> None:
    """A dataset that draws from NumPy's global RNG is never split: its batches are the
    same for any number of workers."""
    loader, *got = _epoch(Waits(draw=True), 4, persistent_workers=True, generator=7)
    assert loader._memory.rng_untouched is False
    assert _pids(got) == [1] * len(got)
    one, *want = _epoch(Waits(draw=True), 1, generator=7)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a["extra"], b["extra"])
    del loader, one


def test_split_batch_failure_is_raised_in_order() -> None:
    """A sample that raises in a part raises for its batch, at its turn, naming it."""
    n = 5 * BATCH
    loader = DataLoader(Waits(n, bad=n - 2), batch_size=BATCH, num_workers=4)
    for _ in range(2):  # the first epoch learns that batches are slow; the second splits
        got = []
        with pytest.raises(ValueError, match=f"bad sample {n - 2}"):
            for batch in loader:
                got.append(batch)
        assert len(got) == 4
    assert loader._memory.rng_untouched is True
    del loader


def test_unordered_delivery_with_split_batches() -> None:
    """With in_order=False every sample still arrives exactly once."""
    loader, *got = _epoch(Waits(), 4, persistent_workers=True, in_order=False)
    assert max(_pids(got[5:])) >= 2
    seen = sorted(np.concatenate([b["x"][:, 0] for b in got[5:]]).astype(int).tolist())
    assert seen == list(range(5 * BATCH))
    del loader


class _KillLast(Waits):
    """Once ``flag`` exists, loading the last sample kills the worker."""

    def __init__(self, flag: str) -> None:
        super().__init__()
        self.flag = flag

    def __getitem__(self, i: int) -> Any:
        if i == self.n - 1 and os.path.exists(self.flag):
            os.kill(os.getpid(), 9)
        return super().__getitem__(i)


def test_worker_killed_during_a_split_is_reported(tmp_path: Any) -> None:
    """A part's worker dying raises WorkerError, as for a whole batch."""
    flag = str(tmp_path / "kill")
    loader = DataLoader(_KillLast(flag), batch_size=BATCH, num_workers=4, persistent_workers=True)
    list(loader)  # first epoch: learns that batches are slow and leave the RNGs alone
    open(flag, "w").close()
    with pytest.raises(WorkerError, match="exited unexpectedly"):
        list(loader)
    del loader


def test_concat_of_collated_parts_equals_collate_of_all() -> None:
    """Joining collated parts gives what collate makes of all the samples."""
    samples = [
        {"a": np.full((2,), i), "p": Point((i, -i), f"s{i}"), "t": (b"x%d" % i, float(i))}
        for i in range(7)
    ]
    whole = collate(samples)
    parts = [collate(samples[:3]), collate(samples[3:5]), collate(samples[5:])]
    assert mergeable(whole)
    joined = concat(parts)
    np.testing.assert_array_equal(joined["a"], whole["a"])
    assert type(joined["p"]) is Point and joined["p"].name == whole["p"].name
    np.testing.assert_array_equal(joined["p"].xy[0], whole["p"].xy[0])
    assert joined["t"][0] == whole["t"][0]
    np.testing.assert_array_equal(joined["t"][1], whole["t"][1])


def test_concat_of_tensors() -> None:
    """Tensor leaves are joined with torch.cat."""
    torch = pytest.importorskip("torch")
    samples = [(torch.full((2,), i), i) for i in range(5)]
    joined = concat([collate(samples[:2]), collate(samples[2:])])
    whole = collate(samples)
    assert torch.equal(joined[0], whole[0]) and torch.equal(joined[1], whole[1])


def test_unmergeable_batches_are_recognised() -> None:
    """Scalars, custom objects and 0-d arrays cannot be joined: no split."""
    assert not mergeable(np.float32(1.0))
    assert not mergeable([object()])
    assert not mergeable({"a": np.array(1.0)})


def test_plan_leaves_a_balanced_tail_whole() -> None:
    """No split when the workers' loads already balance; a split uses distinct workers."""
    assert plan(100, [2.0, 1.0], 1) is None
    assert plan(100, [0.0, 0.0, 0.0, 0.0], 8) is None  # plenty of work left
    assert plan(100, [1.0, 1.0, 1.0, 0.0], 1) is None  # the idle worker takes it whole
    parts = plan(100, [1.0, 1.0, 0.5, 0.5], 1)
    assert parts is not None and sum(c for _, c in parts) == 100
    assert len({w for w, _ in parts}) == len(parts)


class _Unsized:
    """A batch sampler without a length."""

    def __iter__(self) -> Any:
        return iter([list(range(i, i + BATCH)) for i in range(0, 5 * BATCH, BATCH)])


def test_batch_sampler_without_length_is_never_split() -> None:
    """Without a length the tail is unknown: batches load whole, all of them."""
    loader = DataLoader(Waits(), batch_sampler=_Unsized(), num_workers=4, persistent_workers=True)
    for _ in range(2):
        got = list(loader)
        assert _pids(got) == [1] * 5
    del loader
