"""Transport: how a batch and a failure cross from a worker to the main process.

Two implementations of one protocol (``encode`` in the worker, ``decode`` in the main
process):

- **shared memory** (process workers): :func:`encode` pickles the batch's structure, each
  array or tensor leaf replaced by a reference into the worker's slot, so only metadata
  crosses the pipe (plain tuples or lists of arrays skip the pickler);
  :func:`decode` rebuilds the leaves as views of the slot, which returns when the last
  view dies.
- **in-process** (thread workers): the batch object itself.

:func:`send` writes a ``multiprocessing.connection`` frame in one call; an :class:`Inbox`
reads all that a pipe holds at once; an :class:`Outbox` holds tiny batches' results
briefly to share a write. Exceptions travel as :class:`RemoteError` payloads
that rebuild the original type with a note, or a ``RuntimeError`` whose ``__cause__``
carries the worker's traceback (PyTorch issue 30147). See ``docs/engine.md``, "One copy
per batch".
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import pickle
import re
import select
import struct
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from stoker import _torch
from stoker._collate import numpy_dtype
from stoker._engine._interrupts import deferred
from stoker._engine._messages import Task, from_wire, to_wire
from stoker._engine._shm import ALIGN, Arena, SegmentMaps, _round_up

_T = TypeVar("_T")
_NUMPY = "n"
_TORCH = "t"
_EMPTY = "e"


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
    with how its indices travel: 1-D integer index arrays as raw bytes, with their dtype
    (far cheaper to pickle than the array); other tasks as they are, with None.
    A group of tiny batches (``task`` a list of tasks, ``seed`` a tuple, see
    :func:`stoker._policy.group_size`) has ``("g", dtype)``, its index arrays joined in one
    bytes object with their lengths.
    """
    out: list[tuple[Any, ...]] = []
    for gen, idx, task, seed, _ in tasks:
        if type(seed) is tuple:
            dtypes = {t.dtype.str if _index_array(t) else None for t in task}
            dtype = dtypes.pop() if len(dtypes) == 1 else None
            if dtype is not None:
                task = (b"".join(t.tobytes() for t in task), [len(t) for t in task])
            out.append((gen, idx, task, seed, ("g", dtype)))
        elif _index_array(task):
            out.append((gen, idx, task.tobytes(), seed, task.dtype.str))
        else:
            out.append((gen, idx, task, seed, None))
    return out


def _index_array(task: Any) -> bool:
    return type(task) is np.ndarray and task.ndim == 1 and task.dtype.kind in "iu"


def unpack_task(packed: tuple[Any, ...]) -> Task:
    """The :class:`~stoker._engine._messages.Task` of a :func:`pack_tasks` entry (writable
    arrays again; a list for a group).

    >>> unpack_task(pack_tasks([Task(0, 0, np.arange(3), 0)])[0]).task
    array([0, 1, 2])
    >>> group = Task(0, 0, [np.arange(2), np.arange(1)], (0, 0, [0, 1]))
    >>> unpack_task(pack_tasks([group])[0]).task
    [array([0, 1]), array([0])]
    """
    gen, idx, task, seed, dtype = packed
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


_HOLD_S = 0.001
"""How long a worker may hold the results of fast batches to write several at once."""


