"""ColumnBatch: a batch of samples stored as columns, made by vectorised ``__getitems__``.

Array-backed datasets (``TensorDataset`` and friends) fetch a whole batch with one fancy
index per column instead of one ``__getitem__`` per sample. The result still behaves as the
list of samples that ``__getitems__`` promises (a custom ``collate_fn`` can iterate it), but
stoker's own collate recognises it and gathers each column straight into its output buffer,
without building per-sample Python objects.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import numpy as np

from stoker import _torch

Alloc = Callable[[tuple[int, ...], np.dtype[Any]], np.ndarray[Any, Any]]
"""Returns a writable, C-contiguous array of the given shape and dtype (e.g. in shared memory)."""

_loading = threading.local()  # per thread: the memory the batch being loaded is collated into


def output_alloc() -> Alloc | None:
    """While a fetcher loads a batch that stoker's default collate will write into ``alloc``
    (a worker's shared-memory slot, a thread worker's buffer): that ``alloc``; else None.

    A dataset whose ``__getitems__`` returns a :class:`ColumnBatch` may write a column there
    itself as it loads (and hand that array back from :meth:`ColumnBatch.gather` for the
    same ``alloc``), so that the batch is written once, while its pieces are in cache.
    """
    alloc: Alloc | None = getattr(_loading, "alloc", None)
    return alloc


def set_output_alloc(alloc: Alloc | None) -> None:
    """Set what :func:`output_alloc` returns in this thread (the fetcher, around a load)."""
    _loading.alloc = alloc


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

        A CPU tensor is gathered through a NumPy view of its memory (``take`` costs less
        than half of ``index_select`` for small batches) and comes back a tensor.

        Args:
            alloc: where to write each gathered column; by default fresh memory.
        """
        out = []
        torch: Any = _torch.loaded()  # imported whenever a source is a tensor
        for src in self.sources:
            tensor = torch is not None and isinstance(src, torch.Tensor)
            arr = _cpu_view(src) if tensor else np.asarray(src)
            if arr is None:
                out.append(_gather_tensor(src, self.indices))
                continue
            # take, not arr[indices]: NumPy's fancy indexing of rows is much slower
            if alloc is None:
                col = arr.take(self.indices, axis=0)
            else:
                col = alloc((len(self.indices), *arr.shape[1:]), arr.dtype)
                # "wrap", not "raise": with out=, "raise" goes through a temporary copy
                arr.take(self.indices, axis=0, out=col, mode="wrap")
            out.append(torch.from_numpy(col) if tensor else col)
        return out


def _cpu_view(t: Any) -> np.ndarray[Any, Any] | None:
    """The memory of CPU tensor ``t`` as a NumPy array (no copy), or None: on another
    device, needing grad, or of a dtype NumPy lacks (bfloat16...)."""
    if t.device.type != "cpu" or t.requires_grad:
        return None
    try:
        view: np.ndarray[Any, Any] = t.numpy()
    except (TypeError, RuntimeError):
        return None
    return view


def _gather_tensor(src: Any, indices: np.ndarray[Any, Any]) -> Any:
    """``src``'s rows at ``indices`` by torch, on ``src``'s device, in fresh memory."""
    torch: Any = _torch.loaded()
    idx = torch.from_numpy(np.ascontiguousarray(indices, dtype=np.int64))
    return src.index_select(0, idx.to(src.device))
