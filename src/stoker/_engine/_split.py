"""Splitting a slow batch's samples across idle worker threads.

Thread workers each fetch whole batches, so while one thread loads a slow batch (I/O that
releases the GIL) sample after sample, idle threads would wait. :class:`HelpBoard` lets
the loading thread time its first sample and, only when that took at least
:data:`~stoker._policy.THREAD_SPLIT_MIN_S`, offer the rest. A thread about to wait for its
inbox first helps any open job, then waits marked idle; the owner puts a
:class:`~stoker._engine._messages.Help` in idle threads' inboxes and takes samples too, so
it waits only for samples a helper has started. Results come back in index order and the
first failing sample raises, so the batch is the one a single thread would load; a helper
answers ``get_worker_info()`` as the owner does. Only the threads given tasks help (an
autotuned pool holds more), except with the samples the autotuner's probe times.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from stoker._engine._messages import Help
from stoker._policy import THREAD_SPLIT_MIN_S
from stoker._worker_info import get_worker_info, set_worker_info


class Job:
    """One batch's samples, taken one at a time by its owner and any helpers."""

    def __init__(
        self, fn: Callable[[Any], Any], items: list[Any], first: Any, timed: bool = False
    ) -> None:
        self.timed = timed  # its samples are timed for the autotuner's probe
        self._info = get_worker_info()  # the owner's
        self._fn = fn
        self._items = items
        self._results: list[Any] = [first] + [None] * (len(items) - 1)
        self._errors: dict[int, BaseException] = {}
        self._next = 1
        self._done = 1
        self._cond = threading.Condition()

    def left(self) -> int:
        """Samples not taken yet."""
        return len(self._items) - self._next

    def work(self, offer: Callable[[Job], None] | None = None) -> None:
        """Load samples until none is left to take (owner and helpers alike).

        Args:
            offer: the owner's; called before each sample, to hand samples to threads
                that went idle since.
        """
        if offer is not None:
            self._work(offer)
            return
        mine = get_worker_info()
        set_worker_info(self._info, whole_process=False)  # a helper: as the owner
        try:
            self._work(None)
        finally:
            set_worker_info(mine, whole_process=False)

    def _work(self, offer: Callable[[Job], None] | None) -> None:
        n = len(self._items)
        while True:
            if offer is not None:
                offer(self)
            with self._cond:
                i = self._next
                if i >= n:
                    return
                self._next += 1
            failed = False
            try:
                self._results[i] = self._fn(self._items[i])
            except BaseException as exc:  # kept for the owner, which raises in index order
                self._errors[i] = exc
                failed = True
            with self._cond:
                self._done += 1
                if failed and self._next < n:  # the batch raises: load no later sample,
                    self._done += n - self._next  # as one thread would not, and say so
                    self._next = n  # soon (a probe must not outrun the error)
                if self._done == n:
                    self._cond.notify_all()

    def cancel(self) -> None:
        """Take no more samples: the pool stops, the batch is not wanted. Its owner raises
        :class:`Cancelled` once the samples already taken are in."""
        with self._cond:
            n = len(self._items)
            if self._next < n:
                self._errors[self._next] = Cancelled("the pool stopped")
                self._done += n - self._next
                self._next = n
                if self._done == n:
                    self._cond.notify_all()

    def results(self) -> list[Any]:
        """Every sample in index order, once all are loaded (the owner calls it).

        Raises:
            The exception of the first failing sample, in index order.
        """
        n = len(self._items)
        with self._cond:
            # No timeout of its own: these samples load in helper threads as the others did
            # in this one, and the loader's ``timeout`` bounds the whole batch.
            self._cond.wait_for(lambda: self._done == n)
        # A helper may keep a stale reference to the job: it must not keep the samples, or
        # an error whose traceback holds the loader's iterator (and so its threads) alive.
        results, errors = self._results, self._errors
        self._items, self._results, self._errors = [], [], {}
        if errors:
            raise errors[min(errors)]
        return results


class Cancelled(Exception):
    """A batch given up while it loaded, because its pool stopped (see :meth:`Job.cancel`)."""


class HelpBoard:
    """Which thread workers of a pool are idle, and offers of samples to them.

    Args:
        inboxes: each thread's queue.
        probing: the autotuner waits for its probe: until one is sent (:attr:`probing`
            set False), any idle thread helps with timed samples.
    """

    def __init__(self, inboxes: list[Any], probing: bool = False) -> None:
        self._inboxes = inboxes
        self.helpers = len(inboxes)  # threads 0 .. helpers - 1 help with any job
        self.probing = probing
        self._idle: set[int] = set()
        self._open: list[Job] = []  # jobs with owners working on them
        self._lock = threading.Lock()

    def cancel(self) -> None:
        """Give up the batches being loaded (the pool stops): each thread stops after the
        sample it loads, instead of loading the rest of a batch nobody will take."""
        with self._lock:
            for job in self._open:
                job.cancel()

    def next_message(self, wid: int, inbox: Any) -> Any:
        """Thread ``wid``'s next message, after helping the open jobs."""
        while self._open:
            with self._lock:
                job = next((j for j in self._open if j.left() > 0 and self._may(wid, j)), None)
            if job is None:
                break
            job.work()
        with self._lock:
            self._idle.add(wid)
        msg = inbox.get()
        with self._lock:
            self._idle.discard(wid)
        return msg

    def _may(self, wid: int, job: Job) -> bool:
        return wid < self.helpers or (job.timed and self.probing)

    def map(
        self,
        fn: Callable[[Any], Any],
        items: Iterable[Any],
        timed: bool = False,
        first_done: tuple[Any, float] | None = None,
    ) -> list[Any]:
        """``[fn(x) for x in items]``, with idle threads helping when ``fn`` is slow
        (``timed``: for the probe, see the class docstring); ``first_done``: the first
        item's result and seconds, loaded by the caller already."""
        items = list(items)
        if not items:
            return []
        if first_done is None:
            started = time.perf_counter()
            first_done = (fn(items[0]), time.perf_counter() - started)
        first, seconds = first_done
        if len(items) == 1 or seconds < THREAD_SPLIT_MIN_S:
            return [first] + [fn(x) for x in items[1:]]
        job = Job(fn, items, first, timed)
        with self._lock:
            self._open.append(job)
        try:
            job.work(self._offer)
        finally:
            with self._lock:
                self._open.remove(job)
        return job.results()

    def _offer(self, job: Job) -> None:
        """Hand ``job`` to idle threads, one per sample left beyond the owner's next."""
        if not self._idle:  # read without the lock: a miss only delays the offer a sample
            return
        with self._lock:
            helpers = [w for w in self._idle if self._may(w, job)][: job.left() - 1]
            self._idle.difference_update(helpers)
        for wid in helpers:
            self._inboxes[wid].put(Help(job=job))
