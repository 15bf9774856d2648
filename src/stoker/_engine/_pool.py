"""Worker pools: start workers, send tasks, wait for results, notice deaths, shut down.

Two pools with one interface (:class:`WorkerPool`), driven by
:class:`stoker._engine._multi.MultiWorkerIterator` from the thread that iterates:

- :class:`ProcessPool`: one process and one duplex pipe per worker. One ``select.poll``
  on the pipes and the process sentinels sees a result or a death at once; one read takes
  all that a pipe holds, and :meth:`ProcessPool.buffered` hands out the rest. Batches
  cross through the shared-memory transport.
- :class:`ThreadPool`: one thread per worker, passing the batch object itself.

A worker's last message says why it ends early; the pool reads it before reporting the
death. Under fork, a loader keeps its last pool's unused segments for its next workers.
``shutdown`` is idempotent, safe from ``weakref.finalize`` and a no-op in a forked child;
it waits for each worker's goodbye (killing one that misses the grace time), not for its
exit. See ``docs/engine.md``, "Pools, deaths and shutdown".
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import dataclasses
import multiprocessing
import multiprocessing.util
import os
import pickle
import queue
import secrets
import select
import signal
import threading
import time
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Protocol

from stoker import _torch
from stoker._engine import _shm
from stoker._engine._messages import (
    LIFE,
    Bye,
    FromWorker,
    Loaded,
    LoadedGroup,
    Ready,
    Shipped,
    Task,
    ToIterator,
    Work,
)
from stoker._engine._pin import slot_pins
from stoker._engine._restart import Healer, Restarted
from stoker._engine._split import HelpBoard
from stoker._engine._transport import Inbox, add_note, decode, pack_tasks, safe_str, send
from stoker._engine._worker import RngGuard, WorkerArgs, process_worker, thread_worker
from stoker._policy import slots_kept_free, steady_slots, thread_buffers
from stoker._stateful import is_stateful
from stoker.errors import WorkerError

if TYPE_CHECKING:
    from collections.abc import Callable

    from stoker._engine._config import EngineConfig, EngineMemory

_STOP_GRACE_S = 1.0
"""How long stopping workers get to finish their batch and exit before they are killed."""
_KILL_JOIN_TIMEOUT_S = 2.0
"""How long to wait for a killed worker to be reaped."""
_EAGER_FREE_BYTES = 1 << 20
"""Slots from this size up are returned to their worker as soon as their batch dies."""
_EXIT_CODE_WAIT_S = 1.0
"""After a worker's pipe closed, how long to wait for its exit status."""
_EXIT_WAIT_S = 5.0
"""How long a worker that said goodbye may take to exit before it is killed."""
_KILLED_REAP_S = 60.0
"""How long the reaper waits for a killed worker to end: a SIGKILL always ends it, but on a
busy machine its teardown may take seconds, and a worker left unjoined stays a zombie, its
sentinel descriptor open, until the interpreter exits."""
_ALIVE_CHECK_S = 0.5
"""How often a thread pool waiting for results checks that its threads live (a thread
that ends says so; this catches one that could not)."""

# The main process's ends of all live workers' pipes. A process forked later (another
# loader's worker, or the user's own fork) must not keep them open, or a worker would never
# see end-of-file on its pipe when the main process dies.
_PARENT_ENDS: weakref.WeakSet[Any] = weakref.WeakSet()

# Threads reaping workers that said goodbye. multiprocessing joins its live children at
# interpreter exit; a reaper closing one of them meanwhile makes that join fail with
# "process object is closed", so the exit waits for the reapers first (see _join_reapers).
_REAPERS: set[threading.Thread] = set()


@atexit.register  # after multiprocessing.util's registration: runs before its exit hook
def _join_reapers() -> None:
    """Wait for the reaper threads still running (each is bounded by its own timeouts)."""
    for t in list(_REAPERS):
        t.join(_EXIT_WAIT_S + _KILLED_REAP_S)


def _close_parent_ends_in_child() -> None:
    for conn in list(_PARENT_ENDS):
        with contextlib.suppress(OSError):
            conn.close()
    _PARENT_ENDS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_parent_ends_in_child)


