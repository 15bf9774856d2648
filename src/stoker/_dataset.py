"""Datasets: the map-style and iterable base classes, their combinators, and ``random_split``.

The names, signatures and behaviour are those of ``torch.utils.data``; a class written
against torch's protocol (``__getitem__``/``__len__``, or ``__iter__``) works unchanged, and
a torch ``Dataset`` instance is accepted wherever a stoker dataset is.

Beyond torch, the combinators fetch whole batches at once through ``__getitems__``:
``TensorDataset`` returns a lazy :class:`~stoker._batch.ColumnBatch` (one fancy index per
column), and ``Subset``, ``ConcatDataset`` and ``StackDataset`` map the batch's indices with
NumPy and pass them on to the inner datasets' ``__getitems__``. Classes whose
``__getitems__`` accepts an int64 array set ``_stoker_index_array = True`` (see
``_fetch.py``); a user subclass that writes its own ``__getitems__`` is given torch's list
of ints unless it sets the flag itself. A subclass that overrides ``__getitem__`` but not
``__getitems__`` gets the batch through its own ``__getitem__``, so its override is never
bypassed.
"""

from __future__ import annotations

import bisect
import itertools
import math
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np

from stoker import _torch
from stoker._batch import ColumnBatch
from stoker._random import GeneratorLike, check_generator, draw_seed, rng, torch_stream
from stoker.errors import ArgumentError, ArgumentTypeError

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

IndexArray = np.ndarray[Any, np.dtype[np.int64]]


class SizedDataset(Protocol[T_co]):
    """What a map-style dataset supplies: ``__getitem__`` and ``__len__`` (torch's protocol)."""

    def __getitem__(self, index: Any, /) -> T_co: ...

    def __len__(self) -> int: ...


