"""Sharding across ranks: ``DistributedSampler`` (map-style) and ``ShardedIterable`` (streams).

Both find the world as torch does: an initialised ``torch.distributed`` process group
first, else the ``WORLD_SIZE`` / ``RANK`` environment variables (torchrun sets them). They
read the world when built, in the main process, where the group lives: worker processes
and threads started later by a loader need not (and often cannot) join the group.

``DistributedSampler`` is resumable: its ``state_dict()`` is ``{"kind", "seed", "epoch"}``,
the same on every rank, so one rank's checkpoint restores them all (an elastic one's, on
any world size that divides its global batch size: see :mod:`stoker._elastic`). With
``even=False`` (evaluation) it neither pads nor drops: every index goes to exactly one rank.

>>> [list(DistributedSampler(range(5), 2, r, shuffle=False, even=False)) for r in (0, 1)]
[[0, 2, 4], [1, 3]]
"""

from __future__ import annotations

import itertools
import operator
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from typing import Any, TypeVar

import numpy as np

from stoker._dataset import IterableDataset
from stoker._elastic import Layout, check_elastic, checked_batch_size, deal
from stoker._random import SampleSeeds, rng
from stoker._sampler import U64, IndexArray, Sampler, check_state, fast_iter, is_int, state_int
from stoker._worker_info import get_worker_info

T_co = TypeVar("T_co", covariant=True)


def _env_int(name: str) -> int | None:
    """The integer value of environment variable ``name``, or None if it is unset."""
    raw = os.environ.get(name)
    try:
        return None if raw is None or not raw.strip() else int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}.") from None


def find_world(num_replicas: int | None, rank: int | None) -> tuple[int | None, int | None]:
    """Fill in ``num_replicas`` / ``rank``: from torch's process group, else the env.

    Either stays None when neither source has it.
    """
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
    return num_replicas, rank


def check_world(who: str, num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """``(num_replicas, rank)`` as ints, if both are known and consistent, else raise.

    Raises:
        RuntimeError: one of them is None (neither passed nor found).
        TypeError: one of them is not an integer.
        ValueError: ``num_replicas`` < 1, or ``rank`` outside ``[0, num_replicas)``.
    """
    if num_replicas is None or rank is None:
        raise RuntimeError(
            f"{who} needs num_replicas and rank: no initialised torch.distributed process "
            "group and WORLD_SIZE / RANK are not set; pass num_replicas and rank, or set the "
            "WORLD_SIZE and RANK environment variables (torchrun does)."
        )
    for name, value in (("num_replicas", num_replicas), ("rank", rank)):
        if not is_int(value):
            raise TypeError(f"{name} must be an integer, got {value!r}.")
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be a positive integer, got {num_replicas}.")
    if not 0 <= rank < num_replicas:
        raise ValueError(
            f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}] for "
            f"num_replicas={num_replicas}; pass this process's rank (0 .. num_replicas - 1)."
        )
    return int(num_replicas), int(rank)


