"""ColumnBatch: a batch of samples stored as columns, made by vectorised ``__getitems__``.

Array-backed datasets (``TensorDataset`` and friends) fetch a whole batch with one fancy
index per column instead of one ``__getitem__`` per sample. The result still behaves as the
list of samples that ``__getitems__`` promises (a custom ``collate_fn`` can iterate it), but
stoker's own collate recognises it and gathers each column straight into its output buffer,
without building per-sample Python objects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import numpy as np

from stoker import _torch

Alloc = Callable[[tuple[int, ...], np.dtype[Any]], np.ndarray[Any, Any]]
"""Returns a writable, C-contiguous array of the given shape and dtype (e.g. in shared memory)."""


class ColumnBatch(Sequence[Any]):
    """The samples ``indices`` of column sources (NumPy arrays or torch tensors).

    Sample ``i`` is ``tuple(src[indices[i]] for src in sources)``, or a dict when ``keys`` is
    given. Nothing is gathered until a sample or :meth:`gather` is asked for. ``indices``
    must be in range for every source (whoever makes the batch checks them).

    >>> import numpy as np
    >>> b = ColumnBatch((np.arange(10) * 2, np.arange(10)), np.array([3, 1]))
    >>> len(b), b[0]
    (2, (np.int64(6), np.int64(3)))
    >>> [c.tolist() for c in b.gather()]
    [[6, 2], [3, 1]]
    """

    __slots__ = ("indices", "keys", "sources")

    def __init__(
        self,
        sources: Sequence[Any],
        indices: np.ndarray[Any, Any],
        keys: Sequence[str] | None = None,
    ) -> None:
        self.sources = tuple(sources)
        self.indices = indices
        self.keys = tuple(keys) if keys is not None else None

    def __len__(self) -> int:
        return len(self.indices)

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> ColumnBatch: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return ColumnBatch(self.sources, self.indices[i], self.keys)
        j = int(self.indices[i])
        values = tuple(src[j] for src in self.sources)
        return dict(zip(self.keys, values, strict=True)) if self.keys is not None else values

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self.indices)):
            yield self[i]

    def any_tensor(self) -> bool:
        """Whether any source is a torch tensor (then default collate gives tensors)."""
        return any(_torch.is_tensor(s) for s in self.sources)

    def numeric(self) -> bool:
        """Whether every source is a tensor or holds numbers, so collate can gather columns.

        A subclass that makes its columns only in :meth:`gather` overrides this (and
        :meth:`any_tensor`) so that collate need not look at ``sources``.
        """
        return all(_torch.is_tensor(s) or np.asarray(s).dtype.kind in "biufc" for s in self.sources)

    def gather(self, alloc: Alloc | None = None) -> list[Any]:
        """Each source's rows at ``indices``, one array or tensor per source.

        Args:
            alloc: where to write each gathered column; by default fresh memory.
        """
        out = []
        for src in self.sources:
            if _torch.is_tensor(src):
                out.append(_gather_tensor(src, self.indices, alloc))
            else:
                # take, not arr[indices]: NumPy's fancy indexing of rows is ~4x slower
                arr = np.asarray(src)
                if alloc is None:
                    out.append(arr.take(self.indices, axis=0))
                else:
                    buf = alloc((len(self.indices), *arr.shape[1:]), arr.dtype)
                    # "wrap", not "raise": with out=, "raise" goes through a temporary copy
                    arr.take(self.indices, axis=0, out=buf, mode="wrap")
                    out.append(buf)
        return out


def _gather_tensor(src: Any, indices: np.ndarray[Any, Any], alloc: Alloc | None) -> Any:
    torch = _torch.loaded()
    assert torch is not None  # a tensor exists, so torch is imported
    idx = torch.from_numpy(np.ascontiguousarray(indices, dtype=np.int64))
    if alloc is None or src.device.type != "cpu":
        return src.index_select(0, idx.to(src.device))
    try:
        np_dtype = torch.empty((), dtype=src.dtype).numpy().dtype
    except TypeError:  # a dtype NumPy lacks (bfloat16 ...): gather into fresh memory
        return src.index_select(0, idx)
    buf = torch.from_numpy(alloc((len(indices), *src.shape[1:]), np_dtype))
    torch.index_select(src, 0, idx, out=buf)
    return buf
