"""stoker's datasets as subclasses of torch's classes of the same name.

Each class is stoker's implementation first (its fast paths and checks) and torch's class
second, so ``isinstance(ds, torch.utils.data.Dataset)`` holds and frameworks that test for
torch's types accept it. ``a + b`` and ``random_split`` give these classes back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import torch.utils.data as torch_data

from stoker import _dataset
from stoker._random import GeneratorLike

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

__all__ = [
    "ChainDataset",
    "ConcatDataset",
    "Dataset",
    "IterableDataset",
    "StackDataset",
    "Subset",
    "TensorDataset",
    "random_split",
]


class Dataset(_dataset.Dataset[T_co], torch_data.Dataset[T_co]):
    """A map from keys to samples: stoker's ``Dataset`` that is also torch's."""

    def __init__(self) -> None:
        """End the ``super().__init__()`` chain of stoker's classes here: the torch classes
        after them in the MRO have their own ``__init__``, which stoker's replace."""

    def __add__(self, other: Any) -> ConcatDataset[T_co]:
        members: list[Any] = [self, other]
        return ConcatDataset(members)


class IterableDataset(
    _dataset.IterableDataset[T_co], Dataset[T_co], torch_data.IterableDataset[T_co]
):
    """A stream of samples: stoker's ``IterableDataset`` that is also torch's."""

    def __add__(self, other: Any) -> ChainDataset:  # type: ignore[override]
        return ChainDataset([self, other])


class TensorDataset(_dataset.TensorDataset, Dataset[tuple[Any, ...]], torch_data.TensorDataset):
    """Samples are rows of equally long tensors or arrays: stoker's, also torch's."""


class StackDataset(_dataset.StackDataset, Dataset[Any], torch_data.StackDataset[Any]):
    """Samples are tuples or dicts of several datasets' samples: stoker's, also torch's."""


class ConcatDataset(_dataset.ConcatDataset[T_co], Dataset[T_co], torch_data.ConcatDataset[T_co]):  # type: ignore[misc]
    """Datasets one after the other: stoker's ``ConcatDataset``, also torch's."""


class ChainDataset(_dataset.ChainDataset, IterableDataset[Any], torch_data.ChainDataset):
    """Streams one after the other: stoker's ``ChainDataset``, also torch's."""


class Subset(_dataset.Subset[T_co], Dataset[T_co], torch_data.Subset[T_co]):  # type: ignore[misc]
    """The samples of a dataset at the given indices: stoker's ``Subset``, also torch's."""


def random_split(
    dataset: Any,
    lengths: Sequence[int | float],
    generator: GeneratorLike = None,
) -> list[Subset[Any]]:
    """stoker's ``random_split`` (the same splits), giving :class:`Subset` s that are torch's.

    Args:
        dataset: the dataset to split.
        lengths: the size, or the fraction, of each split.
        generator: an int seed, a ``numpy.random.Generator`` or a ``torch.Generator``.
    """
    return [
        Subset(s.dataset, s.indices) for s in _dataset.random_split(dataset, lengths, generator)
    ]
