"""Thread workers deterministic when a dataset draws from the global RNGs.

Threads share Python's, NumPy's and torch's global RNGs; :class:`RngGuard` decides, at each
epoch's start, whether a dataset draws from them, and if it does fetches its batches seeded,
one at a time. See ``docs/engine.md``, "Thread mode and RNGs".
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from stoker import _torch
from stoker._random import call_seeded

_NEW_EPOCH_WAIT_S = 1.0
"""How long a new epoch of persistent thread workers waits for a seeded fetch still in
flight; past it, the last epoch's decision on whether the dataset draws stands."""


class RngGuard:
    """Keeps thread workers deterministic when a dataset draws from the global RNGs.

    Threads share Python's, NumPy's and torch's global RNGs, so a batch gets its own
    (seed, epoch, k) stream only if no other thread draws meanwhile. At each epoch's start,
    until the dataset shows whether it draws, batches are fetched in parallel, unseeded,
    with the RNG states compared around each fetch: a fetch that moved none stands and the
    epoch goes on in parallel; once one moved, that batch and the rest of the epoch are
    fetched again seeded, under one process-wide lock, one at a time. Checking every fetch
    would make every batch serial, as the training loop's own draws would count as the
    dataset's. Process workers have no such limits; see ``docs/engine.md``, "Thread mode
    and RNGs".

    Worker threads call :meth:`fetch`; the main thread calls :meth:`new_epoch` before it
    sends an epoch's tasks.
    """

    lock = threading.Lock()

    def __init__(self) -> None:
        self.serial: bool | None = None  # None until a fetch of this epoch tells
        self._cond = threading.Condition()
        self._unseeded = 0  # unseeded fetches in flight; seeded ones wait for them

    def new_epoch(self) -> None:
        """Decide again: the dataset may start (or stop) drawing in the next epoch. Waits
        for a seeded fetch in flight (of the epoch before), at most ``_NEW_EPOCH_WAIT_S``:
        past that (a stuck dataset), the last epoch's decision stands."""
        if not self.lock.acquire(timeout=_NEW_EPOCH_WAIT_S):
            return
        try:
            with self._cond:
                self.serial = None
        finally:
            self.lock.release()

    def fetch(
        self, fetch: Callable[[Any], Any], task: Any, seed: int, seeded: Callable[[Any], Any]
    ) -> Any:
        """``fetch(task)``, or ``seeded(task)`` with the global RNGs seeded from ``seed``
        for it alone (``seeded`` must not use other threads: they would draw out of order).
        """
        with self._cond:
            mode = self.serial  # None: probe, False: plain, True: seeded
            self._unseeded += mode is not True
        if mode is not True:
            moved = True
            try:
                before = _rng_states() if mode is None else None
                data = fetch(task)
                moved = before is not None and _rng_states() != before
            finally:
                with self._cond:
                    self._unseeded -= 1
                    if mode is None and (moved or self.serial is None):
                        self.serial = moved  # a draw seen anywhere makes the epoch serial
                    self._cond.notify_all()
            if not moved:  # nothing drew while it ran: the batch does not depend on it
                return data
        with self._cond:  # no unseeded fetch may draw from a seeded batch's stream
            self._cond.wait_for(lambda: self._unseeded == 0)
        with self.lock:  # the main thread's streams go on after it (as in process)
            return call_seeded(seed, seeded, task)


def _rng_states() -> tuple[Any, ...]:
    np_state: Any = np.random.get_state()
    torch = _torch.loaded()
    return (
        random.getstate(),
        np_state[1].tobytes(),
        np_state[2],
        bytes(torch.default_generator.get_state().numpy()) if torch is not None else None,
    )
