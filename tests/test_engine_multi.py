"""The worker engine's behaviour: order, prefetch, persistence, seeding, worker info, data.

Each property runs on thread workers (the in-process transport) and fork workers (the
shared-memory transport); a few run once under spawn.
"""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.util
import os
import random
import sys
import threading
import time
import traceback
import warnings
from collections import namedtuple
from typing import Any

import numpy as np
import pytest

from stoker import DataLoader, Dataset, IterableDataset, TensorDataset, get_worker_info
from stoker._engine import _multi
from stoker._engine._rngguard import RngGuard
from stoker._policy import group_size, typical_load_s
from stoker._random import seed_globals

MODES = [
    pytest.param({"worker_mode": "thread"}, id="thread"),
    pytest.param({"multiprocessing_context": "fork"}, id="fork"),
]
SPAWN = pytest.param({"multiprocessing_context": "spawn"}, id="spawn")
FORKSERVER = pytest.param({"multiprocessing_context": "forkserver"}, id="forkserver")

Pair = namedtuple("Pair", ["x", "label"])


class Nested:
    """Samples with nested structure: dicts, tuples, strings, numbers and arrays."""

    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> Any:
        return {"img": np.full((2, 3), i, np.float32), "meta": (f"n{i}", i * 0.5), "i": i}


class WhoAmI:
    """Each sample records the worker that fetched it and its RNG draws."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> Any:
        info = get_worker_info()
        assert info is not None
        return np.array(
            [i, info.id, info.num_workers, random.randrange(10**6), np.random.randint(10**6)]
        )


class Shards(IterableDataset):
    """An iterable dataset that shards itself with get_worker_info(), as torch users do."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        return iter(range(wid, self.n, nw))


class TorchShards(IterableDataset):
    """Shards itself with torch.utils.data.get_worker_info() (a dataset written for torch)."""

    def __iter__(self) -> Any:
        import torch.utils.data as tud

        info = tud.get_worker_info()
        assert info is not None, "torch.utils.data.get_worker_info() answered None"
        return iter(range(info.id, 12, info.num_workers))


def _labels(batches: list[Any]) -> list[int]:
    return [int(v) for b in batches for v in np.asarray(b[1])]


def _data(n: int = 50) -> TensorDataset:
    return TensorDataset(np.arange(n * 3, dtype=np.float32).reshape(n, 3), np.arange(n))


class _UserRows(TensorDataset):
    """A TensorDataset of the user's own class: workers always load it (a fixed worker
    count may move in process only where none of the user's code runs: test_autotune)."""


def _user_data(n: int = 50) -> TensorDataset:
    return _UserRows(*_data(n).tensors)


@pytest.mark.parametrize("kw", [*MODES, SPAWN, FORKSERVER])
def test_batches_match_in_process_loading(kw: dict[str, Any]) -> None:
    """Workers deliver the same batches, in sampler order, as num_workers=0."""
    ds = _data()
    ref = list(DataLoader(ds, batch_size=7))
    got = list(DataLoader(ds, batch_size=7, num_workers=2, **kw))
    assert len(got) == len(ref)
    for a, b in zip(got, ref, strict=True):
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
        assert a[0].dtype == np.float32 and a[1].dtype == b[1].dtype


@pytest.mark.parametrize("kw", MODES)
def test_nested_batches_cross_intact(kw: dict[str, Any]) -> None:
    """Dicts, tuples, strings and numbers come through; arrays keep dtype and shape."""
    got = list(DataLoader(Nested(), batch_size=4, num_workers=2, **kw))
    ref = list(DataLoader(Nested(), batch_size=4))
    for a, b in zip(got, ref, strict=True):
        assert a.keys() == b.keys()
        assert np.array_equal(a["img"], b["img"]) and a["img"].shape == (4, 2, 3)
        assert list(a["meta"][0]) == list(b["meta"][0])
        assert np.array_equal(a["meta"][1], b["meta"][1])
        assert np.array_equal(a["i"], b["i"])


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("kw", MODES)
def test_in_order_false_delivers_every_batch(kw: dict[str, Any]) -> None:
    """in_order=False delivers each batch exactly once."""
    got = DataLoader(_data(), batch_size=5, num_workers=3, in_order=False, **kw)
    assert sorted(_labels(list(got))) == list(range(50))