class _ProcWorker:
    """The main process's handle of one worker process."""

    def __init__(self, wid: int, proc: Any, conn: Any, prefix: str) -> None:
        self.wid = wid
        self.proc = proc
        self.pid: int | None = proc.pid
        self.conn = conn
        self.prefix = prefix
        self.maps = _shm.SegmentMaps()
        self.freed: list[int] = []  # slot ids whose views died; appended by finalizers
        self.big_slots = False  # its slots are big enough to return them eagerly
        self.out: dict[int, str] = {}  # slot id -> segment name, while views of it live
        self.late: dict[int, tuple[str, Any]] = {}  # out at shutdown: warm once freed
        self.memory_ref: Any = None  # the loader's EngineMemory, set at shutdown, for ``late``
        self.unsent: list[Any] | None = []  # tasks queued before the process started
        self.inbox = Inbox(conn.fileno())  # results read from its pipe, not yet handled
        self.said_bye = False
        self.why: tuple[str, int] | None = None  # what ended it early, and its exit code

    def keep_left(self, bye: Bye) -> None:
        """Map (and so unlink) the slots a leaving worker handed over with its goodbye."""
        self.said_bye = True
        self.why = bye.why  # type: ignore[assignment]  # a process's code is an int
        for name, size in bye.kept or ():
            self.maps.keep(name, size)

    def decode(self, msg: Shipped) -> Loaded | LoadedGroup:
        """The batch (or group) of ``msg``, views of its slot (see :meth:`on_free`)."""
        if msg.retired:
            self.maps.drop(msg.retired)
        slot = msg.slot
        if slot is not None:
            self.big_slots = slot[2] >= _EAGER_FREE_BYTES
            self.out[slot[0]] = slot[1]
        data = decode(slot, msg.payload, self.maps, self.on_free)
        if msg.group:
            return LoadedGroup(msg.generation, msg.idx, data, msg.busy, msg.skipped)
        return Loaded(msg.generation, msg.idx, data, msg.busy, msg.skipped, msg.untouched)

    def take_freed(self) -> list[int]:
        """Slot ids freed since the last call (for the next message to this worker)."""
        freed = self.freed
        n = len(freed)
        out = freed[:n]
        del freed[:n]  # finalizers may append concurrently: keep what came after
        return out

    def on_free(self, sid: int) -> None:
        """The last view of slot ``sid``'s batch died (a finalizer, any thread)."""
        self.out.pop(sid, None)
        self.freed.append(sid)
        late = self.late.pop(sid, None) if self.late else None
        memory = self.memory_ref() if late is not None else None
        if late is not None and memory is not None:  # an epoch's last batch died after it
            with contextlib.suppress(Exception):
                memory.warm.append(late)


def _torch_phrase(pid: int | None, code: int | None) -> str:
    """torch's words for a worker's death, which users search for: "DataLoader worker (pid
    N) is killed by signal: Killed. " (or "... exited unexpectedly with exit code 1. ")."""
    if code is not None and code < 0:
        try:
            name = signal.strsignal(-code) or f"signal {-code}"
        except ValueError:
            name = f"signal {-code}"
        return f"DataLoader worker (pid {pid}) is killed by signal: {name}. "
    if code is not None:
        return f"DataLoader worker (pid {pid}) exited unexpectedly with exit code {code}. "
    return f"DataLoader worker (pid {pid}) exited unexpectedly. "


def _signal_text(code: int | None) -> str:
    if code is None:
        return "its exit status is unknown"
    if code >= 0:
        return f"it exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    cause = {
        "SIGKILL": "most often the out-of-memory killer (see `dmesg`); lower batch_size, "
        "num_workers or prefetch_factor, or the dataset's memory use",
        "SIGSEGV": "a crash in native code (a C extension used by the dataset or collate)",
        "SIGBUS": "a bad memory access, e.g. shared memory (/dev/shm) exhausted",
        "SIGTERM": "something outside stoker terminated it",
    }.get(name, "an external signal or a crash")
    return f"it was killed by {name}; likely cause: {cause}"


def _explain_unpicklable(exc: BaseException, parts: dict[str, Any], method: str) -> None:
    """Add a note naming the object (of ``parts``) that the start method could not pickle."""
    for name, obj in parts.items():
        try:
            pickle.dumps(obj)
        except Exception as err:
            try:
                shown = f"{obj!r:.80}"
            except Exception:  # a repr that fails too: the type name says enough
                shown = "object"
            add_note(
                exc,
                f"The DataLoader's {name} ({type(obj).__qualname__} {shown}) cannot be "
                f"pickled ({safe_str(err)}), and the '{method}' start method must pickle it to "
                "send it to worker processes. Define it at module level (not inside a function, "
                "not a lambda), or use multiprocessing_context='fork' or worker_mode='thread'.",
            )
            return


