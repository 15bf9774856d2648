"""The worker loop: seeding, worker info, fetching tasks and sending results back.

:func:`process_worker` is the entry point of a worker process (module level, picklable
arguments only, so spawn and forkserver work); :func:`thread_worker` runs the same loop in a
thread of the main process with the in-process transport.

Messages, main -> worker: a list of tasks ``(generation, index, task, seed,
freed_slot_ids, dtype)`` (see :func:`~stoker._engine._transport.pack_tasks`; all the
tasks the main process had for this worker at once: one pipe message, one wake-up; a
group of tiny batches is one task, its ``task`` a list and its ``seed`` ``(seed, epoch,
batch numbers)``; an iterable dataset's ``seed`` is its worker's for the epoch, see
:func:`worker_seed`), ``("free", freed_slot_ids)``, or ``None`` (stop). Worker -> main:
``("ok", generation, index, slot, payload, retired_segments, busy_seconds, skipped,
untouched)`` (busy: the fetch + collate time, for ``loader.statistics()``; skipped: None, or
the samples left out with ``skip_errors``, see :meth:`~stoker._fetch.MapFetcher.fetch_skipping`;
untouched: for a slow batch, whether the global RNGs were left alone, else None),
``("okg", generation, index, slot, payload, retired_segments, busy_seconds, skipped, None)``
(a group of tiny batches, task indices ``index``, ``index + 1``, ...: the payload is their
list, a :class:`RemoteError` in place of each that raised; skipped: None or a list),
``("end", generation, index)`` (an iterable dataset is exhausted) or
``("err", generation, index, RemoteError)``; :data:`READY` once started (``timeout``
counts from it), :data:`INITED` after ``worker_init_fn`` (when there is one), or
``("err", -1, -1, RemoteError)`` when start-up failed, and :data:`BYE` + ``(kept, why)``
last of all (kept: ``(name, size)`` of slots left for the main process to keep: those it
never saw, see ``WorkerArgs.hand_off``, or, from a worker ending early, those it may not
have mapped yet; why: None, or, from a worker ending early, (what ended it, its exit
code)). A worker ends early, as in torch, when the dataset or ``worker_init_fn`` raises a
``BaseException`` that is not an ``Exception`` (``SystemExit``, ``KeyboardInterrupt``...):
a process exits with its code, a thread ends; the main process reports a dead worker.
"""

from __future__ import annotations

import collections
import contextlib
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
import numpy.random  # loaded once here, not in each new worker (~8 ms each)

from stoker import _torch
from stoker._engine._buffers import BufferPool
from stoker._engine._pin import pin
from stoker._engine._shm import Arena, unlink_prefix
from stoker._engine._split import HelpBoard
from stoker._engine._transport import (
    Inbox,
    Outbox,
    RemoteError,
    encode,
    unpack_task,
)
from stoker._fetch import IterableFetcher, MapFetcher
from stoker._policy import FAST_BATCH_S, INDICES_SHOWN, TAIL_SPLIT_MIN_S
from stoker._random import batch_seeds, call_seeded, globals_untouched, mix_seed, seed_globals
from stoker._worker_info import WorkerInfo, get_worker_info, set_worker_info

