"""Shared-memory segments: the per-worker arena of reusable slots, and the main side's maps.

A worker owns an :class:`Arena` of slots, each one POSIX shared-memory segment named
``stoker_<owner pid>_<loader token>_<worker id>_<sequence>`` (the owner is the main
process). Collate writes a batch straight into a slot (:meth:`Arena.alloc`); the main
process maps the segment once (:class:`~stoker._engine._segments.SegmentMaps`) and
*unlinks its name at once*, so
nothing is left in ``/dev/shm`` to leak. When the last view of a batch dies, the slot id
goes back to the worker, which reuses the slot. Under fork, segments no live batch uses
outlive their pool (``SegmentMaps.take_unused``) and the loader's next workers adopt them
as free slots (``Arena.adopt``, ``Arena.hand_off``), so fresh workers need no fresh
shared memory.

Who calls what, in the worker and in the main process: ``docs/engine.md``, "Slots and
arena".
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import math
import mmap
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker._engine._shm_errors import descriptor_error, shm_error, unwritable_error
from stoker._osprobe import SHM_DIR
from stoker._policy import KEEP_FREE_BYTES, SPARE_MIN_BYTES
from stoker.errors import SharedMemoryError

try:  # POSIX shm_open / shm_unlink, as multiprocessing.shared_memory uses them.
    import _posixshmem  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None

NAME_PREFIX = "stoker_"
ALIGN = 64
"""Leaves start on 64-byte boundaries (cache lines; enough for every dtype and SIMD)."""
_PAGE = mmap.PAGESIZE
_FIRST_SLOT_HEADROOM = 64 * 1024
_SPARE_JOIN_TIMEOUT_S = 60.0
"""How long a batch waits for a slot that a helper thread is making."""
_AT_EXIT: list[Any] = []
"""Slots left for the worker's exit to unmap (see :meth:`Arena.close`)."""
# Map slots with their pages already in place: the worker writes every byte of a slot, and
# one populate call is far cheaper than a page fault per 4 KiB.
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
_MADV_POPULATE_READ = 22
"""Linux 5.14+: map a range's existing pages in one call. fork() does not copy the page
table entries of shared mappings, so a worker's inherited slots would otherwise fault on
every page, at far more cost than the one call."""


Mapping = Any
"""A mapped segment: a ctypes byte array over the mapping, which it unmaps when it dies
(every view holds it). Unlike ``mmap.mmap`` (which keeps a duplicate descriptor until
Python 3.13's ``trackfd``), it holds no file descriptor: batches kept alive cost none."""

_LIBC: Any = None


def _libc() -> Any:
    """libc's mmap, munmap and madvise, typed (loaded once)."""
    global _LIBC
    if _LIBC is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        c_int = ctypes.c_int
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, c_int, c_int, c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _LIBC = libc
    return _LIBC


def map_fd(fd: int, size: int) -> Mapping:
    """Map ``size`` bytes of segment ``fd`` shared, its pages in place; the caller closes
    ``fd`` (the mapping needs it no more).

    Raises:
        OSError: the mapping failed (``errno`` set).
    """
    libc = _libc()
    addr = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, _MAP_FLAGS, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    buf = (ctypes.c_uint8 * size).from_address(addr)
    unmap = weakref.finalize(buf, libc.munmap, addr, size)
    unmap.atexit = False  # at exit the process's mappings go with it; views may remain
    return buf


def _populate(mm: Mapping) -> None:
    """Map the pages of an inherited segment in one call (a no-op on older kernels)."""
    _libc().madvise(ctypes.addressof(mm), len(mm), _MADV_POPULATE_READ)


