"""Tests of ``DataLoader.statistics()`` (stoker._stats): counts, times, gauges, agreement."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from stoker._loader import DataLoader
from stoker._stats import LoaderStatistics, measure

_WORKER_SLEEP_S = 0.02
_CONSUMER_SLEEP_S = 0.01


class Rows:
    """Rows of 8 float32; ``sleep_s`` per batch (``__getitems__``) simulates work."""

    def __init__(self, n: int = 40, sleep_s: float = 0.0) -> None:
        self.data = np.arange(n * 8, dtype=np.float32).reshape(n, 8)
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> Any:
        return self.data[i]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return [self.data[i] for i in indices]


def test_statistics_before_iteration_are_zero() -> None:
    """A loader never iterated reports an empty record of the right type."""
    stats = DataLoader(Rows(), batch_size=4).statistics()
    assert isinstance(stats, LoaderStatistics)
    assert stats.batches == 0 and stats.samples == 0 and stats.input_bound == 0.0


def test_statistics_count_batches_samples_and_bytes_in_process() -> None:
    """In process: every batch, sample and array byte delivered is counted."""
    loader = DataLoader(Rows(n=10), batch_size=4)
    batches = list(loader)
    stats = loader.statistics()
    assert stats.batches == 3
    assert stats.samples == 10
    assert stats.bytes_moved == sum(b.nbytes for b in batches) == 10 * 8 * 4
    assert stats.num_workers == 0 and stats.prefetch_factor is None
    assert len(stats.worker_busy_seconds) == 1
    assert stats.skipped_samples == 0 and stats.autotune == ()


def test_statistics_are_frozen() -> None:
    """The record cannot be changed after it is taken."""
    stats = DataLoader(Rows(), batch_size=4).statistics()
    with pytest.raises(AttributeError):
        stats.batches = 3  # type: ignore[misc]


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_statistics_with_workers_count_and_measure_busy_time(mode: str) -> None:
    """With workers: counts match, busy time covers each worker's sleeps, depth is seen."""
    loader = DataLoader(Rows(n=32, sleep_s=0.01), batch_size=4, num_workers=2, worker_mode=mode)
    it = iter(loader)
    next(it)
    mid = loader.statistics()
    assert mid.batches == 1 and mid.prefetch_depth >= 1
    if mode == "process":
        assert mid.shared_memory_bytes > 0
    rest = list(it)
    stats = loader.statistics()
    assert stats.batches == 1 + len(rest) == 8
    assert stats.samples == 32 and stats.bytes_moved == 32 * 8 * 4
    assert stats.num_workers == 2 and stats.prefetch_factor == 2
    assert len(stats.worker_busy_seconds) == 2
    assert sum(stats.worker_busy_seconds) >= 8 * 0.01 * 0.9
    assert stats.prefetch_depth == 0


def test_statistics_do_not_keep_workers_alive() -> None:
    """Dropping the iterator stops its workers even though its statistics remain readable."""
    loader = DataLoader(Rows(n=16), batch_size=4, num_workers=1)
    it = iter(loader)
    next(it)
    del it
    stats = loader.statistics()  # the no-leak fixture checks the worker is gone
    assert stats.batches == 1
    assert stats.shared_memory_bytes == 0 and stats.prefetch_depth == 0


def test_input_bound_fraction_agrees_with_the_consumer() -> None:
    """The reported input-bound fraction is within 5 points of the consumer's own measure."""
    # fork: a spawned or forkserver worker's start would be most of the wait.
    loader = DataLoader(
        Rows(n=64, sleep_s=_WORKER_SLEEP_S),
        batch_size=4,
        num_workers=1,
        multiprocessing_context="fork",
    )
    # Both sides measure the same span, from the iterator's start (its workers started) to
    # the last delivery: what follows (the last step, the epoch's end) is in neither.
    waited, batches = 0.0, len(loader)
    it = iter(loader)
    start = time.perf_counter()
    for k in range(batches):
        t0 = time.perf_counter()
        next(it)
        last = time.perf_counter()
        waited += last - t0
        if k < batches - 1:
            time.sleep(_CONSUMER_SLEEP_S)  # simulated training step
    own = waited / (last - start)
    stats = loader.statistics()
    assert list(it) == []  # the end of the epoch: the worker stops
    assert 0.2 < own < 0.8  # worker 20 ms per batch, consumer 10 ms: about half waiting
    assert abs(stats.input_bound - own) < 0.05


def test_measure_walks_nested_containers() -> None:
    """measure() counts the first array's rows and every array's bytes, through dicts."""
    batch = {"x": np.zeros((3, 5), np.uint8), "y": [np.zeros(3, np.int64)]}
    assert measure(batch, batched=True) == (3, 15 + 24)
    assert measure(batch, batched=False) == (1, 39)


def test_statistics_with_torch_tensors_count_bytes() -> None:
    """Torch tensor batches count their bytes like arrays."""
    torch = pytest.importorskip("torch")
    loader = DataLoader(Rows(n=8), batch_size=4, tensor_type="torch")
    batches = list(loader)
    assert isinstance(batches[0], torch.Tensor)
    assert loader.statistics().bytes_moved == 8 * 8 * 4
