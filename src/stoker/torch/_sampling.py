"""stoker's samplers as subclasses of torch's classes of the same name.

Frameworks decide by torch's types: Lightning, for one, treats a loader whose sampler is a
``RandomSampler`` as shuffled and swaps in a ``DistributedSampler`` for a ``RandomSampler``
or ``SequentialSampler``. stoker's implementation comes first in each class, so its epoch
orders, ``state_dict`` and fast index arrays stay.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
import torch.utils.data as torch_data

from stoker import _distributed, _sampler

T_co = TypeVar("T_co", covariant=True)

__all__ = [
    "BatchSampler",
    "DistributedSampler",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
]


class Sampler(_sampler.Sampler[T_co], torch_data.Sampler[T_co]):
    """The base of samplers: stoker's ``Sampler`` that is also torch's.

    >>> import torch.utils.data as td
    >>> class Evens(Sampler[int]):
    ...     def __iter__(self):
    ...         return iter(range(0, 6, 2))
    >>> isinstance(Evens(), td.Sampler), list(Evens())
    (True, [0, 2, 4])
    """


class SequentialSampler(_sampler.SequentialSampler, Sampler[int], torch_data.SequentialSampler):
    """Indices ``0 .. len - 1`` in order: stoker's, also torch's.

    >>> import torch.utils.data as td
    >>> sampler = SequentialSampler("abc")
    >>> isinstance(sampler, td.SequentialSampler), list(sampler)
    (True, [0, 1, 2])
    """


class RandomSampler(_sampler.RandomSampler, Sampler[int], torch_data.RandomSampler):
    """A new permutation (or draws with replacement) every epoch: stoker's, also torch's.

    >>> import torch, torch.utils.data as td
    >>> ours = RandomSampler(range(6), generator=torch.Generator().manual_seed(0))
    >>> list(ours) == list(td.RandomSampler(range(6), generator=torch.Generator().manual_seed(0)))
    True
    """


class SubsetRandomSampler(  # type: ignore[misc]
    _sampler.SubsetRandomSampler, Sampler[int], torch_data.SubsetRandomSampler
):
    """The given indices in a new order every epoch: stoker's, also torch's.

    >>> import torch.utils.data as td
    >>> sampler = SubsetRandomSampler([5, 7, 9], generator=0)
    >>> isinstance(sampler, td.SubsetRandomSampler), sorted(sampler)
    (True, [5, 7, 9])
    """


class WeightedRandomSampler(  # type: ignore[misc]
    _sampler.WeightedRandomSampler, Sampler[int], torch_data.WeightedRandomSampler
):
    """Indices drawn with the given weights: stoker's, also torch's.

    >>> import torch.utils.data as td
    >>> sampler = WeightedRandomSampler([0.0, 1.0], num_samples=3, generator=0)
    >>> isinstance(sampler, td.WeightedRandomSampler), list(sampler)
    (True, [1, 1, 1])
    """


class BatchSampler(_sampler.BatchSampler, Sampler[list[int]], torch_data.BatchSampler):
    """Groups a sampler's indices into batches: stoker's, also torch's.

    >>> import torch.utils.data as td
    >>> batches = BatchSampler(SequentialSampler(range(5)), batch_size=2, drop_last=False)
    >>> isinstance(batches, td.BatchSampler), list(batches)
    (True, [[0, 1], [2, 3], [4]])
    """


class DistributedSampler(  # type: ignore[misc]
    _distributed.DistributedSampler, Sampler[int], torch_data.DistributedSampler[Any]
):
    """This rank's share of the indices: stoker's ``DistributedSampler``, also torch's, with
    torch's shuffle (``randperm`` on a generator seeded ``seed + epoch``), so ranks switched
    from torch's sampler see the same samples in the same order.

    >>> import torch.utils.data as td
    >>> ours = DistributedSampler(range(10), num_replicas=2, rank=0, seed=3)
    >>> theirs = td.DistributedSampler(range(10), num_replicas=2, rank=0, seed=3)
    >>> list(ours) == list(theirs), isinstance(ours, td.DistributedSampler)
    (True, True)
    """

    def _permutation(self, n: int) -> Any:
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(n, generator=g).numpy()
