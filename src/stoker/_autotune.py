"""``num_workers``, ``prefetch_factor`` and ``worker_mode`` ``"auto"``: pick them by measuring.

One :class:`Autotuner` per loader, kept across epochs. From a worker's first samples (a
:class:`~stoker._engine._messages.Probe`): a fetch of ``w`` seconds, ``c`` of them CPU,
keeps ``c / w`` of a CPU busy, so slow batches go straight to ``(CPUs + CPU_SLACK) / (c /
w)`` workers, within capacity, the epoch's batches and memory; a first batch that loads in
the main process quicker than a worker hands it over moves loading there. Then, per window
of batches, workers are added as the consumer's wait predicts until that gains under
``MIN_GAIN``. ``worker_mode="auto"`` keeps threads where a fetch mostly waits or threads
side by side use more CPU than one, else processes (switching at the epoch's start if no
batch is out). Idle epochs may bring an in-process trial. Batch ``k`` is seeded from
(seed, epoch, k), so output never depends on this. Decisions: ``statistics().autotune``;
reasons: ``docs/engine.md``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from stoker import _osprobe
from stoker._cache import shm_room_bytes
from stoker._osprobe import available_cpus, idle_cpus, idle_ticks, tree_cpu_seconds
from stoker._placement import IN_PROCESS, Placement, Where, first_placement, threads_suffice
from stoker._policy import (
    BUSY_SHARE,
    CPU_SLACK,
    IN_PROCESS_NOW_S,
    INPUT_BOUND,
    JUMP_BATCH_S,
    MAX_CAPACITY,
    MAX_GROWTH,
    MAX_PREFETCH,
    MEASURE_BELOW_S,
    MEMORY_BUDGET_BYTES,
    MEMORY_BUDGET_SHARE,
    MIN_EPOCH_BATCHES,
    MIN_GAIN,
    MIN_WINDOW_BATCHES,
    MIN_WINDOW_S,
    RETRY_AFTER,
    WORKERS_PER_CPU,
    prefetch_of,
)

if TYPE_CHECKING:
    from stoker._engine._messages import Probe
    from stoker._stats import StatsRecorder

_logger = logging.getLogger(__name__)


class Step(NamedTuple):
    """What the tuner decided after a worker's probe or a window of batches: start
    ``add`` more of the pool's workers now, or ``deepen`` the prefetch window by one task
    per worker; neither: change nothing here (:data:`KEEP`). A move of the loading
    elsewhere is not a step but a placement (:attr:`Autotuner.pending`)."""

    add: int = 0
    deepen: bool = False


KEEP = Step()
"""Change nothing."""
ADD_PREFETCH = Step(deepen=True)
"""Allow one more task in flight per worker."""


class EpochFigures(NamedTuple):
    """What an epoch showed the tuner: its ``batches`` and, per batch, in seconds: the time
    to deliver one (``per_batch``, workers' start included), the workers' mean busy time
    (``load``) and the loop's own time, outside ``__next__`` (``loop``). The measuring
    (:meth:`of`) and the judging (:meth:`Autotuner.judge_epoch`) are apart, so each
    decision can be checked on given figures, whatever the machine's speed."""

    batches: int
    per_batch: float
    load: float
    loop: float

    @classmethod
    def of(cls, rec: StatsRecorder, seconds: float) -> EpochFigures:
        """The figures of an epoch of ``seconds`` whose counters are ``rec``."""
        n = max(1, rec.batches)
        loop = max(0.0, rec.last - rec.start - rec.wait)
        return cls(rec.batches, seconds / n, sum(rec.busy) / n, loop / n)


class Autotuner:
    """Chooses a loader's worker count and prefetch window while it runs (module docstring).

    Args:
        workers: the count to start with (1 for ``num_workers="auto"``).
        capacity: the most workers it may reach (the pool is built this large).
        prefetch: the prefetch factor to start with.
        tune_workers: whether ``num_workers`` is ``"auto"``.
        tune_prefetch: whether ``prefetch_factor`` is ``"auto"``.
        shared_memory: whether batches cross through /dev/shm (process workers).
        in_process: whether loading in process (0 workers) may be tried.
        mode: the worker mode to start with.
        tune_mode: whether ``worker_mode`` is ``"auto"``.
        batched: whether the dataset loads a batch at once (see :meth:`for_settings`).
    """

    def __init__(
        self,
        workers: int,
        capacity: int,
        prefetch: int,
        tune_workers: bool,
        tune_prefetch: bool,
        shared_memory: bool,
        in_process: bool = False,
        mode: Where = Where.PROCESSES,
        tune_mode: bool = False,
        batched: bool = False,
    ) -> None:
        self.workers = workers
        self.mode = Where(mode)
        self.tune_mode = tune_mode
        self._probed = False  # a probe decided (the count, the mode)
        self._predicted = workers  # the count the probe's model gave
        self._switch: Where | None = None  # the kind of workers the next epoch switches to
        self._now_in_process = False  # the probe moved loading in process, not taken yet
        self.capacity = capacity
        self.prefetch = prefetch
        self.tune_workers = tune_workers
        self.tune_prefetch = tune_prefetch
        self.shared_memory = shared_memory
        self.decisions: list[str] = []
        self.settled = False
        self._due = 0
        self._rate: float | None = None  # batches/s of the window before the last change
        self._changed = False
        self._mark: tuple[int, float, float, float] = (0, 0.0, 0.0, 0.0)
        self._idle_mark = idle_ticks()
        self._batch_bytes = 0
        self._budget = memory_budget()
        self._in_process = in_process  # still a candidate
        self._batched, self._looked = batched, False
        self._trial: tuple[int, float] | None = None  # (workers, seconds per batch) before
        self._wait = 0  # epochs with workers before another trial, after a lost one
        self._retry_after = RETRY_AFTER

    @classmethod
    def for_settings(
        cls,
        num_workers: int | str,
        prefetch_factor: int | str | None,
        worker_mode: str,
        iterable: bool,
        in_process: bool,
        batched: bool = False,
    ) -> Autotuner:
        """The tuner of a loader with these settings, whose ``num_workers`` and/or
        ``prefetch_factor`` is "auto", or whose fixed count may load in process
        (``in_process``, see :func:`~stoker._placement.may_load_in_process`). ``batched``:
        the dataset loads a batch at once (``__getitems__``), so the first probe comes
        with a whole batch, not after a few samples."""
        cpus = available_cpus()
        tune_workers = num_workers == "auto"
        tune_prefetch = prefetch_factor == "auto"
        first = first_placement(worker_mode, iterable, batched)
        if tune_workers:
            capacity = min(MAX_CAPACITY, max(2, WORKERS_PER_CPU * cpus))
            # One per CPU where no sample is timed before a whole batch: what the model
            # predicts for batches that compute; those that wait get more at the probe.
            workers = min(cpus, capacity) if batched else 1
            if iterable:
                # An iterable dataset shards itself by worker count: its output would
                # depend on the count, so the count is fixed from the start.
                capacity = workers = cpus
                tune_workers = False
        else:
            capacity = workers = int(num_workers)
        tuner = cls(
            workers,
            capacity,
            prefetch_of(prefetch_factor),
            tune_workers,
            tune_prefetch,
            shared_memory=first.where is Where.PROCESSES,
            in_process=in_process,
            mode=first.where,
            tune_mode=first.tuned,
            batched=batched,
        )
        if num_workers == "auto" and not tune_workers:
            tuner.decide(f"iterable dataset: {workers} workers (one per CPU), not tuned")
        if first.why is not None:
            tuner.decide(first.why)
        # A fixed count and prefetch: only the end-of-epoch comparison with in process.
        tuner.settled = num_workers != "auto" and not tune_prefetch
        return tuner

    @property
    def trying_in_process(self) -> bool:
        """Whether the next epoch is the in-process trial (persistent workers wait it out)."""
        return self.workers == 0 and self._in_process

    @property
    def wants_probe(self) -> bool:
        """Whether the next iterator's workers should time their first samples."""
        return (self.tune_workers or self.tune_mode) and not self._probed

    def probe(
        self,
        p: Probe,
        batches_left: int | None,
        load_in_process: Callable[[], float | None] | None = None,
    ) -> Step:
        """A worker's first samples are timed: go to the count the model predicts (module
        docstring), or in process, and, with ``worker_mode="auto"``, choose the mode.
        Returns the workers to add now; a move to the main process or to the other kind
        of workers becomes :attr:`pending`. Only the first probe decides.

        Args:
            p: the worker's report.
            batches_left: batches of the epoch not delivered yet, or None if unknown.
            load_in_process: times the epoch's first batch in the main process (None
                where it draws); a fast one moves loading there.
        """
        if self._probed:
            return KEEP
        self._probed = True
        share = min(1.0, p.cpu / max(p.wall, 1e-9))  # of a CPU, a fetch on its thread
        if p.nbytes:
            self._batch_bytes = max(self._batch_bytes, p.nbytes * max(1, p.batch_len))
        if self._in_process_now(p.wall * p.batch_len, load_in_process):
            return KEEP
        want, why = self._predict(share, batches_left)
        if self.tune_mode:
            self._choose_mode(p, share)
        self._predicted = want
        more = max(0, want - self.workers)
        if self.tune_workers and not more and "/dev/shm" in why:
            self.decide(f"keep {self.workers} workers from the first samples: {why}")
        if not (self.tune_workers and more) or p.wall * p.batch_len < JUMP_BATCH_S:
            return KEEP
        self.decide(
            f"{self.workers + more} workers (+{more}) from the first samples: one takes "
            f"{p.wall * 1e3:.3g} ms, {share:.0%} of it CPU; {why}"
        )
        self.workers += more
        return Step(add=more)

    def _in_process_now(
        self, first_s: float, load_in_process: Callable[[], float | None] | None
    ) -> bool:
        """Whether a first batch of ``first_s`` seconds loads so fast in the main process
        that the rest of the epoch and the next ones load there at once."""
        if not (self._in_process and self.tune_workers and first_s < MEASURE_BELOW_S):
            return False
        load = load_in_process() if load_in_process is not None else None
        if load is None or load >= IN_PROCESS_NOW_S:
            return False
        self.workers, self._in_process, self.settled, self.tune_mode = 0, False, True, False
        self._now_in_process = True
        self.decide(
            f"load in process from now on: a batch loads in {load * 1e6:.0f} us there, less "
            "than a worker takes to hand it over"
        )
        return True

    @property
    def first_look(self) -> bool:
        """Whether the loader should time the first batch in the main process before any
        worker starts: where that batch loads at once (a ``__getitems__``), so no worker
        could report on its first samples sooner, and loading in process is allowed."""
        return self._batched and self.tune_workers and self._in_process and not self._looked

    def looked(self, first_load_s: Callable[[float], float | None]) -> bool:
        """Time the first batch in process (see :attr:`first_look`); whether it loads so
        fast that the loader stays in process from the start."""
        self._looked = True
        return self._in_process_now(0.0, lambda: first_load_s(MEASURE_BELOW_S))

    @property
    def placement(self) -> Placement:
        """Where the loading is now: in process (while it loads there, or tries it), or
        this many workers of this kind."""
        return IN_PROCESS if self.workers == 0 else Placement(self.mode, self.workers)

    @property
    def pending(self) -> Placement | None:
        """Where the probe chose to move the loading, until :meth:`take_placement` takes
        it: the main process, or workers of the other kind; None for no move."""
        if self._now_in_process:
            return IN_PROCESS
        if self._switch is None:
            return None
        return Placement(self._switch, self._switched_workers())

    def take_placement(self) -> Placement:
        """The placement of the iterator the loader (or an epoch restarted before its first
        delivery) makes next: a move the probe chose takes effect here, and after a switch
        of kind tuning starts again from the model's count (a count settled with threads
        that contend for the GIL is no measure of processes)."""
        self._now_in_process = False
        if self._switch is not None:
            self.workers = self._switched_workers()
            self.mode, self._switch = self._switch, None
            self.shared_memory = self.mode is Where.PROCESSES
            self.settled = self.settled and not self.tune_workers
        return self.placement

    def _switched_workers(self) -> int:
        return max(1, self._predicted) if self.tune_workers else self.workers

    def _predict(self, share: float, batches_left: int | None) -> tuple[int, str]:
        """The count the model predicts for a fetch using ``share`` of a CPU, and why."""
        cpus = available_cpus()
        limits = {
            f"{cpus} CPUs": int((cpus + CPU_SLACK) / max(share, 1 / MAX_CAPACITY)),
            f"a capacity of {self.capacity}": self.capacity,
        }
        if batches_left is not None:
            limits[f"{batches_left} batches left"] = batches_left
        if self._batch_bytes:
            per_worker = (self.prefetch + 1) * self._batch_bytes
            limits[f"{self._budget >> 20} MiB for batches"] = self._budget // per_worker
            room = self._shm_room()
            if room is not None:  # half of what is free, as _memory_short allows
                limits[f"{room >> 20} MiB of /dev/shm for batches"] = room // per_worker
        name = min(limits, key=limits.__getitem__)
        return max(1, limits[name]), f"{name} bound it"

    def _choose_mode(self, p: Probe, share: float) -> None:
        """The mode from the first probe (module docstring); a process worker's probe sees
        no threads side by side, so only a fetch that waits goes to threads."""
        speedup = p.threads * p.rest_cpu / max(p.rest_wall, 1e-9) / max(share, 1e-9)
        threads, why = threads_suffice(1.0 - share, p.threads, speedup)
        mode, self.tune_mode = (Where.THREADS if threads else Where.PROCESSES), False
        if mode == self.mode:
            self.decide(f"{mode} workers: {why}")
            return
        self._switch = mode
        self.decide(f"{mode} workers (at once if no batch is out yet, else next epoch): {why}")

    def decide(self, text: str) -> None:
        """Record and log a decision."""
        self.decisions.append(text)
        _logger.info("stoker autotune: %s", text)

    def begin(self, rec: StatsRecorder) -> None:
        """An iterator starts (an epoch): the first window opens after its first batch."""
        self._due = 1
        self._mark = (-1, 0.0, 0.0, 0.0)
        self._changed = False
        self._rate = None

    def step(self, rec: StatsRecorder, pids: list[int]) -> Step:
        """After a delivered batch: :data:`KEEP`, :data:`ADD_PREFETCH`, or workers to add.

        Args:
            rec: the iterator's counters.
            pids: the worker processes started (for their CPU use; empty for threads).
        """
        if self.settled or rec.batches < self._due:
            return KEEP
        batches, t0, wait0, cpu0 = self._mark
        now = rec.last
        if batches < 0:  # the first batch of the iterator: start-up, not measured
            self._open(rec, pids)
            return KEEP
        dt = now - t0
        if dt < MIN_WINDOW_S:
            self._due = rec.batches + 1
            return KEEP
        rate = (rec.batches - batches) / dt
        waited = (rec.wait - wait0) / dt
        cpu_used = (tree_cpu_seconds(pids) - cpu0) / dt
        idle = idle_cpus(self._idle_mark, idle_ticks())
        self._batch_bytes = max(self._batch_bytes, rec.bytes // max(1, rec.batches))
        if self._changed and self._rate is not None and rate < self._rate * (1 + MIN_GAIN):
            return self._settle(
                f"stop at {self.workers} workers, prefetch {self.prefetch}: the last change "
                f"gave {rate:.3g} batches/s against {self._rate:.3g} before"
            )
        if waited < INPUT_BOUND:
            return self._settle(
                f"keep {self.workers} workers, prefetch {self.prefetch}: the consumer waits "
                f"{waited:.0%} of the time ({rate:.3g} batches/s)"
            )
        self._rate = rate
        more, why_not = self._room(cpu_used, waited, idle)
        if more > 0:
            self.workers += more
            self._changed = True
            self.decide(
                f"{self.workers} workers (+{more}): the consumer waits {waited:.0%} of the "
                f"time ({rate:.3g} batches/s, loader CPU use {cpu_used:.2f})"
            )
            self._open(rec, pids, skip=self.workers)
            return Step(add=more)
        if self.tune_prefetch and self.prefetch < MAX_PREFETCH and not self._memory_short(0):
            self.prefetch += 1
            self._changed = True
            self.decide(
                f"prefetch {self.prefetch}: the consumer waits {waited:.0%} of the time with "
                f"{self.workers} workers ({why_not})"
            )
            self._open(rec, pids, skip=self.workers)
            return ADD_PREFETCH
        return self._settle(
            f"keep {self.workers} workers, prefetch {self.prefetch}: the consumer waits "
            f"{waited:.0%} of the time, but {why_not}"
        )

    def epoch_done(
        self,
        rec: StatsRecorder,
        seconds: float,
        load_in_process: Callable[[], float | None] | None = None,
    ) -> None:
        """An epoch of ``rec.batches`` batches took ``seconds`` (workers' start included):
        :meth:`judge_epoch` on what its counters show."""
        self.judge_epoch(EpochFigures.of(rec, seconds), load_in_process)

    def judge_epoch(
        self, epoch: EpochFigures, load_in_process: Callable[[], float | None] | None = None
    ) -> None:
        """Decide from an epoch's figures whether the next one loads in process (module
        docstring); only the figures decide, not the clock.

        Args:
            load_in_process: measures a batch's load time in process, or gives None; else
                (or then) the workers' mean busy time per batch stands for it. Called only
                when the workers were idle enough for the answer to matter.
        """
        if not self._in_process or epoch.batches < MIN_EPOCH_BATCHES:
            return
        per_batch = epoch.per_batch
        if self.workers == 0:  # the trial epoch
            assert self._trial is not None
            workers, before = self._trial
            rates = f"{1 / per_batch:.3g} batches/s in process, {1 / before:.3g} with workers"
            if per_batch <= before:
                self._in_process = False
                self.decide(f"stay in process: {rates}")
            else:
                self.workers = workers
                self._wait, self._retry_after = self._retry_after, 2 * self._retry_after
                self.decide(
                    f"back to {workers} workers: {rates}; another trial may come after "
                    f"{self._wait} epochs"
                )
            return
        if self._wait:  # a trial was lost lately
            self._wait -= 1
            return
        busy = epoch.load / (self.workers * per_batch)
        if busy >= BUSY_SHARE:  # the workers are the bottleneck: measuring could not help
            return
        measured = load_in_process() if load_in_process is not None else None
        load = epoch.load if measured is None else measured
        if (load + epoch.loop) * (1 + MIN_GAIN) < per_batch:
            self._trial = (self.workers, per_batch)
            self.workers = 0
            self.decide(
                f"try in process next epoch: a batch loads in {load * 1e6:.0f} us and the "
                f"loop takes {epoch.loop * 1e6:.0f} us, but {self._trial[0]} workers, busy "
                f"{busy:.0%} of the time, delivered one every {per_batch * 1e6:.0f} us"
            )

    def _open(self, rec: StatsRecorder, pids: list[int], skip: int = 0) -> None:
        """Open a window now; after a change, ``skip`` batches pass first (the pipeline fills)."""
        if skip:
            self._mark = (-1, 0.0, 0.0, 0.0)  # re-opened at the first batch after the skip
            self._due = rec.batches + skip
            return
        self._mark = (rec.batches, rec.last, rec.wait, tree_cpu_seconds(pids))
        self._idle_mark = idle_ticks()
        self._due = rec.batches + max(MIN_WINDOW_BATCHES, self.workers)

    def _settle(self, text: str) -> Step:
        self.settled = True
        self.decide(text)
        return KEEP

    def _room(self, cpu_used: float, waited: float, idle_cpus: float | None) -> tuple[int, str]:
        """How many workers to add now (see the module docstring), and if none, why not."""
        if not self.tune_workers:
            return 0, "the worker count is fixed"
        wanted = math.ceil(self.workers / max(1.0 - waited, 1 / MAX_GROWTH))
        more = min(max(1, wanted - self.workers), self.capacity - self.workers)
        if more <= 0:
            return 0, f"all {self.capacity} workers run"
        cpus = available_cpus()
        per_worker = max(cpu_used / max(1, self.workers), 1e-3)
        more = min(more, int((cpus + CPU_SLACK - cpu_used) / per_worker))
        if more <= 0:
            return 0, f"CPU is short ({cpu_used:.2f} of {cpus} CPUs in use)"
        if idle_cpus is not None:  # other programs may take the CPUs the loader does not
            more = min(more, int((idle_cpus + CPU_SLACK) / per_worker))
            if more <= 0:
                return 0, f"CPU is short (the machine has {idle_cpus:.2f} CPUs idle)"
        short = self._memory_short(more)
        while more > 0 and self._memory_short(more) is not None:
            more -= 1
        if more <= 0:
            return 0, f"{short} is short"
        return more, ""

    def _memory_short(self, more_workers: int) -> str | None:
        """What batches in flight would outgrow with ``more_workers`` more workers (or,
        for 0, one more prefetch each): the memory budget or /dev/shm; None if neither."""
        need = (self.workers + more_workers) * (self.prefetch + 1) * self._batch_bytes
        if more_workers == 0:
            need = self.workers * (self.prefetch + 2) * self._batch_bytes
        if need > self._budget:
            return "memory (see stoker._autotune.memory_budget)"
        room = self._shm_room()
        if room is not None and need > room:
            return f"/dev/shm ({room >> 20} MiB for batches)"
        return None

    def _shm_room(self) -> int | None:
        """Bytes of /dev/shm batches in flight may take with process workers: half of its
        free space, plus what they take now (None with threads, or without /dev/shm)."""
        free = shm_room_bytes() if self.shared_memory else None
        return None if free is None else free // 2 + self._in_use()

    def _in_use(self) -> int:
        return self.workers * (self.prefetch + 1) * self._batch_bytes


def memory_budget() -> int:
    """Most memory the autotuner lets batches in flight take: (workers x (prefetch + 1)) x
    the batch size seen.

    :data:`MEMORY_BUDGET_SHARE` of the memory available now (the kernel's ``MemAvailable``,
    capped by this cgroup's room below its ``memory.max``), and at least
    :data:`MEMORY_BUDGET_BYTES`. The autotuner adds no worker beyond it, nor beyond half of
    /dev/shm's free space (process workers). Fixed counts are not limited by it.
    """
    available = _osprobe.memory_available()
    room = _osprobe.cgroup_memory_room()
    if room is not None:
        available = room if available is None else min(available, room)
    if available is None:
        return MEMORY_BUDGET_BYTES
    return max(MEMORY_BUDGET_BYTES, int(available * MEMORY_BUDGET_SHARE))
