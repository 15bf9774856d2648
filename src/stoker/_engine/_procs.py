"""Worker processes: one process and one duplex pipe each, batches in shared memory.

:class:`ProcessPool` implements :class:`~stoker._engine._pool.WorkerPool`. One
``select.poll`` on the pipes and the process sentinels sees a result or a death at once;
one read takes all that a pipe holds, and :meth:`ProcessPool.buffered` hands out the rest.
A worker's last message says why it ends early; the pool reads it before reporting the
death. ``shutdown`` is idempotent, safe from ``weakref.finalize`` and a no-op in a forked
child; it waits for each worker's goodbye (killing one that misses the grace time), not for
its exit (:mod:`stoker._engine._reap`). See ``docs/engine.md``, "Pools, deaths and shutdown".

Every death goes through :meth:`ProcessPool.lost`; with ``worker_restarts`` left (a
:class:`~stoker._engine._restart.Healer`), a fresh worker of the same id takes the dead
one's place and tasks, and the iterator gets a :class:`~stoker._engine._messages.Restarted`.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import secrets
import select
import time
import weakref
from typing import TYPE_CHECKING, Any

from stoker import _torch
from stoker._engine import _reap
from stoker._engine._arrivals import Arrivals
from stoker._engine._deaths import WorkerDeath, explain_unpicklable
from stoker._engine._messages import Bye, FromWorker, Restarted, Shipped, Task, ToIterator, Work
from stoker._engine._pipe import Inbox, pack_tasks, send
from stoker._engine._pool import STOP_GRACE_S, PoolGauges
from stoker._engine._restart import Healer
from stoker._engine._segments import sweep_dead_owners
from stoker._engine._shm import segment_prefix
from stoker._engine._shm_errors import unwritable_error
from stoker._engine._sinks import process_worker
from stoker._engine._slots import SlotBook, Warm
from stoker._engine._worker import WorkerArgs
from stoker._policy import slots_kept_free, steady_slots

if TYPE_CHECKING:
    from stoker._engine._config import EngineConfig, EngineMemory

_KILL_JOIN_TIMEOUT_S = 2.0
"""How long to wait for a killed worker to be reaped."""
_EXIT_CODE_WAIT_S = 1.0
"""After a worker's pipe closed, how long to wait for its exit status."""


class ProcWorker:
    """The main process's handle of one worker process: its process, pipe and slots."""

    def __init__(self, wid: int, proc: Any, conn: Any, child: Any, prefix: str) -> None:
        self.wid = wid
        self.proc = proc
        self.pid: int | None = proc.pid
        self.conn = conn
        self.child = child  # the worker's end of the pipe, closed here once it started
        self.prefix = prefix
        self.slots = SlotBook()
        self.unsent: list[Any] | None = []  # tasks queued before the process started
        self.inbox = Inbox(conn.fileno())  # results read from its pipe, not yet handled
        self.said_bye = False
        self.why: tuple[str, int] | None = None  # what ended it early, and its exit code

    def keep_left(self, bye: Bye) -> None:
        """Note a leaving worker's goodbye; keep the slots it handed over."""
        self.said_bye = True
        self.why = bye.why  # type: ignore[assignment]  # a process's code is an int
        self.slots.keep_left(bye)

    def death(self) -> WorkerDeath:
        """What is known of this worker's end, its exit status waited for briefly."""
        self.proc.join(_EXIT_CODE_WAIT_S if self.why is None else 0.0)
        code = self.proc.exitcode
        if self.why is not None and code is None:
            code = self.why[1]
        return WorkerDeath(
            wid=self.wid, pid=self.pid, code=code, why=self.why[0] if self.why else None
        )


