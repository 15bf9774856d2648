"""Self-healing workers (``worker_restarts``): a dead worker process is replaced, its tasks
issued again, and the loop gets the batches of an unfaulted run, byte for byte.

Each death is real: the dataset kills its own worker (SIGKILL, a segfault in native code,
``os._exit``, or a C++ allocation past an ``RLIMIT_AS`` memory limit, which aborts), once
per sample (a marker file, made atomically, says it happened) or every time (a poisoned
sample). The dataset augments: each sample draws from Python's, NumPy's and torch's global
RNGs. The reference is the same loader in process: batches do not depend on the workers.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import faulthandler
import logging
import os
import random
import re
import resource
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stoker
import stoker.torch
from stoker._engine._messages import BatchSeed, GroupSeeds, Loaded, Probe, Task
from stoker._engine._restart import PROBE, Healer, death_cause
from stoker._random import mix_seed
from stoker.errors import WorkerError

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker")

_N, _BATCH = 32, 4
_LIBSTDCXX = ctypes.util.find_library("stdc++")


def _die(how: str) -> None:
    """End this worker process as ``how`` says, the way such deaths happen."""
    faulthandler.disable()  # pytest's: no traceback of a crash or abort on the output
    if how == "sigkill":  # what the kernel's OOM killer sends
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "segfault":  # a crash in a C extension
        ctypes.string_at(0)
    elif how == "exit":
        os._exit(3)
    elif how == "memory":  # a memory limit: C++'s operator new fails and nothing catches it
        with open("/proc/self/status") as f:
            size = int(re.search(r"VmSize:\s+(\d+)", f.read()).group(1)) * 1024  # type: ignore[union-attr]
        resource.setrlimit(resource.RLIMIT_AS, (size + (64 << 20), resource.RLIM_INFINITY))
        new = ctypes.CDLL(_LIBSTDCXX)._Znwm  # operator new(size_t)
        new.restype, new.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        new(512 << 20)  # std::bad_alloc, uncaught: std::terminate, SIGABRT
    raise AssertionError(f"the worker outlived {how}")


class Augments:
    """Samples that draw from every global RNG; ``deaths`` maps a sample to how it kills
    its worker the first time it loads (marker files in ``marks``), ``poison`` to how it
    kills every time."""

    def __init__(
        self,
        marks: Path,
        deaths: dict[int, str] | None = None,
        poison: dict[int, str] | None = None,
    ) -> None:
        self.marks, self.deaths, self.poison = str(marks), deaths or {}, poison or {}

    def __len__(self) -> int:
        return _N

    def __getitem__(self, i: int) -> np.ndarray:
        if i in self.poison:
            _die(self.poison[i])
        if i in self.deaths:
            with contextlib.suppress(FileExistsError):
                os.close(os.open(os.path.join(self.marks, f"died-{i}"), os.O_CREAT | os.O_EXCL))
                _die(self.deaths[i])
        draws = [np.random.rand(), random.random(), torch.rand(1).item()]
        return np.array([i, *draws], np.float64)


class InitLog:
    """A ``worker_init_fn`` that leaves a file per call: which id, in which process."""

    def __init__(self, folder: Path) -> None:
        self.folder = str(folder)

    def __call__(self, worker_id: int) -> None:
        Path(self.folder, f"init-{worker_id}-{os.getpid()}").touch()


def _loader(dataset: Any, workers: int = 2, **kwargs: Any) -> stoker.DataLoader[Any]:
    return stoker.DataLoader(
        dataset, batch_size=_BATCH, shuffle=True, generator=7, num_workers=workers, **kwargs
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """The unfaulted run's batches (in process: the same as with any workers)."""
    return [b.tobytes() for b in _loader(Augments(tmp_path_factory.mktemp("ref")), workers=0)]


_NEEDS = {"memory": pytest.mark.skipif(_LIBSTDCXX is None, reason="no libstdc++ to allocate")}
_CAUSES = {
    "sigkill": "killed by SIGKILL",
    "segfault": "killed by SIGSEGV",
    "exit": "exit code 3",
    "memory": "killed by SIGABRT",
}


@pytest.mark.parametrize("how", [pytest.param(h, marks=_NEEDS.get(h, ())) for h in _CAUSES])
def test_a_dead_fork_worker_is_replaced_and_the_batches_are_unchanged(
    how: str, tmp_path: Path, reference: list[bytes]
) -> None:
    """A fork worker dying in the middle of a batch (each cause): a new one with the same
    id runs worker_init_fn, takes the dead one's tasks, and every batch arrives once, equal
    to the unfaulted run's; statistics() and the log name the cause."""
    loader = _loader(
        Augments(tmp_path, deaths={13: how}),
        worker_init_fn=InitLog(tmp_path),
        multiprocessing_context="fork",
        worker_restarts=1,
    )
    got = [b.tobytes() for b in loader]
    assert got == reference
    (cause,) = loader.statistics().worker_restarts
    assert re.fullmatch(rf"worker (\d) \(pid \d+\): {_CAUSES[how]}", cause)
    inits = sorted(p.name.split("-")[1] for p in tmp_path.glob("init-*"))
    assert inits == sorted(["0", "1", cause[7]])  # the new worker is the dead one's id