@pytest.mark.parametrize("kw", MODES)
def test_persistent_workers_survive_epochs(kw: dict[str, Any]) -> None:
    """persistent_workers keeps the same workers; each epoch is complete; break is fine."""
    loader = DataLoader(_user_data(), batch_size=5, num_workers=2, persistent_workers=True, **kw)
    first = iter(loader)
    pool = first._pool
    next(first)  # abandon this epoch early
    for _ in range(3):
        assert _labels(list(loader)) == list(range(50))
    assert iter(loader)._pool is pool
    del loader, first, pool


@pytest.mark.parametrize("kw", MODES)
def test_worker_info_and_distinct_seeds(kw: dict[str, Any]) -> None:
    """get_worker_info() names each worker; every batch draws different random numbers."""
    rows = np.concatenate(list(DataLoader(WhoAmI(), batch_size=2, num_workers=2, **kw)))
    assert rows[:, 0].tolist() == list(range(16))
    assert set(rows[:, 1].tolist()) <= {0, 1} and set(rows[:, 2].tolist()) == {2}
    if kw.get("worker_mode") != "thread":  # threads share the process's global RNGs
        assert len(set(rows[:, 3].tolist())) == 16
        assert len(set(rows[:, 4].tolist())) == 16


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_seeded_augmentations_do_not_depend_on_workers() -> None:
    """With a seed, random draws per batch are identical for 1, 2 or 3 workers."""
    runs = [
        np.concatenate(list(DataLoader(WhoAmI(), batch_size=2, num_workers=n, generator=7)))[
            :, [0, 3, 4]
        ]
        for n in (1, 2, 3)
    ]
    assert np.array_equal(runs[0], runs[1]) and np.array_equal(runs[0], runs[2])


class _NoisyRows(TensorDataset):
    """A TensorDataset subclass whose samples draw from NumPy's global RNG."""

    def __getitem__(self, index: Any) -> Any:
        return self.tensors[0][index] + np.random.rand()


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_a_subclass_that_draws_is_seeded_per_batch() -> None:
    """Only stoker's own array datasets go unseeded: a subclass's draws still come from its
    batches' seeds, the same in process and with 1 or 3 workers, and new in each batch."""
    ds = _NoisyRows(np.zeros(12))
    runs = [
        np.concatenate(list(DataLoader(ds, batch_size=3, num_workers=n, generator=7)))
        for n in (0, 1, 3)
    ]
    assert np.array_equal(runs[0], runs[1]) and np.array_equal(runs[0], runs[2])
    assert len(set(runs[0].tolist())) == 12


class _AugmentLater(Dataset):
    """Rows that draw from NumPy's global RNG only once ``augment`` is set."""

    augment = False

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> float:
        return i + (float(np.random.rand()) if self.augment else 0.0)


def _two_epochs(**kw: Any) -> list[list[float]]:
    ds = _AugmentLater()
    loader = DataLoader(ds, batch_size=4, shuffle=True, generator=3, **kw)
    first = np.concatenate(list(loader)).tolist()
    ds.augment = True  # switched on between epochs, as a curriculum would
    return [first, np.concatenate(list(loader)).tolist()]


def test_persistent_thread_workers_see_a_dataset_start_drawing() -> None:
    """Persistent thread workers decide again each epoch whether the dataset draws: one
    that starts drawing in its second epoch gets the batches it gets in process."""
    expected = _two_epochs()
    assert expected[0] != expected[1]
    kw = {"num_workers": 3, "worker_mode": "thread", "persistent_workers": True}
    assert _two_epochs(**kw) == expected


