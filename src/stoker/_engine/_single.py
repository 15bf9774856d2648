"""The single-process iterator: seed, fetch, collate and (optionally) pin in the main process."""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, Any

from stoker._engine._interrupts import raise_pending
from stoker._engine._pin import pin
from stoker._policy import IN_PROCESS_BUFFERS
from stoker._random import call_seeded, mix_seed
from stoker._stats import StatsRecorder

if TYPE_CHECKING:
    from stoker._engine._config import EngineConfig, EngineMemory, Epochs
    from stoker._state import Epoch


class SingleProcessIterator:
    """One epoch of a DataLoader loading in the main process, batch by batch on ``__next__``.

    Used with ``num_workers=0`` or when the autotuner chose it. Before batch ``k`` is
    fetched, the global RNGs are seeded from (seed, epoch, k), as a worker would seed them,
    so augmentations match any worker count; after it the caller's own streams go on (see
    :func:`~stoker._random.call_seeded`). A dataset that surely draws nothing (see
    :func:`~stoker._dataset.draws_nothing`) is fetched unseeded. With ``skip_errors``, a
    batch whose samples all failed is dropped (the next one is fetched).

    Large leaves are collated into the loader's reusable buffers
    (:mod:`stoker._engine._buffers`): a buffer returns only when the last view of the batch
    that used it is gone, so a batch the user holds is never overwritten, and the next
    batches write into memory already mapped.
    """

    def __init__(
        self, config: EngineConfig, memory: EngineMemory, epochs: Epochs, epoch: Epoch | None = None
    ) -> None:
        self._created = time.perf_counter()  # the sampler's draw counts in the epoch
        self._epochs = epochs
        self._tuner = tuner = config.tuner  # the autotuner that chose to load in process
        self._epoch = epoch if epoch is not None else epochs.start()  # or one begun with workers
        fetcher = config.make_fetcher()
        self._stream_fetcher: Any = fetcher if config.iterable else None
        if config.iterable:
            self._watch_stream(fetcher)
        self._fetch = fetcher.fetch_skipping
        self._seeded = fetcher.draws
        self._alloc = memory.buffers(IN_PROCESS_BUFFERS, shared=False).alloc
        self._pin_device = config.pin_device
        # e.g. ImageFolder(decode="gpu"): the dataset's step on each batch, before pinning
        self._step = getattr(config.dataset, "main_process_step", None)
        self._iterable = config.iterable
        self._yielded = 0
        self._stats = StatsRecorder(0, config.auto_collation)
        if tuner is not None:
            self._stats.decisions = tuner.decisions
        memory.stats = self._stats

    def _watch_stream(self, fetcher: Any) -> None:
        """A stateful stream in process: it resumes from the state of the epoch's checkpoint,
        and a checkpoint reads its state then (nothing travels per batch)."""
        stream = self._epoch.stream
        if stream is None:
            return
        if stream.handover:
            fetcher.resume = stream.handover[0]
        stream.live = fetcher.state
        self._stream_fetcher = None  # watched

    @property
    def _workers(self) -> list[Any]:
        """No workers: ``[]`` where the loader has workers but loads in process (autotune);
        with ``num_workers=0`` there is no such attribute, as on torch's iterator."""
        if self._tuner is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute '_workers'")
        return []

    @property
    def epoch(self) -> Epoch:
        """The epoch this iterator began (a worker-backed iterator may take it over)."""
        return self._epoch

    def first_load_s(self, below_s: float) -> float | None:
        """Seconds this process takes to load the epoch's first batch (median of three),
        where nothing is drawn and it takes under ``below_s``; else None. Parts of it
        doubling from one sample come first, so finding a slow batch out costs under
        about ``4 * below_s``. The batch stays the epoch's first, loaded in its turn."""
        epoch = self._epoch
        first = next(epoch.tasks, None)
        epoch.tasks = itertools.chain([first] if first else [], epoch.tasks)
        if first is None or self._seeded or not hasattr(first[1], "__len__"):
            return None
        task, size, times = first[1], 1, list[float]()
        while len(times) < 3:
            start = time.perf_counter()
            try:
                self._fetch(task[:size], self._alloc)
            except Exception:  # raised in its turn, as the batch loads for the user
                return None
            seconds = time.perf_counter() - start
            if seconds >= below_s:
                return None
            if size >= len(task):
                times.append(seconds)
            size *= 2
        return sorted(times)[1]

    def __iter__(self) -> SingleProcessIterator:
        return self

    def __next__(self) -> Any:
        raise_pending()  # a Ctrl-C that landed while a batch's memory went home
        entered = time.perf_counter()
        epoch = self._epoch
        while True:
            try:
                k, task = next(epoch.tasks)
                if self._seeded:
                    seed = mix_seed(epoch.seed, epoch.number, k)
                    data, skipped = call_seeded(seed, self._fetch, task, self._alloc)
                else:
                    data, skipped = self._fetch(task, self._alloc)
            except StopIteration:
                self._stats.ended(entered)
                epoch.finish()
                if self._tuner is not None:
                    self._tuner.epoch_done(self._stats, self._stats.last - self._created)
                raise
            if skipped is not None:
                epoch.skip(k, skipped)  # raises past the cap
                self._stats.skipped += len(skipped.indices)
            if epoch.deliver(k) and (skipped is None or not skipped.dropped):
                break
        if self._step is not None:
            data = self._step(data)
        if self._pin_device is not None:
            data = pin(data, self._pin_device)
        self._stats.delivered(data, entered)
        self._stats.busy[0] = self._stats.wait  # in process, fetching is all the waiting
        self._yielded += 1
        if self._iterable:
            self._epochs.delivered(self._yielded)
            fetcher = self._stream_fetcher
            if fetcher is not None and fetcher.stateful and self._epoch.make_stream is not None:
                self._start_stream()  # the dataset's iterator turned out stateful
        return data

    def _start_stream(self) -> None:
        epoch = self._epoch
        assert epoch.make_stream is not None and self._stream_fetcher is not None
        epoch.stream = epoch.make_stream(None)
        epoch.stream.step = self._yielded
        self._watch_stream(self._stream_fetcher)

    def __len__(self) -> int:
        return self._epochs.length()
