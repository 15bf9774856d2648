"""stoker: keeps the accelerator fed.

A fast data loader with torch.utils.data's names. This is the NumPy-native front door
(``from stoker import DataLoader``, no torch needed: batches are NumPy arrays unless the
samples hold tensors); :mod:`stoker.torch` is the PyTorch drop-in. The contract is
``docs/contract.md``; the map of modules is ``src/stoker/README.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stoker._collate import default_collate, default_convert
    from stoker._dataset import (
        ChainDataset,
        ConcatDataset,
        Dataset,
        IterableDataset,
        StackDataset,
        Subset,
        TensorDataset,
        random_split,
    )
    from stoker._distributed import DistributedSampler, ShardedIterable
    from stoker._loader import DataLoader, StatefulDataLoader
    from stoker._sampler import (
        BatchSampler,
        RandomSampler,
        Sampler,
        SequentialSampler,
        SubsetRandomSampler,
        WeightedRandomSampler,
    )
    from stoker._stats import LoaderStatistics
    from stoker._strings import StringArray
    from stoker._worker_info import WorkerInfo, get_worker_info

# Where each public name lives. ``import stoker`` loads none of it (not even NumPy, the
# slowest part): a name's module is imported on first use, e.g. by ``from stoker import X``.
_HOME = {
    "CacheStatistics": "_cache",
    "CachedDataset": "_cache",
    "cached": "_cache",
    "default_collate": "_collate",
    "default_convert": "_collate",
    "ChainDataset": "_dataset",
    "ConcatDataset": "_dataset",
    "Dataset": "_dataset",
    "IterableDataset": "_dataset",
    "StackDataset": "_dataset",
    "Subset": "_dataset",
    "TensorDataset": "_dataset",
    "random_split": "_dataset",
    "DistributedSampler": "_distributed",
    "ShardedIterable": "_distributed",
    "DataLoader": "_loader",
    "BatchSampler": "_sampler",
    "RandomSampler": "_sampler",
    "Sampler": "_sampler",
    "StatefulDataLoader": "_loader",
    "SequentialSampler": "_sampler",
    "SubsetRandomSampler": "_sampler",
    "WeightedRandomSampler": "_sampler",
    "LoaderStatistics": "_stats",
    "StringArray": "_strings",
    "WorkerInfo": "_worker_info",
    "get_worker_info": "_worker_info",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'stoker' has no attribute {name!r}")
    module = importlib.import_module(f"stoker.{home}")
    # Public objects report the public path, so tracebacks read ``stoker.RandomSampler``
    # and pickles (sent to workers, stored in checkpoints) survive moving a private module.
    for public, where in _HOME.items():
        if where == home:
            obj = getattr(module, public)
            obj.__module__ = "stoker"
            globals()[public] = obj
    return globals()[name]


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])


__version__ = "0.1.0"

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