class Outbox:
    """A worker's writer of framed messages, holding results of fast batches to write them
    together.

    A result sent with ``hold=True`` (a fast batch, more tasks queued) waits, and the ones
    after it join it, until :data:`_HOLD_S` has passed since the first: tiny batches then
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
                self._due = time.monotonic() + _HOLD_S
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
            self._thread.join(_HOLD_S * 100)

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


_PLAIN = frozenset({tuple, list, dict, str, bytes, int, float, bool, type(None)})


class _Encoder(pickle.Pickler):
    """Pickles a batch, placing array and tensor leaves in the arena's current slot."""

    def __init__(self, arena: Arena) -> None:
        self.file = io.BytesIO()
        super().__init__(self.file, protocol=pickle.HIGHEST_PROTOCOL)
        self.arena = arena
        self.missing = 0
        self.torch = _torch.loaded()

    def persistent_id(self, obj: Any) -> Any:
        t = type(obj)
        if t in _PLAIN:  # the common case, and every part of our own ids: answer fast
            return None
        if t is np.ndarray:
            dtype = obj.dtype
            if dtype.hasobject:
                return None
            hit = self.arena.placed.get(id(obj))
            if hit is not None and hit[0] is obj and obj.nbytes:  # collate wrote it there
                dt = dtype.str if dtype.fields is None else dtype
                return (_NUMPY, hit[1], obj.nbytes, dt, obj.shape)
            return self._place(
                obj,
                obj.ctypes.data,
                obj.nbytes,
                obj.flags.c_contiguous,
                _NUMPY,
                dtype.str if dtype.fields is None else dtype,
                obj.shape,
            )
        torch = self.torch
        if torch is not None and type(obj) is torch.Tensor:
            if (
                obj.device.type != "cpu"
                or obj.is_nested  # strided in layout, but no one buffer: pickled
                or obj.layout != torch.strided
                or obj.requires_grad
                or obj.is_quantized
                or obj.is_conj()
                or obj.is_neg()
            ):
                return None
            nbytes = obj.numel() * obj.element_size()
            return self._place(
                obj,
                obj.data_ptr(),
                nbytes,
                obj.is_contiguous(),
                _TORCH,
                str(obj.dtype).removeprefix("torch."),
                tuple(obj.shape),
            )
        return None

    def _place(
        self,
        obj: Any,
        addr: int,
        nbytes: int,
        contiguous: bool,
        kind: str,
        dtype: Any,
        shape: tuple[int, ...],
    ) -> Any:
        if nbytes == 0:
            return (_EMPTY, kind, dtype, shape)
        offset = self.arena.offset_of(addr, nbytes) if contiguous else None
        if offset is None:
            dst = self.arena.bump(nbytes)
            if dst is None:
                self.missing += _round_up(nbytes, ALIGN)
                return (_EMPTY, kind, dtype, shape)  # a placeholder; encode() starts over
            _copy_into(dst, obj, kind, self.torch)
            offset = self.arena.offset_of(dst.ctypes.data, nbytes)
        return (kind, offset, nbytes, dtype, shape)


def _copy_into(dst: np.ndarray[Any, Any], obj: Any, kind: str, torch: Any) -> None:
    if kind == _NUMPY:
        dst.view(obj.dtype).reshape(obj.shape)[...] = obj
    else:
        torch.from_numpy(dst).view(obj.dtype).view(obj.shape).copy_(obj)


_FAST_LEAVES = 16
"""A tuple or list of up to this many arrays or tensors takes the fast path."""
_GROUP = 2
"""The container code of a group's fast payload: a list of (container code, leaves)."""


def _fast_refs(batches: list[Any], arena: Arena) -> list[tuple[int, list[Any]]] | None:
    """(container code, leaf references) of each batch, when every one is a tuple or list
    of arrays/tensors (leaves placed in the slot), else None."""
    torch = _torch.loaded()
    for data in batches:
        t = type(data)
        if (t is not tuple and t is not list) or not 0 < len(data) <= _FAST_LEAVES:
            return None
        for leaf in data:
            lt = type(leaf)
            if lt is np.ndarray:
                if leaf.dtype.hasobject or leaf.dtype.fields is not None:
                    return None
            elif torch is None or lt is not torch.Tensor:
                return None

    def refs(enc: _Encoder) -> list[tuple[int, list[Any]]] | None:
        out = []
        for data in batches:
            pids = [enc.persistent_id(leaf) for leaf in data]
            if None in pids:  # a tensor the pickler must handle (needs grad, ...)
                return None
            out.append((0 if type(data) is tuple else 1, pids))
        return out

    return _placing(arena, refs)


def _pickled(enc: _Encoder, data: Any) -> bytes:
    enc.dump(data)
    return enc.file.getvalue()


def _placing(arena: Arena, place: Callable[[_Encoder], _T | None]) -> _T | None:
    """``place(encoder)``, the leaves it meets placed in the arena's current slot; when the
    slot was too small (a first batch, or a bigger one), again in a slot that holds every
    leaf (copied in anew; the arena remembers the size for the next batches). None when
    ``place`` gives up (a leaf the fast path cannot take)."""
    enc = _Encoder(arena)
    out = place(enc)
    if out is not None and enc.missing:
        used = arena.current.used if arena.current is not None else 0
        arena.regrow(used + enc.missing)
        enc = _Encoder(arena)
        out = place(enc)
        if enc.missing:  # pragma: no cover - regrow() made room for all of them
            raise RuntimeError("stoker internal error: a regrown slot still lacks room.")
    return out


