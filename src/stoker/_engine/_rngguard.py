"""Thread workers deterministic when a dataset draws from the global RNGs.

Threads share Python's, NumPy's and torch's global RNGs; :class:`RngGuard` decides, at each
epoch's start, whether a dataset draws from them, and if it does fetches its batches seeded,
one at a time. See ``docs/engine.md``, "Thread mode and RNGs".
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from stoker import _torch
from stoker._policy import DECIDE_WAIT_S
from stoker._random import call_seeded

MapFn = Callable[[Callable[[Any], Any], list[Any]], list[Any]]
"""A fetcher's ``map_fn``: ``[fn(x) for x in items]``, in some way."""
RestMap = Callable[[Callable[[Any], Any], list[Any], tuple[Any, float]], list[Any]]
"""``[fn(x) for x in items]`` given the first item's result and seconds (idle threads
helping, see :meth:`stoker._engine._split.HelpBoard.map`)."""
Wrap = Callable[[Callable[[Any], Any]], Callable[[Any], Any]]
"""What times a sample's load (the autotuner's probe)."""

_NEW_EPOCH_WAIT_S = 1.0
"""How long a new epoch of persistent thread workers waits for a seeded fetch still in
flight; past it, the last epoch's decision on whether the dataset draws stands."""


class _Role(NamedTuple):
    """How one fetch goes ("probe", "plain", "beside" or "seeded", see
    :meth:`RngGuard._role`), and the count of the probe's writes when that was decided."""

    kind: str
    writes: int


