"""What the iterator gets of a worker's message: the one place a batch is decoded.

Every pool passes what its workers send through an :class:`Arrivals`: a
:class:`~stoker._engine._messages.Shipped` batch (or group) becomes
:class:`~stoker._engine._messages.Loaded` (or :class:`~stoker._engine._messages.LoadedGroup`),
its data unpacked by the pool's own ``unpack`` (views of a shared-memory slot for a process,
the object itself for a thread or in process); a message about a worker's life
(:data:`~stoker._engine._messages.LIFE`) is noted, and only ``Ready`` passed on; a
``Bye``, a worker's last word, goes to the pool's ``on_bye`` (the death that follows says
why).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stoker._engine._errors import safe_str
from stoker._engine._messages import (
    LIFE,
    Bye,
    FromWorker,
    Loaded,
    LoadedGroup,
    Ready,
    Shipped,
    ToIterator,
)

Unpack = Callable[[int, Shipped], Any]
"""A pool's way to the data of worker ``wid``'s shipped batch (or group's batches)."""
OnBye = Callable[[int, Bye], None]
"""What a pool does with worker ``wid``'s goodbye."""


def loaded(msg: Shipped, data: Any) -> Loaded | LoadedGroup:
    """The iterator's record of a shipped batch (a group's, with ``msg.group``)."""
    skipped: Any = msg.skipped  # a group's: one entry per batch
    if msg.group:
        return LoadedGroup(
            generation=msg.generation, idx=msg.idx, batches=data, busy=msg.busy, skipped=skipped
        )
    return Loaded(
        generation=msg.generation,
        idx=msg.idx,
        batch=data,
        busy=msg.busy,
        skipped=skipped,
        untouched=msg.untouched,
    )


class Arrivals:
    """A pool's reading of its workers' messages (module docstring), and which workers are
    in their ``worker_init_fn`` (for the timeout's message).

    Args:
        init_fn: the loader's ``worker_init_fn``, or None.
        unpack: the pool's way to a shipped batch's data.
        on_bye: what the pool does with a worker's goodbye.
    """

    def __init__(self, init_fn: Any, unpack: Unpack, on_bye: OnBye) -> None:
        self.init_name = None
        if init_fn is not None:
            self.init_name = safe_str(getattr(init_fn, "__qualname__", None) or init_fn)
        self.in_init: set[int] = set()
        self._unpack, self._on_bye = unpack, on_bye

    def take(self, wid: int, msg: FromWorker) -> ToIterator | None:
        """What the iterator gets of worker ``wid``'s ``msg`` (None: nothing)."""
        kind = type(msg)
        if kind is Shipped:
            return loaded(msg, self._unpack(wid, msg))  # type: ignore[arg-type]
        if kind not in LIFE:
            return msg  # type: ignore[return-value]
        if kind is Ready:
            if self.init_name is not None:
                self.in_init.add(wid)
            return msg  # type: ignore[return-value]  # the iterator's timeout counts from it
        self.in_init.discard(wid)
        if kind is Bye:  # it is leaving; its exit is seen next
            self._on_bye(wid, msg)  # type: ignore[arg-type]
        return None

    def doing(self, wid: int) -> str:
        """'' or ' in its worker_init_fn NAME'."""
        return f" in its worker_init_fn {self.init_name}" if wid in self.in_init else ""
