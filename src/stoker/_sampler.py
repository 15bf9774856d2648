"""Samplers: the order in which a map-style dataset is read, as in ``torch.utils.data``.

Every stoker sampler computes an epoch as int64 arrays (``_epoch_indices()``, in the
parts torch draws: ``_epoch_chunks()``); ``__iter__`` and the loader's fast path
(``batch_arrays``) slice them without a Python int per index. A random sampler draws at
the first ``next()``, as torch's generators do, from one of two kinds of randomness:
*torch's stream* (a ``torch.Generator``, or None while torch is imported) gives exactly
torch's indices; *stoker's seeds* (an int, a ``numpy.random.Generator``, or None without
torch) draw epoch ``e`` from ``rng(base_seed, e)`` alone.

``state_dict()`` is a small JSON-serialisable dict that fixes what the next ``__iter__``
yields; set its ``"epoch"`` before ``load_state_dict`` to skip ahead or rewind. Details:
``docs/engine.md``, "Samplers: randomness and state".

>>> s = RandomSampler(range(6), generator=np.random.default_rng(0))
>>> _ = list(s)
>>> sd = s.state_dict()
>>> sd["epoch"]
1
>>> t = RandomSampler(range(6), generator=123)
>>> t.load_state_dict(sd)
>>> list(t) == list(s)
True
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from stoker import _torch
from stoker._random import (
    GeneratorLike,
    check_generator,
    draw_seed,
    encode_state,
    new_torch_generator,
    rng,
    set_state,
    torch_stream,
)
from stoker.errors import WeightsError

T_co = TypeVar("T_co", covariant=True)
IndexArray = npt.NDArray[np.int64]

U64 = 2**64
_TORCH_MAX_CATEGORIES = 2**24  # torch.multinomial refuses more weights

# ``__iter__`` functions known to be exactly ``iter(self._epoch_indices().tolist())``; a
# subclass that overrides ``__iter__`` is then iterated, never bypassed by the fast path.
_FAST_ITERS: set[object] = set()

_F = TypeVar("_F", bound=Callable[..., Any])


def fast_iter(fn: _F) -> _F:
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


def batch_arrays(batch_sampler: object) -> Iterator[IndexArray | list[Any]] | None:
    """The batches of a stoker ``BatchSampler`` as int64 arrays, or None to iterate it.

    >>> [b.tolist() for b in batch_arrays(BatchSampler(range(5), 2, drop_last=True))]
    [[0, 1], [2, 3]]
    """
    if not isinstance(batch_sampler, BatchSampler):
        return None
    if type(batch_sampler).__iter__ is not BatchSampler.__iter__:
        return None
    return batch_sampler._iter_arrays()


def epoch_chunks(sampler: object) -> Iterator[IndexArray] | None:
    """One epoch of ``sampler`` as int64 arrays, each drawn when torch's sampler draws
    its part (when its first index, or one past the end, is asked for), or None if the
    sampler must be iterated instead (as :func:`epoch_indices`).

    >>> [c.tolist() for c in epoch_chunks(SequentialSampler(range(3)))]
    [[0, 1, 2]]
    """
    if getattr(type(sampler), "__iter__", None) not in _FAST_ITERS:
        return None
    chunks = getattr(sampler, "_epoch_chunks", None)
    return chunks() if callable(chunks) else _one_chunk(sampler)


def _one_chunk(sampler: Any) -> Iterator[IndexArray]:
    """The epoch as one array, drawn at the first ``next()``."""
    yield sampler._epoch_indices()


def _lazy_ints(chunks: Iterator[IndexArray]) -> Iterator[int]:
    """The indices of ``chunks`` as Python ints, each chunk drawn when the first of its
    indices (or one past the end) is asked for, as torch's generators draw; iterated at C
    speed (a generator would resume per index)."""
    return itertools.chain.from_iterable(chunk.tolist() for chunk in chunks)


def _join(chunks: list[IndexArray]) -> IndexArray:
    """The chunks as one array (the only one itself, uncopied)."""
    return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)


S = TypeVar("S", list[int], IndexArray)


def _batches(
    chunks: Iterator[S], size: int, drop_last: bool, join: Callable[[S, S], S]
) -> Iterator[S]:
    """Batches of ``size`` cut from ``chunks`` (slices where a batch lies in one chunk);
    a chunk is taken when a batch needs its first index, or when the next batch is asked
    for after a chunk ran out: when torch's ``BatchSampler`` asks its sampler for it."""
    rest: S | None = None
    for chunk in chunks:
        buf = join(rest, chunk) if rest is not None and len(rest) else chunk
        stop = len(buf) - len(buf) % size
        for start in range(0, stop, size):
            yield buf[start : start + size]
        rest = buf[stop:]
    if rest is not None and len(rest) and not drop_last:
        yield rest


