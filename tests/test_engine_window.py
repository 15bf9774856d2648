"""The reorder window (``stoker._engine._window``) and split batches' bookkeeping
(``stoker._engine._tail.Splits``): pure bookkeeping, tested without a process or a clock."""

from __future__ import annotations

import numpy as np
import pytest

from stoker._engine._errors import RemoteError
from stoker._engine._tail import Splits
from stoker._engine._window import Failure, ReorderWindow


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _send(window: ReorderWindow, wid: int, *ks: int) -> list[int]:
    """Send batches ``ks`` to ``wid`` one task each; their task indices."""
    return [window.add(wid, [k]) for k in ks]


def _drain(window: ReorderWindow) -> list[object]:
    out = []
    while (item := window.pop()) is not None:
        out.append(item)
    return out


def test_in_order_holds_results_until_their_turn() -> None:
    window = ReorderWindow(2, in_order=True)
    a, b, c = _send(window, 0, 10, 11) + _send(window, 1, 12)
    assert (a, b, c) == (0, 1, 2) and window.in_flight == 3
    window.put(c, "c")
    window.put(b, "b")
    assert window.pop() is None  # task 0 is not in: nothing jumps the queue
    window.put(a, "a")
    assert _drain(window) == ["a", "b", "c"]
    assert window.in_flight == 0


def test_unordered_delivers_as_results_come() -> None:
    window = ReorderWindow(2, in_order=False)
    a, b = _send(window, 0, 0) + _send(window, 1, 1)
    window.put(b, "b")
    assert window.pop() == "b"
    window.put(a, "a")
    assert window.pop() == "a"
    assert window.pop() is None


@pytest.mark.parametrize("in_order", [True, False])
def test_skipped_indices_are_passed_over_and_leave_the_window(in_order: bool) -> None:
    window = ReorderWindow(1, in_order=in_order)
    a, b, c = _send(window, 0, 0, 1, 2)
    window.skip(a)
    window.put(c, "c")
    window.skip(b)
    assert _drain(window) == ["c"]
    assert window.in_flight == 0


def test_answered_returns_the_batch_number_and_frees_the_worker() -> None:
    clock = Clock()
    window = ReorderWindow(2, in_order=True, clock=clock)
    first = window.add(1, [7, 8, 9])  # a group: one index per batch
    assert first == 0 and window.outstanding == [0, 3] and window.running == {0: 1, 1: 1, 2: 1}
    clock.now = 2.5
    assert [window.answered(1, j) for j in range(3)] == [7, 8, 9]
    assert window.outstanding == [0, 0] and window.running == {} and window.since[1] == 2.5


def test_since_marks_when_an_idle_workers_task_begins() -> None:
    clock = Clock()
    window = ReorderWindow(1, in_order=True, clock=clock)
    clock.now = 1.0
    _send(window, 0, 0)
    clock.now = 2.0
    _send(window, 0, 1)  # queued behind task 0: its start is not now
    assert window.since == [1.0]


def test_free_choice_takes_the_least_loaded_worker_under_the_depth() -> None:
    window = ReorderWindow(3, in_order=True)
    _send(window, 0, 0, 1)
    _send(window, 1, 2)
    assert window.choose(depth=2, least_loaded=True) == 2
    assert window.choose(depth=2, least_loaded=True, candidates=[0, 1]) == 1
    _send(window, 1, 3)
    _send(window, 2, 4, 5)
    assert window.choose(depth=2, least_loaded=True) is None  # every window is full


def test_torch_choice_is_round_robin_over_workers_with_data() -> None:
    window = ReorderWindow(3, in_order=True)
    assert [window.choose(depth=2, least_loaded=False) for _ in range(4)] == [0, 1, 2, 0]
    (idx,) = _send(window, 1, 0)
    window.answered(1, idx)
    window.exhausted(1, idx)  # worker 1 ran out of data: it is passed over
    assert [window.choose(depth=2, least_loaded=False) for _ in range(3)] == [2, 0, 2]


