"""The tail of an epoch: its last batches split across worker processes that would idle.

A process worker loads whole batches, so an epoch's last batches can leave workers idle.
When batches are slow (see :func:`~stoker._policy.worth_splitting`), the dataset leaves the
global random generators alone (so a part seeded like its batch loads the same samples)
and the loader uses the default collate, the iterator asks :func:`plan` how to cut a task
among the workers that would finish early, sends the parts as tasks of their own, and
joins the collated parts with :func:`concat` into memory the loader keeps: the batch one
worker would have made, for one more copy. A loader remembers its batches' load time and
size, so a fresh iterator may split its tail from the start. See ``docs/engine.md``,
"Tail split".
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from stoker import _torch
from stoker._batch import Alloc
from stoker._collate import numpy_dtype
from stoker._engine._errors import RemoteError
from stoker._engine._window import Failure
from stoker.errors import CollateError

_MIN_SHARE = 0.1
"""A worker's share of a split batch is at least this fraction (else it is sent whole)."""


def plan(n: int, loads: Sequence[float], remaining: float) -> list[tuple[int, int]] | None:
    """How to share a task of ``n`` samples among workers: ``[(worker, samples), ...]`` in
    sample order, or None to send it whole.

    The remaining work is poured onto the workers' projected loads until they are level
    (water filling); this task fills the least loaded ones up to that level.

    Args:
        n: samples in the task.
        loads: each worker's projected work, in batches (its queued tasks and what is left
            of the one it runs).
        remaining: batches not sent yet, this one included.

    >>> plan(100, [1.0, 1.0, 1.0, 1.0], 2)  # 2 batches on 4 level workers: halves
    [(0, 50), (1, 50)]
    >>> plan(100, [2.0, 1.0], 1) is None  # the less loaded worker takes it whole
    True
    """
    level = water_level(loads, remaining)
    shares: list[tuple[int, float]] = []
    left = 1.0
    for w in sorted(range(len(loads)), key=loads.__getitem__):
        share = min(left, level - loads[w])
        if share < _MIN_SHARE:
            break
        shares.append((w, share))
        left -= share
    if len(shares) < 2 or shares[0][1] > 1 - _MIN_SHARE:
        return None
    total = sum(s for _, s in shares)  # < 1 when the last share was too small: spread it
    out, done, acc = [], 0, 0.0
    for w, share in shares:
        acc += share / total
        end = round(acc * n)
        if end > done:
            out.append((w, end - done))
            done = end
    return out if len(out) > 1 else None


def water_level(loads: Sequence[float], amount: float) -> float:
    """The level ``L`` at which ``sum(max(0, L - load))`` equals ``amount``.

    >>> water_level([1.0, 2.0], 1.0), water_level([1.0, 1.0, 1.0, 1.0], 2.0)
    (2.0, 1.5)
    """
    ordered = sorted(loads)
    total = 0.0
    for k, load in enumerate(ordered, 1):
        total += load
        level = (amount + total) / k
        if k == len(ordered) or level <= ordered[k]:
            return level
    return float(amount)  # no workers


def mergeable(batch: Any) -> bool:
    """Whether :func:`concat` can join batches shaped like ``batch`` (what stoker's default
    collate makes of most samples: arrays, tensors and str/bytes columns in dicts, lists and
    namedtuples)."""
    if isinstance(batch, np.ndarray) or _torch.is_tensor(batch):
        return bool(batch.ndim > 0)
    if type(batch) is dict:
        return all(mergeable(v) for v in batch.values())
    if isinstance(batch, (list, tuple)) and batch:
        if all(isinstance(x, (str, bytes)) for x in batch):
            return True
        return (type(batch) is list or _is_namedtuple(batch)) and all(map(mergeable, batch))
    return False