def round_up(n: int, to: int) -> int:
    """``n`` rounded up to a multiple of ``to``.

    >>> round_up(65, 64), round_up(64, 64), round_up(0, 64)
    (128, 64, 0)
    """
    return -(-n // to) * to


def segment_prefix(owner_pid: int, token: str, worker_id: int) -> str:
    """The name prefix of one worker's segments.

    >>> segment_prefix(12, "ab", 3)
    'stoker_12_ab_3_'
    """
    return f"{NAME_PREFIX}{owner_pid}_{token}_{worker_id}_"


def unlink(name: str) -> None:
    """Unlink segment ``name`` (its mappings stay valid); nothing if it is gone."""
    if _posixshmem is None:  # pragma: no cover
        return
    # Read-only: the segment was never made. Nothing a worker's exit can do about either.
    with contextlib.suppress(OSError):
        _posixshmem.shm_unlink("/" + name)


@dataclass
class Slot:
    """One segment of a worker's arena (worker side)."""

    id: int
    name: str
    size: int
    mm: Mapping
    buf: np.ndarray[Any, Any]
    addr: int
    used: int = 0
    cold: bool = False  # inherited through fork: its pages are not mapped here yet
    sent: bool = False  # the main process has seen it (a batch in it, or adopted)


@dataclass
class Arena:
    """A worker's reusable shared-memory slots (used in the worker process only).

    Args:
        prefix: the segment name prefix (:func:`segment_prefix`).
        keep_free: free slots kept for reuse; more are retired (memory bound).
        window: how many slots the whole loader keeps in flight, for error messages.
        steady: how many slots the worker needs once batches flow (its prefetched
            batches, the one the user holds, the one being written); slots are made
            ahead only below it.
        workers: how many workers share the window, for error messages.
    """

    prefix: str
    keep_free: int
    window: int = 1
    steady: int = 4
    workers: int = 1
    slots: dict[int, Slot] = field(default_factory=dict)
    free: list[int] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    hint: int = 0
    current: Slot | None = None
    placed: dict[int, tuple[np.ndarray[Any, Any], int]] = field(default_factory=dict)
    """The arrays :meth:`alloc` made in the current slot, by id: (array, offset)."""
    _seq: int = 0
    _spare: _SpareSlot | None = None

    # -- a batch's life ----------------------------------------------------------------

    def begin(self, ahead: bool = True) -> None:
        """Pick the slot the next batch is written into (none before the first batch).

        When no free slot is left after that, another task waits (``ahead``) and the worker
        has fewer slots than it needs in steady state, the next slot is made in a background
        thread while this batch is fetched: a fresh slot costs page faults that would otherwise
        delay the batch after this one. Otherwise a slot
        usually comes back first, and a spare would only cost memory.
        """
        self.placed.clear()
        self.current = self._take(self.hint) if self.hint else None
        if (
            ahead
            and self.hint >= SPARE_MIN_BYTES
            and not self.free
            and self._spare is None
            and len(self.slots) < self.steady
        ):
            # Known to close() before its thread runs, even if a signal interrupts start().
            self._spare = _SpareSlot(self, self.hint)
            self._spare.start()

    def alloc(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        """Memory for one collated leaf: in the current slot, or private when it is full."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if self.current is None and self.hint == 0 and nbytes:
            # The first batch of this worker: its size is unknown until collate ends, so
            # guess from its first leaf; a wrong guess costs one copy (see encode()).
            self.current = self._create(nbytes + nbytes // 4 + _FIRST_SLOT_HEADROOM)
        got = self._reserve(nbytes)
        if got is None:
            return np.empty(shape, dtype)
        slot, start = got
        arr = np.ndarray(shape, dtype, slot.buf, start)
        self.placed[id(arr)] = (arr, start)  # the transport finds it here, not by address
        return arr

    def bump(self, nbytes: int) -> np.ndarray[Any, Any] | None:
        """``nbytes`` of the current slot as a uint8 array, or None when they do not fit."""
        got = self._reserve(nbytes)
        if got is None:
            return None
        slot, start = got
        return slot.buf[start : start + nbytes]

    def _reserve(self, nbytes: int) -> tuple[Slot, int] | None:
        """The current slot and the offset of ``nbytes`` taken from it, or None when they
        do not fit (the next leaf starts on an ``ALIGN`` boundary)."""
        slot = self.current
        if slot is None or slot.used + nbytes > slot.size:
            return None
        start = slot.used
        slot.used = round_up(start + nbytes, ALIGN)
        return slot, start

    def offset_of(self, addr: int, nbytes: int) -> int | None:
        """The offset of memory at ``addr`` inside the current slot, or None if outside."""
        slot = self.current
        if slot is None or not slot.addr <= addr or addr + nbytes > slot.addr + slot.used:
            return None
        return addr - slot.addr

    def regrow(self, needed: int) -> None:
        """Replace the current slot by one of at least ``needed`` bytes (empty)."""
        self.hint = max(self.hint, round_up(needed + needed // 8, _PAGE))
        if self.current is not None:
            self._give_back(self.current.id)
        self.placed.clear()
        self.current = self._take(self.hint)

    def finish(self) -> tuple[int, str, int] | None:
        """The current slot's (id, name, size), now owned by the main process, or None."""
        slot, self.current = self.current, None
        self.placed.clear()
        if slot is None:
            return None
        self.hint = max(self.hint, round_up(slot.used, _PAGE))
        slot.sent = True
        return slot.id, slot.name, slot.size

    def hand_off(self) -> list[tuple[str, int]]:
        """The free slots the main process never saw (made ahead, not yet used), as
        ``(name, size)``: :meth:`close` leaves their names for the main process to keep
        for the loader's next workers, as it keeps the slots it saw."""
        spare = self._spare
        if spare is not None and spare.made():
            self._spare = None
            slot = self.slots[spare.sid] = spare.result()
            self.free.append(slot.id)
        out = [(s.name, s.size) for s in map(self.slots.__getitem__, self.free) if not s.sent]
        for name, _ in out:
            self.names.discard(name)
        return out

    def leave_sent(self) -> list[tuple[str, int]]:
        """The slots sent to the main process and not given back, as ``(name, size)``:
        :meth:`close` leaves their names, for a worker that ends early while the main
        process may not have mapped its last batches yet (it unlinks them once it has)."""
        out = [
            (s.name, s.size)
            for sid, s in self.slots.items()
            if s.sent and s.name in self.names and sid not in self.free
        ]
        for name, _ in out:
            self.names.discard(name)
        return out

    def abort(self) -> None:
        """Give the current slot back after a failed batch."""
        if self.current is not None:
            self._give_back(self.current.id)
        self.placed.clear()
        self.current = None

    def release(self, slot_ids: list[int]) -> None:
        """Slots whose views all died in the main process are free again."""
        for sid in slot_ids:
            if sid in self.slots:
                self._give_back(sid)

    def adopt(self, segments: list[tuple[str, Mapping]]) -> None:
        """Take over segments of an earlier worker of the same loader (unlinked, their
        memory allocated; inherited through fork), as free slots; a slot's pages are
        mapped in one call when it is first taken (fork does not carry them over)."""
        for name, mm in segments:
            self._seq += 1
            buf = np.frombuffer(mm, np.uint8)
            slot = Slot(self._seq, name, len(mm), mm, buf, buf.ctypes.data, cold=True, sent=True)
            self.slots[self._seq] = slot
            self.free.append(self._seq)
        if segments and not self.hint:
            # Every one of them held a batch: the next batches fit (else encode regrows).
            self.hint = min(len(mm) for _, mm in segments)

    def take_retired(self) -> list[str]:
        """Names of segments retired since the last call (the main side drops its maps)."""
        out, self.retired = self.retired, []
        return out

    def close(self) -> None:
        """Unmap every slot and unlink every name (names the main side unlinked are gone)."""
        spare, self._spare = self._spare, None
        if spare is not None:
            spare.cancel()
        for name in self.names:
            unlink(name)
        self.names.clear()
        if spare is not None:
            # Unmapping now would wait for the spare's mapping (the kernel's mmap lock);
            # the worker exits next, and exit drops every mapping at once.
            _AT_EXIT.append(self.slots)
            self.slots = {}
        self.slots.clear()
        self.free.clear()
        self.placed.clear()
        self.current = None

    # -- slots -------------------------------------------------------------------------

    def _take(self, size: int) -> Slot:
        while self.free:
            slot = self.slots[self.free.pop()]
            if slot.size >= size:
                slot.used = 0
                if slot.cold:
                    _populate(slot.mm)
                    slot.cold = False
                return slot
            self._retire(slot.id)
        spare, self._spare = self._spare, None
        if spare is not None:
            slot = spare.result()
            self.slots[slot.id] = slot
            if slot.size >= size:
                return slot
            self._retire(slot.id)
        return self._create(size)

    def _give_back(self, sid: int) -> None:
        slot = self.slots[sid]
        many = len(self.free) >= self.keep_free
        if slot.size < self.hint or (many and (len(self.free) + 1) * slot.size > KEEP_FREE_BYTES):
            self._retire(sid)
        else:
            self.free.append(sid)

    def _retire(self, sid: int) -> None:
        slot = self.slots.pop(sid)
        unlink(slot.name)
        self.names.discard(slot.name)
        self.retired.append(slot.name)

    def _create(self, size: int) -> Slot:
        slot = self._make(*self._next_name(size))
        self.slots[slot.id] = slot
        return slot

    def _next_name(self, size: int) -> tuple[int, str, int]:
        self._seq += 1
        name = f"{self.prefix}{self._seq}"
        # Known before the segment exists: a signal during creation cannot leak it.
        self.names.add(name)
        return self._seq, name, max(round_up(size, _PAGE), _PAGE)

    def _make(self, sid: int, name: str, size: int, fd: int | None = None) -> Slot:
        """Create (unless ``fd`` is the segment, just created), reserve and map one
        segment; safe to run in a helper thread."""
        if fd is None:
            fd = _create(name)
        try:
            try:
                # Reserve the pages now: tmpfs otherwise over-commits, and the first write
                # beyond /dev/shm's size kills the worker with SIGBUS (PyTorch issue 5040).
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                unlink(name)
                if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
                    raise shm_error(size, self.workers, self.window) from None
                raise
            mm = map_fd(fd, size)  # needs no new descriptor: fails only for memory
        finally:
            os.close(fd)
        buf = np.frombuffer(mm, np.uint8)
        return Slot(sid, name, size, mm, buf, buf.ctypes.data)


def _create(name: str) -> int:
    """A new segment ``name``, as a descriptor."""
    if _posixshmem is None:  # pragma: no cover
        raise SharedMemoryError("process workers need POSIX shared memory.")
    try:
        fd: int = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise descriptor_error(exc, "creating a batch's shared-memory slot") from None
        found = unwritable_error()
        raise found or SharedMemoryError(
            f"process workers hand batches over in shared memory ({SHM_DIR}), but a segment "
            f"cannot be made there ({exc.strerror}). Fix: make {SHM_DIR} writable, or use "
            "worker_mode='thread' or num_workers=0."
        ) from None
    return fd


class _SpareSlot:
    """A slot being made in a helper thread of the worker (see :meth:`Arena.begin`)."""

    def __init__(self, arena: Arena, size: int) -> None:
        self.sid, self.name, size = arena._next_name(size)
        self._slot: Slot | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()  # orders the segment's creation and cancel()
        self._cancelled = False
        self._thread = threading.Thread(
            target=self._run, args=(arena, size), name="stoker-spare-slot", daemon=True
        )

    def start(self) -> None:
        """Start making the slot."""
        self._thread.start()

    def _run(self, arena: Arena, size: int) -> None:
        try:
            with self._lock:
                if self._cancelled:
                    return
                fd = _create(self.name)
            self._slot = arena._make(self.sid, self.name, size, fd)
        except BaseException as exc:
            self._error = exc

    def result(self) -> Slot:
        """The slot, once made (re-raises the helper's error, e.g. SharedMemoryError)."""
        self._thread.join(_SPARE_JOIN_TIMEOUT_S)
        if self._error is not None:
            raise self._error
        if self._slot is None:
            raise SharedMemoryError(
                f"creating a shared-memory slot took over {_SPARE_JOIN_TIMEOUT_S:g} s."
            )
        return self._slot

    def made(self) -> bool:
        """Whether the slot is ready (the helper is done and did not fail)."""
        return not self._thread.is_alive() and self._slot is not None

    def cancel(self) -> None:
        """Unlink the segment, made or not, without waiting for the helper.

        Either the helper has created the segment and its name goes now (the helper may
        still be reserving the memory: the worker is exiting, and the memory goes with it),
        or it never creates it.
        """
        with self._lock:
            self._cancelled = True
        unlink(self.name)
