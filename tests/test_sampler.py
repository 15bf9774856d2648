"""Tests of stoker's samplers, with torch.utils.data as the oracle where behaviour is shared."""

from __future__ import annotations

import pickle
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from stoker._sampler import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
    batch_arrays,
    epoch_indices,
)

# ---------------------------------------------------------------- Sampler / Sequential


def test_sampler_base_accepts_data_source_and_requires_iter() -> None:
    """Sampler takes an optional data_source and raises NotImplementedError when iterated."""
    s: Sampler[int] = Sampler(range(3))
    with pytest.raises(NotImplementedError, match="__iter__"):
        iter(s)
    assert Sampler[int] is not None  # generic subscription works


def test_sequential_matches_torch() -> None:
    """SequentialSampler yields the same indices and length as torch's."""
    torch = pytest.importorskip("torch")
    for n in (0, 1, 7):
        ours, theirs = SequentialSampler(range(n)), torch.utils.data.SequentialSampler(range(n))
        assert list(ours) == list(theirs)
        assert len(ours) == len(theirs)
        assert ours._epoch_indices().dtype == np.int64


# ---------------------------------------------------------------- RandomSampler


def test_random_sampler_is_a_permutation() -> None:
    """Without replacement an epoch is a permutation of range(n)."""
    s = RandomSampler(range(100), generator=3)
    out = list(s)
    assert sorted(out) == list(range(100))
    assert out != list(range(100))
    assert all(type(i) is int for i in out)


def test_random_sampler_more_samples_than_items() -> None:
    """num_samples > n without replacement concatenates permutations, then a cut one."""
    s = RandomSampler(range(10), num_samples=25, generator=0)
    out = list(s)
    assert len(out) == len(s) == 25
    assert sorted(out[:10]) == list(range(10))
    assert sorted(out[10:20]) == list(range(10))
    assert len(set(out[20:])) == 5


def test_random_sampler_replacement_in_range() -> None:
    """With replacement draws stay in [0, n) and repeat."""
    s = RandomSampler(range(7), replacement=True, num_samples=500, generator=1)
    out = s._epoch_indices()
    assert out.dtype == np.int64 and len(out) == 500
    assert out.min() >= 0 and out.max() < 7
    assert len(set(out.tolist())) == 7


def test_random_sampler_int_seed_repeats_and_epochs_differ() -> None:
    """The same int seed gives the same sequence of epochs; consecutive epochs differ."""
    a, b = RandomSampler(range(50), generator=42), RandomSampler(range(50), generator=42)
    epochs_a = [list(a) for _ in range(3)]
    epochs_b = [list(b) for _ in range(3)]
    assert epochs_a == epochs_b
    assert epochs_a[0] != epochs_a[1] != epochs_a[2]
    assert list(RandomSampler(range(50), generator=43)) != epochs_a[0]


def test_random_sampler_numpy_generator_advances() -> None:
    """A NumPy generator is advanced per epoch and reproduces from the same state."""
    s = RandomSampler(range(50), generator=np.random.default_rng(5))
    t = RandomSampler(range(50), generator=np.random.default_rng(5))
    first = list(s)
    assert first != list(s)
    assert list(t) == first


def test_random_sampler_torch_generator_and_global_seed() -> None:
    """A torch Generator or torch.manual_seed (generator=None) makes epochs repeatable."""
    torch = pytest.importorskip("torch")
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    assert list(RandomSampler(range(30), generator=g1)) == list(
        RandomSampler(range(30), generator=g2)
    )
    torch.manual_seed(11)
    a = list(RandomSampler(range(30)))
    torch.manual_seed(11)
    assert list(RandomSampler(range(30))) == a


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_samples": 0},
        {"num_samples": -3},
        {"replacement": "x"},
        {"replacement": 1},
    ],
)
def test_random_sampler_errors_match_torch(kwargs: dict[str, object]) -> None:
    """Invalid RandomSampler arguments raise the exception type torch raises."""
    torch = pytest.importorskip("torch")
    with pytest.raises(Exception) as theirs:
        torch.utils.data.RandomSampler(range(5), **kwargs)
    with pytest.raises(theirs.type):
        RandomSampler(range(5), **kwargs)  # type: ignore[arg-type]


