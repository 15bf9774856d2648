"""Self-healing worker processes (``worker_restarts``): a dead worker replaced, its tasks again.

A process pool with a restart budget keeps a :class:`Healer`: per worker, the tasks sent
and not yet answered (answered in the order sent). When a worker dies, the pool starts one
in its place (same id, seed, ``worker_init_fn``) and the healer sends it the dead one's
tasks again. The reorder window never notices: the tasks keep their indices and worker,
and each batch comes from its own seed, so the batches are those of an unfaulted run.

The first unanswered task at a death is blamed; blamed twice, an :class:`Isolation` loads
halves of its samples in fresh workers until one sample is left, which the batch's error
names (or, with ``skip_errors``, the batch is loaded without it). Deaths count against the
budget (per epoch) unless they isolate a sample. See ``docs/engine.md``, "Self-healing
workers".
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Callable
from typing import Any

import numpy as np

from stoker._engine._errors import RemoteError
from stoker._engine._messages import BatchSeed, Failed, GroupSeeds, Loaded, Task
from stoker._fetch import Skipped
from stoker._osprobe import oom_kills
from stoker._policy import INDICES_SHOWN
from stoker._random import batch_seeds
from stoker.errors import WorkerError

_logger = logging.getLogger(__name__)

PROBE = -1
"""The generation of an isolation's probe tasks: no epoch has it, so no answer of one
reaches the reorder window."""


def death_cause(code: int | None, oom_before: int | None, oom_now: int | None) -> str:
    """A worker's death in a few words, from its exit status (negative: the signal) and the
    kernel's OOM-kill count before and after it.

    >>> death_cause(-9, 3, 4), death_cause(-11, None, None), death_cause(7, 0, 0)
    ('killed by SIGKILL (the kernel OOM killer)', 'killed by SIGSEGV', 'exit code 7')
    """
    if code is None or code >= 0:
        return "an unknown exit" if code is None else f"exit code {code}"
    oom = oom_before is not None and oom_now is not None and oom_now > oom_before
    return (
        f"killed by {_signal_name(-code)}{' (the kernel OOM killer)' if oom and code == -9 else ''}"
    )


def _signal_name(signum: int) -> str:
    """'SIGKILL' (or 'signal 99' for a number Python does not name)."""
    with contextlib.suppress(ValueError):
        return signal.Signals(signum).name
    return f"signal {signum}"


def _subset(indices: Any, positions: list[int]) -> Any:
    """The samples of a task's ``indices`` at ``positions``, of the same kind (an array
    stays an array); a task of one index (no batching) is its own only sample."""
    if isinstance(indices, np.ndarray):
        return indices[positions]
    if isinstance(indices, (list, tuple)):
        return [indices[p] for p in positions]
    return indices


def _samples(indices: Any) -> list[Any]:
    """A task's sample indices as a list of Python ints (for messages and records)."""
    if isinstance(indices, np.ndarray):
        return [int(i) for i in indices.tolist()]
    if isinstance(indices, (list, tuple)):
        return list(indices)
    return [indices]


def _without(task: Task, samples: list[Any]) -> Task | None:
    """``task`` without ``samples`` (each time one occurs), or None when nothing is left."""
    drop = set(samples)
    keep = [p for p, i in enumerate(_samples(task.task)) if i not in drop]
    return task._replace(task=_subset(task.task, keep)) if keep else None


def _singles(task: Task) -> list[Task]:
    """A task as single-batch tasks: a group's batches one by one, each seeded as sent
    alone (so one of them can be blamed); any other task as it is."""
    group = task.seed
    if not isinstance(group, GroupSeeds):
        return [task]
    seeds = batch_seeds(group.base, group.epoch, group.ks)
    return [
        Task(generation=task.generation, idx=task.idx + j, task=t, seed=BatchSeed(seed=seed))
        for j, (t, seed) in enumerate(zip(task.task, seeds, strict=True))
    ]


