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
    """A map from keys to samples: stoker's ``Dataset`` that is also torch's.

    >>> import torch.utils.data as td
    >>> class Squares(Dataset):
    ...     def __len__(self):
    ...         return 3
    ...     def __getitem__(self, i):
    ...         return i * i
    >>> isinstance(Squares(), td.Dataset), Squares()[2]
    (True, 4)
    """

    def __init__(self) -> None:
        """End the ``super().__init__()`` chain of stoker's classes here: the torch classes
        after them in the MRO have their own ``__init__``, which stoker's replace."""

    def __add__(self, other: Any) -> ConcatDataset[T_co]:
        members: list[Any] = [self, other]
        return ConcatDataset(members)


class IterableDataset(
    _dataset.IterableDataset[T_co], Dataset[T_co], torch_data.IterableDataset[T_co]
):
    """A stream of samples: stoker's ``IterableDataset`` that is also torch's.

    >>> import torch.utils.data as td
    >>> class Count(IterableDataset):
    ...     def __iter__(self):
    ...         return iter(range(3))
    >>> isinstance(Count(), td.IterableDataset), list(Count())
    (True, [0, 1, 2])
    """

    def __add__(self, other: Any) -> ChainDataset:  # type: ignore[override]
        return ChainDataset([self, other])


class TensorDataset(_dataset.TensorDataset, Dataset[tuple[Any, ...]], torch_data.TensorDataset):
    """Samples are rows of equally long tensors or arrays: stoker's, also torch's.

    >>> import torch, torch.utils.data as td
    >>> pairs = TensorDataset(torch.arange(3), torch.zeros(3))
    >>> isinstance(pairs, td.TensorDataset), pairs[1]
    (True, (tensor(1), tensor(0.)))
    """


class StackDataset(_dataset.StackDataset, Dataset[Any], torch_data.StackDataset[Any]):
    """Samples are tuples or dicts of several datasets' samples: stoker's, also torch's.

    >>> import torch.utils.data as td
    >>> both = StackDataset(x=[1, 2], y=["a", "b"])
    >>> isinstance(both, td.StackDataset), both[1]
    (True, {'x': 2, 'y': 'b'})
    """


class ConcatDataset(_dataset.ConcatDataset[T_co], Dataset[T_co], torch_data.ConcatDataset[T_co]):  # type: ignore[misc]
    """Datasets one after the other: stoker's ``ConcatDataset``, also torch's.

    >>> import torch.utils.data as td
    >>> both = ConcatDataset([[0, 1, 2], [10, 11]])
    >>> isinstance(both, td.ConcatDataset), both[3]
    (True, 10)
    """


class ChainDataset(_dataset.ChainDataset, IterableDataset[Any], torch_data.ChainDataset):
    """Streams one after the other: stoker's ``ChainDataset``, also torch's.

    >>> import torch.utils.data as td
    >>> class Count(IterableDataset):
    ...     def __iter__(self):
    ...         return iter(range(2))
    >>> chain = ChainDataset([Count(), Count()])
    >>> isinstance(chain, td.ChainDataset), list(chain)
    (True, [0, 1, 0, 1])
    """


class Subset(_dataset.Subset[T_co], Dataset[T_co], torch_data.Subset[T_co]):  # type: ignore[misc]
    """The samples of a dataset at the given indices: stoker's ``Subset``, also torch's.

    >>> import torch.utils.data as td
    >>> part = Subset([10, 11, 12, 13], [3, 0])
    >>> isinstance(part, td.Subset), part[0]
    (True, 13)
    """


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

    >>> import torch, torch.utils.data as td
    >>> ours = random_split(range(5), [3, 2], generator=torch.Generator().manual_seed(0))
    >>> theirs = td.random_split(range(5), [3, 2], generator=torch.Generator().manual_seed(0))
    >>> [list(s) for s in ours] == [list(s) for s in theirs], isinstance(ours[0], td.Subset)
    (True, True)
    """
    return [
        Subset(s.dataset, s.indices) for s in _dataset.random_split(dataset, lengths, generator)
    ]
