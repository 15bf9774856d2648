"""The worker loop: seeding, worker info, fetching tasks and sending results back.

One loop (:func:`_serve`) serves process and thread workers alike through a sink, which
says how tasks come in and results go out: :class:`_ShmSink` for a worker process (tasks
from its pipe, batches written into shared-memory slots, their metadata back on the pipe)
and :class:`_QueueSink` for a worker thread (tasks from its queue, batch objects into the
pool's queue). :func:`process_worker` is a process's entry point (module level, picklable
arguments only, so spawn and forkserver work); :func:`thread_worker` a thread's.

The messages are in :mod:`stoker._engine._messages`. A worker ends early, as in torch,
when the dataset or ``worker_init_fn`` raises a ``BaseException`` that is not an
``Exception`` (``SystemExit``, ``KeyboardInterrupt``...): a process exits with its code, a
thread ends; its :class:`~stoker._engine._messages.Bye` says why, and the main process
reports a dead worker.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.random  # loaded once here, not again in each new worker

from stoker import _torch
from stoker._engine._buffers import BufferPool
from stoker._engine._messages import (
    Bye,
    Exhausted,
    Failed,
    Help,
    Inited,
    Loaded,
    LoadedGroup,
    Probe,
    Ready,
    Shipped,
    Snapshot,
    StartFailed,
    Task,
)
from stoker._engine._pin import pin
from stoker._engine._probe import SampleTimer
from stoker._engine._shm import Arena, unlink_prefix
from stoker._engine._split import HelpBoard
from stoker._engine._transport import (
    Inbox,
    Outbox,
    RemoteError,
    encode,
    send,
    unpack_task,
)
from stoker._fetch import IterableFetcher, MapFetcher
from stoker._policy import FAST_BATCH_S, INDICES_SHOWN, TAIL_SPLIT_MIN_S
from stoker._random import batch_seeds, call_seeded, globals_untouched, mix_seed, seed_globals
from stoker._stateful import StreamTask
from stoker._worker_info import WorkerInfo, get_worker_info, set_worker_info

_PR_SET_PDEATHSIG = 1

_NEW_EPOCH_WAIT_S = 1.0
"""How long a new epoch of persistent thread workers waits for a seeded fetch still in
flight; past it, the last epoch's decision on whether the dataset draws stands."""


def worker_seed(base: int, epoch: int, worker_id: int, iterable: bool) -> int:
    """Worker ``worker_id``'s seed (``get_worker_info().seed``), as torch makes it: a base
    seed + ``worker_id``. The base is the loader's; an iterable dataset's, whose workers
    draw on from that seed through the epoch (torch draws a new base per epoch), is mixed
    from (the loader's, epoch) after the first epoch, so that its draws never repeat.

    >>> worker_seed(10, 0, 1, True), worker_seed(10, 3, 1, False)
    (11, 11)
    >>> worker_seed(10, 1, 1, True) != worker_seed(10, 2, 1, True)
    True
    """
    if iterable and epoch:
        base = mix_seed(base, epoch)
    return base + worker_id


def _enter_epoch(args: WorkerArgs, seed: int, whole_process: bool) -> bool:
    """Make ``seed`` the worker's seed (``get_worker_info().seed``, torch's too) for an
    iterable dataset's new epoch; True if it changed (the caller seeds the RNGs from it)."""
    info = get_worker_info()
    if info is None or info.seed == seed:
        return False  # started for this epoch, seeded already (and worker_init_fn ran)
    info = WorkerInfo(info.id, info.num_workers, seed, info.dataset)
    set_worker_info(info, whole_process=whole_process)
    if whole_process:
        _set_torch_worker_info(info)
    return True