class _CountedDraws:
    """64 samples ``[i, draw]``, the draw from ``source``'s global RNG; each
    ``__getitem__`` call is recorded in ``calls`` (a list: appends are safe from threads)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.calls: list[int] = []

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> np.ndarray:
        self.calls.append(i)
        if self.source == "random":
            draw = random.random()
        elif self.source == "numpy":
            draw = float(np.random.random())
        else:
            draw = float(__import__("torch").rand(()).item())
        return np.array([float(i), draw])


@pytest.mark.parametrize("source", ["random", "numpy", "torch"])
def test_thread_workers_load_each_drawing_sample_once(source: str) -> None:
    """A dataset that draws from a global RNG: each epoch of persistent thread workers
    calls ``__getitem__`` once per sample (not the first batches again, seeded), and the
    batches equal those loaded in process."""
    if source == "torch":
        pytest.importorskip("torch")
    kw: dict[str, Any] = {"batch_size": 8, "shuffle": True, "generator": 6}
    ref = DataLoader(_CountedDraws(source), **kw)
    ds = _CountedDraws(source)
    loader = DataLoader(ds, num_workers=2, worker_mode="thread", persistent_workers=True, **kw)
    for _ in range(2):
        ds.calls.clear()
        assert [b.tolist() for b in loader] == [b.tolist() for b in ref]
        assert sorted(ds.calls) == list(range(64))


def test_a_fetch_beside_a_blocked_probe_is_not_held_back() -> None:
    """A thread whose fetch would wait on the epoch's probe, whose first sample waits in
    turn for later batches (torch lets every worker load at once), loads beside it after
    a bounded wait; its batch stands, as nothing drew."""
    guard, entered, release = RngGuard(), threading.Event(), threading.Event()

    def blocked(task: int) -> int:
        entered.set()
        assert release.wait(20), "the other fetch never came back"
        return task

    out: list[int] = []
    probe = threading.Thread(target=lambda: out.append(guard.fetch(blocked, 0, 1, blocked)))
    probe.start()
    assert entered.wait(20)
    assert guard.fetch(lambda task: task, 1, 2, lambda task: task) == 1  # not held back
    release.set()
    probe.join(20)
    assert out == [0] and guard.serial is False


def test_the_probes_hand_back_is_not_taken_for_a_draw_beside_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fetch beside the probe that ends while the probe hands the global RNGs back (a
    write of the probe's, not the dataset's) stands, and the epoch stays parallel. The
    hand-back is held until that fetch came back (a quiet suite run once lost the race:
    the epoch went serial and a barrier dataset's batches waited for each other)."""
    guard = RngGuard()
    entered, beside, restored, checked = (threading.Event() for _ in range(4))
    armed: list[threading.Thread] = []  # the probe's thread, once its fetch is done
    real_seed = random.seed

    def seed(*args: Any, **kwargs: Any) -> None:
        real_seed(*args, **kwargs)
        if armed and threading.current_thread() is armed[0]:  # the hand-back, not the seeding
            armed.clear()
            restored.set()
            checked.wait(20)  # bounded: a beside fetch that took it for a draw waits for us

    monkeypatch.setattr(random, "seed", seed)

    def probe_fetch(task: int) -> int:
        entered.set()
        assert beside.wait(20), "the fetch beside the probe never started"
        armed.append(threading.current_thread())
        return task

    def beside_fetch(task: int) -> int:
        beside.set()
        assert restored.wait(20), "the probe never handed the streams back"
        return task

    out: list[int] = []
    refetched: list[int] = []
    probe = threading.Thread(target=lambda: out.append(guard.fetch(probe_fetch, 0, 1, probe_fetch)))
    probe.start()
    assert entered.wait(20)
    got = guard.fetch(beside_fetch, 1, 2, lambda task: refetched.append(task) or task)
    checked.set()
    probe.join(20)
    assert (got, refetched, out, guard.serial) == (1, [], [0], False)