def concat(parts: Sequence[Any], alloc: Alloc | None = None) -> Any:
    """The batch that default collate makes of all samples of ``parts``, in order, from the
    batches it made of each part (leaves joined along the first axis).

    Args:
        parts: the parts' batches.
        alloc: where the joined NumPy leaves (and tensors of NumPy dtypes) are written;
            fresh memory when None.
    """
    first = parts[0]
    if isinstance(first, np.ndarray):
        if alloc is None:
            return np.concatenate(parts)
        shape = (sum(len(p) for p in parts), *first.shape[1:])
        return np.concatenate(parts, out=alloc(shape, np.result_type(*parts)))
    if _torch.is_tensor(first):
        torch = _torch.loaded()
        assert torch is not None  # a tensor exists
        dtype = numpy_dtype(torch, first.dtype)
        if alloc is None or dtype is None or first.device.type != "cpu":
            return torch.cat(list(parts))
        out = torch.from_numpy(alloc((sum(len(p) for p in parts), *first.shape[1:]), dtype))
        return torch.cat(list(parts), out=out)
    if type(first) is dict:
        return {k: concat([p[k] for p in parts], alloc) for k in first}
    if all(isinstance(x, (str, bytes)) for x in first):  # a column of strings
        return type(first)(itertools.chain.from_iterable(parts))
    columns = [concat(col, alloc) for col in zip(*parts, strict=True)]
    return type(first)(*columns) if _is_namedtuple(first) else columns


class Splits:
    """The batches of an epoch sent as parts: each part's share of its batch, the parts in
    so far, and the joined batch once the last is in. A batch's parts have consecutive
    task indices; it is delivered at its first part's place."""

    def __init__(self) -> None:
        self._parts: dict[int, tuple[int, list[Any]]] = {}  # k -> (first index, parts)
        self._share: dict[int, float] = {}  # index of a part in flight -> its share

    def __contains__(self, k: int) -> bool:
        return k in self._parts

    def add(self, k: int, first: int, shares: Sequence[float]) -> None:
        """Batch ``k`` went as parts ``first, first + 1, ...`` of these shares."""
        for idx, share in enumerate(shares, first):
            self._share[idx] = share
        self._parts[k] = (first, [None] * len(shares))

    def is_part(self, idx: int) -> bool:
        return idx in self._share

    def share(self, idx: int) -> float:
        """Task ``idx``'s share of its batch (1 for a whole batch)."""
        return self._share.get(idx, 1.0)

    def done(self, k: int, idx: int, part: Any, alloc: Alloc) -> tuple[int, Any]:
        """Keep part ``idx`` of batch ``k``; returns (its first part's index, the batch
        joined into ``alloc``'s memory once every part is in, else None). A part that
        failed, or parts that do not stack, make the batch a :class:`Failure`."""
        first, parts = self._parts[k]
        parts[idx - first] = part
        del self._share[idx]
        if any(p is None for p in parts):
            return first, None
        del self._parts[k]
        failed = [p for p in parts if isinstance(p, Failure)]
        return first, failed[0] if failed else _join(k, parts, alloc)

    def loads(
        self, running: dict[int, int], since: Sequence[float], now: float, mean: float
    ) -> list[float]:
        """Each worker's projected work in batches: its tasks in flight (``running``, in
        the order sent: a worker's first one runs), less what ``mean`` seconds a batch says
        is done of the one it runs since ``since``."""
        loads = [0.0] * len(since)
        current: dict[int, int] = {}
        for idx, w in running.items():
            loads[w] += self.share(idx)
            current.setdefault(w, idx)
        for w, idx in current.items():
            loads[w] -= min(self.share(idx), (now - since[w]) / mean)
        return loads


def _join(k: int, parts: list[Any], alloc: Alloc) -> Any:
    try:
        return concat(parts, alloc)
    except (ValueError, RuntimeError, TypeError) as exc:  # parts that do not stack
        err = CollateError(
            f"default_collate: the samples of batch {k} do not stack into one batch "
            f"({exc}). Give every sample the same shapes, or pass a collate_fn that "
            "handles them."
        )
        return Failure(RemoteError(err, f"joining the parts of batch {k}", keep_object=True))


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")
