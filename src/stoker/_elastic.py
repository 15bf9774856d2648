"""Elastic placement: where an elastic ``DistributedSampler`` puts each sample of the epoch's
global order (and an elastic ``ShardedIterable`` each item of a stream), so that global
batch ``k`` is the same at any world size, and the checks a state saved on one world size
must pass to resume on another.

The epoch's order (one permutation, the same on every rank, padded or cut to ``total`` as
torch's sampler pads or cuts) is cut into global batches of ``G = batch * replicas``
places; rank ``r`` holds the ``r``-th block of ``batch`` places of each. The last, partial
global batch is shared out in blocks as even as can be (equal when the order is padded).
Any world size dividing ``G`` gives the same global batches; only the last one's padding
depends on it. A stream is dealt by the same blocks (:func:`deal`), unpadded.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from stoker._random import SampleSeeds, seed_globals


class Layout(NamedTuple):
    """One rank's places in an epoch's global order of ``total`` places.

    >>> [Layout(total=10, replicas=2, rank=r, batch=2).take(np.arange(10)).tolist()
    ...  for r in (0, 1)]
    [[0, 1, 4, 5, 8], [2, 3, 6, 7, 9]]
    >>> Layout(total=10, replicas=2, rank=1, batch=2).start(2)
    9
    """

    total: int
    replicas: int
    rank: int
    batch: int

    @property
    def full(self) -> int:
        """The number of whole global batches."""
        return self.total // (self.batch * self.replicas)

    def _tail(self) -> tuple[int, int]:
        """(offset within the last global batch, size) of this rank's block of it."""
        rest = self.total - self.full * self.batch * self.replicas
        q, extra = divmod(rest, self.replicas)
        return self.rank * q + min(self.rank, extra), q + (self.rank < extra)

    @property
    def samples(self) -> int:
        """This rank's number of places."""
        return self.full * self.batch + self._tail()[1]

    def start(self, k: int) -> int:
        """The place of the first sample of this rank's batch ``k``."""
        size = self.batch * self.replicas
        if k < self.full:
            return k * size + self.rank * self.batch
        return self.full * size + self._tail()[0]

    def take(self, order: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """This rank's indices of the epoch's ``order`` (``total`` long), in its order."""
        size, full = self.batch * self.replicas, self.full
        head = order[: full * size].reshape(full, self.replicas, self.batch)[:, self.rank]
        offset, count = self._tail()
        tail = order[full * size + offset : full * size + offset + count]
        return np.concatenate([head.ravel(), tail])


_FIXES = {
    "length": "resume over the dataset the state was saved with",
    "global_batch_size": "give each rank batch_size = global batch size / world size",
    "shuffle": "build the sampler with the saving run's shuffle",
    "drop_last": "build the sampler with the saving run's drop_last",
    "even": "build the sampler with the saving run's even",
}
"""What an elastic state must share with what resumes it (beside the seed), and the fix."""


def checked_batch_size(owner: object, bound: int | None, batch_size: int) -> int:
    """``batch_size``, the batch size an elastic ``owner`` (bound to ``bound`` or to none
    yet) places its samples by from now on.

    Raises:
        ValueError: ``owner`` is bound to another batch size (by another loader).
    """
    if bound not in (None, batch_size):
        kind = type(owner).__name__
        raise ValueError(
            f"this elastic {kind} serves batches of {bound} (one loader's), but a loader "
            f"with batch_size={batch_size} uses it too: its samples' places follow one batch "
            f"size; give each loader its own {kind}."
        )
    return int(batch_size)


def check_elastic(
    who: str, saved: object, mine: Mapping[str, Any], seed: object, my_seed: int
) -> None:
    """Raise ``ValueError`` unless an elastic state's part ``saved`` (and its ``seed``) can
    resume on ``who`` (``"DistributedSampler"``, ``"ShardedIterable"``), whose part is
    ``mine`` (what it shares: the keys of ``_FIXES`` it has, and ``num_replicas``) and
    whose seed is ``my_seed``.

    Raises:
        ValueError: a key is missing, or a value differs (the message names both).
    """
    if not isinstance(saved, Mapping) or set(saved) != set(mine):
        found = sorted(saved) if isinstance(saved, Mapping) else type(saved).__name__
        raise ValueError(
            f"{who} state['elastic'] must be a dict with the keys {sorted(mine)}, got "
            f"{found}: pass the dict state_dict() returned."
        )
    if seed != my_seed:
        raise ValueError(
            f"elastic {who} state was saved with seed={seed}, but this {who} has "
            f"seed={my_seed}: every rank must draw the one order of the saving run; build it "
            f"with seed={seed}."
        )
    for key in (k for k in _FIXES if k in mine):
        if saved[key] != mine[key]:
            raise ValueError(
                f"elastic {who} state was saved with {key}={saved[key]!r} (on "
                f"{saved['num_replicas']} ranks), but this {who} has {key}={mine[key]!r} "
                f"(on {mine['num_replicas']} ranks): the rest of the epoch must be cut from "
                f"the same global batches; {_FIXES[key]}."
            )


def deal(
    source: Iterator[Any], place: Layout, worker: int, workers: int, seeds: SampleSeeds
) -> Iterator[Any]:
    """The items of a stream that worker ``worker`` of ``workers`` of rank ``place.rank``
    yields: the rank's blocks of global batches ``worker``, ``worker + workers``, ... (the
    loader takes the workers' batches in turn, so the rank's batches come in order). Every
    item read, kept or not, is drawn with the global RNGs seeded from its place, so the
    stream (and what a source's own draws make of it) is the same on every rank and worker.
    """
    size, i, k = place.batch * place.replicas, 0, worker
    while True:
        first = k * size + place.rank * place.batch
        for seed in seeds.after(i).of(first + place.batch - i):
            seed_globals(seed)
            try:
                item = next(source)
            except StopIteration:
                return
            if i >= first:
                yield item
            i += 1
        k += workers