class Dataset(Generic[T_co]):
    """A map from keys (usually ``0 .. len - 1``) to samples; subclasses define ``__getitem__``.

    Subclasses usually define ``__len__`` too (samplers need it), and may define
    ``__getitems__(indices)`` returning the list of samples of a whole batch, which the
    loader then calls once per batch. ``a + b`` concatenates two datasets.

    >>> class Squares(Dataset):
    ...     def __len__(self):
    ...         return 4
    ...     def __getitem__(self, i):
    ...         return i * i
    >>> [Squares()[i] for i in range(4)], len(Squares() + Squares())
    ([0, 1, 4, 9], 8)
    """

    _stoker_index_array: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Clears the index-array flag for subclasses that bring their own ``__getitems__``."""
        super().__init_subclass__(**kwargs)
        # A subclass that writes its own __getitems__ gets torch's list of ints unless it
        # says it takes an array, even when a stoker base class (TensorDataset...) does.
        if "__getitems__" in cls.__dict__ and "_stoker_index_array" not in cls.__dict__:
            cls._stoker_index_array = False

    def __getitem__(self, index: Any) -> T_co:
        raise NotImplementedError(
            f"{type(self).__name__} must define __getitem__(index) returning one sample; "
            "subclasses of Dataset implement it."
        )

    def __add__(self, other: SizedDataset[T_co]) -> ConcatDataset[T_co]:
        members: list[SizedDataset[T_co]] = [self, other]  # type: ignore[list-item]
        return ConcatDataset(members)


# Generic last, as in torch's MRO, so that stoker.torch can subclass both IterableDatasets.
class IterableDataset(Dataset[T_co], Iterable[T_co], Generic[T_co]):
    """A stream of samples; subclass it and define ``__iter__``.

    With worker processes each worker iterates its own copy, so a dataset that must not
    repeat samples shards itself using ``get_worker_info()``. ``a + b`` chains two streams.

    >>> class Count(IterableDataset):
    ...     def __iter__(self):
    ...         return iter(range(3))
    >>> list(Count() + Count())
    [0, 1, 2, 0, 1, 2]
    """

    def __add__(self, other: Iterable[T_co]) -> ChainDataset:  # type: ignore[override]
        return ChainDataset([self, other])


def is_iterable_dataset(obj: object) -> bool:
    """Whether ``obj`` is an iterable-style dataset: stoker's, or torch's if torch is imported.

    >>> is_iterable_dataset(ChainDataset([])), is_iterable_dataset(TensorDataset(np.zeros(2)))
    (True, False)
    """
    if isinstance(obj, IterableDataset):
        return True
    torch = _torch.loaded()
    if torch is None:
        return False
    torch_data = getattr(getattr(torch, "utils", None), "data", None)
    torch_iterable = getattr(torch_data, "IterableDataset", None)
    return torch_iterable is not None and isinstance(obj, torch_iterable)


class TensorDataset(Dataset[tuple[Any, ...]]):
    """Rows of NumPy arrays or torch tensors: sample ``i`` is ``tuple(t[i] for t in tensors)``.

    A batch is fetched with one fancy index per array (no per-sample Python).

    Args:
        *tensors: arrays or tensors sharing the size of their first dimension.

    Raises:
        ValueError: no arrays were given.
        ArgumentError: their first dimensions differ (an ``AssertionError``, as torch
            raises, and a ``ValueError``).
        TypeError: an argument is not an array or tensor.
        IndexError: an argument is 0-d (torch raises IndexError there too).

    >>> ds = TensorDataset(np.arange(6).reshape(3, 2), np.array([10, 11, 12]))
    >>> len(ds)
    3
    >>> x, y = ds[1]
    >>> x.tolist(), int(y)
    ([2, 3], 11)
    >>> [int(y) for _, y in ds.__getitems__([2, 0])]
    [12, 10]
    """

    _stoker_index_array: ClassVar[bool] = True
    tensors: tuple[Any, ...]

    def __init__(self, *tensors: Any) -> None:
        if not tensors:
            raise ValueError(
                "TensorDataset needs at least one array or tensor, got none; "
                "pass them as TensorDataset(inputs, targets)."
            )
        lengths = []
        for pos, t in enumerate(tensors):
            shape = getattr(t, "shape", None)
            if shape is None:
                raise TypeError(
                    f"TensorDataset takes NumPy arrays or torch tensors, but argument {pos} is "
                    f"a {type(t).__name__}; convert it with numpy.asarray(...) first."
                )
            if len(shape) == 0:
                raise IndexError(
                    f"TensorDataset needs arrays with a first (sample) dimension, but argument "
                    f"{pos} is 0-d; reshape it to (n, ...)."
                )
            lengths.append(int(shape[0]))
        if any(n != lengths[0] for n in lengths):
            raise ArgumentError(
                "Size mismatch between tensors: TensorDataset needs every array to have the "
                f"same size in its first dimension (one row per sample), got sizes {lengths}; "
                "slice them to a common length."
            )
        self.tensors = tuple(tensors)

    def __getitem__(self, index: Any) -> tuple[Any, ...]:
        return tuple(t[index] for t in self.tensors)

    def __getitems__(self, indices: Sequence[int] | IndexArray) -> Sequence[Any]:
        """The samples at ``indices`` as a lazy :class:`ColumnBatch` (a sequence of tuples)."""
        if type(self).__getitem__ is not TensorDataset.__getitem__:
            return [self[i] for i in _int_list(indices)]
        return ColumnBatch(self.tensors, _checked_indices(indices, len(self)))

    def __len__(self) -> int:
        return int(self.tensors[0].shape[0])


class StackDataset(Dataset[Any]):
    """Zips datasets of equal length: samples are tuples (positional) or dicts (keywords).

    ``StackDataset(a, b)[i] == (a[i], b[i])``;
    ``StackDataset(x=a, y=b)[i] == {"x": a[i], "y": b[i]}``.

    Args:
        *args: datasets whose samples form a tuple.
        **kwargs: datasets whose samples form a dict under these keys.

    Raises:
        ValueError: both or neither of ``args`` and ``kwargs`` given, or lengths differ.

    >>> StackDataset([1, 2], ["a", "b"])[1]
    (2, 'b')
    >>> StackDataset(x=[1, 2], y=["a", "b"])[0]
    {'x': 1, 'y': 'a'}
    """

    _stoker_index_array: ClassVar[bool] = True
    datasets: tuple[Any, ...] | dict[str, Any]

    def __init__(self, *args: SizedDataset[Any], **kwargs: SizedDataset[Any]) -> None:
        if args and kwargs:
            raise ValueError(
                "Supported either tuple- (via args) or dict- (via kwargs) like input/output, "
                "but both types are given: pass StackDataset's datasets either "
                "positionally (tuple samples) or by keyword (dict samples)."
            )
        if not args and not kwargs:
            raise ValueError(
                "At least one dataset should be passed: StackDataset got none; pass the "
                "datasets to zip, e.g. StackDataset(images, labels)."
            )
        members: dict[str, Any] = (
            kwargs if kwargs else {f"argument {i}": d for i, d in enumerate(args)}
        )
        lengths = {name: len(d) for name, d in members.items()}
        if len(set(lengths.values())) > 1:
            found = ", ".join(f"{name}: {n}" for name, n in lengths.items())
            raise ValueError(
                f"Size mismatch between datasets: StackDataset needs datasets of equal length, "
                f"got {found}; wrap the longer ones in Subset to align them."
            )
        self._length = next(iter(lengths.values()))
        self.datasets = dict(kwargs) if kwargs else tuple(args)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(self.datasets, dict):
            return {key: d[index] for key, d in self.datasets.items()}
        return tuple(d[index] for d in self.datasets)

    def __getitems__(self, indices: Sequence[int] | IndexArray) -> list[Any]:
        """The samples at ``indices``, each member fetched once for the whole batch."""
        if type(self).__getitem__ is not StackDataset.__getitem__:
            return [self[i] for i in _int_list(indices)]
        batch = _Indices(indices)
        if isinstance(self.datasets, dict):
            keys = list(self.datasets)
            columns = [_fetch_rows(d, batch) for d in self.datasets.values()]
            return [dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)]
        return list(zip(*[_fetch_rows(d, batch) for d in self.datasets], strict=True))

    def __len__(self) -> int:
        return self._length


class ConcatDataset(Dataset[T_co]):
    """The datasets one after another: indices ``0 .. len(a) - 1`` are ``a``, then ``b``...

    Args:
        datasets: map-style datasets (stoker's, torch's, or anything with ``__getitem__``
            and ``__len__``).

    Raises:
        ArgumentError: ``datasets`` is empty (an ``AssertionError``, as in torch, and a
            ``ValueError``).
        ArgumentTypeError: a member is an iterable-style dataset (use ``ChainDataset``;
            an ``AssertionError``, as in torch, and a ``TypeError``).

    >>> both = ConcatDataset([[0, 1, 2], [10, 11]])
    >>> len(both), both[3]
    (5, 10)
    """

    _stoker_index_array: ClassVar[bool] = True
    datasets: list[SizedDataset[T_co]]
    cumulative_sizes: list[int]

    @staticmethod
    def cumsum(sequence: Iterable[SizedDataset[Any]]) -> list[int]:
        """The running totals of the lengths of ``sequence``'s members."""
        return list(itertools.accumulate(len(d) for d in sequence))

    def __init__(self, datasets: Iterable[SizedDataset[T_co]]) -> None:
        super().__init__()
        self.datasets = list(datasets)
        if not self.datasets:
            raise ArgumentError(
                "datasets should not be an empty iterable: ConcatDataset needs at least one "
                "dataset to concatenate."
            )
        for pos, d in enumerate(self.datasets):
            if is_iterable_dataset(d):
                raise ArgumentTypeError(
                    f"ConcatDataset does not support IterableDataset: member {pos} is one "
                    f"({type(d).__name__}); chain streams with ChainDataset."
                )
        self.cumulative_sizes = self.cumsum(self.datasets)
        self._cum = np.asarray(self.cumulative_sizes, dtype=np.int64)

    @property
    def cummulative_sizes(self) -> list[int]:
        """Deprecated misspelling of :attr:`cumulative_sizes`, kept as torch keeps it."""
        warnings.warn(
            "`cummulative_sizes` attribute is renamed to `cumulative_sizes`",
            FutureWarning,
            stacklevel=2,
        )
        return self.cumulative_sizes

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx: Any) -> T_co:
        n = len(self)
        if idx < 0:
            if -idx > n:
                raise ValueError(
                    f"absolute value of index should not exceed dataset length: index {idx} "
                    f"is out of range for length {n}."
                )
            idx = n + idx
        elif idx >= n:
            raise IndexError(f"index {idx} is out of range for a dataset of length {n}.")
        member = bisect.bisect_right(self.cumulative_sizes, idx)
        start = self.cumulative_sizes[member - 1] if member > 0 else 0
        return self.datasets[member][idx - start]

    def __getitems__(self, indices: Sequence[int] | IndexArray) -> Sequence[Any]:
        """The samples at ``indices``, each member dataset asked once for its share."""
        if type(self).__getitem__ is not ConcatDataset.__getitem__:
            return [self[i] for i in _int_list(indices)]
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if idx.size == 0:
            return []
        low, high = int(idx.min()), int(idx.max())
        if low < -n:
            raise ValueError(
                f"absolute value of index should not exceed dataset length: index {low} "
                f"is out of range for length {n}."
            )
        if high >= n:
            raise IndexError(f"index {high} is out of range for a dataset of length {n}.")
        if low < 0:
            idx = np.where(idx < 0, idx + n, idx)
        member = np.searchsorted(self._cum, idx, side="right")
        starts = np.concatenate(([0], self._cum[:-1]))
        local = idx - starts[member]
        first = int(member[0])
        if (member == first).all():
            return _fetch_rows(self.datasets[first], _Indices(local))
        order = np.argsort(member, kind="stable")
        cuts = np.flatnonzero(np.diff(member[order])) + 1
        groups = np.split(order, cuts)
        parts = [_fetch_rows(self.datasets[int(member[g[0]])], _Indices(local[g])) for g in groups]
        merged = _merge_column_batches(parts, order)
        if merged is not None:
            return merged
        out: list[Any] = [None] * len(idx)
        for positions, rows in zip(groups, parts, strict=True):
            for pos, sample in zip(positions.tolist(), rows, strict=True):
                out[pos] = sample
        return out


