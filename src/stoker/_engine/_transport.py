"""Transport: how a batch crosses from a worker process to the main process.

:func:`encode` (in the worker) pickles the batch's structure, each array or tensor leaf
replaced by a reference into the worker's shared-memory slot, so only metadata crosses
the pipe (plain tuples or lists of arrays skip the pickler); :func:`decode` (in the main
process) rebuilds the leaves as views of the slot, which returns when the last view dies.
Thread and in-process workers hand over the batch object itself. The pipe is
:mod:`stoker._engine._pipe`; a failure travels as a
:class:`~stoker._engine._errors.RemoteError`. See ``docs/engine.md``, "One copy per batch".
"""

from __future__ import annotations

import functools
import io
import pickle
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from stoker import _torch
from stoker._collate import numpy_dtype
from stoker._engine._interrupts import deferred
from stoker._engine._segments import SegmentMaps
from stoker._engine._shm import ALIGN, Arena, round_up

_T = TypeVar("_T")
_NUMPY = "n"
_TORCH = "t"
_EMPTY = "e"


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
                self.missing += round_up(nbytes, ALIGN)
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
