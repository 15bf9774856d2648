"""The pipe between the main process and a worker process: framing, reading, writing.

:func:`send` writes a ``multiprocessing.connection`` frame in one call; an :class:`Inbox`
reads all that a pipe holds at once; an :class:`Outbox` holds tiny batches' results
briefly to share a write. Tasks travel packed as plain tuples (:func:`pack_tasks`). See
``docs/engine.md``, "One copy per batch".
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from stoker._engine._messages import (
    BatchSeed,
    GroupSeeds,
    StreamSeed,
    Task,
    from_wire,
    seed_from_wire,
    seed_to_wire,
    to_wire,
)
from stoker._policy import HOLD_S

_READ_SIZE = 1 << 16
"""Bytes asked for per read of a pipe (a pipe buffer: all it holds)."""
_LONG_SIZE = struct.Struct("!Q")
_INT32 = struct.Struct("!i")


def dumps(msg: Any) -> bytes:
    """A message as the bytes of a frame (protocol 5: index arrays pickle about twice as
    fast as with ``Connection.send``'s protocol; a message's wire form, see
    :func:`~stoker._engine._messages.to_wire`)."""
    return pickle.dumps(to_wire(msg), pickle.HIGHEST_PROTOCOL)


def framed(data: bytes) -> list[bytes]:
    """``data`` framed as ``Connection.send_bytes`` frames it: a 4-byte big-endian length,
    or for 2 GiB and more -1 and an 8-byte length; then the data.

    >>> framed(b"ab"), [len(part) for part in framed(bytes(4))]
    ([b'\\x00\\x00\\x00\\x02', b'ab'], [4, 4])
    """
    if len(data) >= 1 << 31:  # Connection's long frame
        return [_INT32.pack(-1) + _LONG_SIZE.pack(len(data)), data]
    return [_INT32.pack(len(data)), data]


def send(conn: Any, msg: Any) -> None:
    """Send ``msg`` on ``conn`` framed as ``Connection.send_bytes`` frames it, but in one
    write: ``send_bytes`` writes a message over 16 KiB as two (the length, then the data),
    which wakes the reader twice."""
    write_all(conn.fileno(), framed(dumps(msg)))


def write_all(fd: int, chunks: list[bytes]) -> None:
    """Write ``chunks`` to ``fd`` in one system call if it takes them all, else in more."""
    view = memoryview(b"".join(chunks))
    while view:
        view = view[os.write(fd, view) :]


def pack_tasks(tasks: list[Task]) -> list[tuple[Any, ...]]:
    """Tasks as plain tuples for the pipe (a NamedTuple costs more to pickle), each
    with how its indices travel, as its kind of seed packs them (:data:`PACKS`): 1-D
    integer index arrays as raw bytes, with their dtype (far cheaper to pickle than the
    array); other tasks as they are, with None. A group of tiny batches (``task`` a list
    of tasks, ``seed`` :class:`GroupSeeds`, see :func:`stoker._policy.group_size`) has
    ``("g", dtype)``, its index arrays joined in one bytes object with their lengths.
    """
    return [
        (gen, idx, *PACKS[type(record)](task), seed_to_wire(record))
        for gen, idx, task, record, _ in tasks
    ]


def _pack_indices(task: Any) -> tuple[Any, Any]:
    """(the indices as they travel, how): an integer array as bytes, with its dtype."""
    if _index_array(task):
        return task.tobytes(), task.dtype.str
    return task, None


def _pack_group(tasks: list[Any]) -> tuple[Any, Any]:
    """(a group's index lists as they travel, how): one array's bytes if all share an
    integer dtype, with the lengths."""
    dtypes = {t.dtype.str if _index_array(t) else None for t in tasks}
    dtype = dtypes.pop() if len(dtypes) == 1 else None
    if dtype is None:
        return tasks, ("g", None)
    return (b"".join(t.tobytes() for t in tasks), [len(t) for t in tasks]), ("g", dtype)


PACKS: dict[type, Callable[[Any], tuple[Any, Any]]] = {
    BatchSeed: _pack_indices,
    GroupSeeds: _pack_group,
    StreamSeed: _pack_indices,
}
"""How each kind of task seed's indices travel (a new kind is one entry here and one in
``stoker._engine._worker.KINDS``)."""


def _index_array(task: Any) -> bool:
    return type(task) is np.ndarray and task.ndim == 1 and task.dtype.kind in "iu"


def unpack_task(packed: tuple[Any, ...]) -> Task:
    """The :class:`~stoker._engine._messages.Task` of a :func:`pack_tasks` entry (writable
    arrays again; a list for a group).

    >>> from stoker._engine._messages import BatchSeed
    >>> unpack_task(pack_tasks([Task(0, 0, np.arange(3), BatchSeed(0))])[0]).task
    array([0, 1, 2])
    >>> group = Task(0, 0, [np.arange(2), np.arange(1)], GroupSeeds(0, 0, [0, 1]))
    >>> unpack_task(pack_tasks([group])[0]).task
    [array([0, 1]), array([0])]
    """
    gen, idx, task, dtype, raw = packed
    seed = seed_from_wire(raw)
    if dtype is None:
        return Task(gen, idx, task, seed)
    if type(dtype) is tuple:
        if dtype[1] is not None:
            data, lengths = task
            flat = np.frombuffer(data, dtype[1]).copy()
            task = np.split(flat, np.cumsum(lengths[:-1])) if len(lengths) > 1 else [flat]
        return Task(gen, idx, task, seed)
    return Task(gen, idx, np.frombuffer(task, dtype).copy(), seed)


def frame(buf: bytearray) -> tuple[int, int] | None:
    """(start, end) of the first whole message in ``buf``, or None if none is complete.

    >>> frame(bytearray(b"\\0\\0\\0\\2ab?")), frame(bytearray(b"\\0\\0\\0\\3ab"))
    ((4, 6), None)
    """
    if len(buf) < 4:
        return None
    size = int.from_bytes(buf[:4], "big", signed=True)
    start = 4
    if size == -1:  # a message of 2 GiB or more
        if len(buf) < 12:
            return None
        size, start = _LONG_SIZE.unpack_from(buf, 4)[0], 12
    end = start + size
    return (start, end) if len(buf) >= end else None


class Inbox:
    """Reads framed messages from a pipe's descriptor, a whole pipe buffer per read.

    Args:
        fd: the descriptor (of a ``Connection``; the connection keeps it open).
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def take(self) -> Any:
        """A message already read, or None (no system call)."""
        span = frame(self.buf) if self.buf else None
        return None if span is None else self._pop(span)

    def readable(self) -> bool:
        """Whether :meth:`recv` has something to read without waiting for the sender."""
        if self.buf and frame(self.buf) is not None:
            return True
        return bool(self._poll.poll(0))

    def wait(self, timeout_s: float) -> bool:
        """Whether something came to read within ``timeout_s`` (or is buffered already)."""
        if self.buf and frame(self.buf) is not None:
            return True
        return bool(self._poll.poll(max(0.0, timeout_s) * 1000))

    def recv(self) -> Any:
        """The next message; waits until a whole one has come (like ``Connection.recv``).

        Raises:
            EOFError: the pipe closed before a whole message came.
        """
        buf = self.buf
        span = frame(buf)
        while span is None:
            chunk = os.read(self.fd, _READ_SIZE)
            if not chunk:
                raise EOFError
            buf += chunk
            span = frame(buf)
        return self._pop(span)

    def _pop(self, span: tuple[int, int]) -> Any:
        start, end = span
        msg = from_wire(pickle.loads(self.buf[start:end]))
        del self.buf[:end]
        return msg