def test_thread_workers_hand_the_main_threads_rng_streams_back() -> None:
    """After thread workers seeded the process's RNGs for batches, the main thread's streams
    follow its own seeds again: torch's (which these samples do not draw from) is exactly
    where torch.manual_seed left it."""
    torch = pytest.importorskip("torch")

    def after(user_seed: int) -> tuple[list[Any], float, float]:
        random.seed(user_seed)
        torch.manual_seed(user_seed)
        loader = DataLoader(
            WhoAmI(), batch_size=2, num_workers=2, worker_mode="thread", generator=0
        )
        batches = [b[:, [0, 3, 4]].tolist() for b in loader]  # the loop draws nothing
        return batches, random.random(), torch.rand(()).item()

    first, second = after(1), after(2)
    assert first[0] == second[0]  # the batches follow the loader's seed
    assert first[1] != second[1]
    torch.manual_seed(1)
    assert first[2] == torch.rand(()).item()


@pytest.mark.parametrize("bad_fork", [False, True])
def test_workers_seed_cuda_only_where_it_can_start_and_read_no_stack(
    bad_fork: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker forked after its parent started CUDA (torch's "bad fork": CUDA cannot start
    there) seeds only torch's CPU generator, as torch.manual_seed would only record its
    stack (3-5 ms); where CUDA may start, a CUDA build gets torch.manual_seed, with
    ``sys.tracebacklimit`` 0 meanwhile (no stack read) and the caller's limit afterwards.
    This suite's torch is a CPU build: the CUDA build and the fork state are stood in for."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch._C, "_has_cuda", True)
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: bad_fork)
    monkeypatch.setattr(sys, "tracebacklimit", 7, raising=False)
    called: list[tuple[int, int]] = []
    monkeypatch.setattr(
        torch, "manual_seed", lambda seed: called.append((seed, sys.tracebacklimit))
    )
    states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    try:
        seed_globals(5, every_device=True)
        assert called == ([] if bad_fork else [(5, 0)]) and sys.tracebacklimit == 7
        if bad_fork:
            assert torch.initial_seed() == 5  # the CPU generator, seeded directly
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("kw", MODES)
def test_iterable_dataset_sharded_per_worker(kw: dict[str, Any]) -> None:
    """Each worker iterates its own copy; shards via get_worker_info give every item once."""
    got = list(DataLoader(Shards(23), batch_size=4, num_workers=3, **kw))
    assert sorted(int(v) for b in got for v in b) == list(range(23))


def test_iterable_drop_last_applies_per_worker_copy() -> None:
    """drop_last drops each worker's own short last batch, as torch does."""
    got = list(DataLoader(Shards(10), batch_size=4, num_workers=2, drop_last=True))
    assert all(len(b) == 4 for b in got) and len(got) == 2


def test_torch_get_worker_info_answers_in_stoker_workers() -> None:
    """A dataset that shards with torch.utils.data.get_worker_info() is not duplicated."""
    pytest.importorskip("torch")
    got = list(DataLoader(TorchShards(), batch_size=3, num_workers=2))
    assert sorted(int(v) for b in got for v in b) == list(range(12))


@pytest.mark.parametrize("kw", MODES)
def test_torch_tensors_come_back_as_tensors(kw: dict[str, Any]) -> None:
    """Tensor datasets give torch tensors equal to torch's own DataLoader's."""
    torch = pytest.importorskip("torch")
    x, y = torch.arange(60.0).reshape(20, 3), torch.arange(20)
    got = list(DataLoader(TensorDataset(x, y), batch_size=6, num_workers=2, **kw))
    ref = list(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=6))
    for a, b in zip(got, ref, strict=True):
        assert isinstance(a[0], torch.Tensor) and torch.equal(a[0], b[0])
        assert torch.equal(a[1], b[1])


