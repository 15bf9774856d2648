"""The bytes of one cache entry: a small tagged skeleton, then the sample's arrays, raw.

An entry is a 4-byte skeleton length, the skeleton, and each plain NumPy array of the
sample (64-byte aligned). The skeleton is stoker's own format, not pickle: None, bools,
ints, floats, complex numbers, strings, bytes, NumPy scalars, arrays and CPU tensors of
numeric dtypes (a tensor comes back a copy), and tuples, lists and dicts of them. Anything
else is pickled into the skeleton only where the store allows it (a memory cache, which no
other user can open); a store on disk holds no pickle, and decoding refuses one there
whatever the entry's checksum says, so a file planted in a shared folder never runs code.
"""

from __future__ import annotations

import math
import pickle
import re
import struct
from typing import Any

import numpy as np

from stoker import _torch

ALIGN = 64
"""Entries and the arrays in them start on 64-byte boundaries."""
PREFIX = 4
"""Bytes of an entry's skeleton length."""
_U32, _I64, _F64, _C128 = struct.Struct("<I"), struct.Struct("<q"), struct.Struct("<d"), "<dd"
_U64 = struct.Struct("<Q")
_DTYPE = re.compile(r"[<>|=][biufc?][0-9]{1,2}")
"""The dtype strings an array or NumPy scalar may have: plain numbers and bools only."""
_MAX_DEPTH = 64
_TAGS: dict[type, bytes] = {tuple: b"t", list: b"l", dict: b"d"}


class Unstorable(ValueError):
    """A sample holds an object that only pickle could store, in a store without pickle."""


class EntryError(ValueError):
    """An entry's bytes are not a well-formed entry (or hold a pickle a store refuses)."""


