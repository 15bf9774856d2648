"""Tests of ``DataLoader(skip_errors=...)``: skipping samples whose loading raises."""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
import pytest

from stoker import DataLoader

BAD = frozenset({3, 9, 10, 16, 17, 18, 19, 30})  # 16..19: a whole batch of 4 in order


class Flaky:
    """40 samples ``[i, noise]``; the indices in ``bad`` raise ValueError."""

    def __init__(self, n: int = 40, bad: frozenset[int] = BAD) -> None:
        self.n = n
        self.bad = bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if i in self.bad:
            raise ValueError(f"sample {i} is corrupt")
        return np.array([float(i), np.random.random()])


class FlakyItems(Flaky):
    """The same samples, loaded in bulk by ``__getitems__``."""

    def __getitems__(self, indices: list[int]) -> list[np.ndarray]:
        return [self[i] for i in indices]


def _run(loader: DataLoader[Any]) -> list[np.ndarray]:
    return [np.asarray(b) for b in loader]


def _indices(batches: list[np.ndarray]) -> list[int]:
    return [int(v) for b in batches for v in b[:, 0]]


def test_default_raises() -> None:
    """Without skip_errors a failing sample raises its own error, as in torch."""
    with pytest.raises(ValueError, match="sample 3 is corrupt"):
        _run(DataLoader(Flaky(), batch_size=4))


@pytest.mark.parametrize(("workers", "mode"), [(2, "process"), (2, "thread")])
def test_skip_is_identical_across_workers(workers: int, mode: str) -> None:
    """Workers deliver the same batches (noise included) and skip the same samples."""
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": True, "generator": 7, "skip_errors": 8}
    ref_loader: DataLoader[Any] = DataLoader(Flaky(), **kw)
    ref = _run(ref_loader)
    loader: DataLoader[Any] = DataLoader(Flaky(), num_workers=workers, worker_mode=mode, **kw)
    got = _run(loader)
    assert sorted(_indices(ref)) == sorted(set(range(40)) - BAD)
    assert len(got) == len(ref)
    assert all(np.array_equal(a, b) for a, b in zip(got, ref, strict=True))
    assert loader.statistics().skipped_samples == ref_loader.statistics().skipped_samples == 8


def test_whole_failing_batch_is_dropped() -> None:
    """A batch whose samples all fail is dropped; the others keep their good samples."""
    batches = _run(DataLoader(Flaky(), batch_size=4, skip_errors=8))
    assert len(batches) == 9
    assert _indices(batches) == [i for i in range(40) if i not in BAD]
    assert [len(b) for b in batches][:4] == [3, 4, 2, 4]


def test_getitems_dataset_is_retried_per_sample() -> None:
    """A dataset with __getitems__ is retried one index at a time."""
    batches = _run(DataLoader(FlakyItems(), batch_size=4, skip_errors=8, num_workers=2))
    assert _indices(batches) == [i for i in range(40) if i not in BAD]


def test_unbatched_failing_sample_is_dropped() -> None:
    """With batch_size=None a failing sample is left out of the stream."""
    loader: DataLoader[Any] = DataLoader(Flaky(), batch_size=None, skip_errors=8)
    assert [int(s[0]) for s in loader] == [i for i in range(40) if i not in BAD]
    assert loader.statistics().skipped_samples == 8


@pytest.mark.parametrize("workers", [0, 2])
def test_cap_exceeded_raises(workers: int) -> None:
    """One failing sample more than the cap raises RuntimeError naming count, cap and fix."""
    loader: DataLoader[Any] = DataLoader(Flaky(), batch_size=4, skip_errors=3, num_workers=workers)
    with pytest.raises(
        RuntimeError, match=r"7 samples of epoch 0 .* more than the 3 .*\[3, 9, 10, 16"
    ):
        _run(loader)
    with pytest.raises(RuntimeError, match=r"ValueError: sample 3 is corrupt.*raise skip_errors"):
        _run(DataLoader(Flaky(), batch_size=4, skip_errors=3, num_workers=workers))