def test_random_sampler_empty_and_bad_generator() -> None:
    """An empty source is a ValueError (as torch); an unknown generator a TypeError."""
    with pytest.raises(ValueError, match="num_samples"):
        RandomSampler([])
    with pytest.raises(TypeError, match="generator"):
        RandomSampler(range(3), generator="seed")


def test_random_sampler_len_matches_torch() -> None:
    """len() equals torch's for default and explicit num_samples."""
    torch = pytest.importorskip("torch")
    for kw in ({}, {"num_samples": 13}, {"replacement": True, "num_samples": 4}):
        assert len(RandomSampler(range(9), **kw)) == len(  # type: ignore[arg-type]
            torch.utils.data.RandomSampler(range(9), **kw)
        )


# ---------------------------------------------------------------- SubsetRandomSampler


def test_subset_random_sampler_permutes_the_subset() -> None:
    """Each epoch is a permutation of the given indices, differing between epochs."""
    idx = [5, 9, 11, 40, 41, 2, 7, 8]
    s = SubsetRandomSampler(idx, generator=0)
    a, b = list(s), list(s)
    assert sorted(a) == sorted(b) == sorted(idx)
    assert a != b
    assert len(s) == len(idx)
    assert s.indices is idx


def test_subset_random_sampler_accepts_arrays_and_rejects_floats() -> None:
    """Array and tensor indices work; float or 2-D indices are rejected."""
    assert sorted(SubsetRandomSampler(np.array([3, 1, 2]), generator=1)) == [1, 2, 3]
    assert list(SubsetRandomSampler([], generator=1)) == []
    with pytest.raises(TypeError, match="integers"):
        SubsetRandomSampler([0.5, 1.5])
    with pytest.raises(ValueError, match="1-D"):
        SubsetRandomSampler([[1, 2]])
    torch = pytest.importorskip("torch")
    assert sorted(SubsetRandomSampler(torch.tensor([4, 0]), generator=2)) == [0, 4]


# ---------------------------------------------------------------- WeightedRandomSampler


def _chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson's chi-square statistic of ``counts`` against ``probs``."""
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_weighted_with_replacement_distribution() -> None:
    """Draw frequencies follow the weights (chi-square, 4 categories, fixed seed)."""
    w = np.array([1.0, 2.0, 0.0, 3.0, 4.0])
    out = WeightedRandomSampler(w, 200_000, generator=0)._epoch_indices()
    counts = np.bincount(out, minlength=5)
    assert counts[2] == 0
    nz = w > 0
    # 3 degrees of freedom: P(chi2 > 25) ~ 1.6e-5.
    assert _chi2(counts[nz], w[nz] / w.sum()) < 25.0
    # Draws are independent: neighbours are equal with probability sum(p**2) = 0.3.
    assert abs(np.mean(out[1:] == out[:-1]) - ((w / w.sum()) ** 2).sum()) < 0.01


def test_weighted_without_replacement_first_draw_distribution() -> None:
    """Without replacement, indices are distinct and the first one is drawn ∝ weight."""
    w = np.array([0.0, 1.0, 2.0, 5.0, 0.0, 2.0])
    s = WeightedRandomSampler(w, 3, replacement=False, generator=7)
    firsts = []
    for _ in range(4000):
        out = list(s)
        assert len(set(out)) == 3 and not {0, 4} & set(out)
        firsts.append(out[0])
    counts = np.bincount(firsts, minlength=6)[w > 0]
    assert _chi2(counts, w[w > 0] / w.sum()) < 25.0


def test_weighted_without_replacement_order_follows_weights() -> None:
    """Without replacement heavier indices come first: the order is the order of drawing."""
    w = [1.0, 1e3, 1e6, 1e-3]
    for k in (3, 4):
        s = WeightedRandomSampler(w, k, replacement=False, generator=0)
        epochs = [list(s)[:3] for _ in range(200)]
        assert sum(e == [2, 1, 0] for e in epochs) >= 190


def test_weighted_zero_weights_never_drawn() -> None:
    """Zero weights (first, middle, last) are never drawn, with or without replacement."""
    w = [0.0, 0.0, 1e-12, 0.0, 1.0, 0.0]
    drawn = set(WeightedRandomSampler(w, 100_000, generator=1))
    assert drawn <= {2, 4} and 4 in drawn
    assert sorted(WeightedRandomSampler(w, 2, replacement=False, generator=1)) == [2, 4]