class Outbox:
    """A worker's writer of framed messages, holding results of fast batches to write them
    together.

    A result sent with ``hold=True`` (a fast batch, more tasks queued) waits, and the ones
    after it join it, until :data:`HOLD_S` has passed since the first: tiny batches then
    cost one system call and one wake-up of the main process per several batches. A helper
    thread writes what is held when that time is up, so a slow or stuck batch does not keep
    finished ones back; nothing is held while the worker waits for tasks (:meth:`flush`).

    Args:
        conn: the worker's ``Connection``; :class:`Inbox` reads its frames.
    """

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self._fd = conn.fileno()
        self._held: list[bytes] = []
        self._due = 0.0
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._closed = False
        self._thread: threading.Thread | None = None

    def send(self, msg: Any, hold: bool = False) -> None:
        """Send ``msg`` after what is held, or (``hold``) hold it too."""
        chunks = framed(dumps(msg))
        with self._lock:
            self._held += chunks
            if not hold:
                self._write()
            elif len(self._held) == 2:  # the first held: the helper writes it when due
                self._due = time.monotonic() + HOLD_S
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._flusher, name="stoker-outbox", daemon=True
                    )
                    self._thread.start()
                self._cond.notify()

    def flush(self) -> None:
        """Write everything held now."""
        with self._lock:
            self._write()

    def close(self) -> None:
        """Write what is held (if the pipe still takes it) and stop the helper thread."""
        with self._lock:
            self._closed = True
            self._cond.notify()
            with contextlib.suppress(OSError):
                self._write()
        if self._thread is not None:
            self._thread.join(HOLD_S * 100)

    def _write(self) -> None:  # with the lock held
        if not self._held:
            return
        held, self._held = self._held, []
        write_all(self._fd, held)

    def _flusher(self) -> None:
        with self._lock:
            while not self._closed:
                if not self._held:
                    self._cond.wait()
                    continue
                left = self._due - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                with contextlib.suppress(OSError):
                    self._write()
