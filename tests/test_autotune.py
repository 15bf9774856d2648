"""Tests of ``num_workers="auto"`` and ``prefetch_factor="auto"`` (stoker._autotune)."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from typing import Any

import numpy as np
import pytest

from stoker import _autotune, get_worker_info
from stoker._autotune import Autotuner, EpochFigures
from stoker._dataset import IterableDataset, TensorDataset
from stoker._loader import DataLoader
from stoker._placement import IN_PROCESS, Placement, Where
from stoker._stats import StatsRecorder

_SLEEP_S = 0.01


class Augmented:
    """Samples drawn from NumPy's global RNG (seeded per batch), after a simulated wait."""

    def __init__(self, n: int = 96, sleep_s: float = _SLEEP_S) -> None:
        self.n = n
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return np.full(4, i, np.float64) + np.random.random(4)

    def __getitems__(self, indices: list[int]) -> list[Any]:
        time.sleep(self.sleep_s)  # simulated I/O: the worker waits, the CPU is free
        return [self[i] for i in indices]


class Stream(IterableDataset[Any]):
    """An iterable dataset of 0..n-1 (its sharding would depend on the worker count)."""

    def __init__(self, n: int = 16) -> None:
        self.n = n

    def __iter__(self) -> Any:
        from stoker._worker_info import get_worker_info

        info = get_worker_info()
        wid, k = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(wid, self.n, k))


