"""Worker threads: one thread per worker, passing the batch object itself.

:class:`ThreadPool` implements :class:`~stoker._engine._pool.WorkerPool`. Every thread of
the pool's capacity starts at the first :meth:`ThreadPool.start` (the idle ones help with
the probe's samples, see :mod:`stoker._engine._split`); only the first ``limit_start``
get tasks. A thread that ends says why in its last message (:class:`Bye`), which the next
:meth:`ThreadPool.get` raises as a dead worker.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any

from stoker._engine._arrivals import Arrivals
from stoker._engine._deaths import WorkerDeath
from stoker._engine._messages import Bye, Shipped, Task, ToIterator
from stoker._engine._pool import STOP_GRACE_S, PoolGauges
from stoker._engine._rngguard import RngGuard
from stoker._engine._sinks import thread_worker
from stoker._engine._split import HelpBoard
from stoker._engine._worker import WorkerArgs
from stoker._policy import thread_buffers
from stoker._stateful import is_stateful

if TYPE_CHECKING:
    from stoker._engine._config import EngineConfig, EngineMemory

_ALIVE_CHECK_S = 0.5
"""How often a thread pool waiting for results checks that its threads live (a thread
that ends says so; this catches one that could not)."""


class ThreadPool:
    """Worker threads with the in-process transport (see the module docstring)."""

    def __init__(self, config: EngineConfig, memory: EngineMemory, seeds: list[int]) -> None:
        self._closed = False
        self._outbox: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        n = config.capacity  # with autotune, the most workers it may use
        self._arrivals = Arrivals(config.init_fn)
        self._dead: WorkerDeath | None = None  # a thread that said it ended, and why
        self._generation: int | None = None  # of the last tasks sent
        shared = None if config.iterable else config.make_fetcher()
        guard = self._guard = RngGuard()
        buffers = memory.buffers(thread_buffers(n, config.prefetch))
        self._inboxes: list[queue.SimpleQueue[Any]] = [queue.SimpleQueue() for _ in range(n)]
        board = self._board = HelpBoard(self._inboxes, config.probe)
        self._threads: list[threading.Thread] = []
        for wid in range(n):
            fetcher = shared if shared is not None else config.make_fetcher()
            if shared is None and is_stateful(config.dataset):  # its state is each thread's
                fetcher.dataset = _thread_copy(config.dataset)
            args = WorkerArgs(
                worker_id=wid,
                num_workers=n,
                seed=seeds[wid],
                fetcher=fetcher,
                worker_init_fn=config.init_fn,
                pin_device=config.pin_device,
                rng_guard=guard,
                board=board,
                buffers=buffers,
                probe=config.probe,
            )
            self._threads.append(
                threading.Thread(
                    target=thread_worker,
                    args=(args, self._inboxes[wid], self._outbox),
                    daemon=True,
                    name=f"stoker-worker-{wid}",
                )
            )

    @property
    def alive(self) -> bool:
        """Whether the pool can still serve tasks."""
        return not self._closed

    @property
    def pending_start(self) -> bool:
        """Whether the threads are not started yet."""
        return not self._closed and not self._threads[0].ident

    def start(self, count: int | None = None) -> None:
        """Start every thread (the first call; ``count`` aside, idle threads help others)."""
        for t in self._threads:
            if not t.ident and not self._closed:
                t.start()

    def is_started(self, wid: int) -> bool:
        """Whether thread ``wid`` was started."""
        return self._threads[wid].ident is not None

    def limit_start(self, count: int) -> None:
        """Only the first ``count`` threads get tasks, so only they help with others'
        batches: the tuner's count is how many fetches run side by side."""
        self._board.helpers = count

    def gauges(self) -> PoolGauges:
        """No worker processes (the threads' CPU use is the main process's), no shared
        memory (batch objects are handed over)."""
        return PoolGauges(pids=[], shared_bytes=0)

    def handles(self) -> list[Any]:
        """The ``threading.Thread`` of each worker that may get tasks."""
        return self._threads[: self._board.helpers]

    def describe(self, wid: int) -> str:
        """'worker thread 1', and ' in its worker_init_fn NAME' while it runs that."""
        return f"worker thread {wid}{self._arrivals.doing(wid)}"

    def send(self, wid: int, tasks: list[Task]) -> None:
        """Queue tasks for thread ``wid``; an epoch's first lets its fetches decide again
        whether the dataset draws from the global RNGs (see :class:`RngGuard`)."""
        if tasks and tasks[0].generation != self._generation:
            self._generation = tasks[0].generation
            self._guard.new_epoch()
        for task in tasks:
            self._inboxes[wid].put(task)

    def buffered(self) -> tuple[int, ToIterator] | None:
        """A result already queued, or None (a dead worker is reported by :meth:`get`,
        after the results it sent before)."""
        while True:
            try:
                wid, raw = self._outbox.get_nowait()
            except queue.Empty:
                return None
            msg = self._arrivals.take(self, wid, raw)
            if msg is not None:
                return wid, msg

    def get(self, timeout_s: float) -> tuple[int, ToIterator] | None:
        """The next (worker id, message), or None after ``timeout_s``.

        Raises:
            WorkerError: a worker thread ended (it said so, or is found dead).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if self._dead is not None:
                self._lost(self._dead)
            left = deadline - time.monotonic()
            try:
                wid, raw = self._outbox.get(timeout=max(0.0, min(left, _ALIVE_CHECK_S)))
            except queue.Empty:
                self._check_alive()
                if left <= _ALIVE_CHECK_S:
                    return None
                continue
            msg = self._arrivals.take(self, wid, raw)
            if msg is not None:
                return wid, msg

    def unpack(self, wid: int, msg: Shipped) -> Any:
        """A batch made in this process is the object itself."""
        return msg.payload

    def bye(self, wid: int, bye: Bye) -> None:
        """Worker ``wid`` said goodbye (see :class:`~stoker._engine._arrivals.Arrivals`)."""
        if self._dead is None:  # raised by the next get()
            why = bye.why[0] if bye.why is not None else "an unknown cause"
            self._dead = WorkerDeath(
                wid=wid, pid=None, code=None, why=f"it was ended by {why}", thread=True
            )

    def _check_alive(self) -> None:
        """Raise for a thread found dead with nothing left in the queue (what a thread puts
        there before it ends is read first: it may say why)."""
        dead = [wid for wid, t in enumerate(self._threads) if t.ident and not t.is_alive()]
        if dead and self._outbox.empty() and not self._closed:
            self._lost(WorkerDeath(wid=dead[0], pid=None, code=None, why=None, thread=True))

    def _lost(self, death: WorkerDeath) -> None:
        self.shutdown(grace_s=0.0)
        raise death.error()

    def shutdown(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every thread; a thread stuck in user code is left to finish as a daemon.

        Args:
            grace_s: how long to wait for the threads to stop.
        """
        if self._closed:
            return
        self._closed = True
        self._board.cancel()  # a batch loading now is not wanted: its threads stop sooner
        for inbox in self._inboxes:
            inbox.put(None)
        deadline = time.monotonic() + grace_s
        for t in self._threads:
            if t.ident and t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))


def _thread_copy(dataset: Any) -> Any:
    """A thread worker's own copy of a stateful iterable dataset (as a process has its
    own), or, where it cannot be copied, the dataset itself, with a warning: the threads'
    states then share one object, and a checkpoint of them cannot resume exactly."""
    try:
        return copy.deepcopy(dataset)
    except Exception as exc:
        warnings.warn(
            f"worker_mode='thread': the stateful dataset {type(dataset).__name__} cannot be "
            f"copied for each thread ({type(exc).__name__}: {exc}), so the threads share it "
            "and their states collide: a checkpoint will not resume exactly. Make it "
            "copyable (copy.deepcopy), or use process workers.",
            UserWarning,
            stacklevel=2,
        )
        return dataset
