"""Samplers: the order in which a map-style dataset is read, as in ``torch.utils.data``.

Every stoker sampler draws its randomness with NumPy from a seed (see ``stoker._random``)
and computes a whole epoch at once in ``_epoch_indices()`` (an int64 array); ``__iter__``
is built on it, and the loader's fast path (``epoch_indices`` / ``batch_arrays`` below)
slices that array into batches without creating a Python int per index.

``generator`` (for the random samplers) may be:

- None: each epoch (each ``__iter__``) draws a seed from torch's global RNG if torch is
  imported, else NumPy's (so ``torch.manual_seed`` / ``np.random.seed`` repeat a run);
- a ``numpy.random.Generator`` or ``torch.Generator``: each epoch draws its seed from it,
  advancing it as torch's samplers do;
- an int seed: epoch ``e`` of the sampler uses ``rng(seed, e)``, where ``e`` counts the
  sampler's ``__iter__`` calls, so epochs differ and runs repeat.
"""

from __future__ import annotations

import itertools
import operator
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from stoker import _torch
from stoker._random import GeneratorLike, check_generator, draw_seed, rng

T_co = TypeVar("T_co", covariant=True)
IndexArray = npt.NDArray[np.int64]

_U64 = 2**64

# ``__iter__`` functions known to be exactly ``iter(self._epoch_indices().tolist())``; a
# subclass that overrides ``__iter__`` is then iterated, never bypassed by the fast path.
_FAST_ITERS: set[object] = set()

_F = TypeVar("_F", bound=Callable[..., Any])


def _fast_iter(fn: _F) -> _F:
    """Mark ``fn`` as an ``__iter__`` equivalent to iterating ``_epoch_indices()``."""
    _FAST_ITERS.add(fn)
    return fn


def epoch_indices(sampler: object) -> IndexArray | None:
    """One epoch of ``sampler`` as an int64 array, or None if it must be iterated instead.

    Consumes the sampler's randomness exactly as one ``iter(sampler)`` would. Returns None
    for samplers that are not stoker's (e.g. torch's) and for subclasses that override
    ``__iter__``.

    >>> epoch_indices(SequentialSampler(range(3)))
    array([0, 1, 2])
    >>> epoch_indices([2, 0, 1]) is None
    True
    """
    if getattr(type(sampler), "__iter__", None) not in _FAST_ITERS:
        return None
    indices: IndexArray = sampler._epoch_indices()  # type: ignore[attr-defined]
    return indices


def batch_arrays(batch_sampler: object) -> Iterator[IndexArray] | None:
    """The batches of a stoker ``BatchSampler`` as int64 arrays, or None to iterate it.

    >>> [b.tolist() for b in batch_arrays(BatchSampler(range(5), 2, drop_last=True))]
    [[0, 1], [2, 3]]
    """
    if not isinstance(batch_sampler, BatchSampler):
        return None
    if type(batch_sampler).__iter__ is not BatchSampler.__iter__:
        return None
    return batch_sampler._iter_arrays()


