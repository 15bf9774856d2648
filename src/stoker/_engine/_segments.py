"""The main process's side of shared memory: each worker's segments mapped by name, and
the sweep of segments whose owner died.

:class:`SegmentMaps` maps a segment once and unlinks its name at once, so nothing is left
in ``/dev/shm`` to leak; under fork it hands the segments no live batch uses to the next
pool (:meth:`SegmentMaps.take_unused`). The worker's side is :mod:`stoker._engine._shm`.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import numpy as np

from stoker._engine._shm import NAME_PREFIX, Mapping, map_fd, unlink
from stoker._engine._shm_errors import descriptor_error
from stoker._osprobe import SHM_DIR
from stoker.errors import SharedMemoryError

try:  # POSIX shm_open, as multiprocessing.shared_memory uses it.
    import _posixshmem  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None


class SegmentMaps:
    """The main process's maps of one worker's segments, by name (main process only)."""

    def __init__(self) -> None:
        self._maps: dict[str, Mapping] = {}
        # pin_memory=True with CUDA: registers each mapping as page-locked memory (see
        # stoker._engine._pin.SlotPins); the buffers that hold the registrations, by name.
        self.pins: Any = None
        self._pinned: dict[str, Any] = {}

    def view(self, name: str, size: int) -> np.ndarray[Any, Any]:
        """A fresh uint8 array over the whole segment ``name``; its ``base`` is new too.

        The first call maps the segment and unlinks its name, so nothing remains in
        ``/dev/shm`` once the main process holds it.
        """
        mm = self._maps.get(name)
        if mm is None:
            if _posixshmem is None:  # pragma: no cover
                raise SharedMemoryError("process workers need POSIX shared memory.")
            try:
                fd = _posixshmem.shm_open("/" + name, os.O_RDWR, 0o600)
                try:
                    mm = map_fd(fd, size)  # the consumer reads it all
                finally:
                    os.close(fd)
            except OSError as exc:
                raise descriptor_error(exc, "mapping a batch from a worker") from None
            unlink(name)
            self._maps[name] = mm
        if self.pins is None:
            return np.frombuffer(memoryview(mm), np.uint8)  # a fresh base per batch
        self.pins.poll()
        buf = self._pinned.get(name)
        if buf is None:
            buf = self._pinned[name] = self.pins.register(mm)
        return np.frombuffer(memoryview(buf), np.uint8)  # a fresh base per batch, as above

    def freeing(self, name: str, on_free: Any) -> Any:
        """What to call when the last view of a batch in segment ``name`` dies: ``on_free``,
        or for a registered segment, ``on_free`` once the copies reading it are done."""
        buf = self._pinned.get(name)
        if self.pins is None or buf is None or buf is self._maps.get(name):
            return on_free
        return self.pins.guard(on_free, buf)

    def mapped_bytes(self) -> int:
        """Bytes of the segments mapped now (for ``loader.statistics()``)."""
        return sum(len(mm) for mm in self._maps.values())

    def adopt(self, name: str, mm: Mapping) -> None:
        """Know a segment mapped before (by an earlier pool of the same loader)."""
        self._maps[name] = mm

    def keep(self, name: str, size: int) -> None:
        """Map segment ``name`` as :meth:`view` does, and unlink it, even if it cannot be
        mapped."""
        with contextlib.suppress(OSError):
            self.view(name, size)
        unlink(name)

    def take_unused(self, in_use: set[str]) -> list[tuple[str, Mapping]]:
        """Forget every segment; return those not in ``in_use`` (no live batch views)."""
        out = [(n, mm) for n, mm in self._maps.items() if n not in in_use]
        self._maps.clear()
        self._pinned.clear()
        return out

    def mappings(self, names: set[str]) -> dict[str, Mapping]:
        """The mappings of those of ``names`` mapped now, by name."""
        return {n: self._maps[n] for n in names if n in self._maps}

    def drop(self, names: list[str]) -> None:
        """Forget retired segments (views still alive keep their memory)."""
        for name in names:
            self._maps.pop(name, None)
            self._pinned.pop(name, None)

    def clear(self) -> None:
        """Forget every segment."""
        self._maps.clear()
        self._pinned.clear()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_dead_owners() -> int:
    """Unlink stoker segments whose owner process is dead; returns how many.

    A main process killed with SIGKILL together with its workers cannot clean up; the
    next loader on the machine does.
    """
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    swept = 0
    for name in names:
        if not name.startswith(NAME_PREFIX):
            continue
        pid_text = name[len(NAME_PREFIX) :].split("_", 1)[0]
        if pid_text.isdigit() and not pid_alive(int(pid_text)):
            unlink(name)
            swept += 1
    return swept


def unlink_prefix(prefix: str) -> None:
    """Unlink every segment whose name starts with ``prefix`` (after a worker was killed)."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix):
            unlink(name)