class DistributedSampler(Sampler[int]):
    """Gives each of ``num_replicas`` processes its own share of a dataset's indices.

    As torch's: all ranks compute one order (shuffled from ``rng(seed, epoch)``), padded by
    repetition (or cut, with ``drop_last``) to a multiple of ``num_replicas``; rank ``r``
    takes every ``num_replicas``-th index from ``r``. Call ``set_epoch`` before each epoch.

    Args:
        dataset: anything with ``__len__``.
        num_replicas: processes; default from the process group, else ``WORLD_SIZE``.
        rank: this process's rank; default likewise, else ``RANK``.
        shuffle: reshuffle each epoch.
        seed: the shuffle seed, equal on all ranks.
        drop_last: cut the tail instead of padding.
        even: keyword-only; False gives every index exactly once, unpadded and uncut
            (``docs/engine.md``).
        elastic: keyword-only; True gives the same global batches, draws included, on
            any world size, and resumes on another (``docs/engine.md``, "Elastic
            sampling"); False: torch's interleaved order.

    Raises:
        RuntimeError: the world size or rank cannot be found.
        TypeError: a wrongly typed argument.
        ValueError: an out-of-range argument, or ``even=False`` with ``drop_last``.

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
        *,
        even: bool = True,
        elastic: bool = False,
    ) -> None:
        num_replicas, rank = check_world("DistributedSampler", *find_world(num_replicas, rank))
        if not is_int(seed):
            raise TypeError(f"seed must be an integer, got {seed!r}.")
        if not isinstance(even, bool):
            raise TypeError(f"even must be a bool, got {even!r}; pass True or False.")
        if not even and drop_last:
            raise ValueError(
                "even=False gives every index exactly once, but drop_last=True drops the "
                "tail to make ranks even; pass even=False (evaluation) or drop_last=True "
                "(training), not both."
            )
        if not isinstance(elastic, bool):
            raise TypeError(f"elastic must be a bool, got {elastic!r}; pass True or False.")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        self.shuffle = shuffle
        self.seed = int(seed)
        self.even = even
        self.elastic = elastic
        self.batch_size: int | None = None  # elastic: each rank's, set by the loader
        n, r = len(dataset), self.num_replicas
        if not even:
            self.num_samples = len(range(rank, n, r))
            self.total_size = n
        else:
            self.num_samples = n // r if drop_last else -(-n // r)
            self.total_size = self.num_samples * self.num_replicas
        if elastic:
            self._layout = Layout(total=self.total_size, replicas=r, rank=rank, batch=1)
            self.num_samples = self._layout.samples

    def bind_batch_size(self, batch_size: int) -> None:
        """Set each rank's batch size (elastic only; the loader calls it): global batch
        ``k`` is then the places ``[k * G, (k + 1) * G)`` of the epoch's order, ``G =
        batch_size * num_replicas``, rank ``r`` holding the ``r``-th block of each.

        Raises:
            ValueError: the sampler was bound to another batch size (by another loader).
        """
        self.batch_size = checked_batch_size(self, self.batch_size, batch_size)
        self._layout = self._layout._replace(batch=self.batch_size)
        self.num_samples = self._layout.samples

    @property
    def global_batch_size(self) -> int:
        """Samples in a global batch, all ranks together (elastic: ``batch_size * R``)."""
        return (self.batch_size or 1) * self.num_replicas

    def sample_seeds(self) -> Callable[[int], SampleSeeds]:
        """Batch ``k`` of this rank -> its samples' seeds, for the epoch now set (elastic)."""
        seed, epoch, start = self.seed % U64, operator.index(self.epoch) % U64, self._layout.start
        return lambda k: SampleSeeds(seed=seed, epoch=epoch, start=start(k))

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch whose order the next ``__iter__`` gives (same on every rank).

        Args:
            epoch: the epoch number, an integer.

        Raises:
            TypeError: ``epoch`` is not an integer.
        """
        if not is_int(epoch):
            raise TypeError(f"epoch must be an integer, got {epoch!r}.")
        self.epoch = int(epoch)

    def _epoch_indices(self) -> IndexArray:
        """This rank's indices for the current epoch, as an int64 array."""
        n = len(self.dataset)
        order = self._permutation(n) if self.shuffle else np.arange(n, dtype=np.int64)
        total = self.total_size
        if n >= total:
            order = order[:total]
        elif n > 0:
            order = np.resize(order, total)  # repeats the order from its start
        if self.elastic:
            return self._layout.take(order).astype(np.int64, copy=False)
        return order[self.rank : total : self.num_replicas].astype(np.int64, copy=False)

    def _permutation(self, n: int) -> IndexArray:
        """The epoch's shuffled order of ``n`` indices, the same on every rank."""
        return rng(self.seed % U64, operator.index(self.epoch) % U64).permutation(n)

    @fast_iter
    def __iter__(self) -> Iterator[int]:
        return iter(self._epoch_indices().tolist())

    def __len__(self) -> int:
        return self.num_samples

    def state_dict(self) -> dict[str, Any]:
        """``{"kind": "DistributedSampler", "seed", "epoch"}``: the same on every rank.

        The epoch is the one ``set_epoch`` set (iterating does not advance it, as in
        torch). Edit ``"epoch"`` before loading to skip ahead or rewind. An elastic
        sampler's state also holds ``"elastic"``, what a resume on another world size
        must share: the dataset length, the global batch size and the order's settings
        (the world size it was saved on is kept for messages).

        >>> DistributedSampler(range(4), 2, 0, seed=3).state_dict()
        {'kind': 'DistributedSampler', 'seed': 3, 'epoch': 0}
        """
        state: dict[str, Any] = {"kind": type(self).__name__, "seed": self.seed}
        state["epoch"] = self.epoch
        if self.elastic:
            state["elastic"] = self._elastic_part()
        return state

    def _elastic_part(self) -> dict[str, Any]:
        """What an elastic state must share with the sampler that loads it (and the world
        size it was saved on)."""
        return {
            "length": len(self.dataset),
            "global_batch_size": self.global_batch_size,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "even": self.even,
            "num_replicas": self.num_replicas,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()`` (of any rank): the seed and the epoch.

        An elastic sampler takes an elastic state saved on any world size, if the state's
        seed, dataset length, global batch size and order settings are this sampler's.

        Args:
            state_dict: a dict from ``DistributedSampler.state_dict()``.

        Raises:
            TypeError: it is not a dict, or ``seed`` / ``epoch`` are not ints.
            ValueError: its kind or keys differ, or (elastic) it cannot resume here: the
                message names both values.
        """
        seed, epoch = self._checked_state(state_dict)
        self.seed, self.epoch = seed, epoch

    def _checked_state(self, state_dict: Mapping[str, Any]) -> tuple[int, int]:
        """``(seed, epoch)`` of ``state_dict``, all of it validated; nothing is applied."""
        state = check_state(state_dict, self, ("seed", "epoch"), optional=("elastic",))
        seed = state_int(self, state, "seed", bound=None)
        epoch = state_int(self, state, "epoch", bound=None)
        saved = state.get("elastic")
        if saved is None and not self.elastic:
            return seed, epoch
        if saved is None or not self.elastic:
            was, now = ("False", "True") if saved is None else ("True", "False")
            raise ValueError(
                f"DistributedSampler state was saved with elastic={was}, but this sampler has "
                f"elastic={now}: the two place samples on ranks differently, so the rest of "
                f"the epoch would repeat and miss samples; build the sampler with "
                f"elastic={was}."
            )
        check_elastic("DistributedSampler", saved, self._elastic_part(), seed, self.seed)
        return seed, epoch


def _worker() -> tuple[int, int]:
    """``(worker id, number of workers)`` of the calling code; ``(0, 1)`` outside workers.

    Asks stoker, then torch (when loaded), so torch's DataLoader shards this dataset too.
    """
    info: Any = get_worker_info()
    if info is None:
        torch_data = sys.modules.get("torch.utils.data")
        info = torch_data.get_worker_info() if torch_data is not None else None
    return (0, 1) if info is None else (int(info.id), int(info.num_workers))


class ShardedIterable(IterableDataset[T_co]):
    """This rank's and this worker's share of an iterable dataset (every item once overall).

    Item ``i`` goes to rank ``i % num_replicas`` and, within it, to worker
    ``(i // num_replicas) % num_workers``, so a rank's items do not depend on its worker
    count. Each worker reads and skips the others' items: for costly items, shard the
    source instead. The world is found when this is built (one process without a process
    group or ``WORLD_SIZE`` / ``RANK``); the worker at each ``__iter__``.

    Args:
        dataset: any iterable, iterated afresh at each ``__iter__``.
        num_replicas: number of ranks (keyword-only); default as ``DistributedSampler``.
        rank: this process's rank (keyword-only); default as ``DistributedSampler``.
        elastic: keyword-only; True: the same global batches on any world size
            (``docs/engine.md``, "Elastic sampling").
        seed: keyword-only; elastic items are seeded from it, ``set_epoch`` and their place.

    Raises:
        RuntimeError: only one of ``num_replicas`` / ``rank`` is given or found.
        TypeError, ValueError: as ``DistributedSampler``.

    >>> [list(ShardedIterable(range(7), num_replicas=2, rank=r)) for r in (0, 1)]
    [[0, 2, 4, 6], [1, 3, 5]]
    >>> len(ShardedIterable(range(7), num_replicas=2, rank=1))
    3
    """

    def __init__(
        self,
        dataset: Iterable[T_co],
        *,
        num_replicas: int | None = None,
        rank: int | None = None,
        elastic: bool = False,
        seed: int = 0,
    ) -> None:
        found = find_world(num_replicas, rank)
        if found == (None, None):
            found = (1, 0)
        if not isinstance(elastic, bool):
            raise TypeError(f"elastic must be a bool, got {elastic!r}; pass True or False.")
        if not is_int(seed):
            raise TypeError(f"seed must be an integer, got {seed!r}.")
        self.dataset = dataset
        self.num_replicas, self.rank = check_world("ShardedIterable", *found)
        self.elastic, self.seed, self.epoch = elastic, int(seed), 0
        self.batch_size: int | None = None  # elastic: each rank's, set by the loader

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch whose seeds an elastic share's items are drawn with.

        Raises:
            TypeError: ``epoch`` is not an integer.
        """
        if not is_int(epoch):
            raise TypeError(f"epoch must be an integer, got {epoch!r}.")
        self.epoch = int(epoch)

    def bind_batch_size(self, batch_size: int) -> None:
        """Set each rank's batch size (elastic only; the loader calls it), as
        :meth:`DistributedSampler.bind_batch_size`."""
        self.batch_size = checked_batch_size(self, self.batch_size, batch_size)

    def elastic_part(self) -> dict[str, Any]:
        """What an elastic share's state must share with the one that resumes it (and
        the world size it was saved on, for messages)."""
        return {
            "global_batch_size": (self.batch_size or 1) * self.num_replicas,
            "num_replicas": self.num_replicas,
        }

    def __iter__(self) -> Iterator[T_co]:
        worker_id, num_workers = _worker()
        if self.elastic:
            b = self.batch_size or 1
            place = Layout(total=0, replicas=self.num_replicas, rank=self.rank, batch=b)
            seeds = SampleSeeds(seed=self.seed % U64, epoch=self.epoch % U64, start=0)
            return deal(iter(self.dataset), place, worker_id, num_workers, seeds)
        start = worker_id * self.num_replicas + self.rank
        return itertools.islice(iter(self.dataset), start, None, self.num_replicas * num_workers)

    def __len__(self) -> int:
        """This rank's number of items (all its workers together), if ``dataset`` has a len.

        Raises:
            TypeError: ``dataset`` has no ``__len__``.
        """
        n = len(self.dataset)  # type: ignore[arg-type]
        if not self.elastic:
            return len(range(self.rank, n, self.num_replicas))
        b = self.batch_size or 1
        full, rest = divmod(n, b * self.num_replicas)
        return full * b + min(b, max(0, rest - self.rank * b))
