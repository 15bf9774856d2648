"""What the iterator gets of a worker's message: the one place a batch is decoded.

Every pool passes what its workers send through an :class:`Arrivals`: a
:class:`~stoker._engine._messages.Shipped` batch (or group) becomes
:class:`~stoker._engine._messages.Loaded` (or :class:`~stoker._engine._messages.LoadedGroup`),
its data unpacked by the pool (a :class:`Receiver`: views of a shared-memory slot for a
process, the object itself for a thread or in process); a message about a worker's life
(:data:`~stoker._engine._messages.LIFE`) is noted, and only ``Ready`` passed on; a
``Bye``, a worker's last word, goes to the pool (the death that follows says why). The
pool is handed in with each message, never kept: a pool that held it through its
arrivals would be a cycle, kept (with the batches it holds) until the collector runs.
"""

from __future__ import annotations

from typing import Any, Protocol

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


class Receiver(Protocol):
    """What :class:`Arrivals` asks of the pool a message came to."""

    def unpack(self, wid: int, msg: Shipped) -> Any:
        """The data of worker ``wid``'s shipped batch (or group's batches)."""

    def bye(self, wid: int, bye: Bye) -> None:
        """Worker ``wid`` said goodbye (its end is reported next)."""


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
    """

    def __init__(self, init_fn: Any) -> None:
        self.init_name = None
        if init_fn is not None:
            self.init_name = safe_str(getattr(init_fn, "__qualname__", None) or init_fn)
        self.in_init: set[int] = set()

    def take(self, pool: Receiver, wid: int, msg: FromWorker) -> ToIterator | None:
        """What the iterator gets of ``pool``'s worker ``wid``'s ``msg`` (None: nothing)."""
        kind = type(msg)
        if kind is Shipped:
            return loaded(msg, pool.unpack(wid, msg))  # type: ignore[arg-type]
        if kind not in LIFE:
            return msg  # type: ignore[return-value]
        if kind is Ready:
            if self.init_name is not None:
                self.in_init.add(wid)
            return msg  # type: ignore[return-value]  # the iterator's timeout counts from it
        self.in_init.discard(wid)
        if kind is Bye:  # it is leaving; its exit is seen next
            pool.bye(wid, msg)  # type: ignore[arg-type]
        return None

    def doing(self, wid: int) -> str:
        """'' or ' in its worker_init_fn NAME'."""
        return f" in its worker_init_fn {self.init_name}" if wid in self.in_init else ""