class _Phases:
    """Which workers are in their ``worker_init_fn`` (for the timeout's message), from the
    messages about their life that a pool reads (:data:`~stoker._engine._messages.LIFE`)."""

    def __init__(self, init_fn: Any) -> None:
        self.init_name = None
        if init_fn is not None:
            self.init_name = safe_str(getattr(init_fn, "__qualname__", None) or init_fn)
        self.in_init: set[int] = set()

    def note(self, wid: int, msg: FromWorker) -> bool:
        """Take note of a life message of worker ``wid``; whether to pass it on."""
        if type(msg) is Ready:
            if self.init_name is not None:
                self.in_init.add(wid)
            return True  # the iterator's timeout counts from it
        self.in_init.discard(wid)
        return False

    def doing(self, wid: int) -> str:
        """'' or ' in its worker_init_fn NAME'."""
        return f" in its worker_init_fn {self.init_name}" if wid in self.in_init else ""


def _ended_text(why: str | None) -> str:
    return f"; it was ended by {why}" if why else ""


class WorkerPool(Protocol):
    """What :class:`~stoker._engine._multi.MultiWorkerIterator` uses of a pool: tasks out,
    decoded messages in (see :mod:`stoker._engine._messages`), starts and shutdown.
    :class:`ProcessPool` and :class:`ThreadPool` are the two."""

    @property
    def alive(self) -> bool:
        """Whether the pool can still serve tasks."""

    @property
    def pending_start(self) -> bool:
        """Whether some workers (within the start limit) are not started yet."""

    @property
    def lazy_start(self) -> bool:
        """Whether to start one worker first and the others after the first batch."""

    def start(self, count: int | None = None) -> None:
        """Start the next ``count`` workers (default: all)."""

    def limit_start(self, count: int) -> None:
        """Let :meth:`start` start only the first ``count`` workers."""

    def is_started(self, wid: int) -> bool:
        """Whether worker ``wid`` was started."""

    def started_pids(self) -> list[int]:
        """The process ids of the workers started (none for threads)."""

    def handles(self) -> list[Any]:
        """The worker processes or threads that may get tasks (``iterator._workers``)."""

    def new_epoch(self) -> None:
        """Persistent workers start another epoch."""

    def send(self, wid: int, tasks: list[Task]) -> None:
        """Send worker ``wid`` its tasks (with the slots freed since its last message)."""

    def get(self, timeout_s: float) -> tuple[int, ToIterator] | None:
        """The next (worker id, message), or None after ``timeout_s``."""

    def buffered(self) -> tuple[int, ToIterator] | None:
        """A (worker id, message) already received, or None; never waits."""

    def flush_freed(self) -> None:
        """Send the slots of big batches that died back to their workers now."""

    def describe(self, wid: int) -> str:
        """Worker ``wid`` in words, for error messages."""

    def shared_memory_bytes(self) -> int:
        """Bytes of shared memory mapped for batches now."""

    def shutdown(self, grace_s: float = ...) -> None:
        """Stop every worker."""


def make_pool(
    config: EngineConfig, memory: EngineMemory, seeds: list[int]
) -> tuple[WorkerPool, str | None]:
    """The pool of ``config.capacity`` workers seeded with ``seeds``, and the device the
    iterator pins delivered batches to: None for threads, which pin their own; process
    workers' slots are registered as pinned memory, so pinning them is the one copy."""
    if config.worker_mode == "thread":
        return ThreadPool(config, memory, seeds), None
    if config.worker_mode == "ray":  # Ray is imported only here, for such a loader
        from stoker._engine._ray import RayPool

        return RayPool(config, memory, seeds), config.pin_device
    pool = ProcessPool(config, memory, seeds)
    if config.restarts or (config.skip_errors and memory.poisoned):  # restart hook
        pool._healer = Healer(config.restarts, config.skip_errors, pool._post, memory.poisoned)
    pins = slot_pins(config.pin_device)
    for w in pool.workers:
        w.maps.pins = pins
    return pool, config.pin_device


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


