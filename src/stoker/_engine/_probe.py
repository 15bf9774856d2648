"""A worker's timing of its first samples, sent before their batch is done.

The autotuner must size the pool within an epoch's first batch (an epoch may have only a
few), so a worker asked to (``WorkerArgs.probe``) times each sample of its epoch's first
batch: wall time, and CPU time on its thread. The first runs alone; idle thread workers
may help with the next ones, and the CPU those get side by side tells whether the fetch
releases the GIL. The first sample needs all of its wall time as CPU if its thread never
blocked: the rest was a wait for a CPU other programs held, not for data. After
:data:`~stoker._policy.PROBE_SAMPLES` samples (or the batch's end, for a dataset that
loads a batch at once) one :class:`~stoker._engine._messages.Probe` goes out; none if one
of the first samples raised (a switch of mode would drop that error).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from stoker._engine._messages import Probe
from stoker._osprobe import thread_blocks
from stoker._policy import PROBE_SAMPLES

_Mark = tuple[float, float, int | None]


def _mark() -> _Mark:
    return time.perf_counter(), time.thread_time(), thread_blocks()


def _spent(since: _Mark) -> tuple[float, float, float]:
    """Wall and CPU seconds of this thread since ``since``: the CPU it needed (all of the
    wall time if it never blocked), and the CPU it got."""
    wall, got = time.perf_counter() - since[0], time.thread_time() - since[1]
    blocks = thread_blocks()
    needed = wall if since[2] is not None and blocks == since[2] else got
    return wall, needed, got


class SampleTimer:
    """Times the samples of one batch until a probe is sent (thread-safe: helpers call it)."""

    def __init__(self, send: Callable[[Any], None], generation: int, batch_len: int) -> None:
        self._send = send
        self._generation = generation
        self._batch_len = batch_len
        self._lock = threading.Lock()
        self._first: tuple[float, float] | None = None  # (wall, cpu) of the first sample
        self._rest = [0.0, 0.0]  # wall, cpu of the samples after it
        self._threads: set[int] = set()
        self._count = 0
        self._nbytes = 0
        self._sent = False
        self._failed = False  # one of its samples raised
        self._started = 0  # samples taken (numbered in the order they were taken)
        self._running: set[int] = set()  # the numbers of those still loading
        self._start = _mark()

    def wrap(self, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``fn`` (a dataset's ``__getitem__``), timed while the probe is open."""

        def timed(i: Any) -> Any:
            if self._sent:
                return fn(i)
            with self._lock:
                seq, self._started = self._started, self._started + 1
                self._running.add(seq)
            since = _mark()
            try:
                out = fn(i)
            except BaseException:
                # No probe then: a switch of mode would drop the batch, and this error
                # with it (a sample that fails once would load on the other side).
                with self._lock:
                    self._failed = True  # finish() still sends for a batch that skips it
                    self._running.discard(seq)
                raise
            self._add(seq, *_spent(since), out)
            return out

        return timed

    def map_fn(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        """A fetcher's ``map_fn`` for a worker whose samples load one after another."""
        timed = self.wrap(fn)
        return [timed(i) for i in items]

    def finish(self) -> None:
        """The batch is loaded: send the probe now if its samples could not be timed one
        by one (a dataset's ``__getitems__``), from the whole batch's times."""
        with self._lock:
            if self._sent:
                return
            self._sent = True
            wall, cpu, _ = _spent(self._start)
            n = max(1, self._batch_len)
        self._send(
            Probe(
                generation=self._generation,
                samples=n,
                wall=wall / n,
                cpu=cpu / n,
                rest_wall=0.0,
                rest_cpu=0.0,
                threads=1,
                batch_len=self._batch_len,
                nbytes=0,
            )
        )

    def _add(self, seq: int, wall: float, cpu: float, got: float, out: Any) -> None:
        with self._lock:
            self._running.discard(seq)
            if self._sent or self._failed:
                return
            self._count += 1
            if self._first is None:
                self._first = (wall, cpu)
                self._nbytes = leaf_bytes(out)
            else:
                self._rest[0] += wall
                self._rest[1] += got  # side by side: threads that preempt each other gain no more
                self._threads.add(threading.get_ident())
            target = min(PROBE_SAMPLES, self._batch_len)
            if self._count < target or any(s < target for s in self._running):
                return  # the first samples taken are not all in: one may yet raise
            self._sent = True
            first, (rest_wall, rest_cpu) = self._first, self._rest
            threads = max(1, len(self._threads))
        n = self._count - 1
        self._send(
            Probe(
                generation=self._generation,
                samples=self._count,
                wall=first[0],
                cpu=first[1],
                rest_wall=rest_wall / n if n else 0.0,
                rest_cpu=rest_cpu / n if n else 0.0,
                threads=threads,
                batch_len=self._batch_len,
                nbytes=self._nbytes,
            )
        )


def leaf_bytes(sample: Any, depth: int = 3) -> int:
    """Bytes of a sample's arrays, tensors and bytes (nested tuples, lists and dicts).

    >>> leaf_bytes((np.zeros(4, np.float32), 3, {"b": b"xy"}))
    26
    """
    if isinstance(sample, (bytes, bytearray, memoryview)):
        return len(sample)
    nbytes = getattr(sample, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if depth and isinstance(sample, (tuple, list)):
        return sum(leaf_bytes(x, depth - 1) for x in sample)
    if depth and isinstance(sample, dict):
        return sum(leaf_bytes(x, depth - 1) for x in sample.values())
    return 0 if not isinstance(sample, (int, float)) else 8
