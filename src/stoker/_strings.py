"""StringArray: an immutable sequence of str or bytes kept in one buffer with offsets.

A dataset that holds millions of file names or labels as a Python list holds millions of
objects, each with a reference count. Forked workers that merely *read* them write those
counts, so every page of the list is copied into every worker (PyTorch issue 13246): memory
grows with ``num_workers``. A :class:`StringArray` keeps all the characters in one NumPy
byte buffer and the boundaries in one int64 array: two objects in all, so the pages stay
shared. Items are decoded on access.
"""

from __future__ import annotations

import array
import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np


class StringArray(Sequence[Any]):
    """An immutable, picklable sequence of ``str`` (or of ``bytes``) in one buffer.

    Args:
        items: the strings, all ``str`` or all ``bytes`` (a NumPy array of strings works).

    Raises:
        TypeError: for items that are not all ``str`` or all ``bytes``.

    >>> names = StringArray(["cat.jpg", "dög.png", ""])
    >>> len(names), names[1], names[-1], list(names[:2])
    (3, 'dög.png', '', ['cat.jpg', 'dög.png'])
    >>> StringArray([b"a", b"bc"])[1]
    b'bc'
    >>> import pickle
    >>> pickle.loads(pickle.dumps(names)) == names
    True
    """

    __slots__ = ("_data", "_is_bytes", "_offsets")

    def __init__(self, items: Iterable[str] | Iterable[bytes] = ()) -> None:
        # Streamed into one buffer: building from a generator never holds all the items as
        # Python objects at once (their freed pages would stay in the parent's heap).
        values: Iterable[Any] = items.tolist() if isinstance(items, np.ndarray) else items
        buf = bytearray()
        lengths = array.array("q")
        kind: type | None = None
        for i, v in enumerate(values):
            if kind is None:
                kind = bytes if isinstance(v, bytes) else str
            if kind is str and isinstance(v, str):
                raw = v.encode("utf-8", "surrogatepass")
            elif kind is bytes and isinstance(v, bytes):
                raw = v
            else:
                raise TypeError(
                    "StringArray items must be all str or all bytes; item 0 is "
                    f"{kind.__name__} but item {i} is {type(v).__name__} ({v!r:.40})."
                )
            buf += raw
            lengths.append(len(raw))
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(np.frombuffer(lengths, np.int64), out=offsets[1:])
        self._data = np.frombuffer(bytes(buf), np.uint8)
        self._offsets = offsets
        self._is_bytes = kind is bytes

    @classmethod
    def _from_parts(
        cls, data: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any], is_bytes: bool
    ) -> StringArray:
        out = cls.__new__(cls)
        out._data = data
        out._offsets = offsets
        out._is_bytes = is_bytes
        return out

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> StringArray: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                return StringArray(self[j] for j in range(start, stop, step))
            return StringArray._from_parts(
                self._data, self._offsets[start : max(start, stop) + 1], self._is_bytes
            )
        n = len(self)
        j = int(i)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError(f"StringArray index {i} out of range for length {n}.")
        a, b = self._offsets[j : j + 2].tolist()
        raw = self._data[a:b].tobytes()
        return raw if self._is_bytes else raw.decode("utf-8", "surrogatepass")

    def __iter__(self) -> Iterator[Any]:
        data = self._data
        bounds = self._offsets.tolist()
        for a, b in itertools.pairwise(bounds):
            raw = data[a:b].tobytes()
            yield raw if self._is_bytes else raw.decode("utf-8", "surrogatepass")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray):
            return self._is_bytes == other._is_bytes and list(self) == list(other)
        if isinstance(other, (list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = ", ".join(repr(x) for x in self[:3])
        more = ", ..." if len(self) > 3 else ""
        return f"StringArray([{head}{more}], len={len(self)})"

    def __reduce__(self) -> tuple[Any, ...]:
        a, b = int(self._offsets[0]), int(self._offsets[-1])
        return (
            StringArray._from_parts,
            (self._data[a:b].copy(), self._offsets - a, self._is_bytes),
        )

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffer and the offsets."""
        return int(self._data.nbytes + self._offsets.nbytes)