def _merge_column_batches(parts: list[Sequence[Any]], order: IndexArray) -> ColumnBatch | None:
    """One ColumnBatch for a batch fetched in ``parts`` (samples ``order`` in batch order).

    Each part's columns are gathered and concatenated, and the merged batch indexes them
    back into batch order, so no per-sample Python runs. Returns None unless every part is
    a ColumnBatch of the same layout whose columns agree in kind, dtype and row shape.
    """
    if not all(isinstance(p, ColumnBatch) for p in parts):
        return None
    batches: list[ColumnBatch] = parts  # type: ignore[assignment]
    first = batches[0]
    if any(len(b.sources) != len(first.sources) or b.keys != first.keys for b in batches):
        return None
    columns = []
    for col in zip(*(b.gather() for b in batches), strict=True):
        kinds = {(_torch.is_tensor(c), str(c.dtype), tuple(c.shape[1:])) for c in col}
        if len(kinds) != 1:
            return None
        if _torch.is_tensor(col[0]):
            torch = _torch.loaded()
            assert torch is not None  # a tensor exists, so torch is imported
            columns.append(torch.cat(col))
        else:
            columns.append(np.concatenate(col))
    rows = np.empty(len(order), dtype=np.int64)
    rows[order] = np.arange(len(order), dtype=np.int64)
    return ColumnBatch(columns, rows, first.keys)


