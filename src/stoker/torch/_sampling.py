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
    """The base of samplers: stoker's ``Sampler`` that is also torch's."""


class SequentialSampler(_sampler.SequentialSampler, Sampler[int], torch_data.SequentialSampler):
    """Indices ``0 .. len - 1`` in order: stoker's, also torch's."""


class RandomSampler(_sampler.RandomSampler, Sampler[int], torch_data.RandomSampler):
    """A new permutation (or draws with replacement) every epoch: stoker's, also torch's."""


class SubsetRandomSampler(  # type: ignore[misc]
    _sampler.SubsetRandomSampler, Sampler[int], torch_data.SubsetRandomSampler
):
    """The given indices in a new order every epoch: stoker's, also torch's."""


class WeightedRandomSampler(  # type: ignore[misc]
    _sampler.WeightedRandomSampler, Sampler[int], torch_data.WeightedRandomSampler
):
    """Indices drawn with the given weights: stoker's, also torch's."""


class BatchSampler(_sampler.BatchSampler, Sampler[list[int]], torch_data.BatchSampler):
    """Groups a sampler's indices into batches: stoker's, also torch's."""


class DistributedSampler(  # type: ignore[misc]
    _distributed.DistributedSampler, Sampler[int], torch_data.DistributedSampler[Any]
):
    """This rank's share of the indices: stoker's ``DistributedSampler``, also torch's, with
    torch's shuffle (``randperm`` on a generator seeded ``seed + epoch``), so ranks switched
    from torch's sampler see the same samples in the same order."""

    def _permutation(self, n: int) -> Any:
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(n, generator=g).numpy()
