"""Sharding across ranks: ``DistributedSampler`` (map-style) and ``ShardedIterable`` (streams).

Both find the world as torch does: an initialised ``torch.distributed`` process group
first, else the ``WORLD_SIZE`` / ``RANK`` environment variables (torchrun sets them). They
read the world when built, in the main process, where the group lives: worker processes
and threads started later by a loader need not (and often cannot) join the group.

``DistributedSampler`` is resumable: its ``state_dict()`` is ``{"kind", "seed", "epoch"}``,
the same on every rank, so one rank's checkpoint restores them all. With ``even=False``
(evaluation) it neither pads nor drops: every index goes to exactly one rank.

>>> [list(DistributedSampler(range(5), 2, r, shuffle=False, even=False)) for r in (0, 1)]
[[0, 2, 4], [1, 3]]
"""

from __future__ import annotations

import itertools
import operator
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sized
from typing import Any, TypeVar

import numpy as np

from stoker._dataset import IterableDataset
from stoker._random import rng
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
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        self.shuffle = shuffle
        self.seed = int(seed)
        self.even = even
        n, r = len(dataset), self.num_replicas
        if not even:
            self.num_samples = len(range(rank, n, r))
            self.total_size = n
        else:
            self.num_samples = n // r if drop_last else -(-n // r)
            self.total_size = self.num_samples * self.num_replicas

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
        torch). Edit ``"epoch"`` before loading to skip ahead or rewind.

        >>> DistributedSampler(range(4), 2, 0, seed=3).state_dict()
        {'kind': 'DistributedSampler', 'seed': 3, 'epoch': 0}
        """
        return {"kind": type(self).__name__, "seed": self.seed, "epoch": self.epoch}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()`` (of any rank): the seed and the epoch.

        Args:
            state_dict: a dict from ``DistributedSampler.state_dict()``.

        Raises:
            TypeError: it is not a dict, or ``seed`` / ``epoch`` are not ints.
            ValueError: its kind or keys differ.
        """
        state = check_state(state_dict, self, ("seed", "epoch"))
        seed = state_int(self, state, "seed", bound=None)
        self.epoch = state_int(self, state, "epoch", bound=None)
        self.seed = seed


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
    count. Each worker still reads and skips the others' items: for costly items, shard the
    source instead. The world is found when this is built (one process without a process
    group or ``WORLD_SIZE`` / ``RANK``); the worker at each ``__iter__``.

    Args:
        dataset: any iterable, iterated afresh at each ``__iter__``.
        num_replicas: number of ranks (keyword-only); default as ``DistributedSampler``.
        rank: this process's rank (keyword-only); default as ``DistributedSampler``.

    Raises:
        RuntimeError: only one of ``num_replicas`` / ``rank`` is given or found.
        TypeError, ValueError: as ``DistributedSampler``.

    >>> [list(ShardedIterable(range(7), num_replicas=2, rank=r)) for r in (0, 1)]
    [[0, 2, 4, 6], [1, 3, 5]]
    >>> len(ShardedIterable(range(7), num_replicas=2, rank=1))
    3
    """

    def __init__(
        self, dataset: Iterable[T_co], *, num_replicas: int | None = None, rank: int | None = None
    ) -> None:
        found = find_world(num_replicas, rank)
        if found == (None, None):
            found = (1, 0)
        self.dataset = dataset
        self.num_replicas, self.rank = check_world("ShardedIterable", *found)

    def __iter__(self) -> Iterator[T_co]:
        worker_id, num_workers = _worker()
        start = worker_id * self.num_replicas + self.rank
        return itertools.islice(iter(self.dataset), start, None, self.num_replicas * num_workers)

    def __len__(self) -> int:
        """This rank's number of items (all its workers together), if ``dataset`` has a len.

        Raises:
            TypeError: ``dataset`` has no ``__len__``.
        """
        return len(range(self.rank, len(self.dataset), self.num_replicas))  # type: ignore[arg-type]
