"""A cache of a deterministic dataset's samples: computed once, one copy shared by all workers.

:func:`cached` wraps a map-style dataset. The first load of sample ``i`` (in any process
or thread) stores it in one store every process maps:
a POSIX shared-memory segment (``where="memory"``, its name unlinked at once) or a file
on disk. Later loads get read-only NumPy views into it. Space is reserved before use.

A store is a header, one table row per index (empty / being written / ready, offset,
length, stamp, CRC-32) and a data area filled front to back; a miss computes outside any
lock and publishes its row last, (no torn entry is ever read). A fixed set of indices is
kept (a shuffled pass thrashes LRU), caching turns itself off when producing costs less
than reading back, and the store is keyed by what produced it. See ``docs/caching.md``.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import fcntl
import hashlib
import mmap
import operator
import os
import secrets
import threading
import time
import warnings
import weakref
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from stoker import _cache_entry, _osprobe
from stoker._worker_info import get_worker_info

try:  # POSIX shm_open / shm_unlink, as multiprocessing.shared_memory uses them.
    import _posixshmem  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None

MAGIC = b"STKCACH1"
ALIGN = _cache_entry.ALIGN
PAYS_FACTOR = 2.0
"""Caching pays when producing a sample costs at least this many reads of it back."""
MEASURE_ENTRIES = 8
"""Entries whose produce and read-back times decide whether caching pays."""
ROWS = 64
"""Counter rows in the header: 0 for the main process, 1 + worker id for a worker (ids past
the last row share it: their counts may then lose increments; the data never does)."""

EMPTY, WRITING, READY = 0, 1, 2
STALE, CORRUPT = -1, -2
"""What :meth:`_Store.read` says of an entry it does not serve (negative: to replace)."""
_UNDECIDED, _ON, _OFF, _PRELOADED = 0, 1, 2, 3
_DECISIONS = {_UNDECIDED: "measuring", _ON: "caching", _OFF: "off", _PRELOADED: "preloaded"}
# header fields (int64 each, after the 8-byte magic)
_H_VERSION, _H_KEY, _H_LEN, _H_SIZE, _H_DATA, _H_USED, _H_LIMIT, _H_DECISION = range(8)
_H_PRODUCE, _H_READ, _H_MEASURED, _H_FIELDS = 8, 9, 10, 16
_C_HITS, _C_MISSES, _C_STORED, _C_STALE, _C_CORRUPT, _C_FIELDS = 0, 1, 2, 3, 4, 8
_T_STATE, _T_OFFSET, _T_LENGTH, _T_STAMP, _T_CRC, _T_FIELDS = 0, 1, 2, 3, 4, 5
_VERSION = 2
"""1: skeletons were pickles; 2: :mod:`stoker._cache_entry`'s own format."""