def encode(
    data: Any, arena: Arena, group: bool = False
) -> tuple[tuple[int, str, int] | None, bytes | tuple[int, list[Any]]]:
    """The batch (or, with ``group``, the list of batches) as (slot, metadata) for the pipe;
    the leaves are in the slot (worker side).

    Returns:
        The slot's (id, name, size) or None when the batch has no array leaf, and the
        pickled structure (or, for a tuple or list of arrays, the container code and the
        leaf references; for a group of those, :data:`_GROUP` and their list).
    """
    fast = _fast_refs(data if group else [data], arena)
    if fast is not None:
        return _finish(arena), (_GROUP, fast) if group else fast[0]
    payload = _placing(arena, functools.partial(_pickled, data=data))
    assert payload is not None
    return _finish(arena), payload


def _finish(arena: Arena) -> tuple[int, str, int] | None:
    slot = arena.finish()
    if slot is not None and arena.slots[slot[0]].used == 0:
        arena.release([slot[0]])
        slot = None
    return slot


class _Decoder(pickle.Unpickler):
    """Rebuilds a batch from its metadata, leaves viewing one slot's memory."""

    def __init__(self, payload: bytes, base: np.ndarray[Any, Any] | None) -> None:
        super().__init__(io.BytesIO(payload))
        self.base = base

    def persistent_load(self, pid: Any) -> Any:
        return _leaf(pid, self.base)


def _leaf(pid: Any, base: np.ndarray[Any, Any] | None) -> Any:
    """The array or tensor a leaf reference stands for (a view of ``base``)."""
    kind = pid[0]
    if kind == _EMPTY:
        _, kind, dtype, shape = pid
        if kind == _NUMPY:
            return np.empty(shape, dtype)
        torch = _torch.require("a batch of tensors")
        return torch.empty(shape, dtype=getattr(torch, dtype))
    _, offset, nbytes, dtype, shape = pid
    assert base is not None
    if kind == _NUMPY:
        return np.ndarray(shape, dtype, base, offset)
    torch = _torch.require("a batch of tensors")
    tdtype = getattr(torch, dtype)
    same = numpy_dtype(torch, tdtype)
    if same is not None:  # one NumPy view, one tensor: a third of the general way's cost
        return torch.from_numpy(np.ndarray(shape, same, base, offset))
    raw = base[offset : offset + nbytes]
    return torch.from_numpy(raw).view(tdtype).view(shape)


def decode(
    slot: tuple[int, str, int] | None,
    payload: bytes | tuple[int, list[Any]],
    maps: SegmentMaps,
    on_free: Callable[[int], None],
) -> Any:
    """The batch from a worker's (slot, metadata); ``on_free(slot_id)`` runs when it dies.

    Called in the main process.
    """
    base = None
    if slot is not None:
        sid, name, size = slot
        base = maps.view(name, size)
        # Every view of ``base`` shares base.base (the memoryview NumPy made for it), so it
        # dies with the last view of the batch, tensors included (they hold their array).
        weakref.finalize(base.base, deferred(maps.freeing(name, on_free)), sid)
    if isinstance(payload, tuple):  # the fast path: a tuple or list of leaves, or a group
        if payload[0] == _GROUP:
            return [_fast_batch(code, pids, base) for code, pids in payload[1]]
        return _fast_batch(*payload, base)
    return _Decoder(payload, base).load()


def _fast_batch(code: int, pids: list[Any], base: np.ndarray[Any, Any] | None) -> Any:
    leaves = [_leaf(pid, base) for pid in pids]
    return tuple(leaves) if code == 0 else leaves


