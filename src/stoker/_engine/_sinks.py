"""A worker's two ends: how its tasks come in and its results go out (a sink), and the
entry points of a worker process and a worker thread.

The one worker loop (:mod:`stoker._engine._worker`) serves every kind of worker through a
:class:`~stoker._engine._worker.Sink`: :class:`ShmSink` for a worker process (tasks from its
pipe, batches written into shared-memory slots, their metadata back on the pipe),
:class:`QueueSink` for a worker thread (tasks from its queue, batch objects into the pool's
queue) and :class:`DirectSink` for the in-process pool (results into a list the pool
reads). :func:`process_worker` is a process's entry point (module level, picklable
arguments only, so spawn and forkserver work); :func:`thread_worker` a thread's.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import signal
import sys
import time
from typing import Any

from stoker._engine._errors import RemoteError
from stoker._engine._messages import Bye, Help, Probe, Shipped, Snapshot, Task
from stoker._engine._pin import pin
from stoker._engine._pipe import Inbox, Outbox, send, unpack_task
from stoker._engine._probe import SampleTimer
from stoker._engine._segments import unlink_prefix
from stoker._engine._shm import Arena
from stoker._engine._transport import encode
from stoker._engine._worker import (
    Ended,
    ParentDied,
    Sink,
    WorkerArgs,
    enter_epoch,
    serve,
    start,
)
from stoker._fetch import IterableFetcher, MapFetcher
from stoker._policy import FAST_BATCH_S, TAIL_SPLIT_MIN_S
from stoker._random import call_seeded, globals_untouched, mix_seed, seed_globals
from stoker._worker_info import set_worker_info

_PR_SET_PDEATHSIG = 1


def _watch_parent() -> None:
    """Get SIGUSR2 when the parent dies (Linux prctl PR_SET_PDEATHSIG), and exit on it.

    The signal also fires when the parent *thread* that started the worker exits, so the
    handler checks that the parent process really changed before unwinding.
    """
    parent = os.getppid()

    def on_signal(signum: int, frame: Any) -> None:
        if os.getppid() != parent:
            raise ParentDied

    signal.signal(signal.SIGUSR2, on_signal)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGUSR2), 0, 0, 0)
    if os.getppid() != parent:  # died before prctl took effect
        raise ParentDied


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
    sink = ShmSink(args, conn, arena)
    kept: list[tuple[str, int]] = []
    ended: Ended | None = None
    try:
        _watch_parent()
        if start(args, sink, whole_process=True):
            try:
                serve(args, sink)
            finally:
                sink.outbox.close()
            if args.hand_off:  # told to stop: the main process keeps the slots it never saw
                kept = arena.hand_off()
    except (ParentDied, EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the main process is gone: clean up below and exit quietly
    except Ended as exc:
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


def _say_bye(args: WorkerArgs, conn: Any, kept: list[tuple[str, int]], ended: Ended | None) -> None:
    """Send :class:`Bye`: this worker writes no slot from here on, so the main process may
    hand them on and stop waiting (it reaps the exit, an address-space teardown, in the
    back)."""
    try:
        why = None if ended is None else (ended.remote.summary(), ended.code)
        send(conn, Bye(kept=kept, why=why))
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


def _exit(args: WorkerArgs, ended: Ended | None) -> None:
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
    sink = QueueSink(args, inbox, outbox)
    try:
        if start(args, sink, whole_process=False):
            serve(args, sink)
    except Ended as exc:
        sink.send(Bye(kept=None, why=(exc.remote.summary(), None)))
    except BaseException as exc:  # stoker's own code failed: still a dead worker, saying why
        remote = RemoteError(exc, f"worker thread {args.worker_id}", keep_object=True)
        sink.send(Bye(kept=None, why=(remote.summary(), None)))
    finally:
        set_worker_info(None, whole_process=False)


class ProcessSink(Sink):
    """A worker that is a process of its own (a worker process, a Ray actor): an iterable
    dataset's worker seeds the process's RNGs once an epoch, a map-style batch is seeded
    from its own seed."""

    def __init__(self, args: WorkerArgs) -> None:
        super().__init__(args)
        self.iterable = isinstance(args.fetcher, IterableFetcher)

    def epoch(self, seed: int) -> None:
        if enter_epoch(self.args, seed, whole_process=True):
            seed_globals(seed, every_device=True)  # its draws go on through the epoch

    def seed_for(self, task: Task) -> int | None:
        if self.iterable or not self.fetcher.draws:  # an iterable's: seeded once, per epoch
            return None
        return task.seed.seed  # type: ignore[union-attr]  # a batch's (groups: KINDS)


class ObjectShipping(Sink):
    """Ships batch objects as they are (a thread's queue, the in-process pool's list, a
    Ray actor's answer), not into shared memory."""

    def ship(self, task: Task, data: Any, skipped: Any, started: float, first: bool) -> None:
        busy = time.perf_counter() - started
        self.send(shipped(task, data, busy, skipped))

    def ship_group(self, task: Task, batches: list[Any], skips: list[Any], started: float) -> None:
        skipped = skips if any(s is not None for s in skips) else None
        busy = time.perf_counter() - started
        self.send(shipped(task, batches, busy, skipped, group=True))


class ShmSink(ProcessSink):
    """A worker process's: tasks from its pipe, batches into shared memory (one slot each,
    or a group's), their metadata back on the pipe, held briefly when they are fast."""

    def __init__(self, args: WorkerArgs, conn: Any, arena: Arena) -> None:
        super().__init__(args)
        self.arena = arena
        self.inbox = Inbox(conn.fileno())
        self.outbox = Outbox(conn)
        self.pending: collections.deque[Task] = collections.deque()

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
            untouched = not self.fetcher.draws or globals_untouched(task.seed.seed)  # type: ignore[union-attr]
        retired = self.arena.take_retired()
        msg = shipped(task, payload, busy, skipped, slot=slot, retired=retired, untouched=untouched)
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
        self.send(shipped(task, payload, busy, skipped, slot=slot, retired=retired, group=True))

    def snapshot(self, task: Task) -> None:
        state = self.fetcher.state()  # type: ignore[union-attr]
        self.outbox.send(
            Snapshot(generation=task.generation, idx=task.idx, state=state), hold=True
        )  # with the batch

    def abort(self) -> None:
        self.arena.abort()


class LocalSink(ObjectShipping):
    """A worker in the main process's address space (a thread, or the in-process pool):
    batch objects handed over as they are; the global RNGs are shared with the main
    thread, so an iterable dataset's batches are each seeded on their own."""

    def __init__(self, args: WorkerArgs) -> None:
        super().__init__(args)
        self.iterable = isinstance(args.fetcher, IterableFetcher)
        self.fetched = 0  # batches of an iterable dataset this epoch

    def epoch(self, seed: int) -> None:
        enter_epoch(self.args, seed, whole_process=False)
        self.fetched = 0

    def seed_for(self, task: Task) -> int | None:
        seed: int = task.seed.seed  # type: ignore[union-attr]  # a batch's or a stream's
        if self.iterable:  # threads share the RNGs: each batch is seeded on its own
            seed, self.fetched = mix_seed(seed, self.fetched), self.fetched + 1
        return seed if self.fetcher.draws else None


class QueueSink(LocalSink):
    """A worker thread's: tasks (and offers of help, see :mod:`stoker._engine._split`) from
    its queue, batch objects (pinned, if asked) into the pool's queue."""

    def __init__(self, args: WorkerArgs, inbox: Any, outbox: Any) -> None:
        super().__init__(args)
        self.inbox = inbox
        self.outbox = outbox
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

    def fetch(self, indices: Any, seed: int | None, timer: SampleTimer | None = None) -> Any:
        split, probing = self.split, self.whole
        if isinstance(self.fetcher, MapFetcher):
            board_map, wrap = self.board.map, None if timer is None else timer.wrap

            def rest(fn: Any, items: list[Any], first_done: Any = None) -> list[Any]:
                timed = wrap is not None
                return board_map(fn if wrap is None else wrap(fn), items, timed, first_done)

            split = functools.partial(self.split, map_fn=rest)
            probing = functools.partial(self.whole, map_fn=self.guard.deciding(rest, wrap))
        if seed is not None:
            data, skipped = self.guard.fetch(split, indices, seed, self.whole, probing)
        else:
            data, skipped = split(indices)
        if self.args.pin_device is not None and data is not None:
            data = pin(data, self.args.pin_device)
        return data, skipped


class DirectSink(LocalSink):
    """The in-process pool's: the pool hands the loop each task; results go into the
    pool's list; a seeded batch's draws leave the main thread's streams as they were."""

    def __init__(self, args: WorkerArgs, results: collections.deque[tuple[int, Any]]) -> None:
        super().__init__(args)
        self.results = results

    def send(self, msg: Any) -> None:
        self.results.append((self.args.worker_id, msg))

    def fetch(self, indices: Any, seed: int | None, timer: SampleTimer | None = None) -> Any:
        fetch = self.fetcher.fetch_skipping
        if timer is not None and isinstance(self.fetcher, MapFetcher):
            fetch = functools.partial(self.fetcher.fetch_skipping, map_fn=timer.map_fn)
        data, skipped = fetch(indices) if seed is None else call_seeded(seed, fetch, indices)
        if self.args.pin_device is not None and data is not None:
            data = pin(data, self.args.pin_device)
        return data, skipped


def shipped(
    task: Task,
    payload: Any,
    busy: float,
    skipped: Any,
    *,
    slot: tuple[int, str, int] | None = None,
    retired: list[str] | None = None,
    untouched: bool | None = None,
    group: bool = False,
) -> Shipped:
    """The message for ``task``'s batch (or ``group``'s batches): ``payload`` the object
    itself in this process, or its structure with its leaves in shared-memory ``slot``."""
    return Shipped(
        generation=task.generation,
        idx=task.idx,
        slot=slot,
        payload=payload,
        retired=retired or [],
        busy=busy,
        skipped=skipped,
        untouched=untouched,
        group=group,
    )
