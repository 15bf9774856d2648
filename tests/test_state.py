"""Determinism and exact resume: same seed, same batches; a checkpoint resumes at the next batch."""

from __future__ import annotations

import hashlib
import json
import random
import sys
from typing import Any

import numpy as np
import pytest

import stoker
from stoker import DataLoader, Dataset, IterableDataset

MODES = [(0, "process"), (1, "process"), (2, "process"), (3, "process"),
         (1, "thread"), (2, "thread"), (3, "thread")]  # fmt: skip
MODE_IDS = [f"{n}{m[0]}" for n, m in MODES]


class Noisy(Dataset[Any]):
    """A map-style dataset whose samples draw from random, np.random and (if loaded) torch."""

    def __init__(self, n: int = 40, use_torch: bool = False) -> None:
        self.n = n
        self.use_torch = use_torch

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        x = np.float64(i) + random.random() + np.random.rand()
        if self.use_torch:
            import torch

            x += float(torch.rand(()))
        return np.float64(x)


class Stream(IterableDataset):
    """An iterable dataset that draws from np.random while it streams."""

    def __init__(self, n: int = 30) -> None:
        self.n = n

    def __iter__(self) -> Any:
        for i in range(self.n):
            yield np.float64(i) + np.random.rand()


def digest(batches: list[Any]) -> list[str]:
    """One hash per batch, of its bytes."""
    return [hashlib.sha256(np.ascontiguousarray(np.asarray(b)).tobytes()).hexdigest()
            for b in batches]  # fmt: skip


def run(loader: DataLoader[Any], epochs: int = 2) -> list[str]:
    return [h for _ in range(epochs) for h in digest(list(loader))]


@pytest.mark.multiprocess
@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@pytest.mark.parametrize(("workers", "mode"), MODES, ids=MODE_IDS)
def test_same_seed_same_batches_for_any_worker_count(workers: int, mode: str) -> None:
    """Batches (augmentations included) are byte-identical for every num_workers and mode."""
    torch = pytest.importorskip("torch")
    del torch
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": True, "generator": 7}
    reference = run(DataLoader(Noisy(use_torch=True), **kw))
    assert run(DataLoader(Noisy(use_torch=True), num_workers=workers, worker_mode=mode,
                          **kw)) == reference  # fmt: skip


@pytest.mark.parametrize("cut", [0, 1, 5, 9, 10])
def test_resume_mid_epoch_in_process(cut: int) -> None:
    """A checkpoint after `cut` batches resumes at the next one, bit-identical to no break."""
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": True, "generator": 3}
    full = run(DataLoader(Noisy(), **kw), epochs=2)
    loader = DataLoader(Noisy(), **kw)
    it = iter(loader)
    head = digest([next(it) for _ in range(cut)])
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    fresh = DataLoader(Noisy(), batch_size=4, shuffle=True, generator=99)  # another seed
    fresh.load_state_dict(state)
    assert head + run(fresh, epochs=2)[: len(full) - cut] == full


@pytest.mark.multiprocess
@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@pytest.mark.parametrize(("workers", "mode"), MODES, ids=MODE_IDS)
def test_resume_with_another_worker_count(workers: int, mode: str) -> None:
    """A state saved with num_workers=2 resumes exactly with any other count and mode."""
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": True, "generator": 5}
    full = run(DataLoader(Noisy(), **kw), epochs=1)
    saver = DataLoader(Noisy(), num_workers=2, **kw)
    it = iter(saver)
    head = digest([next(it) for _ in range(3)])
    state = saver.state_dict()
    del it
    loader = DataLoader(Noisy(), num_workers=workers, worker_mode=mode, **kw)
    loader.load_state_dict(state)
    assert head + digest(list(loader)) == full


def test_resume_without_automatic_batching() -> None:
    """batch_size=None resumes at the next sample, in the same shuffled order."""
    kw: dict[str, Any] = {"batch_size": None, "shuffle": True, "generator": 8}
    full = run(DataLoader(Noisy(12), **kw), epochs=2)
    loader = DataLoader(Noisy(12), **kw)
    it = iter(loader)
    head = digest([next(it) for _ in range(5)])
    fresh = DataLoader(Noisy(12), **kw)
    fresh.load_state_dict(loader.state_dict())
    assert head + run(fresh, epochs=2)[: len(full) - 5] == full


