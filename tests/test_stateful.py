"""torchdata's ``Stateful`` protocol: an iterable dataset (or its iterator) with
``state_dict`` / ``load_state_dict`` resumes from its workers' states, without replay.

Each test compares what a resumed loader yields with what an uninterrupted one does; a
resume that replayed the stream would repeat samples (the datasets below resume only from
their state), one that lost a state would skip or repeat them.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import pytest

import stoker
from stoker import DataLoader, IterableDataset


def _share() -> tuple[int, int]:
    info = stoker.get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


class Counting(IterableDataset[Any]):
    """Worker ``w`` of ``c`` yields ``[x, resumed_at]`` for x in ``range(w, n, c)``, where
    ``resumed_at`` is the position its state gave (-1: started afresh); its state is its
    position, so a resume that replayed the stream would yield the samples again."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.pos = 0
        self._start: int | None = None

    def __iter__(self) -> Any:
        wid, count = _share()
        start, self._start = self._start, None
        items = list(range(wid, self.n, count))
        at = -1 if start is None else start
        self.pos = start or 0
        while self.pos < len(items):
            self.pos += 1
            yield [items[self.pos - 1], at]

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._start = state["pos"]


class _Cursor:
    """An iterator with its own state (its dataset has none)."""

    def __init__(self, items: list[int]) -> None:
        self.items, self.pos = items, 0

    def __iter__(self) -> _Cursor:
        return self

    def __next__(self) -> int:
        if self.pos >= len(self.items):
            raise StopIteration
        self.pos += 1
        return self.items[self.pos - 1]

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = state["pos"]


class SelfCursor(_Cursor, IterableDataset[int]):
    """A dataset that is its own iterator (``__iter__`` returns self): its state is taken
    once, as the iterator's, and loaded after ``__iter__`` (which resets it)."""

    def __init__(self, n: int) -> None:
        super().__init__([])
        self.n = n

    def __iter__(self) -> SelfCursor:
        wid, count = _share()
        self.items, self.pos = list(range(wid, self.n, count)), 0
        return self