def _round_up(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


class _Encoder:
    """Writes a sample's skeleton; arrays are recorded with a place for their offset."""

    def __init__(self, pickles: bool) -> None:
        self.pickles = pickles
        self.out = bytearray()
        self.arrays: list[np.ndarray[Any, Any]] = []
        self.slots: list[int] = []  # where each array's offset goes in ``out``

    def put(self, x: Any, depth: int = 0) -> None:
        out, kind = self.out, type(x)
        if x is None or kind is bool:
            out += b"N" if x is None else (b"T" if x else b"F")
        elif kind is int and -(1 << 63) <= x < 1 << 63:
            out += b"i" + _I64.pack(x)
        elif kind is float:
            out += b"f" + _F64.pack(x)
        elif kind is complex:
            out += b"j" + struct.pack(_C128, x.real, x.imag)
        elif kind is str or kind is bytes:
            raw = x.encode("utf-8", "surrogatepass") if kind is str else x
            out += (b"s" if kind is str else b"b") + _U32.pack(len(raw)) + raw
        elif (kind is np.ndarray or kind is np.memmap) and _plain_dtype(x.dtype):
            self._array(x, b"a")
        elif isinstance(x, np.generic) and type(x).__module__ == "numpy" and _plain_dtype(x.dtype):
            dtype = x.dtype.str.encode()
            out += b"g" + bytes([len(dtype)]) + dtype + x.tobytes()
        elif kind.__module__ == "torch" and (t := _tensor_array(x)) is not None:
            self._array(t, b"A")
        elif kind in (tuple, list, dict) and depth < _MAX_DEPTH:
            items = list(x.items()) if kind is dict else x
            out += _TAGS[kind] + _U32.pack(len(items))
            for item in items:
                if kind is dict:
                    self.put(item[0], depth + 1)
                    self.put(item[1], depth + 1)
                else:
                    self.put(item, depth + 1)
        else:
            self._pickled(x)

    def _array(self, a: np.ndarray[Any, Any], tag: bytes) -> None:
        dtype = a.dtype.str.encode()
        self.out += tag + bytes([len(dtype)]) + dtype + bytes([a.ndim])
        self.out += b"".join(_U64.pack(n) for n in a.shape)
        self.slots.append(len(self.out))
        self.out += _U64.pack(0)
        self.arrays.append(a)

    def _pickled(self, x: Any) -> None:
        if not self.pickles:
            raise Unstorable(
                f"a cache on disk stores numbers, strings, bytes, None, NumPy arrays and "
                f"scalars of numeric dtypes and tuples, lists and dicts of them, never a "
                f"pickle; this sample holds a {type(x).__module__}.{type(x).__qualname__}"
            )
        blob = pickle.dumps(x, 5)
        self.out += b"p" + _U32.pack(len(blob)) + blob


def _plain_dtype(dtype: np.dtype[Any]) -> bool:
    return _DTYPE.fullmatch(dtype.str) is not None


def _tensor_array(t: Any) -> np.ndarray[Any, Any] | None:
    """The memory of a plain CPU tensor as an array (stored raw, like one), else None."""
    torch = _torch.loaded()
    if torch is None or type(t) is not torch.Tensor:
        return None
    if t.device.type != "cpu" or t.requires_grad or t.layout != torch.strided:
        return None
    try:
        a = t.resolve_conj().resolve_neg().numpy()
    except (TypeError, RuntimeError):  # bfloat16 and other dtypes NumPy lacks
        return None
    return a if _plain_dtype(a.dtype) else None


class Entry:
    """An encoded sample: its skeleton, its arrays and their offsets, and its size."""

    __slots__ = ("arrays", "offsets", "size", "skeleton")

    def __init__(self, sample: Any, pickles: bool) -> None:
        enc = _Encoder(pickles)
        enc.put(sample)
        size = _round_up(PREFIX + len(enc.out))
        self.offsets = []
        for a in enc.arrays:
            self.offsets.append(size)
            size = _round_up(size + a.nbytes)
        for slot, offset in zip(enc.slots, self.offsets, strict=True):
            _U64.pack_into(enc.out, slot, offset)
        self.skeleton, self.arrays, self.size = bytes(enc.out), enc.arrays, max(size, ALIGN)

    def write(self, buf: Any, start: int) -> None:
        """Write the entry into ``buf`` (a writable buffer) at ``start``."""
        n = len(self.skeleton)
        buf[start : start + PREFIX + n] = _U32.pack(n) + self.skeleton
        for a, off in zip(self.arrays, self.offsets, strict=True):
            dst = np.frombuffer(buf, a.dtype, a.size, start + off).reshape(a.shape)
            dst[...] = a


class _Decoder:
    """Reads a skeleton back, arrays as read-only views of the entry's buffer."""

    def __init__(self, buf: Any, start: int, length: int, pickles: bool) -> None:
        self.buf, self.start, self.length, self.pickles = buf, start, length, pickles
        n = _U32.unpack_from(buf, start)[0]
        if PREFIX + n > length:
            raise EntryError(f"a skeleton of {n} bytes does not fit in an entry of {length}")
        self.data = bytes(buf[start + PREFIX : start + PREFIX + n])  # small: one copy
        self.pos = 0

    def take(self, n: int) -> bytes:
        pos = self.pos
        if pos + n > len(self.data):
            raise EntryError("the skeleton ends inside a value")
        self.pos = pos + n
        return self.data[pos : pos + n]

    def get(self, depth: int = 0) -> Any:
        data, pos = self.data, self.pos
        tag = data[pos]  # (an IndexError past the end: a damaged entry)
        self.pos = pos + 1
        if tag == _ARRAY:  # the common case first
            return self.array()
        if tag in _SCALARS:
            return _SCALARS[tag](self)
        if tag in _CONTAINERS and depth < _MAX_DEPTH:
            count = _U32.unpack(self.take(4))[0]
            if count > len(data) - self.pos:  # each item takes a byte at least
                raise EntryError(f"a container of {count} items is longer than its entry")
            if tag == _CONTAINERS[2]:
                return {self.get(depth + 1): self.get(depth + 1) for _ in range(count)}
            items = [self.get(depth + 1) for _ in range(count)]
            return tuple(items) if tag == _CONTAINERS[0] else items
        if tag == ord("p"):
            if not self.pickles:
                raise EntryError("it holds a pickle, which a cache on disk never loads")
            return pickle.loads(self.take(_U32.unpack(self.take(4))[0]))
        raise EntryError(f"unknown tag {tag} in its skeleton")

    def dtype(self) -> np.dtype[Any]:
        data, pos = self.data, self.pos
        n = data[pos]
        text = data[pos + 1 : pos + 1 + n]
        self.pos = pos + 1 + n
        dtype = _DTYPES.get(text)
        if dtype is None:
            name = text.decode("ascii", "replace")
            if _DTYPE.fullmatch(name) is None:
                raise EntryError(f"dtype {name!r} is not a plain numeric dtype")
            dtype = _DTYPES.setdefault(text, np.dtype(name))
        return dtype

    def array(self) -> np.ndarray[Any, Any]:
        dtype = self.dtype()
        data, pos = self.data, self.pos
        ndim = data[pos]
        *shape, offset = struct.unpack_from(f"<{ndim + 1}Q", data, pos + 1)
        self.pos = pos + 1 + 8 * (ndim + 1)
        count = math.prod(shape)
        if offset % ALIGN or offset + count * dtype.itemsize > self.length:
            raise EntryError(f"an array of shape {shape} at {offset} lies outside its entry")
        a = np.frombuffer(self.buf, dtype, count, self.start + offset).reshape(shape)
        a.flags.writeable = False
        return a

    def tensor(self) -> Any:
        """A tensor of its own (a copy: a tensor ignores the read-only flag)."""
        return _torch.require("a cached tensor").from_numpy(np.array(self.array()))

    def scalar(self) -> Any:
        dtype = self.dtype()
        return np.frombuffer(bytes(self.take(dtype.itemsize)), dtype)[0]


_SCALARS: dict[int, Any] = {
    ord("N"): lambda d: None,
    ord("T"): lambda d: True,
    ord("F"): lambda d: False,
    ord("i"): lambda d: _I64.unpack(d.take(8))[0],
    ord("f"): lambda d: _F64.unpack(d.take(8))[0],
    ord("j"): lambda d: complex(*struct.unpack(_C128, d.take(16))),
    ord("s"): lambda d: str(d.take(_U32.unpack(d.take(4))[0]), "utf-8", "surrogatepass"),
    ord("b"): lambda d: bytes(d.take(_U32.unpack(d.take(4))[0])),
    ord("a"): _Decoder.array,
    ord("A"): _Decoder.tensor,
    ord("g"): _Decoder.scalar,
}
_CONTAINERS = b"tld"
_ARRAY = ord("a")
_DTYPES: dict[bytes, np.dtype[Any]] = {}
"""Dtypes of arrays read so far, by their string (checked once)."""


def decode(buf: Any, start: int, length: int, pickles: bool) -> Any:
    """The sample of the entry of ``length`` bytes at ``start`` in ``buf``; arrays as
    read-only views of ``buf`` (give a read-only buffer: their flag cannot then be reset).

    Raises:
        EntryError: when the bytes are no well-formed entry, or hold a pickle and
            ``pickles`` is False.
    """
    try:
        dec = _Decoder(buf, start, length, pickles)
        sample = dec.get()
    except EntryError:
        raise
    except (struct.error, IndexError, ValueError, TypeError, RecursionError) as exc:
        raise EntryError(f"a damaged entry: {exc}") from exc
    if dec.pos != len(dec.data):
        raise EntryError("its skeleton has bytes past its end")
    return sample