@pytest.mark.parametrize("kw", MODES)
def test_custom_collate_and_worker_init_fn(kw: dict[str, Any]) -> None:
    """A user collate_fn's arrays are copied into shared memory; worker_init_fn runs."""
    loader = DataLoader(
        _data(12),
        batch_size=4,
        num_workers=2,
        collate_fn=_sum_collate,
        worker_init_fn=_mark_init,
        **kw,
    )
    got = list(loader)
    assert [int(b["sum"]) for b in got] == [6, 22, 38]
    assert all(b["init"] for b in got)


_INIT: dict[int, bool] = {}


def _mark_init(wid: int) -> None:
    _INIT[wid] = True


def _sum_collate(samples: list[Any]) -> Any:
    return {"sum": np.array(sum(int(s[1]) for s in samples)), "init": bool(_INIT)}


def test_slots_are_reused_not_grown() -> None:
    """Over many batches a worker keeps a bounded number of slots: one per batch in flight
    (prefetch_factor: the user's dataset is never grouped) plus a few."""
    loader = DataLoader(
        _user_data(400), batch_size=4, num_workers=1, prefetch_factor=2, persistent_workers=True
    )
    for _ in range(2):
        for _batch in loader:
            pass
    arena_segments = loader._iterator._pool.workers[0].slots.maps._maps
    assert 1 <= len(arena_segments) <= 2 + 4  # + held, in transit
    del loader, arena_segments


def test_tiny_batches_are_grouped_despite_slow_first_batches() -> None:
    """Batches that load in microseconds travel in groups, even when each worker's first
    batch is slow: the group is sized from the median load time, not the mean."""
    loads = [0.02, 0.02] + [20e-6] * 6  # two workers' first batches pay their start-up
    assert group_size(32, typical_load_s(loads)) > 1
    assert group_size(32, sum(loads) / len(loads)) == 1  # what a mean would give


class _TinyNoisy:
    """Tiny samples that draw from NumPy's global RNG; sample ``bad`` raises, and with
    ``skip`` so do every seventh sample's neighbours. Worker agnostic: stoker may group
    its batches."""

    _stoker_worker_agnostic = True

    def __init__(self, n: int = 400, bad: int = -1) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if i == self.bad:
            raise KeyError(f"sample {i} is bad")
        return np.float64(i), np.random.random()


def _grouped(kw: dict[str, Any], **more: Any) -> DataLoader[Any]:
    return DataLoader(_TinyNoisy(**more), batch_size=4, shuffle=True, generator=3, **kw)


@pytest.mark.parametrize("kw", [MODES[1], SPAWN, {"in_order": False}])
def test_groups_of_tiny_batches_match_in_process_loading(kw: dict[str, Any]) -> None:
    """Tiny batches travel in groups (one task, one slot, one message each), and every
    batch is still seeded on its own: the same batches as in process, epoch after epoch
    (in any order with ``in_order=False``)."""
    loader = _grouped({"num_workers": 2, "persistent_workers": True, **kw})
    # Groups of 4 from the first batch: whether this VM loads these batches in under
    # FAST_BATCH_S (which sizes the group) is not what is tested here.
    loader._memory.task_group = 4
    alone = _grouped({})
    for _ in range(2):
        got, want = list(loader), list(alone)
        assert loader._memory.task_group == 4
        assert len(got) == len(want) == 100
        if kw.get("in_order") is False:
            got.sort(key=lambda b: b[0].tolist())
            want.sort(key=lambda b: b[0].tolist())
        for (gx, gr), (wx, wr) in zip(got, want, strict=True):
            assert np.array_equal(gx, wx) and np.array_equal(gr, wr)


