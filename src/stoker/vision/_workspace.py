"""Per-thread scratch memory that outlives the thread: file, decode and batch buffers.

A batch's decode threads live for that batch only (see ``_fused._in_threads``), so memory
kept in a ``threading.local`` would die with them, and the next batch's threads would fault
in fresh pages for every buffer again. Here each thread owns a workspace (a dict) while it
runs; :func:`lend` hands a batch's threads the workspaces that earlier threads returned.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

_local = threading.local()
_free: list[dict[str, Any]] = []
_lock = threading.Lock()
_KEEP = 16
"""At most this many idle workspaces are kept (one per decode thread ever run at once)."""
KEEP_FILE_BYTES = 64 << 20
"""The most file buffers one thread keeps: a batch of typical JPEGs, not of huge ones."""


def workspace() -> dict[str, Any]:
    """The calling thread's workspace: a dict its users keep their reusable memory in."""
    ws: dict[str, Any] | None = getattr(_local, "ws", None)
    if ws is None:
        ws = _local.ws = {}
    return ws


class lend:
    """Workspaces for ``count`` threads about to start: pass :attr:`initializer` to the
    thread pool; when the block ends (the threads joined), the workspaces are kept for the
    next batch's threads."""

    def __init__(self, count: int) -> None:
        with _lock:
            self._spare = [_free.pop() if _free else {} for _ in range(count)]
        self._lent = list(self._spare)

    @property
    def initializer(self) -> Callable[[], None]:
        """Gives the calling thread one of the workspaces."""

        def adopt() -> None:
            with _lock:
                _local.ws = self._spare.pop()

        return adopt

    def __enter__(self) -> lend:
        return self

    def __exit__(self, *exc: object) -> None:
        with _lock:
            room = max(0, _KEEP - len(_free))
            _free.extend(self._lent[:room])


def read(path: str, slot: int) -> memoryview:
    """The bytes of the file ``path``, in this thread's reusable file buffer number ``slot``.

    A batch's files stay alive together until its images are decoded; read as fresh
    ``bytes``, their memory goes back to the OS when the batch ends and every next batch
    faults it in again. The view is valid until this thread reads into ``slot`` again. A
    thread keeps at most :data:`KEEP_FILE_BYTES` of such buffers; files past that are read
    as plain ``bytes``.
    """
    buffers: list[bytearray] = workspace().setdefault("files", [])
    while len(buffers) <= slot:
        buffers.append(bytearray())
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size + 1  # one more byte: sees a file that grew
        if len(buffers[slot]) < size:
            grown = size + (size >> 3)
            if sum(map(len, buffers)) - len(buffers[slot]) + grown > KEEP_FILE_BYTES:
                return memoryview(f.read())
            buffers[slot] = bytearray(grown)
        view, n = memoryview(buffers[slot]), 0
        while n < size and (got := f.readinto(view[n:size])):
            n += got
        if n < size:
            return view[:n]
        return memoryview(bytes(view[:n]) + f.read())  # it grew while we read: all of it
