"""The worker loop: seeding, worker info, fetching tasks and sending results back.

One loop (:class:`Server`, run by :func:`serve`) serves every kind of worker through a
:class:`Sink`, which says how tasks come in and results go out; the sinks and the entry
points of processes and threads are in :mod:`stoker._engine._sinks`.

The messages are in :mod:`stoker._engine._messages`. A worker ends early, as in torch,
when the dataset or ``worker_init_fn`` raises a ``BaseException`` that is not an
``Exception`` (``SystemExit``, ``KeyboardInterrupt``...): a process exits with its code, a
thread ends; its :class:`~stoker._engine._messages.Bye` says why, and the main process
reports a dead worker.
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import numpy as np
import numpy.random  # loaded once here, not again in each new worker

from stoker import _torch
from stoker._engine._buffers import BufferPool
from stoker._engine._errors import RemoteError
from stoker._engine._messages import (
    BatchSeed,
    Exhausted,
    Failed,
    GroupSeeds,
    Inited,
    Ready,
    Snapshot,
    StartFailed,
    StreamSeed,
    Task,
)
from stoker._engine._probe import SampleTimer
from stoker._engine._rngguard import RngGuard
from stoker._engine._split import HelpBoard
from stoker._fetch import IterableFetcher, MapFetcher
from stoker._policy import INDICES_SHOWN
from stoker._random import batch_seeds, mix_seed, seed_globals
from stoker._worker_info import WorkerInfo, get_worker_info, set_worker_info


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


def enter_epoch(args: WorkerArgs, seed: int, whole_process: bool) -> bool:
    """Make ``seed`` the worker's seed (``get_worker_info().seed``, torch's too) for an
    iterable dataset's new epoch; True if it changed (the caller seeds the RNGs from it)."""
    info = get_worker_info()
    if info is None or info.seed == seed:
        return False  # started for this epoch, seeded already (and worker_init_fn ran)
    info = WorkerInfo(info.id, info.num_workers, seed, info.dataset)
    set_worker_info(info, whole_process=whole_process)
    if whole_process:
        set_torch_worker_info(info)
    return True


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
        window: slots in flight (for error messages).
        import_torch: import torch first.
        pin_device: pin batches in the worker (threads only).
        rng_guard: the guard a pool's thread workers share (threads only).
        board: where idle threads take samples of slow batches (threads only).
        buffers: reusable memory for large leaves (threads only).
        warm: segments inherited through fork, adopted as free slots.
        hand_off: on stop, leave unused slots to the main process (fork).
        probe: time an epoch's first samples (:mod:`stoker._engine._probe`).
        local: the in-process pool's worker.
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

    local: bool = False

    @property
    def in_thread(self) -> bool:
        """Whether the worker runs in the main process's address space: a thread (only
        thread workers share a board), or the in-process pool's (``local``)."""
        return self.board is not None or self.local


def where(args: WorkerArgs, task: Any) -> str:
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


def set_torch_worker_info(info: WorkerInfo) -> None:
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
        set_torch_worker_info(info)
        seed_globals(args.seed, every_device=True)


class Ended(Exception):
    """A worker ends early: the dataset or ``worker_init_fn`` raised ``exc``, a
    ``BaseException`` that is not an ``Exception`` (``sys.exit()``, ``KeyboardInterrupt``...),
    or stoker's own worker code failed; ``remote`` says so to the main process."""

    def __init__(self, exc: BaseException, where: str) -> None:
        super().__init__(where)
        self.exc = exc
        self.remote = RemoteError(exc, where, keep_object=True)  # for its summary()
        code = exc.code if isinstance(exc, SystemExit) else 1
        self.code = code if isinstance(code, int) else int(code is not None)  # as Python exits


def start(args: WorkerArgs, sink: Sink, whole_process: bool) -> bool:
    """Set the worker up, send :class:`Ready`, run ``worker_init_fn`` (then send
    :class:`Inited`); False when either raised an Exception (sent as :class:`StartFailed`),
    :class:`Ended` for any other BaseException from ``worker_init_fn``."""
    try:
        _setup(args, whole_process)
    except Exception as exc:
        who = f"worker thread {args.worker_id}" if args.in_thread else f"worker {args.worker_id}"
        sink.send(
            StartFailed(error=RemoteError(exc, f"{who} start-up", keep_object=args.in_thread))
        )
        return False
    sink.send(Ready())
    init = args.worker_init_fn
    if init is None:
        return True
    try:
        init(args.worker_id)
    except ParentDied:
        raise
    except Exception as exc:
        at = f"{where(args, None)} start-up"
        sink.send(StartFailed(error=RemoteError(exc, at, keep_object=args.in_thread)))
        return False
    except BaseException as exc:
        name = getattr(init, "__qualname__", type(init).__qualname__)
        raise Ended(exc, f"{where(args, None)}'s worker_init_fn {name}") from None
    sink.send(Inited())
    return True


class ParentDied(BaseException):
    """Raised in a worker by the parent-death signal; unwinds to the cleanup."""


class Sink:
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
        self.send(Snapshot(generation=task.generation, idx=task.idx, state=state))

    def ship_group(self, task: Task, batches: list[Any], skips: list[Any], started: float) -> None:
        """Send a group's batches (a :class:`RemoteError` for each that raised)."""
        raise NotImplementedError

    def abort(self) -> None:
        """A fetch failed: drop what :meth:`begin` took."""

    def fail_all(self, task: Task, exc: Exception) -> None:
        """Send one :class:`Failed` for each batch of ``task`` (a group's), raised ``exc``."""
        err = RemoteError(exc, where(self.args, None), keep_object=self.args.in_thread)
        for j in range(len(task.task)):
            self.send(Failed(generation=task.generation, idx=task.idx + j, error=err))