_PR_SET_PDEATHSIG = 1
BYE = ("bye", -1, -3)
"""A worker's last message: its slots are closed and it is exiting."""
READY = ("ready", -1, -2)
"""A worker is up (imports, seeding done); next it runs ``worker_init_fn``, if any."""
INITED = ("inited", -1, -4)
"""A worker's ``worker_init_fn`` returned."""

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

    Threads share Python's ``random``, NumPy's global RNG and torch's, so a batch can only
    get its own (seed, epoch, k) stream if no other thread draws meanwhile. At the start of
    each epoch, until the dataset has shown whether it draws, batches are fetched in
    parallel, unseeded, and the global RNG states are compared around each fetch: a fetch
    during which no state moved did not depend on them, so its batch stands and the
    epoch's later ones run in parallel; once a state moved, the dataset draws, and that
    batch and every later one of the epoch is fetched again seeded, under the lock, one at
    a time (use process workers for parallel augmentation). So a dataset that starts
    drawing in a later epoch is seen, but one that draws only for some batches of an epoch
    may draw unseeded, in thread order, for those after the first ones. Checking every
    fetch would not help: the training loop's own draws (dropout) would count as the
    dataset's and make every batch serial. Process workers have no such limit.

    One lock for the whole process, since the RNGs are process-wide. After a seeded batch
    the main thread's own streams go on, as in process; a training loop that draws from
    the global RNGs *while* a batch is seeded takes from that batch's stream, so with a
    dataset that draws, only process workers keep batches and loop apart.

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
        num_workers: how many workers the loader runs.
        seed: the worker's seed when it starts (see :func:`worker_seed`).
        fetcher: the loader's fetcher (dataset and collate function).
        worker_init_fn: the user's hook, called with ``worker_id`` after seeding.
        prefix: the worker's shared-memory segment name prefix.
        keep_free: free slots the worker keeps for reuse.
        steady: slots the worker needs once batches flow (see :class:`Arena`).
        window: slots in flight for the whole loader (for error messages).
        import_torch: import torch in the worker (the main process had it imported).
        pin_device: pin batches in the worker (thread workers only).
        rng_guard: the guard shared by a pool's thread workers (threads only).
        board: where a pool's idle thread workers take samples of slow batches (threads
            only; see :mod:`stoker._engine._split`).
        buffers: the loader's reusable memory for large leaves (threads only).
        warm: (name, mmap) of segments an earlier worker of the loader used, inherited
            through fork; the arena starts with them as free slots.
        hand_off: when told to stop, leave the slots the main process never saw (made
            ahead and not used yet) for it to keep too, not unlinked (fork).
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


def _init(args: WorkerArgs, send: Callable[[Any], None]) -> bool:
    """Run ``worker_init_fn`` (then send :data:`INITED`); False when it raised an Exception
    (sent as the start-up error), :class:`_Ended` for any other BaseException."""
    init = args.worker_init_fn
    if init is None:
        return True
    try:
        init(args.worker_id)
    except _ParentDied:
        raise
    except Exception as exc:
        where = f"{_where(args, None)} start-up"
        send(("err", -1, -1, RemoteError(exc, where, keep_object=args.in_thread)))
        return False
    except BaseException as exc:
        name = getattr(init, "__qualname__", type(init).__qualname__)
        raise _Ended(exc, f"{_where(args, None)}'s worker_init_fn {name}") from None
    send(INITED)
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
    kept: list[tuple[str, int]] = []
    ended: _Ended | None = None
    try:
        _watch_parent()
        try:
            _setup(args, whole_process=True)
        except Exception as exc:
            conn.send(("err", -1, -1, RemoteError(exc, f"worker {args.worker_id} start-up")))
            return
        conn.send(READY)
        if not _init(args, conn.send):
            return
        outbox = Outbox(conn)
        try:
            _serve(args, conn, outbox, arena)
        finally:
            outbox.close()
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
        # This worker writes no slot from here on: the main process may hand them on and
        # stop waiting (it reaps the exit, ~5 ms of address-space teardown, in the back).
        try:
            why = None if ended is None else (ended.remote.summary(), ended.code)
            conn.send((*BYE, kept, why))
        except (OSError, ValueError):  # nobody to take them: unlink them too
            unlink_prefix(args.prefix)
        # What is left of a forked worker is the exit: tearing down this copy of the main
        # process's address space (~5 ms with torch loaded). At the lowest priority, it
        # waits for a free core instead of taking one from the main process or the other
        # workers still loading. Not a spawned worker (``hand_off`` is for fork only): its
        # exit runs the interpreter's finalization, which on a busy machine would starve
        # for seconds at that priority, and workers must be gone soon after the loop ends.
        # Nor a worker ending early: the main process waits for its exit code.
        if ended is None and args.hand_off:
            with contextlib.suppress(OSError):
                os.nice(19)
    code = 0 if ended is None else ended.code  # the main process was told why
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


