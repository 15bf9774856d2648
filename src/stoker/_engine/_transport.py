"""Transport: how a batch and a failure cross from a worker to the main process.

Two implementations of one small protocol (``encode`` in the worker, ``decode`` in the main
process):

- **shared memory** (process workers): :func:`encode` pickles the batch's *structure* with
  every array or tensor leaf replaced by a reference to its place in the worker's slot
  (``persistent_id``); leaves that collate did not write into the slot are copied in. Only
  that metadata crosses the pipe. :func:`decode` maps the slot and rebuilds the leaves as
  NumPy views (``torch.from_numpy`` of them for tensors); a ``weakref.finalize`` on the
  memoryview that every view shares returns the slot when the last view dies.
- **in-process** (thread workers and tests): the batch object itself is passed; nothing is
  encoded.

Exceptions travel as :class:`RemoteError` payloads that rebuild the original type with a
note (worker id, indices, traceback), or a ``RuntimeError`` whose ``__cause__`` carries the
worker's traceback when the type cannot be rebuilt (PyTorch issue 30147).
"""

from __future__ import annotations

import io
import pickle
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from stoker import _torch
from stoker._engine._shm import ALIGN, Arena, SegmentMaps, _round_up

_NUMPY = "n"
_TORCH = "t"
_EMPTY = "e"


_PLAIN = frozenset({tuple, list, dict, str, bytes, int, float, bool, type(None)})


class _Encoder(pickle.Pickler):
    """Pickles a batch, placing array and tensor leaves in the arena's current slot."""

    def __init__(self, file: io.BytesIO, arena: Arena) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
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


def encode(data: Any, arena: Arena) -> tuple[tuple[int, str, int] | None, bytes]:
    """The batch as (slot, metadata) for the pipe; the leaves are in the slot (worker side).

    Returns:
        The slot's (id, name, size) or None when the batch has no array leaf, and the
        pickled structure.
    """
    buf = io.BytesIO()
    enc = _Encoder(buf, arena)
    enc.dump(data)
    if enc.missing:
        # The slot was too small (first batch, or a bigger one): take a slot that holds
        # every leaf, copy them all in, and remember the size for the next batches.
        used = arena.current.used if arena.current is not None else 0
        arena.regrow(used + enc.missing)
        buf = io.BytesIO()
        enc = _Encoder(buf, arena)
        enc.dump(data)
        if enc.missing:  # pragma: no cover - regrow() made room for all of them
            raise RuntimeError("stoker internal error: a regrown slot still lacks room.")
    slot = arena.finish()
    if slot is not None and arena.slots[slot[0]].used == 0:
        arena.release([slot[0]])
        slot = None
    return slot, buf.getvalue()


class _Decoder(pickle.Unpickler):
    """Rebuilds a batch from its metadata, leaves viewing one slot's memory."""

    def __init__(self, payload: bytes, base: np.ndarray[Any, Any] | None) -> None:
        super().__init__(io.BytesIO(payload))
        self.base = base

    def persistent_load(self, pid: Any) -> Any:
        kind = pid[0]
        if kind == _EMPTY:
            _, kind, dtype, shape = pid
            if kind == _NUMPY:
                return np.empty(shape, dtype)
            torch = _torch.require("a batch of tensors")
            return torch.empty(shape, dtype=getattr(torch, dtype))
        _, offset, nbytes, dtype, shape = pid
        assert self.base is not None
        raw = self.base[offset : offset + nbytes]
        if kind == _NUMPY:
            return raw.view(dtype).reshape(shape)
        torch = _torch.require("a batch of tensors")
        return torch.from_numpy(raw).view(getattr(torch, dtype)).view(shape)


def decode(
    slot: tuple[int, str, int] | None,
    payload: bytes,
    maps: SegmentMaps,
    on_free: Callable[[int], None],
) -> Any:
    """The batch from a worker's (slot, metadata); ``on_free(slot_id)`` runs when it dies.

    Called in the main process.
    """
    if slot is None:
        return _Decoder(payload, None).load()
    sid, name, size = slot
    base = maps.view(name, size)
    # Every view of ``base`` shares base.base (the memoryview NumPy made for it), so it
    # dies with the last view of the batch, tensors included (they hold their array).
    weakref.finalize(base.base, on_free, sid)
    return _Decoder(payload, base).load()


class RemoteError:
    """An exception raised in a worker, packed to cross to the main process.

    Args:
        exc: the exception.
        where: who raised it and on what, e.g. "worker 1 (pid 42), indices [3, 4]".
        keep_object: pass the exception object itself (thread workers), not a pickle.
    """

    def __init__(self, exc: BaseException, where: str, keep_object: bool = False) -> None:
        self.where = where
        self.type_name = f"{type(exc).__module__}.{type(exc).__qualname__}"
        self.text = str(exc)
        self.tb = "".join(traceback.format_exception(exc))
        self.exc: BaseException | None = exc if keep_object else None
        self.pickled: bytes | None = None
        if not keep_object:
            try:
                pickled = pickle.dumps(exc)
                pickle.loads(pickled)  # several-argument constructors fail here (#30147)
                self.pickled = pickled
            except Exception:
                self.pickled = None

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
        exc.add_note(note)
        return exc


class _RemoteTraceback(Exception):
    """Carries a worker's formatted traceback as an exception cause."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return "\n" + self.tb
