"""An iterator's tasks, out and back: which worker takes each, seeded, grouped or split.

:class:`Dispatcher` draws tasks from the epoch's sampler while the reorder window has room
and makes each worker's message: a batch alone, seeded from (seed, epoch, k); a group of
tiny batches as one task (process workers, after the epoch's first batch); an iterable
dataset's task with its worker's seed for the epoch; or, near the epoch's end, a slow
batch cut into parts for workers that would idle (:mod:`stoker._engine._tail`). It books
the answers into the window, and keeps what they show (load time, size) for the group's
size and the split plan.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from stoker._engine._errors import RemoteError
from stoker._engine._messages import (
    BatchSeed,
    Exhausted,
    Failed,
    GroupSeeds,
    Loaded,
    LoadedGroup,
    Snapshot,
    StreamSeed,
    Task,
    TaskSeed,
)
from stoker._engine._tail import Splits, mergeable, plan
from stoker._engine._window import Entry, Failure
from stoker._placement import Where
from stoker._policy import (
    GROUP_AFTER,
    JOIN_BUFFERS,
    assigns_freely,
    balances_load,
    group_size,
    is_default_collate,
    typical_load_s,
    worth_splitting,
)
from stoker._random import mix_seed

if TYPE_CHECKING:
    from stoker._engine._config import EngineConfig, EngineMemory
    from stoker._engine._window import ReorderWindow
    from stoker._state import Epoch

Sends = dict[int, list[Task]]
"""Each worker's tasks of one refill (one message per worker)."""
Answer = Loaded | LoadedGroup | Exhausted | Failed | Snapshot
"""A worker's answer to a task, as the pool decodes it (a stateful stream's state first)."""