def _digest(loader: DataLoader[Any]) -> list[str]:
    return [hashlib.sha256(np.ascontiguousarray(b).tobytes()).hexdigest() for b in loader]


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_auto_gives_the_batches_of_num_workers_0(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With num_workers="auto" (workers added mid-epoch), batches are byte-identical to 0."""
    # Other programs' CPU use would cap the workers added: read no machine-wide idle time.
    monkeypatch.setattr(_autotune, "idle_ticks", lambda: None)
    ds = Augmented()
    auto: DataLoader[Any] = DataLoader(
        ds, batch_size=4, shuffle=True, generator=7, num_workers="auto", worker_mode=mode
    )
    plain: DataLoader[Any] = DataLoader(ds, batch_size=4, shuffle=True, generator=7)
    assert _digest(auto) == _digest(plain)
    stats = auto.statistics()
    assert stats.num_workers > 1, stats.autotune  # a wait-bound loader gets more workers
    assert stats.autotune and "workers (+" in stats.autotune[0]


def test_auto_logs_its_decisions(caplog: pytest.LogCaptureFixture) -> None:
    """Each decision is logged by stoker._autotune and listed in statistics()."""
    loader: DataLoader[Any] = DataLoader(Augmented(n=64), batch_size=4, num_workers="auto")
    with caplog.at_level(logging.INFO, logger="stoker._autotune"):
        list(loader)
    logged = [r.getMessage() for r in caplog.records if r.name == "stoker._autotune"]
    assert logged and all(d in logged[i] for i, d in enumerate(loader.statistics().autotune))


@pytest.fixture
def one_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuner starts a dataset that loads whole batches at one worker per CPU: with one
    CPU that is one worker, which these tests start from."""
    monkeypatch.setattr(_autotune, "available_cpus", lambda: 1)


class _Windows:
    """Windows of batches fed to a tuner: its counters and the loader's CPU time move as
    given, and the machine shows no idle time (2 CPUs): the decisions of
    :meth:`~stoker._autotune.Autotuner.step` on these figures, not on this machine's."""

    def __init__(self, tuner: Autotuner, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tuner, self.cpu = tuner, 0.0
        self.rec = StatsRecorder(tuner.workers, batched=True)
        self.rec.start = self.rec.last = 0.0  # the fed clock starts at 0
        monkeypatch.setattr(_autotune, "available_cpus", lambda: 2)
        monkeypatch.setattr(_autotune, "idle_ticks", lambda: None)
        monkeypatch.setattr(_autotune, "tree_cpu_seconds", lambda pids: self.cpu)
        tuner.begin(self.rec)

    def window(self, waited: float, rate: float = 100.0, cpus: float = 0.1) -> _autotune.Step:
        """A window of 0.1 s at ``rate`` batches/s, the consumer waiting ``waited`` of it,
        the loader using ``cpus`` CPUs: the tuner's decision at its end."""
        rec = self.rec
        rec.batches += 16  # past the batches a change skips: the window opens
        rec.last += 0.01
        assert self.tuner.step(rec, []) == _autotune.KEEP
        rec.batches += round(rate * 0.1)
        rec.last += 0.1
        rec.wait += waited * 0.1
        self.cpu += cpus * 0.1
        return self.tuner.step(rec, [])


def test_a_window_where_the_consumer_barely_waits_keeps_the_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A consumer waiting under 20 % of a window is not input-bound: no worker is added,
    and the tuner settles."""
    windows = _Windows(Autotuner(1, 8, 2, True, False, shared_memory=True), monkeypatch)
    assert windows.window(waited=0.1) == _autotune.KEEP
    assert windows.tuner.settled and windows.tuner.workers == 1
    assert windows.tuner.decisions[0].startswith("keep 1 workers"), windows.tuner.decisions


def test_windows_add_workers_while_the_consumer_waits_and_each_addition_gains(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A consumer waiting w of a window gets count / (1 - w) workers (at most 4x at once);
    additions go on while one raises batches/s by 5 %, then the count stays."""
    windows = _Windows(Autotuner(1, 8, 2, True, False, shared_memory=True), monkeypatch)
    assert windows.window(waited=0.4, rate=100).add == 1  # 1 / (1 - 0.4), rounded up: 2
    assert windows.window(waited=0.9, rate=200).add == 6  # 2 x 4 = 8: the capacity
    assert windows.tuner.workers == 8
    assert windows.window(waited=0.5, rate=200) == _autotune.KEEP  # no gain: the end
    assert windows.tuner.settled and windows.tuner.workers == 8
    assert windows.tuner.decisions[-1].startswith("stop at 8 workers"), windows.tuner.decisions


def test_windows_add_workers_only_within_the_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers that keep the CPUs busy (2 of 2, 1 a worker) get no company: the CPUs, with
    a quarter of one to spare, bound the count."""
    windows = _Windows(Autotuner(2, 8, 2, True, False, shared_memory=True), monkeypatch)
    assert windows.window(waited=0.9, cpus=2.0) == _autotune.KEEP
    assert "CPU is short" in windows.tuner.decisions[-1], windows.tuner.decisions


def test_windows_deepen_the_prefetch_of_a_fixed_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """prefetch_factor="auto" with a fixed count: a waiting consumer gets one more task in
    flight per worker, not workers."""
    windows = _Windows(Autotuner(1, 1, 2, False, True, shared_memory=True), monkeypatch)
    assert windows.window(waited=0.5) == _autotune.ADD_PREFETCH
    assert (windows.tuner.workers, windows.tuner.prefetch) == (1, 3)
    assert windows.tuner.decisions[-1].startswith("prefetch 3"), windows.tuner.decisions


def test_auto_persistent_workers_keep_the_count_found() -> None:
    """With persistent workers the next epoch starts with the workers found in the first."""
    loader: DataLoader[Any] = DataLoader(
        Augmented(n=64), batch_size=4, num_workers="auto", persistent_workers=True
    )
    first = list(loader)
    found = loader.statistics().num_workers
    second = list(loader)
    assert len(first) == len(second) == 16
    assert found > 1 and loader.statistics().num_workers >= found
    del loader, first, second


def test_prefetch_auto_deepens_the_window_with_fixed_workers() -> None:
    """prefetch_factor="auto" with a fixed worker count deepens prefetch while waits remain."""
    loader: DataLoader[Any] = DataLoader(
        Augmented(n=64), batch_size=4, num_workers=1, prefetch_factor="auto"
    )
    assert len(list(loader)) == 16
    stats = loader.statistics()
    assert stats.num_workers == 1
    assert stats.prefetch_factor is not None and stats.prefetch_factor >= 3
    assert any(d.startswith("prefetch 3") for d in stats.autotune)


def test_auto_with_an_iterable_dataset_fixes_the_count() -> None:
    """An iterable dataset gets a fixed count (its sharding depends on it), all data once."""
    loader: DataLoader[Any] = DataLoader(Stream(), batch_size=None, num_workers="auto")
    got = sorted(int(x) for x in loader)
    assert got == list(range(16))
    assert "not tuned" in loader.statistics().autotune[0]


class SlowInProcess:
    """Rows that load at once in a worker, but 20 ms per batch in the main process."""

    def __len__(self) -> int:
        return 64

    def __getitems__(self, indices: list[int]) -> list[Any]:
        from stoker._worker_info import get_worker_info

        if get_worker_info() is None:
            time.sleep(0.02)  # simulated slow loading, in the main process only
        return [np.full(2, i) for i in indices]


def _epochs(loader: DataLoader[Any], n: int = 3) -> list[list[str]]:
    return [_digest(loader) for _ in range(n)]


@pytest.fixture
def trial_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """No move from the first batch's timing (in process, or to the model's count: on a
    loaded machine a tiny batch may take long enough to look like one that waits): the
    end-of-epoch trial decides."""
    monkeypatch.setattr(_autotune, "MEASURE_BELOW_S", 0.0)
    monkeypatch.setattr(_autotune, "JUMP_BATCH_S", float("inf"))


@pytest.fixture
def windows_keep(monkeypatch: pytest.MonkeyPatch) -> None:
    """No window of batches adds workers (or prefetch): the consumer never waits enough.
    The count stays where it starts, whatever this machine's speed (a loaded machine makes
    any consumer wait)."""
    monkeypatch.setattr(_autotune, "INPUT_BOUND", float("inf"))


WORKERS_COST = EpochFigures(16, per_batch=1e-3, load=1e-5, loop=1e-5)
"""An epoch with workers that only cost: one batch a millisecond, each loaded in 10 us."""
IN_PROCESS_WINS = EpochFigures(16, per_batch=5e-5, load=1e-5, loop=1e-5)
"""An in-process trial faster than :data:`WORKERS_COST`."""
IN_PROCESS_LOSES = EpochFigures(16, per_batch=2e-3, load=2e-3, loop=1e-5)
"""An in-process trial slower than :data:`WORKERS_COST`."""


def _feed_epochs(
    monkeypatch: pytest.MonkeyPatch, workers: EpochFigures, in_process: EpochFigures
) -> None:
    """The tuner judges each epoch the loader reports from these figures (``in_process``
    for its trial epochs), not from this machine's clock; nothing is timed in process."""

    def judge(tuner: Autotuner, rec: Any, seconds: float, load_in_process: Any = None) -> None:
        tuner.judge_epoch(in_process if tuner.workers == 0 else workers, lambda: None)

    monkeypatch.setattr(Autotuner, "epoch_done", judge)