class Server:
    """The worker loop's state between tasks: which epoch the last task was of. A
    process or thread runs :func:`serve`; the in-process pool hands it one task at a time."""

    def __init__(self, args: WorkerArgs, sink: Sink) -> None:
        self.args, self.sink = args, sink
        self.iterable = isinstance(args.fetcher, IterableFetcher)
        self.generation: int | None = None

    def handle(self, task: Task) -> None:
        """Fetch and ship ``task``'s batch (or group of batches), or send its failure.

        Raises:
            Ended: the dataset raised a ``BaseException`` that is not an ``Exception``.
        """
        args, sink, fetcher, iterable = self.args, self.sink, self.args.fetcher, self.iterable
        first = task.generation != self.generation  # an epoch's first batch is never held back
        if first:
            self.generation = task.generation
            if isinstance(fetcher, IterableFetcher):
                fetcher.restart()
                seed = cast(StreamSeed, task.seed)  # an iterable dataset's tasks'
                sink.epoch(seed.seed)
                if seed.stream is not None and seed.stream.resumes:  # a resumed stream
                    fetcher.resume = seed.stream.state
        if isinstance(fetcher, IterableFetcher) and fetcher.ended:
            sink.send(Exhausted(generation=task.generation, idx=task.idx))
            return
        kind = KINDS[type(task.seed)]
        try:
            kind.load(sink, task, first)
        except Exception as exc:  # the dataset's, collate's, or a batch that cannot cross
            sink.abort()
            if iterable and isinstance(exc, StopIteration):
                sink.send(Exhausted(generation=task.generation, idx=task.idx))
            else:  # no local name for it: the frame must not keep it (see _failure)
                shown = None if iterable else task.task
                sink.send(
                    Failed(
                        generation=task.generation, idx=task.idx, error=_failure(args, exc, shown)
                    )
                )
        except ParentDied:
            raise
        except BaseException as exc:  # sys.exit(), KeyboardInterrupt...: the worker ends
            sink.abort()
            raise Ended(exc, where(args, task.task if kind.shows_indices else None)) from None


def serve(args: WorkerArgs, sink: Sink) -> None:
    """The worker loop, for processes and threads alike: each task handled by a
    :class:`Server` until the sink says stop."""
    server = Server(args, sink)
    while (task := sink.next_task()) is not None:
        server.handle(task)


def _load(sink: Sink, task: Task, first: bool) -> None:
    """Fetch and ship one task's batch (its own frame: nothing of it outlives the call);
    an epoch's first, timed for the autotuner if it asks; a stateful iterable dataset's
    state before it, unless the task says none is needed (see ``StreamSeed.stream``)."""
    seed = sink.seed_for(task)
    iterable = isinstance(sink.fetcher, IterableFetcher)
    started = time.perf_counter()
    sink.begin()
    timer = None
    if first and sink.args.probe:
        size = len(task.task) if hasattr(task.task, "__len__") else 1
        timer = SampleTimer(sink.send, task.generation, size)
    data, skipped = sink.fetch(task.task, seed, timer)
    if timer is not None:
        timer.finish()
    stateful = iterable and sink.fetcher.stateful  # type: ignore[union-attr]
    if stateful and _wants_state(cast(StreamSeed, task.seed)):
        sink.snapshot(task)
    sink.ship(task, data, skipped, started, first)


def _wants_state(seed: StreamSeed) -> bool:
    """Whether an iterable dataset's task asks for the worker's state after its batch."""
    return seed.stream is None or seed.stream.snapshot


def _load_group(sink: Sink, task: Task, first: bool) -> None:
    """Fetch and ship a group of tiny batches (task indices ``task.idx``, ``+ 1``, ...):
    each seeded from (seed, epoch, its own batch number), as a batch sent alone, and a
    :class:`RemoteError` in place of each that raised. The finished batches wait for the
    group's last one: only batches measured to load in less than
    :data:`~stoker._policy.FAST_BATCH_S` are grouped
    (see :func:`~stoker._policy.group_size`)."""
    args, group = sink.args, task.seed
    assert type(group) is GroupSeeds  # KINDS sends only groups here
    started = time.perf_counter()
    try:
        sink.begin()
    except Exception as exc:  # /dev/shm full: every batch of the group says so
        sink.fail_all(task, exc)
        return
    n = len(task.task)
    seeds = batch_seeds(group.base, group.epoch, group.ks) if args.fetcher.draws else [None] * n
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
    return RemoteError(exc, where(args, indices), keep_object=args.in_thread)


class Kind(NamedTuple):
    """How the worker loads a kind of task: ``load(sink, task, first)``, and whether its
    errors name the task's sample indices (a batch's; not a group's or a stream's)."""

    load: Callable[[Sink, Task, bool], None]
    shows_indices: bool


KINDS: dict[type, Kind] = {
    BatchSeed: Kind(load=_load, shows_indices=True),
    GroupSeeds: Kind(load=_load_group, shows_indices=False),
    StreamSeed: Kind(load=_load, shows_indices=False),
}
"""Each kind of task seed (:data:`~stoker._engine._messages.TaskSeed`) and how it loads: a
new kind is its record and one entry here."""
