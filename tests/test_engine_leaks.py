"""Leaks and bounds: many iterators created, partly consumed and dropped leave nothing."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import numpy as np

from conftest import _snapshot, leftovers
from stoker import DataLoader, TensorDataset


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
            fds = _snapshot()["open file descriptors"] - before["open file descriptors"]
            most = max(most, len(fds))
    assert most <= 2 * 2 + 2  # one mapping per warm segment: at most the arena's keep_free
    del loader
    assert leftovers(before) == {}


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