class ProcessPool:
    """Worker processes with the shared-memory transport (see the module docstring)."""

    def __init__(self, config: EngineConfig, memory: EngineMemory, seeds: list[int]) -> None:
        self._ctx = config.context or multiprocessing.get_context()
        method = self._method = self._ctx.get_start_method()
        self._owner = os.getpid()
        self._closed = False
        if (unwritable := unwritable_error()) is not None:
            raise unwritable  # before any worker starts, rather than one error per worker
        sweep_dead_owners()
        self._token = secrets.token_hex(4)
        self._config, self._seeds = config, seeds
        self._fetcher = config.make_fetcher()
        # What to name if pickling fails (not the loader: it may hold this pool's iterator,
        # and the pool must not keep that alive).
        self._parts: dict[str, Any] = {
            "dataset": config.dataset,
            "collate_fn": config.collate_fn,
            "worker_init_fn": config.init_fn,
        }
        self._arrivals = Arrivals(config.init_fn)
        self._memory_ref = weakref.ref(memory)
        n = config.capacity  # with autotune, the most workers it may start
        self._warm_cap = n * slots_kept_free(config.prefetch)  # what persistent workers keep
        warm = memory.take_warm() if method == "fork" else []  # faulted in already
        self._next_start = 0
        self._start_limit = n  # workers beyond it wait for limit_start (autotune)
        self._poller = select.poll()
        self._by_fd: dict[int, ProcWorker] = {}  # pipe and sentinel descriptors
        self._pins: Any = None  # pinned-memory registration of slots (set by make_pool)
        self.healer: Healer | None = None  # worker_restarts (set by make_pool); None: raise
        first = max(1, min(n, config.num_workers))  # the warm memory goes to those that start
        self.workers = [self.spawn(w, warm[w::first] if w < first else []) for w in range(n)]

    def spawn(self, wid: int, warm: Warm | None = None, fresh: bool = False) -> ProcWorker:
        """A new handle (process not started) for worker ``wid``, its pipe polled; a fork
        worker adopts the ``warm`` segments as free slots. A ``fresh`` one (in a dead
        worker's place) names its segments apart from those the dead one left."""
        config, prefetch = self._config, self._config.prefetch
        token = secrets.token_hex(4) if fresh else self._token
        prefix = segment_prefix(self._owner, token, wid)
        # fmt: off
        args = WorkerArgs(
            worker_id=wid, num_workers=config.capacity, seed=self._seeds[wid],
            fetcher=self._fetcher, worker_init_fn=config.init_fn, prefix=prefix,
            keep_free=slots_kept_free(prefetch), steady=steady_slots(prefetch),
            window=config.capacity * prefetch, import_torch=_torch.loaded() is not None,
            warm=list(warm or ()), hand_off=self._method == "fork", probe=config.probe,
        )
        # fmt: on
        parent, child = self._ctx.Pipe(duplex=True)
        _reap.PARENT_ENDS.add(parent)
        proc = self._ctx.Process(  # type: ignore[attr-defined]
            target=process_worker, args=(args, child), daemon=True, name=f"stoker-worker-{wid}"
        )
        w = ProcWorker(wid, proc, parent, child, prefix)
        w.slots.maps.pins = self._pins
        for name, mm in warm or ():
            w.slots.maps.adopt(name, mm)
        self._by_fd[parent.fileno()] = w
        self._poller.register(parent.fileno(), select.POLLIN)
        return w

    def forget(self, w: ProcWorker) -> None:
        """Stop polling worker ``w``'s pipe and sentinel (it died, or is replaced)."""
        for fd in (w.conn.fileno(), w.proc.sentinel if w.pid is not None else None):
            if fd is not None and self._by_fd.pop(fd, None) is not None:
                self._poller.unregister(fd)

    def set_pins(self, pins: Any) -> None:
        """Register every worker's slots as pinned memory with ``pins`` (see ``_pin``)."""
        self._pins = pins
        for w in self.workers:
            w.slots.maps.pins = pins

    def start(self, count: int | None = None) -> None:
        """Start the next ``count`` workers (default: all), each given its queued tasks.

        Raises:
            Whatever starting raised, e.g. a pickling error under spawn, with a note naming
            the object that could not be sent; the pool is shut down first.
        """
        todo = self.workers[self._next_start : self._start_limit]
        if count is not None:
            todo = todo[:count]
        try:
            for w in todo:
                self._start_one(w)
                self._next_start += 1
        except BaseException as exc:
            for w in self.workers:
                w.child.close()
            self.shutdown()
            if self._method != "fork" and isinstance(exc, Exception):
                explain_unpicklable(exc, self._parts, self._method)
            raise
        if not self.pending_start:
            self._parts = {}

    def _start_one(self, w: ProcWorker) -> None:
        try:
            _reap.start_process(w.proc)
        finally:
            w.child.close()  # the worker holds its own copy now
        w.pid = w.proc.pid
        self._by_fd[w.proc.sentinel] = w
        self._poller.register(w.proc.sentinel, select.POLLIN)
        unsent, w.unsent = w.unsent, None
        for msg in unsent or ():  # it works on these while the next one starts
            self.send(w.wid, msg)

    def is_started(self, wid: int) -> bool:
        """Whether worker ``wid``'s process was started."""
        return self.workers[wid].pid is not None

    def limit_start(self, count: int) -> None:
        """Let :meth:`start` start only the first ``count`` workers (autotune grows it)."""
        self._start_limit = count

    def started_pids(self) -> list[int]:
        """The process ids of the workers started (autotune reads their CPU use)."""
        return [w.pid for w in self.workers if w.pid is not None]

    def gauges(self) -> PoolGauges:
        """The started workers' pids and the shared memory mapped for batches now."""
        mapped = sum(w.slots.maps.mapped_bytes() for w in self.workers)
        return PoolGauges(pids=self.started_pids(), shared_bytes=mapped)

    def handles(self) -> list[Any]:
        """The ``multiprocessing.Process`` of each worker that may get tasks."""
        return [w.proc for w in self.workers[: self._start_limit]]

    @property
    def pending_start(self) -> bool:
        """Whether some workers (within the start limit) are not started yet."""
        return self._next_start < self._start_limit and not self._closed

    @property
    def alive(self) -> bool:
        """Whether the pool can still serve tasks."""
        return not self._closed

    def describe(self, wid: int) -> str:
        """'worker 1 (pid 42)', and ' in its worker_init_fn NAME' while it runs that."""
        return f"worker {wid} (pid {self.workers[wid].pid}){self._arrivals.doing(wid)}"

    def send(self, wid: int, tasks: list[Task]) -> None:
        """Send worker ``wid`` its tasks, and the slots freed since its last message.

        A worker that died is not reported here but by :meth:`get`, after the results it
        sent before dying have been read.
        """
        if self.healer is not None:  # held until answered, to send again if it dies
            tasks = self.healer.sent(wid, tasks)
        self.post(wid, tasks)

    def post(self, wid: int, tasks: list[Task]) -> None:
        """Send worker ``wid`` ``tasks`` now (or at its start), with its slots freed."""
        w = self.workers[wid]
        if w.unsent is not None:  # not started yet: sent right after its start
            w.unsent.append(tasks)
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            send(w.conn, Work(tasks=pack_tasks(tasks), freed=w.slots.take_freed()))

    def _flush_freed(self) -> None:
        """Return freed slots of big batches at once, not with the next tasks: creating a
        big slot costs page faults in proportion to its size; a small one costs less than
        the extra message."""
        for w in self.workers:
            if w.slots.wants_flush():
                self.send(w.wid, [])

    def get(self, timeout_s: float) -> tuple[int, ToIterator] | None:
        """The next (worker id, message) from any worker, or None after ``timeout_s``; the
        slots of big batches that died meanwhile go home first.

        Raises:
            WorkerError: a worker died (its pipe closed or its process ended).
        """
        self._flush_freed()  # the batch delivered last time may have died by now
        deadline = time.monotonic() + timeout_s
        while True:
            got = self._get(max(0.0, deadline - time.monotonic()))
            if got is None:
                return None
            msg = self._take(*got)
            if msg is not None:
                return got[0], msg

    def buffered(self) -> tuple[int, ToIterator] | None:
        """A (worker id, message) already read from a pipe, or None; no system call."""
        while (got := self._buffered()) is not None:
            msg = self._take(*got)
            if msg is not None:
                return got[0], msg
        return None

    def _take(self, wid: int, msg: Any) -> ToIterator | None:
        """What the iterator gets of worker ``wid``'s ``msg``: decoded, and, with a healer,
        no longer held (None for an isolation probe's answer)."""
        got = self._arrivals.take(self, wid, msg)
        if got is None or self.healer is None:
            return got
        return self.healer.answered(wid, got)  # type: ignore[no-any-return]

    def unpack(self, wid: int, msg: Shipped) -> Any:
        """A worker process's batch: views of its slot (see :class:`SlotBook`)."""
        return self.workers[wid].slots.unpack(msg)

    def bye(self, wid: int, bye: Bye) -> None:
        """Worker ``wid`` said goodbye (see :class:`~stoker._engine._arrivals.Arrivals`)."""
        self.workers[wid].keep_left(bye)

    def _get(self, timeout_s: float) -> tuple[int, FromWorker | Restarted] | None:
        got = self._buffered()
        if got is not None:
            return got
        # One poll object for the pool's life: cheaper per batch than building a selector
        # in multiprocessing.connection.wait() each time.
        events = self._poller.poll(max(0, timeout_s) * 1000)
        if not events:
            return None
        dead = None
        for fd, _ in events:
            w = self._by_fd[fd]
            if fd != w.conn.fileno():
                dead = w
                continue
            try:
                return w.wid, w.inbox.recv()
            except (EOFError, OSError):
                return w.wid, self.lost(w)
        assert dead is not None
        with contextlib.suppress(EOFError, OSError):  # read what it sent before it died
            if dead.inbox.readable():
                return dead.wid, dead.inbox.recv()
        return dead.wid, self.lost(dead)

    def _buffered(self) -> tuple[int, Any] | None:
        if self.healer is not None and (made := self.healer.take_ready()) is not None:
            return made  # a poisoned batch's answer, made by the healer
        for w in self.workers:
            msg = w.inbox.take()
            if msg is not None:
                return w.wid, msg
        return None

    def lost(self, w: ProcWorker) -> Restarted:
        """Worker ``w`` died while the pool needed it: with restarts left, another takes
        its place (see the module docstring); else the pool stops and raises its death.

        Raises:
            WorkerError: no restart is left, with torch's words for the death.
        """
        death, healer = w.death(), self.healer
        where = f"worker {w.wid} (pid {w.pid})"
        cause = healer.died(w.wid, death.code, where) if healer is not None else None
        if healer is None or cause is None:
            self.shutdown(grace_s=0.0)
            error = death.error()
            raise error if healer is None else type(error)(f"{error}{healer.spent()}")
        memory = self._memory_ref()
        if memory is not None and memory.stats is not None:  # statistics()
            memory.stats.restarts.append(cause)
        try:
            self._replace(w)
        except BaseException:  # no process to be had (fork failed): nothing lives on
            self.shutdown(grace_s=0.0)
            raise
        healer.restarted(w.wid)
        return Restarted(cause=cause)

    def _replace(self, old: ProcWorker) -> None:
        """Start a worker in dead worker ``old``'s place; ``old`` is reaped in the
        background (its segments unlinked), its batches still alive keep their memory."""
        self.forget(old)
        _reap.PARENT_ENDS.discard(old.conn)
        old.conn.close()
        old.slots.maps.clear()
        _reap.reaper()([old])
        new = self.workers[old.wid] = self.spawn(old.wid, fresh=True)
        self._start_one(new)

    def shutdown(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every worker (kill those that do not stop in time); unlink what they left.

        Args:
            grace_s: how long workers get to stop by themselves before they are killed.
        """
        if self._closed or os.getpid() != self._owner:
            return
        self._closed = True
        reap = _reap.reaper()  # started now, while the workers idle (see reaper)
        leaving: list[ProcWorker] = []
        try:
            warm = self._stop(grace_s, leaving)
        finally:
            reap(leaving)
        memory = self._memory_ref()
        if warm and memory is not None and self._method == "fork":
            with contextlib.suppress(Exception):  # interpreter exit may have torn it down
                memory.warm = (memory.warm + warm)[: self._warm_cap]

    def _stop(self, grace_s: float, leaving: list[ProcWorker]) -> Warm:
        """Tell every worker to stop and wait for it (see :meth:`shutdown`); the workers that
        were started go into ``leaving`` as they stop. Returns the segments to keep warm."""
        for w in self.workers:
            with contextlib.suppress(OSError, ValueError):
                send(w.conn, None)
        deadline = time.monotonic() + grace_s
        warm: Warm = []
        for w in self.workers:
            if w.pid is None:  # never started
                _reap.PARENT_ENDS.discard(w.conn)
                w.conn.close()
                w.child.close()
                warm += w.slots.maps.take_unused(set())
                continue
            if not _said_bye(w, deadline):
                with contextlib.suppress(OSError):
                    w.proc.kill()
                w.proc.join(_KILL_JOIN_TIMEOUT_S)
            _reap.PARENT_ENDS.discard(w.conn)
            w.conn.close()
            if self._method == "fork":  # it writes no more: the next pool's workers reuse it
                warm += w.slots.hand_on(self._memory_ref)
            w.slots.maps.clear()
            leaving.append(w)
        return warm


def _said_bye(w: ProcWorker, deadline: float) -> bool:
    """Whether worker ``w`` said :data:`BYE` (or died) by ``deadline``; results still
    in its pipe are dropped on the way."""
    while True:
        try:
            msg = w.inbox.take()
            if msg is None:
                if not w.inbox.wait(deadline - time.monotonic()):
                    return w.proc.exitcode is not None
                msg = w.inbox.recv()
        except (EOFError, OSError):  # it closed its end: it has exited, or is exiting
            return True
        if type(msg) is Bye:
            w.keep_left(msg)
            return True