class CursorStream(IterableDataset[Any]):
    """A dataset without state whose ``__iter__`` returns a stateful iterator."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> _Cursor:
        wid, count = _share()
        return _Cursor(list(range(wid, self.n, count)))


class _Plain(IterableDataset[int]):
    """An iterable dataset without the protocol (replayed on resume)."""

    def __iter__(self) -> Any:
        return iter(range(10))


def _batches(loader: Any) -> list[Any]:
    return [np.asarray(b).tolist() for b in loader]


def _values(batches: list[Any]) -> list[Any]:
    """The samples' values of :class:`Counting`'s batches (``[values, resumed_at]``)."""
    return [b[0] for b in batches]


LOADERS = {
    "in process": {},
    "2 processes": {"num_workers": 2},
    "2 threads": {"num_workers": 2, "worker_mode": "thread"},
    "persistent": {"num_workers": 2, "persistent_workers": True},
}


def _resumed(make: Any, cut: int, same_loader: bool) -> tuple[list[Any], list[Any], Any]:
    """(the first ``cut`` batches, the batches after a resume from a state saved then,
    the loader that resumed); the state goes through JSON, as a checkpoint would."""
    saver = make()
    it = iter(saver)
    head = [np.asarray(next(it)).tolist() for _ in range(cut)]
    state = json.loads(json.dumps(saver.state_dict()))
    del it
    loader = saver if same_loader else make()
    loader.load_state_dict(state)
    return head, _batches(loader), loader


@pytest.mark.parametrize("kw", LOADERS.values(), ids=LOADERS.keys())
def test_stateful_stream_resumes_at_every_batch(kw: dict[str, Any]) -> None:
    """Resumed after any batch of a short epoch (uneven shards: one worker runs out
    first), a stateful stream gives exactly the uninterrupted batches, each worker going on
    from its own state (nothing produced again); persistent workers resume in place."""

    def make() -> DataLoader[Any]:
        return DataLoader(Counting(21), batch_size=3, **kw)

    full = _values(_batches(make()))
    assert len(full) == (7 if not kw else 8)  # 2 workers: shares of 11 and 10 samples
    for cut in range(len(full) + 1):
        head, rest, loader = _resumed(make, cut, same_loader="persistent_workers" in kw)
        assert _values(head) + _values(rest) == full, cut
        if 0 < cut < len(full) - 1:  # the workers went on from where their states said
            assert any(min(b[1]) >= 0 for b in rest), cut
        assert loader.statistics().resume == "state"


@pytest.mark.parametrize("kw", [LOADERS["in process"], LOADERS["2 processes"]], ids=str)
@pytest.mark.parametrize("kind", [CursorStream, SelfCursor])
def test_stateful_iterator_resumes_without_replay(kw: dict[str, Any], kind: type) -> None:
    """The iterator ``__iter__`` returns may be what holds the state (its dataset has
    none, or is that iterator): it is asked, and resumed after ``__iter__``; one state
    per worker, as the iterator's."""

    def make() -> DataLoader[Any]:
        return DataLoader(kind(20), batch_size=3, **kw)

    full = _batches(make())
    for cut in (1, len(full) // 2, len(full) - 1):
        saver = make()
        it = iter(saver)
        head = [np.asarray(next(it)).tolist() for _ in range(cut)]
        workers = saver.state_dict()["stream"]["workers"]
        del it
        assert all(w is None or w["dataset"] is None for w in workers)
        assert any(w is not None and w["iterator"] for w in workers)
        head, rest, _ = _resumed(make, cut, same_loader=False)
        assert head + rest == full, cut


def test_state_names_each_workers_state() -> None:
    """The checkpoint holds each worker's own state as of the last batch delivered, and
    a stream without the protocol has none (it is replayed, and statistics say so)."""
    loader = DataLoader(Counting(30), batch_size=2, num_workers=2)
    it = iter(loader)
    for _ in range(3):  # worker 0, 1, 0
        next(it)
    stream = loader.state_dict()["stream"]
    assert stream["workers"] == [
        {"dataset": {"pos": 4}, "iterator": None},
        {"dataset": {"pos": 2}, "iterator": None},
    ]
    assert (stream["next_worker"], stream["replay"], stream["num_workers"]) == (1, 0, 2)
    del it
    plain = DataLoader(list(range(10)), batch_size=2)
    replayed = DataLoader(_Plain(), batch_size=2)
    next(iter(replayed))
    assert replayed.state_dict()["stream"] is None
    assert replayed.statistics().resume == "replay"
    assert plain.statistics().resume == "skip"


def test_other_worker_count_is_refused() -> None:
    """Each worker resumes its own part: a state of 2 workers does not load into a loader
    of 3 (nor in process); the message names both counts."""
    loader = DataLoader(Counting(30), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    for workers in (0, 3):
        with pytest.raises(ValueError, match=f"2 workers.*num_workers={workers}"):
            DataLoader(Counting(30), batch_size=2, num_workers=workers).load_state_dict(state)


@pytest.mark.parametrize("every", [0, 3])
def test_snapshot_every_n_steps_replays_since_the_last_snapshot(every: int) -> None:
    """With ``snapshot_every_n_steps=N`` the states kept are those at the last multiple
    of N batches (0: the epoch's start), and the batches since are fetched again and
    dropped: still exact."""

    def make() -> DataLoader[Any]:
        return DataLoader(Counting(24), batch_size=2, num_workers=2, snapshot_every_n_steps=every)

    full = _values(_batches(make()))
    for cut in range(1, len(full)):
        saver = make()
        it = iter(saver)
        head = [np.asarray(next(it)).tolist() for _ in range(cut)]
        stream = saver.state_dict()["stream"]
        snap = cut - cut % every if every else 0
        assert (stream["step"], stream["replay"]) == (snap, cut - snap), cut
        del it
        fresh = make()
        fresh.load_state_dict(saver.state_dict())
        assert _values(head) + _values(_batches(fresh)) == full, cut


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_snapshot_every_n_steps_is_checked(bad: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="snapshot_every_n_steps"):
        DataLoader(Counting(4), snapshot_every_n_steps=bad)


def test_auto_workers_replay_a_stateful_stream() -> None:
    """``num_workers="auto"`` may find another count on resume: its checkpoint keeps no
    worker states, and the stream is replayed (exact, as any replay), statistics say so."""

    def make() -> DataLoader[Any]:
        return DataLoader(Counting(12), batch_size=2, num_workers="auto")

    full = _values(_batches(make()))
    saver = make()
    it = iter(saver)
    head = [np.asarray(next(it)).tolist() for _ in range(2)]
    state = saver.state_dict()
    del it
    assert state["stream"] is None and saver.statistics().resume == "replay"
    fresh = make()
    fresh.load_state_dict(state)
    assert _values(head) + _values(_batches(fresh)) == full


class _Locked(Counting):
    """A stateful stream that cannot be copied (it holds a lock)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.lock = threading.Lock()


def test_thread_workers_warn_when_a_stateful_dataset_cannot_be_copied() -> None:
    """Each thread gets a copy of a stateful dataset; one that cannot be copied is shared,
    with a warning saying that its checkpoint will not resume exactly, and why."""
    loader = DataLoader(_Locked(8), batch_size=2, num_workers=2, worker_mode="thread")
    with pytest.warns(UserWarning, match="cannot be copied for each thread"):
        assert _batches(loader)  # (shared, the threads' positions interleave)
