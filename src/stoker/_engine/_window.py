"""The reorder window: an epoch's tasks between the sampler and the user.

Tasks are numbered as they are sent (a task index ``idx``, distinct from the batch's
number ``k`` in the epoch), belong to a worker until answered and until delivered, and
leave the window in task order (``in_order=True``) or as they come in. An index with
nothing to deliver (its worker ran out of data, or a later part of a split batch) is
skipped in its turn. :meth:`ReorderWindow.choose` says which worker takes the next task:
torch's round robin where the user's code could see the assignment, else the one with the
fewest in flight. Pure bookkeeping: no processes, no I/O; the clock is injected.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from stoker._engine._errors import RemoteError
    from stoker._fetch import Skipped


class Failure:
    """A task that raised in its worker; raised again when its turn comes."""

    def __init__(self, remote: RemoteError) -> None:
        self.remote = remote


class Entry(NamedTuple):
    """A task's result in the window: batch ``k`` of the epoch, its ``item`` (the batch,
    or the :class:`Failure` raised in its turn) and what it ``skipped`` (``skip_errors``)."""

    k: int
    item: Any
    skipped: Skipped | None = None


class _Skip:
    """Marks a task index with nothing to deliver."""


_SKIP = _Skip()


class ReorderWindow:
    """The bookkeeping of one epoch's tasks in flight (module docstring).

    Args:
        workers: how many workers take tasks (more may join: :meth:`add_worker`).
        in_order: deliver in task order (else as results come in).
        clock: seconds, for when each worker's current task began.
    """

    def __init__(
        self, workers: int, in_order: bool, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.in_order = in_order
        self._clock = clock
        self.sent = 0  # the next task's index
        self._next = 0  # the next index to deliver, in order
        self._left = 0  # tasks that left the window (delivered, skipped or raised)
        self.outstanding = [0] * workers  # sent, not yet answered
        self._undelivered = [0] * workers  # sent, not yet delivered or skipped
        self.active = [True] * workers  # False once a worker ran out of data
        self.since = [clock()] * workers  # when each one's current task began
        self.running: dict[int, int] = {}  # idx -> worker until answered, in the order sent
        self._batch: dict[int, int] = {}  # idx -> batch number k, until answered
        self._owner: dict[int, int] = {}  # idx -> worker, until it leaves the window
        self._ready: dict[int, Entry | _Skip] = {}
        self._round = 0  # round robin: the next worker to try

    @property
    def workers(self) -> int:
        return len(self.outstanding)

    @property
    def in_flight(self) -> int:
        """Tasks sent and not yet out of the window."""
        return self.sent - self._left

    def start_at(self, wid: int) -> None:
        """The round robin's first task goes to worker ``wid`` (a resumed stream's turn)."""
        self._round = wid % self.workers

    def batch_of(self, idx: int) -> int:
        """The batch number of task ``idx``, sent and not yet answered."""
        return self._batch[idx]

    def add_worker(self) -> None:
        """One more worker takes tasks from now on."""
        self.outstanding.append(0)
        self._undelivered.append(0)
        self.active.append(True)
        self.since.append(self._clock())

    def choose(
        self, depth: int, least_loaded: bool, candidates: Sequence[int] | None = None
    ) -> int | None:
        """The worker for the next task, or None to send nothing now.

        Not ``least_loaded`` (torch's assignment): the next worker in the cycle that still
        has data and, with ``in_order=False``, fewer than its share of the window
        undelivered. Else: of ``candidates`` (default all), the one with the fewest tasks
        in flight, if it has fewer than ``depth``.
        """
        n = self.workers
        if not least_loaded:
            share = (depth * n) // max(1, sum(self.active))
            for _ in range(n):
                wid = self._round
                self._round = (wid + 1) % n
                if self.active[wid] and (self.in_order or self._undelivered[wid] < share):
                    return wid
            return None
        wid = min(candidates or range(n), key=self.outstanding.__getitem__)
        return wid if self.outstanding[wid] < depth else None

    def add(self, wid: int, ks: Sequence[int]) -> int:
        """Number the tasks of batches ``ks``, all sent to worker ``wid`` (a group's batches
        go as one message, one index each); returns the first index."""
        first = self.sent
        self.sent += len(ks)
        for idx, k in enumerate(ks, first):
            self._batch[idx] = k
            self.running[idx] = wid
            self._owner[idx] = wid
        self._undelivered[wid] += len(ks)
        if not self.outstanding[wid]:
            self.since[wid] = self._clock()
        self.outstanding[wid] += len(ks)
        return first

    def answered(self, wid: int, idx: int) -> int:
        """Worker ``wid`` answered task ``idx`` (its next one starts now); returns the
        task's batch number."""
        self.outstanding[wid] -= 1
        del self.running[idx]
        self.since[wid] = self._clock()
        return self._batch.pop(idx)

    def exhausted(self, wid: int, idx: int) -> None:
        """Worker ``wid`` has no more data (an iterable dataset): task ``idx`` is skipped and
        the worker gets no more tasks this epoch."""
        self.active[wid] = False
        self.skip(idx)

    def put(self, idx: int, entry: Entry) -> None:
        """Task ``idx``'s result, to be delivered in its turn."""
        self._ready[idx] = entry

    def skip(self, idx: int) -> None:
        """Task ``idx`` has nothing to deliver: passed over in its turn."""
        if self.in_order:
            self._ready[idx] = _SKIP
        else:
            self._leave(idx)

    def pop(self) -> Entry | None:
        """The next result to deliver, or None while it is not in."""
        ready = self._ready
        if not self.in_order:
            if not ready:
                return None
            idx = next(iter(ready))
        else:
            while ready.get(self._next) is _SKIP:
                del ready[self._next]
                self._leave(self._next)
                self._next += 1
            idx = self._next
            if idx not in ready:
                return None
            self._next += 1
        self._leave(idx)
        return ready.pop(idx)  # type: ignore[return-value]  # skips never reach here

    def waiting_for(self) -> int:
        """The worker whose answer the next delivery waits for (in order), or the busiest."""
        if self.in_order and self._next in self.running:
            return self.running[self._next]
        return max(range(self.workers), key=self.outstanding.__getitem__)

    def drained(self, tasks_done: bool) -> bool:
        """Whether the epoch is over: nothing in flight, and no task left or no worker
        with data."""
        return not any(self.outstanding) and (tasks_done or not any(self.active))

    def _leave(self, idx: int) -> None:
        self._left += 1
        self._undelivered[self._owner.pop(idx)] -= 1
