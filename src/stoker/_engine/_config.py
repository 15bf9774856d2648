"""What a loader hands its engine: a frozen configuration, its memory, and its epochs.

Dependencies run one way, loader -> engine: the loader builds an :class:`EngineConfig`
for each iterator (its settings, resolved), owns one :class:`EngineMemory` (what its
iterators and pools learn and keep from one epoch to the next), and hands in an
:class:`Epochs` through which an iterator begins the loader's epochs. The engine reads
and writes only these, never the loader's attributes.
"""

from __future__ import annotations

import multiprocessing.context
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from stoker._engine._buffers import BufferPool
from stoker._placement import Where

if TYPE_CHECKING:
    from stoker._autotune import Autotuner
    from stoker._fetch import IterableFetcher, MapFetcher
    from stoker._state import Epoch
    from stoker._stats import StatsRecorder


@dataclass(frozen=True)
class EngineConfig:
    """A loader's settings as one iterator and its pool run them.

    Attributes:
        make_fetcher: a fresh fetcher (one task in, one batch out), holding no loader.
        dataset: the dataset (pickling note, ``main_process_step``).
        collate_fn: the collate function.
        num_workers: workers given tasks at first.
        capacity: workers the pool is built with (with autotune, the most it may use).
        prefetch: tasks in flight per worker at first.
        worker_mode: who loads (:class:`~stoker._placement.Where`).
        context: the multiprocessing context, or None for the default.
        timeout: seconds to wait for a batch (0: as long as workers live).
        init_fn: ``worker_init_fn``, or None.
        in_order: deliver in sampler order.
        pin_device: where batches are pinned, or None.
        persistent: keep workers between epochs.
        iterable: an iterable dataset.
        auto_collation: batches (a batch sampler), not single samples.
        skip_errors: whether failing samples may be skipped.
        warn_workers: warn when a fixed ``num_workers`` exceeds the CPUs.
        tuner: the loader's autotuner, or None.
        probe: workers time first samples (autotune).
    """

    make_fetcher: Callable[[], MapFetcher | IterableFetcher]
    dataset: Any
    collate_fn: Any
    num_workers: int
    capacity: int
    prefetch: int
    worker_mode: Where
    context: multiprocessing.context.BaseContext | None
    timeout: float
    init_fn: Callable[[int], None] | None
    in_order: bool
    pin_device: str | None
    persistent: bool
    iterable: bool
    auto_collation: bool
    skip_errors: bool
    warn_workers: bool
    tuner: Autotuner | None
    probe: bool = False
    restarts: int = 0  # worker_restarts: dead worker processes replaced per epoch
    ray_options: dict[str, Any] | None = None  # worker_mode="ray": each actor's Ray options


class Epochs(Protocol):
    """How an iterator begins its loader's epochs and reports what the user saw."""

    def start(self) -> Epoch:
        """Begin the next epoch (or the one a loaded state resumes)."""

    def next_number(self) -> int:
        """The number of the epoch :meth:`start` begins next."""

    def base_seed(self) -> int:
        """The loader's base seed."""

    def length(self) -> int:
        """``len(loader)``: batches in an epoch (may raise ``TypeError``)."""

    def delivered(self, yielded: int) -> None:
        """``yielded`` batches of an iterable dataset's epoch reached the user so far."""


class EngineMemory:
    """What a loader's engine keeps from one iterator to the next; owned by the loader and
    dropped with it (pools hold it weakly).

    Attributes:
        stats: the current (or last) iterator's counters, for ``loader.statistics()``.
        first_batch_s: the last epoch's wait for its first batch (see
            :func:`~stoker._policy.starts_lazily`).
        task_group: tiny batches per prefetch slot, once measured (0 before).
        rng_untouched: whether slow batches leave the global RNGs alone (None: not seen).
        mergeable: whether split batches can be joined (None: not seen).
        batch_profile: the last epoch's mean load seconds and bytes per batch.
        warm: under fork, the segments the last pool's workers used, still mapped (and so
            faulted in): the next pool's workers start with them.
        poisoned: samples that killed every worker that loaded them, left out with
            ``skip_errors`` (``worker_restarts``; kept in ``state_dict()``).
    """

    def __init__(self) -> None:
        self.stats: StatsRecorder | None = None
        self.first_batch_s = 0.0
        self.task_group = 0
        self.rng_untouched: bool | None = None
        self.mergeable: bool | None = None
        self.batch_profile = (0.0, 0.0)
        self.warm: list[tuple[str, Any]] = []
        self.poisoned: set[Any] = set()
        self._buffers: dict[bool, BufferPool] = {}

    def take_warm(self) -> list[tuple[str, Any]]:
        """The warm segments, handed to a new pool's workers (and so no longer kept here)."""
        warm, self.warm = self.warm, []
        return warm

    def buffers(self, keep: int, shared: bool = True) -> BufferPool:
        """The loader's pool of reusable batch memory (made on first use), keeping at least
        ``keep`` free buffers; ``shared=False`` gives its pool of private memory."""
        pool = self._buffers.get(shared)
        if pool is None:
            pool = self._buffers[shared] = BufferPool(keep, shared)
        pool.keep = max(pool.keep, keep)
        return pool