def test_fraction_cap() -> None:
    """A float caps the skipped fraction of the epoch's samples (rounded down)."""
    assert len(_run(DataLoader(Flaky(), batch_size=4, skip_errors=0.2))) == 9  # cap 8
    with pytest.raises(RuntimeError, match="more than the 6 "):
        _run(DataLoader(Flaky(), batch_size=4, skip_errors=0.15))


def test_skips_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    """Each batch with skipped samples logs a WARNING naming the indices and the error."""
    with caplog.at_level(logging.WARNING, logger="stoker._state"):
        _run(DataLoader(Flaky(), batch_size=4, skip_errors=8))
    texts = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(texts) == 4
    assert "[9, 10]" in texts[1] and "sample 9 is corrupt" in texts[1]
    assert "whole batch is dropped" in texts[2]


def test_count_resets_each_epoch() -> None:
    """The cap is per epoch: a second epoch skips the same samples again."""
    loader: DataLoader[Any] = DataLoader(Flaky(), batch_size=4, skip_errors=8)
    assert _run(loader)[0].shape == _run(loader)[0].shape
    assert loader.statistics().skipped_samples == 8
    assert loader.state_dict()["skipped"] == 0


def test_state_dict_round_trip_keeps_count() -> None:
    """state_dict counts this epoch's skipped samples; a JSON round trip and load keep it."""
    loader: DataLoader[Any] = DataLoader(Flaky(), batch_size=4, skip_errors=8)
    it = iter(loader)
    for _ in range(3):  # batches 0..2 skip 3, 9 and 10
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["skipped"] == 3 and state["delivered"] == 3
    other: DataLoader[Any] = DataLoader(Flaky(), batch_size=4, skip_errors=8)
    other.load_state_dict(state)
    assert other.state_dict() == state


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_is_exact(workers: int) -> None:
    """Resuming after skips gives the rest of the epoch bit for bit; the cap spans it."""
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": True, "generator": 3, "skip_errors": 8}
    full = _run(DataLoader(Flaky(), **kw))
    loader: DataLoader[Any] = DataLoader(Flaky(), **kw)
    it = iter(loader)
    head = [np.asarray(next(it)) for _ in range(4)]
    state = loader.state_dict()
    resumed: DataLoader[Any] = DataLoader(Flaky(), num_workers=workers, **kw)
    resumed.load_state_dict(state)
    tail = _run(resumed)
    assert all(np.array_equal(a, b) for a, b in zip(head + tail, full, strict=True))
    before = state["skipped"]
    assert before + resumed.statistics().skipped_samples == 8
    state["skipped"] = before + 1  # with the skips still to come: one more than the cap
    again: DataLoader[Any] = DataLoader(Flaky(), num_workers=workers, **kw)
    again.load_state_dict(state)
    with pytest.raises(RuntimeError, match="more than the 8 "):
        _run(again)


@pytest.mark.parametrize(
    ("value", "error", "text"),
    [
        (-1, ValueError, ">= 0"),
        (1.5, ValueError, r"\(0, 1\)"),
        (0.0, ValueError, r"\(0, 1\)"),
        ("all", TypeError, "int >= 0"),
        (True, TypeError, "int >= 0"),
    ],
)
def test_invalid_skip_errors(value: Any, error: type[Exception], text: str) -> None:
    """skip_errors must be an int >= 0 or a float in (0, 1)."""
    with pytest.raises(error, match=text):
        DataLoader(Flaky(), skip_errors=value)


def test_iterable_dataset_rejects_skip_errors() -> None:
    """skip_errors applies to map-style datasets only."""
    from stoker import IterableDataset

    class Stream(IterableDataset[int]):
        def __iter__(self) -> Any:
            return iter(range(3))

    with pytest.raises(ValueError, match="map-style datasets only"):
        DataLoader(Stream(), skip_errors=2)
    assert list(DataLoader(Stream(), batch_size=None)) == [0, 1, 2]


def test_state_rejects_bad_skipped() -> None:
    """load_state_dict validates the skipped count."""
    loader: DataLoader[Any] = DataLoader(Flaky(), batch_size=4, skip_errors=8)
    state = loader.state_dict()
    state["skipped"] = -1
    with pytest.raises(ValueError, match="skipped"):
        loader.load_state_dict(state)
    state["skipped"] = "2"
    with pytest.raises(TypeError, match="skipped"):
        loader.load_state_dict(state)
