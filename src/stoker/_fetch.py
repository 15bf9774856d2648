"""Fetchers: turn one task (a batch of indices, or one index) into one collated batch.

The same fetcher runs in the main process (``num_workers=0``) and inside workers, so
everything here is picklable and free of process logic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from stoker._batch import Alloc

CollateFn = Callable[[Any], Any]


class MapFetcher:
    """Fetches from a map-style dataset.

    With automatic batching a task is a list (or int64 array) of indices: the dataset's
    ``__getitems__`` is called once if it has one, else ``__getitem__`` per index, and the
    samples are collated. Without it, a task is one index and the sample is converted.
    Datasets whose class sets ``_stoker_index_array = True`` get indices as an int64 array;
    others get a list of Python ints, as torch gives them.
    """

    def __init__(self, dataset: Any, auto_collation: bool, collate_fn: CollateFn) -> None:
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn

    def fetch(self, index: Any, alloc: Alloc | None = None) -> Any:
        """The collated batch for ``index``; ``alloc`` goes to stoker's default collate."""
        ds = self.dataset
        if self.auto_collation:
            getitems = getattr(ds, "__getitems__", None)
            if getitems is not None:
                if isinstance(index, np.ndarray) and not getattr(ds, "_stoker_index_array", False):
                    index = index.tolist()
                data = getitems(index)
            else:
                if isinstance(index, np.ndarray):
                    index = index.tolist()
                data = [ds[i] for i in index]
        else:
            data = ds[index]
        return _call_collate(self.collate_fn, data, alloc)


class IterableFetcher:
    """Fetches from an iterable dataset: ``batch_size`` samples per task, or one sample.

    Raises ``StopIteration`` when the dataset is exhausted (or, with ``drop_last``, when
    fewer than ``batch_size`` samples remain).
    """

    def __init__(
        self,
        dataset: Any,
        auto_collation: bool,
        collate_fn: CollateFn,
        drop_last: bool,
        batch_size: int | None,
    ) -> None:
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        self.batch_size = batch_size
        self._it: Iterator[Any] | None = None
        self.ended = False

    def fetch(self, _index: Any = None, alloc: Alloc | None = None) -> Any:
        """The next batch (or sample) of the dataset's iterator."""
        if self.ended:
            raise StopIteration
        if self._it is None:
            self._it = iter(self.dataset)
        if self.auto_collation:
            assert self.batch_size is not None
            data = []
            for _ in range(self.batch_size):
                try:
                    data.append(next(self._it))
                except StopIteration:
                    self.ended = True
                    break
            if not data or (self.drop_last and len(data) < self.batch_size):
                self.ended = True
                raise StopIteration
        else:
            try:
                data = next(self._it)
            except StopIteration:
                self.ended = True
                raise
        return _call_collate(self.collate_fn, data, alloc)


def _call_collate(collate_fn: CollateFn, data: Any, alloc: Alloc | None) -> Any:
    if alloc is not None and getattr(collate_fn, "accepts_alloc", False):
        return collate_fn(data, alloc=alloc)  # type: ignore[call-arg]
    return collate_fn(data)
