"""Unit tests of stoker._policy: each rule on its own, no process started, no file touched."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from stoker import _placement, _policy
from stoker._collate import DefaultCollate
from stoker._dataset import Dataset, Subset, TensorDataset


class _Users(Dataset[Any]):
    """A dataset of the user's own: its __getitem__ may draw, or look at the worker."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Any:
        return i


class _Agnostic(_Users):
    _stoker_worker_agnostic = True


def _collate() -> DefaultCollate:
    return DefaultCollate(None, batched=True)


def test_stoker_assigns_freely_only_where_no_user_code_runs_in_workers() -> None:
    arrays = TensorDataset(np.arange(8))
    assert _policy.assigns_freely(arrays, _collate(), iterable=False, init_fn=None)
    assert _policy.assigns_freely(Subset(arrays, [1, 2]), _collate(), False, None)
    assert _policy.assigns_freely(_Agnostic(), _collate(), False, None)  # it says so
    assert not _policy.assigns_freely(_Users(), _collate(), False, None)
    assert not _policy.assigns_freely(arrays, lambda b: b, False, None)  # the user's collate
    assert not _policy.assigns_freely(arrays, _collate(), False, lambda wid: None)
    assert not _policy.assigns_freely(arrays, _collate(), True, None)  # iterable


def test_a_truthy_non_bool_marker_does_not_count_as_worker_agnostic() -> None:
    class Marked(_Users):
        _stoker_worker_agnostic = "yes"

    assert _policy.assigns_freely(Marked(), _collate(), False, None) is False


@pytest.mark.parametrize(
    ("num_workers", "iterable", "init_fn", "timeout", "draws", "expected"),
    [
        ("auto", False, None, 0, True, True),  # auto measures whatever runs
        (4, False, None, 0, False, True),  # a fixed count where only stoker's code runs
        (4, False, None, 0, True, False),  # the user's code runs: their count stands
        ("auto", True, None, 0, False, False),  # an iterable dataset shards by count
        ("auto", False, print, 0, False, False),  # worker_init_fn would not run
        ("auto", False, None, 5.0, False, False),  # in process cannot time itself out
    ],
)
def test_when_loading_in_process_may_stand_in_for_workers(
    num_workers: int | str,
    iterable: bool,
    init_fn: Any,
    timeout: float,
    draws: bool,
    expected: bool,
) -> None:
    allowed = _placement.may_load_in_process(num_workers, iterable, init_fn, timeout, draws)
    assert allowed is expected


def test_lazy_start_needs_free_assignment_fork_and_a_fast_first_batch() -> None:
    fast, slow = 0.0, _policy.EAGER_AFTER_S * 2
    assert _policy.starts_lazily(True, True, fast)
    assert not _policy.starts_lazily(True, True, slow)  # last epoch waited: start all now
    assert not _policy.starts_lazily(False, True, fast)  # torch's assignment starts all
    assert not _policy.starts_lazily(True, False, fast)  # spawn: all start at once
    assert _policy.EAGER_AFTER_S < _policy.LAZY_START_S


def test_group_size_groups_only_small_fast_batches_and_fills_one_slot() -> None:
    fast = _policy.FAST_BATCH_S / 10
    assert _policy.group_size(1000, fast) == _policy.MAX_GROUP  # capped
    assert _policy.group_size(_policy.SMALL_BATCH_BYTES // 4, fast) == 4  # fills a slot
    assert _policy.group_size(_policy.SMALL_BATCH_BYTES, fast) == 1  # too large
    assert _policy.group_size(1000, _policy.FAST_BATCH_S) == 1  # too slow
    assert _policy.group_size(0, fast) == _policy.MAX_GROUP  # empty batches: no division


def test_typical_load_is_the_median_so_start_up_outliers_do_not_count() -> None:
    loads = [0.5, 0.4] + [1e-5] * 6  # two workers' first batches paid for their start
    assert _policy.typical_load_s(loads) == 1e-5
    assert _policy.group_size(32, _policy.typical_load_s(loads)) > 1
    assert _policy.group_size(32, sum(loads) / len(loads)) == 1  # what a mean would say
    assert _policy.typical_load_s([]) == 0.0


def test_tail_split_needs_a_slow_batch_that_is_not_mostly_copying() -> None:
    slow = _policy.TAIL_SPLIT_MIN_S * 10
    assert _policy.worth_splitting(slow, 1 << 20)
    assert not _policy.worth_splitting(_policy.TAIL_SPLIT_MIN_S / 2, 0)  # too fast
    copy_s = (1 << 30) / _policy.JOIN_BYTES_PER_S
    assert not _policy.worth_splitting(copy_s * (_policy.SPLIT_GAIN - 1), 1 << 30)
    assert _policy.worth_splitting(max(slow, copy_s * (_policy.SPLIT_GAIN + 1)), 1 << 30)


def test_the_two_split_thresholds_are_distinct_rules() -> None:
    """Threads share a batch's samples from a far shorter sample time than processes split
    a tail batch (a sample handed over costs a lock, a part costs a message and a join)."""
    assert _policy.THREAD_SPLIT_MIN_S < _policy.TAIL_SPLIT_MIN_S


def test_prefetch_sizing() -> None:
    assert _policy.prefetch_of(None) == _policy.prefetch_of("auto") == _policy.DEFAULT_PREFETCH
    assert _policy.prefetch_of(3) == 3
    assert _policy.prefetch_of(np.int64(5)) == 5
    for prefetch in (1, 2, 8):
        kept = _policy.slots_kept_free(prefetch)
        assert kept > _policy.steady_slots(prefetch) > prefetch  # room for frees in transit
    assert _policy.thread_buffers(4, 2) == 4 * 2 + 2  # every batch in flight, and two more