def _serve(args: WorkerArgs, conn: Any, outbox: Outbox, arena: Arena) -> None:
    fetcher = args.fetcher
    iterable = isinstance(fetcher, IterableFetcher)
    generation = None
    pending: collections.deque[Any] = collections.deque()
    inbox = Inbox(conn.fileno())
    while True:
        # Read everything already sent before taking a slot: free-slot notices sent after
        # queued tasks then count before the next batch (no new slot for nothing).
        while not pending or inbox.readable():
            if not pending:
                outbox.flush()  # nothing is held while the worker waits
            msg = inbox.recv()
            if msg is None:
                return
            if type(msg) is list:
                if pending and msg and msg[0][0] != pending[-1][0]:
                    _drop_abandoned(pending, arena)
                pending.extend(msg)
            else:
                arena.release(msg[1])
        gen, index, task, seed, freed, dtype = pending.popleft()
        task = unpack_task(task, dtype)
        if freed:
            arena.release(freed)
        first = gen != generation  # an epoch's first batch is never held back
        if first:
            generation = gen
            _reset_fetcher(fetcher)
            if iterable and _enter_epoch(args, seed, whole_process=True):
                seed_globals(seed, every_device=True)  # its draws go on through the epoch
        if iterable and fetcher.ended:  # type: ignore[union-attr]
            outbox.send(("end", gen, index))
            continue
        if type(seed) is tuple:  # a group of tiny batches: one slot, one message
            try:
                replies = _fetch_group(args, arena, gen, index, task, seed, bool(pending))
            except _ParentDied:
                raise
            except BaseException as exc:  # as for a single batch (below)
                arena.abort()
                raise _Ended(exc, _where(args, None)) from None
            for reply in replies:
                outbox.send(reply)
            continue
        started = time.perf_counter()
        if fetcher.draws and not iterable:
            seed_globals(seed)
        try:
            # Inside: making the slot (for a later batch too) may find /dev/shm full.
            arena.begin(ahead=bool(pending))
            data, skipped = fetcher.fetch_skipping(task, alloc=arena.alloc)
            slot, payload = encode(data, arena)
            del data
        except StopIteration:
            arena.abort()
            if not iterable:
                outbox.send(("err", gen, index, _stop_iteration_error(args, task)))
            else:
                outbox.send(("end", gen, index))
            continue
        except Exception as exc:
            arena.abort()
            outbox.send(("err", gen, index, RemoteError(exc, _where(args, task))))
            continue
        except _ParentDied:
            raise
        except BaseException as exc:  # sys.exit(), KeyboardInterrupt...: the worker ends
            arena.abort()
            raise _Ended(exc, _where(args, task)) from None
        busy = time.perf_counter() - started
        retired = arena.take_retired()
        # For a slow batch, whether the dataset left the global RNGs alone: then its parts
        # can be loaded by several workers (see stoker._engine._tail).
        slow = busy >= TAIL_SPLIT_MIN_S and not iterable
        untouched = (not fetcher.draws or globals_untouched(seed)) if slow else None
        reply = ("ok", gen, index, slot, payload, retired, busy, skipped, untouched)
        outbox.send(reply, hold=bool(pending) and busy < FAST_BATCH_S and not first)


def _fetch_group(
    args: WorkerArgs,
    arena: Arena,
    gen: int,
    index: int,
    tasks: list[Any],
    seed: tuple[int, int, list[int]],
    ahead: bool,
) -> list[tuple[Any, ...]]:
    """The replies to a group of tiny batches (task indices ``index``, ``index + 1``, ...):
    one ``"okg"`` message whose payload is the list of the batches (or of the
    :class:`RemoteError` of those that raised), all written into one slot. Each batch is
    seeded from (seed, epoch, its own batch number), as a batch sent alone. The finished
    batches wait for the group's last one: only batches measured to load in well under a
    millisecond are grouped (see :func:`~stoker._policy.group_size`)."""
    base, epoch, ks = seed
    fetcher = args.fetcher
    started = time.perf_counter()
    try:
        arena.begin(ahead=ahead)  # may find /dev/shm full: every batch of the group says so
    except Exception as exc:
        err = RemoteError(exc, _where(args, None))
        return [("err", gen, index + j, err) for j in range(len(tasks))]
    batches: list[Any] = []
    skips: list[Any] = []
    seeds = batch_seeds(base, epoch, ks) if fetcher.draws else [None] * len(tasks)
    for k_seed, task in zip(seeds, tasks, strict=True):
        if k_seed is not None:
            seed_globals(k_seed)
        skipped = None
        try:
            data, skipped = fetcher.fetch_skipping(task, alloc=arena.alloc)
        except StopIteration:
            data = _stop_iteration_error(args, task)
        except Exception as exc:
            data = RemoteError(exc, _where(args, task))
        batches.append(data)
        skips.append(skipped)
    try:
        slot, payload = encode(batches, arena, group=True)
    except Exception as exc:  # a batch that cannot cross (pickling failed): each one says so
        arena.abort()
        err = RemoteError(exc, _where(args, None))
        return [("err", gen, index + j, err) for j in range(len(tasks))]
    busy = time.perf_counter() - started
    any_skipped = skips if any(s is not None for s in skips) else None
    return [("okg", gen, index, slot, payload, arena.take_retired(), busy, any_skipped, None)]