class Isolation:
    """The search for the sample of ``task`` that kills its worker: halves of the suspects
    loaded as probes in fresh workers; a half that kills narrows the search to it. When
    neither half kills alone, no one sample does (two samples died once each, or the
    batch kills only whole), and the suspects left are more than one."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self._size = len(_samples(task.task))
        self._suspects = list(range(self._size))  # positions in the batch
        self._halves: list[list[int]] = []
        self._split()

    def _split(self) -> None:
        s = self._suspects
        self._halves = [s[: len(s) // 2], s[len(s) // 2 :]] if len(s) > 1 else []

    @property
    def done(self) -> bool:
        """Whether the suspects are found (one sample, or some that kill only together)."""
        return not self._halves

    def probe(self) -> Task:
        """The next probe: the task's first untried half, under the batch's seed."""
        part = _subset(self.task.task, self._halves[0])
        return Task(generation=PROBE, idx=PROBE, task=part, seed=self.task.seed)

    def died(self) -> None:
        """The probe killed its worker: the sample is in that half."""
        self._suspects = self._halves[0]
        self._split()

    def survived(self) -> None:
        """The probe loaded: try the other half (none left: the suspects kill together)."""
        self._halves.pop(0)

    def culprits(self) -> list[Any]:
        """The sample indices found."""
        return _samples(_subset(self.task.task, self._suspects))


class Healer:
    """A process pool's record of the tasks its workers hold, and what to do when one dies
    (module docstring).

    Args:
        budget: deaths per epoch that may be healed (``worker_restarts``).
        skip_errors: a poisoned sample is skipped (else its batch fails at its turn).
        post: sends tasks to a worker now (past this record).
        poisoned: the samples known to kill (the loader's, kept in its checkpoint): with
            ``skip_errors`` left out of every task before it is sent; found ones are added.
    """

    def __init__(
        self,
        budget: int,
        skip_errors: bool,
        post: Callable[[int, list[Task]], None],
        poisoned: set[Any],
    ) -> None:
        self.budget, self._skip, self._post = budget, skip_errors, post
        self._poisoned = poisoned
        self.restarts = 0  # counted this epoch
        self._generation: int | None = None
        self._held: dict[int, dict[int, Task]] = {}  # worker -> {task index: task}, as sent
        self._blamed: set[int] = set()  # task indices loading at a death this epoch
        self._cleared: set[int] = set()  # blamed, but no sample of it kills alone
        self._isolating: dict[int, Isolation] = {}  # worker -> the search it runs
        self._amend: dict[int, tuple[list[Any], str]] = {}  # task index -> samples left out
        self._ready: list[tuple[int, Any]] = []  # answers made here, for the iterator
        self._causes: dict[int, str] = {}  # worker -> why the last one died
        self._oom = oom_kills()

    def sent(self, wid: int, tasks: list[Task]) -> list[Task]:
        """Hold ``tasks`` for worker ``wid`` until answered; returns those to send now
        (none while the worker isolates a sample: they follow its search)."""
        if tasks and tasks[0].generation != self._generation:  # a new epoch: a new budget
            self._generation, self.restarts = tasks[0].generation, 0
            self._held.clear()  # a worker drops an abandoned epoch's tasks, unanswered
            self._blamed.clear()
            self._cleared.clear()
            self._amend.clear()
            self._isolating.clear()  # a probe in flight is answered, and dropped, still
        if self._skip and self._poisoned:
            tasks = self._spare(wid, tasks)
        held = self._held.setdefault(wid, {})
        for task in tasks:
            held[task.idx] = task
        return [] if wid in self._isolating else tasks

    def _spare(self, wid: int, tasks: list[Task]) -> list[Task]:
        """``tasks`` without the samples known to kill (a group then goes batch by batch)."""
        out = []
        for one in (single for task in tasks for single in _singles(task)):
            hit = sorted({i for i in _samples(one.task) if i in self._poisoned})
            if not hit:
                out.append(one)
            elif (rest := self._leave_out(wid, one, hit, "killed a worker before")) is not None:
                out.append(rest)
        return out

    def _leave_out(self, wid: int, task: Task, samples: list[Any], why: str) -> Task | None:
        """``task`` without ``samples``, its answer to record them as skipped (``why``);
        None when nothing is left, the dropped batch's answer made here."""
        named = ", ".join(map(str, samples[:INDICES_SHOWN]))
        rest, reason = _without(task, samples), f"WorkerError: sample {named} {why}"
        if rest is not None:
            self._amend[task.idx] = (samples, reason)
            return rest
        skipped = Skipped(indices=samples, error=reason, dropped=True)
        # fmt: off
        self._ready.append((wid, Loaded(
            generation=task.generation, idx=task.idx, batch=None, busy=0.0, skipped=skipped,
            untouched=None,
        )))
        # fmt: on
        return None

    def answered(self, wid: int, msg: Any) -> Any:
        """Worker ``wid``'s message as the iterator gets it: an answer no longer held (a
        skipped sample's record added), or None for a probe's answer (the search goes on)."""
        if getattr(msg, "generation", None) == PROBE:  # an autotune Probe of it is dropped
            search = self._isolating.get(wid)
            if search is not None and type(msg) in (Loaded, Failed):
                search.survived()
                self._step(wid)
            return None
        idx = getattr(msg, "idx", None)
        if idx is None or msg.generation != self._generation:
            return msg
        self._held.get(wid, {}).pop(idx, None)
        left_out = self._amend.pop(idx, None)
        if left_out is not None and type(msg) is Loaded:
            failed, why = left_out
            had = msg.skipped
            if had is None:
                return msg._replace(skipped=Skipped(indices=failed, error=why, dropped=False))
            both = sorted([*failed, *had.indices])
            return msg._replace(skipped=Skipped(indices=both, error=why, dropped=had.dropped))
        return msg

    def died(self, wid: int, code: int | None, where: str) -> str | None:
        """Worker ``wid`` (``where``: 'worker 1 (pid 42)') died with exit status ``code``:
        its cause, logged, if a new worker may take its place; None when the restarts ran
        out (the pool raises)."""
        oom = oom_kills()
        cause = death_cause(code, self._oom, oom)
        self._oom = oom
        self._causes[wid] = cause
        held = self._held.get(wid, {})
        head = next(iter(held.values()), None)
        search = self._isolating.get(wid)
        if search is not None:
            search.died()
            what = "while isolating the sample that kills it"
        elif head is not None and head.idx in self._blamed and head.idx not in self._cleared:
            self._isolating[wid] = Isolation(head)
            what = f"again on task {head.idx}: isolating the sample that kills it"
        elif self.restarts >= self.budget:
            return None
        else:
            self.restarts += 1
            if head is not None:
                self._blamed.add(head.idx)
            what = f"restart {self.restarts} of {self.budget} this epoch"
        _logger.warning(
            "DataLoader %s was %s; a new worker takes its place (%s), its %d task(s) issued again.",
            where,
            cause,
            what,
            len(held),
        )
        return f"{where}: {cause}"

    def restarted(self, wid: int) -> None:
        """The new worker ``wid`` runs: send it the next probe, or its held tasks (groups
        one batch at a time, so that a batch can be blamed)."""
        held = self._held.get(wid, {})
        singles = [one for task in held.values() for one in _singles(task)]
        self._held[wid] = {t.idx: t for t in singles}
        self._step(wid)

    def _step(self, wid: int) -> None:
        """Go on with worker ``wid``'s search, or, when there is none left, send its tasks."""
        search = self._isolating.get(wid)
        if search is not None and not search.done:
            self._post(wid, [search.probe()])
            return
        if search is not None:
            del self._isolating[wid]
            self._settle(wid, search)
        self._post(wid, list(self._held.get(wid, {}).values()))

    def _settle(self, wid: int, search: Isolation) -> None:
        """The samples that kill are found: the batch fails at its turn naming them, or with
        ``skip_errors`` is loaded without them (dropped if nothing is left)."""
        task, culprits, cause = search.task, search.culprits(), self._causes.get(wid, "")
        held = self._held.setdefault(wid, {})
        if len(culprits) > 1:  # no sample kills alone: the deaths were not one sample's
            self._cleared.add(task.idx)  # its next deaths count against the budget
            _logger.warning(
                "DataLoader: no sample of the batch %s kills a worker alone; it is issued again.",
                _shown(culprits),
            )
            return
        why = f"killed every worker that loaded it ({cause})"
        if self._skip:
            self._poisoned.update(culprits)
            rest = self._leave_out(wid, task, culprits, why)
            if rest is None:
                held.pop(task.idx, None)
            else:
                held[task.idx] = rest
            return
        held.pop(task.idx, None)
        why = f"sample {culprits[0]} {why}"
        error = WorkerError(
            f"DataLoader {why}: {_tries(task)}. Fix the sample (or the code that loads it), "
            "or pass skip_errors=N to leave such samples out."
        )
        remote = RemoteError(error, f"worker {wid} on sample indices {culprits}", True)
        self._ready.append((wid, Failed(generation=task.generation, idx=task.idx, error=remote)))

    def take_ready(self) -> tuple[int, Any] | None:
        """An answer made here (a poisoned batch's), or None."""
        return self._ready.pop(0) if self._ready else None

    def spent(self) -> str:
        """For the error when the restarts ran out: how many were made."""
        return (
            f" The DataLoader had restarted {self.restarts} dead worker(s) this epoch, as "
            f"many as worker_restarts={self.budget} allows: raise worker_restarts, or find "
            "what kills the workers."
        )


def _shown(samples: list[Any]) -> str:
    """A batch's sample indices, the first few of a long one."""
    return str(samples if len(samples) <= INDICES_SHOWN else [*samples[:INDICES_SHOWN], "..."])


def _tries(task: Task) -> str:
    """How the sample was found, for the error message."""
    return (
        f"its batch {_shown(_samples(task.task))} killed two workers, then fresh workers "
        "loaded halves of it until one sample was left"
    )
