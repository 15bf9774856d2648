"""The in-process pool: the worker loop run in the main process, no process or thread.

:class:`InProcessPool` implements :class:`~stoker._engine._pool.WorkerPool` with each
worker's loop (:class:`~stoker._engine._worker.Server`) run by the thread that iterates,
one task at a time, when the iterator waits (:meth:`InProcessPool.get`). Every message and
decision the iterator makes with real workers (the reorder window, skips, groups, probes,
autotune's steps, deaths, shutdown) runs as with them, so the iterator's logic is tested
without starting anything (``tests/test_engine_inprocess.py``). A worker's info
(``get_worker_info()``) is set only while its loop runs. A task that runs past the wait's
timeout is answered after it, as a late worker's would be: the wait says it timed out.
"""

from __future__ import annotations

import collections
import functools
import time
from typing import TYPE_CHECKING, Any

from stoker._engine._arrivals import Arrivals
from stoker._engine._deaths import WorkerDeath
from stoker._engine._messages import Bye, Shipped, Task, ToIterator
from stoker._engine._pool import PoolGauges
from stoker._engine._sinks import DirectSink
from stoker._engine._worker import Ended, Server, WorkerArgs
from stoker._engine._worker import start as start_worker
from stoker._worker_info import WorkerInfo, get_worker_info, set_worker_info

if TYPE_CHECKING:
    from stoker._engine._config import EngineConfig, EngineMemory


class InProcessPool:
    """Workers whose loops the main thread runs (see the module docstring).

    Attributes:
        runs: tasks run so far (a test reads it to see this pool did the work).
    """

    def __init__(self, config: EngineConfig, memory: EngineMemory, seeds: list[int]) -> None:
        n = config.capacity
        self._closed = False
        self._results: collections.deque[tuple[int, Any]] = collections.deque()
        self._queues: list[collections.deque[Task]] = [collections.deque() for _ in range(n)]
        self._arrivals = Arrivals(config.init_fn)
        self._dead: WorkerDeath | None = None
        shared = None if config.iterable else config.make_fetcher()
        self._args = [
            WorkerArgs(
                worker_id=wid,
                num_workers=n,
                seed=seeds[wid],
                fetcher=shared if shared is not None else config.make_fetcher(),
                worker_init_fn=config.init_fn,
                pin_device=config.pin_device,
                probe=config.probe,
                local=True,
            )
            for wid in range(n)
        ]
        self._servers: list[Server | None] = [None] * n
        self._infos: list[WorkerInfo | None] = [None] * n
        self._started = 0
        self._limit = n
        self._turn = 0  # the next worker to run, round robin
        self.runs = 0

    @property
    def alive(self) -> bool:
        """Whether the pool can still serve tasks."""
        return not self._closed

    @property
    def pending_start(self) -> bool:
        """Whether some workers within the start limit are not started yet."""
        return self._started < self._limit and not self._closed

    def start(self, count: int | None = None) -> None:
        """Start the next ``count`` workers: each sets up and runs ``worker_init_fn`` now."""
        todo = range(self._started, self._limit)
        for wid in todo if count is None else todo[:count]:
            self._started += 1
            sink = DirectSink(self._args[wid], self._results)
            begin = functools.partial(start_worker, self._args[wid], sink, whole_process=False)
            if self._run(wid, begin):
                self._servers[wid] = Server(self._args[wid], sink)

    def limit_start(self, count: int) -> None:
        """Only the first ``count`` workers start and get tasks."""
        self._limit = count

    def is_started(self, wid: int) -> bool:
        """Whether worker ``wid`` was started."""
        return wid < self._started

    def send(self, wid: int, tasks: list[Task]) -> None:
        """Queue tasks for worker ``wid`` (run when the iterator waits)."""
        self._queues[wid].extend(tasks)

    def buffered(self) -> tuple[int, ToIterator] | None:
        """A result of a task run already, or None."""
        while self._results:
            wid, raw = self._results.popleft()
            msg = self._arrivals.take(self, wid, raw)
            if msg is not None:
                return wid, msg
        return None

    def get(self, timeout_s: float) -> tuple[int, ToIterator] | None:
        """The next (worker id, message): a result already made, else the next queued task
        of a started worker run now; None if that took over ``timeout_s`` or nothing is
        queued (as a real pool's wait would end).

        Raises:
            WorkerError: a worker ended (the dataset raised ``SystemExit``...).
        """
        began = time.monotonic()
        while True:
            if self._dead is not None:
                death, self._dead = self._dead, None
                self.shutdown()
                raise death.error()
            got = self.buffered()
            if got is not None or self._closed:
                return got
            if not self._run_next() or time.monotonic() - began > timeout_s:
                return None

    def _run_next(self) -> bool:
        """Run one queued task of a started worker (round robin); False if none is queued."""
        n = len(self._queues)
        for step in range(n):
            wid = (self._turn + step) % n
            server = self._servers[wid]
            if server is not None and self._queues[wid]:
                self._turn = wid + 1
                self.runs += 1
                self._run(wid, functools.partial(server.handle, self._queues[wid].popleft()))
                return True
        return False

    def _run(self, wid: int, step: Any) -> Any:
        """``step()`` as worker ``wid``: its worker info set meanwhile; a worker that ends
        says goodbye, as a thread would."""
        set_worker_info(self._infos[wid], whole_process=False)
        try:
            return step()
        except Ended as exc:
            self._servers[wid] = None
            self._results.append((wid, Bye(kept=None, why=(exc.remote.summary(), None))))
            return None
        finally:
            self._infos[wid] = get_worker_info()
            set_worker_info(None, whole_process=False)

    def unpack(self, wid: int, msg: Shipped) -> Any:
        """A batch made in this process is the object itself."""
        return msg.payload

    def bye(self, wid: int, bye: Bye) -> None:
        """Worker ``wid`` said goodbye (see :class:`~stoker._engine._arrivals.Arrivals`)."""
        if self._dead is None:
            why = bye.why[0] if bye.why is not None else "an unknown cause"
            self._dead = WorkerDeath(
                wid=wid, pid=None, code=None, why=f"it was ended by {why}", thread=True
            )

    def describe(self, wid: int) -> str:
        """'in-process worker 1', and ' in its worker_init_fn NAME' while it runs that."""
        return f"in-process worker {wid}{self._arrivals.doing(wid)}"

    def gauges(self) -> PoolGauges:
        """No worker processes, no shared memory: everything runs in this thread."""
        return PoolGauges(pids=[], shared_bytes=0)

    def handles(self) -> list[Any]:
        """No process or thread to list."""
        return []

    def shutdown(self, grace_s: float = 0.0) -> None:
        """Drop the queued tasks; idempotent."""
        self._closed = True
        for q in self._queues:
            q.clear()
