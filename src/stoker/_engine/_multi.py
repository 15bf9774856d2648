"""The worker-backed iterator: the coordinator of an epoch with workers.

:class:`MultiWorkerIterator` runs in the thread that iterates the loader. It keeps each
worker's prefetch window full through a :class:`~stoker._engine._dispatch.Dispatcher`
(which worker, seeded, grouped or split), waits for answers from the pool (timeouts, lazy
start of later fork workers, deaths), books them into the
:class:`~stoker._engine._window.ReorderWindow` and delivers its batches in task order
(``in_order=True``) or as they come. A batch is seeded from (seed, epoch, index), so which
worker runs it does not matter. See ``docs/engine.md``, "Assignment".

The pool (:mod:`stoker._engine._pool`, chosen by :func:`make_pool`) is shut down by a
``weakref.finalize``: at the end of an epoch (unless ``persistent_workers``), on garbage
collection, at exit, and before a fatal error is raised. Also here: :func:`workers_warning`
(more workers than CPUs, as torch warns).
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import sys
import time
import warnings
import weakref
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from stoker._engine._dispatch import Dispatcher
from stoker._engine._inproc import InProcessPool
from stoker._engine._interrupts import raise_pending
from stoker._engine._messages import (
    Loaded,
    LoadedGroup,
    Probe,
    Ready,
    Restarted,
    StartFailed,
    ToIterator,
)
from stoker._engine._pin import pin, slot_pins
from stoker._engine._pool import WorkerPool
from stoker._engine._procs import ProcessPool
from stoker._engine._restart import Healer
from stoker._engine._single import SingleProcessIterator
from stoker._engine._threads import ThreadPool
from stoker._engine._window import Failure, ReorderWindow
from stoker._engine._worker import worker_seed
from stoker._osprobe import available_cpus
from stoker._placement import Placement, Where
from stoker._policy import HEALTH_CHECK_S, LAZY_START_S, START_TIMEOUT_S, starts_lazily
from stoker._stats import StatsRecorder
from stoker.errors import WorkerError

if TYPE_CHECKING:
    from stoker._engine._config import EngineConfig, EngineMemory, Epochs
    from stoker._state import Epoch


class MultiWorkerIterator:
    """One epoch (or, with ``persistent_workers``, every epoch) of a loader with workers.

    Made by ``DataLoader.__iter__`` in the thread that iterates, ``__next__`` called from
    one thread at a time; :meth:`restart` starts the next epoch on the same workers."""

    _workers = property(lambda self: _worker_handles(self._pool))  # torch's, for their pids

    def __init__(
        self, config: EngineConfig, memory: EngineMemory, epochs: Epochs, epoch: Epoch | None = None
    ) -> None:
        # The epoch's start, as the tuner compares its time with loading in process: its
        # sampler's draw included, as SingleProcessIterator's, and the first one's workers.
        self._drawing = time.perf_counter()
        self._config, self._memory, self._epochs = config, memory, epochs
        if config.warn_workers:
            workers_warning(config.num_workers, config.worker_mode)
        # Autotune (num_workers / prefetch_factor "auto"): the pool is built for the
        # tuner's capacity, and only the first _num_workers workers get tasks.
        self._tuner = config.tuner
        self._num_workers, self._prefetch = config.num_workers, config.prefetch
        # e.g. ImageFolder(decode="gpu"): the dataset's step on each batch, before pinning;
        # its batches are not split (their columns need not join).
        self._step = getattr(config.dataset, "main_process_step", None)
        self._generation = 0
        self._rest: SingleProcessIterator | None = None  # the epoch, moved in process
        self._open_pool(epochs.next_number() if epoch is None else epoch.number)
        try:
            self._pool.start(1)  # first: it starts up while the sampler draws
            self._begin(epoch if epoch is not None else epochs.start())
            if not self._lazy:
                self._pool.start()  # each one busy with its tasks while the next one forks
        except BaseException:  # Ctrl-C, a sampler that raises: no worker outlives iter()
            self._finalizer()
            raise

    def _open_pool(self, epoch: int) -> None:
        """Build the pool for ``self._config`` (workers seeded for ``epoch`` from base + id,
        as in torch; an iterable dataset's base is the epoch's: see worker_seed)."""
        config, memory = self._config, self._memory
        self._dispatch = Dispatcher(config, memory, self._epochs.length, self._step is None)
        seeds = worker_seeds(config, self._epochs.base_seed(), epoch)
        pool, self._pin_device = make_pool(config, memory, seeds)
        self._pool, self._started = pool, [False] * config.capacity
        self._finalizer = weakref.finalize(self, pool.shutdown)
        pool.limit_start(self._num_workers)
        # Lazy start pays off when the first batch comes sooner than the other forks take.
        forks = isinstance(pool, ProcessPool) and forks_workers(config)
        self._lazy = starts_lazily(self._dispatch.free, forks, memory.first_batch_s)

    @property
    def alive(self) -> bool:
        """Whether the workers can still serve epochs (persistent workers are reused)."""
        return self._pool.alive

    def shutdown(self) -> None:
        """Stop the workers now (else at garbage collection, or at the epoch's end)."""
        self._finalizer()

    @property
    def mode(self) -> Where:
        """The workers' kind: processes or threads (``worker_mode="auto"`` may switch)."""
        return self._config.worker_mode

    def restart(self) -> None:
        """Start the next epoch on the same (persistent) workers, an unfinished one's dropped."""
        self._drawing = time.perf_counter()
        self._begin(self._epochs.start())

    def _begin(self, epoch: Epoch, replay: list[tuple[int, Any]] | None = None) -> None:
        """Start ``epoch`` (the loader numbers its tasks and records deliveries for
        state_dict), the tasks of ``replay`` (drawn already) first."""
        self._generation += 1
        self._epoch_state, config = epoch, self._config
        seeds = worker_seeds(config, self._epochs.base_seed(), epoch.number)
        self._window = ReorderWindow(self._num_workers, config.in_order)
        self._dispatch.new_epoch(self._window, epoch, self._generation, seeds, replay)
        self._yielded = 0
        self._began = time.perf_counter()
        # Worker processes running before this epoch: one that starts more (the first, or
        # one where autotune adds some) is no measure of the next (see __next__).
        self._started_before = 0 if self._generation == 1 else len(self._pool.gauges().pids)
        self._stats = StatsRecorder(len(self._started), config.auto_collation, self._gauges)
        self._stats.workers, self._stats.prefetch = self._num_workers, self._prefetch
        if self._tuner is not None:
            self._stats.decisions = self._tuner.decisions
            self._tuner.begin(self._stats)
        self._memory.stats = self._stats
        self._refill()

    def _end(self) -> None:
        (stats := self._stats).ended(self._entered)
        self._epoch_state.finish()
        # Persistent workers start once: an epoch that started some is no measure of others.
        started = len(self._pool.gauges().pids)
        judged = not self._config.persistent or started <= self._started_before
        if self._tuner is not None and judged:
            first = functools.partial(load_in_process, self._config, self._dispatch.first_task)
            self._tuner.epoch_done(stats, stats.last - self._drawing, first)
        self._memory.batch_profile = self._dispatch.profile(stats.bytes, stats.batches)
        if not self._config.persistent:
            self._finalizer()

    def _refill(self) -> None:
        """Fill the workers' prefetch windows, one message each: only started workers'
        while others start lazily, and one task deep until the tuner's probe decides."""
        pool, candidates, tuner = self._pool, None, self._tuner
        if self._lazy and pool.pending_start:
            candidates = [w for w in range(self._num_workers) if pool.is_started(w)]
        depth = 1 if self._config.probe and tuner and tuner.wants_probe else self._prefetch
        sends = self._dispatch.refill(depth, self._yielded > 0, candidates)
        for wid, tasks in sends.items():
            pool.send(wid, tasks)

    # -- results -----------------------------------------------------------------------

    def __iter__(self) -> MultiWorkerIterator:
        return self

    def __len__(self) -> int:
        return self._epochs.length()

    def __next__(self) -> Any:
        if self._rest is not None:
            return next(self._rest)
        raise_pending()  # a Ctrl-C that landed while a batch's memory went home
        self._entered = time.perf_counter()
        if not self._pool.alive:
            raise StopIteration
        if self._yielded and self._pool.pending_start:
            self._pool.start()  # the first batch is out: now start the other workers
        while True:
            got = self._window.pop()
            if got is not None:
                self._refill()  # its place in the window is free: keep the workers busy
                skipped = got.skipped
                if skipped is not None:  # counted in task order: the same in every run
                    self._epoch_state.skip(got.k, skipped)  # raises past the cap
                    self._stats.skipped += len(skipped.indices)
                if not self._epoch_state.deliver(got.k):
                    continue  # delivered before the checkpoint this epoch resumes from
                if skipped is not None and skipped.dropped:
                    continue  # every sample of the batch failed: it is dropped
                return self._deliver(got.item)
            if self._window.drained(self._dispatch.done):
                self._end()
                raise StopIteration
            self._handle(*wait(self._pool, self._window, self._started, self._config.timeout))
            # Results of the same read are handled now, so their replacements go out together.
            while self._rest is None and (more := self._pool.buffered()) is not None:
                self._handle(*more)
            if self._rest is not None:  # the tuner moved the epoch in process
                return next(self._rest)
            self._refill()

    def _deliver(self, item: Any) -> Any:
        if isinstance(item, Failure):
            raise item.remote.rebuild()
        if self._step is not None:
            item = self._step(item)
        if self._pin_device is not None:
            item = pin(item, self._pin_device)
        stats = self._stats
        stats.delivered(item, self._entered)
        if self._dispatch.delivered(stats.batches, stats.bytes):
            self._refill()  # the group is sized: fill the windows to their new depth
        if not self._yielded:
            self._memory.first_batch_s = time.perf_counter() - self._began
            self._dispatch.drawn = None  # no switch of mode after a delivery
        if self._tuner is not None and not self._tuner.settled:
            self._autotune()
        self._yielded += 1
        if self._config.iterable:
            self._epochs.delivered(self._yielded)
        return item

    def _handle(self, wid: int, msg: ToIterator) -> None:
        if isinstance(msg, (Ready, Restarted)):  # restart hook: a new worker starts up
            self._started[wid] = isinstance(msg, Ready)
            return
        if isinstance(msg, StartFailed):  # dataset unpickling, worker_init_fn
            self._finalizer()
            raise msg.error.rebuild()
        if msg.generation != self._generation:
            return  # a result of an abandoned epoch (a batch's slot returns as it dies)
        if isinstance(msg, Probe):  # a worker's first samples, timed (autotune)
            return self._autotune(msg) if heeds(self._window, self._dispatch, wid) else None
        if isinstance(msg, (Loaded, LoadedGroup)):
            self._stats.busy[wid] += msg.busy  # the worker's fetch + collate seconds
        self._dispatch.answered(wid, msg)
        restart_once_first_in(self)

    # -- statistics and autotune -------------------------------------------------------

    def _gauges(self) -> tuple[int, int]:
        """(shared memory mapped for batches, tasks in flight) for ``loader.statistics()``."""
        return self._pool.gauges().shared_bytes, sum(self._window.outstanding)

    def _autotune(self, probe: Probe | None = None) -> None:
        """Ask the tuner after a delivered batch or a worker's ``probe``; apply its decision."""
        assert self._tuner is not None  # workers probe only for a tuner
        if probe is not None:
            timer = functools.partial(load_in_process, self._config, self._dispatch.first_task)
            step = self._tuner.probe(probe, batches_left(self._epochs, 0), timer)
            moves = self._tuner.pending is not None
            if moves and self._dispatch.drawn is not None:  # nothing delivered: may restart
                return restart_once_first_in(self)
        else:
            step = self._tuner.step(self._stats, self._pool.gauges().pids)
        if step.add:
            self._add_workers(step.add)
        if step.deepen:
            self._prefetch += 1
            self._stats.prefetch = self._prefetch
            self._refill()

    def _switch(self, to: Placement) -> None:
        """Before the epoch's first delivery the tuner chose to load ``to`` another place:
        the epoch starts there again; the old pool's batches are dropped."""
        if to.where is Where.PROCESSES:  # no fork while threads run: a lock one holds would
            self._pool.shutdown()  # stay held in the child; each stops after its sample
        self._pool.shutdown(grace_s=0.0)
        self._finalizer()
        drawn, epoch = self._dispatch.drawn, self._epoch_state
        if to.in_process:
            epoch.tasks = itertools.chain(drawn or (), epoch.tasks)
            self._rest = SingleProcessIterator(self._config, self._memory, self._epochs, epoch)
            return
        self._num_workers = to.workers
        config = replace(self._config, worker_mode=to.where, num_workers=to.workers, probe=False)
        self._config = config
        self._open_pool(epoch.number)
        self._pool.start()
        self._begin(epoch, drawn)

    def _add_workers(self, count: int) -> None:
        """Give tasks to ``count`` more of the pool's workers (built already, started now);
        ``restart`` makes the next epoch's window at the new count, so persistent workers
        keep the count found. All start before the refill, so the tasks left spread over
        all of them rather than filling the first ones' windows."""
        for _ in range(count):
            self._window.add_worker()
        self._num_workers += count
        self._stats.workers = self._num_workers
        self._pool.limit_start(self._num_workers)
        self._pool.start(count)  # a process pool starts them; threads run already
        self._refill()


POOLS: dict[Where, Any] = {
    Where.PROCESSES: ProcessPool,
    Where.THREADS: ThreadPool,
    Where.IN_PROCESS: InProcessPool,
}
"""The pool of each kind of worker (a test puts :class:`InProcessPool` in another's place)."""


def make_pool(
    config: EngineConfig, memory: EngineMemory, seeds: list[int]
) -> tuple[WorkerPool, str | None]:
    """The pool of ``config.capacity`` workers seeded with ``seeds``, and the device the
    iterator pins delivered batches to: a process pool's slots are registered as pinned
    memory, so pinning them is the one copy; workers in this process pin their own (None)."""
    if config.worker_mode is Where.RAY:  # Ray is imported only here, for such a loader
        from stoker._engine._ray import RayPool

        return RayPool(config, memory, seeds), config.pin_device
    pool = POOLS[config.worker_mode](config, memory, seeds)
    if not isinstance(pool, ProcessPool):
        return pool, None
    if config.restarts or (config.skip_errors and memory.poisoned):  # worker_restarts
        pool.healer = Healer(config.restarts, bool(config.skip_errors), pool.post, memory.poisoned)
    pool.set_pins(slot_pins(config.pin_device))
    return pool, config.pin_device


def forks_workers(config: EngineConfig) -> bool:
    """Whether worker processes start by fork (each start copies the page tables)."""
    ctx = config.context or multiprocessing.get_context()
    return bool(ctx.get_start_method() == "fork")


def restart_once_first_in(it: MultiWorkerIterator) -> None:
    """Restart ``it``'s epoch where its tuner's probe chose (the main process, or workers of
    the other mode) once the epoch's first batch is answered, not at the probe: the old pool
    stops after the samples in hand, and one of them that raised would take its error along
    (read again on the other side, it may load). Nothing once a batch is out or has failed
    (``drawn`` is None): the tuner's choice then starts with the next epoch."""
    tuner = it._tuner
    if tuner is None or it._dispatch.drawn is None or 0 in it._window.running:
        return
    if tuner.pending is not None:
        it._switch(tuner.take_placement())


def heeds(window: ReorderWindow, dispatch: Dispatcher, wid: int) -> bool:
    """Whether the tuner hears worker ``wid``'s probe: before the epoch's first delivery
    (while it may restart elsewhere), only the worker loading the first batch decides, which
    sends no probe if that batch raises, so the error is not dropped."""
    first = dispatch.drawn is not None and window.in_order and window.running
    return not first or window.waiting_for() == wid


def wait(
    pool: WorkerPool, window: ReorderWindow, started: list[bool], timeout: float
) -> tuple[int, ToIterator]:
    """The pool's next (worker id, message). While later workers start lazily, a short wait
    on a started worker, then the rest start. With a ``timeout`` (from the worker's start-up
    on; before it, :data:`START_TIMEOUT_S`), a silent worker raises ``WorkerError`` and the
    pool is shut down; without one, deaths still end the wait."""
    if pool.pending_start:
        if pool.is_started(window.waiting_for()):
            got = pool.get(LAZY_START_S)
            if got is not None:
                return got
        pool.start()  # the first batch is slow, or queued for an unstarted worker
    if timeout <= 0:
        while (got := pool.get(HEALTH_CHECK_S)) is None:
            pass
        return got
    wid = window.waiting_for()
    got = pool.get(timeout if started[wid] else START_TIMEOUT_S)
    if got is None:
        who = pool.describe(wid)
        pool.shutdown(grace_s=0.0)  # a stuck worker would not stop anyway
        raise WorkerError(
            f"DataLoader timed out after {timeout:g} seconds waiting for a batch from "
            f"{who}, which is alive but made no progress. Raise timeout= (or set it to 0 "
            "to wait as long as workers live), or find what blocks in the dataset."
        )
    return got


def _worker_handles(pool: WorkerPool) -> list[Any]:
    """``iterator._workers``, as torch's iterator lists them (tools and torch's tests read
    their ``pid``): ``multiprocessing.Process`` objects, started now if they were to start
    lazily; for thread workers, their ``threading.Thread`` objects (no ``pid``: they run
    in this process)."""
    if pool.pending_start:
        pool.start()
    return pool.handles()


def worker_seeds(config: EngineConfig, base: int, epoch: int) -> list[int]:
    """Each worker's seed in ``epoch`` (see :func:`~stoker._engine._worker.worker_seed`)."""
    return [worker_seed(base, epoch, w, config.iterable) for w in range(config.capacity)]


def batches_left(epochs: Epochs, delivered: int) -> int | None:
    """The epoch's batches not delivered yet, or None for a batch sampler without a length."""
    try:
        return epochs.length() - delivered
    except TypeError:
        return None


def load_in_process(config: EngineConfig, task: Any) -> float | None:
    """Seconds the main process takes to load ``task`` (an epoch's first) itself,
    median of three, when only stoker's code loads it (nothing runs that could be seen,
    nothing is drawn); else None. Workers' time per batch overstates it: they share the
    cores with each other and the main process."""
    fetcher = config.make_fetcher()
    if fetcher.draws or task is None:
        return None
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fetcher.fetch(task)
        times.append(time.perf_counter() - start)
    return sorted(times)[1]


def workers_warning(num_workers: int, worker_mode: str) -> None:
    """Warn, as torch does (its sentences first), when more worker processes are asked for
    than CPUs are available; called where torch calls its check: as the loader is made and
    as each iterator with workers is made. The warning points at the user's line (the
    first frame outside stoker)."""
    if worker_mode != "process" or num_workers <= 0:
        return
    cpus = available_cpus()
    if num_workers > cpus:
        warnings.warn(
            f"This DataLoader will create {num_workers} worker processes in total. Our "
            f"suggested max number of worker in current system is {cpus}, which is smaller "
            "than what this DataLoader is going to create. Please be aware that excessive "
            "worker creation might get DataLoader running slow or even freeze, lower the "
            "worker number to avoid potential slowness/freeze if necessary. stoker counts "
            "the CPUs this process may use (its affinity mask and cgroup quota): use "
            f"num_workers <= {cpus}, or worker_mode='thread' for I/O-bound datasets.",
            UserWarning,
            stacklevel=_user_stacklevel(),
        )


def _user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning issued by the caller name the first frame
    outside stoker (a stoker.torch subclass adds frames)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "stoker":
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level
