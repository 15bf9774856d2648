"""In-process loading (``num_workers=0``) reuses large batch memory only once a batch is gone:
a batch, or any view of it, the user still holds keeps its values; dropped ones return."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import torch

import stoker

FLOATS = 1 << 16  # 256 KiB a sample: a batch of 8 is a pooled leaf (>= 1 MiB)
N, BATCH = 48, 8


class Distinct:
    """Sample ``i`` is ``FLOATS`` copies of ``i`` (as a tensor when ``torch`` is set)."""

    def __init__(self, as_torch: bool = False) -> None:
        self.as_torch = as_torch

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> Any:
        sample = np.full(FLOATS, i, np.float32)
        return torch.from_numpy(sample) if self.as_torch else sample


def _expected(k: int) -> np.ndarray[Any, Any]:
    rows = np.arange(k * BATCH, (k + 1) * BATCH, dtype=np.float32)
    return np.repeat(rows[:, None], FLOATS, axis=1)


def _address(batch: Any) -> int:
    array = batch.numpy() if isinstance(batch, torch.Tensor) else batch
    return int(array.__array_interface__["data"][0])


@pytest.mark.parametrize("as_torch", [False, True], ids=["numpy", "torch"])
def test_batches_held_keep_their_values(as_torch: bool) -> None:
    loader = stoker.DataLoader(Distinct(as_torch), batch_size=BATCH)
    for _ in range(2):  # the second epoch starts with the first one's free buffers
        held = list(loader)
        assert len(held) == N // BATCH
        for k, batch in enumerate(held):
            assert isinstance(batch, torch.Tensor) == as_torch
            np.testing.assert_array_equal(np.asarray(batch), _expected(k))
        assert len({_address(b) for b in held}) == len(held)


def test_a_view_held_keeps_its_buffer() -> None:
    loader = stoker.DataLoader(Distinct(), batch_size=BATCH)
    kept = []
    for k, batch in enumerate(loader):
        np.testing.assert_array_equal(batch, _expected(k))
        if k == 1:
            kept.append(batch[3, :5])  # a small view: the whole buffer stays the user's
    np.testing.assert_array_equal(kept[0], np.full(5, BATCH + 3, np.float32))


def test_dropped_batches_are_written_into_reused_memory() -> None:
    loader = stoker.DataLoader(Distinct(), batch_size=BATCH)
    addresses = set()
    for _ in range(3):
        for k, batch in enumerate(loader):
            np.testing.assert_array_equal(batch, _expected(k))
            addresses.add(_address(batch))
    # One batch held by the loop while the next is made: a handful of buffers, not one
    # per batch (18 here).
    assert len(addresses) <= 3, addresses


def test_same_batches_as_a_worker_and_across_epochs() -> None:
    rng_loader = stoker.DataLoader(_Noisy(), batch_size=BATCH, shuffle=True, generator=7)
    first = [b.copy() for b in rng_loader]
    assert len({float(b[0, 0] % 1) for b in first}) > 1  # the draws differ per batch
    worker = stoker.DataLoader(_Noisy(), batch_size=BATCH, shuffle=True, generator=7, num_workers=1)
    for a, b in zip(first, worker, strict=True):
        np.testing.assert_array_equal(a, b)


class _Noisy(Distinct):
    """Each sample draws from NumPy's global RNG, so the per-batch seeding shows."""

    def __getitem__(self, i: int) -> Any:
        return np.full(FLOATS, i, np.float32) + np.float32(np.random.random())


# A call is 50x under the 0.25 s bound (busy machines stretch sleeps), a sample of the slow
# kind 1/12.5 of it: the 16-sample part is past it however long a sleep takes.
@pytest.mark.parametrize(("call_s", "sample_s", "fast"), [(0.005, 0.0, True), (0.0, 0.02, False)])
def test_the_first_batch_is_timed_whole_and_a_slow_one_cut_short(
    call_s: float, sample_s: float, fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's cost per call is not multiplied by its samples (a 256-sample batch at
    5 ms a call is fast), and a slow batch is given up after a few of its samples."""
    ds = stoker.TensorDataset(np.arange(1024, dtype=np.float32))
    it = iter(stoker.DataLoader(ds, batch_size=256))
    loaded, fetch = [], it._fetch

    def costly(indices: Any, alloc: Any) -> Any:
        time.sleep(call_s + sample_s * len(indices))  # the load, which waits
        loaded.append(len(indices))
        return fetch(indices, alloc)

    monkeypatch.setattr(it, "_fetch", costly)
    seconds = it.first_load_s(0.25)
    assert (seconds is not None) == fast, seconds
    assert sum(loaded) <= (3 * 256 + 255 if fast else 31), loaded  # 31: 1 + 2 + ... + 16
    monkeypatch.undo()  # the batch itself at no cost
    assert len(next(it)[0]) == 256  # the batch is still the epoch's first
