"""stoker.torch: the PyTorch drop-in, ``from stoker.torch import DataLoader``.

The names of ``docs/contract.md`` with torch's semantics end to end, on stoker's engine:
every class is a subclass of torch's class of the same name *and* of stoker's (``isinstance(loader,
torch.utils.data.DataLoader)`` holds, so frameworks such as Lightning recognise and rebuild
the loaders), and the default collate converts exactly as torch's ``default_collate`` does
(NumPy arrays and numbers become tensors). stoker's extras are keyword-only arguments of
:class:`DataLoader`, and stoker's other public names are here too. Importing it imports
torch; ``import stoker`` (the NumPy-native front door) does not.
"""

from __future__ import annotations

from stoker import _dataset
from stoker._stats import LoaderStatistics
from stoker._strings import StringArray
from stoker._worker_info import WorkerInfo, get_worker_info
from stoker.torch._cache import CachedDataset, CacheStatistics, cached
from stoker.torch._data import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
    random_split,
)
from stoker.torch._distributed import ShardedIterable
from stoker.torch._loading import DataLoader, StatefulDataLoader, default_collate, default_convert
from stoker.torch._sampling import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

__all__ = [
    "BatchSampler",
    "CacheStatistics",
    "CachedDataset",
    "ChainDataset",
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "DistributedSampler",
    "IterableDataset",
    "LoaderStatistics",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "ShardedIterable",
    "StackDataset",
    "StatefulDataLoader",
    "StringArray",
    "Subset",
    "SubsetRandomSampler",
    "TensorDataset",
    "WeightedRandomSampler",
    "WorkerInfo",
    "cached",
    "default_collate",
    "default_convert",
    "get_worker_info",
    "random_split",
]


def _publish() -> None:
    """Name this module as the home of its own classes and functions (tracebacks read
    ``stoker.torch.DataLoader``, pickles sent to spawned workers find them here), and tell
    stoker which of them are its own classes under another name."""
    import stoker

    for name in __all__:
        obj = globals()[name]
        if obj is getattr(stoker, name):
            continue  # stoker's own object (StringArray, get_worker_info, ...): stoker.X
        obj.__module__ = __name__
        if isinstance(obj, type):
            same = getattr(_dataset, name, None)
            if isinstance(same, type) and obj.__mro__[1] is same:
                _dataset.SAME_AS[obj] = same


_publish()
