"""Tests of stoker's samplers, with torch.utils.data as the oracle where behaviour is shared."""

from __future__ import annotations

import json
import pickle
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from stoker._distributed import DistributedSampler
from stoker._random import draw_seed, rng
from stoker._sampler import (
    BatchSampler,
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


def test_random_sampler_epoch_is_rng_of_seed_and_epoch() -> None:
    """Epoch e of an int-seeded sampler is exactly the permutation from rng(seed, e)."""
    s = RandomSampler(range(30), generator=9)
    for e in range(3):
        assert list(s) == rng(9, e).permutation(30).tolist()


def test_numpy_generator_is_drawn_once_not_per_epoch() -> None:
    """A NumPy generator gives one base seed at the first __iter__, then is left alone."""
    g, twin = np.random.default_rng(5), np.random.default_rng(5)
    s = RandomSampler(range(50), generator=g)
    assert s.state_dict()["seed"] is None
    epochs = [list(s) for _ in range(3)]
    seed = draw_seed(twin)  # the one draw the sampler made
    assert g.bit_generator.state == twin.bit_generator.state
    assert epochs == [rng(seed, e).permutation(50).tolist() for e in range(3)]
    assert epochs[0] != epochs[1]


def test_torch_generator_draws_as_torch_each_epoch() -> None:
    """A torch Generator is drawn from at every epoch, exactly as torch's sampler draws."""
    torch = pytest.importorskip("torch")
    g, twin = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    s = RandomSampler(range(30), generator=g)
    epochs = [list(s) for _ in range(3)]
    theirs = torch.utils.data.RandomSampler(range(30), generator=twin)
    assert epochs == [list(theirs) for _ in range(3)]
    assert torch.equal(g.get_state(), twin.get_state())


def test_global_torch_rng_drawn_at_each_iter_not_when_built() -> None:
    """generator=None draws one seed from torch's global RNG per epoch, when iterated."""
    torch = pytest.importorskip("torch")
    runs = []
    for _ in range(2):
        s = RandomSampler(range(30))
        torch.manual_seed(11)  # after construction: the draws happen at each __iter__
        runs.append([list(s) for _ in range(3)])
        after = torch.rand(3)
        torch.manual_seed(11)
        for _ in range(3):
            draw_seed(None)
        assert torch.equal(after, torch.rand(3))  # exactly one draw per epoch
    assert runs[0] == runs[1] and runs[0][0] != runs[0][1]


def test_global_numpy_seed_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without torch imported, np.random.seed before iterating repeats a run."""
    import stoker._torch

    monkeypatch.setattr(stoker._torch, "loaded", lambda: None)
    runs = []
    for _ in range(2):
        s = SubsetRandomSampler(list(range(20)))
        np.random.seed(3)
        runs.append([list(s) for _ in range(2)])
    assert runs[0] == runs[1] and runs[0][0] != runs[0][1]


def test_assigning_generator_resets_base_seed() -> None:
    """Assigning .generator replaces the base seed (an int at once, others at next draw)."""
    s = RandomSampler(range(20), generator=1)
    _ = list(s)
    s.generator = 2
    assert s.state_dict() == {"kind": "RandomSampler", "seed": 2, "epoch": 1}
    s.generator = np.random.default_rng(0)
    assert s.state_dict()["seed"] is None
    with pytest.raises(TypeError, match="generator"):
        s.generator = "x"


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


def test_weighted_checks_shape_when_built() -> None:
    """Weights that are not 1-D raise ValueError at construction, as torch's do."""
    with pytest.raises(ValueError, match="weights should be a 1d sequence"):
        WeightedRandomSampler([[1.0, 2.0]], 2)


@pytest.mark.parametrize(
    ("weights", "kwargs", "match"),
    [
        ([1.0, float("nan")], {}, "finite"),
        ([1.0, float("inf")], {}, "finite"),
        ([1.0, -0.5], {}, ">= 0"),
        ([0.0, 0.0], {}, "sum of probabilities <= 0"),
        ([], {}, "sum of probabilities <= 0"),
        ([1.0, 0.0, 2.0], {"num_samples": 3, "replacement": False}, "non-zero"),
        ([1.0, 2.0], {"num_samples": 3, "replacement": False}, "n_sample > prob_dist"),
    ],
)
def test_weighted_validates_weights_when_drawn(
    weights: object, kwargs: dict[str, object], match: str
) -> None:
    """Bad weights raise WeightsError (a RuntimeError, as torch's multinomial raises, and a
    ValueError) naming the rule broken, when an epoch is drawn, not when built."""
    from stoker.errors import WeightsError

    kw = {"num_samples": 2, "generator": 0, **kwargs}
    s = WeightedRandomSampler(weights, **kw)  # type: ignore[arg-type]
    for kind in (WeightsError, RuntimeError, ValueError):
        with pytest.raises(kind, match=match):
            next(iter(s))


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
    s.weights = [-1.0, 1.0]  # checked when drawn, as torch's multinomial checks it
    with pytest.raises(ValueError, match="probability entry < 0"):
        next(iter(s))
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


# ---------------------------------------------------------------- state_dict


def _makers() -> dict[str, Any]:
    """Builders of every stateful sampler from a generator (a different one must not matter)."""
    return {
        "random": lambda g: RandomSampler(range(12), generator=g),
        "random_repl": lambda g: RandomSampler(range(9), True, 20, generator=g),
        "random_more": lambda g: RandomSampler(range(5), num_samples=13, generator=g),
        "subset": lambda g: SubsetRandomSampler([3, 1, 4, 15, 9, 2, 6], generator=g),
        "weighted": lambda g: WeightedRandomSampler([1.0, 2.0, 0.0, 4.0], 10, generator=g),
        "weighted_norepl": lambda g: WeightedRandomSampler([1, 2, 3, 4, 5], 4, False, g),
        "batch": lambda g: BatchSampler(RandomSampler(range(11), generator=g), 3, False),
        "sequential": lambda g: SequentialSampler(range(5)),
        "batch_sequential": lambda g: BatchSampler(SequentialSampler(range(5)), 2, True),
    }


def _generators() -> list[Any]:
    """One generator of each kind (torch's only if installed)."""
    gens: list[Any] = [7, np.random.default_rng(7), None]
    try:
        import torch
    except ImportError:
        return gens
    return [*gens, torch.Generator().manual_seed(7)]


@pytest.mark.parametrize("name", list(_makers()))
def test_state_dict_fixes_the_next_epochs(name: str) -> None:
    """A state taken at any point, loaded into a sampler with another generator, repeats
    the next two epochs; the state survives a JSON round trip."""
    make = _makers()[name]
    torch = sys.modules.get("torch")
    for gen in _generators():
        s = make(gen)
        for done in range(3):
            sd = s.state_dict()
            assert json.loads(json.dumps(sd)) == sd
            # generator=None on torch's global RNG: each epoch draws from it, as in torch,
            # so the resumed run follows it when its state is restored too.
            global_rng = torch.get_rng_state() if torch is not None else None
            later = [list(s), list(s)]
            on_global = gen is None and torch is not None
            fresh = make(None if on_global else 12345)
            fresh.load_state_dict(json.loads(json.dumps(sd)))
            on_torch = torch is not None and isinstance(gen, torch.Generator)
            stoker_seed = gen is not None and not isinstance(gen, int) and not on_torch
            if done == 0 and stoker_seed and "sequential" not in name:
                continue  # seed not drawn yet: the loader keeps its own (next test)
            if on_global:
                torch.set_rng_state(global_rng)
            assert [list(fresh), list(fresh)] == later, (name, gen, done)
            # The state now equals the original's: loading is complete.
            assert fresh.state_dict() == s.state_dict()


def test_state_before_first_draw_keeps_own_generator() -> None:
    """A state saved before the seed was drawn has seed None: the loader draws its own."""
    s = RandomSampler(range(40), generator=np.random.default_rng(1))
    sd = s.state_dict()
    assert sd == {"kind": "RandomSampler", "seed": None, "epoch": 0}
    t = RandomSampler(range(40), generator=3)
    t.load_state_dict(sd)
    u = RandomSampler(range(40), generator=np.random.default_rng(1))
    u.load_state_dict(sd)
    assert list(u) == list(s)
    assert list(t) == list(RandomSampler(range(40), generator=3))
    assert t.state_dict()["seed"] == 3


def test_state_epoch_edit_skips_ahead_and_rewinds() -> None:
    """Setting "epoch" in a state makes the next __iter__ give that epoch."""
    s = WeightedRandomSampler([1.0, 3.0, 2.0], 8, generator=4)
    epochs = [list(s) for _ in range(6)]
    sd = s.state_dict()
    sd["epoch"] = 4
    s.load_state_dict(sd)
    assert list(s) == epochs[4]
    sd["epoch"] = 1
    s.load_state_dict(sd)
    assert [list(s), list(s)] == epochs[1:3]


def test_epoch_advances_at_the_first_next() -> None:
    """The first next() (not iter(), as torch's generators) draws the epoch, also through a
    BatchSampler; the loader's fast path draws when asked."""
    s = SubsetRandomSampler([1, 2, 3], generator=0)
    it = iter(s)
    assert s.state_dict()["epoch"] == 0
    first = next(it)
    assert s.state_dict()["epoch"] == 1
    b = BatchSampler(s, 2, drop_last=False)
    bit = iter(b)
    assert b.state_dict()["sampler"]["epoch"] == 1
    batches = [next(bit)]
    assert b.state_dict()["sampler"]["epoch"] == 2
    arrays = b._iter_arrays()
    assert s.state_dict()["epoch"] == 2
    _ = next(arrays)
    assert s.state_dict()["epoch"] == 3
    batches.extend(bit)
    assert sorted([first, *it]) == [1, 2, 3] and sum(len(x) for x in batches) == 3


def test_epoch_indices_advances_like_iter() -> None:
    """_epoch_indices() stands for one __iter__ and advances the epoch counter."""
    s = RandomSampler(range(10), generator=2)
    first = s._epoch_indices()
    assert s.state_dict()["epoch"] == 1
    assert first.tolist() == list(RandomSampler(range(10), generator=2))


def test_batch_sampler_state_without_stateful_sampler() -> None:
    """A BatchSampler over a list saves sampler None; mismatched states are refused."""
    plain = BatchSampler([3, 1, 2], 2, drop_last=False)
    assert plain.state_dict() == {"kind": "BatchSampler", "sampler": None}
    plain.load_state_dict({"kind": "BatchSampler", "sampler": None})
    seeded = BatchSampler(RandomSampler(range(4), generator=0), 2, drop_last=False)
    with pytest.raises(ValueError, match="no load_state_dict"):
        plain.load_state_dict(seeded.state_dict())
    with pytest.raises(ValueError, match="wraps a RandomSampler"):
        seeded.load_state_dict(plain.state_dict())
    with pytest.raises(TypeError, match="dict or None"):
        seeded.load_state_dict({"kind": "BatchSampler", "sampler": 3})
    with pytest.raises(ValueError, match="kind 'RandomSampler'"):
        seeded.load_state_dict({"kind": "BatchSampler", "sampler": {"kind": "X"}})


_GOOD = {"kind": "RandomSampler", "seed": 1, "epoch": 2}


@pytest.mark.parametrize(
    ("state", "exc", "match"),
    [
        ([1, 2], TypeError, "expects the dict"),
        ({**_GOOD, "kind": "SubsetRandomSampler"}, ValueError, "got kind 'SubsetRandomSampler'"),
        ({"seed": 1, "epoch": 2}, ValueError, "got kind '<missing>'"),
        ({"kind": "RandomSampler", "seed": 1}, ValueError, r"lacks \['epoch'\]"),
        ({**_GOOD, "cursor": 0}, ValueError, r"unexpected keys \['cursor'\]"),
        ({**_GOOD, "seed": "1"}, TypeError, r"'seed'\] must be an int .* or None, got '1' \(str\)"),
        ({**_GOOD, "epoch": 2.0}, TypeError, r"'epoch'\] must be an int"),
        ({**_GOOD, "epoch": True}, TypeError, r"'epoch'\] must be an int"),
        ({**_GOOD, "epoch": -1}, ValueError, r"in \[0, 18446744073709551616\), got -1"),
        ({**_GOOD, "seed": 2**64}, ValueError, "'seed'"),
    ],
)
def test_load_state_dict_validates(state: Any, exc: type, match: str) -> None:
    """Bad states raise TypeError/ValueError saying what was expected and what was found;
    the sampler is left unchanged."""
    s = RandomSampler(range(5), generator=0)
    with pytest.raises(exc, match=match) as info:
        s.load_state_dict(state)
    assert "state_dict" in str(info.value)
    assert s.state_dict() == {"kind": "RandomSampler", "seed": 0, "epoch": 0}


def test_sequential_state_is_kind_only() -> None:
    """SequentialSampler's state is its kind; other kinds are refused."""
    s = SequentialSampler(range(3))
    assert s.state_dict() == {"kind": "SequentialSampler"}
    s.load_state_dict({"kind": "SequentialSampler"})
    with pytest.raises(ValueError, match="kind"):
        s.load_state_dict(RandomSampler(range(3), generator=0).state_dict())