def _is_int(x: object) -> bool:
    """Whether ``x`` is an integer (Python or NumPy) and not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _to_numpy(x: object, dtype: Any = None) -> np.ndarray[Any, Any]:
    """``x`` as a NumPy array, detaching and moving torch tensors to the CPU first."""
    if _torch.is_tensor(x):
        x = x.detach().cpu().numpy()  # type: ignore[attr-defined]
    return np.asarray(x, dtype=dtype)


class Sampler(Generic[T_co]):
    """Base class of samplers: an iterable over dataset indices (or batches of them).

    Subclasses must define ``__iter__`` and may define ``__len__``. The optional
    ``data_source`` argument is accepted, and ignored, as older torch versions did, so
    subclasses calling ``super().__init__(data_source)`` keep working.

    >>> class Evens(Sampler[int]):
    ...     def __iter__(self):
    ...         return iter(range(0, 6, 2))
    >>> list(Evens())
    [0, 2, 4]
    """

    def __init__(self, data_source: Sized | None = None) -> None:
        """Accept and ignore ``data_source`` (see the class docstring)."""

    def __iter__(self) -> Iterator[T_co]:
        """Iterate over indices; every subclass must override this."""
        raise NotImplementedError(
            f"{type(self).__name__} must define __iter__ to be used as a sampler."
        )


class _SeededSampler(Sampler[int]):
    """A sampler whose epochs are drawn from a ``generator`` (see the module docstring)."""

    generator: GeneratorLike
    _epoch: int

    def _next_rng(self) -> np.random.Generator:
        """The NumPy generator for the next epoch, advancing the epoch or the generator."""
        gen = self.generator
        if _is_int(gen):
            epoch = getattr(self, "_epoch", 0)
            self._epoch = epoch + 1
            return rng(int(gen) % _U64, epoch)
        return rng(draw_seed(gen))


class SequentialSampler(Sampler[int]):
    """Yields ``0, 1, ..., len(data_source) - 1`` in order.

    Args:
        data_source: anything with ``__len__``; its length is read at each epoch.

    >>> list(SequentialSampler(range(4)))
    [0, 1, 2, 3]
    """

    data_source: Sized

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source

    def _epoch_indices(self) -> IndexArray:
        """The epoch's indices as an int64 array."""
        return np.arange(len(self.data_source), dtype=np.int64)

    @_fast_iter
    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(_SeededSampler):
    """Yields indices of ``data_source`` in random order.

    Without replacement each epoch is a permutation (several, concatenated and the last
    one cut, when ``num_samples`` exceeds the length); with replacement the indices are
    independent uniform draws.

    Args:
        data_source: anything with ``__len__``; its length is read at each epoch.
        replacement: draw with replacement.
        num_samples: how many indices per epoch; default ``len(data_source)``.
        generator: None, an int seed, or a NumPy or torch generator (module docstring).

    Raises:
        TypeError: ``replacement`` is not a bool, or ``generator`` is of no accepted kind.
        ValueError: ``num_samples`` is not a positive integer.

    >>> s = RandomSampler(range(5), generator=0)
    >>> first, second = list(s), list(s)
    >>> sorted(first), first != second
    ([0, 1, 2, 3, 4], True)
    >>> list(RandomSampler(range(5), generator=0)) == first
    True
    """

    data_source: Sized
    replacement: bool

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: GeneratorLike = None,
    ) -> None:
        if not isinstance(replacement, bool):
            raise TypeError(f"replacement must be a bool, got {replacement!r}; pass True or False.")
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = (
            int(num_samples) if num_samples is not None and _is_int(num_samples) else num_samples
        )
        self.generator = generator
        self._epoch = 0
        n = self.num_samples
        if not _is_int(n) or n <= 0:
            raise ValueError(
                f"num_samples must be a positive integer, got {n!r}; pass num_samples >= 1 "
                "or a non-empty data_source."
            )
        check_generator(generator)

    @property
    def num_samples(self) -> int:
        """Indices per epoch: the ``num_samples`` given, else ``len(data_source)``."""
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def _epoch_indices(self) -> IndexArray:
        """The epoch's indices as an int64 array (advances the randomness by one epoch)."""
        n = len(self.data_source)
        k = self.num_samples
        if n == 0:
            raise ValueError(f"data_source must be non-empty to draw {k} samples, got length 0.")
        gen = self._next_rng()
        if self.replacement:
            return gen.integers(0, n, size=k, dtype=np.int64)
        full, rest = divmod(k, n)
        parts = [gen.permutation(n) for _ in range(full)]
        if rest:
            parts.append(gen.choice(n, size=rest, replace=False, shuffle=True))
        return np.concatenate(parts).astype(np.int64, copy=False)

    @_fast_iter
    def __iter__(self) -> Iterator[int]:
        return iter(self._epoch_indices().tolist())

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(_SeededSampler):
    """Yields the given indices in a random order, a new one each epoch.

    Args:
        indices: a 1-D sequence (list, range, array or tensor) of integer indices.
        generator: None, an int seed, or a NumPy or torch generator (module docstring).

    Raises:
        TypeError: ``indices`` are not integers, or ``generator`` is of no accepted kind.
        ValueError: ``indices`` are not 1-D.

    >>> sorted(SubsetRandomSampler([10, 20, 30], generator=1))
    [10, 20, 30]
    """

    def __init__(
        self, indices: Sequence[int] | npt.ArrayLike, generator: GeneratorLike = None
    ) -> None:
        self.indices = indices
        self.generator = generator
        self._epoch = 0
        check_generator(generator)

    @property
    def indices(self) -> Sequence[int] | npt.ArrayLike:
        """The indices to sample from, as given."""
        return self._indices

    @indices.setter
    def indices(self, value: Sequence[int] | npt.ArrayLike) -> None:
        arr = _to_numpy(value)
        if arr.ndim != 1:
            raise ValueError(f"indices must be a 1-D sequence of integers, got shape {arr.shape}.")
        if arr.size == 0:
            arr = arr.astype(np.int64)
        if not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(
                f"indices must be integers, got dtype {arr.dtype}; convert them with int()."
            )
        self._indices = value
        self._index_array: IndexArray = arr.astype(np.int64, copy=False)

    def _epoch_indices(self) -> IndexArray:
        """The epoch's indices as an int64 array (advances the randomness by one epoch)."""
        gen = self._next_rng()
        return self._index_array[gen.permutation(len(self._index_array))]

    @_fast_iter
    def __iter__(self) -> Iterator[int]:
        return iter(self._epoch_indices().tolist())

    def __len__(self) -> int:
        return len(self._index_array)