def _concat(a: IndexArray, b: IndexArray) -> IndexArray:
    return np.concatenate([a, b])


def _int_array(batch: list[Any]) -> IndexArray | list[Any]:
    """A batch of keys as an int64 array when every key is an int, else unchanged: keys of
    another type (str, tuple, bool...) reach ``__getitem__`` as the sampler gave them."""
    if all(type(k) is int or isinstance(k, np.integer) for k in batch):
        return np.asarray(batch, dtype=np.int64)
    return batch


def is_int(x: object) -> bool:
    """Whether ``x`` is an integer (Python or NumPy) and not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def check_state(
    state_dict: object, owner: object, keys: tuple[str, ...], optional: tuple[str, ...] = ()
) -> Mapping[str, Any]:
    """``state_dict`` if it is a state of ``owner``'s kind with exactly ``keys`` (and "kind"),
    and perhaps some of ``optional``.

    Raises:
        TypeError: ``state_dict`` is not a dict.
        ValueError: its ``"kind"`` is not ``owner``'s class name, or keys are missing or extra.
    """
    kind = type(owner).__name__
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"{kind}.load_state_dict expects the dict that {kind}.state_dict() returned, got "
            f"{type(state_dict).__name__}."
        )
    found = state_dict.get("kind", "<missing>")
    if found != kind:
        raise ValueError(
            f"{kind}.load_state_dict needs a state with kind {kind!r}, got kind {found!r}; "
            f"load a state saved by a {kind}, or load this one into a {found}."
        )
    expected = {"kind", *keys}
    missing = sorted(expected - state_dict.keys())
    extra = sorted(str(k) for k in state_dict.keys() - expected - set(optional))
    if missing or extra:
        what = f"lacks {missing}" if missing else f"has unexpected keys {extra}"
        raise ValueError(
            f"{kind} state_dict {what}; expected exactly the keys {sorted(expected)}; pass "
            f"the dict {kind}.state_dict() returned (only its 'epoch' is meant to be edited)."
        )
    return state_dict


def state_int(
    owner: object, state: Mapping[str, Any], key: str, *, bound: int | None, optional: bool = False
) -> int:
    """``state[key]`` as an int in ``[0, bound)``, or any int if ``bound`` is None.

    Args:
        owner: the object loading the state (its class name goes into messages).
        state: the state dict.
        key: the key to read.
        bound: the exclusive upper bound (the lower is 0), or None for any int.
        optional: the caller accepts None too (it only changes the message).

    Raises:
        TypeError: the value is not an int.
        ValueError: the value is out of range.
    """
    value = state[key]
    rule = "an int" if bound is None else f"an int in [0, {bound})"
    rule += " or None" if optional else ""
    kind = type(owner).__name__
    if not is_int(value):
        raise TypeError(
            f"{kind} state_dict[{key!r}] must be {rule}, got {value!r} "
            f"({type(value).__name__}); use the value {kind}.state_dict() saved."
        )
    if bound is not None and not 0 <= value < bound:
        raise ValueError(
            f"{kind} state_dict[{key!r}] must be {rule}, got {value}; "
            f"use the value {kind}.state_dict() saved."
        )
    return int(value)


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
    """A random sampler: torch's draws on a torch stream, else epoch ``e`` from
    ``rng(base_seed, e)`` (module docstring)."""

    _generator: GeneratorLike
    _seed: int | None
    _epoch: int = 0
    _replay: dict[str, Any] | None = None
    _drawn: dict[str, Any] | None = None

    @property
    def generator(self) -> GeneratorLike:
        """Where the randomness comes from; assigning one discards a base seed already drawn."""
        return self._generator

    @generator.setter
    def generator(self, value: GeneratorLike) -> None:
        check_generator(value)
        self._generator = value
        self._seed = int(value) % U64 if is_int(value) else None

    def _torch_stream(self) -> tuple[Any, bool] | None:
        """Where the next epoch's torch draws come from: ``(generator, from_global)``, or
        None for stoker's ``(seed, epoch)`` draws; advances the epoch counter and records
        the state that draws this epoch again (:meth:`_drawn_state`).

        ``from_global`` tells that the draws stand for torch's global RNG (``generator``
        None), which torch's ``RandomSampler`` treats otherwise than a given generator.
        A loaded ``torch_state`` is drawn from (a copy of the global RNG's, so that the
        process's own stream is not moved, unless that RNG is in the state saved; the
        sampler's own generator otherwise).
        """
        replay, self._replay = self._replay, None
        self._epoch += 1
        own = torch_stream(self._generator)
        if replay is not None:
            from_global = replay["source"] == "global"
            if from_global and _is_at(own, self._generator, replay["state"]):
                stream = own  # the global RNG is where it was saved: draw on it, as torch
            elif from_global or own is None or self._generator is None:
                stream = new_torch_generator(replay["state"])
            else:
                stream = own
                set_state(stream, replay["state"])
            self._drawn = {"source": replay["source"], "state": replay["state"], "when": "draw"}
            return stream, from_global
        if own is None:
            self._drawn = None
            return None
        from_global = self._generator is None
        source = "global" if from_global else "generator"
        self._drawn = {"source": source, "state": encode_state(own), "when": "draw"}
        return own, from_global

    def _next_rng(self) -> np.random.Generator:
        """The NumPy generator of the next epoch (stoker's draws, not a torch stream)."""
        return rng(self._base_seed(), self._epoch - 1)

    def _base_seed(self) -> int:
        """The base seed of stoker's draws, drawn from the generator the first time."""
        if self._seed is None:
            self._seed = draw_seed(self._generator) % U64
        return self._seed

    def state_dict(self) -> dict[str, Any]:
        """What the next ``__iter__`` yields: ``{"kind", "seed", "epoch"}``, and
        ``"torch_state"`` on a torch stream (module docstring).

        >>> RandomSampler(range(3), generator=5).state_dict()
        {'kind': 'RandomSampler', 'seed': 5, 'epoch': 0}
        """
        torch_state = self._replay
        own = torch_stream(self._generator)
        if torch_state is None and own is not None and self._generator is not None:
            torch_state = {"source": "generator", "state": encode_state(own), "when": "load"}
        return self._state(self._epoch, torch_state)

    def _drawn_state(self) -> dict[str, Any]:
        """The state whose loading draws the last epoch drawn again (a checkpoint within
        that epoch saves it; see ``DataLoader._start_epoch``)."""
        return self._state(max(self._epoch - 1, 0), self._drawn)

    def _pending_state(self) -> dict[str, Any]:
        """The state whose loading draws the epoch that a draw now would draw (a loader's
        checkpoint after ``iter()`` and before the first ``next()`` saves it): the base
        seed of stoker's draws, or the global RNG's state, fixed now."""
        own = torch_stream(self._generator)
        if self._replay is None and own is None:
            self._base_seed()
        elif self._replay is None and self._generator is None:
            now = {"source": "global", "state": encode_state(own), "when": "draw"}
            return self._state(self._epoch, now)
        return self.state_dict()

    def _state(self, epoch: int, torch_state: dict[str, Any] | None) -> dict[str, Any]:
        state: dict[str, Any] = {"kind": type(self).__name__, "seed": self._seed, "epoch": epoch}
        if torch_state is not None:
            state["torch_state"] = dict(torch_state)
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()``, so the next ``__iter__`` gives the epoch it names.

        Args:
            state_dict: a dict from ``state_dict()`` of the same class, possibly with
                ``"epoch"`` edited to skip ahead or rewind (stoker's draws only).

        Raises:
            TypeError: it is not a dict, or ``seed`` / ``epoch`` are not ints.
            ValueError: its kind or keys differ, or ``seed`` / ``epoch`` / ``torch_state``
                are out of range.
        """
        self._apply_state(self._checked_state(state_dict))

    def _checked_state(self, state_dict: Mapping[str, Any]) -> dict[str, Any]:
        """``state_dict`` validated for this sampler, nothing applied yet."""
        state = check_state(state_dict, self, ("seed", "epoch"), optional=("torch_state",))
        seed = state["seed"]
        if seed is not None:
            seed = state_int(self, state, "seed", bound=U64, optional=True)
        epoch = state_int(self, state, "epoch", bound=U64)
        torch_state = state.get("torch_state")
        if torch_state is not None:
            torch_state = dict(_check_torch_state(self, torch_state))
            new_torch_generator(torch_state["state"])  # a bad state raises here
        return {"seed": seed, "epoch": epoch, "torch_state": torch_state}

    def _apply_state(self, state: dict[str, Any]) -> None:
        """Apply a state from :meth:`_checked_state`.

        A given generator's torch state is set in this sampler's ``torch.Generator`` now
        (saved between epochs) or when the next epoch is drawn (saved within one, after
        the loader's own draw); a sampler built with another kind of generator is given a
        new ``torch.Generator`` in that state. The global RNG's state is drawn from a copy
        at the next epoch only: later epochs follow torch's global RNG, as torch's do.
        """
        torch_state = state["torch_state"]
        self._replay = None
        if torch_state is not None:
            mine = self._generator is not None and torch_stream(self._generator) is not None
            if torch_state["source"] == "generator" and not mine:
                self.generator = new_torch_generator(torch_state["state"])
            elif torch_state["source"] == "generator" and torch_state["when"] == "load":
                set_state(self._generator, torch_state["state"])
            else:
                self._replay = torch_state
        self._epoch = state["epoch"]
        self._seed = state["seed"]


def _is_at(own: Any, generator: GeneratorLike, state: str) -> bool:
    """Whether ``own`` is torch's global RNG (``generator`` None) and in ``state``."""
    return own is not None and generator is None and encode_state(own) == state


def _check_torch_state(owner: object, value: object) -> Mapping[str, Any]:
    """``value`` if it is a ``torch_state`` entry as ``state_dict()`` writes it."""
    kind = type(owner).__name__
    ok = (
        isinstance(value, Mapping)
        and set(value) == {"source", "state", "when"}
        and value["source"] in ("global", "generator")
        and value["when"] in ("load", "draw")
        and isinstance(value["state"], str)
    )
    if not ok:
        raise ValueError(
            f"{kind} state_dict['torch_state'] must be None or the dict state_dict() wrote "
            f"({{'source', 'state', 'when'}}), got {str(value)[:80]}; load the state unchanged."
        )
    assert isinstance(value, Mapping)
    return value


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

    @fast_iter
    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)

    def state_dict(self) -> dict[str, Any]:
        """``{"kind": "SequentialSampler"}``: every epoch is the same, so nothing to save."""
        return {"kind": type(self).__name__}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Check a ``state_dict()`` (there is nothing to restore).

        Raises:
            TypeError: it is not a dict.
            ValueError: its kind or keys differ.
        """
        check_state(state_dict, self, ())


def _torch_random_chunks(n: int, k: int, replacement: bool, stream: Any) -> Iterator[IndexArray]:
    """torch's ``RandomSampler`` draws on a given generator, one part at a time as torch
    draws them: 32 indices with replacement, a permutation (the last cut, even to nothing)
    without."""
    torch = _torch.loaded()
    assert torch is not None, "a torch stream needs torch"
    for size in [32] * (k // 32) + [k % 32] if replacement else [n] * (k // n) + [k % n]:
        if replacement:
            yield torch.randint(high=n, size=(size,), dtype=torch.int64, generator=stream).numpy()
        else:
            yield torch.randperm(n, generator=stream)[:size].numpy()


def _torch_random_epoch(n: int, k: int, replacement: bool, stream: Any) -> IndexArray:
    """One epoch of torch's ``RandomSampler`` on the global RNG over ``n`` items: the same
    draws as torch's, from a generator seeded from one draw of ``stream``."""
    torch = _torch.loaded()
    assert torch is not None, "a torch stream needs torch"
    seed = int(torch.empty((), dtype=torch.int64).random_(generator=stream).item())
    stream = torch.Generator()
    stream.manual_seed(seed)
    if replacement:
        # torch draws k // 32 chunks of 32, then k % 32: the same values as one draw of k.
        out = torch.randint(high=n, size=(k,), dtype=torch.int64, generator=stream)
    else:
        # torch draws one more permutation, cut to k % n (even to nothing), after the
        # k // n whole ones.
        parts = [torch.randperm(n, generator=stream) for _ in range(k // n + 1)]
        parts[-1] = parts[-1][: k % n]
        out = torch.cat(parts)
    indices: IndexArray = out.numpy()
    return indices


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
            raise TypeError(
                f"replacement should be a boolean value, but got replacement={replacement!r}; "
                "pass True or False."
            )
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = (
            int(num_samples) if num_samples is not None and is_int(num_samples) else num_samples
        )
        n = self.num_samples
        if not is_int(n) or n <= 0:
            raise ValueError(
                f"num_samples should be a positive integer value, but got num_samples={n!r}; "
                "pass num_samples >= 1 or a non-empty data_source."
            )
        self.generator = generator
        self._epoch = 0

    @property
    def num_samples(self) -> int:
        """Indices per epoch: the ``num_samples`` given, else ``len(data_source)``."""
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def _epoch_indices(self) -> IndexArray:
        """The epoch's indices as an int64 array (advances the randomness by one epoch)."""
        return _join(list(self._epoch_chunks()))

    def _epoch_chunks(self) -> Iterator[IndexArray]:
        """The epoch in the parts torch draws, each when torch draws it: on a given
        torch generator, its permutations (or 32 draws with replacement) one by one;
        otherwise the whole epoch at once (torch draws the global RNG's from a private
        generator, whose draws nobody else sees)."""
        n = len(self.data_source)
        k = self.num_samples
        if n == 0:
            raise ValueError(f"data_source must be non-empty to draw {k} samples, got length 0.")
        stream = self._torch_stream()
        if stream is not None and not stream[1]:
            yield from _torch_random_chunks(n, k, self.replacement, stream[0])
        elif stream is not None:
            yield _torch_random_epoch(n, k, self.replacement, stream[0])
        else:
            yield self._stoker_epoch(n, k)

    def _stoker_epoch(self, n: int, k: int) -> IndexArray:
        """An epoch of stoker's draws, from ``rng(seed, epoch)``."""
        gen = self._next_rng()
        if self.replacement:
            return gen.integers(0, n, size=k, dtype=np.int64)
        full, rest = divmod(k, n)
        parts = [gen.permutation(n) for _ in range(full)]
        if rest:
            parts.append(gen.choice(n, size=rest, replace=False, shuffle=True))
        return np.concatenate(parts).astype(np.int64, copy=False)

    @fast_iter
    def __iter__(self) -> Iterator[int]:
        return _lazy_ints(self._epoch_chunks())

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
        n = len(self._index_array)
        stream = self._torch_stream()
        if stream is not None:
            torch = _torch.loaded()
            assert torch is not None, "a torch stream needs torch"
            order: IndexArray = torch.randperm(n, generator=stream[0]).numpy()
        else:
            order = self._next_rng().permutation(n)
        return self._index_array[order]

    @fast_iter
    def __iter__(self) -> Iterator[int]:
        return _lazy_ints(_one_chunk(self))

    def __len__(self) -> int:
        return len(self._index_array)


class WeightedRandomSampler(_SeededSampler):
    """Yields ``num_samples`` indices of ``weights``, each drawn with probability ∝ weight.

    On a torch stream (module docstring) draws are torch's ``multinomial`` up to its
    2**24 weights; past that, and on stoker's seeds, uniform draws are
    located in the cumulative sum (with replacement) or the Gumbel top-k trick draws
    (without). ``weights`` are checked each epoch, so may change between epochs.

    Args:
        weights: 1-D, finite, non-negative, with a positive sum.
        num_samples: indices per epoch.
        replacement: draw with replacement; without, ``num_samples`` must not exceed the
            (on stoker's draws: non-zero) weights.
        generator: None, an int seed, or a NumPy or torch generator.

    Raises:
        ValueError: a bad ``num_samples``, ``replacement`` or ``weights`` shape.
        WeightsError: at iteration, weights that cannot be drawn from (a ``RuntimeError``
            and a ``ValueError``).
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
        if not is_int(num_samples) or num_samples <= 0:
            raise ValueError(
                "num_samples should be a positive integer value, but got "
                f"num_samples={num_samples!r}; pass how many indices an epoch draws (>= 1)."
            )
        if not isinstance(replacement, bool):
            raise ValueError(
                f"replacement should be a boolean value, but got replacement={replacement!r}; "
                "pass True or False."
            )
        self.generator = generator
        self._epoch = 0
        self.num_samples = int(num_samples)
        self.replacement = replacement
        self.weights = weights

    @property
    def weights(self) -> npt.NDArray[np.float64]:
        """The weights as a float64 array."""
        return self._weights

    @weights.setter
    def weights(self, value: Sequence[float] | npt.ArrayLike) -> None:
        w = _to_numpy(value, dtype=np.float64)
        if w.ndim != 1:
            raise ValueError(
                f"weights should be a 1d sequence but given weights have shape {w.shape}; "
                "pass one weight per dataset index."
            )
        self._weights = w

    def _validate(self, w: npt.NDArray[np.float64], torch_draws: bool) -> None:
        """Raise :class:`WeightsError` unless ``w`` can be drawn from, with torch's phrase
        for the same weights (``torch_draws``: ``multinomial`` will draw them)."""
        bad = ~np.isfinite(w) | (w < 0)
        if bad.any():
            at = int(np.argmax(bad))
            if not self.replacement:
                phrase = "probability tensor contains either `inf`, `nan` or element < 0"
            elif np.isinf(w[at]):
                phrase = "invalid multinomial distribution (encountering probability entry = infinity or NaN)"  # noqa: E501
            else:
                phrase = "invalid multinomial distribution (encountering probability entry < 0)"
            raise WeightsError(
                f"{phrase}: weights must be finite and >= 0, found {w[at]} at index {at}; "
                "fix the weights."
            )
        if not w.sum() > 0:
            raise WeightsError(
                "invalid multinomial distribution (sum of probabilities <= 0): all "
                f"{len(w)} weights are zero; give some index a positive weight."
            )
        if self.replacement:
            return
        if self.num_samples > len(w):
            raise WeightsError(
                "cannot sample n_sample > prob_dist.size(-1) samples without replacement: "
                f"num_samples={self.num_samples} but only {len(w)} weights; lower num_samples "
                "or pass replacement=True."
            )
        nonzero = int(np.count_nonzero(w))
        if not torch_draws and self.num_samples > nonzero:
            raise WeightsError(
                f"without replacement num_samples must be <= the number of non-zero weights, "
                f"got num_samples={self.num_samples} and {nonzero} non-zero weights; lower "
                "num_samples or pass replacement=True (torch would then draw zero-weight "
                "indices, after all the others)."
            )

    def _epoch_indices(self) -> IndexArray:
        """The epoch's indices as an int64 array (advances the randomness by one epoch)."""
        w = self._weights
        on_stream = self._replay is not None or torch_stream(self._generator) is not None
        torch_draws = on_stream and len(w) <= _TORCH_MAX_CATEGORIES
        self._validate(w, torch_draws)  # before the draw: a refused epoch draws nothing
        stream = self._torch_stream()
        if stream is not None:
            if torch_draws:
                torch = _torch.loaded()
                assert torch is not None, "a torch stream needs torch"
                out = torch.multinomial(
                    torch.from_numpy(w), self.num_samples, self.replacement, generator=stream[0]
                )
                indices: IndexArray = out.numpy()
                return indices
            gen = rng(draw_seed(stream[0]) % U64)
        else:
            gen = self._next_rng()
        if self.replacement:
            cdf = np.cumsum(w)
            cdf /= cdf[-1]
            # side="right" never lands on a zero weight (its cdf equals its predecessor's)
            # and u < 1 == cdf[last non-zero], so no index past the last non-zero one.
            # Sorted uniforms (normalised sums of exponentials) make searchsorted walk the
            # cdf in order, faster than random queries; a shuffle restores i.i.d. order.
            k = self.num_samples
            sums = np.cumsum(gen.standard_exponential(k + 1))
            u = sums[:k] / sums[k]
            np.minimum(u, np.nextafter(1.0, 0.0), out=u)
            out_np: IndexArray = np.searchsorted(cdf, u, side="right").astype(np.int64)
            gen.shuffle(out_np)
            return out_np
        candidates = np.flatnonzero(w)
        with np.errstate(divide="ignore"):
            keys = np.log(w[candidates]) + gen.gumbel(size=len(candidates))
        k = self.num_samples
        # The k largest keys, largest first, are the indices in the order drawn.
        top = np.argpartition(-keys, k - 1)[:k] if k < len(keys) else np.arange(len(keys))
        top = top[np.argsort(-keys[top], kind="stable")]
        return candidates[top].astype(np.int64, copy=False)

    @fast_iter
    def __iter__(self) -> Iterator[int]:
        return _lazy_ints(_one_chunk(self))

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
        if not is_int(batch_size) or batch_size <= 0:
            raise ValueError(
                "batch_size should be a positive integer value, but got "
                f"batch_size={batch_size!r}; pass how many indices a batch holds (>= 1)."
            )
        if not isinstance(drop_last, bool):
            raise ValueError(
                f"drop_last should be a boolean value, but got drop_last={drop_last!r}; pass "
                "True or False."
            )
        self.sampler = sampler
        self.batch_size = int(batch_size)
        self.drop_last = drop_last

    def _iter_lists(self, it: Iterator[Any]) -> Iterator[list[Any]]:
        """Chunk an iterator of indices into lists, as torch's ``BatchSampler`` does."""
        bs = self.batch_size
        while True:
            batch = list(itertools.islice(it, bs))
            if not batch or (self.drop_last and len(batch) < bs):
                return
            yield batch

    def _iter_arrays(self) -> Iterator[IndexArray | list[Any]]:
        """The epoch's batches as int64 arrays (slices of the sampler's arrays when
        possible), drawn from the wrapped sampler as ``__iter__`` draws."""
        chunks = epoch_chunks(self.sampler)
        if chunks is None:
            return (_int_array(batch) for batch in self._iter_lists(iter(self.sampler)))
        return _batches(chunks, self.batch_size, self.drop_last, _concat)

    def __iter__(self) -> Iterator[list[int]]:
        # A generator, as torch's: the sampler's draws happen as torch's BatchSampler asks.
        chunks = epoch_chunks(self.sampler)
        if chunks is None:
            yield from self._iter_lists(iter(self.sampler))
            return
        lists = (chunk.tolist() for chunk in chunks)
        yield from _batches(lists, self.batch_size, self.drop_last, list.__add__)

    def __len__(self) -> int:
        n, bs = len(self.sampler), self.batch_size  # type: ignore[arg-type]
        return n // bs if self.drop_last else -(-n // bs)

    def state_dict(self) -> dict[str, Any]:
        """``{"kind": "BatchSampler", "sampler": <the sampler's state_dict(), or None>}``.

        The sampler's state is None when it has no ``state_dict`` (a list, a torch sampler);
        the next ``__iter__`` then depends on that sampler alone.

        >>> BatchSampler(RandomSampler(range(4), generator=1), 2, False).state_dict()["sampler"]
        {'kind': 'RandomSampler', 'seed': 1, 'epoch': 0}
        """
        save = getattr(self.sampler, "state_dict", None)
        return {"kind": type(self).__name__, "sampler": save() if callable(save) else None}

    def _drawn_state(self) -> dict[str, Any]:
        """The state whose loading draws the last epoch drawn again (``_SeededSampler``)."""
        return self._inner_state("_drawn_state")

    def _pending_state(self) -> dict[str, Any]:
        """The state whose loading draws what a draw now would (``_SeededSampler``)."""
        return self._inner_state("_pending_state")

    def _inner_state(self, method: str) -> dict[str, Any]:
        """This state with the sampler's ``method()`` state, where it has that method."""
        inner = getattr(self.sampler, method, None)
        if callable(inner):
            return {"kind": type(self).__name__, "sampler": inner()}
        return self.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()``: loads the sampler's part into the wrapped sampler.

        Args:
            state_dict: a dict from ``BatchSampler.state_dict()``; edit its
                ``["sampler"]["epoch"]`` to skip ahead or rewind.

        Raises:
            TypeError: it is not a dict, or its sampler part is not a dict or None.
            ValueError: its kind or keys differ, or it has a sampler state exactly when
                the wrapped sampler cannot take one (and the sampler's own checks).
        """
        inner = self._checked_inner(state_dict)
        if inner is not None:
            self.sampler.load_state_dict(inner)  # type: ignore[union-attr]

    def _checked_inner(self, state_dict: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The wrapped sampler's part of ``state_dict``, all of it validated (raises as
        :meth:`load_state_dict`); nothing is applied."""
        state = check_state(state_dict, self, ("sampler",))
        inner = state["sampler"]
        name = type(self.sampler).__name__
        load = getattr(self.sampler, "load_state_dict", None)
        if inner is None:
            if callable(load):
                raise ValueError(
                    f"BatchSampler state_dict['sampler'] is None (saved over a sampler without "
                    f"state), but this BatchSampler wraps a {name}, whose state it must hold; "
                    "load the state of a BatchSampler over the same kind of sampler."
                )
            return None
        if not isinstance(inner, Mapping):
            raise TypeError(
                f"BatchSampler state_dict['sampler'] must be a dict or None, got "
                f"{type(inner).__name__}; use the value BatchSampler.state_dict() saved."
            )
        if not callable(load):
            raise ValueError(
                f"BatchSampler state_dict holds a {inner.get('kind')!r} sampler state, but this "
                f"BatchSampler wraps a {name}, which has no load_state_dict; wrap the kind of "
                "sampler that saved it."
            )
        check_sampler_state(self.sampler, inner)
        return inner


def check_sampler_state(sampler: object, state: Mapping[str, Any]) -> None:
    """Validate ``state`` for ``sampler.load_state_dict`` without applying any of it, so
    that a loader can check a whole checkpoint before it changes anything.

    stoker's samplers check everything; another sampler's state is checked for its
    ``"kind"`` (when it has one), the rest by its own ``load_state_dict``.

    Raises:
        TypeError, ValueError: as ``sampler.load_state_dict(state)`` would.
    """
    if isinstance(sampler, _SeededSampler):
        sampler._checked_state(state)
    elif isinstance(sampler, BatchSampler):
        sampler._checked_inner(state)
    elif isinstance(sampler, SequentialSampler):
        check_state(state, sampler, ())
    elif type(sampler).__module__.startswith("stoker.") and hasattr(sampler, "_checked_state"):
        sampler._checked_state(state)  # DistributedSampler (elastic states, too)
    elif type(sampler).__module__.startswith("stoker.") and isinstance(state, Mapping):
        check_state(state, sampler, tuple(k for k in state if k != "kind"))
