"""Where an epoch's batches load: in the main process, or in thread, process or Ray workers.

One typed decision, :class:`Placement`, and the rules that make it, in one place: a fixed
setting's placement (:meth:`Placement.fixed`), where ``worker_mode="auto"`` starts
(:func:`first_placement`), whether loading in process may stand in for workers
(:func:`may_load_in_process`) and whether threads serve a fetch (:func:`threads_suffice`).
The autotuner measures and moves between placements (``Autotuner.pending`` and
``Autotuner.take_placement``); the loader and the worker-backed iterator act only on the
:class:`Placement` they get. Thresholds live in :mod:`stoker._policy`, with their reasons.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from stoker import _osprobe
from stoker._policy import GIL_FREE_SPEEDUP, THREADS_WAIT_SHARE


class Where(enum.StrEnum):
    """Who loads the batches; a worker kind's value is its ``worker_mode``."""

    IN_PROCESS = "in_process"
    THREADS = "thread"
    PROCESSES = "process"
    RAY = "ray"


@dataclass(frozen=True)
class Placement:
    """Where an epoch loads (``where``) and with how many ``workers`` (0 in process).

    >>> Placement.fixed(0, "process"), Placement.fixed(2, "thread").where
    (Placement(where=<Where.IN_PROCESS: 'in_process'>, workers=0), <Where.THREADS: 'thread'>)
    """

    where: Where
    workers: int

    def __post_init__(self) -> None:
        if (self.where is Where.IN_PROCESS) != (self.workers == 0):
            raise ValueError(f"{self.where} with {self.workers} workers is no placement")

    @classmethod
    def fixed(cls, num_workers: int, worker_mode: str) -> Placement:
        """The placement of a loader whose settings are fixed (no tuner)."""
        if num_workers == 0:
            return IN_PROCESS
        return cls(Where(worker_mode), num_workers)

    @property
    def in_process(self) -> bool:
        return self.where is Where.IN_PROCESS


IN_PROCESS = Placement(Where.IN_PROCESS, 0)
"""Batches load in the main process."""


@dataclass(frozen=True)
class FirstPlacement:
    """Where a tuned loader's workers start (``where``), whether the first probe may move
    them to the other kind (``tuned``), and why, where the choice is forced (``why``)."""

    where: Where
    tuned: bool
    why: str | None = None


def first_placement(worker_mode: str, iterable: bool, batched: bool) -> FirstPlacement:
    """Where workers of ``worker_mode`` start. ``"auto"`` starts with threads (they start
    at once, and show whether the fetch releases the GIL), or, where the probe comes only
    with a whole batch (``batched``), with processes (a switch would drop that batch; a
    batch that waits is dropped at less cost than one that computes). An ``iterable``
    dataset's draws are seeded per epoch in a process, per batch in a thread, so its kind
    is fixed. Without a writable /dev/shm, threads are the only workers that can hand
    batches over.
    """
    if worker_mode != "auto":
        return FirstPlacement(Where(worker_mode), tuned=False)
    no_shm = _osprobe.shm_unwritable()
    if no_shm is not None:
        why = f"thread workers: /dev/shm is {no_shm}, process workers need it"
        return FirstPlacement(Where.THREADS, tuned=False, why=why)
    if iterable:
        why = "iterable dataset: process workers (its draws are seeded per epoch)"
        return FirstPlacement(Where.PROCESSES, tuned=False, why=why)
    return FirstPlacement(Where.PROCESSES if batched else Where.THREADS, tuned=True)


def may_load_in_process(
    num_workers: int | str, iterable: bool, init_fn: Any, timeout: float, draws: bool
) -> bool:
    """Whether loading in the main process may stand in for a loader's workers, when an
    epoch shows that workers only cost (see :mod:`stoker._autotune`).

    With ``num_workers="auto"``, or a fixed count where only stoker's code would run in
    the workers (a fetcher that ``draws`` nothing runs none of the user's: where such
    batches are gathered cannot be seen, except in the time they take). Never for an
    iterable dataset (it shards itself by worker count), with ``worker_init_fn`` (it would
    not run) or a ``timeout`` (the main process cannot time itself out).
    """
    if iterable or init_fn is not None or float(timeout):
        return False
    return num_workers == "auto" or not draws


def threads_suffice(waiting: float, threads: int, speedup: float) -> tuple[bool, str]:
    """Whether thread workers serve a fetch that waits ``waiting`` of its time, and whose
    ``threads`` threads side by side used ``speedup`` times the CPU of one alone; and why.
    Else processes: only they run a fetch that holds the GIL in parallel.

    >>> [threads_suffice(*a)[0] for a in [(0.9, 1, 0), (0.1, 4, 1.9), (0.1, 4, 1.0), (0.1, 1, 0)]]
    [True, True, False, False]
    """
    if waiting >= THREADS_WAIT_SHARE:
        return True, f"a fetch waits {waiting:.0%} of its time"
    if threads < 2:
        return (
            False,
            f"a fetch computes {1 - waiting:.0%} of its time, no thread measured beside it",
        )
    side = f"{threads} threads side by side use {speedup:.2g}x the CPU of one"
    if speedup >= GIL_FREE_SPEEDUP:
        return True, f"{side}: the fetch releases the GIL"
    return False, f"{side}: the fetch holds the GIL"