def _drop_abandoned(pending: collections.deque[Any], arena: Arena) -> None:
    """Forget the queued tasks of an epoch the main process abandoned (it started another:
    their results would be dropped); the slots they gave back are free all the same."""
    for task in pending:
        if task[4]:
            arena.release(task[4])
    pending.clear()


def _stop_iteration_error(args: WorkerArgs, task: Any) -> RemoteError:
    err = RuntimeError("a map-style dataset raised StopIteration while fetching a batch.")
    return RemoteError(err, _where(args, task))


def thread_worker(args: WorkerArgs, inbox: Any, outbox: Any) -> None:
    """A worker thread: the same loop as a process, passing batch objects (in-process).

    Whatever the dataset throws that is not an ``Exception`` (``sys.exit()``,
    ``KeyboardInterrupt``...) ends the thread as it would end a process: its last message,
    :data:`BYE` with what ended it, tells the main process that the worker is dead.

    Args:
        args: the worker's settings.
        inbox: a ``queue.SimpleQueue`` of tasks (``None`` stops the thread).
        outbox: the queue shared by all threads, of ``(worker_id, message)``.
    """
    wid = args.worker_id
    try:
        _serve_thread(args, inbox, outbox)
    except _Ended as exc:
        outbox.put((wid, (*BYE, None, (exc.remote.summary(), None))))
    except BaseException as exc:  # stoker's own code failed: still a dead worker, saying why
        why = RemoteError(exc, f"worker thread {wid}", keep_object=True).summary()
        outbox.put((wid, (*BYE, None, (why, None))))
    finally:
        set_worker_info(None, whole_process=False)


def _serve_thread(args: WorkerArgs, inbox: Any, outbox: Any) -> None:
    wid = args.worker_id
    fetcher = args.fetcher
    iterable = isinstance(fetcher, IterableFetcher)
    generation = None
    try:
        _setup(args, whole_process=False)
    except Exception as exc:
        where = f"worker thread {wid} start-up"
        outbox.put((wid, ("err", -1, -1, RemoteError(exc, where, keep_object=True))))
        return
    outbox.put((wid, READY))
    if not _init(args, lambda msg: outbox.put((wid, msg))):
        return
    board = args.board
    assert args.rng_guard is not None and board is not None
    alloc = args.buffers.alloc if args.buffers is not None else None
    whole = functools.partial(fetcher.fetch_skipping, alloc=alloc)
    split = whole
    if isinstance(fetcher, MapFetcher):
        split = functools.partial(fetcher.fetch_skipping, alloc=alloc, map_fn=board.map)
    fetched = 0  # batches of an iterable dataset this epoch
    while True:
        msg = board.next_message(wid, inbox)
        if msg is None:
            return
        if msg[0] == "help":  # samples of another thread's slow batch
            msg[1].work()
            continue
        gen, index, task, seed, _freed = msg
        if gen != generation:
            generation = gen
            _reset_fetcher(fetcher)
            if iterable:
                _enter_epoch(args, seed, whole_process=False)
                fetched = 0
        if iterable:  # threads share the RNGs: each batch is seeded on its own
            seed, fetched = mix_seed(seed, fetched), fetched + 1
        if iterable and fetcher.ended:  # type: ignore[union-attr]
            outbox.put((wid, ("end", gen, index)))
            continue
        started = time.perf_counter()
        try:
            if fetcher.draws:
                data, skipped = args.rng_guard.fetch(split, task, seed, whole)
            else:
                data, skipped = split(task)
            if args.pin_device is not None and data is not None:
                data = pin(data, args.pin_device)
        except StopIteration:
            reply: tuple[Any, ...] = ("end", gen, index)
            if not iterable:
                err = _stop_iteration_error(args, task)
                err.exc = RuntimeError(err.text)
                reply = ("err", gen, index, err)
            outbox.put((wid, reply))
            continue
        except Exception as exc:
            # No local name for it: the main thread's frames join the exception's traceback
            # when it is raised there, and this frame must not keep them (and the iterator).
            outbox.put((wid, ("err", gen, index, RemoteError(exc, _where(args, task), True))))
            continue
        except BaseException as exc:  # sys.exit(), KeyboardInterrupt...: the worker ends
            raise _Ended(exc, _where(args, task)) from None
        busy = time.perf_counter() - started
        outbox.put((wid, ("ok", gen, index, None, data, None, busy, skipped, None)))