def test_weighted_many_weights() -> None:
    """2**25 weights (beyond torch.multinomial's 2**24) work and respect zero weights."""
    w = np.zeros(2**25, dtype=np.float32)
    w[-5:] = 1.0
    w[123] = 1.0
    out = WeightedRandomSampler(w, 1000, generator=0)._epoch_indices()
    assert set(out.tolist()) <= {123, *range(2**25 - 5, 2**25)}
    out = WeightedRandomSampler(w, 6, replacement=False, generator=0)._epoch_indices()
    assert sorted(out.tolist()) == [123, *range(2**25 - 5, 2**25)]


@pytest.mark.parametrize(
    ("weights", "kwargs", "match"),
    [
        ([[1.0, 2.0]], {}, "1-D"),
        ([1.0, float("nan")], {}, "finite"),
        ([1.0, float("inf")], {}, "finite"),
        ([1.0, -0.5], {}, "non-negative"),
        ([0.0, 0.0], {}, "positive sum"),
        ([], {}, "positive sum"),
        ([1.0, 0.0, 2.0], {"num_samples": 3, "replacement": False}, "non-zero"),
    ],
)
def test_weighted_validates_weights(weights: object, kwargs: dict[str, object], match: str) -> None:
    """Bad weights raise ValueError naming the rule broken."""
    kw = {"num_samples": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        WeightedRandomSampler(weights, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_samples": 0},
        {"num_samples": True},
        {"num_samples": 2.0},
        {"num_samples": 2, "replacement": "x"},
    ],
)
def test_weighted_errors_match_torch(kwargs: dict[str, object]) -> None:
    """Invalid num_samples / replacement raise the exception type torch raises."""
    torch = pytest.importorskip("torch")
    with pytest.raises(Exception) as theirs:
        torch.utils.data.WeightedRandomSampler([1.0, 2.0, 3.0], **kwargs)
    with pytest.raises(theirs.type):
        WeightedRandomSampler([1.0, 2.0, 3.0], **kwargs)  # type: ignore[arg-type]


def test_weighted_reassigned_weights_are_used() -> None:
    """Assigning new weights takes effect at the next epoch and is validated."""
    s = WeightedRandomSampler([1.0, 0.0], 50, generator=0)
    assert set(s) == {0}
    s.weights = [0.0, 1.0]
    assert set(s) == {1}
    with pytest.raises(ValueError):
        s.weights = [-1.0, 1.0]
    assert s.weights.dtype == np.float64 and len(s) == 50


# ---------------------------------------------------------------- BatchSampler


@pytest.mark.parametrize("n", [0, 1, 9, 10, 11])
@pytest.mark.parametrize("bs", [1, 3, 10])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_sampler_matches_torch(n: int, bs: int, drop_last: bool) -> None:
    """Batches and len() equal torch's BatchSampler over the same sequential sampler."""
    torch = pytest.importorskip("torch")
    tu = torch.utils.data
    theirs = tu.BatchSampler(tu.SequentialSampler(range(n)), bs, drop_last)
    ours = BatchSampler(SequentialSampler(range(n)), bs, drop_last)
    assert list(ours) == list(theirs)
    assert len(ours) == len(theirs)
    assert [a.tolist() for a in ours._iter_arrays()] == list(theirs)


def test_batch_sampler_arrays_are_int64_slices() -> None:
    """_iter_arrays gives int64 arrays covering one epoch of the wrapped sampler."""
    ours = BatchSampler(RandomSampler(range(23), generator=4), 5, drop_last=False)
    arrays = list(ours._iter_arrays())
    assert all(a.dtype == np.int64 for a in arrays)
    assert [len(a) for a in arrays] == [5, 5, 5, 5, 3]
    assert sorted(np.concatenate(arrays).tolist()) == list(range(23))
    # The same seed gives the same epoch through either path.
    lists = list(BatchSampler(RandomSampler(range(23), generator=4), 5, drop_last=False))
    assert lists == [a.tolist() for a in arrays]