class RngGuard:
    """Keeps thread workers deterministic when a dataset draws from the global RNGs.

    Threads share Python's, NumPy's and torch's global RNGs, so a batch gets its own
    (seed, epoch, k) stream only if no other thread draws meanwhile. At each epoch's start,
    until the dataset shows whether it draws, batches are fetched in parallel, unseeded,
    with the RNG states compared around each fetch: a fetch that moved none stands and the
    epoch goes on in parallel; once one moved, that batch and the rest of the epoch are
    fetched again seeded, under one process-wide lock, one at a time. Checking every fetch
    would make every batch serial, as the training loop's own draws would count as the
    dataset's. Process workers have no such limits; see ``docs/engine.md``, "Thread mode
    and RNGs".

    Worker threads call :meth:`fetch`; the main thread calls :meth:`new_epoch` before it
    sends an epoch's tasks.
    """

    lock = threading.Lock()

    def __init__(self) -> None:
        self.serial: bool | None = None  # None until a fetch of this epoch tells
        self._cond = threading.Condition()
        self._unseeded = 0  # unseeded fetches in flight; seeded ones wait for them

    def new_epoch(self) -> None:
        """Decide again: the dataset may start (or stop) drawing in the next epoch. Waits
        for a seeded fetch in flight (of the epoch before), at most ``_NEW_EPOCH_WAIT_S``:
        past that (a stuck dataset), the last epoch's decision stands."""
        if not self.lock.acquire(timeout=_NEW_EPOCH_WAIT_S):
            return
        try:
            with self._cond:
                self.serial = None
        finally:
            self.lock.release()

    def fetch(
        self, fetch: Callable[[Any], Any], task: Any, seed: int, seeded: Callable[[Any], Any]
    ) -> Any:
        """``fetch(task)``, or ``seeded(task)`` with the global RNGs seeded from ``seed``
        for it alone (``seeded`` must not use other threads: they would draw out of order).
        """
        with self._cond:
            mode = self.serial  # None: probe, False: plain, True: seeded
            self._unseeded += mode is not True
        if mode is not True:
            moved = True
            try:
                before = _rng_states() if mode is None else None
                data = fetch(task)
                moved = before is not None and _rng_states() != before
            finally:
                with self._cond:
                    self._unseeded -= 1
                    if mode is None and (moved or self.serial is None):
                        self.serial = moved  # a draw seen anywhere makes the epoch serial
                    self._cond.notify_all()
            if not moved:  # nothing drew while it ran: the batch does not depend on it
                return data
        with self._cond:  # no unseeded fetch may draw from a seeded batch's stream
            self._cond.wait_for(lambda: self._unseeded == 0)
        with self.lock:  # the main thread's streams go on after it (as in process)
            return call_seeded(seed, seeded, task)


def _rng_states() -> tuple[Any, ...]:
    np_state: Any = np.random.get_state()
    torch = _torch.loaded()
    return (
        random.getstate(),
        np_state[1].tobytes(),
        np_state[2],
        bytes(torch.default_generator.get_state().numpy()) if torch is not None else None,
    )


@dataclass
class WorkerArgs:
    """Everything a worker needs; picklable (spawn / forkserver send it to the worker).

    Attributes:
        worker_id: the worker's index.
        num_workers: the loader's worker count.
        seed: the worker's seed when it starts (see :func:`worker_seed`).
        fetcher: the loader's fetcher.
        worker_init_fn: the user's hook, called after seeding.
        prefix: the worker's shared-memory segment name prefix.
        keep_free: free slots the worker keeps for reuse.
        steady: slots the worker needs once batches flow (see :class:`Arena`).
        window: the loader's slots in flight (for error messages).
        import_torch: import torch first.
        pin_device: pin batches in the worker (threads only).
        rng_guard: the guard a pool's thread workers share (threads only).
        board: where idle threads take samples of slow batches (threads only).
        buffers: reusable memory for large leaves (threads only).
        warm: (name, mmap) of segments inherited through fork, adopted as free slots.
        hand_off: on stop, leave slots made ahead and unused to the main process (fork).
        probe: time an epoch's first samples (:mod:`stoker._engine._probe`).
    """

    worker_id: int
    num_workers: int
    seed: int
    fetcher: MapFetcher | IterableFetcher
    worker_init_fn: Callable[[int], None] | None
    prefix: str = ""
    keep_free: int = 3
    steady: int = 4
    window: int = 1
    import_torch: bool = False
    hand_off: bool = False
    pin_device: str | None = None
    rng_guard: RngGuard | None = None
    board: HelpBoard | None = None
    buffers: BufferPool | None = None
    warm: list[Any] = field(default_factory=list)
    probe: bool = False

    @property
    def in_thread(self) -> bool:
        """Whether the worker is a thread (only thread workers share a board)."""
        return self.board is not None