class ChainDataset(IterableDataset[Any]):
    """Iterable datasets one after another, chained on the fly.

    Args:
        datasets: iterable-style datasets (stoker's or torch's).

    Raises:
        ArgumentTypeError: a member is not an iterable-style dataset, when it is reached
            by ``__iter__`` or ``len()``, as torch checks it (an ``AssertionError``, as
            torch raises, and a ``TypeError``).

    >>> class Count(IterableDataset):
    ...     def __iter__(self):
    ...         return iter(range(2))
    >>> list(ChainDataset([Count(), Count()]))
    [0, 1, 0, 1]
    """

    def __init__(self, datasets: Iterable[Any]) -> None:
        super().__init__()
        self.datasets = datasets

    def __iter__(self) -> Iterator[Any]:
        for pos, d in enumerate(self.datasets):
            _check_chain_member(pos, d)
            yield from d

    def __len__(self) -> int:
        total = 0
        for pos, d in enumerate(self.datasets):
            _check_chain_member(pos, d)
            total += len(d)
        return total


def _check_chain_member(pos: int, d: object) -> None:
    if not is_iterable_dataset(d):
        raise ArgumentTypeError(
            f"ChainDataset only supports IterableDataset: member {pos} is a "
            f"{type(d).__name__}; concatenate map-style datasets with ConcatDataset."
        )