def test_batch_sampler_wraps_torch_sampler_and_iterables() -> None:
    """A torch sampler, or a plain iterable, works as the wrapped sampler."""
    torch = pytest.importorskip("torch")
    inner = torch.utils.data.RandomSampler(range(10), generator=torch.Generator().manual_seed(0))
    batches = list(BatchSampler(inner, 4, drop_last=True))
    assert [len(b) for b in batches] == [4, 4]
    assert len({i for b in batches for i in b}) == 8
    arrays = list(BatchSampler(inner, 4, drop_last=False)._iter_arrays())
    assert [a.dtype for a in arrays] == [np.int64] * 3
    assert sorted(np.concatenate(arrays).tolist()) == list(range(10))
    assert list(BatchSampler([3, 1, 2], 2, drop_last=False)) == [[3, 1], [2]]


@pytest.mark.parametrize(
    ("batch_size", "drop_last"),
    [(0, False), (-1, False), (2.0, False), (True, False), (2, "x"), (2, 1)],
)
def test_batch_sampler_errors_match_torch(batch_size: object, drop_last: object) -> None:
    """Invalid batch_size / drop_last raise the exception type torch raises."""
    torch = pytest.importorskip("torch")
    with pytest.raises(Exception) as theirs:
        torch.utils.data.BatchSampler(range(5), batch_size, drop_last)
    with pytest.raises(theirs.type):
        BatchSampler(range(5), batch_size, drop_last)  # type: ignore[arg-type]


def test_overridden_iter_disables_fast_path() -> None:
    """A subclass overriding __iter__ is iterated, never bypassed via _epoch_indices."""

    class Reversed(SequentialSampler):
        def __iter__(self) -> Iterator[int]:
            return reversed(range(len(self.data_source)))

    assert epoch_indices(Reversed(range(3))) is None
    assert list(BatchSampler(Reversed(range(5)), 2, drop_last=False)) == [[4, 3], [2, 1], [0]]
    arrays = batch_arrays(BatchSampler(Reversed(range(4)), 2, drop_last=False))
    assert arrays is not None and [a.tolist() for a in arrays] == [[3, 2], [1, 0]]

    class Doubled(BatchSampler):
        def __iter__(self) -> Iterator[list[int]]:
            for b in super().__iter__():
                yield b + b

    assert batch_arrays(Doubled(range(4), 2, drop_last=False)) is None


# ---------------------------------------------------------------- DistributedSampler


def test_distributed_unshuffled_matches_torch() -> None:
    """With shuffle=False every rank's list and len equal torch's, over many shapes."""
    torch = pytest.importorskip("torch")
    for n in (0, 1, 2, 3, 5, 7, 8, 10, 17):
        for replicas in (1, 2, 3, 4, 8, 13):
            for drop_last in (False, True):
                for rank in range(replicas):
                    kw = {"num_replicas": replicas, "rank": rank, "shuffle": False}
                    theirs = torch.utils.data.DistributedSampler(
                        range(n), drop_last=drop_last, **kw
                    )
                    ours = DistributedSampler(range(n), drop_last=drop_last, **kw)  # type: ignore[arg-type]
                    assert list(ours) == list(theirs), (n, replicas, drop_last, rank)
                    assert len(ours) == len(theirs)
                    assert ours.total_size == theirs.total_size


def test_distributed_ranks_disjoint_and_cover() -> None:
    """Shuffled ranks agree on one order: with drop_last disjoint, without it covering all."""
    n, replicas = 103, 4
    parts = [
        list(DistributedSampler(range(n), replicas, r, seed=3, drop_last=True))
        for r in range(replicas)
    ]
    flat = [i for p in parts for i in p]
    assert len(flat) == len(set(flat)) == (n // replicas) * replicas
    padded = [list(DistributedSampler(range(n), replicas, r, seed=3)) for r in range(replicas)]
    assert {i for p in padded for i in p} == set(range(n))
    assert {len(p) for p in padded} == {26}


def test_distributed_set_epoch_changes_order() -> None:
    """set_epoch changes the shuffled order; the same (seed, epoch) repeats it."""
    s = DistributedSampler(range(40), num_replicas=2, rank=1, seed=5)
    e0 = list(s)
    assert list(s) == e0  # no set_epoch: same order, as torch
    s.set_epoch(1)
    e1 = list(s)
    assert e1 != e0
    t = DistributedSampler(range(40), num_replicas=2, rank=1, seed=5)
    t.set_epoch(1)
    assert list(t) == e1
    with pytest.raises(TypeError):
        s.set_epoch(1.5)  # type: ignore[arg-type]


def test_distributed_world_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """num_replicas and rank come from WORLD_SIZE / RANK when no group is initialised."""
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "2")
    s = DistributedSampler(range(10), shuffle=False)
    assert (s.num_replicas, s.rank) == (3, 2)
    assert list(s) == [2, 5, 8, 1]
    assert DistributedSampler(range(10), rank=0).rank == 0


