"""Refcount-free file lists: ``samples`` and ``targets`` of a folder dataset in NumPy arrays.

A list of a million ``(path, class_index)`` tuples is three million Python objects; every
worker that touches them writes their reference counts and so copies the pages they live on
(PyTorch issue 13246). These containers hold the paths in a
:class:`~stoker.StringArray` (a few NumPy buffers; file names that share directories take a
fraction of their size) and the targets in one array, which forked workers share untouched,
while still behaving as torchvision's lists.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

from stoker._strings import StringArray


class SampleList(Sequence[tuple[str, int]]):
    """An immutable list-like of ``(path, class_index)`` stored in NumPy arrays.

    >>> s = SampleList.from_pairs([("a/x.jpg", 0), ("b/y.jpg", 1)])
    >>> len(s), s[1], s[-1] == ("b/y.jpg", 1)
    (2, ('b/y.jpg', 1), True)
    >>> [t for _, t in s]
    [0, 1]
    """

    __slots__ = ("_paths", "_targets")

    def __init__(self, paths: StringArray, targets: np.ndarray[Any, Any]) -> None:
        self._paths = paths
        self._targets = targets

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[str | os.PathLike[str], int]]) -> SampleList:
        """Pack ``(path, class_index)`` pairs."""
        paths: list[str] = []
        targets: list[int] = []
        for path, target in pairs:
            paths.append(os.fspath(path))
            targets.append(int(target))
        return cls(StringArray(paths), np.asarray(targets, dtype=np.int64))

    def __len__(self) -> int:
        return len(self._paths)

    def path(self, i: int) -> str:
        """The path of sample ``i``."""
        path: str = self._paths[i]
        return path

    @overload
    def __getitem__(self, i: int) -> tuple[str, int]: ...
    @overload
    def __getitem__(self, i: slice) -> list[tuple[str, int]]: ...
    def __getitem__(self, i: int | slice) -> tuple[str, int] | list[tuple[str, int]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self._paths)
        if not -n <= i < n:
            raise IndexError(f"sample index {i} is out of range for {n} samples.")
        i = int(i) % n
        return self.path(i), int(self._targets[i])

    def __iter__(self) -> Iterator[tuple[str, int]]:
        for i in range(len(self)):
            yield self[i]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(
            a == tuple(b) for a, b in zip(self, other, strict=False)
        )

    __hash__ = None  # type: ignore[assignment]

    def targets(self) -> TargetList:
        """The class indices, as a list-like sharing this list's array."""
        return TargetList(self._targets)

    def __repr__(self) -> str:
        head = ", ".join(repr(s) for s in self[:3])
        more = ", ..." if len(self) > 3 else ""
        return f"SampleList([{head}{more}], {len(self)} samples)"


class TargetList(Sequence[int]):
    """An immutable list-like of ints over an int64 array (``np.asarray`` gives the array).

    >>> t = TargetList(np.array([2, 0, 1]))
    >>> t[0], list(t), np.bincount(t).tolist()
    (2, [2, 0, 1], [1, 1, 1])
    """

    __slots__ = ("_values",)

    def __init__(self, values: np.ndarray[Any, Any]) -> None:
        self._values = values

    def __len__(self) -> int:
        return len(self._values)

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        if isinstance(i, slice):
            return [int(v) for v in self._values[i]]
        return int(self._values[i])

    def __iter__(self) -> Iterator[int]:
        return iter(self._values.tolist())

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
        if copy:
            return np.array(self._values, dtype=dtype)
        return np.asarray(self._values, dtype=dtype)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=False))

    __hash__ = None  # type: ignore[assignment]

    def tolist(self) -> list[int]:
        """The targets as a list of Python ints."""
        return list(self._values.tolist())

    def __repr__(self) -> str:
        return f"TargetList({self.tolist()!r})" if len(self) <= 10 else f"TargetList(<{len(self)}>)"