class ProcessPool:
    """Worker processes with the shared-memory transport (see the module docstring)."""

    _healer: Healer | None = None
    """Restart hook (:mod:`stoker._engine._restart`): the record of the tasks workers hold,
    set by :func:`make_pool` with ``worker_restarts``; None: a death raises."""

    def __init__(self, config: EngineConfig, memory: EngineMemory, seeds: list[int]) -> None:
        ctx = config.context or multiprocessing.get_context()
        method = ctx.get_start_method()
        self._owner = os.getpid()
        self._closed = False
        self.workers: list[_ProcWorker] = []
        self._worker_args: list[WorkerArgs] = []  # restart hook: to start one again
        if (unwritable := _shm.unwritable_error()) is not None:
            raise unwritable  # before any worker starts, rather than one error per worker
        _shm.sweep_dead_owners()
        token = secrets.token_hex(4)
        n = config.capacity  # with autotune, the most workers it may start
        prefetch = config.prefetch
        fetcher = config.make_fetcher()
        import_torch = _torch.loaded() is not None
        # What to name if pickling fails (not the loader: it may hold this pool's iterator,
        # and the pool must not keep that alive).
        self._parts: dict[str, Any] = {
            "dataset": config.dataset,
            "collate_fn": config.collate_fn,
            "worker_init_fn": config.init_fn,
        }
        self._method = method
        self._phases = _Phases(config.init_fn)
        self._memory_ref = weakref.ref(memory)
        self._warm_cap = n * slots_kept_free(prefetch)  # what persistent workers would keep
        warm = memory.take_warm() if method == "fork" else []  # faulted in already
        self._child_ends: list[Any] = []
        self._next_start = 0
        self._start_limit = n  # workers beyond it wait for limit_start (autotune)
        first = max(1, min(n, config.num_workers))  # the warm memory goes to those that start
        for wid in range(n):
            mine = warm[wid::first] if wid < first else []
            prefix = _shm.segment_prefix(self._owner, token, wid)
            # fmt: off
            args = WorkerArgs(
                wid, n, seeds[wid], fetcher, config.init_fn, prefix,
                keep_free=slots_kept_free(prefetch), steady=steady_slots(prefetch),
                window=n * prefetch, import_torch=import_torch, warm=mine,
                hand_off=method == "fork", probe=config.probe,
            )
            # fmt: on
            self._worker_args.append(args)  # restart hook
            parent, child = ctx.Pipe(duplex=True)
            _PARENT_ENDS.add(parent)
            proc = ctx.Process(  # type: ignore[attr-defined]
                target=process_worker,
                args=(args, child),
                daemon=True,
                name=f"stoker-worker-{wid}",
            )
            self.workers.append(_ProcWorker(wid, proc, parent, prefix))
            for name, mm in mine:
                self.workers[-1].maps.adopt(name, mm)
            self._child_ends.append(child)
        self._poller = select.poll()
        self._by_conn_fd = {w.conn.fileno(): w for w in self.workers}
        self._by_sentinel: dict[int, _ProcWorker] = {}
        for fd in self._by_conn_fd:
            self._poller.register(fd, select.POLLIN)

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
                child = self._child_ends[w.wid]
                try:
                    _start_process(w.proc)
                finally:
                    child.close()  # the worker holds its own copy now
                self._next_start += 1
                w.pid = w.proc.pid
                self._by_sentinel[w.proc.sentinel] = w
                self._poller.register(w.proc.sentinel, select.POLLIN)
                unsent, w.unsent = w.unsent, None
                for msg in unsent or ():  # it works on these while the next one starts
                    self.send(w.wid, msg)
        except BaseException as exc:
            for child in self._child_ends:
                child.close()
            self.shutdown()
            if self._method != "fork" and isinstance(exc, Exception):
                _explain_unpicklable(exc, self._parts, self._method)
            raise
        if not self.pending_start:
            self._parts = {}

    def is_started(self, wid: int) -> bool:
        """Whether worker ``wid``'s process was started."""
        return self.workers[wid].pid is not None

    def limit_start(self, count: int) -> None:
        """Let :meth:`start` start only the first ``count`` workers (autotune grows it)."""
        self._start_limit = count

    def new_epoch(self) -> None:
        """Nothing to do: each worker process seeds its own RNGs per batch."""

    def started_pids(self) -> list[int]:
        """The process ids of the workers started (autotune reads their CPU use)."""
        return [w.pid for w in self.workers if w.pid is not None]

    def handles(self) -> list[Any]:
        """The ``multiprocessing.Process`` of each worker that may get tasks."""
        return [w.proc for w in self.workers[: self._start_limit]]

    def shared_memory_bytes(self) -> int:
        """Bytes of shared memory the main process has mapped for batches now."""
        return sum(w.maps.mapped_bytes() for w in self.workers)

    @property
    def pending_start(self) -> bool:
        """Whether some workers (within the start limit) are not started yet."""
        return self._next_start < self._start_limit and not self._closed

    @property
    def lazy_start(self) -> bool:
        """Whether to start one worker first and the others after the first batch.

        Under fork each start costs the main process a copy of its page tables; the first
        batch needs only one worker. Spawned workers start slowly, so
        they all start at once.
        """
        return self._method == "fork"

    @property
    def alive(self) -> bool:
        """Whether the pool can still serve tasks."""
        return not self._closed

    def describe(self, wid: int) -> str:
        """'worker 1 (pid 42)', and ' in its worker_init_fn NAME' while it runs that."""
        return f"worker {wid} (pid {self.workers[wid].pid}){self._phases.doing(wid)}"

    def send(self, wid: int, tasks: list[Task]) -> None:
        """Send worker ``wid`` its tasks, and the slots freed since its last message.

        A worker that died is not reported here but by :meth:`get`, after the results it
        sent before dying have been read.
        """
        if self._healer is not None:  # restart hook: held until answered
            tasks = self._healer.sent(wid, tasks)
        self._post(wid, tasks)

    def _post(self, wid: int, tasks: list[Task]) -> None:
        """Send worker ``wid`` ``tasks`` now (or at its start), with the slots freed."""
        w = self.workers[wid]
        if w.unsent is not None:  # not started yet: sent right after its start
            w.unsent.append(tasks)
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            send(w.conn, Work(pack_tasks(tasks), w.take_freed()))

    def flush_freed(self) -> None:
        """Return freed slots of big batches at once, not with the next tasks.

        Creating a big slot costs page faults in proportion to its size; a small one costs
        less than the extra message.
        """
        for w in self.workers:
            if w.freed and w.big_slots:
                self.send(w.wid, [])

    def get(self, timeout_s: float) -> tuple[int, ToIterator] | None:
        """The next (worker id, message) from any worker, or None after ``timeout_s``.

        Raises:
            WorkerError: a worker died (its pipe closed or its process ended).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            got = self._get(max(0.0, deadline - time.monotonic()))
            if got is None:
                return None
            msg = self._note(*got)
            if msg is not None:
                return got[0], msg

    def buffered(self) -> tuple[int, ToIterator] | None:
        """A (worker id, message) already read from a pipe, or None; no system call."""
        while True:
            got = self._buffered()
            if got is None:
                return None
            msg = self._note(*got)
            if msg is not None:
                return got[0], msg

    def _note(self, wid: int, msg: FromWorker) -> ToIterator | None:
        """What the iterator gets of worker ``wid``'s ``msg``: a batch decoded, a life
        message noted (only :class:`Ready` passed on, see :class:`_Phases`)."""
        kind = type(msg)
        if kind is Shipped:
            loaded = self.workers[wid].decode(msg)  # type: ignore[arg-type]
            if self._healer is not None:  # restart hook: an answer held no longer
                return self._healer.answered(wid, loaded)  # type: ignore[no-any-return]
            return loaded
        if kind not in LIFE:
            if self._healer is not None:  # restart hook: an answer held no longer
                return self._healer.answered(wid, msg)  # type: ignore[no-any-return]
            return msg  # type: ignore[return-value]
        if kind is Bye:  # it is leaving; its exit is seen next
            self.workers[wid].keep_left(msg)  # type: ignore[arg-type]
        return msg if self._phases.note(wid, msg) else None  # type: ignore[return-value]

    def _get(self, timeout_s: float) -> tuple[int, Any] | None:
        got = self._buffered()
        if got is not None:
            return got
        # One poll object for the pool's life: cheaper per batch than building a selector
        # in multiprocessing.connection.wait() each time.
        events = self._poller.poll(None if timeout_s is None else max(0, timeout_s) * 1000)
        if not events:
            return None
        dead = None
        for fd, _ in events:
            w = self._by_conn_fd.get(fd)
            if w is None:
                dead = self._by_sentinel[fd]
                continue
            try:
                return w.wid, w.inbox.recv()
            except (EOFError, OSError):
                return w.wid, self._died(w)
        assert dead is not None
        with contextlib.suppress(EOFError, OSError):  # read what it sent before it died
            if dead.inbox.readable():
                return dead.wid, dead.inbox.recv()
        return dead.wid, self._died(dead)

    def _buffered(self) -> tuple[int, Any] | None:
        if self._healer is not None and (made := self._healer.take_ready()) is not None:
            return made  # restart hook: a poisoned batch's answer
        for w in self.workers:
            msg = w.inbox.take()
            if msg is not None:
                return w.wid, msg
        return None

    def _died(self, w: _ProcWorker) -> Restarted:
        """Worker ``w`` died: with restarts left, another takes its place (see
        :mod:`stoker._engine._restart`); else the pool stops and raises ``WorkerError``."""
        w.proc.join(_EXIT_CODE_WAIT_S if w.why is None else 0.0)
        code = w.proc.exitcode if w.why is None or w.proc.exitcode is not None else w.why[1]
        healer = self._healer
        if healer is not None:  # restart hook
            cause = healer.died(w.wid, code, f"worker {w.wid} (pid {w.pid})")
            if cause is not None:
                memory = self._memory_ref()
                if memory is not None and memory.stats is not None:  # statistics()
                    memory.stats.restarts.append(cause)
                try:
                    self._replace(w)
                except BaseException:  # no process to be had (fork failed): nothing lives on
                    self.shutdown(grace_s=0.0)
                    raise
                healer.restarted(w.wid)
                return Restarted(cause)
        self.shutdown(grace_s=0.0)
        raise WorkerError(
            f"{_torch_phrase(w.pid, code)}Worker {w.wid} exited unexpectedly: {_signal_text(code)}"
            f"{_ended_text(w.why[0] if w.why else None)}.{healer.spent() if healer else ''}"
        )

    def _replace(self, old: _ProcWorker) -> None:
        """Start a worker in dead worker ``old``'s place (restart hook): the same arguments,
        a new pipe and segment prefix (the reaper unlinks the old one's); ``old`` is reaped
        in the back, its batches still alive keep their memory."""
        self._poller.unregister(old.conn.fileno())
        self._poller.unregister(old.proc.sentinel)
        del self._by_conn_fd[old.conn.fileno()], self._by_sentinel[old.proc.sentinel]
        _PARENT_ENDS.discard(old.conn)
        old.conn.close()
        old.maps.clear()
        _reaper()([old])
        prefix = _shm.segment_prefix(self._owner, secrets.token_hex(4), old.wid)
        args = dataclasses.replace(self._worker_args[old.wid], prefix=prefix, warm=[])
        ctx = multiprocessing.get_context(self._method)
        parent, child = ctx.Pipe(duplex=True)
        _PARENT_ENDS.add(parent)
        proc = ctx.Process(  # type: ignore[attr-defined]
            target=process_worker, args=(args, child), daemon=True, name=f"stoker-worker-{old.wid}"
        )
        new = self.workers[old.wid] = _ProcWorker(old.wid, proc, parent, prefix)
        new.maps.pins, new.unsent = old.maps.pins, None
        try:
            _start_process(proc)
        finally:
            child.close()
        new.pid = proc.pid
        self._by_conn_fd[parent.fileno()], self._by_sentinel[proc.sentinel] = new, new
        self._poller.register(parent.fileno(), select.POLLIN)
        self._poller.register(proc.sentinel, select.POLLIN)

    def shutdown(self, grace_s: float = _STOP_GRACE_S) -> None:
        """Stop every worker (kill those that do not stop in time); unlink what they left.

        Args:
            grace_s: how long workers get to stop by themselves before they are killed.
        """
        if self._closed or os.getpid() != self._owner:
            return
        self._closed = True
        reap = _reaper()  # started now, while the workers idle (see _reaper)
        leaving: list[_ProcWorker] = []
        try:
            warm = self._stop(grace_s, leaving)
        finally:
            reap(leaving)
        memory = self._memory_ref()
        if warm and memory is not None and self._method == "fork":
            with contextlib.suppress(Exception):  # interpreter exit may have torn it down
                memory.warm = (memory.warm + warm)[: self._warm_cap]

    def _stop(self, grace_s: float, leaving: list[_ProcWorker]) -> list[tuple[str, Any]]:
        """Tell every worker to stop and wait for it (see :meth:`shutdown`); the workers that
        were started go into ``leaving`` as they stop. Returns the segments to keep warm."""
        for w in self.workers:
            with contextlib.suppress(OSError, ValueError):
                send(w.conn, None)
        deadline = time.monotonic() + grace_s
        warm: list[tuple[str, Any]] = []
        for w in self.workers:
            if w.pid is None:  # never started
                _PARENT_ENDS.discard(w.conn)
                w.conn.close()
                self._child_ends[w.wid].close()
                warm += w.maps.take_unused(set())
                continue
            if not _said_bye(w, deadline):
                with contextlib.suppress(OSError):
                    w.proc.kill()
                w.proc.join(_KILL_JOIN_TIMEOUT_S)
            _PARENT_ENDS.discard(w.conn)
            w.conn.close()
            if self._method == "fork":
                # It writes no more: the next pool's workers reuse what it left.
                out = dict(w.out)
                w.late = {sid: (n, w.maps._maps[n]) for sid, n in out.items() if n in w.maps._maps}
                w.memory_ref = self._memory_ref
                warm += w.maps.take_unused(set(out.values()))
            w.maps.clear()
            leaving.append(w)
        return warm


def _start_process(proc: Any) -> None:
    """``proc.start()``, without Python 3.12+'s warning that forking a multi-threaded
    process may deadlock the child when the only other threads are stoker's reapers: they
    only wait for workers' exits and hold no lock a child could need. Any other thread
    (the user's) still gets the warning."""
    me = threading.current_thread()
    ours = all(t is me or t in _REAPERS for t in threading.enumerate())
    if not _REAPERS or not ours:
        proc.start()
        return
    with warnings.catch_warnings():  # safe: no other thread warns meanwhile
        warnings.filterwarnings("ignore", r".*multi-threaded, use of fork\(\)", DeprecationWarning)
        proc.start()


def _said_bye(w: _ProcWorker, deadline: float) -> bool:
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


def _reaper() -> Callable[[list[_ProcWorker]], None]:
    """Start a thread that waits for the exits of the workers handed to it; return the hand.

    A worker's exit tears down its copy of the main process's address space, which takes
    a while with torch loaded: the loop need not wait for it. A worker that does not exit in time is
    killed; one that failed has its segments unlinked for it. The thread starts before the
    workers are told to stop: started while they tear down, it would wait for a core, and
    ``Thread.start`` with it. The hand must be called once, even with no workers.
    """
    handed: queue.SimpleQueue[list[_ProcWorker]] = queue.SimpleQueue()

    def run() -> None:
        for w in handed.get():
            w.proc.join(_EXIT_WAIT_S)
            if w.proc.exitcode is None:
                with contextlib.suppress(OSError):
                    w.proc.kill()
                w.proc.join(_KILLED_REAP_S)
            if w.proc.exitcode != 0 or not w.said_bye:
                _shm.unlink_prefix(w.prefix)  # it could not unlink its own segments
            with contextlib.suppress(ValueError):
                w.proc.close()  # frees the sentinel descriptor now, not at GC
        _REAPERS.discard(threading.current_thread())

    def now(workers: list[_ProcWorker]) -> None:
        handed.put(workers)
        run()

    if not threading.main_thread().is_alive():  # interpreter exit: no thread may race
        return now  # multiprocessing's own join of its children
    reaper = threading.Thread(target=run, name="stoker-reaper", daemon=True)
    _REAPERS.add(reaper)
    try:
        reaper.start()
    except RuntimeError:  # the interpreter is shutting down: no new threads
        _REAPERS.discard(reaper)
        return now
    return handed.put


class ThreadPool:
    """Worker threads with the in-process transport (see the module docstring)."""

    def __init__(self, config: EngineConfig, memory: EngineMemory, seeds: list[int]) -> None:
        self._closed = False
        self._outbox: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        n = config.capacity  # with autotune, the most workers it may use
        self._phases = _Phases(config.init_fn)
        self._dead: tuple[int, str] | None = None  # a thread that said it ended, and why
        shared = None if config.iterable else config.make_fetcher()
        guard = self._guard = RngGuard()
        buffers = memory.buffers(thread_buffers(n, config.prefetch))
        self._inboxes: list[queue.SimpleQueue[Any]] = [queue.SimpleQueue() for _ in range(n)]
        board = self._board = HelpBoard(self._inboxes, config.probe)
        for wid in range(n):
            fetcher = shared if shared is not None else config.make_fetcher()
            if shared is None and is_stateful(config.dataset):  # its state is each thread's
                fetcher.dataset = _thread_copy(config.dataset)
            args = WorkerArgs(
                wid,
                n,
                seeds[wid],
                fetcher,
                config.init_fn,
                pin_device=config.pin_device,
                rng_guard=guard,
                board=board,
                buffers=buffers,
                probe=config.probe,
            )
            t = threading.Thread(
                target=thread_worker,
                args=(args, self._inboxes[wid], self._outbox),
                daemon=True,
                name=f"stoker-worker-{wid}",
            )
            t.start()
            self._threads.append(t)

    @property
    def alive(self) -> bool:
        """Whether the pool can still serve tasks."""
        return not self._closed

    def start(self, count: int | None = None) -> None:
        """Nothing to do: the threads run from construction."""

    def limit_start(self, count: int) -> None:
        """Only the first ``count`` threads get tasks, so only they help with others'
        batches: the tuner's count is how many fetches run side by side."""
        self._board.helpers = count

    def new_epoch(self) -> None:
        """Let the next epoch's first fetches decide again whether the dataset draws."""
        self._guard.new_epoch()

    def started_pids(self) -> list[int]:
        """No processes: the threads' CPU use is the main process's."""
        return []

    def handles(self) -> list[Any]:
        """The ``threading.Thread`` of each worker that may get tasks."""
        return self._threads[: self._board.helpers]

    def shared_memory_bytes(self) -> int:
        """None: thread workers hand over batch objects."""
        return 0

    pending_start = False
    lazy_start = False

    def is_started(self, wid: int) -> bool:
        """Always: threads start at construction."""
        return True

    def describe(self, wid: int) -> str:
        """'worker thread 1', and ' in its worker_init_fn NAME' while it runs that."""
        return f"worker thread {wid}{self._phases.doing(wid)}"

    def send(self, wid: int, tasks: list[Task]) -> None:
        """Queue tasks for thread ``wid``."""
        for task in tasks:
            self._inboxes[wid].put(task)

    def buffered(self) -> tuple[int, ToIterator] | None:
        """A result already queued, or None (a dead worker is reported by :meth:`get`,
        after the results it sent before)."""
        while True:
            try:
                got = self._outbox.get_nowait()
            except queue.Empty:
                return None
            if type(got[1]) not in LIFE or self._note(*got):
                return got

    def flush_freed(self) -> None:
        """Nothing to free: batches are ordinary objects."""

    def get(self, timeout_s: float) -> tuple[int, ToIterator] | None:
        """The next (worker id, message), or None after ``timeout_s``.

        Raises:
            WorkerError: a worker thread ended (it said so, or is found dead).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if self._dead is not None:
                self._died(*self._dead)
            left = deadline - time.monotonic()
            try:
                got = self._outbox.get(timeout=max(0.0, min(left, _ALIVE_CHECK_S)))
            except queue.Empty:
                self._check_alive()
                if left <= _ALIVE_CHECK_S:
                    return None
                continue
            if type(got[1]) not in LIFE or self._note(*got):
                return got

    def _note(self, wid: int, msg: Any) -> bool:
        if type(msg) is Bye and self._dead is None:  # raised by the next get()
            why = msg.why[0] if msg.why is not None else "an unknown cause"
            self._dead = (wid, f"it was ended by {why}")
        return self._phases.note(wid, msg)

    def _check_alive(self) -> None:
        """Raise for a thread found dead with nothing left in the queue (what a thread puts
        there before it ends is read first: it may say why)."""
        dead = [wid for wid, t in enumerate(self._threads) if not t.is_alive()]
        if dead and self._outbox.empty() and not self._closed:
            self._died(dead[0], "its thread ended without saying why")

    def _died(self, wid: int, why: str) -> None:
        self.shutdown(grace_s=0.0)
        raise WorkerError(f"DataLoader worker thread {wid} exited unexpectedly: {why}.")

    def shutdown(self, grace_s: float = _STOP_GRACE_S) -> None:
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
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))