class Dispatcher:
    """The sending side of an iterator's epochs (module docstring), and what the batches
    it sent showed: their load time and size, which size the group and plan a split.

    Args:
        config: the loader's engine configuration.
        memory: the loader's engine memory (join buffers; what earlier epochs showed).
        length: the epoch's batch count (raises ``TypeError`` when unknown).
        joinable: batches as collated may be joined (not shaped for a dataset's
            ``main_process_step``); the tail is split only then (see :func:`_splittable`).
    """

    def __init__(
        self,
        config: EngineConfig,
        memory: EngineMemory,
        length: Callable[[], int],
        joinable: bool,
    ) -> None:
        # torch's assignment where the user's code could see it, else stoker's own.
        self.free = free = assigns_freely(
            config.dataset, config.collate_fn, config.iterable, config.init_fn
        )
        self._memory, self._length = memory, length
        self._iterable = config.iterable
        tuned = config.tuner is not None and config.tuner.tune_workers
        self._balance = balances_load(free, tuned, config.iterable)
        self._may_switch = config.probe  # the tuner may restart the epoch at the probe
        self._can_split = free and joinable and _splittable(config)
        # Process workers get a group's batches as one task, answered in one slot (Ray
        # workers in one actor call).
        grouping = config.worker_mode in (Where.PROCESSES, Where.RAY)
        self._group_tasks = grouping and not config.iterable
        # Batches per prefetch slot; 0 until GROUP_AFTER are measured (in an earlier epoch).
        self.group = memory.task_group if free else 1
        self._busy_sum, self._busy_n = 0.0, 0  # load seconds of whole batches
        self._first_loads: list[float] = []  # of the first ones, to size the group

    def new_epoch(
        self,
        window: ReorderWindow,
        epoch: Epoch,
        generation: int,
        worker_seeds: list[int],
        replay: list[tuple[int, Any]] | None = None,
    ) -> None:
        """Send epoch ``epoch``'s tasks into ``window`` from now on, marked with
        ``generation``, those of ``replay`` first; an iterable dataset's worker ``w`` seeds
        itself once with ``worker_seeds[w]``."""
        self._window, self._splits = window, Splits()
        self._tasks = itertools.chain(replay, epoch.tasks) if replay else epoch.tasks
        # The tasks drawn, until one is delivered: until then the tuner may restart the
        # epoch in the other mode, or in the main process.
        self.drawn: list[tuple[int, Any]] | None = [] if self._may_switch else None
        self._seed, self._epoch, self._generation = epoch.seed, epoch.number, generation
        self._worker_seeds = worker_seeds
        self._epoch_state = epoch
        if epoch.stream is not None and epoch.stream.handover:  # a stateful stream resumes
            window.start_at(epoch.stream.next_worker)  # where the round robin had come
        self.done = False  # the sampler has no more tasks this epoch
        self.first_task: Any = None  # the epoch's first task

    def refill(self, prefetch: int, grouping: bool, candidates: Sequence[int] | None) -> Sends:
        """Fill every worker's window: ``prefetch`` slots of :attr:`group` batches once
        ``grouping`` (of single batches before: the epoch's first comes sooner);
        ``candidates``: the workers that may take tasks now (default all)."""
        sends: Sends = {}
        window, group = self._window, self.group
        depth = prefetch * max(1, group) if grouping else prefetch
        size = depth * window.workers
        if group > 1 and size - window.in_flight < group and window.in_flight:
            return sends  # tiny batches: send a group's worth of tasks at a time
        while not self.done and window.in_flight < size:
            wid = window.choose(depth, self._balance, candidates)
            if wid is None:
                break
            got = self._next()
            if got is None:
                break
            k, task = got
            if self._iterable:  # the worker's seed for the epoch: it seeds itself once
                log = self._epoch_state.stream  # a stateful stream's: resume, when to send
                stream = log.task(wid, k) if log is not None else None
                seed = StreamSeed(seed=self._worker_seeds[wid], stream=stream)
                self._queue(sends, wid, [k], task, seed)
            elif group > 1 and grouping and self._group_tasks:
                self._queue_group(
                    sends, wid, k, task, min(group, depth - window.outstanding[wid]), size
                )
            else:
                self._queue_batch(sends, wid, k, task)
        return sends

    def _next(self) -> tuple[int, Any] | None:
        try:
            k, task = next(self._tasks)
        except StopIteration:
            self.done = True
            return None
        if self.first_task is None:
            self.first_task = task
        if self.drawn is not None:
            self.drawn.append((k, task))
        return k, task

    def _queue(self, sends: Sends, wid: int, ks: list[int], task: Any, seed: TaskSeed) -> int:
        """Add ``task`` (batch ``ks[0]``, or a group's batches ``ks``) to worker ``wid``'s
        message; returns its first task index."""
        idx = self._window.add(wid, ks)
        sends.setdefault(wid, []).append(
            Task(generation=self._generation, idx=idx, task=task, seed=seed)
        )
        return idx

    def _queue_batch(self, sends: Sends, wid: int, k: int, task: Any) -> None:
        seed = BatchSeed(seed=mix_seed(self._seed, self._epoch, k))
        parts = self._plan_split(k, task)
        if parts is None:
            self._queue(sends, wid, [k], task, seed)
            return
        self._memory.buffers(JOIN_BUFFERS).warm()  # the join's memory, meanwhile
        first, start = self._window.sent, 0
        for w, count in parts:
            self._queue(sends, w, [k], task[start : start + count], seed)
            start += count
        self._splits.add(k, first, [count / len(task) for _, count in parts])

    def _queue_group(self, sends: Sends, wid: int, k: int, task: Any, n: int, size: int) -> None:
        """Queue batch ``k`` and the next ones, at most ``n`` and what the window of
        ``size`` allows, as one task for worker ``wid`` (numbered one by one)."""
        n = min(n, size - self._window.in_flight)
        ks, tasks = [k], [task]
        while len(ks) < n and (got := self._next()) is not None:
            ks.append(got[0])
            tasks.append(got[1])
        self._queue(sends, wid, ks, tasks, GroupSeeds(base=self._seed, epoch=self._epoch, ks=ks))

    def _plan_split(self, k: int, task: Any) -> list[tuple[int, int]] | None:
        """How to split batch ``k`` among workers that would otherwise idle, or None."""
        memory, workers = self._memory, self._window.workers
        if not (self._can_split and memory.mergeable and memory.rng_untouched):
            return None
        try:
            remaining = self._length() - k
        except TypeError:  # a batch sampler without a length: the tail is unknown
            return None
        mean, nbytes = self.profile()
        if remaining >= workers or len(task) < 2 or not worth_splitting(mean, nbytes):
            return None
        window = self._window
        loads = self._splits.loads(window.running, window.since, time.perf_counter(), mean)
        return plan(len(task), loads, remaining)

    # -- answers, and what the batches showed ------------------------------------------

    def answered(self, wid: int, msg: Answer) -> None:
        """Book worker ``wid``'s answer to this epoch's task(s): each result at its task
        index in the window, a split batch's parts joined once all are in."""
        window, idx = self._window, msg.idx
        if isinstance(msg, LoadedGroup):  # each batch of a group at its own task index
            self._loaded(msg.busy, len(msg.batches))
            for j, batch in enumerate(msg.batches, idx):
                k = window.answered(wid, j)
                if type(batch) is RemoteError:
                    window.put(j, Entry(k=k, item=Failure(batch)))
                else:
                    skipped = msg.skipped[j - idx] if msg.skipped else None
                    window.put(j, Entry(k=k, item=batch, skipped=skipped))
            return
        if isinstance(msg, Snapshot):  # a stateful stream's worker state, before its batch
            return self.snapshot(msg)
        k = window.answered(wid, idx)
        if isinstance(msg, Exhausted):
            window.exhausted(wid, idx)
            return
        part = self._splits.is_part(idx)
        if isinstance(msg, Loaded):
            entry = Entry(k=k, item=msg.batch, skipped=msg.skipped)
            self._note(msg, part)
            if self._iterable and self._epoch_state.stream is not None:
                self._epoch_state.stream.answered(k, wid)
        else:
            entry = Entry(k=k, item=Failure(msg.error))
            self.drawn = None  # the epoch stays here: a restart elsewhere would drop the error
        if not part:
            window.put(idx, entry)
            return
        alloc = self._memory.buffers(JOIN_BUFFERS).alloc
        first, batch = self._splits.done(k, idx, entry.item, alloc)
        if batch is not None:
            window.put(first, Entry(k=k, item=batch))
        if idx != first:  # the batch is delivered at its first part's place in the order
            window.skip(idx)

    def snapshot(self, msg: Snapshot) -> None:
        """A stateful iterable dataset's worker state after task ``msg.idx``'s batch (its
        batch follows); the epoch's stream log starts with the first."""
        epoch = self._epoch_state
        if epoch.stream is None:
            if epoch.make_stream is None:  # num_workers="auto": the stream is replayed
                return
            epoch.stream = epoch.make_stream(None)
        epoch.stream.arrived(self._window.batch_of(msg.idx), msg.state)

    def _note(self, msg: Loaded, part: bool) -> None:
        """What a loaded batch (or ``part``) shows: load time, whether batches join, and
        whether slow ones draw from the global RNGs."""
        memory = self._memory
        self._loaded(msg.busy, 0 if part else 1)
        if memory.mergeable is None and not part:
            memory.mergeable = mergeable(msg.batch)
        if msg.untouched is not None:  # a slow batch: did it draw from the global RNGs?
            memory.rng_untouched = msg.untouched and memory.rng_untouched is not False

    def _loaded(self, busy: float, batches: int) -> None:
        """A worker spent ``busy`` seconds on ``batches`` whole batches (0: a part)."""
        if batches:
            self._busy_sum += busy
            self._busy_n += batches
            if batches == 1 and len(self._first_loads) < GROUP_AFTER:
                self._first_loads.append(busy)

    def delivered(self, batches: int, nbytes: int) -> bool:
        """After a delivery (``batches`` so far this epoch, of ``nbytes`` in all): whether
        the group was sized just now, once :data:`GROUP_AFTER` batches are measured."""
        if self.group or batches < GROUP_AFTER:
            return False
        seconds = typical_load_s(self._first_loads)
        self.group = 1 if self._iterable else group_size(nbytes / batches, seconds)
        self._memory.task_group = self.group
        return True

    def profile(self, nbytes: int = 0, batches: int = 0) -> tuple[float, float]:
        """Mean load seconds and bytes of this epoch's whole batches, or (before the first
        is in) of the last epoch's."""
        if not self._busy_n:
            return self._memory.batch_profile
        return self._busy_sum / self._busy_n, nbytes / max(1, batches)


def _splittable(config: EngineConfig) -> bool:
    """Whether the loader's batches may be split at an epoch's tail and joined: process
    workers, map-style, batched by the default collate, no skipped samples."""
    return (
        config.worker_mode is Where.PROCESSES
        and not config.iterable
        and config.auto_collation
        and is_default_collate(config.collate_fn)
        and not config.skip_errors
    )