def _where(args: WorkerArgs, task: Any) -> str:
    """'worker 1 (pid 42) on sample indices [3, 4]' (a thread: 'worker thread 1 ...')."""
    if args.in_thread:
        text = f"worker thread {args.worker_id}"
    else:
        text = f"worker {args.worker_id} (pid {os.getpid()})"
    if task is None:
        return text
    if isinstance(task, np.ndarray):
        task = task.tolist()
    if isinstance(task, list) and len(task) > INDICES_SHOWN:
        shown = ", ".join(map(str, task[:INDICES_SHOWN]))
        return f"{text} on sample indices [{shown}, ...] ({len(task)} in all)"
    return f"{text} on sample indices {task}"


def _set_torch_worker_info(info: WorkerInfo) -> None:
    """Make ``torch.utils.data.get_worker_info()`` answer too (datasets shard with it)."""
    torch = _torch.loaded()
    if torch is None:
        return
    torch.set_num_threads(1)
    with contextlib.suppress(Exception):  # torch's private layout may change
        worker = torch.utils.data._utils.worker
        worker._worker_info = worker.WorkerInfo(
            id=info.id, num_workers=info.num_workers, seed=info.seed, dataset=info.dataset
        )


def _setup(args: WorkerArgs, whole_process: bool) -> None:
    info = WorkerInfo(args.worker_id, args.num_workers, args.seed, args.fetcher.dataset)
    set_worker_info(info, whole_process=whole_process)
    if whole_process:
        if args.import_torch:
            _torch.require("a worker of a process that uses torch")
        _set_torch_worker_info(info)
        seed_globals(args.seed, every_device=True)


class _Ended(Exception):
    """A worker ends early: the dataset or ``worker_init_fn`` raised ``exc``, a
    ``BaseException`` that is not an ``Exception`` (``sys.exit()``, ``KeyboardInterrupt``...),
    or stoker's own worker code failed; ``remote`` says so to the main process."""

    def __init__(self, exc: BaseException, where: str) -> None:
        super().__init__(where)
        self.exc = exc
        self.remote = RemoteError(exc, where, keep_object=True)  # for its summary()
        code = exc.code if isinstance(exc, SystemExit) else 1
        self.code = code if isinstance(code, int) else int(code is not None)  # as Python exits


def _start(args: WorkerArgs, sink: _Sink, whole_process: bool) -> bool:
    """Set the worker up, send :class:`Ready`, run ``worker_init_fn`` (then send
    :class:`Inited`); False when either raised an Exception (sent as :class:`StartFailed`),
    :class:`_Ended` for any other BaseException from ``worker_init_fn``."""
    try:
        _setup(args, whole_process)
    except Exception as exc:
        who = f"worker thread {args.worker_id}" if args.in_thread else f"worker {args.worker_id}"
        sink.send(StartFailed(RemoteError(exc, f"{who} start-up", keep_object=args.in_thread)))
        return False
    sink.send(Ready())
    init = args.worker_init_fn
    if init is None:
        return True
    try:
        init(args.worker_id)
    except _ParentDied:
        raise
    except Exception as exc:
        where = f"{_where(args, None)} start-up"
        sink.send(StartFailed(RemoteError(exc, where, keep_object=args.in_thread)))
        return False
    except BaseException as exc:
        name = getattr(init, "__qualname__", type(init).__qualname__)
        raise _Ended(exc, f"{_where(args, None)}'s worker_init_fn {name}") from None
    sink.send(Inited())
    return True


def _reset_fetcher(fetcher: MapFetcher | IterableFetcher) -> None:
    if isinstance(fetcher, IterableFetcher):
        fetcher._it = None
        fetcher.ended = False


class _ParentDied(BaseException):
    """Raised in a worker by the parent-death signal; unwinds to the cleanup."""


def _watch_parent() -> None:
    """Get SIGUSR2 when the parent dies (Linux prctl PR_SET_PDEATHSIG), and exit on it.

    The signal also fires when the parent *thread* that started the worker exits, so the
    handler checks that the parent process really changed before unwinding.
    """
    parent = os.getppid()

    def on_signal(signum: int, frame: Any) -> None:
        if os.getppid() != parent:
            raise _ParentDied

    signal.signal(signal.SIGUSR2, on_signal)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGUSR2), 0, 0, 0)
    if os.getppid() != parent:  # died before prctl took effect
        raise _ParentDied