def test_abandoned_groups_give_their_slots_back() -> None:
    """Groups still in flight when an epoch is abandoned are mapped and dropped: their
    slots return to the workers, so abandoning epochs leaves no segment behind."""
    loader = _grouped({"num_workers": 2, "persistent_workers": True})
    list(loader)
    for _ in range(10):
        it = iter(loader)
        for _ in range(5):
            next(it)
    assert len(list(loader)) == 100
    # every slot the main process saw was unlinked when it mapped it
    assert [n for n in os.listdir("/dev/shm") if n.startswith(f"stoker_{os.getpid()}_")] == []


def _each(loader: DataLoader[Any]) -> list[Any]:
    """Every batch of an epoch, or the error in its place (iteration goes on after it)."""
    out: list[Any] = []
    it = iter(loader)
    while True:
        try:
            out.append(next(it)[0].tolist())
        except StopIteration:
            return out
        except KeyError as exc:
            out.append("".join(traceback.format_exception_only(exc)))


@pytest.mark.parametrize("kw", [MODES[1], SPAWN])
def test_a_failing_batch_in_a_group_raises_at_its_turn(kw: dict[str, Any]) -> None:
    """A batch that raises inside a group raises when its turn comes, naming the worker
    and indices; the batches around it, in its group too, arrive in order."""
    loader = _grouped({"num_workers": 2, "persistent_workers": True, **kw}, bad=333)
    # nothing raises without the bad sample (forked: a property of the dataset, not of kw)
    list(_grouped({"num_workers": 2, "multiprocessing_context": "fork"}))
    loader._memory.task_group = 8  # as an earlier epoch measured it
    got = _each(loader)
    want = _each(_grouped({}, bad=333))
    assert [b for b in got if not isinstance(b, str)] == [b for b in want if not isinstance(b, str)]
    assert [isinstance(b, str) for b in got] == [isinstance(b, str) for b in want]
    failed = [b for b in got if isinstance(b, str)]
    assert len(failed) == 1 and "sample 333 is bad" in failed[0]
    assert "Raised in DataLoader worker" in failed[0] and "333" in failed[0]


@pytest.mark.parametrize("kw", [MODES[1]])
def test_skipped_samples_in_groups_match_in_process(kw: dict[str, Any]) -> None:
    """skip_errors leaves out the same samples inside groups as in process, and counts
    them (the cap holds). The worker skips in its common loop: groups under spawn are the
    two tests above."""
    loader = _grouped({"num_workers": 2, "skip_errors": 1, **kw}, bad=201)
    loader._memory.task_group = 8
    got = [b[0].tolist() for b in loader]
    want = [b[0].tolist() for b in _grouped({"skip_errors": 1}, bad=201)]
    assert got == want and sum(map(len, got)) == 399
    assert loader.statistics().skipped_samples == 1


def _lock_collate(samples: list[Any]) -> Any:
    first = np.array([s[0] for s in samples])
    return first, threading.Lock() if first[0] else None  # the first batch crosses


@pytest.mark.parametrize("group", [0, 4])
def test_a_batch_that_cannot_cross_raises_each_time(group: int) -> None:
    """A batch that cannot be pickled raises its TypeError at its turn, alone or in a
    group, and the next batches are tried in turn (each fails the same way here)."""
    loader = DataLoader(_TinyNoisy(40), batch_size=4, num_workers=1, collate_fn=_lock_collate)
    loader._memory.task_group = group
    it = iter(loader)
    assert next(it)[0].tolist() == [0, 1, 2, 3]
    for _ in range(9):
        with pytest.raises(TypeError, match="pickle") as info:
            next(it)
        assert "Raised in DataLoader worker 0" in "".join(info.value.__notes__)
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.parametrize("cut", [13, 50])
def test_resume_inside_a_group(cut: int) -> None:
    """A checkpoint taken between two batches of one group resumes exactly."""
    loader = _grouped({"num_workers": 2})
    loader._memory.task_group = 8
    it = iter(loader)
    head = [next(it)[0].tolist() for _ in range(cut)]
    state = loader.state_dict()
    del it
    fresh = _grouped({"num_workers": 2})
    fresh._memory.task_group = 8
    fresh.load_state_dict(state)
    tail = [b[0].tolist() for b in fresh]
    assert head + tail == [b[0].tolist() for b in _grouped({})]


