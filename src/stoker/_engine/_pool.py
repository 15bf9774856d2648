"""The worker pool protocol, in one place: what the iterator uses of a pool.

:class:`~stoker._engine._multi.MultiWorkerIterator` drives one :class:`WorkerPool` from
the thread that iterates; :func:`~stoker._engine._multi.make_pool` picks it by
``worker_mode`` from ``_multi.POOLS`` (where a new kind registers). Three implement it:
:class:`~stoker._engine._procs.ProcessPool` (a process and a pipe per worker, batches in
shared memory),
:class:`~stoker._engine._threads.ThreadPool` (a thread per worker, batch objects) and
:class:`~stoker._engine._inproc.InProcessPool` (the worker loop run by the main thread
itself, for tests of the iterator with no process or thread). A new kind of pool
implements :class:`WorkerPool`'s members and nothing else.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from stoker._engine._messages import Task, ToIterator

STOP_GRACE_S = 1.0
"""How long stopping workers get to finish their batch and exit before they are killed."""


class PoolGauges(NamedTuple):
    """What a pool measures for the tuner and ``loader.statistics()``: the pids of its
    started worker processes (their CPU use; none for workers in this process), and the
    bytes of shared memory mapped for batches now."""

    pids: list[int]
    shared_bytes: int


class WorkerPool(Protocol):
    """What the iterator uses of a pool: starts, tasks out, decoded messages in, deaths.

    What a pool must hold: workers are numbered ``0 .. config.capacity - 1``, each running
    the worker loop (:mod:`stoker._engine._worker`) through a sink of the pool's own
    (:mod:`stoker._engine._sinks`). Everything they send goes through the pool's
    :class:`~stoker._engine._arrivals.Arrivals`, which decodes batches (the one place) and
    notes life messages; ``get`` and ``buffered`` return only what it passes on. A worker
    that dies is reported by ``get``, after what it sent before, as the ``WorkerError`` of
    its :class:`~stoker._engine._deaths.WorkerDeath`, the pool shut down first (a pool
    that heals replaces it instead: see ``ProcessPool.lost``). ``shutdown`` is idempotent
    and safe from a ``weakref.finalize``. Output never depends on the pool: each task
    carries its seed.
    """

    @property
    def alive(self) -> bool:
        """Whether the pool can still serve tasks (False after :meth:`shutdown`)."""

    @property
    def pending_start(self) -> bool:
        """Whether some workers within the start limit are not started yet."""

    def start(self, count: int | None = None) -> None:
        """Start the next ``count`` workers within the start limit (default: all); a
        worker's queued tasks go to it as it starts."""

    def limit_start(self, count: int) -> None:
        """Only the first ``count`` workers start and get tasks (autotune grows it)."""

    def is_started(self, wid: int) -> bool:
        """Whether worker ``wid`` was started."""

    def send(self, wid: int, tasks: list[Task]) -> None:
        """Send worker ``wid`` its tasks (queued until it starts); never raises for a dead
        worker: :meth:`get` reports it."""

    def get(self, timeout_s: float) -> tuple[int, ToIterator] | None:
        """The next (worker id, message), or None after ``timeout_s``.

        Raises:
            WorkerError: a worker died.
        """

    def buffered(self) -> tuple[int, ToIterator] | None:
        """A (worker id, message) already received, or None; never waits."""

    def describe(self, wid: int) -> str:
        """Worker ``wid`` in words, for error messages ('worker 1 (pid 42)')."""

    def gauges(self) -> PoolGauges:
        """The pool's measures now (see :class:`PoolGauges`)."""

    def handles(self) -> list[Any]:
        """The objects torch's iterator lists as ``_workers`` (processes, threads...)."""

    def shutdown(self, grace_s: float = ...) -> None:
        """Stop every worker; idempotent."""
