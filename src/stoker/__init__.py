"""stoker: keeps the accelerator fed.

A fast, drop-in replacement for ``torch.utils.data`` that is NumPy-native: change one import
(``from stoker import DataLoader``) and keep the training script; without torch, batches are
NumPy arrays. The contract is API.md; the map of modules is ``src/stoker/README.md``.
"""

from __future__ import annotations

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
from stoker._loader import DataLoader
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

__version__ = "0.1.0"

__all__ = [
    "BatchSampler",
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
    "StringArray",
    "Subset",
    "SubsetRandomSampler",
    "TensorDataset",
    "WeightedRandomSampler",
    "WorkerInfo",
    "default_collate",
    "default_convert",
    "get_worker_info",
    "random_split",
]

# Public objects report the public path, so tracebacks read ``stoker.RandomSampler`` and
# pickles (sent to workers, stored in checkpoints) survive moving a private module.
for _name in __all__:
    globals()[_name].__module__ = "stoker"
del _name