def test_state_at_epoch_end_starts_next_epoch() -> None:
    """A state taken after an epoch ended resumes with the next epoch."""
    kw: dict[str, Any] = {"batch_size": 8, "shuffle": True, "generator": 1}
    full = run(DataLoader(Noisy(), **kw), epochs=2)
    loader = DataLoader(Noisy(), **kw)
    first = digest(list(loader))
    fresh = DataLoader(Noisy(), **kw)
    fresh.load_state_dict(loader.state_dict())
    assert first + digest(list(fresh)) == full


def test_iterable_dataset_resumes_by_replay() -> None:
    """An iterable dataset without its own state resumes by fetching and dropping."""
    np.random.seed(0)
    full = digest(list(DataLoader(Stream(), batch_size=4, generator=2)))
    loader = DataLoader(Stream(), batch_size=4, generator=2)
    it = iter(loader)
    head = digest([next(it) for _ in range(3)])
    fresh = DataLoader(Stream(), batch_size=4, generator=2)
    fresh.load_state_dict(loader.state_dict())
    assert head + digest(list(fresh)) == full


def test_skip_ahead_by_editing_delivered() -> None:
    """Editing 'delivered' skips batches (e.g. after a loss spike), others unchanged."""
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": True, "generator": 4}
    full = digest(list(DataLoader(Noisy(), **kw)))
    loader = DataLoader(Noisy(), **kw)
    state = loader.state_dict()
    state["delivered"] = 6
    loader.load_state_dict(state)
    assert digest(list(loader)) == full[6:]


def test_state_is_small_json() -> None:
    """The state is JSON and small: counters and seeds, not data; on a torch stream it
    holds that generator's state too (5056 bytes, as base64)."""
    loader = DataLoader(Noisy(10_000), batch_size=4, shuffle=True, generator=3)
    it = iter(loader)
    next(it)
    text = json.dumps(loader.state_dict())
    assert len(text) < 400
    torch = pytest.importorskip("torch")
    loader = DataLoader(Noisy(10_000), batch_size=4, shuffle=True, generator=torch.Generator())
    it = iter(loader)
    next(it)
    text = json.dumps(loader.state_dict())
    assert 6744 < len(text) < 7500


@pytest.mark.parametrize(
    ("edit", "exc", "match"),
    [
        ({"version": 9}, ValueError, "version"),
        ({"delivered": -1}, ValueError, "delivered"),
        ({"delivered": "3"}, TypeError, "delivered"),
        ({"delivered": 99}, ValueError, "batches"),
        ({"extra": 1}, ValueError, "unknown"),
        (
            {"sampler": {"kind": "BatchSampler", "sampler": {"kind": "SequentialSampler"}}},
            ValueError,
            "RandomSampler",
        ),
    ],
)
def test_load_validates(edit: dict[str, Any], exc: type[Exception], match: str) -> None:
    """A state that does not fit says what does not match."""
    loader = DataLoader(Noisy(), batch_size=4, shuffle=True, generator=0)
    state = {**loader.state_dict(), **edit}
    with pytest.raises(exc, match=match):
        loader.load_state_dict(state)


def _first_epoch_generators() -> list[Any]:
    """Generators whose base seed (or stream) is drawn at the first epoch, not given."""
    gens: list[Any] = ["global", lambda: np.random.default_rng(4)]
    try:
        import torch
    except ImportError:
        return gens
    return [*gens, lambda: torch.Generator().manual_seed(4)]


