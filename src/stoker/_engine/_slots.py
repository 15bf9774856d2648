"""The main process's books of one worker process's shared-memory slots.

A :class:`SlotBook` maps the segments a worker's batches arrive in
(:class:`~stoker._engine._segments.SegmentMaps`), decodes each batch as views of its slot,
and notes when the last view of a slot's batch dies, so the slot id goes back to its
worker (with its next message, or at once for big slots). At a fork pool's shutdown, the
slots still out are kept for the loader's next workers once their batches die (``late``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from stoker._engine._messages import Bye, Shipped
from stoker._engine._segments import SegmentMaps
from stoker._engine._transport import decode
from stoker._policy import EAGER_FREE_BYTES

Warm = list[tuple[str, Any]]
"""Segments kept mapped for the next pool's workers: (name, mapping)."""


class SlotBook:
    """One worker process's slots as the main process sees them (module docstring)."""

    def __init__(self) -> None:
        self.maps = SegmentMaps()
        self.freed: list[int] = []  # slot ids whose views died; appended by finalizers
        self.big_slots = False  # its slots are big enough to return them eagerly
        self.out: dict[int, str] = {}  # slot id -> segment name, while views of it live
        self.late: dict[int, tuple[str, Any]] = {}  # out at shutdown: warm once freed
        self.memory_ref: Callable[[], Any] | None = None  # the loader's EngineMemory, for late

    def keep_left(self, bye: Bye) -> None:
        """Map (and so unlink) the slots a leaving worker handed over with its goodbye."""
        for name, size in bye.kept or ():
            self.maps.keep(name, size)

    def unpack(self, msg: Shipped) -> Any:
        """The batch (or group's batches) of ``msg``, views of its slot (see :meth:`on_free`)."""
        if msg.retired:
            self.maps.drop(msg.retired)
        slot = msg.slot
        if slot is not None:
            self.big_slots = slot[2] >= EAGER_FREE_BYTES
            self.out[slot[0]] = slot[1]
        return decode(slot, msg.payload, self.maps, self.on_free)

    def take_freed(self) -> list[int]:
        """Slot ids freed since the last call (for the next message to this worker)."""
        freed = self.freed
        n = len(freed)
        out = freed[:n]
        del freed[:n]  # finalizers may append concurrently: keep what came after
        return out

    def wants_flush(self) -> bool:
        """Whether freed slots are big enough to send home before the next tasks."""
        return bool(self.freed) and self.big_slots

    def on_free(self, sid: int) -> None:
        """The last view of slot ``sid``'s batch died (a finalizer, any thread)."""
        self.out.pop(sid, None)
        self.freed.append(sid)
        late = self.late.pop(sid, None) if self.late else None
        memory = self.memory_ref() if late is not None and self.memory_ref else None
        if late is not None and memory is not None:  # an epoch's last batch died after it
            with contextlib.suppress(Exception):
                memory.warm.append(late)

    def hand_on(self, memory_ref: Callable[[], Any]) -> Warm:
        """At a fork pool's shutdown (the worker writes no more): the segments no batch
        uses, for the next pool's workers; those still out follow as their batches die."""
        out = dict(self.out)
        mapped = self.maps.mappings(set(out.values()))
        self.late = {sid: (n, mapped[n]) for sid, n in out.items() if n in mapped}
        self.memory_ref = memory_ref
        return self.maps.take_unused(set(out.values()))
