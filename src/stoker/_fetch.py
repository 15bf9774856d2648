"""Fetchers: turn one task (a batch of indices, or one index) into one collated batch.

The same fetcher runs in the main process (``num_workers=0``) and inside workers, so
everything here is picklable and free of process logic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from stoker._batch import Alloc, set_output_alloc
from stoker._dataset import draws_nothing
from stoker._policy import only_stoker_code
from stoker._random import SampleSeeds, seed_globals
from stoker._stateful import is_stateful, resumed_iterator, take_state

CollateFn = Callable[[Any], Any]
MapFn = Callable[[Callable[[Any], Any], list[Any]], list[Any]]


class Skipped(NamedTuple):
    """What a fetch skipped: the failing sample ``indices``, the first ``error``
    (``"Type: message"``), and whether the whole batch was ``dropped``."""

    indices: list[Any]
    error: str
    dropped: bool




@dataclass(frozen=True)
class PlacedTask:
    """A batch's indices with the per-sample seeds of their places in the global order (an
    elastic ``DistributedSampler``'s task): each sample is fetched with the global RNGs
    seeded from its own seed, so its draws are the same at any world size or worker count.
    A slice is a part of the batch with its samples' seeds (a tail split keeps them)."""

    indices: np.ndarray[Any, Any]
    seeds: SampleSeeds

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, part: slice) -> PlacedTask:
        start = part.indices(len(self.indices))[0]
        return PlacedTask(indices=self.indices[part], seeds=self.seeds.after(start))

    def __repr__(self) -> str:  # how error messages name the batch's samples
        return repr(self.indices.tolist())


def placed_tasks(
    tasks: Iterator[Any], seeds: Callable[[], Callable[[int], SampleSeeds]]
) -> Iterator[PlacedTask]:
    """An epoch's index batches as :class:`PlacedTask`; ``seeds()``, called when the first
    batch is drawn (the epoch is fixed then), gives batch ``k``'s seeds."""
    of: Callable[[int], SampleSeeds] | None = None
    for k, task in enumerate(tasks):
        if of is None:
            of = seeds()
        yield PlacedTask(indices=np.asarray(task, dtype=np.int64), seeds=of(k))


class MapFetcher:
    """Fetches from a map-style dataset.

    With automatic batching a task is a list (or int64 array) of indices: the dataset's
    ``__getitems__`` is called once if it has one, else ``__getitem__`` per index, and the
    samples are collated. Without it, a task is one index and the sample is converted.
    Datasets whose class sets ``_stoker_index_array = True`` get indices as an int64 array,
    others a list of Python ints, as torch gives them.

    With ``skip_errors``, a batch whose loading raises is loaded again sample by sample and
    the samples that raise are left out (the same ones in every run); the collate function is
    not retried. :meth:`fetch_skipping` returns the record with the batch and keeps no state
    on the fetcher, which thread workers share; a batch whose every sample failed is None.
    """

    def __init__(
        self,
        dataset: Any,
        auto_collation: bool,
        collate_fn: CollateFn,
        skip_errors: bool = False,
    ) -> None:
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn
        self.skip_errors = skip_errors
        # Whether a fetch may draw from the global RNGs, so that each batch is seeded from
        # (seed, epoch, k) first; stoker's array datasets and default collate draw nothing.
        self.draws = not only_stoker_code(dataset, collate_fn)
        self._samples_draw = not draws_nothing(dataset)  # seeded one by one when placed

    def fetch(self, index: Any, alloc: Alloc | None = None) -> Any:
        """The collated batch for ``index``; ``alloc`` goes to stoker's default collate."""
        return self.fetch_skipping(index, alloc)[0]

    def fetch_skipping(
        self, index: Any, alloc: Alloc | None = None, map_fn: MapFn | None = None
    ) -> tuple[Any, Skipped | None]:
        """(batch, what was skipped or None); the batch is None when it is dropped.

        ``map_fn(fn, indices)`` loads the samples of a dataset without ``__getitems__``
        in place of ``[fn(i) for i in indices]`` (thread workers split slow batches so).
        """
        into = alloc if getattr(self.collate_fn, "accepts_alloc", False) else None
        set_output_alloc(into)
        try:
            data = self._load(index, map_fn)
        except Exception as exc:
            if not self.skip_errors:
                raise
            set_output_alloc(None)  # the reload sample by sample writes nothing there
            data, skipped = self._load_each(index, exc)
            if data is None:
                return None, skipped
            return _call_collate(self.collate_fn, data, alloc), skipped
        finally:
            set_output_alloc(None)
        return _call_collate(self.collate_fn, data, alloc), None

    def _load(self, index: Any, map_fn: MapFn | None = None) -> Any:
        ds = self.dataset
        if type(index) is PlacedTask:
            if not self._samples_draw:  # nothing to seed: the batch as any other
                return self._load(index.indices, map_fn)
            data: list[Any] = []  # one sample at a time, each under its own seed
            for i, seed in _seeded(index):
                data.extend(self._one(i, seed))
            return data
        if self.auto_collation:
            getitems = getattr(ds, "__getitems__", None)
            if getitems is not None:
                if isinstance(index, np.ndarray) and not getattr(ds, "_stoker_index_array", False):
                    index = index.tolist()
                return getitems(index)
            if isinstance(index, np.ndarray):
                index = index.tolist()
            if map_fn is not None:
                return map_fn(ds.__getitem__, index)
            return [ds[i] for i in index]
        return ds[index]

    def _load_each(self, index: Any, batch_error: Exception) -> tuple[list[Any] | None, Skipped]:
        """The samples of ``index`` that load, one by one, and the record of those that raise.

        Raises:
            Exception: ``batch_error`` again when every sample loads on its own.
        """
        if not self.auto_collation:
            one = int(index) if isinstance(index, (int, np.integer)) else index
            return None, Skipped(indices=[one], error=_error_text(batch_error), dropped=True)
        if type(index) is PlacedTask:
            pairs = _seeded(index)
        else:
            indices = index.tolist() if isinstance(index, np.ndarray) else list(index)
            pairs = [(i, None) for i in indices]
        data: list[Any] = []
        failed: list[int] = []
        first = ""
        for i, seed in pairs:
            try:
                data.extend(self._one(i, seed if self._samples_draw else None))
            except Exception as exc:
                failed.append(i)
                first = first or _error_text(exc)
        if not failed:  # the batch failed as a whole but each sample loads: not skippable
            raise batch_error
        return data or None, Skipped(indices=failed, error=first, dropped=not data)

    def _one(self, i: int, seed: int | None) -> Any:
        """Sample ``i`` as a batch of one, fetched alone (through ``__getitems__`` where
        the dataset has it), with the global RNGs seeded from ``seed`` unless it is None."""
        if seed is not None:
            seed_globals(seed)
        ds = self.dataset
        getitems = getattr(ds, "__getitems__", None)
        if getitems is None:
            return [ds[i]]
        as_array = getattr(ds, "_stoker_index_array", False)
        return getitems(np.array([i], np.int64) if as_array else [i])


