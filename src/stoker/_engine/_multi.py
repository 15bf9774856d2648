"""The worker-backed iterator: dispatch, prefetch window, ordering, timeouts and shutdown.

:class:`MultiWorkerIterator` runs in the thread that iterates the loader. It keeps
``prefetch_factor * num_workers`` tasks in flight, numbers them, and delivers the batches
in task order (``in_order=True``) or as they come. Where the user's code runs in the
workers, tasks go round robin, as torch assigns them; where only stoker's code runs
(:func:`~stoker._policy.assigns_freely`), later fork workers start lazily, a task goes to
the worker with the fewest in flight, tiny batches are grouped
(:func:`~stoker._policy.group_size`) and an epoch's tail may be split
(:mod:`stoker._engine._tail`). A batch is seeded from (seed, epoch, index), so which
worker runs it does not matter. See ``docs/engine.md``, "Assignment".

The pool (:mod:`stoker._engine._pool`) is shut down by a ``weakref.finalize``: at the end
of an epoch (unless ``persistent_workers``), on garbage collection, at exit, and before a
fatal error is raised. Also here: :func:`workers_warning` (more workers than CPUs, as
torch warns).
"""

from __future__ import annotations

import time
import warnings
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stoker._collate import DefaultCollate
from stoker._engine._interrupts import raise_pending
from stoker._engine._messages import (
    Exhausted,
    Loaded,
    LoadedGroup,
    Probe,
    Ready,
    StartFailed,
    Task,
    ToIterator,
)
from stoker._engine._pin import pin, slot_pins
from stoker._engine._pool import ProcessPool, ThreadPool, WorkerPool
from stoker._engine._tail import concat, mergeable, plan
from stoker._engine._transport import RemoteError
from stoker._engine._worker import worker_seed
from stoker._osprobe import available_cpus
from stoker._policy import (
    GROUP_AFTER,
    JOIN_BUFFERS,
    LAZY_START_S,
    assigns_freely,
    group_size,
    starts_lazily,
    typical_load_s,
    worth_splitting,
)
from stoker._random import mix_seed
from stoker._stats import StatsRecorder
from stoker.errors import CollateError, WorkerError

if TYPE_CHECKING:
    from stoker._engine._config import EngineConfig, EngineMemory, Epochs

_HEALTH_CHECK_S = 5.0
"""Longest single wait for a result; deaths are seen at once, this only bounds the call."""
_START_TIMEOUT_S = 120.0
"""``timeout`` counts from a worker's start-up; before it, start-up (spawn imports) may take
this long."""


class _Skip:
    """Marks a task index with nothing to deliver: its worker had no more data (iterable
    datasets), or it is a part of a split batch delivered at its first part's place."""


_SKIP = _Skip()


class _Failure:
    """A task that raised in its worker; raised again when its turn comes."""

    def __init__(self, remote: RemoteError) -> None:
        self.remote = remote