class _SlowFirst:
    """Sample 0 waits (bounded) for a sign that other workers ran past the window."""

    def __init__(self, ran_ahead: Any) -> None:
        self.ran_ahead = ran_ahead

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> Any:
        if i == 0:
            return np.array(self.ran_ahead.wait(0.5))  # a bug shows well within this
        if i >= 6:  # only reachable before sample 0 is delivered if the window leaks
            self.ran_ahead.set()
        return np.array(False)


@pytest.mark.parametrize("kw", MODES)
def test_in_order_window_bounds_a_fast_worker(kw: dict[str, Any]) -> None:
    """While in-order delivery waits on a slow batch, no more than prefetch_factor *
    num_workers tasks are out: the fast worker does not run ahead without bound."""
    import multiprocessing
    import threading

    event = threading.Event() if kw.get("worker_mode") == "thread" else multiprocessing.Event()
    loader = DataLoader(_SlowFirst(event), batch_size=1, num_workers=2, **kw)
    batches = [bool(b[0]) for b in loader]
    assert batches[0] is False  # nothing past task 3 was sent while task 0 was pending
    assert len(batches) == 12


def test_worker_count_warning_counts_available_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """More process workers than usable CPUs warns as the loader is made and as an
    iterator starts them (as torch warns); thread workers never do."""
    monkeypatch.setattr(_multi, "available_cpus", lambda: 2)
    with pytest.warns(UserWarning, match="suggested max number of worker in current system is 2"):
        loader = DataLoader(_data(), num_workers=3)
    with pytest.warns(UserWarning, match="suggested max number of worker in current system is 2"):
        it = iter(loader)
    del it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(DataLoader(_data(), num_workers=3, worker_mode="thread"))
        list(DataLoader(_data(), num_workers=2))
    assert 1 <= _multi.available_cpus() <= (os.cpu_count() or 1)


@pytest.mark.multiprocess
def test_bfloat16_tensor_dataset_through_workers() -> None:
    """A dtype NumPy lacks (bfloat16) still travels: gathered in fresh memory, then copied."""
    torch = pytest.importorskip("torch")
    x = torch.arange(12, dtype=torch.bfloat16).reshape(6, 2)
    loader = DataLoader(TensorDataset(x), batch_size=4, num_workers=1)
    got = torch.cat([b[0] for b in loader])
    assert got.dtype == torch.bfloat16 and torch.equal(got, x)


class _MeetInBatch:
    """Samples 1 and 2 can only load together (a barrier of two): one thread loading the
    batch alone times out. Sample 0 costs a few milliseconds, as slow I/O would."""

    def __init__(self) -> None:
        import threading

        self.meet = threading.Barrier(2, timeout=20)

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> Any:
        import threading

        if i == 0:
            time.sleep(0.003)  # the sample's own cost, not a synchronisation
        if i in (1, 2):
            self.meet.wait()
        return np.array([i, threading.get_ident()])


def test_thread_workers_split_a_slow_batch() -> None:
    """Idle thread workers load samples of a slow batch; the batch keeps its order."""
    loader = DataLoader(_MeetInBatch(), batch_size=16, num_workers=4, worker_mode="thread")
    (batch,) = list(loader)
    assert batch[:, 0].tolist() == list(range(16))
    assert len(set(batch[:, 1].tolist())) >= 2