def process_worker(args: WorkerArgs, conn: Any) -> None:
    """A worker process's main function: start up, then serve tasks until told to stop.

    Args:
        args: the worker's settings (see :class:`WorkerArgs`).
        conn: this worker's end of its own duplex pipe to the main process.
    """
    # Ctrl-C reaches the whole process group; the main process decides and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    arena = Arena(args.prefix, args.keep_free, args.window, args.steady, args.num_workers)
    arena.adopt(args.warm)
    args.warm = []
    sink = _ShmSink(args, conn, arena)
    kept: list[tuple[str, int]] = []
    ended: _Ended | None = None
    try:
        _watch_parent()
        if _start(args, sink, whole_process=True):
            try:
                _serve(args, sink)
            finally:
                sink.outbox.close()
            if args.hand_off:  # told to stop: the main process keeps the slots it never saw
                kept = arena.hand_off()
    except (_ParentDied, EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the main process is gone: clean up below and exit quietly
    except _Ended as exc:
        ended = exc
        # Batches sent just before: the main process maps (and unlinks) their slots.
        kept = arena.leave_sent()
    finally:
        # An idle worker sees end-of-file *and* gets the parent-death signal: the signal
        # must not interrupt the cleanup it would trigger.
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        arena.close()
        _say_bye(args, conn, kept, ended)
    _exit(args, ended)


def _say_bye(
    args: WorkerArgs, conn: Any, kept: list[tuple[str, int]], ended: _Ended | None
) -> None:
    """Send :class:`Bye`: this worker writes no slot from here on, so the main process may
    hand them on and stop waiting (it reaps the exit, an address-space teardown, in the
    back)."""
    try:
        why = None if ended is None else (ended.remote.summary(), ended.code)
        send(conn, Bye(kept, why))
    except (OSError, ValueError):  # nobody to take them: unlink them too
        unlink_prefix(args.prefix)
    # What is left of a forked worker is the exit: tearing down this copy of the main
    # process's address space (slow with torch loaded). At the lowest priority, it
    # waits for a free core instead of taking one from the main process or the other
    # workers still loading. Not a spawned worker (``hand_off`` is for fork only): its
    # exit runs the interpreter's finalization, which on a busy machine would starve
    # for seconds at that priority, and workers must be gone soon after the loop ends.
    # Nor a worker ending early: the main process waits for its exit code.
    if ended is None and args.hand_off:
        with contextlib.suppress(OSError):
            os.nice(19)


def _exit(args: WorkerArgs, ended: _Ended | None) -> None:
    """End the worker process with the exit code its :class:`Bye` said."""
    code = 0 if ended is None else ended.code
    if not args.hand_off:
        # A spawned or forkserver worker would exit through the interpreter's finalization,
        # seconds with torch loaded on a busy machine, while the main process waits for it
        # to be gone. Nothing is left to finalise (pipe and arena closed, goodbye said).
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    if ended is not None:  # exit quietly with the code said
        raise SystemExit(code)


def thread_worker(args: WorkerArgs, inbox: Any, outbox: Any) -> None:
    """A worker thread: the same loop as a process, passing batch objects (in-process).

    Whatever the dataset throws that is not an ``Exception`` (``sys.exit()``,
    ``KeyboardInterrupt``...) ends the thread as it would end a process: its last message,
    :class:`Bye` with what ended it, tells the main process that the worker is dead.

    Args:
        args: the worker's settings.
        inbox: a ``queue.SimpleQueue`` of tasks (``None`` stops the thread).
        outbox: the queue shared by all threads, of ``(worker_id, message)``.
    """
    sink = _QueueSink(args, inbox, outbox)
    try:
        if _start(args, sink, whole_process=False):
            _serve(args, sink)
    except _Ended as exc:
        sink.send(Bye(None, (exc.remote.summary(), None)))
    except BaseException as exc:  # stoker's own code failed: still a dead worker, saying why
        remote = RemoteError(exc, f"worker thread {args.worker_id}", keep_object=True)
        sink.send(Bye(None, (remote.summary(), None)))
    finally:
        set_worker_info(None, whole_process=False)


class _Sink:
    """How a worker's tasks come in and its results go out (see the module docstring)."""

    def __init__(self, args: WorkerArgs) -> None:
        self.args = args
        self.fetcher = args.fetcher

    def send(self, msg: Any) -> None:
        """Send a message about the worker's life or a task, now."""
        raise NotImplementedError

    def next_task(self) -> Task | None:
        """The next task, or None when told to stop (waits for one)."""
        raise NotImplementedError

    def epoch(self, seed: int) -> None:
        """An iterable dataset's new epoch, its worker seeded from ``seed``."""
        raise NotImplementedError

    def seed_for(self, task: Task) -> int | None:
        """The seed to fetch ``task``'s batch under, or None: unseeded."""
        raise NotImplementedError

    def begin(self) -> None:
        """Before fetching a task's batch (or a group's)."""

    def fetch(self, indices: Any, seed: int | None, timer: SampleTimer | None = None) -> Any:
        """The batch of ``indices`` (seeded from ``seed``, unless None) and its skipped;
        ``timer`` times its samples."""
        raise NotImplementedError

    def ship(self, task: Task, data: Any, skipped: Any, started: float, first: bool) -> None:
        """Send a task's batch, fetched since ``started`` (``first``: the epoch's first)."""
        raise NotImplementedError

    def snapshot(self, task: Task) -> None:
        """Send the state of a stateful iterable dataset after ``task``'s batch, before it
        (a copy: the main process keeps it while the dataset goes on, in this process)."""
        state = copy.deepcopy(self.fetcher.state())  # type: ignore[union-attr]
        self.send(Snapshot(task.generation, task.idx, state))

    def ship_group(self, task: Task, batches: list[Any], skips: list[Any], started: float) -> None:
        """Send a group's batches (a :class:`RemoteError` for each that raised)."""
        raise NotImplementedError

    def abort(self) -> None:
        """A fetch failed: drop what :meth:`begin` took."""

    def fail_all(self, task: Task, exc: Exception) -> None:
        """Send one :class:`Failed` for each batch of ``task`` (a group's), raised ``exc``."""
        err = RemoteError(exc, _where(self.args, None), keep_object=self.args.in_thread)
        for j in range(len(task.task)):
            self.send(Failed(task.generation, task.idx + j, err))


class _ShmSink(_Sink):
    """A worker process's: tasks from its pipe, batches into shared memory (one slot each,
    or a group's), their metadata back on the pipe, held briefly when they are fast."""

    def __init__(self, args: WorkerArgs, conn: Any, arena: Arena) -> None:
        super().__init__(args)
        self.arena = arena
        self.inbox = Inbox(conn.fileno())
        self.outbox = Outbox(conn)
        self.pending: collections.deque[Task] = collections.deque()
        self.iterable = isinstance(args.fetcher, IterableFetcher)

    def send(self, msg: Any) -> None:
        self.outbox.send(msg)

    def next_task(self) -> Task | None:
        pending, inbox = self.pending, self.inbox
        # Read everything already sent before taking a slot: slots freed after queued tasks
        # were sent then count before the next batch (no new slot for nothing).
        while not pending or inbox.readable():
            if not pending:
                self.outbox.flush()  # nothing is held while the worker waits
            work = inbox.recv()
            if work is None:
                return None
            if work.freed:
                self.arena.release(work.freed)
            tasks = [unpack_task(t) for t in work.tasks]
            if pending and tasks and tasks[0].generation != pending[-1].generation:
                pending.clear()  # an epoch the main process abandoned: results unwanted
            pending.extend(tasks)
        return pending.popleft()

    def epoch(self, seed: int) -> None:
        if _enter_epoch(self.args, seed, whole_process=True):
            seed_globals(seed, every_device=True)  # its draws go on through the epoch

    def seed_for(self, task: Task) -> int | None:
        return task.seed if self.fetcher.draws and not self.iterable else None

    def begin(self) -> None:
        # Making the slot (for a later batch too) may find /dev/shm full.
        self.arena.begin(ahead=bool(self.pending))

    def fetch(self, indices: Any, seed: int | None, timer: SampleTimer | None = None) -> Any:
        if seed is not None:
            seed_globals(seed)
        if timer is not None and isinstance(self.fetcher, MapFetcher):
            return self.fetcher.fetch_skipping(indices, self.arena.alloc, timer.map_fn)
        return self.fetcher.fetch_skipping(indices, alloc=self.arena.alloc)

    def ship(self, task: Task, data: Any, skipped: Any, started: float, first: bool) -> None:
        slot, payload = encode(data, self.arena)
        busy = time.perf_counter() - started
        # For a slow batch, whether the dataset left the global RNGs alone: then its parts
        # can be loaded by several workers (see stoker._engine._tail).
        untouched = None
        if busy >= TAIL_SPLIT_MIN_S and not self.iterable:
            untouched = not self.fetcher.draws or globals_untouched(task.seed)
        retired = self.arena.take_retired()
        msg = Shipped(task.generation, task.idx, slot, payload, retired, busy, skipped, untouched)
        self.outbox.send(msg, hold=bool(self.pending) and busy < FAST_BATCH_S and not first)

    def ship_group(self, task: Task, batches: list[Any], skips: list[Any], started: float) -> None:
        try:
            slot, payload = encode(batches, self.arena, group=True)
        except Exception as exc:  # a batch that cannot cross (pickling failed): each says so
            self.arena.abort()
            self.fail_all(task, exc)
            return
        busy = time.perf_counter() - started
        skipped = skips if any(s is not None for s in skips) else None
        retired = self.arena.take_retired()
        msg = Shipped(task.generation, task.idx, slot, payload, retired, busy, skipped, None, True)
        self.send(msg)

    def snapshot(self, task: Task) -> None:
        state = self.fetcher.state()  # type: ignore[union-attr]
        self.outbox.send(Snapshot(task.generation, task.idx, state), hold=True)  # with the batch

    def abort(self) -> None:
        self.arena.abort()


class ObjectSink(_Sink):
    """A sink that ships batches as the objects themselves (:class:`Loaded`), for a
    transport that moves objects: a thread's queue, a Ray actor's answer."""

    def ship(self, task: Task, data: Any, skipped: Any, started: float, first: bool) -> None:
        busy = time.perf_counter() - started
        self.send(Loaded(task.generation, task.idx, data, busy, skipped, None))

    def ship_group(self, task: Task, batches: list[Any], skips: list[Any], started: float) -> None:
        skipped = skips if any(s is not None for s in skips) else None
        busy = time.perf_counter() - started
        self.send(LoadedGroup(task.generation, task.idx, batches, busy, skipped))


class _QueueSink(ObjectSink):
    """A worker thread's: tasks (and offers of help, see :mod:`stoker._engine._split`) from
    its queue, batch objects (pinned, if asked) into the pool's queue."""

    def __init__(self, args: WorkerArgs, inbox: Any, outbox: Any) -> None:
        super().__init__(args)
        self.inbox = inbox
        self.outbox = outbox
        self.iterable = isinstance(args.fetcher, IterableFetcher)
        self.fetched = 0  # batches of an iterable dataset this epoch
        board = args.board
        assert args.rng_guard is not None and board is not None
        self.guard, self.board = args.rng_guard, board
        alloc = args.buffers.alloc if args.buffers is not None else None
        self.whole = functools.partial(self.fetcher.fetch_skipping, alloc=alloc)
        self.split = self.whole
        if isinstance(self.fetcher, MapFetcher):
            self.split = functools.partial(
                self.fetcher.fetch_skipping, alloc=alloc, map_fn=board.map
            )

    def send(self, msg: Any) -> None:
        if type(msg) is Probe:  # the tuner decides from the first: later ones take no helpers
            self.board.probing = False
        self.outbox.put((self.args.worker_id, msg))

    def next_task(self) -> Task | None:
        while True:
            msg = self.board.next_message(self.args.worker_id, self.inbox)
            if type(msg) is not Help:
                return msg  # type: ignore[no-any-return]
            msg.job.work()  # samples of another thread's slow batch

    def epoch(self, seed: int) -> None:
        _enter_epoch(self.args, seed, whole_process=False)
        self.fetched = 0

    def seed_for(self, task: Task) -> int | None:
        seed = task.seed
        if self.iterable:  # threads share the RNGs: each batch is seeded on its own
            seed, self.fetched = mix_seed(seed, self.fetched), self.fetched + 1
        return seed if self.fetcher.draws else None

    def fetch(self, indices: Any, seed: int | None, timer: SampleTimer | None = None) -> Any:
        split = self.split
        if timer is not None and isinstance(self.fetcher, MapFetcher):
            board_map = self.board.map
            split = functools.partial(
                self.split, map_fn=lambda fn, items: board_map(timer.wrap(fn), items, True)
            )
        if seed is not None:
            data, skipped = self.guard.fetch(split, indices, seed, self.whole)
        else:
            data, skipped = split(indices)
        if self.args.pin_device is not None and data is not None:
            data = pin(data, self.args.pin_device)
        return data, skipped


def _serve(args: WorkerArgs, sink: _Sink) -> None:
    """The worker loop, for processes and threads alike: each task's batch (or group of
    batches) fetched and shipped, or its failure sent, until told to stop."""
    fetcher = args.fetcher
    iterable = isinstance(fetcher, IterableFetcher)
    generation = None
    while (task := sink.next_task()) is not None:
        first = task.generation != generation  # an epoch's first batch is never held back
        if first:
            generation = task.generation
            _reset_fetcher(fetcher)
            if iterable:
                sink.epoch(task.seed)
                if type(task.task) is StreamTask:  # a resumed stateful stream: its state
                    fetcher.resume = task.task.state  # type: ignore[union-attr]
        seed = sink.seed_for(task)
        if iterable and fetcher.ended:  # type: ignore[union-attr]
            sink.send(Exhausted(task.generation, task.idx))
            continue
        group = type(task.seed) is tuple  # a group of tiny batches: one slot, one message
        try:
            if group:
                _load_group(args, sink, task)
            else:
                _load(sink, task, seed, first, iterable)
        except Exception as exc:  # the dataset's, collate's, or a batch that cannot cross
            sink.abort()
            if iterable and isinstance(exc, StopIteration):
                sink.send(Exhausted(task.generation, task.idx))
            else:  # no local name for it: the frame must not keep it (see _failure)
                where = None if iterable else task.task
                sink.send(Failed(task.generation, task.idx, _failure(args, exc, where)))
        except _ParentDied:
            raise
        except BaseException as exc:  # sys.exit(), KeyboardInterrupt...: the worker ends
            sink.abort()
            raise _Ended(exc, _where(args, None if group or iterable else task.task)) from None


def _load(sink: _Sink, task: Task, seed: int | None, first: bool, iterable: bool) -> None:
    """Fetch and ship one task's batch (its own frame: nothing of it outlives the call);
    an epoch's first, timed for the autotuner if it asks; a stateful iterable dataset's
    state before it, unless the task says none is needed (see :class:`StreamTask`)."""
    started = time.perf_counter()
    sink.begin()
    timer = None
    if first and sink.args.probe:
        size = len(task.task) if hasattr(task.task, "__len__") else 1
        timer = SampleTimer(sink.send, task.generation, size)
    data, skipped = sink.fetch(task.task, seed, timer)
    if timer is not None:
        timer.finish()
    if iterable and sink.fetcher.stateful and _wants_state(task.task):  # type: ignore[union-attr]
        sink.snapshot(task)
    sink.ship(task, data, skipped, started, first)


def _wants_state(task: Any) -> bool:
    """Whether an iterable dataset's task asks for the worker's state after its batch."""
    return task is None or (type(task) is StreamTask and task.snapshot)


def _load_group(args: WorkerArgs, sink: _Sink, task: Task) -> None:
    """Fetch and ship a group of tiny batches (task indices ``task.idx``, ``+ 1``, ...):
    each seeded from (seed, epoch, its own batch number), as a batch sent alone, and a
    :class:`RemoteError` in place of each that raised. The finished batches wait for the
    group's last one: only batches measured to load in less than
    :data:`~stoker._policy.FAST_BATCH_S` are grouped
    (see :func:`~stoker._policy.group_size`)."""
    base, epoch, ks = task.seed
    started = time.perf_counter()
    try:
        sink.begin()
    except Exception as exc:  # /dev/shm full: every batch of the group says so
        sink.fail_all(task, exc)
        return
    n = len(task.task)
    seeds = batch_seeds(base, epoch, ks) if args.fetcher.draws else [None] * n
    batches: list[Any] = []
    skips: list[Any] = []
    for seed, indices in zip(seeds, task.task, strict=True):
        skipped = None
        try:
            data, skipped = sink.fetch(indices, seed)
        except Exception as exc:
            data = _failure(args, exc, indices)
        batches.append(data)
        skips.append(skipped)
    sink.ship_group(task, batches, skips, started)


def _failure(args: WorkerArgs, exc: Exception, indices: Any) -> RemoteError:
    """What a fetch of a map-style dataset that raised ``exc`` sends (a StopIteration is a
    RuntimeError there, as in torch). A thread's keeps the exception itself: the caller must
    not keep it in a local, since the main thread's frames join its traceback when raised."""
    if isinstance(exc, StopIteration):
        exc = RuntimeError("a map-style dataset raised StopIteration while fetching a batch.")
    return RemoteError(exc, _where(args, indices), keep_object=args.in_thread)