class RngGuard:
    """Keeps thread workers deterministic when a dataset draws from the global RNGs.

    Threads share Python's, NumPy's and torch's global RNGs, so a batch gets its own
    (seed, epoch, k) stream only if no other thread draws meanwhile. At each epoch's start
    one batch, the probe, is fetched seeded under one process-wide lock, the RNG states
    compared around its first sample, while the other threads wait for the answer
    (at most :data:`DECIDE_WAIT_S`; past it they fetch beside it, comparing the states
    themselves, and are fetched again, seeded, if the dataset draws). If no state moved,
    the rest loads in parallel, unseeded; else the probe goes on in its seeded stream and
    the epoch is fetched seeded, one batch at a time. Each sample loads once. See
    ``docs/engine.md``, "Thread mode and RNGs".

    Worker threads call :meth:`fetch`; the pool calls :meth:`new_epoch` before it sends an
    epoch's tasks.
    """

    lock = threading.Lock()

    def __init__(self) -> None:
        self.serial: bool | None = None  # None until a fetch of this epoch tells
        self._cond = threading.Condition()
        self._unseeded = 0  # unseeded fetches in flight; seeded ones wait for them
        self._probing = False  # the probe is running
        self._crowded = False  # fetches ran unseeded beside the probe
        # Starts and ends of the probe's writes to the global RNGs (seeding them as it
        # begins, handing them back as it ends): odd while one is under way. A fetch beside
        # the probe that sees a state move blames the dataset only if none overlapped it.
        self._writes = 0

    def new_epoch(self) -> None:
        """Decide again: the dataset may start (or stop) drawing in the next epoch. Waits
        for a seeded fetch in flight (of the epoch before), at most ``_NEW_EPOCH_WAIT_S``:
        past that (a stuck dataset), the last epoch's decision stands."""
        if not self.lock.acquire(timeout=_NEW_EPOCH_WAIT_S):
            return
        try:
            with self._cond:
                self.serial, self._crowded = None, False
        finally:
            self.lock.release()

    def fetch(
        self,
        fetch: Callable[[Any], Any],
        task: Any,
        seed: int,
        seeded: Callable[[Any], Any],
        probing: Callable[[Any], Any] | None = None,
    ) -> Any:
        """``fetch(task)`` in parallel where the dataset leaves the global RNGs alone, else
        ``seeded(task)`` with them seeded from ``seed`` for it alone (``seeded`` must not
        use other threads: they would draw out of order). ``probing`` fetches the probe,
        seeded: a fetch whose ``map_fn`` is :meth:`deciding`."""
        role = self._role()
        if role.kind == "probe":
            try:
                with self.lock:  # the main thread's streams go on after it (as in process)
                    self._wrote()  # call_seeded draws from them and seeds them...
                    data = call_seeded(seed, self._probe, probing or seeded, task)
            finally:
                with self._cond:
                    self._writes += 1  # ...and hands them back (that write began in _probe)
                    self._probing = False
                    self._cond.notify_all()
            if not (self._crowded and self.serial):  # else others drew beside it
                return data
        elif role.kind == "beside":
            data, stands = self._beside(fetch, task, role.writes)
            if stands:
                return data
        elif role.kind == "plain":
            data = self._unseeded_fetch(fetch, task)
            if self.serial is False:  # the dataset draws nothing: the batch stands
                return data
        with self._cond:  # no unseeded fetch may draw from a seeded batch's stream
            self._cond.wait_for(lambda: self._unseeded == 0)
        with self.lock:
            return call_seeded(seed, seeded, task)

    def _role(self) -> _Role:
        """How this fetch goes: "probe" (the first of an epoch), "plain" (the dataset
        draws nothing), "beside" (a probe that took too long) or "seeded"; with the count
        of the probe's writes as it was decided (see :meth:`_beside`)."""
        with self._cond:
            if (
                self.serial is None
                and self._probing
                and not self._cond.wait_for(self._decided, DECIDE_WAIT_S)
            ):
                self._crowded = True
                self._unseeded += 1
                return _Role("beside", self._writes)
            if self.serial is None and not self._probing:
                self._probing, self._crowded = True, False
                return _Role("probe", self._writes)
            if self.serial is True:
                return _Role("seeded", self._writes)
            self._unseeded += 1
            return _Role("plain", self._writes)

    def _decided(self) -> bool:
        """Whether the epoch's probe told if the dataset draws, or ended without telling."""
        return self.serial is not None or not self._probing

    def _wrote(self) -> None:
        """Counts a start or an end of the probe's writes to the global RNGs."""
        with self._cond:
            self._writes += 1

    def _unseeded_fetch(self, fetch: Callable[[Any], Any], task: Any) -> Any:
        """``fetch(task)`` unseeded, counted while it runs (seeded fetches wait for it)."""
        try:
            return fetch(task)
        finally:
            with self._cond:
                self._unseeded -= 1
                self._cond.notify_all()

    def _beside(self, fetch: Callable[[Any], Any], task: Any, writes: int) -> tuple[Any, bool]:
        """``fetch(task)`` unseeded beside a probe that took too long, and whether its
        batch stands: it moved no RNG state, or a write of the probe (``writes`` counts
        them when this fetch was decided) may have and the probe found that the dataset
        draws nothing. A move of its own means the dataset draws: the epoch goes serial,
        and the batch is fetched again."""
        before = _rng_states()
        data = self._unseeded_fetch(fetch, task)
        if _rng_states() == before:
            return data, True
        with self._cond:
            if self._writes == writes and writes % 2 == 0:  # no write of the probe overlapped
                self.serial = True
                self._cond.notify_all()
                return data, False
            # The probe decides after its first sample, which may have been waiting for this
            # fetch: wait for it a little; undecided, the batch is fetched again, seeded.
            self._cond.wait_for(self._decided, DECIDE_WAIT_S)
            return data, self.serial is False

    def _probe(self, probing: Callable[[Any], Any], task: Any) -> Any:
        """The probe's fetch, the global RNGs seeded: it decides after its first sample
        (see :meth:`deciding`), or, where samples load together, after the whole fetch."""
        self._wrote()  # the streams are seeded: the write call_seeded began has ended
        before = _rng_states()
        try:
            data = probing(task)
            if self.serial is None:  # no sample decided (``__getitems__``): the whole fetch does
                self._decide(_rng_states() != before)
        finally:
            self._wrote()  # call_seeded hands the streams back next
        return data

    def deciding(self, rest_map: RestMap, wrap: Wrap | None = None) -> MapFn:
        """A fetcher's ``map_fn`` for the probe: its first sample (through ``wrap``, if
        given) decides; if it left the global RNGs alone, the dataset is taken to draw
        nothing and the rest load by ``rest_map`` (idle threads helping), else one by one,
        on in the batch's seeded stream, as in process."""

        def map_fn(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
            one = fn if wrap is None else wrap(fn)
            if not items:
                return []
            before, started = _rng_states(), time.perf_counter()
            first = one(items[0])
            seconds = time.perf_counter() - started
            moved = _rng_states() != before
            self._decide(moved)
            if moved:
                return [first, *(one(i) for i in items[1:])]
            return rest_map(fn, items, (first, seconds))

        return map_fn

    def _decide(self, draws: bool) -> None:
        with self._cond:
            if self.serial is None or draws:  # a draw seen anywhere makes the epoch serial
                self.serial = draws
            self._cond.notify_all()


def _rng_states() -> tuple[Any, ...]:
    np_state: Any = np.random.get_state()
    torch = _torch.loaded()
    return (
        random.getstate(),
        np_state[1].tobytes(),
        np_state[2],
        bytes(torch.default_generator.get_state().numpy()) if torch is not None else None,
    )