def _in_process_decisions(loader: DataLoader[Any]) -> list[str]:
    """The loader's decisions about loading in process (not those of windows), up to ':'."""
    decisions = loader.statistics().autotune
    return [d.split(":")[0] for d in decisions if "in process" in d or d.startswith("back to")]


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.usefixtures("trial_only")
def test_auto_loads_in_process_when_workers_cost_more(
    persistent: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short epochs of tiny batches: after one epoch with workers that only cost (fed
    figures), auto tries and keeps loading in process, with the same batches (persistent
    workers: after the first epoch that did not start them)."""
    _feed_epochs(monkeypatch, WORKERS_COST, IN_PROCESS_WINS)
    data = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": True, "generator": 5}
    auto: DataLoader[Any] = DataLoader(
        TensorDataset(data), num_workers="auto", persistent_workers=persistent, **kw
    )
    assert _epochs(auto, 4) == _epochs(DataLoader(TensorDataset(data), **kw), 4)
    assert auto.statistics().num_workers == 0
    assert _in_process_decisions(auto) == ["try in process next epoch", "stay in process"]
    assert auto._iterator is None  # persistent workers went with the decision


def test_a_won_trial_keeps_loading_in_process_for_good() -> None:
    """Workers that only cost bring a trial; a trial that is faster keeps the loader in
    process, and no later epoch is judged again."""
    tuner = Autotuner(2, 4, 2, True, False, shared_memory=True, in_process=True)
    tuner.judge_epoch(WORKERS_COST)
    assert tuner.workers == 0 and tuner.trying_in_process
    tuner.judge_epoch(IN_PROCESS_WINS)
    assert tuner.workers == 0 and not tuner.trying_in_process
    for _ in range(4):
        tuner.judge_epoch(IN_PROCESS_LOSES)
    assert tuner.workers == 0
    assert [d.split(":")[0] for d in tuner.decisions] == [
        "try in process next epoch",
        "stay in process",
    ]


@pytest.mark.parametrize(
    ("epoch", "tried"),
    [
        (WORKERS_COST, True),
        (WORKERS_COST._replace(batches=7), False),  # too short an epoch to judge
        (WORKERS_COST._replace(loop=1e-3), False),  # the loop alone takes the time
        (WORKERS_COST._replace(load=0.96e-3), False),  # loading does, within 5 %
    ],
    ids=["costly workers", "short epoch", "slow loop", "slow load"],
)
def test_a_trial_comes_only_where_loading_and_the_loop_take_less_than_workers_deliver(
    epoch: EpochFigures, tried: bool
) -> None:
    """The in-process trial's condition, on fed figures: a batch's load plus the loop's own
    time, with 5 % to spare, below the time per batch the workers delivered, the workers
    idle most of the time, and an epoch of at least 8 batches."""
    tuner = Autotuner(2, 4, 2, True, False, shared_memory=True, in_process=True)
    tuner.judge_epoch(epoch)
    assert (tuner.workers == 0) is tried, tuner.decisions


@pytest.mark.multiprocess
@pytest.mark.usefixtures("trial_only", "one_cpu", "windows_keep")
def test_auto_judges_persistent_workers_by_an_epoch_that_did_not_start_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spawned persistent workers take long to start, once: the first epoch, which waited
    for them, is not judged (its figures would send the loader in process; the second
    epoch's may: see the test above)."""
    _feed_epochs(monkeypatch, WORKERS_COST, IN_PROCESS_WINS)
    data = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
    loader: DataLoader[Any] = DataLoader(
        TensorDataset(data),
        batch_size=4,
        num_workers="auto",
        persistent_workers=True,
        multiprocessing_context="spawn",
    )
    assert len(list(loader)) == 16
    assert _in_process_decisions(loader) == []
    assert loader.statistics().num_workers == 1


@pytest.mark.usefixtures("one_cpu", "windows_keep")
def test_auto_goes_back_to_workers_when_in_process_is_slower(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The in-process trial is kept only if it was faster (fed figures): here the workers
    come back, with the same batches in every epoch."""
    _feed_epochs(monkeypatch, WORKERS_COST, IN_PROCESS_LOSES)
    loader: DataLoader[Any] = DataLoader(SlowInProcess(), batch_size=8, num_workers="auto")
    plain: DataLoader[Any] = DataLoader(SlowInProcess(), batch_size=8)
    assert _epochs(loader) == _epochs(plain, 1) * 3
    assert loader.statistics().num_workers == 1
    assert _in_process_decisions(loader) == ["try in process next epoch", "back to 1 workers"]


@pytest.mark.parametrize(("busy_s", "tried"), [(0.5, True), (0.95, False)])
def test_auto_tries_in_process_only_when_workers_idle(busy_s: float, tried: bool) -> None:
    """Workers busy most of an epoch are its bottleneck (more would help): no trial then,
    even when a batch's load plus the loop's time is below the time per batch."""
    tuner = Autotuner(1, 4, 2, True, False, shared_memory=True, in_process=True)
    rec = StatsRecorder(1, batched=True)
    rec.batches, rec.busy, rec.wait = 100, [busy_s], 0.999
    rec.start, rec.last = 0.0, 1.0  # 10 ms a batch; a batch loads in 5 or 9.5 ms
    tuner.epoch_done(rec, seconds=1.0)
    assert (tuner.workers == 0) is tried
    assert bool(tuner.decisions) is tried


@pytest.mark.parametrize(("measured_s", "tried"), [(None, False), (0.002, True)])
def test_a_load_measured_in_process_replaces_the_workers_busy_time(
    measured_s: float | None, tried: bool
) -> None:
    """Workers sharing the cores take longer per batch than the main process would: where a
    batch can be loaded in process to measure it (only stoker's code), that time decides."""
    tuner = Autotuner(2, 2, 2, False, False, shared_memory=True, in_process=True)
    rec = StatsRecorder(2, batched=True)
    rec.batches, rec.busy, rec.wait = 100, [0.5, 0.5], 0.999  # 10 ms a batch in a worker
    rec.start, rec.last = 0.0, 1.0  # 10 ms a batch delivered
    tuner.epoch_done(rec, seconds=1.0, load_in_process=lambda: measured_s)
    assert (tuner.workers == 0) is tried


def test_busy_workers_are_not_measured_against_in_process() -> None:
    """Workers busy most of the epoch are the bottleneck: the main process does not spend
    time loading a batch itself to compare."""
    tuner = Autotuner(2, 2, 2, False, False, shared_memory=True, in_process=True)
    rec = StatsRecorder(2, batched=True)
    rec.batches, rec.busy, rec.wait = 100, [0.95, 0.95], 0.9  # busy 95% of a 1 s epoch
    rec.start, rec.last = 0.0, 1.0
    calls: list[int] = []
    tuner.epoch_done(rec, seconds=1.0, load_in_process=lambda: calls.append(1) or 0.001)
    assert calls == [] and tuner.workers == 2


def test_a_lost_trial_is_tried_again_after_more_and_more_epochs() -> None:
    """A trial that loses (here every one: in process takes twice the time) brings the
    workers back, and another comes after 2, then 4 epochs with workers: one trial slowed by
    a stall of the machine does not decide for good."""
    tuner = Autotuner(2, 2, 2, False, False, shared_memory=True, in_process=True)
    trials = []
    for epoch in range(12):
        in_process = tuner.workers == 0
        per_batch = 0.010 if in_process else 0.005
        rec = StatsRecorder(2, batched=True)
        rec.batches, rec.busy, rec.wait = 100, [0.05, 0.05], 0.45  # loads in 1 ms a batch
        rec.start, rec.last = 0.0, per_batch * 100
        tuner.epoch_done(rec, seconds=per_batch * 100)
        if in_process:
            trials.append(epoch)
    assert trials == [1, 5, 11]
    assert tuner.workers == 2
    assert tuner.decisions[1].endswith("another trial may come after 2 epochs")


@pytest.mark.parametrize("kw", [{"worker_init_fn": print}, {"timeout": 30}], ids=str)
@pytest.mark.usefixtures("one_cpu", "windows_keep")
def test_auto_stays_with_workers_that_in_process_could_not_replace(
    kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With worker_init_fn (it would not run) or timeout (the main process cannot time itself
    out), auto never loads in process, even after epochs whose workers only cost."""
    _feed_epochs(monkeypatch, WORKERS_COST, IN_PROCESS_WINS)
    data = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
    loader: DataLoader[Any] = DataLoader(
        TensorDataset(data), batch_size=4, num_workers="auto", **kw
    )
    _epochs(loader, 2)
    assert loader.statistics().num_workers == 1
    assert _in_process_decisions(loader) == []


class _UserRows(TensorDataset):
    """A TensorDataset of the user's own class: its code could run in a worker."""


def _rows() -> np.ndarray[Any, Any]:
    return np.arange(1024 * 4, dtype=np.float32).reshape(1024, 4)


def _epochs_until(loader: DataLoader[Any], decision: str, limit: int = 3) -> int:
    """Epochs of ``loader`` until its last decision starts with ``decision`` (at most
    ``limit``)."""
    for epoch in range(1, limit + 1):
        assert len(list(loader)) == 256
        decisions = loader.statistics().autotune
        if decisions and decisions[-1].startswith(decision):
            return epoch
    raise AssertionError(f"no {decision!r} in {limit} epochs: {loader.statistics().autotune}")


@pytest.mark.parametrize("persistent", [False, True])
def test_a_fixed_count_loads_in_process_where_only_stoker_code_runs(
    persistent: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """num_workers=2 over a TensorDataset of arrays with the default collate: none of the
    user's code runs in a worker, so once an epoch shows the workers slower (fed figures),
    the loader tries and keeps loading in process, with the same batches; persistent
    workers go then."""
    _feed_epochs(monkeypatch, WORKERS_COST, IN_PROCESS_WINS)
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": True, "generator": 5}
    fixed: DataLoader[Any] = DataLoader(
        TensorDataset(_rows()), num_workers=2, persistent_workers=persistent, **kw
    )
    epochs = _epochs_until(fixed, "stay in process")
    assert epochs == (3 if persistent else 2)  # the epoch that started them is not judged
    plain: DataLoader[Any] = DataLoader(TensorDataset(_rows()), **kw)
    assert _epochs(fixed, 2) == _epochs(plain, epochs + 2)[epochs:]
    stats = fixed.statistics()
    assert (stats.num_workers, fixed.num_workers) == (0, 2)
    assert stats.autotune[0].startswith("try in process next epoch")
    assert fixed._iterator is None


@pytest.mark.parametrize(
    "kw",
    [{"dataset": _UserRows(_rows())}, {"worker_init_fn": print}, {"collate_fn": list}],
    ids=["subclass", "worker_init_fn", "collate_fn"],
)
def test_a_fixed_count_keeps_its_workers_where_user_code_runs(
    kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dataset subclass, a worker_init_fn or a collate_fn of the user's would run in the
    workers: a fixed count keeps them, however slow (fed figures)."""
    _feed_epochs(monkeypatch, WORKERS_COST, IN_PROCESS_WINS)
    kw = {"dataset": TensorDataset(_rows()), "batch_size": 4, "num_workers": 2, **kw}
    loader: DataLoader[Any] = DataLoader(**kw)
    for _ in range(3):
        assert len(list(loader)) == 256
    assert (loader.statistics().num_workers, loader.statistics().autotune) == (2, ())


def _no_init(worker_id: int) -> None:
    """A worker_init_fn that does nothing (but would run in the workers)."""


def test_a_setting_that_lets_user_code_into_workers_brings_them_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The decision holds for the settings it was made with: once the loader loads in
    process, giving it a worker_init_fn (which must run in workers) brings the workers back."""
    _feed_epochs(monkeypatch, WORKERS_COST, IN_PROCESS_WINS)
    loader: DataLoader[Any] = DataLoader(TensorDataset(_rows()), batch_size=4, num_workers=2)
    _epochs_until(loader, "stay in process")
    assert loader.statistics().num_workers == 0
    loader.worker_init_fn = _no_init
    assert len(list(loader)) == 256
    assert (loader.statistics().num_workers, loader.statistics().autotune) == (2, ())


def test_persistent_workers_wait_out_an_in_process_trial(monkeypatch: pytest.MonkeyPatch) -> None:
    """Persistent workers are kept through the in-process trial; when it is slower (fed
    figures), the same workers load the next epoch."""
    _feed_epochs(monkeypatch, WORKERS_COST, IN_PROCESS_LOSES)
    loader: DataLoader[Any] = DataLoader(
        TensorDataset(_rows()), batch_size=4, num_workers=2, persistent_workers=True
    )
    _epochs_until(loader, "try in process next epoch")
    pool = loader._iterator._pool
    assert len(list(loader)) == 256  # the trial, in process
    assert loader.statistics().autotune[-1].startswith("back to 2 workers")
    it = iter(loader)
    assert it._pool is pool
    assert len(list(it)) == 256
    del it, pool


def test_prefetch_factor_rejects_other_strings() -> None:
    """prefetch_factor accepts an int or "auto"; another string is a TypeError, as torch."""
    with pytest.raises(TypeError, match="prefetch_factor"):
        DataLoader(Augmented(), batch_size=4, num_workers=1, prefetch_factor="many")


def test_num_workers_rejects_other_strings() -> None:
    """num_workers accepts an int or "auto"; another string is a TypeError, as torch."""
    with pytest.raises(TypeError, match="num_workers"):
        DataLoader(Augmented(), batch_size=4, num_workers="all")  # type: ignore[arg-type]


def test_memory_budget_follows_the_memory_available(monkeypatch: pytest.MonkeyPatch) -> None:
    """A quarter of the memory available, capped by the cgroup's room, at least 2 GiB."""
    from stoker import _autotune, _osprobe

    gib = 1 << 30
    if os.path.exists("/proc/meminfo"):
        assert (_osprobe.memory_available() or 0) > 0  # the parser reads this machine's
    monkeypatch.setattr(_osprobe, "memory_available", lambda: 24 * gib)
    monkeypatch.setattr(_osprobe, "cgroup_memory_room", lambda: None)
    assert _autotune.memory_budget() == 6 * gib
    monkeypatch.setattr(_osprobe, "cgroup_memory_room", lambda: 12 * gib)  # a container's limit
    assert _autotune.memory_budget() == 3 * gib
    monkeypatch.setattr(_osprobe, "cgroup_memory_room", lambda: gib)
    assert _autotune.memory_budget() == _autotune.MEMORY_BUDGET_BYTES == 2 * gib
    monkeypatch.setattr(_osprobe, "memory_available", lambda: None)
    monkeypatch.setattr(_osprobe, "cgroup_memory_room", lambda: None)
    assert _autotune.memory_budget() == 2 * gib


class Waiting:
    """Samples that wait (the GIL released) and draw from NumPy's global RNG."""

    def __init__(self, n: int = 48, sleep_s: float = 0.004) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        time.sleep(self.sleep_s)
        return np.full(3, i, np.float64) + np.random.random(3)


class Computing(Waiting):
    """Samples computed in Python (the GIL held), drawing from NumPy's global RNG."""

    def __getitem__(self, i: int) -> Any:
        total = 0
        for j in range(3000):
            total += j
        return np.full(3, i + total, np.float64) + np.random.random(3)


@pytest.mark.parametrize("dataset", [Waiting, Computing])
@pytest.mark.parametrize("persistent", [False, True])
def test_auto_x_auto_gives_the_batches_of_num_workers_0(dataset: Any, persistent: bool) -> None:
    """num_workers="auto" with worker_mode="auto": whatever count and mode the tuner picks
    (and a switch of mode between epochs), each epoch's batches are byte-identical to 0."""
    kw: dict[str, Any] = {"batch_size": 8, "shuffle": True, "generator": 3}
    auto: DataLoader[Any] = DataLoader(
        dataset(), num_workers="auto", worker_mode="auto", persistent_workers=persistent, **kw
    )
    plain: DataLoader[Any] = DataLoader(dataset(), **kw)
    assert _epochs(auto) == _epochs(plain)
    decisions = auto.statistics().autotune
    modes = [d for d in decisions if d.startswith(("thread workers", "process workers"))]
    assert len(modes) == 1, decisions  # the probe chose a mode, once


def test_the_first_samples_set_the_count_before_the_first_batch() -> None:
    """An epoch of 3 slow batches: the count comes from the first worker's first samples
    (a Probe), not from windows of batches, which this epoch is too short for."""
    loader: DataLoader[Any] = DataLoader(
        Waiting(n=24, sleep_s=0.005), batch_size=8, num_workers="auto"
    )
    assert len(list(loader)) == 3
    stats = loader.statistics()
    assert "from the first samples" in stats.autotune[0], stats.autotune
    assert stats.num_workers == 3, stats.autotune  # one per batch: "3 batches left bound it"


class WorkerIds(Waiting):
    """Samples that wait and say which worker loaded them."""

    def __getitem__(self, i: int) -> Any:
        time.sleep(self.sleep_s)
        info = get_worker_info()
        return np.int64(-1 if info is None else info.id)


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_the_workers_the_probe_adds_take_the_batches_after_the_first(mode: str) -> None:
    """Until the probe decides, the first worker holds one task, not a prefetch window:
    the second batch goes to a worker the probe adds, not behind the first batch."""
    loader: DataLoader[Any] = DataLoader(
        WorkerIds(n=48, sleep_s=0.005), batch_size=16, num_workers="auto", worker_mode=mode
    )
    owners = [set(batch.tolist()) for batch in loader]
    assert loader.statistics().num_workers == 3, loader.statistics().autotune
    assert owners[0] == {0} and owners[1] != {0} and owners[2] != {0}, owners


class Threads(Waiting):
    """Samples that wait and note the thread that loaded them."""

    def __init__(self, n: int, sleep_s: float) -> None:
        super().__init__(n, sleep_s)
        self.seen: set[int] = set()

    def __getitem__(self, i: int) -> Any:
        self.seen.add(threading.get_ident())
        return super().__getitem__(i)


@pytest.mark.parametrize("persistent", [False, True])
def test_only_the_threads_the_tuner_counts_load_samples_after_the_probe(persistent: bool) -> None:
    """A pool of threads built for the tuner's capacity: the idle ones beyond its count
    help with the probe's samples only, or they would fetch side by side with the count
    it chose (on two CPUs, 8 threads of a GIL-free decode instead of 2)."""
    ds = Threads(n=32, sleep_s=0.005)  # slow samples: idle threads are offered the rest
    loader: DataLoader[Any] = DataLoader(
        ds, batch_size=16, num_workers="auto", worker_mode="thread", persistent_workers=persistent
    )
    assert len(list(loader)) == 2
    stats = loader.statistics()
    assert stats.num_workers == 2, stats.autotune
    ds.seen.clear()
    assert len(list(loader)) == 2
    assert len(ds.seen) <= 2, f"{len(ds.seen)} threads loaded samples; the tuner counts 2"


def _probe(wall: float, cpu: float, threads: int = 1, share: float = 0.0) -> Any:
    from stoker._engine._messages import Probe

    return Probe(1, 8, wall, cpu, wall, share * wall, threads, 100, 1 << 10)


@pytest.mark.parametrize(
    ("wall", "cpu", "workers"), [(0.005, 0.0001, 8), (0.005, 0.005, 2), (0.0001, 0.0001, 1)]
)
def test_the_probe_model_counts_workers_from_the_cpu_a_fetch_uses(
    wall: float, cpu: float, workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiting fetch gets the capacity, a CPU-bound one the CPUs (2 here), and a fast
    batch (under _JUMP_BATCH_S) is left to the windows."""
    monkeypatch.setattr(_autotune, "available_cpus", lambda: 2)
    tuner = _autotune.Autotuner.for_settings("auto", 2, "process", False, False)
    tuner.capacity = 8
    assert tuner.probe(_probe(wall, cpu), 50).add == workers - 1
    assert tuner.workers == workers
    assert tuner.probe(_probe(wall, cpu), 50) == _autotune.KEEP  # only the first decides


@pytest.mark.parametrize(
    ("cpu", "threads", "share", "mode"),
    [(0.0002, 1, 0.0, "thread"), (0.005, 4, 0.5, "thread"), (0.005, 4, 0.25, "process"),
     (0.005, 1, 0.0, "process")],
)  # fmt: skip
def test_worker_mode_auto_keeps_threads_only_where_the_gil_is_released(
    cpu: float, threads: int, share: float, mode: str
) -> None:
    """Threads stay where a fetch waits, or where threads side by side use more CPU than
    one; else the next epoch (not this one) runs processes, from the model's count."""
    tuner = _autotune.Autotuner.for_settings("auto", 2, "auto", False, False)
    assert tuner.mode == "thread" and tuner.wants_probe
    tuner.probe(_probe(0.005, cpu, threads, share), 50)
    assert tuner.mode == "thread" and not tuner.wants_probe
    assert tuner.take_placement().where == mode
    assert tuner.shared_memory == (mode == "process")


def test_worker_mode_auto_is_fixed_to_processes_for_an_iterable_dataset() -> None:
    """An iterable dataset's draws are seeded per epoch in a process, per batch in a thread:
    its mode must not change, so it is processes, said once."""
    tuner = _autotune.Autotuner.for_settings(2, 2, "auto", True, False)
    assert tuner.mode == "process" and not tuner.wants_probe
    assert tuner.decisions == ["iterable dataset: process workers (its draws are seeded per epoch)"]


@pytest.mark.parametrize("batch_size", [4, None], ids=["batched", "one by one"])
@pytest.mark.parametrize("mode", ["process", "thread", "auto"])
@pytest.mark.parametrize("persistent", [False, True])
def test_fast_batches_load_in_process_from_the_first_epoch_with_the_same_batches(
    batch_size: int | None, mode: str, persistent: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first batch that loads in the main process faster than a worker hands one over:
    the epoch, and the next ones, load there, and every epoch's batches are those of
    num_workers=0 (the thresholds are raised so that any load qualifies). Batches gathered
    at once (``__getitems__``) are timed before any worker starts; single samples at the
    first worker's probe, and the epoch restarts in process."""
    monkeypatch.setattr(_autotune, "IN_PROCESS_NOW_S", 10.0)
    monkeypatch.setattr(_autotune, "MEASURE_BELOW_S", 10.0)
    data = TensorDataset(np.arange(64 * 3, dtype=np.float32).reshape(64, 3))
    kw: dict[str, Any] = {"batch_size": batch_size, "shuffle": True, "generator": 5}
    auto: DataLoader[Any] = DataLoader(
        data, num_workers="auto", worker_mode=mode, persistent_workers=persistent, **kw
    )
    assert _epochs(auto) == _epochs(DataLoader(data, **kw))
    decisions = auto.statistics().autotune
    assert any(d.startswith("load in process from now on") for d in decisions), decisions
    assert auto.statistics().num_workers == 0  # the later epochs ran in process


class Pids(Waiting):
    """Samples that say which process loaded them."""

    def __getitem__(self, i: int) -> Any:
        return np.array([i, os.getpid()])


@pytest.mark.parametrize("persistent", [False, True])
def test_a_switch_to_processes_before_the_first_batch_takes_the_epoch_over(
    persistent: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """worker_mode="auto" starts with threads; when their first samples show the GIL held,
    a process pool loads the whole epoch, its first batch included, and the later epochs."""
    monkeypatch.setattr(_autotune, "threads_suffice", lambda *a: (False, "the GIL is held"))
    loader: DataLoader[Any] = DataLoader(
        Pids(n=64), batch_size=16, num_workers="auto", worker_mode="auto",
        persistent_workers=persistent,
    )  # fmt: skip
    for _ in range(2):
        batches = list(loader)
        assert [int(b[0][0]) for b in batches] == [0, 16, 32, 48]
        assert all(int(pid) != os.getpid() for b in batches for pid in b[:, 1]), batches
    assert "process workers (at once" in loader.statistics().autotune[0]


@pytest.mark.parametrize(
    ("batched", "workers", "mode"), [(False, 1, "thread"), (True, 2, "process")]
)
def test_a_dataset_that_loads_whole_batches_starts_at_one_worker_per_cpu_in_processes(
    batched: bool, workers: int, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Samples timed one by one: one thread worker first, the probe decides within a few
    samples. A whole batch at once (``__getitems__``): the probe comes only with the first
    batch, so the tuner starts where batches that compute need it: a process per CPU."""
    monkeypatch.setattr(_autotune, "available_cpus", lambda: 2)
    tuner = _autotune.Autotuner.for_settings("auto", 2, "auto", False, False, batched=batched)
    assert (tuner.workers, tuner.mode) == (workers, mode)
    fixed = _autotune.Autotuner.for_settings(3, 2, "thread", False, True, batched=batched)
    assert (fixed.workers, fixed.mode) == (3, "thread")  # a fixed count and mode stay


def test_a_process_probe_moves_a_waiting_fetch_to_threads() -> None:
    """Started in processes, a fetch that waits goes to threads (no threads are measured
    side by side in a process, so one that computes stays)."""
    for cpu, mode in [(0.0001, "thread"), (0.005, "process")]:
        tuner = _autotune.Autotuner.for_settings("auto", 2, "auto", False, False, batched=True)
        tuner.probe(_probe(0.005, cpu), 50)
        assert tuner.take_placement().where == mode


def test_a_move_the_probe_chose_is_a_pending_placement_until_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tuner's choices reach the loader as typed placements: a kind switch is pending
    with the model's count, a fast first batch is pending in process; taking one clears
    it, and a fixed loader's placement is its settings'."""
    monkeypatch.setattr(_autotune, "available_cpus", lambda: 2)
    tuner = _autotune.Autotuner.for_settings("auto", 2, "auto", False, False, batched=True)
    assert tuner.pending is None and tuner.placement == Placement(Where.PROCESSES, 2)
    tuner.probe(_probe(0.005, 0.0001), 50)  # it waits: threads, as many as the capacity
    assert tuner.pending == Placement(Where.THREADS, 8)
    assert tuner.take_placement() == Placement(Where.THREADS, 8) and tuner.pending is None
    monkeypatch.setattr(_autotune, "MEASURE_BELOW_S", 10.0)
    fast = _autotune.Autotuner.for_settings("auto", 2, "process", False, True)
    fast.probe(_probe(0.001, 0.001), 50, lambda: 1e-6)
    assert fast.pending == IN_PROCESS and fast.take_placement() == IN_PROCESS
    assert fast.pending is None
    assert Placement.fixed(0, "thread") == IN_PROCESS
    assert Placement.fixed(3, "ray") == Placement(Where.RAY, 3)
    with pytest.raises(ValueError, match="no placement"):
        Placement(Where.THREADS, 0)


def test_a_first_batch_that_raises_while_timed_raises_in_its_turn() -> None:
    """The first look times the first batch in process; an error there (here an index out
    of range) is not raised by ``iter()`` but by the ``next`` that loads that batch."""
    data = TensorDataset(np.arange(32, dtype=np.float32).reshape(16, 2))
    loader: DataLoader[Any] = DataLoader(data, batch_sampler=[[0, 99], [1, 2]], num_workers="auto")
    it = iter(loader)
    with pytest.raises(IndexError):
        next(it)
    del it


@pytest.mark.usefixtures("trial_only", "windows_keep")
def test_the_warm_memory_of_the_last_epoch_goes_to_the_workers_that_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Forked workers reuse the shared memory the last epoch's workers wrote (no page to fault
    again), spread over the workers that start, not over the tuner's whole capacity."""
    monkeypatch.setattr(_autotune, "available_cpus", lambda: 2)  # 2 workers of capacity 8
    monkeypatch.setattr(_autotune, "MIN_EPOCH_BATCHES", 10**9)  # no trial in process
    data = TensorDataset(np.zeros((64, 4096), np.float32))
    loader: DataLoader[Any] = DataLoader(
        data, batch_size=8, num_workers="auto", multiprocessing_context="fork"
    )
    assert len(list(loader)) == 8
    warm = {name for name, _ in loader._memory.warm}
    assert warm
    it = iter(loader)
    next(it)
    held = [set(w.slots.maps._maps) & warm for w in it._pool.workers]
    assert len(held) == 8 and not any(held[2:]), held
    assert held[0] | held[1] == warm and held[0] and held[1], held
    del it