@pytest.mark.parametrize("make_gen", _first_epoch_generators(), ids=["none", "numpy", "torch"])
@pytest.mark.parametrize("cut", [0, 2])
def test_first_epoch_checkpoint_resumes_exact_order(make_gen: Any, cut: int) -> None:
    """A checkpoint within the first epoch, with generator None (after seeding the global
    RNG), a NumPy or a torch generator, resumes that epoch's order (issue #22: the state
    saved "seed": None, and the resumed epoch repeated and skipped samples)."""

    def loader() -> DataLoader[Any]:
        if make_gen == "global":
            np.random.seed(8)
            torch = sys.modules.get("torch")
            if torch is not None:
                torch.manual_seed(8)
            gen = None
        else:
            gen = make_gen()
        return DataLoader(list(range(40)), batch_size=4, shuffle=True, generator=gen)

    full = [np.asarray(b).tolist() for b in loader()]
    saver = loader()
    it = iter(saver)
    head = [np.asarray(next(it)).tolist() for _ in range(cut)]
    state = json.loads(json.dumps(saver.state_dict()))
    del it
    fresh = DataLoader(list(range(40)), batch_size=4, shuffle=True, generator=12345)
    fresh.load_state_dict(state)
    assert head + [np.asarray(b).tolist() for b in fresh] == full


class _NoState(Dataset[Any]):
    """A map-style dataset without load_state_dict."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> int:
        return i


@pytest.mark.parametrize(
    ("saved_kw", "loading_kw", "match"),
    [
        ({"batch_size": 10}, {"batch_size": 20}, "batch_size=10.*batch_size=20"),
        ({"n": 100}, {"n": 50}, "dataset length=100.*dataset length=50"),
        ({"drop_last": True}, {"drop_last": False}, "drop_last=True.*drop_last=False"),
        ({"shuffle": True}, {"shuffle": False}, "RandomSampler.*SequentialSampler"),
        ({"shuffle": False}, {"shuffle": True}, "SequentialSampler.*RandomSampler"),
    ],
)
def test_mismatched_checkpoint_is_refused_and_changes_nothing(
    saved_kw: dict[str, Any], loading_kw: dict[str, Any], match: str
) -> None:
    """A state saved by another loader (batch size, dataset length, drop_last, sampler
    kind) is refused with a ValueError naming both values, and the loader is unchanged."""

    def make(n: int = 100, **kw: Any) -> DataLoader[Any]:
        return DataLoader(list(range(n)), **{"batch_size": 10, "generator": 1, **kw})

    saver = make(**saved_kw)
    it = iter(saver)
    next(it)
    state = saver.state_dict()
    del it
    target = make(**loading_kw)
    list(target)  # one epoch done
    before = target.state_dict()
    with pytest.raises(ValueError, match=match):
        target.load_state_dict(state)
    assert target.state_dict() == before


def test_state_rejected_half_way_leaves_loader_unchanged() -> None:
    """A state whose dataset part cannot be loaded (the dataset has no load_state_dict)
    is refused before its sampler part is applied: the next epoch is the one it was."""
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": True, "generator": 2}
    reference = DataLoader(_NoState(), **kw)
    list(reference)
    expected = [np.asarray(b).tolist() for b in reference]  # epoch 1

    loader = DataLoader(_NoState(), **kw)
    list(loader)
    state = loader.state_dict()
    state["sampler"]["sampler"]["epoch"] = 7  # would change the next epoch if applied
    state["dataset"] = {"position": 3}
    with pytest.raises(ValueError, match="no load_state_dict"):
        loader.load_state_dict(state)
    assert [np.asarray(b).tolist() for b in loader] == expected


class _LazySampler(stoker.RandomSampler):
    """A subclass whose __iter__ draws at the first next(), not at iter()."""

    def __iter__(self) -> Any:
        yield from super().__iter__()


def test_checkpoint_of_a_lazily_drawing_sampler_resumes_exactly() -> None:
    """A sampler that draws only when first advanced is checkpointed by its state before
    the draw (the state after it would name the previous epoch)."""

    def loader() -> DataLoader[Any]:
        return DataLoader(
            list(range(30)), batch_size=4, sampler=_LazySampler(range(30), generator=6)
        )

    reference = loader()
    list(reference)
    second = [np.asarray(b).tolist() for b in reference]
    saver = loader()
    list(saver)
    it = iter(saver)
    head = [np.asarray(next(it)).tolist() for _ in range(3)]
    state = saver.state_dict()
    del it
    fresh = loader()
    fresh.load_state_dict(state)
    assert head + [np.asarray(b).tolist() for b in fresh] == second