def test_out_of_order_delivery_gets_each_batch_once(tmp_path: Path, reference: list[bytes]) -> None:
    """in_order=False: the batches come as they are loaded, each once, the same bytes."""
    loader = _loader(Augments(tmp_path, deaths={13: "segfault"}), in_order=False, worker_restarts=1)
    assert sorted(b.tobytes() for b in loader) == sorted(reference)
    assert len(loader.statistics().worker_restarts) == 1


def test_spawn_workers_dying_every_way_in_one_epoch(tmp_path: Path, reference: list[bytes]) -> None:
    """Spawned workers: four deaths of four causes in one epoch, four restarts, the
    batches of the unfaulted run (the torch front door: tensors, the same values)."""
    deaths = {3: "sigkill", 12: "segfault", 21: "exit"}
    if _LIBSTDCXX is not None:
        deaths[30] = "memory"
    loader = stoker.torch.DataLoader(
        Augments(tmp_path, deaths=deaths),
        batch_size=_BATCH,
        shuffle=True,
        generator=7,
        num_workers=1,  # each start imports torch: one worker, and a new one per death
        multiprocessing_context="spawn",
        worker_restarts=len(deaths),
    )
    got = [b.numpy().tobytes() for b in loader]
    assert got == reference
    causes = loader.statistics().worker_restarts
    assert sorted(c.split(": ")[1] for c in causes) == sorted(_CAUSES[h] for h in deaths.values())


def test_a_poisoned_sample_is_named_by_index(tmp_path: Path, reference: list[bytes]) -> None:
    """A sample that kills every worker that loads it: the batches before it arrive, then
    its batch raises WorkerError naming the sample (found by loading halves of the batch
    in fresh workers); one restart suffices."""
    it = iter(_loader(Augments(tmp_path, poison={13: "segfault"}), worker_restarts=1))
    got = []
    with pytest.raises(
        WorkerError, match=r"sample 13 killed every worker that loaded it \(killed by SIGSEGV\)"
    ):
        got.extend(b.tobytes() for b in it)
    assert got == reference[: len(got)]
    assert 13 in np.frombuffer(reference[len(got)]).reshape(-1, 4)[:, 0]  # the batch that raised


