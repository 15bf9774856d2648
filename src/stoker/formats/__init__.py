"""Storage formats: LMDB files and tar shards (WebDataset layout), local or remote.

- :class:`LMDBWriter` / :class:`LMDBDataset`: one LMDB file, map-style.
- :class:`ShardWriter` / :class:`ShardDataset`: tar shards with an index beside each,
  map-style; :class:`ShardIterable`: the same shards streamed, shuffled, split across
  ranks x workers, resumable.
- :func:`pack` / :func:`inspect`: what ``stoker pack`` and ``stoker inspect`` run.

Readers never unpickle: values are raw bytes, ``.npy`` arrays (``allow_pickle=False``),
JSON, ints or text. Writers write to a temporary name and rename on success. Remote
paths go through fsspec (``pip install 'stoker[remote]'``), configured by the
``storage_options`` argument, which the readers pickle to their workers (``spawn`` and
``forkserver`` workers do not see the parent's ``fsspec.config.conf``); LMDB needs
``stoker[lmdb]``.
"""

from __future__ import annotations

from stoker.formats._codec import CorruptRecordError
from stoker.formats._index import TruncatedShardError
from stoker.formats._lmdb import LMDBDataset, LMDBWriter
from stoker.formats._pack import PackSummary, inspect, pack
from stoker.formats._stream import ShardIterable
from stoker.formats._tar import ShardDataset, ShardWriter

__all__ = [
    "CorruptRecordError",
    "LMDBDataset",
    "LMDBWriter",
    "PackSummary",
    "ShardDataset",
    "ShardIterable",
    "ShardWriter",
    "TruncatedShardError",
    "inspect",
    "pack",
]

# Public objects report the public path, so tracebacks read ``stoker.formats.LMDBDataset``
# and pickles (sent to workers, stored in checkpoints) survive moving a private module.
for _name in __all__:
    globals()[_name].__module__ = "stoker.formats"
del _name