class MultiWorkerIterator:
    """One epoch (or, with ``persistent_workers``, every epoch) of a loader with workers.

    Created by ``DataLoader.__iter__`` in the thread that iterates; ``__next__`` must be
    called from one thread at a time. :meth:`restart` starts the next epoch on the same
    workers.
    """

    def __init__(self, config: EngineConfig, memory: EngineMemory, epochs: Epochs) -> None:
        self._created = time.perf_counter()  # the first epoch pays the workers' start
        self._config, self._memory, self._epochs = config, memory, epochs
        if config.warn_workers:
            workers_warning(config.num_workers, config.worker_mode)
        # Autotune (num_workers / prefetch_factor "auto"): the pool is built for the
        # tuner's capacity, and only the first _num_workers workers get tasks.
        self._tuner = config.tuner
        self._num_workers, self._prefetch = config.num_workers, config.prefetch
        # torch's assignment where the user's code could see it, else stoker's own.
        self._free = assigns_freely(
            config.dataset, config.collate_fn, config.iterable, config.init_fn
        )
        # Batches per prefetch slot; 0 until GROUP_AFTER are measured (in an earlier epoch).
        self._group = memory.task_group if self._free else 1
        # Process workers get a group's batches as one task, answered in one slot.
        self._group_tasks = config.worker_mode == "process" and not config.iterable
        self._in_order = config.in_order
        self._iterable = config.iterable
        # e.g. ImageFolder(decode="gpu"): the dataset's step on each batch, before pinning
        self._step = getattr(config.dataset, "main_process_step", None)
        # The tail of an epoch may be split across processes (see stoker._engine._tail);
        # not batches shaped for a dataset's step (their columns need not join).
        self._can_split = self._free and self._step is None and _splittable(config)
        self._busy_sum, self._busy_n = 0.0, 0  # load seconds of whole batches
        self._first_loads: list[float] = []  # of the first ones, to size the group
        self._persistent = config.persistent
        self._timeout = config.timeout
        # Workers start seeded from base + id, as in torch (an iterable dataset's base is
        # the epoch's: see worker_seed).
        pool = self._pool = self._make_pool(epochs.next_number())
        self._started = [False] * config.capacity
        self._finalizer = weakref.finalize(self, pool.shutdown)
        self._generation = 0
        pool.limit_start(self._num_workers)
        # Lazy start pays off when the first batch comes sooner than the other forks take.
        self._lazy = starts_lazily(self._free, pool.lazy_start, memory.first_batch_s)
        try:
            pool.start(1)  # first: it starts up while the sampler draws
            self._reset()  # queues the first tasks: a worker not started gets them as it starts
            if not self._lazy:
                pool.start()  # each one busy with its tasks while the next one forks
        except BaseException:  # Ctrl-C, a sampler that raises: no worker outlives iter()
            self._finalizer()
            raise

    def _make_pool(self, epoch: int) -> WorkerPool:
        """The pool of ``config.capacity`` workers, seeded for ``epoch``."""
        config = self._config
        seeds = self._worker_seeds(epoch, config.capacity)
        if config.worker_mode == "thread":
            self._pin_device = None  # threads pin their own batches
            return ThreadPool(config, self._memory, seeds)
        pool = ProcessPool(config, self._memory, seeds)
        self._pin_device = config.pin_device
        pins = slot_pins(config.pin_device)  # one copy: the slots themselves are pinned
        for w in pool.workers:
            w.maps.pins = pins
        return pool

    # -- epochs ------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """Whether the workers can still serve epochs (persistent workers are reused)."""
        return self._pool.alive

    def restart(self) -> None:
        """Start the next epoch on the same (persistent) workers."""
        self._reset()

    def shutdown(self) -> None:
        """Stop the workers now (also done on garbage collection and at the epoch's end
        without ``persistent_workers``)."""
        self._finalizer()

    def _reset(self) -> None:
        """Start an epoch: fresh tasks and seed, results of an unfinished one discarded."""
        if self._generation:
            self._pool.new_epoch()  # persistent workers start another epoch
        self._generation += 1
        # The epoch's time, as the tuner compares it with loading in process, counts the
        # sampler's draw, as SingleProcessIterator's does.
        self._drawing = time.perf_counter()
        # The loader numbers the epoch's tasks (k) and records deliveries for state_dict.
        self._epoch_state = self._epochs.start()
        self._seed = self._epoch_state.seed
        self._epoch = self._epoch_state.number
        self._tasks = self._epoch_state.tasks
        # An iterable dataset's workers are seeded per epoch; each task carries its seed.
        self._epoch_seeds = self._worker_seeds(self._epoch, len(self._started))
        self._k_of: dict[int, int] = {}  # send index -> batch index in the epoch
        self._probe: Any = None  # the epoch's first task (see _load_in_process)
        self._tasks_done = False
        self._send_idx = 0
        self._rcv_idx = 0
        self._popped = 0  # results taken from _ready (delivered, skipped or raised)
        self._outstanding = [0] * self._num_workers  # sent, not yet answered
        self._undelivered = [0] * self._num_workers  # sent, not yet delivered (or ended)
        self._task_worker: dict[int, int] = {}  # send index -> worker, until answered
        self._owner: dict[int, int] = {}  # send index -> worker, until delivered
        self._ready: dict[int, Any] = {}
        self._splits: dict[int, tuple[int, list[Any]]] = {}  # k -> (first send index, parts)
        self._share: dict[int, float] = {}  # send index of a part -> its share of the batch
        self._since = [time.perf_counter()] * self._num_workers  # each one's task began
        self._active = [True] * self._num_workers
        self._next_worker = 0
        self._yielded = 0
        self._began = time.perf_counter()
        # Worker processes running before this epoch: one that starts more (the first, or
        # one where autotune adds some) is no measure of the next (see __next__).
        self._started_before = 0 if self._generation == 1 else len(self._pool.started_pids())
        self._stats = StatsRecorder(len(self._started), self._config.auto_collation, self._gauges)
        self._stats.workers, self._stats.prefetch = self._num_workers, self._prefetch
        if self._tuner is not None:
            self._stats.decisions = self._tuner.decisions
            self._tuner.begin(self._stats)
        self._memory.stats = self._stats
        self._refill()

    def _worker_seeds(self, epoch: int, count: int) -> list[int]:
        """Each worker's seed in ``epoch`` (see :func:`~stoker._engine._worker.worker_seed`)."""
        base = self._epochs.base_seed()
        return [worker_seed(base, epoch, wid, self._iterable) for wid in range(count)]

    def _judged_by_this_epoch(self) -> bool:
        """Whether the tuner may judge workers by this epoch: persistent workers start
        once, so an epoch that started some is no measure of the next ones (fresh workers
        pay for their start in every epoch)."""
        return not self._persistent or len(self._pool.started_pids()) <= self._started_before

    def _load_in_process(self) -> float | None:
        """Seconds the main process takes to load the epoch's first batch itself (median of
        three), when only stoker's code loads it (nothing runs that could be seen, nothing
        is drawn); else None. Workers' time per batch overstates it: they share the cores
        with each other and the main process."""
        fetcher = self._config.make_fetcher()
        if fetcher.draws or self._probe is None:
            return None
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fetcher.fetch(self._probe)
            times.append(time.perf_counter() - start)
        return sorted(times)[1]

    def _end(self) -> None:
        if not self._persistent:
            self._finalizer()

    # -- dispatch ----------------------------------------------------------------------

    def _choose(self, depth: int) -> int | None:
        """The worker for the next task, or None to send nothing now.

        torch's choice where the user's code runs (see the module docstring): the next
        worker in the cycle that still has data, and with ``in_order=False`` fewer than its
        share of the window undelivered. Else the started worker with the fewest tasks in
        flight, if it has fewer than ``depth``.
        """
        n = self._num_workers
        if not self._free:
            active = sum(self._active)
            share = (depth * n) // max(1, active)
            for _ in range(n):
                wid = self._next_worker
                self._next_worker = (wid + 1) % n
                if self._active[wid] and (self._in_order or self._undelivered[wid] < share):
                    return wid
            return None
        ready: Sequence[int] = range(n)
        if self._lazy and self._pool.pending_start:  # to started workers: others take a while
            ready = [w for w in ready if self._pool.is_started(w)] or ready
        wid = min(ready, key=self._outstanding.__getitem__)
        return wid if self._outstanding[wid] < depth else None

    @property
    def _depth(self) -> int:
        """Tasks in flight per worker: ``prefetch_factor`` slots of :attr:`_group` batches
        (of single batches until the epoch's first is out: it comes sooner)."""
        return self._prefetch * max(1, self._group) if self._yielded else self._prefetch

    def _size_group(self) -> None:
        """Fix :attr:`_group` from the first batches' mean bytes and median load time (a
        worker's first batch pays for its start-up: a mean would count that)."""
        stats = self._stats
        seconds = typical_load_s(self._first_loads)
        self._group = 1 if self._iterable else group_size(stats.bytes / stats.batches, seconds)
        self._memory.task_group = self._group

    def _refill(self) -> None:
        """Fill every worker's prefetch window; one message per worker for all its tasks."""
        sends: dict[int, list[Task]] = {}
        depth = self._depth
        window = depth * self._num_workers
        in_flight = self._send_idx - self._popped
        if self._group > 1 and window - in_flight < self._group and in_flight:
            return  # tiny batches: send a group's worth of tasks at a time
        while not self._tasks_done and self._send_idx - self._popped < window:
            wid = self._choose(depth)
            if wid is None:
                break
            try:
                k, task = next(self._tasks)
            except StopIteration:
                self._tasks_done = True
                break
            if self._probe is None:
                self._probe = task
            if self._iterable:  # the worker's seed for the epoch: it seeds itself once
                self._queue(sends, wid, [k], task, self._epoch_seeds[wid])
                continue
            if self._group > 1 and self._group_tasks and self._yielded:  # first one alone
                self._queue_group(sends, wid, k, task, depth, window)
                continue
            seed = mix_seed(self._seed, self._epoch, k)
            parts = self._plan_split(k, task)
            if parts is None:
                self._queue(sends, wid, [k], task, seed)
                continue
            self._memory.buffers(JOIN_BUFFERS).warm()  # the join's memory, meanwhile
            first, start = self._send_idx, 0
            for w, count in parts:
                idx = self._queue(sends, w, [k], task[start : start + count], seed)
                self._share[idx] = count / len(task)
                start += count
            self._splits[k] = (first, [None] * len(parts))
        for wid, tasks in sends.items():
            self._pool.send(wid, tasks)

    def _queue(
        self, sends: dict[int, list[Task]], wid: int, ks: list[int], task: Any, seed: Any
    ) -> int:
        """Number ``task`` (batch ``ks[0]``, or a group's batches ``ks``: one task index
        each) and add it to worker ``wid``'s message; returns its first task index."""
        idx = self._send_idx
        self._send_idx += len(ks)
        for j, k in enumerate(ks, idx):
            self._k_of[j] = k
            self._task_worker[j] = wid
            self._owner[j] = wid
        self._undelivered[wid] += len(ks)
        sends.setdefault(wid, []).append(Task(self._generation, idx, task, seed))
        if not self._outstanding[wid]:
            self._since[wid] = time.perf_counter()
        self._outstanding[wid] += len(ks)
        return idx

    def _queue_group(
        self, sends: dict[int, list[Task]], wid: int, k: int, task: Any, depth: int, window: int
    ) -> None:
        """Queue batch ``k`` and the next ones, as many as a group, the worker's window and
        the loader's allow, as one task for worker ``wid`` (numbered one by one)."""
        n = min(self._group, depth - self._outstanding[wid], window - self._send_idx + self._popped)
        ks, tasks = [k], [task]
        while len(ks) < n:
            try:
                k, task = next(self._tasks)
            except StopIteration:
                self._tasks_done = True
                break
            ks.append(k)
            tasks.append(task)
        self._queue(sends, wid, ks, tasks, (self._seed, self._epoch, ks))

    def _plan_split(self, k: int, task: Any) -> list[tuple[int, int]] | None:
        """How to split batch ``k`` among workers that would otherwise idle, or None."""
        memory = self._memory
        if not (self._can_split and memory.mergeable and memory.rng_untouched):
            return None
        try:
            remaining = self._epochs.length() - k
        except TypeError:  # a batch sampler without a length: the tail is unknown
            return None
        mean, nbytes = self._profile()
        if remaining >= self._num_workers or len(task) < 2 or not worth_splitting(mean, nbytes):
            return None
        now = time.perf_counter()
        loads = [0.0] * self._num_workers
        running: dict[int, int] = {}
        for idx, w in self._task_worker.items():  # in the order sent: a worker's first runs
            loads[w] += self._share.get(idx, 1.0)
            running.setdefault(w, idx)
        for w, idx in running.items():
            loads[w] -= min(self._share.get(idx, 1.0), (now - self._since[w]) / mean)
        return plan(len(task), loads, remaining)

    def _profile(self) -> tuple[float, float]:
        """Mean load seconds and bytes of this epoch's whole batches, or (before the first
        is in) of the last epoch's."""
        if not self._busy_n:
            return self._memory.batch_profile
        return self._busy_sum / self._busy_n, self._stats.bytes / max(1, self._stats.batches)

    # -- results -----------------------------------------------------------------------

    def __iter__(self) -> MultiWorkerIterator:
        return self

    def __len__(self) -> int:
        return self._epochs.length()

    def __next__(self) -> Any:
        raise_pending()  # a Ctrl-C that landed while a batch's memory went home
        entered = time.perf_counter()
        if not self._pool.alive:
            raise StopIteration
        self._pool.flush_freed()  # the batch delivered last time may have died by now
        if self._yielded and self._pool.pending_start:
            self._pool.start()  # the first batch is out: now start the other workers
        while True:
            got = self._pop_ready()
            if got is not None:
                self._refill()  # its place in the window is free: keep the workers busy
                k, item, skipped = got
                if skipped is not None:  # counted in task order: the same in every run
                    self._epoch_state.skip(k, skipped)  # raises past the cap
                    self._stats.skipped += len(skipped[0])
                if not self._epoch_state.deliver(k):
                    continue  # delivered before the checkpoint this epoch resumes from
                if skipped is not None and skipped[2]:
                    continue  # every sample of the batch failed: it is dropped
                return self._deliver(item, entered)
            if not any(self._outstanding) and (self._tasks_done or not any(self._active)):
                self._stats.ended(entered)
                self._epoch_state.finish()
                if self._tuner is not None and self._judged_by_this_epoch():
                    began = self._created if self._generation == 1 else self._drawing
                    seconds = self._stats.last - began
                    self._tuner.epoch_done(self._stats, seconds, self._load_in_process)
                self._memory.batch_profile = self._profile()  # the next epoch's tail plan
                self._end()
                raise StopIteration
            self._handle(*self._wait())
            # Results that came in the same read are handled now, without a system call,
            # so the tasks that replace them go out together.
            while (more := self._pool.buffered()) is not None:
                self._handle(*more)
            self._refill()

    def _pop_ready(self) -> Any:
        ready = self._ready
        if self._in_order:
            while ready.get(self._rcv_idx) is _SKIP:
                del ready[self._rcv_idx]
                self._release(self._rcv_idx)
                self._rcv_idx += 1
            if self._rcv_idx in ready:
                self._rcv_idx += 1
                self._release(self._rcv_idx - 1)
                return ready.pop(self._rcv_idx - 1)
            return None
        if ready:
            idx = next(iter(ready))
            self._release(idx)
            return ready.pop(idx)
        return None

    def _release(self, idx: int) -> None:
        """Task ``idx`` leaves the window: delivered, skipped or raised."""
        self._popped += 1
        self._undelivered[self._owner.pop(idx)] -= 1

    def _deliver(self, item: Any, entered: float) -> Any:
        if isinstance(item, _Failure):
            raise item.remote.rebuild()
        if self._step is not None:
            item = self._step(item)
        if self._pin_device is not None:
            item = pin(item, self._pin_device)
        self._stats.delivered(item, entered)
        if not self._group and self._stats.batches >= GROUP_AFTER:
            self._size_group()
            self._refill()
        if not self._yielded:
            self._memory.first_batch_s = time.perf_counter() - self._began
        if self._tuner is not None and not self._tuner.settled:
            self._autotune()
        self._yielded += 1
        if self._iterable:
            self._epochs.delivered(self._yielded)
        return item

    def _waiting_for(self) -> int:
        if self._in_order and self._rcv_idx in self._task_worker:
            return self._task_worker[self._rcv_idx]
        return max(range(self._num_workers), key=self._outstanding.__getitem__)

    def _wait(self) -> tuple[int, ToIterator]:
        if self._pool.pending_start:
            if self._pool.is_started(self._waiting_for()):
                got = self._pool.get(LAZY_START_S)
                if got is not None:
                    return got
            self._pool.start()  # the first batch is slow, or queued for an unstarted worker
        if self._timeout > 0:
            wid = self._waiting_for()
            limit = self._timeout if self._started[wid] else _START_TIMEOUT_S
            got = self._pool.get(limit)
            if got is None:
                who = self._pool.describe(wid)
                self._pool.shutdown(grace_s=0.0)  # a stuck worker would not stop anyway
                self._finalizer()
                raise WorkerError(
                    f"DataLoader timed out after {self._timeout:g} seconds waiting for a "
                    f"batch from {who}, which is alive but made no progress. Raise timeout= "
                    "(or set it to 0 to wait as long as workers live), or find what blocks "
                    "in the dataset."
                )
            return got
        while True:
            got = self._pool.get(_HEALTH_CHECK_S)
            if got is not None:
                return got

    def _handle(self, wid: int, msg: ToIterator) -> None:
        if isinstance(msg, Ready):
            self._started[wid] = True
            return
        if isinstance(msg, StartFailed):  # dataset unpickling, worker_init_fn
            self._finalizer()
            raise msg.error.rebuild()
        if msg.generation != self._generation:
            return  # a result of an abandoned epoch (a batch's slot returns as it dies)
        if isinstance(msg, LoadedGroup):
            self._handle_group(wid, msg)
            return
        if isinstance(msg, Probe):  # a worker's first samples, timed (autotune)
            if self._tuner is not None:
                self._autotune(msg)
            return
        idx = msg.idx
        self._outstanding[wid] -= 1
        del self._task_worker[idx]
        k = self._k_of.pop(idx)
        self._since[wid] = time.perf_counter()  # its next task starts now
        if isinstance(msg, Exhausted):
            self._active[wid] = False
            if self._in_order:
                self._ready[idx] = _SKIP
            else:
                self._release(idx)  # nothing to deliver: it leaves the window now
            return
        if isinstance(msg, Loaded):
            self._stats.busy[wid] += msg.busy  # the worker's fetch + collate seconds
            item = (k, msg.batch, msg.skipped)
            if idx not in self._share:
                self._busy_sum += msg.busy
                self._busy_n += 1
                if len(self._first_loads) < GROUP_AFTER:
                    self._first_loads.append(msg.busy)
                if self._memory.mergeable is None:
                    self._memory.mergeable = mergeable(msg.batch)
            if msg.untouched is not None:  # a slow batch: did it draw from the global RNGs?
                seen = self._memory.rng_untouched
                self._memory.rng_untouched = msg.untouched and seen is not False
        else:
            item = (k, _Failure(msg.error), None)
        if k in self._splits:
            self._part_done(k, idx, item[1])
        else:
            self._ready[idx] = item

    def _handle_group(self, wid: int, msg: LoadedGroup) -> None:
        """Make the batches of a group ready, each at its own task index."""
        batches, first, skipped = msg.batches, msg.idx, msg.skipped
        self._outstanding[wid] -= len(batches)
        self._since[wid] = time.perf_counter()
        self._stats.busy[wid] += msg.busy
        self._busy_sum += msg.busy
        self._busy_n += len(batches)
        for j, batch in enumerate(batches, first):
            del self._task_worker[j]
            k = self._k_of.pop(j)
            if type(batch) is RemoteError:
                self._ready[j] = (k, _Failure(batch), None)
            else:
                self._ready[j] = (k, batch, skipped[j - first] if skipped else None)

    def _part_done(self, k: int, idx: int, part: Any) -> None:
        """Keep a part of split batch ``k``; with the last one, the batch is ready."""
        first, parts = self._splits[k]
        parts[idx - first] = part
        del self._share[idx]
        if all(p is not None for p in parts):
            del self._splits[k]
            failed = [p for p in parts if isinstance(p, _Failure)]
            self._ready[first] = (k, failed[0] if failed else self._join(k, parts), None)
        if idx != first:  # the batch is delivered at its first part's place in the order
            if self._in_order:
                self._ready[idx] = _SKIP
            else:
                self._release(idx)

    def _join(self, k: int, parts: list[Any]) -> Any:
        # Into memory this loader reuses: fresh memory for a large batch costs far more in
        # page faults than the copy.
        buffers = self._memory.buffers(JOIN_BUFFERS)
        try:
            return concat(parts, buffers.alloc)
        except (ValueError, RuntimeError, TypeError) as exc:  # parts that do not stack
            err = CollateError(
                f"default_collate: the samples of batch {k} do not stack into one batch "
                f"({exc}). Give every sample the same shapes, or pass a collate_fn that "
                "handles them."
            )
            return _Failure(RemoteError(err, f"joining the parts of batch {k}", keep_object=True))

    # -- statistics and autotune -------------------------------------------------------

    def _gauges(self) -> tuple[int, int]:
        """(shared memory mapped for batches, tasks in flight) for ``loader.statistics()``."""
        return self._pool.shared_memory_bytes(), sum(self._outstanding)

    def _autotune(self, probe: Probe | None = None) -> None:
        """Ask the tuner after a delivered batch, or a worker's ``probe``; apply what it
        decides."""
        from stoker._autotune import ADD_PREFETCH

        assert self._tuner is not None
        if probe is not None:
            try:
                left: int | None = self._epochs.length() - self._stats.batches
            except TypeError:  # a batch sampler without a length
                left = None
            decision = self._tuner.probe(probe, left)
        else:
            decision = self._tuner.step(self._stats, self._pool.started_pids())
        for _ in range(max(0, decision)):
            self._add_worker()
        if decision == ADD_PREFETCH:
            self._prefetch += 1
            self._stats.prefetch = self._prefetch
            self._refill()

    def _add_worker(self) -> None:
        """Give tasks to one more of the pool's workers (built already, started now).

        The per-worker lists grow by one; ``_reset`` rebuilds them at the new count, so
        persistent workers keep the count found.
        """
        self._num_workers += 1
        self._outstanding.append(0)
        self._undelivered.append(0)
        self._active.append(True)
        self._since.append(time.perf_counter())
        self._stats.workers = self._num_workers
        self._pool.limit_start(self._num_workers)
        self._pool.start(1)  # a process pool starts it; threads run already
        self._refill()


def _splittable(config: EngineConfig) -> bool:
    """Whether the loader's batches may be split at an epoch's tail and joined: process
    workers, map-style, batched by the default collate, no skipped samples."""
    return (
        config.worker_mode == "process"
        and not config.iterable
        and config.auto_collation
        and isinstance(config.collate_fn, DefaultCollate)
        and not config.skip_errors
    )


def workers_warning(num_workers: int, worker_mode: str) -> None:
    """Warn, as torch does (its phrase first), when more worker processes are asked for
    than CPUs are available; called as each iterator with workers is made, as torch's."""
    if worker_mode != "process" or num_workers <= 0:
        return
    cpus = available_cpus()
    if num_workers > cpus:
        warnings.warn(
            f"This DataLoader will create {num_workers} worker processes in total. Our "
            f"suggested max number of worker in current system is {cpus}, which is smaller "
            "than what this DataLoader is going to create. stoker counts the CPUs this "
            "process may use (its affinity mask and cgroup quota): the workers will compete "
            "for them and loading may slow down or stall. Use num_workers <= "
            f"{cpus}, or worker_mode='thread' for I/O-bound datasets.",
            UserWarning,
            stacklevel=4,  # the user's line that made the iterator (DataLoader.__iter__ -> here)
        )