def test_a_poisoned_sample_is_skipped_with_skip_errors(
    tmp_path: Path, reference: list[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    """With skip_errors, the poisoned sample is left out of its batch as a failing sample
    is: counted, in state_dict(), logged; every other batch is the unfaulted run's."""
    loader = _loader(Augments(tmp_path, poison={13: "sigkill"}), worker_restarts=1, skip_errors=1)
    with caplog.at_level(logging.WARNING):
        got = [b for b in loader]
    assert loader.statistics().skipped_samples == 1
    assert len(got) == len(reference)
    (poisoned,) = [k for k, b in enumerate(got) if b.tobytes() != reference[k]]
    samples = np.frombuffer(reference[poisoned]).reshape(-1, 4)[:, 0]
    assert 13 in samples and got[poisoned][:, 0].tolist() == [s for s in samples if s != 13]
    assert re.search(r"DataLoader worker \d \(pid \d+\) was killed by SIGKILL; a new", caplog.text)
    assert "skipped 1 sample(s)" in caplog.text


def test_the_skip_is_kept_in_the_checkpoint(tmp_path: Path) -> None:
    """state_dict() after the poisoned batch counts its skipped sample."""
    loader = _loader(Augments(tmp_path, poison={13: "exit"}), worker_restarts=1, skip_errors=1)
    for _ in loader:
        if loader.statistics().skipped_samples:
            break
    assert loader.state_dict()["skipped"] == 1


def test_a_resume_leaves_the_poisoned_sample_out_without_a_death(tmp_path: Path) -> None:
    """The checkpoint names the sample found to kill; a loader resumed from it (no
    restarts allowed) leaves it out of the next epoch at once, as the first loader does."""
    first = _loader(Augments(tmp_path, poison={13: "segfault"}), worker_restarts=1, skip_errors=1)
    list(first)
    state = first.state_dict()
    assert state["poisoned"] == [13]
    again = [b.tobytes() for b in first]  # epoch 1: no worker dies now
    assert first.statistics().worker_restarts == () and first.statistics().skipped_samples == 1
    resumed = _loader(Augments(tmp_path, poison={13: "segfault"}), skip_errors=1)
    resumed.load_state_dict(state)
    assert [b.tobytes() for b in resumed] == again


def test_persistent_workers_get_the_restarts_anew_each_epoch(tmp_path: Path) -> None:
    """The budget is per epoch: persistent workers that lose one worker in each of two
    epochs, with worker_restarts=1, give both epochs as in process."""
    dying = Augments(tmp_path, deaths={5: "sigkill"})
    loader = _loader(dying, persistent_workers=True, worker_restarts=1)
    ref = _loader(Augments(tmp_path), workers=0)
    for _ in range(2):
        got = [b.tobytes() for b in loader]
        assert len(loader.statistics().worker_restarts) == 1
        assert got == [b.tobytes() for b in ref]
        os.remove(tmp_path / "died-5")  # sample 5 kills its worker once more
    del loader


def test_restarts_run_out_with_todays_error(tmp_path: Path) -> None:
    """More deaths than worker_restarts: torch's phrase, then how many restarts were made."""
    loader = _loader(Augments(tmp_path, deaths={5: "sigkill", 22: "sigkill"}), worker_restarts=1)
    with pytest.raises(
        WorkerError,
        match=r"DataLoader worker \(pid \d+\) is killed by signal: Killed\. .*restarted 1 dead "
        r"worker\(s\) this epoch, as many as worker_restarts=1 allows",
    ):
        list(loader)


def test_a_killed_worker_of_grouped_tiny_batches_is_replaced() -> None:
    """An outside SIGKILL (the OOM killer) of a worker loading groups of tiny batches
    (stoker's own code only: one task per group): every batch once, in order."""
    data = np.arange(4000, dtype=np.int64)
    loader = stoker.DataLoader(
        stoker.TensorDataset(data), batch_size=2, num_workers=2, worker_restarts=1
    )
    loader._memory.task_group = 8  # as an earlier epoch measures tiny batches: 8 a task
    it = iter(loader)
    got = [next(it) for _ in range(300)]
    assert it._dispatch.group == 8  # grouping is on
    os.kill(it._workers[0].pid, signal.SIGKILL)
    got += list(it)
    assert np.concatenate([x for (x,) in got]).tolist() == data.tolist()
    assert len(loader.statistics().worker_restarts) == 1


class SlowTail:
    """40 samples of 4 ms each (batches of 8 are slow enough to split at an epoch's tail),
    which promise not to depend on their worker, so stoker splits them; from the epoch in
    which the folder holds "armed", the last sample kills its worker the first time."""

    _stoker_worker_agnostic = True

    def __init__(self, marks: Path) -> None:
        self.marks = str(marks)

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> dict[str, Any]:
        time.sleep(0.004)  # the sample's load time, not a wait for anything
        if i == 39 and os.path.exists(os.path.join(self.marks, "armed")):
            with contextlib.suppress(FileExistsError):
                os.close(os.open(os.path.join(self.marks, "died"), os.O_CREAT | os.O_EXCL))
                os.kill(os.getpid(), signal.SIGKILL)
        return {"x": np.full(3, i, np.float32), "pid": os.getpid()}


def test_a_worker_dying_on_a_part_of_a_split_tail_batch(tmp_path: Path) -> None:
    """A worker killed while it loads a part of a batch split at the epoch's tail: the part
    is issued again to the new worker and the batch joined, equal to the unsplit one."""
    loader = stoker.DataLoader(
        SlowTail(tmp_path), batch_size=8, num_workers=4, persistent_workers=True, worker_restarts=1
    )
    list(loader)  # the first epoch learns that batches are slow and leave the RNGs alone
    Path(tmp_path, "armed").touch()
    got = list(loader)
    assert Path(tmp_path, "died").exists() and len(loader.statistics().worker_restarts) == 1
    assert max(len(set(b["pid"].tolist())) for b in got) >= 2  # a batch came in parts
    want = np.arange(40, dtype=np.float32).repeat(3).reshape(5, 8, 3)
    assert np.array_equal(np.stack([b["x"] for b in got]), want)
    del loader


def test_worker_restarts_is_refused_where_nothing_can_be_restarted() -> None:
    """Threads cannot be killed alone, an iterable dataset's worker holds its place in the
    stream, and num_workers=0 has no workers: each a ValueError saying so."""
    with pytest.raises(ValueError, match="a thread cannot be killed alone"):
        stoker.DataLoader(np.arange(4), num_workers=1, worker_mode="thread", worker_restarts=1)
    with pytest.raises(ValueError, match="IterableDataset's worker holds its place"):
        stoker.DataLoader(stoker.ShardedIterable(range(4)), num_workers=1, worker_restarts=1)
    with pytest.raises(ValueError, match="no worker to replace"):
        stoker.torch.DataLoader(np.arange(4), worker_restarts=1)
    with pytest.raises(TypeError, match="worker_restarts must be an int"):
        stoker.DataLoader(np.arange(4), num_workers=1, worker_restarts=1.5)  # type: ignore[arg-type]


def test_the_cause_names_the_oom_killer_where_the_kernel_counted_a_kill() -> None:
    """SIGKILL while the kernel's OOM-kill count rose is the OOM killer's; other deaths say
    their signal or exit code."""
    assert death_cause(-9, 1, 2) == "killed by SIGKILL (the kernel OOM killer)"
    assert death_cause(-9, 1, 1) == "killed by SIGKILL"
    assert death_cause(-6, 1, 2) == "killed by SIGABRT"
    assert death_cause(0, None, None) == "exit code 0"


# -- the healer's bookkeeping alone (no process) ----------------------------------------


class _Posts:
    """The healer's ``post``: what it sent to which worker, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, list[Task]]] = []

    def __call__(self, wid: int, tasks: list[Task]) -> None:
        self.sent.append((wid, tasks))


def _healer(skip: bool = False, budget: int = 1) -> tuple[Healer, _Posts]:
    posts = _Posts()
    return Healer(budget, skip, posts, set()), posts


def _loaded(task: Task, generation: int | None = None) -> Loaded:
    gen = task.generation if generation is None else generation
    return Loaded(
        generation=gen, idx=task.idx, batch=object(), busy=0.0, skipped=None, untouched=None
    )


def test_the_healer_issues_the_unanswered_tasks_again_in_order() -> None:
    """Answered tasks are not issued again; a group goes batch by batch, each under the
    seed the group gave it; a death past the budget is refused (the pool raises)."""
    healer, posts = _healer()
    a = Task(generation=1, idx=0, task=[0, 1], seed=BatchSeed(seed=11))
    b = Task(generation=1, idx=1, task=[2, 3], seed=BatchSeed(seed=12))
    seeds = GroupSeeds(base=9, epoch=0, ks=[2, 3])
    group = Task(generation=1, idx=2, task=[np.array([4]), np.array([5])], seed=seeds)
    assert healer.sent(0, [a, b, group]) == [a, b, group]
    assert healer.answered(0, _loaded(a)) is not None
    assert healer.died(0, -9, "worker 0 (pid 1)") == "worker 0 (pid 1): killed by SIGKILL"
    healer.restarted(0)
    (wid, again), *_ = posts.sent
    singles = [
        Task(generation=1, idx=2, task=group.task[0], seed=BatchSeed(seed=mix_seed(9, 0, 2))),
        Task(generation=1, idx=3, task=group.task[1], seed=BatchSeed(seed=mix_seed(9, 0, 3))),
    ]
    assert (
        wid == 0
        and again[0] == b
        and [(t.idx, t.seed) for t in again[1:]] == [(t.idx, t.seed) for t in singles]
    )
    healer.answered(0, _loaded(b))
    assert healer.died(0, -9, "worker 0 (pid 2)") is None  # not b again: a restart, the 2nd
    assert "restarted 1 dead worker(s)" in healer.spent()


def test_the_healer_isolates_a_sample_by_halves() -> None:
    """A task blamed twice: halves of it go alone to fresh workers; the half that kills is
    halved again until one sample is left, which its batch's error names."""
    healer, posts = _healer()
    task = Task(generation=1, idx=0, task=np.array([10, 11, 12, 13]), seed=BatchSeed(seed=5))
    healer.sent(0, [task])
    healer.died(0, -11, "worker 0")  # restart 1, the task blamed
    healer.restarted(0)
    healer.died(0, -11, "worker 0")  # blamed again: isolate
    healer.restarted(0)
    probes = lambda: posts.sent[-1][1][0].task.tolist()  # noqa: E731
    assert probes() == [10, 11]
    autotune = Probe(
        generation=PROBE, samples=1, wall=0.0, cpu=0.0, rest_wall=0.0, rest_cpu=0.0, threads=1,
        batch_len=2, nbytes=0,
    )
    assert healer.answered(0, autotune) is None and probes() == [10, 11]  # not an answer
    assert healer.answered(0, _loaded(posts.sent[-1][1][0])) is None  # [10, 11] loads
    assert probes() == [12, 13]
    healer.died(0, -11, "worker 0")
    healer.restarted(0)
    assert probes() == [12]
    assert healer.answered(0, _loaded(posts.sent[-1][1][0])) is None  # [12] loads
    assert probes() == [13]
    healer.died(0, -11, "worker 0")
    healer.restarted(0)
    wid, failed = healer.take_ready()  # type: ignore[misc]
    assert (wid, failed.idx) == (0, 0)
    assert "sample 13 killed every worker" in str(failed.error.rebuild())
    assert posts.sent[-1] == (0, [])  # nothing else was held