class WeightedRandomSampler(_SeededSampler):
    """Yields ``num_samples`` indices of ``weights``, each drawn with probability ∝ weight.

    Any number of weights works (torch's ``multinomial`` stops at 2**24). With
    replacement, uniform draws are located in the normalised cumulative sum; without,
    the Gumbel top-k trick gives the same law as drawing one index at a time.
    ``weights`` may be reassigned between epochs (it is validated again).

    Args:
        weights: 1-D, finite, non-negative, with a positive sum; need not sum to one.
        num_samples: how many indices per epoch.
        replacement: draw with replacement; without it, ``num_samples`` must not exceed
            the number of non-zero weights.
        generator: None, an int seed, or a NumPy or torch generator (module docstring).

    Raises:
        ValueError: an argument breaks the rules above (the type torch raises too).
        TypeError: ``generator`` is of no accepted kind.

    >>> s = WeightedRandomSampler([0.0, 1.0, 0.0, 3.0], 8, generator=0)
    >>> len(s), set(s) <= {1, 3}
    (8, True)
    >>> sorted(WeightedRandomSampler([0.0, 1.0, 2.0], 2, replacement=False, generator=0))
    [1, 2]
    """

    num_samples: int
    replacement: bool

    def __init__(
        self,
        weights: Sequence[float] | npt.ArrayLike,
        num_samples: int,
        replacement: bool = True,
        generator: GeneratorLike = None,
    ) -> None:
        if not _is_int(num_samples) or num_samples <= 0:
            raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}.")
        if not isinstance(replacement, bool):
            raise ValueError(f"replacement must be a bool, got {replacement!r}.")
        check_generator(generator)
        self.num_samples = int(num_samples)
        self.replacement = replacement
        self.generator = generator
        self._epoch = 0
        self.weights = weights

    @property
    def weights(self) -> npt.NDArray[np.float64]:
        """The weights as a float64 array."""
        return self._weights

    @weights.setter
    def weights(self, value: Sequence[float] | npt.ArrayLike) -> None:
        self._weights = self._validate(_to_numpy(value, dtype=np.float64))

    def _validate(self, w: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Return ``w`` if it is a valid weight vector for this sampler, else raise."""
        if w.ndim != 1:
            raise ValueError(f"weights must be a 1-D sequence, got shape {w.shape}.")
        if not np.isfinite(w).all():
            raise ValueError("weights must be finite; found inf or nan.")
        if (w < 0).any():
            raise ValueError(f"weights must be non-negative, found {w.min()} at {w.argmin()}.")
        if not w.sum() > 0:
            raise ValueError("weights must have a positive sum; all are zero (or empty).")
        if not self.replacement:
            nonzero = int(np.count_nonzero(w))
            if self.num_samples > nonzero:
                raise ValueError(
                    f"without replacement num_samples must be <= the number of non-zero "
                    f"weights, got num_samples={self.num_samples} and {nonzero} non-zero "
                    "weights; lower num_samples or pass replacement=True."
                )
        return w

    def _epoch_indices(self) -> IndexArray:
        """The epoch's indices as an int64 array (advances the randomness by one epoch)."""
        w = self._validate(self._weights)  # cheap next to sampling; catches in-place edits
        gen = self._next_rng()
        if self.replacement:
            cdf = np.cumsum(w)
            cdf /= cdf[-1]
            # side="right" never lands on a zero weight (its cdf equals its predecessor's)
            # and u < 1 == cdf[last non-zero], so no index past the last non-zero one.
            # Sorted uniforms (normalised sums of exponentials) make searchsorted walk the
            # cdf in order, ~4x faster than random queries; a shuffle restores i.i.d. order.
            k = self.num_samples
            sums = np.cumsum(gen.standard_exponential(k + 1))
            u = sums[:k] / sums[k]
            np.minimum(u, np.nextafter(1.0, 0.0), out=u)
            out: IndexArray = np.searchsorted(cdf, u, side="right").astype(np.int64)
            gen.shuffle(out)
            return out
        candidates = np.flatnonzero(w)
        with np.errstate(divide="ignore"):
            keys = np.log(w[candidates]) + gen.gumbel(size=len(candidates))
        k = self.num_samples
        # The k largest keys, largest first, are the indices in the order drawn.
        top = np.argpartition(-keys, k - 1)[:k] if k < len(keys) else np.arange(len(keys))
        top = top[np.argsort(-keys[top], kind="stable")]
        return candidates[top].astype(np.int64, copy=False)

    @_fast_iter
    def __iter__(self) -> Iterator[int]:
        return iter(self._epoch_indices().tolist())

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler[list[int]]):
    """Groups the indices of another sampler into lists of ``batch_size``.

    Args:
        sampler: a sampler or any iterable of indices (torch's samplers work too).
        batch_size: indices per batch.
        drop_last: drop the last batch when it is shorter than ``batch_size``.

    Raises:
        ValueError: ``batch_size`` is not a positive integer or ``drop_last`` not a bool
            (the exception type torch raises for both).

    >>> list(BatchSampler(SequentialSampler(range(7)), batch_size=3, drop_last=False))
    [[0, 1, 2], [3, 4, 5], [6]]
    >>> list(BatchSampler(range(7), batch_size=3, drop_last=True))
    [[0, 1, 2], [3, 4, 5]]
    """

    def __init__(
        self, sampler: Sampler[int] | Iterable[int], batch_size: int, drop_last: bool
    ) -> None:
        if not _is_int(batch_size) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last must be a bool, got {drop_last!r}; pass True or False.")
        self.sampler = sampler
        self.batch_size = int(batch_size)
        self.drop_last = drop_last

    def _stop(self, n: int) -> int:
        """Where batching of ``n`` indices stops (before a short last batch if dropped)."""
        return n - n % self.batch_size if self.drop_last else n

    def _iter_lists(self, it: Iterator[Any]) -> Iterator[list[Any]]:
        """Chunk an iterator of indices into lists, as torch's ``BatchSampler`` does."""
        bs = self.batch_size
        while True:
            batch = list(itertools.islice(it, bs))
            if not batch or (self.drop_last and len(batch) < bs):
                return
            yield batch

    def _iter_arrays(self) -> Iterator[IndexArray]:
        """The epoch's batches as int64 arrays (slices of one array when possible)."""
        indices = epoch_indices(self.sampler)
        if indices is None:
            for batch in self._iter_lists(iter(self.sampler)):
                yield np.asarray(batch, dtype=np.int64)
            return
        bs = self.batch_size
        for start in range(0, self._stop(len(indices)), bs):
            yield indices[start : start + bs]

    def __iter__(self) -> Iterator[list[int]]:
        indices = epoch_indices(self.sampler)
        if indices is None:
            yield from self._iter_lists(iter(self.sampler))
            return
        flat = indices.tolist()
        bs = self.batch_size
        for start in range(0, self._stop(len(flat)), bs):
            yield flat[start : start + bs]

    def __len__(self) -> int:
        n, bs = len(self.sampler), self.batch_size  # type: ignore[arg-type]
        return n // bs if self.drop_last else -(-n // bs)