def test_unordered_torch_choice_caps_each_workers_undelivered_share() -> None:
    window = ReorderWindow(2, in_order=False)
    (idx,) = _send(window, 0, 0)  # worker 0 holds its share (depth 1 x 2 workers / 2 active)
    assert window.choose(depth=1, least_loaded=False) == 1
    assert window.choose(depth=1, least_loaded=False) == 1  # worker 0 is still passed over
    window.answered(0, idx)
    window.put(idx, "a")
    assert window.choose(depth=1, least_loaded=False) == 1  # answered is not delivered
    assert window.pop() == "a"
    assert window.choose(depth=1, least_loaded=False) == 0  # delivered: below its share again


def test_waiting_for_is_the_owner_of_the_next_turn() -> None:
    window = ReorderWindow(2, in_order=True)
    _send(window, 1, 0)
    _send(window, 0, 1, 2)
    assert window.waiting_for() == 1
    window.answered(1, 0)
    assert window.waiting_for() == 0  # task 0 is answered: the busiest waits next
    unordered = ReorderWindow(2, in_order=False)
    _send(unordered, 1, 0, 1)
    assert unordered.waiting_for() == 1


def test_drained_when_nothing_is_in_flight_and_no_task_or_worker_is_left() -> None:
    window = ReorderWindow(2, in_order=True)
    assert window.drained(tasks_done=True) and not window.drained(tasks_done=False)
    (idx,) = _send(window, 0, 0)
    assert not window.drained(tasks_done=True)
    window.answered(0, idx)
    window.exhausted(0, idx)
    assert not window.drained(tasks_done=False)  # worker 1 may still have data
    window.active[1] = False
    assert window.drained(tasks_done=False)


def test_a_worker_added_mid_epoch_takes_tasks() -> None:
    window = ReorderWindow(1, in_order=True)
    _send(window, 0, 0)
    window.add_worker()
    assert window.workers == 2 and window.choose(depth=1, least_loaded=True) == 1
    assert _send(window, 1, 1) == [1]


def test_split_parts_join_in_order_at_the_first_parts_place() -> None:
    splits = Splits()
    splits.add(5, first=3, shares=[0.5, 0.25, 0.25])
    assert 5 in splits and splits.is_part(4) and splits.share(4) == 0.25
    assert splits.share(9) == 1.0  # a whole batch
    assert splits.done(5, 4, np.array([2]), np.empty) == (3, None)
    assert splits.done(5, 3, np.array([0, 1]), np.empty) == (3, None)
    first, batch = splits.done(5, 5, np.array([3]), np.empty)
    assert first == 3 and batch.tolist() == [0, 1, 2, 3]
    assert 5 not in splits and not splits.is_part(4)


def test_a_failed_part_fails_the_batch_and_unstackable_parts_say_why() -> None:
    splits = Splits()
    splits.add(0, first=0, shares=[0.5, 0.5])
    failure = Failure(RemoteError(ValueError("bad sample"), "worker 1"))
    splits.done(0, 1, failure, np.empty)
    assert splits.done(0, 0, np.zeros(2), np.empty) == (0, failure)
    splits.add(1, first=2, shares=[0.5, 0.5])
    splits.done(1, 2, np.zeros((1, 2)), np.empty)
    _, joined = splits.done(1, 3, np.zeros((1, 3)), np.empty)
    assert isinstance(joined, Failure)
    with pytest.raises(Exception, match="do not stack into one batch"):
        raise joined.remote.rebuild()


def test_projected_loads_count_queued_shares_less_the_running_tasks_progress() -> None:
    splits = Splits()
    splits.add(0, first=2, shares=[0.5, 0.5])
    running = {0: 0, 1: 0, 2: 1, 3: 1}  # worker 0: two batches; worker 1: two halves
    loads = splits.loads(running, since=[9.0, 9.5], now=10.0, mean=2.0)
    assert loads == [2.0 - 0.5, 1.0 - 0.25]  # each runs its first task since `since`
    assert splits.loads({}, since=[0.0, 0.0], now=1.0, mean=1.0) == [0.0, 0.0]