class IterableFetcher:
    """Fetches from an iterable dataset: ``batch_size`` samples per task, or one sample.

    Raises ``StopIteration`` when the dataset is exhausted (or, with ``drop_last``, when
    fewer than ``batch_size`` samples remain). ``resume``: a worker's state
    (:func:`~stoker._stateful.take_state`) the next iterator starts from; ``stateful``:
    whether the dataset or the current iterator has a state to take (:meth:`state`).
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
        self.draws = True  # the dataset's own code runs: it may draw
        self.batch_size = batch_size
        self._it: Iterator[Any] | None = None
        self.ended = False
        self.resume: dict[str, Any] | None = None
        self.stateful = is_stateful(dataset)

    def restart(self) -> None:
        """Start the dataset's iteration afresh at the next fetch (a new epoch)."""
        self._it = None
        self.ended = False

    def state(self) -> dict[str, Any]:
        """The state of the dataset and its iterator after the last batch fetched."""
        return take_state(self.dataset, self._it)

    def fetch(self, _index: Any = None, alloc: Alloc | None = None) -> Any:
        """The next batch (or sample) of the dataset's iterator."""
        if self.ended:
            raise StopIteration
        if self._it is None:
            self._it = resumed_iterator(self.dataset, self.resume)
            self.resume = None
            self.stateful = is_stateful(self.dataset) or is_stateful(self._it)
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

    def fetch_skipping(self, index: Any = None, alloc: Alloc | None = None) -> tuple[Any, None]:
        """(the next batch, None): skipping applies to map-style datasets only."""
        return self.fetch(index, alloc), None


def _seeded(task: PlacedTask) -> list[tuple[int, int | None]]:
    """``(index, seed)`` of each sample of ``task`` (seed None: nothing to seed)."""
    indices = task.indices.tolist()
    return list(zip(indices, task.seeds.of(len(indices)), strict=True))


def _error_text(exc: BaseException) -> str:
    """``"Type: message"`` of an exception.

    >>> _error_text(KeyError("x"))
    "KeyError: 'x'"
    """
    return f"{type(exc).__name__}: {exc}"


def _call_collate(collate_fn: CollateFn, data: Any, alloc: Alloc | None) -> Any:
    if alloc is not None and getattr(collate_fn, "accepts_alloc", False):
        return collate_fn(data, alloc=alloc)  # type: ignore[call-arg]
    return collate_fn(data)