def test_distributed_missing_world_is_runtime_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without group, env vars or arguments, a RuntimeError says what to pass or set."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(RuntimeError, match="WORLD_SIZE"):
        DistributedSampler(range(10))
    with pytest.raises(RuntimeError, match="rank"):
        DistributedSampler(range(10), num_replicas=2)


def test_distributed_world_from_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """An initialised torch.distributed group supplies num_replicas and rank first."""
    fake = types.SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: True,
        get_world_size=lambda: 4,
        get_rank=lambda: 3,
    )
    monkeypatch.setitem(sys.modules, "torch.distributed", fake)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    s = DistributedSampler(range(8), shuffle=False)
    assert (s.num_replicas, s.rank) == (4, 3)
    assert list(s) == [3, 7]


def test_distributed_real_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real one-process gloo group is detected (world size 1, rank 0)."""
    pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("torch.distributed unavailable or already initialised")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        s = DistributedSampler(range(5), shuffle=False)
    finally:
        dist.destroy_process_group()
    assert (s.num_replicas, s.rank, list(s)) == (1, 0, [0, 1, 2, 3, 4])


@pytest.mark.parametrize(
    ("num_replicas", "rank", "exc"),
    [(2, 2, ValueError), (2, -1, ValueError), (0, 0, ValueError), (2, 1.0, TypeError)],
)
def test_distributed_invalid_rank(num_replicas: int, rank: object, exc: type) -> None:
    """rank outside [0, num_replicas) is a ValueError, as torch; non-ints a TypeError."""
    with pytest.raises(exc):
        DistributedSampler(range(4), num_replicas=num_replicas, rank=rank)  # type: ignore[arg-type]


def test_distributed_invalid_rank_type_matches_torch() -> None:
    """torch raises ValueError for an out-of-range rank too."""
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError):
        torch.utils.data.DistributedSampler(range(4), num_replicas=2, rank=2)


# ---------------------------------------------------------------- shared properties


def _all_samplers() -> list[Any]:
    """One instance of every sampler, seeded."""
    return [
        SequentialSampler(range(10)),
        RandomSampler(range(10), generator=1),
        RandomSampler(range(10), replacement=True, num_samples=15, generator=1),
        SubsetRandomSampler([1, 4, 6], generator=2),
        WeightedRandomSampler([1.0, 2.0, 0.0], 6, generator=3),
        WeightedRandomSampler([1.0, 2.0, 0.5], 2, replacement=False, generator=3),
        DistributedSampler(range(10), num_replicas=3, rank=1, seed=4),
        BatchSampler(RandomSampler(range(10), generator=5), 3, drop_last=False),
    ]


def test_pickle_round_trip_preserves_order() -> None:
    """Every sampler pickles, and the copy yields what the original yields next."""
    for s in _all_samplers():
        copy = pickle.loads(pickle.dumps(s))
        assert list(copy) == list(s), type(s).__name__
        assert list(copy) == list(s), type(s).__name__


def test_epoch_indices_consumes_like_iter() -> None:
    """_epoch_indices gives the epoch __iter__ would, as int64, and len() matches it."""
    for s in _all_samplers():
        if isinstance(s, BatchSampler):
            continue
        twin = pickle.loads(pickle.dumps(s))
        arr = epoch_indices(s)
        assert arr is not None and arr.dtype == np.int64
        assert arr.tolist() == list(twin)
        assert epoch_indices(s).tolist() == list(twin)  # type: ignore[union-attr]
        assert len(arr) == len(s)
