"""``stoker.torch.cached``: :func:`stoker.cached` whose dataset is also torch's ``Dataset``."""

from __future__ import annotations

import os
from typing import Any

import torch.utils.data as torch_data

from stoker import _cache
from stoker._cache import CacheStatistics

__all__ = ["CacheStatistics", "CachedDataset", "cached"]


class CachedDataset(_cache.CachedDataset, torch_data.Dataset[Any]):
    """stoker's :class:`~stoker.CachedDataset` that is also a ``torch.utils.data.Dataset``.

    >>> import torch, torch.utils.data as td
    >>> data = cached(TensorDataset(torch.arange(4.0)), budget=1 << 20)
    >>> isinstance(data, (CachedDataset, td.Dataset)), float(data[3][0])
    (True, 3.0)
    >>> data.close()
    """


def cached(
    dataset: Any, budget: int, where: str | os.PathLike[str] = "memory", **options: bool
) -> CachedDataset:
    """:func:`stoker.cached` (the same arguments: ``preload``, ``always``), returning a
    ``torch.utils.data.Dataset``.

    >>> import torch, torch.utils.data as td
    >>> data = cached(TensorDataset(torch.arange(4.0)), budget=1 << 20, preload=True)
    >>> isinstance(data, td.Dataset), data.statistics().entries
    (True, 4)
    >>> data.close()
    """
    return CachedDataset(dataset, budget, where, **options)
