"""The worker-backed iterator's logic on the in-process pool, and the same on real workers.

Each test runs twice: with :class:`~stoker._engine._inproc.InProcessPool` standing in for
every pool (the worker loop run by the main thread; the test asserts that no process or
thread was started, and that the pool ran the tasks), and on real worker processes. The
iterator, its window, dispatch, skips, timeouts and autotune run the same in both, so what
these tests check holds for the iterator itself, not for one transport.
"""

from __future__ import annotations

import multiprocessing.process
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from stoker import DataLoader, IterableDataset, TensorDataset, get_worker_info
from stoker._engine import _multi
from stoker._engine._inproc import InProcessPool
from stoker.errors import WorkerError

_SLOW_S = 1.0
"""How long a slow sample sleeps, against a timeout of :data:`_TIMEOUT_S`."""
_TIMEOUT_S = 0.2


class Pools:
    """The pool kind a test runs on, and what it started."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.made: list[InProcessPool] = []
        self.started = 0  # threads and processes started while the test ran

    @property
    def in_process(self) -> bool:
        return self.kind == "in_process"

    def loader(self, dataset: Any, **kw: Any) -> DataLoader[Any]:
        """A loader with workers (2 unless ``kw`` says), on this kind of pool."""
        kw.setdefault("num_workers", 2)
        return DataLoader(dataset, **kw)


@pytest.fixture(params=["in_process", "processes"])
def pools(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pools]:
    """The pool kind; in process, every pool is an InProcessPool and no thread or process
    may start (``Thread.start`` and ``Process.start`` are counted)."""
    got = Pools(request.param)
    if not got.in_process:
        yield got
        return

    class Counted(InProcessPool):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            got.made.append(self)

    for mode in ("process", "thread"):
        monkeypatch.setitem(_multi.POOLS, mode, Counted)
    thread_start, process_start = threading.Thread.start, multiprocessing.process.BaseProcess.start

    def count_thread(self: threading.Thread) -> None:
        got.started += 1
        thread_start(self)

    def count_process(self: Any) -> None:
        got.started += 1
        process_start(self)

    monkeypatch.setattr(threading.Thread, "start", count_thread)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", count_process)
    children = len(multiprocessing.active_children())
    yield got
    assert got.started == 0, "the in-process pool started a thread or a process"
    assert len(multiprocessing.active_children()) == children
    assert got.made and sum(p.runs for p in got.made) > 0, "no task ran on the in-process pool"


class Noisy:
    """``n`` samples ``[i, draw]``, the draw from NumPy's global RNG; ``bad`` raise
    ValueError, ``slow`` sleep :data:`_SLOW_S` first, ``exits`` call ``sys.exit(3)``."""

    def __init__(
        self,
        n: int = 24,
        bad: frozenset[int] = frozenset(),
        slow: frozenset[int] = frozenset(),
        exits: frozenset[int] = frozenset(),
    ) -> None:
        self.n, self.bad, self.slow, self.exits = n, bad, slow, exits

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if i in self.slow:
            time.sleep(_SLOW_S)
        if i in self.bad:
            raise ValueError(f"sample {i} is corrupt")
        if i in self.exits:
            sys.exit(3)
        return np.array([float(i), np.random.random()])


class WhoLoads:
    """Samples ``[i, worker id]``: which worker loaded each (``get_worker_info()``)."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> np.ndarray:
        info = get_worker_info()
        assert info is not None, "a worker's sample sees its worker info"
        return np.array([i, info.id])


class Stream(IterableDataset):
    """Items 0..n-1 split among the workers by ``get_worker_info()``, as torch's docs do."""

    def __init__(self, n: int = 20) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        step, first = (1, 0) if info is None else (info.num_workers, info.id)
        return iter(range(first, self.n, step))


def _rows(loader: DataLoader[Any]) -> list[list[float]]:
    return [row for batch in loader for row in np.asarray(batch).tolist()]


def _firsts(loader: DataLoader[Any]) -> list[int]:
    return [int(row[0]) for row in _rows(loader)]


