"""Leaks and bounds: many iterators created, partly consumed and dropped leave nothing."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from conftest import _snapshot, leftovers
from stoker import DataLoader, TensorDataset
from stoker._engine import _procs


# About 10 s on two quiet cores; each iterator forks a worker and waits for it, so beside
# CPU burners (tests/under_load.sh) every fork waits for a time slice: minutes, not a hang.
@pytest.mark.timeout(900)
def test_thousand_iterators_leave_nothing_behind() -> None:
    """1,000 iterators (partly consumed, dropped): segments, fds and children unchanged,
    but for the loader's few warm segments (bounded), which go with the loader."""
    ds = TensorDataset(np.arange(64, dtype=np.float32).reshape(32, 2), np.arange(32))
    loader = DataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context="fork")
    gc.collect()
    before = _snapshot()
    most = 0
    for i in range(1000):
        it = iter(loader)
        for _ in range(i % 3):  # 0, 1 or 2 batches taken, the rest abandoned
            next(it)
        del it
        if i % 50 == 49:
            _join_reapers()  # a worker that said goodbye holds its exit pipe until reaped
            fds = _snapshot()["open file descriptors"] - before["open file descriptors"]
            most = max(most, len(fds))
    assert most <= 2 * 2 + 2  # one mapping per warm segment: at most the arena's keep_free
    del loader
    assert leftovers(before) == {}


def _join_reapers(timeout_s: float = 5.0) -> None:
    """Wait (bounded) for the threads that reap exiting workers."""
    for t in threading.enumerate():
        if t.name == "stoker-reaper":
            t.join(timeout_s)


def test_the_reaper_starts_before_the_workers_are_told_to_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The thread that waits for the workers' exits is running before they stop: started
    while they tear down their address spaces, it waited for a core (~4 ms), and so did
    the loop that ended the epoch. It ends once they have exited."""
    seen: list[bool] = []
    said_bye = _procs._said_bye

    def spy(w: object, deadline: float) -> bool:
        seen.append(any(t.name == "stoker-reaper" for t in threading.enumerate()))
        return said_bye(w, deadline)  # type: ignore[arg-type]

    monkeypatch.setattr(_procs, "_said_bye", spy)
    assert not any(t.name == "stoker-reaper" for t in threading.enumerate())
    assert len(list(DataLoader(_Rows(np.arange(8)), batch_size=2, num_workers=2))) == 4
    assert seen == [True, True]
    _join_reapers()
    assert not any(t.name == "stoker-reaper" for t in threading.enumerate())


def test_segments_of_dead_owners_are_swept() -> None:
    """A loader starting workers unlinks stoker segments whose owner process is dead."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = Path(f"/dev/shm/stoker_{dead.pid}_dead_0_1")
    orphan.write_bytes(b"left by a crashed run")
    try:
        ds = TensorDataset(np.arange(8.0), np.arange(8))
        assert len(list(DataLoader(ds, batch_size=4, num_workers=1))) == 2
        assert not orphan.exists()
    finally:
        orphan.unlink(missing_ok=True)


class _Rows(TensorDataset):
    """The user's own class: a fixed worker count never moves it in process."""


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_fifty_epochs_with_persistent_workers_do_not_grow(mode: str) -> None:
    """Soak: over 50 epochs with persistent workers, shared memory in use, the workers'
    memory and the main process's do not grow (slots come and go by one or two; a leak of
    one 1 MiB slot per epoch would add 40 MiB)."""
    ds = _Rows(np.ones((64, 1 << 14), np.float32), np.arange(64))  # 64 KiB rows
    loader = DataLoader(ds, batch_size=16, num_workers=2, persistent_workers=True, worker_mode=mode)
    shm: list[int] = []
    seen = []
    for epoch in range(50):
        for _batch in loader:
            pass
        shm.append(loader.statistics().shared_memory_bytes)
        if epoch in (9, 49):
            pids = loader._iterator._pool.gauges().pids
            seen.append(([_rss_bytes(pid) for pid in pids], _rss_bytes(os.getpid())))
    assert max(shm[40:]) <= max(shm[5:15]) + (4 << 20)
    (workers_early, main_early), (workers_late, main_late) = seen
    assert all(
        late - early < 4 << 20 for early, late in zip(workers_early, workers_late, strict=True)
    )
    assert main_late - main_early < 8 << 20
    del loader