class _SlowWithBadSamples:
    """Sample 0 is slow (so the batch is split); samples 5 and 9 raise."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> Any:

        if i == 0:
            time.sleep(0.003)  # the sample's own cost
        if i in (5, 9):
            raise ValueError(f"bad sample {i}")
        return np.array(i)


def test_split_batch_raises_the_first_failing_sample() -> None:
    """A split batch raises the error of its first failing sample, as one thread would."""
    loader = DataLoader(_SlowWithBadSamples(), batch_size=12, num_workers=4, worker_mode="thread")
    with pytest.raises(ValueError, match="bad sample 5"):
        list(loader)


class _BigSamples:
    """Samples of 256 KiB each: batches of 4 are 1 MiB leaves (pooled by thread workers)."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> Any:
        return np.full(1 << 16, i, np.float32)


def test_thread_workers_reuse_batch_memory_across_epochs() -> None:
    """A thread-mode loader's next epoch collates into the memory the last one freed, and
    never into a batch the user still holds."""
    loader = DataLoader(_BigSamples(), batch_size=4, num_workers=2, worker_mode="thread")
    first = {b.__array_interface__["data"][0] for b in loader}
    second = {b.__array_interface__["data"][0] for b in loader}
    assert first & second  # every batch of the first died before the second began
    # An iterator dropped after one batch keeps nothing from the next epoch but that
    # batch's memory (which of the freed its threads took last depends on timing).
    held = next(iter(loader))
    again = [b.__array_interface__["data"][0] for b in loader]
    assert held.__array_interface__["data"][0] not in again
    assert (held == np.arange(4, dtype=np.float32)[:, None]).all()


class _SlowFirstBatch:
    """Sample 0 costs 30 ms (as a slow read would); the rest cost nothing. Worker
    agnostic: stoker may start its workers lazily."""

    _stoker_worker_agnostic = True

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:

        if i == 0:
            time.sleep(0.03)  # the sample's own cost
        return np.array(i)


def test_slow_first_batch_starts_every_worker_in_the_next_epoch() -> None:
    """Fork workers start one first (a fast first batch need not wait for the other
    forks), but after an epoch whose first batch was slower than forking, all at once."""
    loader = DataLoader(
        _SlowFirstBatch(), batch_size=2, num_workers=2, multiprocessing_context="fork"
    )
    it = iter(loader)
    assert len(it._pool.gauges().pids) == 1
    assert len(list(it)) == 4
    it = iter(loader)
    assert len(it._pool.gauges().pids) == 2
    assert len(list(it)) == 4


_LINGER_S = 30.0


def _linger_at_exit(release: Any, wid: int) -> None:
    """worker_init_fn: the worker's exit waits (bounded) until ``release`` is set."""
    multiprocessing.util.Finalize(None, release.wait, args=(_LINGER_S,), exitpriority=0)


def _fork_warnings(loader: DataLoader[Any]) -> list[str]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert len(list(loader)) == 5
    return [str(w.message) for w in seen if "use of fork()" in str(w.message)]


@pytest.mark.skipif(sys.version_info < (3, 12), reason="Python 3.12 added the warning")
@pytest.mark.timeout(120, method="signal")  # no timer thread: it would make the warning real
def test_forking_beside_reaper_threads_does_not_warn() -> None:
    """Python 3.12+ warns when fork() runs beside other threads; stoker's reapers (joining
    the last epoch's exiting workers) are no such risk and stay quiet, a user's thread not."""
    release = multiprocessing.get_context("fork").Event()
    loader = DataLoader(
        _data(10),
        batch_size=2,
        num_workers=2,
        multiprocessing_context="fork",
        worker_init_fn=functools.partial(_linger_at_exit, release),
    )
    user_thread = threading.Thread(target=release.wait, args=(_LINGER_S,))
    try:
        assert _fork_warnings(loader) == []  # no thread but the main one at the first fork
        assert any(t.name == "stoker-reaper" for t in threading.enumerate())
        assert _fork_warnings(loader) == []  # beside the reapers of the lingering workers
        user_thread.start()
        assert len(_fork_warnings(loader)) >= 1  # beside a thread of the user's
    finally:
        release.set()
        if user_thread.is_alive():
            user_thread.join(_LINGER_S)