class Subset(Dataset[T_co]):
    """The samples of ``dataset`` at ``indices``: ``Subset(d, idx)[i] == d[idx[i]]``.

    Args:
        dataset: the whole dataset (stoker's, torch's, or any map-style object).
        indices: the indices into ``dataset`` that make up the subset.

    >>> part = Subset([10, 11, 12, 13], [3, 0])
    >>> len(part), part[0], part[1]
    (2, 13, 10)
    """

    _stoker_index_array: ClassVar[bool] = True
    dataset: SizedDataset[T_co]
    indices: Sequence[int]

    def __init__(self, dataset: SizedDataset[T_co], indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = indices
        self._index_cache: tuple[object, IndexArray | None] | None = None

    def __getitem__(self, idx: Any) -> T_co:
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __getitems__(self, indices: Sequence[int] | IndexArray) -> Sequence[Any]:
        """The samples at ``indices``, fetched from ``dataset`` in one call when it can."""
        if type(self).__getitem__ is not Subset.__getitem__:
            return [self[i] for i in _int_list(indices)]
        table = self._index_array()
        if table is None:  # non-integer keys: map them one by one, as torch does
            keys = [self.indices[i] for i in _int_list(indices)]
            getitems = getattr(self.dataset, "__getitems__", None)
            if callable(getitems):
                return getitems(keys)  # type: ignore[no-any-return]
            return [self.dataset[k] for k in keys]
        return _fetch_rows(self.dataset, _Indices(table[np.asarray(indices, dtype=np.int64)]))

    def __len__(self) -> int:
        return len(self.indices)

    def _index_array(self) -> IndexArray | None:
        """``indices`` as an int64 array (cached), or None when they are not integers."""
        cache = self._index_cache
        if cache is not None and cache[0] is self.indices:
            table = cache[1]
            if table is None or len(table) == len(self.indices):
                return table
        arr = np.asarray(self.indices)
        table = None
        if arr.size == 0:
            table = np.empty(0, dtype=np.int64)
        elif arr.ndim == 1 and arr.dtype.kind in "iu":
            table = arr.astype(np.int64, copy=False)
        self._index_cache = (self.indices, table)
        return table

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_index_cache"] = None  # rebuilt on first use; keeps worker pickles small
        return state


def random_split(
    dataset: SizedDataset[T],
    lengths: Sequence[int | float],
    generator: GeneratorLike = None,
) -> list[Subset[T]]:
    """Splits ``dataset`` at random into non-overlapping subsets of the given lengths.

    ``lengths`` are sizes summing to ``len(dataset)`` or fractions summing to 1 (rounded
    to sizes as torch does; an empty split gives a warning).

    Args:
        dataset: the dataset to split.
        lengths: the size, or the fraction, of each split.
        generator: a ``torch.Generator``, or None with torch imported, gives torch's split
            (``torch.randperm``); an int seed, a ``numpy.random.Generator``, or None without
            torch draw one seed and permute with NumPy.

    Returns:
        One :class:`Subset` per entry of ``lengths``.

    Raises:
        ValueError: a fraction is outside [0, 1], a length is negative, or the lengths do
            not add up to ``len(dataset)``.
        TypeError: a length is not an int or a fraction, or ``generator`` is of another kind.

    >>> parts = random_split(range(10), [0.3, 0.7], generator=0)
    >>> [len(p) for p in parts]
    [3, 7]
    >>> sorted(parts[0].indices + parts[1].indices) == list(range(10))
    True
    >>> [len(p) for p in random_split(range(5), [0.5, 0.5], generator=1)]
    [3, 2]
    """
    check_generator(generator)
    n = len(dataset)
    total = sum(lengths)
    if math.isclose(total, 1) and total <= 1:
        lengths = _sizes_of_fractions(lengths, n)
    _check_sizes(lengths, n)
    order = _permutation(n, generator)
    ends = itertools.accumulate(int(s) for s in lengths)
    return [
        Subset(dataset, order[end - int(size) : end])
        for end, size in zip(ends, lengths, strict=True)
    ]


def _sizes_of_fractions(fractions: Sequence[int | float], n: int) -> list[int]:
    """Split sizes for ``fractions`` of ``n`` samples, the remainder dealt out as torch does.

    Each size is ``floor(fraction * n)``; the samples left over go one at a time to the
    splits in order. A split left empty gives torch's warning, pointing at the caller of
    :func:`random_split`.
    """
    sizes: list[int] = []
    for pos, frac in enumerate(fractions):
        if not 0 <= frac <= 1:
            raise ValueError(
                f"Fraction at index {pos} is not between 0 and 1: it is {frac}; give "
                "fractions in [0, 1] summing to 1, or sizes."
            )
        sizes.append(math.floor(n * frac))
    for i in range(n - sum(sizes)):
        sizes[i % len(sizes)] += 1
    for pos, count in enumerate(sizes):
        if count == 0:
            warnings.warn(
                f"Length of split at index {pos} is 0. This might result in an empty dataset.",
                UserWarning,
                stacklevel=3,
            )
    return sizes


def _check_sizes(lengths: Sequence[int | float], n: int) -> None:
    """Raises unless ``lengths`` are non-negative ints that add up to ``n``."""
    if sum(lengths) != n:
        raise ValueError(
            "Sum of input lengths does not equal the length of the input dataset: lengths "
            f"{list(lengths)} add up to {sum(lengths)}, but the dataset has {n} samples; give "
            "sizes summing to that, or fractions summing to 1."
        )
    for pos, size in enumerate(lengths):
        if not isinstance(size, (int, np.integer)):
            raise TypeError(
                f"lengths must be ints (or fractions summing to 1), but the one at index {pos} "
                f"is {size!r}, a {type(size).__name__}."
            )
        if size < 0:
            raise ValueError(f"lengths must be >= 0, but the one at index {pos} is {size}.")


def _permutation(n: int, generator: GeneratorLike) -> list[int]:
    """A random order of ``range(n)``: torch's ``randperm`` on a torch stream, else NumPy's."""
    stream = torch_stream(generator)
    if stream is not None:
        torch = _torch.loaded()
        assert torch is not None, "a torch stream needs torch"
        order: list[int] = torch.randperm(n, generator=stream).tolist()
        return order
    order = rng(draw_seed(generator)).permutation(n).tolist()
    return order


# Classes that only rename a stoker class (stoker.torch's), mapped to the class they equal.
SAME_AS: dict[type, type] = {}


def draws_nothing(dataset: object) -> bool:
    """Whether loading from ``dataset`` surely draws nothing from the global RNGs, because
    only stoker's code runs: a TensorDataset of NumPy arrays or torch tensors, or a Subset,
    ConcatDataset or StackDataset of such (exact classes: a subclass may draw). The loader
    need not seed the global RNGs for its batches, which for tiny ones costs more than the
    loading.

    >>> x = np.zeros((4, 2))
    >>> draws_nothing(Subset(TensorDataset(x), [1, 2])), draws_nothing([x[0], x[1]])
    (True, False)
    """
    kind = type(dataset)
    kind = SAME_AS.get(kind, kind)
    if kind is TensorDataset:
        torch = _torch.loaded()
        plain = (np.ndarray, np.memmap, *((torch.Tensor,) if torch is not None else ()))
        return all(type(t) in plain for t in dataset.tensors)  # type: ignore[attr-defined]
    if kind is Subset:
        indices = dataset.indices  # type: ignore[attr-defined]
        return type(indices) in (list, tuple, range, np.ndarray) and draws_nothing(
            dataset.dataset  # type: ignore[attr-defined]
        )
    if kind is ConcatDataset:
        return all(map(draws_nothing, dataset.datasets))  # type: ignore[attr-defined]
    if kind is StackDataset:
        members = dataset.datasets  # type: ignore[attr-defined]
        return all(map(draws_nothing, members.values() if isinstance(members, dict) else members))
    return False


class _Indices:
    """A batch of indices as an int64 array, with its list of ints made once on demand."""

    __slots__ = ("_list", "array")

    def __init__(self, indices: Sequence[int] | IndexArray) -> None:
        self.array: IndexArray = np.asarray(indices, dtype=np.int64).reshape(-1)
        self._list = indices if isinstance(indices, list) else None

    def as_list(self) -> list[int]:
        """The indices as Python ints, as torch passes them."""
        if self._list is None:
            self._list = self.array.tolist()
        return self._list


def _fetch_rows(dataset: Any, batch: _Indices) -> Sequence[Any]:
    """``dataset``'s samples at ``batch``: one ``__getitems__`` call if it has one."""
    getitems = getattr(dataset, "__getitems__", None)
    if not callable(getitems):
        return [dataset[i] for i in batch.as_list()]
    wants_array = getattr(dataset, "_stoker_index_array", False)
    rows = getitems(batch.array if wants_array else batch.as_list())
    if len(rows) != len(batch.array):
        raise ValueError(
            f"Nested dataset's output size mismatch. Expected {len(batch.array)}, got "
            f"{len(rows)}: {type(dataset).__name__}.__getitems__ must return one sample per "
            "index it is given."
        )
    return rows  # type: ignore[no-any-return]


def _int_list(indices: Sequence[int] | IndexArray) -> list[int]:
    """``indices`` as a list of Python ints (what ``__getitem__`` expects)."""
    if isinstance(indices, np.ndarray):
        return indices.tolist()  # type: ignore[no-any-return]
    return [int(i) for i in indices]


def _checked_indices(indices: Sequence[int] | IndexArray, n: int) -> IndexArray:
    """``indices`` as an int64 array in ``[0, n)``, negatives counted from the end.

    >>> _checked_indices([0, -1], 5).tolist()
    [0, 4]
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    if idx.size and int(idx.view(np.uint64).max()) >= n:  # negatives or out of range
        low, high = int(idx.min()), int(idx.max())
        if low < -n or high >= n:
            bad = low if low < -n else high
            raise IndexError(f"index {bad} is out of range for a dataset of {n} samples.")
        if low < 0:
            idx = np.where(idx < 0, idx + n, idx)
    return idx