def _in_process_reference(dataset: Any, **kw: Any) -> list[list[float]]:
    return _rows(DataLoader(dataset, num_workers=0, **kw))


def test_batches_come_in_sampler_order(pools: Pools) -> None:
    """``in_order=True``: the batches of a shuffled epoch, noise included, equal those
    loaded in process, in the same order."""
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": True, "generator": 3}
    assert _rows(pools.loader(Noisy(), **kw)) == _in_process_reference(Noisy(), **kw)


def test_out_of_order_delivers_every_batch_once(pools: Pools) -> None:
    """``in_order=False``: every batch once, each equal to its in-process twin."""
    kw: dict[str, Any] = {"batch_size": 3, "shuffle": True, "generator": 5}
    got = pools.loader(Noisy(), in_order=False, **kw)
    assert sorted(_rows(got)) == sorted(_in_process_reference(Noisy(), **kw))


def test_round_robin_gives_each_worker_its_share(pools: Pools) -> None:
    """Where the user's code runs in the workers, batch ``k`` goes to worker ``k % n``,
    as torch assigns it."""
    rows = _rows(pools.loader(WhoLoads(), batch_size=2))
    assert [int(i) for i, _ in rows] == list(range(12))
    assert [int(w) for _, w in rows] == [(i // 2) % 2 for i in range(12)]


def test_worker_info_is_none_in_the_main_process_after_loading(pools: Pools) -> None:
    """Only the worker's fetch sees its ``WorkerInfo``; the main thread sees None."""
    assert len(list(pools.loader(WhoLoads(), batch_size=3))) == 4
    assert get_worker_info() is None


def test_worker_init_fn_runs_once_per_worker(pools: Pools) -> None:
    """``worker_init_fn`` runs once for each worker, with its id, before its batches."""
    seen: list[int] = []
    loader = pools.loader(Noisy(8), batch_size=2, worker_init_fn=seen.append)
    assert len(list(loader)) == 4
    if pools.in_process:  # a process's list is its own copy
        assert sorted(seen) == [0, 1]


def test_skipped_samples_are_left_out_and_counted(pools: Pools) -> None:
    """``skip_errors``: failing samples are left out, the same ones as in process."""
    bad = frozenset({1, 6, 13})
    kw: dict[str, Any] = {"batch_size": 4, "skip_errors": 3, "generator": 1}
    loader = pools.loader(Noisy(bad=bad), **kw)
    rows = _rows(loader)
    assert rows == _in_process_reference(Noisy(bad=bad), **kw)
    assert [int(r[0]) for r in rows] == [i for i in range(24) if i not in bad]
    assert loader.statistics().skipped_samples == 3


def test_a_batch_whose_samples_all_fail_is_dropped(pools: Pools) -> None:
    """A batch of failing samples only is dropped: the epoch has one batch fewer."""
    loader = pools.loader(Noisy(12, bad=frozenset({4, 5, 6, 7})), batch_size=4, skip_errors=4)
    batches = [np.asarray(b)[:, 0].tolist() for b in loader]
    assert batches == [[0, 1, 2, 3], [8, 9, 10, 11]]


def test_one_skip_past_the_cap_raises(pools: Pools) -> None:
    """One failing sample more than ``skip_errors`` allows raises RuntimeError."""
    loader = pools.loader(Noisy(bad=frozenset({2, 9, 15})), batch_size=4, skip_errors=2)
    with pytest.raises(RuntimeError, match="skip"):
        list(loader)


def test_a_failing_batch_raises_at_its_turn(pools: Pools) -> None:
    """A batch that raises does so in its turn, after the batches before it, with its
    type and torch's "Caught ValueError" phrase."""
    got: list[int] = []
    with pytest.raises(ValueError, match="Caught ValueError") as info:
        for batch in pools.loader(Noisy(bad=frozenset({13})), batch_size=4):
            got.append(int(np.asarray(batch)[0, 0]))
    assert got == [0, 4, 8]
    assert "sample 13 is corrupt" in str(info.value)


def test_a_slow_worker_times_out(pools: Pools) -> None:
    """A batch slower than ``timeout`` raises WorkerError naming the wait."""
    loader = pools.loader(Noisy(8, slow=frozenset({0})), batch_size=2, timeout=_TIMEOUT_S)
    with pytest.raises(WorkerError, match="timed out"):
        list(loader)


def test_a_worker_that_exits_is_a_dead_worker(pools: Pools) -> None:
    """``sys.exit()`` in the dataset ends the worker: WorkerError says what ended it."""
    loader = pools.loader(Noisy(8, exits=frozenset({5})), batch_size=2)
    with pytest.raises(WorkerError, match="exited unexpectedly") as info:
        list(loader)
    assert "SystemExit" in str(info.value)


def test_breaking_out_shuts_the_pool_down_and_the_next_epoch_runs(pools: Pools) -> None:
    """An epoch left early stops its workers at shutdown; the loader's next epoch is whole."""
    loader = pools.loader(Noisy(), batch_size=4)
    it = iter(loader)
    next(it)
    it.shutdown()  # type: ignore[attr-defined]
    assert not it.alive  # type: ignore[attr-defined]
    assert _firsts(loader) == list(range(24))


def test_persistent_workers_serve_every_epoch_alike(pools: Pools) -> None:
    """Persistent workers: each epoch's batches equal that epoch's in process."""
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": True, "generator": 11}
    loader = pools.loader(Noisy(), persistent_workers=True, **kw)
    ref = DataLoader(Noisy(), **kw)
    for _ in range(2):
        assert _rows(loader) == _rows(ref)


def test_an_iterable_dataset_is_read_once_across_workers(pools: Pools) -> None:
    """An iterable dataset split by ``get_worker_info()``: every item once, the epoch ends
    when every worker's iterator is exhausted, and the next epoch reads it again."""
    loader = pools.loader(Stream(), batch_size=3)
    for _ in range(2):
        items = [int(v) for b in loader for v in np.asarray(b).tolist()]
        assert sorted(items) == list(range(20))


def test_resume_from_a_mid_epoch_state_is_exact(pools: Pools) -> None:
    """A loader loading the state taken after 2 batches gives the rest of that epoch."""
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": True, "generator": 2}
    loader = pools.loader(Noisy(), **kw)
    it = iter(loader)
    head = [np.asarray(next(it)).tolist() for _ in range(2)]
    state = loader.state_dict()
    rest = [np.asarray(b).tolist() for b in it]
    again = pools.loader(Noisy(), **kw)
    again.load_state_dict(state)
    assert [np.asarray(b).tolist() for b in again] == rest
    assert len(head) + len(rest) == 6


def test_autotune_keeps_the_batches(pools: Pools) -> None:
    """``num_workers="auto"``: whatever count the tuner's steps choose over three epochs,
    the batches equal those in process, and its decisions are listed."""
    kw: dict[str, Any] = {"batch_size": 2, "shuffle": True, "generator": 4}
    loader = DataLoader(Noisy(32), num_workers="auto", worker_mode="process", **kw)
    ref = DataLoader(Noisy(32), **kw)
    for _ in range(3):
        assert _rows(loader) == _rows(ref)
    assert loader.statistics().autotune


def test_prefetch_auto_and_tiny_batches_keep_the_batches(pools: Pools) -> None:
    """Tiny batches of stoker's own code (grouped, perhaps moved in process by the tuner)
    and ``prefetch_factor="auto"``: every epoch equals loading in process."""
    ds = TensorDataset(np.arange(64.0), np.arange(64) % 5)
    kw: dict[str, Any] = {"batch_size": 2, "shuffle": True, "generator": 8}
    loader = pools.loader(ds, prefetch_factor="auto", **kw)
    ref = DataLoader(ds, **kw)
    for _ in range(3):
        got = [[np.asarray(x).tolist() for x in b] for b in loader]
        assert got == [[np.asarray(x).tolist() for x in b] for b in ref]