def _round_up(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


def _layout(length: int) -> tuple[int, int]:
    """(bytes of header + counters, bytes of the table) of a store for ``length`` indices."""
    head = _round_up(8 + 8 * _H_FIELDS + 8 * ROWS * _C_FIELDS, 4096)
    return head, _round_up(8 * _T_FIELDS * length, 4096)


@dataclass(frozen=True)
class CacheStatistics:
    """What a cache did, summed over every process and thread that used it.

    Attributes:
        where: "memory" or the store's file.
        budget_bytes: the store's size (header, table and data); never exceeded.
        used_bytes: data bytes written (including space of entries rewritten when stale).
        entries: entries ready now.
        length: the dataset's length.
        admitted: the fixed set of indices kept, ``0 .. admitted-1`` (None before the
            first entry decides it).
        hits: loads served from the cache.
        misses: loads that ran the dataset (while caching, off, or outside the set).
        stale: entries found out of date (their file changed) and recomputed.
        corrupt: entries whose checksum failed on disk, recomputed and never served.
        decision: "measuring", "caching", "preloaded" or "off", with the measured produce
            and read-back times per sample when known.

    >>> data = cached(TensorDataset(np.arange(6.0)), budget=1 << 20)
    >>> _ = [data[i] for i in range(6)]
    >>> stats = data.statistics()
    >>> stats.where, stats.length
    ('memory', 6)
    >>> data.close()
    """

    where: str
    budget_bytes: int
    used_bytes: int
    entries: int
    length: int
    admitted: int | None
    hits: int
    misses: int
    stale: int
    corrupt: int
    decision: str

    @property
    def hit_rate(self) -> float:
        """``hits / (hits + misses)`` (0 before any load)."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


def fingerprint(dataset: Any) -> int:
    """A 63-bit key of what produces ``dataset``'s samples: its type, length and repr, its
    transforms' repr, and for folder datasets every file's path, size and mtime."""
    h = hashlib.blake2b(digest_size=8)
    kind = type(dataset)
    h.update(f"{kind.__module__}.{kind.__qualname__}|{len(dataset)}".encode())
    for attr in ("transform", "target_transform", "transforms"):
        h.update(repr(getattr(dataset, attr, None)).encode())
    if getattr(kind, "__repr__", None) is not getattr(object, "__repr__", None):
        # (the default repr names an address: no key)
        with contextlib.suppress(Exception):
            h.update(repr(dataset).encode())
    path_of = _path_of(dataset)
    for i in range(len(dataset) if path_of is not None else 0):
        path = path_of(i)  # type: ignore[misc]
        st = os.stat(path)
        h.update(f"{path}|{st.st_size}|{st.st_mtime_ns}".encode())
    return int.from_bytes(h.digest(), "little") >> 1


def _path_of(dataset: Any) -> Callable[[int], str] | None:
    """Index to file, for a folder dataset (``samples`` of (path, target)); else None."""
    samples = getattr(dataset, "samples", None)
    if samples is None or not hasattr(samples, "__len__") or len(samples) != len(dataset):
        return None
    path = getattr(samples, "path", None)
    if callable(path):
        return path  # type: ignore[no-any-return]
    return lambda i: str(samples[i][0])


def file_stamp(path: str) -> int:
    """A nonzero 63-bit stamp of a file's size and mtime: an entry made from the file is
    served only while the file still has it."""
    st = os.stat(path)
    return ((st.st_mtime_ns * 1_000_003) ^ st.st_size) & (2**63 - 1) | 1


_LIVE: weakref.WeakSet[_Store] = weakref.WeakSet()
"""Stores in shared memory mapped by this process (for :func:`shm_reserved_bytes`)."""


def shm_reserved_bytes() -> int:
    """Bytes that live shared-memory caches of this process may still write into /dev/shm
    (their segments are sparse: ``statvfs`` does not count space not yet reserved)."""
    total, seen = 0, set()
    for store in list(_LIVE):
        if store.owner == os.getpid() and not store.closed and store.ref not in seen:
            seen.add(store.ref)
            total += max(0, store.size - store.touched())
    return total


def shm_room_bytes() -> int | None:
    """Bytes free in /dev/shm for new segments (None without it): the free space less what
    this process's shared-memory caches may still write there."""
    free = _osprobe.shm_free_bytes()
    return None if free is None else max(0, free - shm_reserved_bytes())


class ShmRef(NamedTuple):
    """How another process finds a memory cache's segment, whose name is unlinked as soon
    as it is made: the descriptor ``fd`` of process ``pid`` (``/proc/PID/fd/FD``), and the
    segment's device and inode, which the file opened there must have."""

    pid: int
    fd: int
    dev: int
    ino: int


def _no_room(place: str, room: int, budget: int, fix: str) -> OSError:
    return OSError(
        errno.ENOSPC,
        f"a cache's budget must fit in the space free where it lives, but {place} has "
        f"{room:,} bytes free for a budget of {budget:,} bytes. Fix: pass a smaller budget, "
        f"or {fix}",
    )


_SHM_FIX = (
    "give the container more shared memory (docker run --shm-size=8g, or a larger "
    "/dev/shm), or cache on disk (where=<a directory>)."
)
_DISK_FIX = "free space there, or pick a folder on a larger file system."


_NO_ROOM = {errno.ENOSPC, errno.EDQUOT}


def _fallocate(fd: int, start: int, length: int) -> None:
    """Reserve the bytes ``start .. start + length`` of a file; OSError only when there is
    no room (where the platform or file system cannot reserve, nothing is reserved)."""
    reserve = getattr(os, "posix_fallocate", None)  # (not on macOS)
    if reserve is None:  # pragma: no cover
        return
    try:
        reserve(fd, start, length)
    except OSError as exc:
        if exc.errno in _NO_ROOM:
            raise


def _disk_free(folder: str) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


class _Store:
    """One mapped store (a shared-memory segment or a file): the header, the table, the data.

    Space is reserved (``posix_fallocate``) before any of it is written: the header and
    table when the store is made, each entry before it is written, so a full ``/dev/shm`` or
    disk is an error or an entry not stored, never SIGBUS.

    Args:
        where: "memory" or a directory.
        length: indices in the table.
        budget: the store's size in bytes.
        key: the :func:`fingerprint` of the dataset.
        ref: the memory segment to attach to (None: make one; unused on disk).
    """

    def __init__(self, where: str, length: int, budget: int, key: int, ref: ShmRef | None) -> None:
        head, table = _layout(length)
        if budget < head + table + ALIGN:
            raise ValueError(
                f"budget must hold the cache's header and index table ({head + table:,} bytes "
                f"for {length:,} samples) plus data, got {budget:,}; pass a larger budget."
            )
        self.where, self.length, self.size, self.key = where, length, budget, key
        self.data_start = head + table
        self.owner = os.getpid()
        self.closed = False
        self.pickles = where == "memory"  # a file another user may plant holds no pickle
        self._lock = threading.Lock()
        self._verified: np.ndarray[Any, Any] | None = None
        self._warned = False
        if where == "memory":
            self.name = f"stoker_{os.getpid()}_cache_{secrets.token_hex(4)}"
            self.fd = self._make_shm() if ref is None else _attach_shm(ref)
        else:
            self.name = os.path.join(where, f"stoker-cache-{key:016x}.bin")
            self.fd = self._open_file()
        st = os.fstat(self.fd)
        pid, fd = (ref.pid, ref.fd) if ref is not None else (os.getpid(), self.fd)
        self.ref = ShmRef(pid, fd, st.st_dev, st.st_ino)
        self._map(head, length)
        if where == "memory":
            if ref is None:
                self._init_header()
            if ref is None or ref.pid == os.getpid():
                _LIVE.add(self)
        else:
            self._verified = np.zeros(length, np.bool_)
            self._recover()
        self._finalizer = weakref.finalize(self, _close, self.mm, self.fd)
        _ALL.add(self)

    def _map(self, head: int, length: int) -> None:
        try:
            self.mm = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED)
        except BaseException:
            os.close(self.fd)
            raise
        # int64 fields as memoryviews: a Python int per access, far cheaper than NumPy's
        view = memoryview(self.mm)
        self.ro = view.toreadonly()  # what entries are read from: their arrays stay read-only
        self.header = view[8 : 8 + 8 * _H_FIELDS].cast("q")
        self.counters = view[8 + 8 * _H_FIELDS : 8 + 8 * (_H_FIELDS + ROWS * _C_FIELDS)].cast("q")
        self.table = view[head : head + 8 * length * _T_FIELDS].cast("q")
        del view

    def again(self) -> _Store:
        """Another mapping of the same store, for a copy of its cache (closed apart)."""
        ref = self.ref if self.where == "memory" else None
        return _Store(self.where, self.length, self.size, self.key, ref)

    # -- opening ---------------------------------------------------------------------------

    def _make_shm(self) -> int:
        """A new segment, its name unlinked at once: nothing is left in /dev/shm whatever
        ends this process (even SIGKILL); other processes open it by :class:`ShmRef`."""
        if _posixshmem is None:  # pragma: no cover
            raise OSError("where='memory' needs POSIX shared memory; pass a directory instead.")
        room = shm_room_bytes()
        place = f"shared memory ({_osprobe.SHM_DIR})"
        if room is not None and self.size > room:
            raise _no_room(place, room, self.size, _SHM_FIX)
        fd: int = _posixshmem.shm_open("/" + self.name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        _posixshmem.shm_unlink("/" + self.name)
        try:
            os.ftruncate(fd, self.size)
            self._reserve(fd, 0, self.data_start, place, _SHM_FIX)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _reserve(self, fd: int, start: int, length: int, place: str, fix: str) -> None:
        try:
            _fallocate(fd, start, length)
        except OSError as exc:
            free = _osprobe.shm_free_bytes() if self.where == "memory" else _disk_free(self.where)
            raise _no_room(place, free or 0, self.size, fix) from exc

    def _open_file(self) -> int:
        """The store's file, checked; made again (atomically) when missing, foreign,
        damaged or of another size. Under a lock file beside it, so that processes opening
        one folder at once share one file."""
        folder = os.path.dirname(self.name) or "."
        os.makedirs(folder, exist_ok=True)
        lock = os.open(self.name + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            with contextlib.suppress(FileNotFoundError):
                fd = os.open(self.name, os.O_RDWR)
                if self._header_ok(fd):
                    need = self.size - os.fstat(fd).st_blocks * 512
                    if need > _disk_free(folder):
                        os.close(fd)
                        raise _no_room(folder, _disk_free(folder), self.size, _DISK_FIX)
                    return fd
                os.close(fd)
            if self.size > _disk_free(folder):
                raise _no_room(folder, _disk_free(folder), self.size, _DISK_FIX)
            return self._make_file(folder)
        finally:
            os.close(lock)  # (and with it the lock)

    def _make_file(self, folder: str) -> int:
        tmp = f"{self.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(fd, self.size)
            self._reserve(fd, 0, self.data_start, folder, _DISK_FIX)
            mm = mmap.mmap(fd, self.size, mmap.MAP_SHARED)
            header = np.frombuffer(mm, np.int64, _H_FIELDS, 8)
            self._fill_header(header)
            mm[:8] = MAGIC
            del header
            mm.flush()
            mm.close()
            os.fsync(fd)
            os.replace(tmp, self.name)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return fd

    def _header_ok(self, fd: int) -> bool:
        """Whether the file is a store of this key and layout with sane header fields."""
        if os.fstat(fd).st_size != self.size:
            return False  # truncated, or made for another budget
        raw = os.pread(fd, 8 + 8 * _H_FIELDS, 0)
        if raw[:8] != MAGIC:
            return False
        h = np.frombuffer(raw, np.int64, _H_FIELDS, 8)
        return bool(
            h[_H_VERSION] == _VERSION
            and h[_H_KEY] == self.key
            and h[_H_LEN] == self.length
            and h[_H_SIZE] == self.size
            and h[_H_DATA] == self.data_start
            and self.data_start <= h[_H_USED] <= self.size
            and int(h[_H_DECISION]) in _DECISIONS
            and -1 <= h[_H_LIMIT] <= self.length
            and min(h[_H_PRODUCE], h[_H_READ], h[_H_MEASURED]) >= 0
        )

    def _fill_header(self, header: Any) -> None:
        for i in range(_H_FIELDS):
            header[i] = 0
        header[_H_VERSION], header[_H_KEY], header[_H_LEN] = _VERSION, self.key, self.length
        header[_H_SIZE], header[_H_DATA] = self.size, self.data_start
        header[_H_USED], header[_H_LIMIT] = self.data_start, -1

    def _init_header(self) -> None:
        self._fill_header(self.header)
        self.mm[:8] = MAGIC

    def _recover(self) -> None:
        """Rows a crashed writer left "being written" are empty again, when no other
        process has the file open (an exclusive ``flock``); then hold it shared."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pass
        else:
            states = self.column(_T_STATE)
            states[states == WRITING] = EMPTY
            del states
        fcntl.flock(self.fd, fcntl.LOCK_SH)

    def column(self, field: int) -> np.ndarray[Any, Any]:
        """One field of every table row, as a (writable) NumPy view."""
        return np.frombuffer(self.table, np.int64).reshape(self.length, _T_FIELDS)[:, field]

    # -- the lock ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The store's lock, across this process's threads and other processes."""
        with self._lock:
            fcntl.lockf(self.fd, fcntl.LOCK_EX, 8, 0)
            try:
                yield
            finally:
                fcntl.lockf(self.fd, fcntl.LOCK_UN, 8, 0)

    # -- entries -----------------------------------------------------------------------------

    def read(self, index: int, stamp: int) -> tuple[Any, int]:
        """(the sample, status): status READY when served, EMPTY when absent, WRITING when
        being written elsewhere, STALE or CORRUPT otherwise (on disk: a failed checksum, a
        malformed entry or one holding a pickle)."""
        t, row = self.table, index * _T_FIELDS
        state = t[row + _T_STATE]
        if state != READY:
            return None, min(state, WRITING)
        offset, length = t[row + _T_OFFSET], t[row + _T_LENGTH]
        if t[row + _T_STAMP] != stamp:
            return None, STALE
        if self._verified is not None and not self._verified[index]:
            ok = self.data_start <= offset and offset + length <= self.size
            if not ok or zlib.crc32(self.mm[offset : offset + length]) != t[row + _T_CRC]:
                return None, CORRUPT
            self._verified[index] = True
        try:
            return _cache_entry.decode(self.ro, offset, length, self.pickles), READY
        except _cache_entry.EntryError:
            return None, CORRUPT

    def write(self, index: int, stamp: int, sample: Any, replace: bool) -> bool:
        """Store ``sample`` as entry ``index``; False when it is someone else's to write,
        outside the admitted set, does not fit, or (on disk) would need a pickle."""
        try:
            entry = _cache_entry.Entry(sample, self.pickles)
        except _cache_entry.Unstorable as exc:
            self._warn(f"{exc}, so such samples are loaded from the dataset every time")
            return False
        size = entry.size
        with self.locked():
            t, row, h = self.table, index * _T_FIELDS, self.header
            if t[row + _T_STATE] == WRITING or (t[row + _T_STATE] == READY and not replace):
                return False
            limit = h[_H_LIMIT]
            if limit < 0:  # the first entry fixes the admitted set
                limit = min(self.length, (self.size - self.data_start) // size)
                h[_H_LIMIT] = limit
            used = h[_H_USED]
            if index >= limit or used + size > self.size:
                return False
            h[_H_USED] = used + size
            t[row + _T_STATE] = WRITING
        try:
            _fallocate(self.fd, used, size)  # a full file system: ENOSPC here, not SIGBUS
        except OSError as exc:
            t[row + _T_STATE] = EMPTY
            place = self.where if self.where != "memory" else _osprobe.SHM_DIR
            self._warn(f"{place} is full ({exc.strerror}): samples not yet cached are loaded "
                       "from the dataset every time; free space there or pass a smaller budget")
            return False
        entry.write(self.mm, used)
        crc = zlib.crc32(self.mm[used : used + size]) if self._verified is not None else 0
        t[row + _T_OFFSET], t[row + _T_LENGTH], t[row + _T_STAMP] = used, size, stamp
        t[row + _T_CRC] = crc
        t[row + _T_STATE] = READY  # last: readers see a whole entry or none
        if self._verified is not None:
            self._verified[index] = True
        return True

    def _warn(self, text: str) -> None:
        """Warn once per store and process (the cache goes on without the entry)."""
        if not self._warned:
            self._warned = True
            where = "a memory cache" if self.where == "memory" else f"cache {self.name!r}"
            warnings.warn(f"{where}: {text}.", RuntimeWarning, stacklevel=4)

    def touched(self) -> int:
        """Bytes of the store reserved so far (header, table and the data used)."""
        return self.header[_H_USED] if not self.closed else 0

    def close(self) -> None:
        """Unmap now (views handed out keep the mapping until they die)."""
        self.closed = True
        for view in (self.header, self.counters, self.table, self.ro):
            with contextlib.suppress(BufferError):  # arrays of entries still alive
                view.release()
        self._finalizer()


_ALL: weakref.WeakSet[_Store] = weakref.WeakSet()


def _after_fork() -> None:
    for store in list(_ALL):
        store._lock = threading.Lock()  # a thread of the parent may have held it


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _attach_shm(ref: ShmRef) -> int:
    """The segment of a memory cache made elsewhere (or by an object gone): opened through
    its maker's descriptor, and checked to be that segment."""
    with contextlib.suppress(OSError):
        fd = os.open(f"/proc/{ref.pid}/fd/{ref.fd}", os.O_RDWR)
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) == (ref.dev, ref.ino):
            return fd
        os.close(fd)
    raise ValueError(
        f"this memory cache's store is gone: process {ref.pid} made it and has closed it or "
        "exited. A memory cache is shared with its maker's workers (and copies) while its "
        "maker holds it; pickled, it attaches to that store, it does not carry the data. Use "
        "copy.deepcopy to keep a copy working on its own, or where=<a directory> for a cache "
        "that outlives its process."
    )


def _close(mm: mmap.mmap, fd: int) -> None:
    """Unmap and close (a memory segment's name was unlinked when it was made)."""
    with contextlib.suppress(BufferError):  # views still alive: their mapping stays
        mm.close()
    with contextlib.suppress(OSError):
        os.close(fd)


def _row() -> int:
    info = get_worker_info()
    return 0 if info is None else min(ROWS - 1, info.id + 1)


class CachedDataset:
    """A map-style dataset whose samples are computed once and then read from a shared store.

    Made by :func:`cached`; see the module docstring for how it stores, which samples it
    keeps and when it turns itself off. Pickles (to spawned workers) as the name of its
    store, which workers attach to; forked workers and threads use the same mapping.

    >>> data = cached(TensorDataset(np.arange(6.0)), budget=1 << 20)
    >>> isinstance(data, CachedDataset), len(data), float(data[2][0])
    (True, 6, 2.0)
    >>> data.close()
    """

    def __init__(
        self,
        dataset: Any,
        budget: int,
        where: str | os.PathLike[str] = "memory",
        preload: bool = False,
        always: bool = False,
    ) -> None:
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TypeError(
                f"cached() needs a map-style dataset (with __getitem__ and __len__), got "
                f"{type(dataset).__name__}; an iterable dataset has no index to cache by."
            )
        if isinstance(budget, bool) or not isinstance(budget, int) or not 0 < budget < 2**63:
            raise ValueError(
                f"budget must be a positive number of bytes below 2**63, got {budget!r}."
            )
        self.dataset = dataset
        self.where = "memory" if where == "memory" else os.path.abspath(os.fspath(where))
        self.budget = budget
        self.always = always
        self._path_of = _path_of(dataset)
        self._key = fingerprint(dataset)
        self._store: _Store | None = _Store(self.where, len(dataset), budget, self._key, None)
        self._name = self._store.name
        self._ref = self._store.ref if self.where == "memory" else None
        self._closed = False
        if preload:
            self.preload()

    def _opened(self) -> _Store:
        store = self._store
        if store is None:  # unpickled in a spawned worker: attach to the maker's store
            if self._closed:
                raise ValueError("this cache was closed; make a new one with stoker.cached().")
            store = _Store(self.where, len(self.dataset), self.budget, self._key, self._ref)
            self._store = store
        return store

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_store"] = None
        state["_path_of"] = None  # may be a lambda: found again on the other side
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._path_of = _path_of(self.dataset)

    def __copy__(self) -> CachedDataset:
        return self._copy(self.__getstate__())

    def __deepcopy__(self, memo: dict[int, Any]) -> CachedDataset:
        return self._copy(copy.deepcopy(self.__getstate__(), memo))

    def _copy(self, state: dict[str, Any]) -> CachedDataset:
        """A copy with a mapping of its own of the same store, made now: it works on after
        this object is closed or gone (a memory store lives while a copy maps it)."""
        new = type(self).__new__(type(self))
        new.__setstate__(state)
        if self._store is not None and not self._store.closed:
            new._store = self._store.again()
        return new

    def __len__(self) -> int:
        return len(self.dataset)

    def stamp(self, index: int) -> int:
        """The stamp an entry must carry to be served (its file's size and mtime, or 1)."""
        if self._path_of is not None:
            return file_stamp(self._path_of(index))
        return 1

    def __getitem__(self, index: int) -> Any:
        store = self._opened()
        index, n = operator.index(index), store.length
        if not -n <= index < n:
            raise IndexError(f"index {index} is out of range for a dataset of {n} samples")
        index = index % n
        counters, row = store.counters, _row() * _C_FIELDS
        if store.header[_H_DECISION] == _OFF:
            counters[row + _C_MISSES] += 1
            return self.dataset[index]
        stamp = self.stamp(index)
        sample, status = store.read(index, stamp)
        if status == READY:
            counters[row + _C_HITS] += 1
            return sample
        counters[row + _C_MISSES] += 1
        if status == STALE:
            counters[row + _C_STALE] += 1
        elif status == CORRUPT:
            counters[row + _C_CORRUPT] += 1
        t0 = time.perf_counter()
        sample = self.dataset[index]
        produce = time.perf_counter() - t0
        if status != WRITING and store.write(index, stamp, sample, replace=status < 0):
            counters[row + _C_STORED] += 1
            self._measure(store, index, produce)
            if sample is not None:
                sample, _ = store.read(index, stamp)  # the stored copy: hits give the same
        return sample

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        return [self[int(i)] for i in indices]

    def _measure(self, store: _Store, index: int, produce: float) -> None:
        """Time reading the entry just stored back; after :data:`MEASURE_ENTRIES`, decide."""
        header = store.header
        if header[_H_DECISION] != _UNDECIDED:
            return
        t0 = time.perf_counter()
        store.read(index, self.stamp(index))
        read = time.perf_counter() - t0
        with store.locked():
            if header[_H_DECISION] != _UNDECIDED:
                return
            header[_H_PRODUCE] += int(produce * 1e9)
            header[_H_READ] += int(read * 1e9)
            header[_H_MEASURED] += 1
            if header[_H_MEASURED] >= MEASURE_ENTRIES:
                pays = self.always or header[_H_PRODUCE] >= PAYS_FACTOR * header[_H_READ]
                header[_H_DECISION] = _ON if pays else _OFF

    def preload(self) -> int:
        """Load indices ``0, 1, ...`` in this process until the store is full; the entries
        stored. The kept set is then exactly those indices."""
        store = self._opened()
        with store.locked():
            store.header[_H_DECISION] = _PRELOADED  # asked for: no measuring
        stored = 0
        for i in range(len(self)):
            self[i]
            if store.table[i * _T_FIELDS + _T_STATE] != READY:
                break
            stored += 1
        return stored

    def statistics(self) -> CacheStatistics:
        """What the cache did so far, over all processes and threads."""
        store = self._opened()
        h = store.header
        sums = np.frombuffer(store.counters, np.int64).reshape(ROWS, _C_FIELDS).sum(axis=0)
        decision = _DECISIONS.get(int(h[_H_DECISION]))
        if decision is None:  # (checked on open: damaged since, by another writer)
            raise ValueError(
                f"cache store {store.name!r} is damaged: its header field 'decision' holds "
                f"{int(h[_H_DECISION])}, not one of {sorted(_DECISIONS)}. Delete the file: "
                "the next run makes it again."
            )
        if h[_H_MEASURED]:
            n = int(h[_H_MEASURED])
            decision += (
                f" (producing a sample took {h[_H_PRODUCE] / n / 1e3:.1f} us, reading it back "
                f"{h[_H_READ] / n / 1e3:.1f} us, over {n} samples)"
            )
        limit = int(h[_H_LIMIT])
        return CacheStatistics(
            where=self.where if self.where == "memory" else store.name,
            budget_bytes=store.size,
            used_bytes=int(h[_H_USED]) - store.data_start,
            entries=int(np.count_nonzero(store.column(_T_STATE) == READY)),
            length=store.length,
            admitted=None if limit < 0 else limit,
            hits=int(sums[_C_HITS]),
            misses=int(sums[_C_MISSES]),
            stale=int(sums[_C_STALE]),
            corrupt=int(sums[_C_CORRUPT]),
            decision=decision,
        )

    def close(self) -> None:
        """Unmap the store now (a memory cache's segment goes when its last mapping does)."""
        if self._store is not None:
            self._store.close()
        self._store = None
        self._closed = True

    def __repr__(self) -> str:
        return f"cached({self.dataset!r}, budget={self.budget}, where={self.where!r})"


def cached(
    dataset: Any,
    budget: int,
    where: str | os.PathLike[str] = "memory",
    *,
    preload: bool = False,
    always: bool = False,
) -> CachedDataset:
    """A dataset that computes ``dataset[i]`` once and serves it from one shared copy after.

    For deterministic datasets: cache the decode, augment on top.

    Args:
        dataset: a map-style dataset.
        budget: bytes the store takes at most (header, table, samples), free where it
            lives; samples past it are loaded every time.
        where: "memory" (shared memory) or a directory (a file that survives restarts,
            shared by every loader keyed the same).
        preload: load indices 0, 1, ... now until the budget is full.
        always: keep caching even when producing costs less than reading back.

    Returns:
        A :class:`CachedDataset` (in ``stoker.torch``, also a torch ``Dataset``).

    Raises:
        TypeError: for a dataset without ``__getitem__`` and ``__len__``.
        ValueError: for a budget not a positive int below 2**63, or too small.
        OSError: (``ENOSPC``) for a budget over the free space where the store lives.

    >>> data = cached(TensorDataset(np.arange(6.0)), budget=1 << 20, preload=True)
    >>> float(data[5][0]), data.statistics().entries
    (5.0, 6)
    >>> data.close()
    """
    return CachedDataset(dataset, budget, where, preload=preload, always=always)


def find(dataset: Any, depth: int = 3) -> CachedDataset | None:
    """The cache a loader's dataset reads through: the dataset itself, an ImageFolder's
    pixel cache (``_pixel_cache``), or the first found in the datasets a Subset, Concat or
    Stack dataset wraps (``dataset`` / ``datasets``), ``depth`` levels down."""
    if isinstance(dataset, CachedDataset):
        return dataset
    inner = getattr(dataset, "_pixel_cache", None)
    if isinstance(inner, CachedDataset) or depth == 0:
        return inner if isinstance(inner, CachedDataset) else None
    members = getattr(dataset, "datasets", None)
    if isinstance(members, dict):
        members = list(members.values())
    if not isinstance(members, (list, tuple)):
        members = [getattr(dataset, "dataset", None)]
    for member in members:
        found = find(member, depth - 1) if member is not None else None
        if found is not None:
            return found
    return None
