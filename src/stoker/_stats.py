"""Loader statistics: what ``DataLoader.statistics()`` returns, and the counters behind it.

Every iterator (in-process or with workers) owns a :class:`StatsRecorder` and registers it
on its loader; ``loader.statistics()`` turns the latest one into a frozen
:class:`LoaderStatistics`. The hot path is a few additions and one
``time.perf_counter()`` per batch, with no locks: the recorder is only written by the
thread that iterates (worker busy times arrive with the results, read on that thread).
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from stoker._cache import CacheStatistics


@dataclass(frozen=True)
class LoaderStatistics:
    """What one iterator of a loader did so far (the current one, or the last).

    Attributes:
        batches: batches delivered to the consumer.
        samples: samples in those batches (1 per item without automatic batching).
        wait_seconds: time the consumer spent inside ``__next__`` waiting for data.
        wall_seconds: time from the iterator's start to its latest delivery (or end).
        input_bound: ``wait_seconds / wall_seconds``: near 1, training waits for data.
        worker_busy_seconds: per worker (in process: one), time spent fetching and collating.
        bytes_moved: bytes of the arrays and tensors delivered.
        shared_memory_bytes: shared memory the main process has mapped for batches.
        prefetch_depth: tasks in flight at the latest delivery.
        skipped_samples: samples left out because they failed to load (``skip_errors``).
        num_workers: workers in use now (0 in process).
        prefetch_factor: tasks in flight per worker allowed now (None in process).
        autotune: the autotuner's decisions, oldest first (empty without ``"auto"``).
        cache: what the dataset's cache (:func:`stoker.cached`) did, over all workers.

    >>> loader = DataLoader(np.arange(10), batch_size=4)
    >>> _ = list(loader)
    >>> stats = loader.statistics()
    >>> stats.batches, stats.samples, stats.num_workers
    (3, 10, 0)
    """

    batches: int
    samples: int
    wait_seconds: float
    wall_seconds: float
    input_bound: float
    worker_busy_seconds: tuple[float, ...]
    bytes_moved: int
    shared_memory_bytes: int
    prefetch_depth: int
    skipped_samples: int
    num_workers: int
    prefetch_factor: int | None
    autotune: tuple[str, ...]
    cache: CacheStatistics | None = None
    resume: str = "skip"  # how a checkpoint resumes the epoch: "skip", "state" or "replay"
    worker_restarts: tuple[str, ...] = ()  # each dead worker replaced and why, in order

    @property
    def samples_per_second(self) -> float:
        """Samples delivered per second of wall time (0 before the first batch)."""
        return self.samples / self.wall_seconds if self.wall_seconds > 0 else 0.0


_FLAT = (tuple, list)


def measure(batch: Any, batched: bool) -> tuple[int, int]:
    """(samples, bytes) of a delivered batch: its first array's length, and all arrays' bytes.

    Walks tuples, lists and dicts (not other containers); objects with ``nbytes`` (NumPy
    arrays, torch tensors) count.

    >>> import numpy as np
    >>> measure((np.zeros((4, 2), np.float32), np.zeros(4, np.int64)), batched=True)
    (4, 64)
    >>> measure({"x": [1, 2]}, batched=False)
    (1, 0)
    """
    if type(batch) in _FLAT and batch and all(type(a) is np.ndarray for a in batch):
        # the common batch, a tuple or list of arrays: no walk
        first = len(batch[0]) if batch[0].ndim and batched else 1
        return first, sum(a.nbytes for a in batch)
    nbytes = 0
    first = -1
    stack = [batch]
    while stack:
        obj = stack.pop()
        size = getattr(obj, "nbytes", None)
        if isinstance(size, int):
            nbytes += size
            if first < 0:
                try:
                    shape: Any = getattr(obj, "shape", ())
                except RuntimeError:  # a nested tensor has no one shape
                    shape = ()
                first = int(shape[0]) if len(shape) else 1
        elif isinstance(obj, (tuple, list)):
            stack.extend(reversed(obj))
        elif isinstance(obj, dict):
            stack.extend(reversed(list(obj.values())))
    if not batched or first < 0:
        first = 1
    return first, nbytes


class StatsRecorder:
    """The running counters of one iterator (see the module docstring).

    Args:
        workers: how many worker busy times to keep (1 in process).
        batched: whether batches are collated (their first dimension counts samples).
        gauges: returns (shared memory bytes, tasks in flight) now; held weakly when it
            is a bound method, so statistics never keep an iterator (and its workers) alive.
    """

    __slots__ = (
        "_gauges",
        "batched",
        "batches",
        "busy",
        "bytes",
        "decisions",
        "last",
        "prefetch",
        "restarts",
        "samples",
        "skipped",
        "start",
        "wait",
        "workers",
    )

    def __init__(
        self,
        workers: int,
        batched: bool,
        gauges: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        self.batched = batched
        self.batches = 0
        self.samples = 0
        self.skipped = 0
        self.wait = 0.0
        self.bytes = 0
        self.busy = [0.0] * max(1, workers)
        self.workers = workers  # in use now; the iterator updates it (and prefetch)
        self.prefetch: int | None = None
        self.decisions: list[str] = []
        self.restarts: list[str] = []  # dead workers replaced, and why
        self.start = time.perf_counter()
        self.last = self.start
        self._gauges: Any = None
        if gauges is not None:
            self._gauges = (
                weakref.WeakMethod(gauges) if hasattr(gauges, "__self__") else lambda: gauges
            )

    def delivered(self, batch: Any, entered: float) -> None:
        """Count a batch handed to the consumer by a ``__next__`` entered at ``entered``."""
        now = time.perf_counter()
        self.wait += now - entered
        self.last = now
        self.batches += 1
        samples, nbytes = measure(batch, self.batched)
        self.samples += samples
        self.bytes += nbytes

    def ended(self, entered: float) -> None:
        """Count the wait of the ``__next__`` call that found the epoch over."""
        now = time.perf_counter()
        self.wait += now - entered
        self.last = now

    def snapshot(self) -> LoaderStatistics:
        """The counters now, as a frozen record."""
        shm = depth = 0
        get = self._gauges() if self._gauges is not None else None
        if get is not None:
            shm, depth = get()
        wall = self.last - self.start
        return LoaderStatistics(
            batches=self.batches,
            samples=self.samples,
            wait_seconds=self.wait,
            wall_seconds=wall,
            input_bound=min(1.0, self.wait / wall) if wall > 0 else 0.0,
            worker_busy_seconds=tuple(self.busy[: max(1, self.workers)]),
            bytes_moved=self.bytes,
            shared_memory_bytes=shm,
            prefetch_depth=depth,
            skipped_samples=self.skipped,
            num_workers=self.workers,
            prefetch_factor=self.prefetch,
            autotune=tuple(self.decisions),
            worker_restarts=tuple(self.restarts),
        )


def empty(decisions: tuple[str, ...] = ()) -> LoaderStatistics:
    """The statistics of a loader that was never iterated.

    >>> empty().batches
    0
    """
    return LoaderStatistics(0, 0, 0.0, 0.0, 0.0, (), 0, 0, 0, 0, 0, None, decisions)


def with_cache(stats: LoaderStatistics, dataset: Any) -> LoaderStatistics:
    """``stats`` with the statistics of the dataset's cache filled in."""
    from stoker._cache import find  # the cache module needs no statistics back

    cache = find(dataset)
    return stats if cache is None else dataclasses.replace(stats, cache=cache.statistics())