class RemoteError:
    """An exception raised in a worker, packed to cross to the main process.

    The one place where a worker's exception (any ``BaseException``, of process or thread
    workers) becomes what the main process raises. Building it never raises: an exception
    whose ``__str__``, traceback or pickling fails is still described by its type name and
    what could be read of it.

    Args:
        exc: the exception.
        where: who raised it and on what, e.g. "worker 1 (pid 42), indices [3, 4]".
        keep_object: pass the exception object itself (thread workers), not a pickle.
    """

    def __init__(self, exc: BaseException, where: str, keep_object: bool = False) -> None:
        self.where = where
        self.type_name = f"{type(exc).__module__}.{type(exc).__qualname__}"
        self.text = safe_str(exc)
        self.tb = _format(exc)
        self.exc: BaseException | None = exc if keep_object else None
        self.pickled: bytes | None = None
        if not keep_object:
            try:
                pickled = pickle.dumps(exc)
                pickle.loads(pickled)  # several-argument constructors fail here (#30147)
                self.pickled = pickled
            except Exception:
                self.pickled = None

    def summary(self) -> str:
        """'SystemExit(3) in worker 0 (pid 42) on sample indices [3]': what ended a worker."""
        name = self.type_name.removeprefix("builtins.")
        return f"{name}({self.text}) in {self.where}" if self.text else f"{name} in {self.where}"

    def rebuild(self) -> BaseException:
        """The exception to raise in the main process, with the worker's context noted."""
        note = f"Raised in DataLoader {self.where}. The worker's traceback:\n{self.tb}"
        exc = self.exc
        if exc is None and self.pickled is not None:
            try:
                exc = pickle.loads(self.pickled)
            except Exception:
                exc = None
        if exc is None or not isinstance(exc, BaseException):
            err = RuntimeError(
                f"DataLoader {self.where} raised {self.type_name}: {self.text}; the exception "
                "could not be rebuilt in the main process (its type cannot be pickled with "
                "its arguments), so it is reported as this RuntimeError, caused by the "
                "worker's traceback."
            )
            err.__cause__ = _RemoteTraceback(self.tb)
            return err
        if self.where.startswith("worker "):  # a process's "worker 1 (pid 42) ...", a thread's
            who = re.sub(r"^worker (?=\d)", "worker process ", self.where)  # torch's words
            with contextlib.suppress(Exception):  # an exception may refuse new arguments
                _restate(exc, f"Caught {type(exc).__name__} in DataLoader {who}")
        add_note(exc, note)
        return exc


class _Message(str):
    """A message that a ``KeyError`` shows as it is, not quoted (``KeyError`` shows the
    ``repr`` of its one argument)."""

    def __repr__(self) -> str:
        return str(self)


def _restate(exc: BaseException, head: str) -> None:
    """Put ``head`` (torch's "Caught ValueError in DataLoader worker process 0", then the
    pid and sample indices) before ``str(exc)``, keeping the exception's type and attributes:
    where its message is its one argument (or it has none), a ``KeyError``'s key, or an
    ``OSError``'s ``strerror``. Others (their own ``__str__``) keep the note only."""
    args = exc.args
    kind = type(exc).__str__
    if kind is BaseException.__str__ and (not args or (len(args) == 1 and type(args[0]) is str)):
        exc.args = (f"{head}: {args[0]}" if args and args[0] else f"{head}.",)
    elif isinstance(exc, KeyError) and kind is KeyError.__str__ and len(args) == 1:
        exc.args = (_Message(f"{head}: {args[0]!r}"),)
    elif isinstance(exc, OSError) and kind is OSError.__str__ and exc.strerror:
        exc.strerror = f"{exc.strerror} ({head})"


def safe_str(exc: BaseException) -> str:
    """``str(exc)``, or a placeholder naming what went wrong when ``__str__`` raises.

    >>> class Bad(Exception):
    ...     def __str__(self): raise ValueError("no")
    >>> safe_str(Bad()), safe_str(KeyError("k"))
    ('<str() of the exception raised ValueError: no>', "'k'")
    """
    try:
        return str(exc)
    except Exception as err:
        try:
            return f"<str() of the exception raised {type(err).__name__}: {err}>"
        except Exception:
            return "<str() of the exception failed>"


def _format(exc: BaseException) -> str:
    """The formatted traceback of ``exc`` (``traceback`` copes with a failing ``__str__``;
    this copes with anything else that fails on the way)."""
    try:
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except Exception:
        return f"{type(exc).__qualname__}: {safe_str(exc)} (its traceback could not be formatted)"


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` that never raises (an exception may refuse notes)."""
    with contextlib.suppress(Exception):
        exc.add_note(note)


class _RemoteTraceback(Exception):
    """Carries a worker's formatted traceback as an exception cause."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return "\n" + self.tb
