"""stoker's ``ShardedIterable`` as an iterable dataset of torch's type."""

from __future__ import annotations

from typing import TypeVar

from stoker import _distributed
from stoker.torch._data import IterableDataset

T_co = TypeVar("T_co", covariant=True)

__all__ = ["ShardedIterable"]


class ShardedIterable(_distributed.ShardedIterable[T_co], IterableDataset[T_co]):
    """This rank's and this worker's share of an iterable dataset, also torch's type.

    >>> import torch.utils.data as td
    >>> class Count(IterableDataset):
    ...     def __iter__(self):
    ...         return iter(range(6))
    >>> share = ShardedIterable(Count(), num_replicas=2, rank=1)
    >>> isinstance(share, td.IterableDataset), list(share)
    (True, [1, 3, 5])
    """