def _env_int(name: str) -> int | None:
    """The integer value of environment variable ``name``, or None if it is unset."""
    raw = os.environ.get(name)
    try:
        return None if raw is None or not raw.strip() else int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}.") from None


def _world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """Fill in ``num_replicas`` / ``rank``: from torch's process group, else the env."""
    if num_replicas is None or rank is None:
        # Only a process that imported torch.distributed can have initialised a group.
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            if num_replicas is None:
                num_replicas = int(dist.get_world_size())
            if rank is None:
                rank = int(dist.get_rank())
    if num_replicas is None:
        num_replicas = _env_int("WORLD_SIZE")
    if rank is None:
        rank = _env_int("RANK")
    if num_replicas is None or rank is None:
        raise RuntimeError(
            "DistributedSampler needs num_replicas and rank: no initialised torch.distributed "
            "process group and WORLD_SIZE / RANK are not set; pass num_replicas and rank, "
            "or set the WORLD_SIZE and RANK environment variables (torchrun does)."
        )
    return num_replicas, rank


class DistributedSampler(Sampler[int]):
    """Gives each of ``num_replicas`` processes its own share of a dataset's indices.

    Each epoch all ranks compute the same order (a permutation from ``rng(seed, epoch)``
    when shuffling, else ``0..n-1``), pad it by repeating it from the start (or, with
    ``drop_last``, cut its tail) to a multiple of ``num_replicas``, and rank ``r`` takes
    every ``num_replicas``-th index from position ``r``, as torch does. Call
    ``set_epoch(epoch)`` before each epoch so that shuffled orders differ.

    Args:
        dataset: anything with ``__len__``.
        num_replicas: number of processes; default from an initialised torch process
            group, else the ``WORLD_SIZE`` environment variable.
        rank: this process's rank; default from the process group, else ``RANK``.
        shuffle: shuffle the indices each epoch.
        seed: the shuffling seed; must be the same on every rank.
        drop_last: cut the tail instead of padding, so no index is seen twice.

    Raises:
        RuntimeError: ``num_replicas`` or ``rank`` is None and cannot be found.
        TypeError: ``num_replicas``, ``rank`` or ``seed`` is not an integer.
        ValueError: ``num_replicas`` < 1, or ``rank`` outside ``[0, num_replicas)``.

    >>> [list(DistributedSampler(range(5), 2, r, shuffle=False)) for r in (0, 1)]
    [[0, 2, 4], [1, 3, 0]]
    >>> s = DistributedSampler(range(5), num_replicas=2, rank=0, seed=1, drop_last=True)
    >>> len(s), len(list(s))
    (2, 2)
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        num_replicas, rank = _world(num_replicas, rank)
        for name, value in (("num_replicas", num_replicas), ("rank", rank), ("seed", seed)):
            if not _is_int(value):
                raise TypeError(f"{name} must be an integer, got {value!r}.")
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be a positive integer, got {num_replicas}.")
        if not 0 <= rank < num_replicas:
            raise ValueError(
                f"rank must be in [0, {num_replicas - 1}] for num_replicas={num_replicas}, "
                f"got {rank}."
            )
        self.dataset = dataset
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.epoch = 0
        self.drop_last = drop_last
        self.shuffle = shuffle
        self.seed = int(seed)
        n, r = len(dataset), self.num_replicas
        self.num_samples = n // r if drop_last else -(-n // r)
        self.total_size = self.num_samples * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch whose order the next ``__iter__`` gives (same on every rank).

        Args:
            epoch: the epoch number, an integer.

        Raises:
            TypeError: ``epoch`` is not an integer.
        """
        if not _is_int(epoch):
            raise TypeError(f"epoch must be an integer, got {epoch!r}.")
        self.epoch = int(epoch)

    def _epoch_indices(self) -> IndexArray:
        """This rank's indices for the current epoch, as an int64 array."""
        n = len(self.dataset)
        if self.shuffle:
            order = rng(self.seed % _U64, operator.index(self.epoch) % _U64).permutation(n)
        else:
            order = np.arange(n, dtype=np.int64)
        total = self.total_size
        if n >= total:
            order = order[:total]
        elif n > 0:
            order = np.resize(order, total)  # repeats the order from its start
        return order[self.rank : total : self.num_replicas].astype(np.int64, copy=False)

    @_fast_iter
    def __iter__(self) -> Iterator[int]:
        return iter(self._epoch_indices().tolist())

    def __len__(self) -> int:
        return self.num_samples
