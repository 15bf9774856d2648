"""Differential tests: torch's worker semantics, run on torch.utils.data and on stoker.

Each scenario runs on ``torch.utils.data.DataLoader`` and on ``stoker.DataLoader`` and
compares what a user observes: which worker loads which batch (``get_worker_info().id``),
the order of ``in_order=False`` delivery, iterable datasets' per-epoch seeds, torch's
phrases in errors and warnings, and torch-only tensors crossing from workers. Waits across
workers are bounded (a barrier or an event with a timeout); nothing sleeps to synchronise.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import sys
import tempfile
import textwrap
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stoker
from _early import Job, finished, python_env, starts_early
from conftest import raised
from stoker._osprobe import available_cpus

torch = pytest.importorskip("torch")
tud = torch.utils.data

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.filterwarnings("ignore:This DataLoader will create"),
]

_WAIT_S = 60.0
"""Longest wait of a sample for the other workers (a hang shows as BrokenBarrierError)."""


def _worker_id() -> int:
    """The calling worker's id, in a stoker worker (process or thread) or a torch one."""
    info = stoker.get_worker_info() or tud.get_worker_info()
    assert info is not None, "not in a worker"
    return int(info.id)


def _ids(batches: list[Any]) -> list[tuple[int, int]]:
    """(sample, worker id) of each batch of one-sample batches of [sample, worker id]."""
    return [(int(b[0][0]), int(b[0][1])) for b in batches]


class _Meet:
    """Every sample waits at a barrier of all the workers (bounded): only N workers that
    load concurrently get through. A sample is [index, worker id]."""

    def __init__(self, barrier: Any, n: int) -> None:
        self.barrier, self.n = barrier, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        self.barrier.wait(_WAIT_S)
        return np.array([i, _worker_id()])


_N = {"fork": 6, "spawn": 3, "thread": 6}
"""Workers of each mode in the test below. Spawned ones each import torch (seconds of CPU)
and start through the same code as forked ones: three are enough, more than CI's cores."""
# Made at import: multiprocessing's heap, where they live, keeps its arena (a descriptor)
# for the process's life. A barrier resets after each round, so tests can share them.
_BARRIERS = {
    "fork": multiprocessing.get_context("fork").Barrier(_N["fork"]),
    "spawn": multiprocessing.get_context("spawn").Barrier(_N["spawn"]),
    "thread": threading.Barrier(_N["thread"]),
}


_SLOW = pytest.mark.slow  # spawned workers import numpy, stoker and torch: seconds each


@pytest.mark.parametrize("mode", ["fork", pytest.param("spawn", marks=_SLOW), "thread"])
def test_every_worker_gets_its_first_batch_at_once(mode: str) -> None:
    """With 6 workers (3 spawned; on any core count), samples that meet across all the
    workers load, as with torch: every worker starts at once and gets a batch of the first
    round."""
    if mode == "thread":
        kw: dict[str, Any] = {"worker_mode": "thread"}
    else:
        kw = {"multiprocessing_context": mode}
    n = _N[mode]
    ds = _Meet(_BARRIERS[mode], 2 * n)
    got = list(stoker.DataLoader(ds, batch_size=1, num_workers=n, **kw))
    want = [(k, k % n) for k in range(2 * n)]
    assert _ids(got) == want
    if mode == "fork":  # torch, the same
        theirs = tud.DataLoader(ds, batch_size=1, num_workers=n, multiprocessing_context="fork")
        assert _ids(list(theirs)) == want


class _WhoLoads:
    """Sample i is [i, the id of the worker that loaded it]."""

    def __len__(self) -> int:
        return 11

    def __getitem__(self, i: int) -> Any:
        return np.array([i, _worker_id()])


@pytest.mark.parametrize("kw", [{}, {"worker_mode": "thread"}, {"persistent_workers": True}])
def test_batches_go_round_robin_as_torch_sends_them(kw: dict[str, Any]) -> None:
    """Batch k is loaded by worker k % num_workers, in every epoch, as with torch."""
    loader = stoker.DataLoader(_WhoLoads(), batch_size=1, num_workers=3, **kw)
    theirs = tud.DataLoader(
        _WhoLoads(),
        batch_size=1,
        num_workers=3,
        persistent_workers=bool(kw.get("persistent_workers")),
    )
    want = _ids(list(theirs))
    assert want == [(k, k % 3) for k in range(11)]
    for _ in range(2):
        assert _ids(list(loader)) == want


class _FirstWaitsForRelease:
    """Sample 0 waits (bounded) until the consumer has taken three batches: with
    in_order=False those must be the other worker's, delivered as they come. A sample is
    [i, worker id]."""

    def __init__(self, released: Any) -> None:
        self.released = released

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> Any:
        if i == 0:
            assert self.released.wait(_WAIT_S), "the consumer never took three batches"
        return np.array([i, _worker_id()])


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_in_order_false_delivers_the_first_ready_as_torch(mode: str) -> None:
    """in_order=False: while worker 0 waits on sample 0, worker 1's batches come first,
    and the next tasks go to worker 1 (worker 0 holds its share of the window), as torch.
    Sample 0 is released only once three batches reached the consumer, so no timing of
    the workers or of the main process can reorder them."""

    def run(make: Any, released: Any, **kw: Any) -> list[tuple[int, int]]:
        ds = _FirstWaitsForRelease(released)
        batches = []
        for batch in make(ds, batch_size=1, num_workers=2, in_order=False, **kw):
            batches.append(batch)
            if len(batches) == 3:
                released.set()
        return _ids(batches)

    if mode == "thread":
        got = run(stoker.DataLoader, threading.Event(), worker_mode="thread")
    else:
        got = run(stoker.DataLoader, multiprocessing.Event())
    want = run(tud.DataLoader, multiprocessing.Event())
    assert want[:3] == [(1, 1), (3, 1), (4, 1)]  # torch's: the first ready
    assert got[:3] == want[:3]
    assert sorted(got) == sorted(want) == [(0, 0), (1, 1), (2, 0), (3, 1), (4, 1), (5, 1)]


class _Uneven(tud.IterableDataset):  # type: ignore[misc]
    """Worker w yields COUNTS[w] items (w, j): the workers run out at different times."""

    COUNTS = (1, 4, 2)

    def __iter__(self) -> Any:
        wid = _worker_id()
        return iter([np.array([wid, j]) for j in range(self.COUNTS[wid])])


@pytest.mark.parametrize("kw", [{}, {"persistent_workers": True}, {"worker_mode": "thread"}])
def test_an_iterable_whose_workers_run_out_unevenly_ends_as_torch(kw: dict[str, Any]) -> None:
    """Round robin over the workers that still have data, as torch: the same items in the
    same order, epoch after epoch."""
    persistent = bool(kw.get("persistent_workers"))
    theirs = tud.DataLoader(
        _Uneven(), batch_size=None, num_workers=3, persistent_workers=persistent
    )
    want = [b.tolist() for b in theirs]
    assert sorted(want) == sorted([w, j] for w, c in enumerate(_Uneven.COUNTS) for j in range(c))
    loader = stoker.DataLoader(_Uneven(), batch_size=None, num_workers=3, **kw)
    for _ in range(2):
        assert [b.tolist() for b in loader] == want


class _SeedsInIter(tud.IterableDataset):  # type: ignore[misc]
    """Yields, once per worker, (worker id, get_worker_info().seed, torch.initial_seed())
    as __iter__ sees them."""

    def __iter__(self) -> Any:
        info = stoker.get_worker_info() or tud.get_worker_info()
        yield np.array([info.id, info.seed, torch.initial_seed()], dtype=np.uint64)


def _epoch_seeds(loader: Any) -> list[list[list[int]]]:
    return [sorted(b.tolist() for b in loader) for _ in range(2)]


@pytest.mark.parametrize("persistent", [False, True])
def test_iterable_worker_seeds_change_every_epoch(persistent: bool) -> None:
    """get_worker_info().seed and torch.initial_seed() in an IterableDataset's __iter__
    change from one epoch to the next, with fresh workers as torch's do and with persistent
    ones too (a difference: torch's persistent workers keep their seed); in each epoch they
    are equal, as torch's, and differ between workers."""
    kw = {"batch_size": None, "num_workers": 2, "persistent_workers": persistent}
    first, second = _epoch_seeds(stoker.DataLoader(_SeedsInIter(), **kw))
    t_first, t_second = _epoch_seeds(tud.DataLoader(_SeedsInIter(), **kw))
    for epoch in (first, second, t_first, t_second):
        assert [w for w, _, _ in epoch] == [0, 1]
        assert all(seed == initial for _, seed, initial in epoch)
        assert epoch[0][1] != epoch[1][1]
    assert first != second
    assert (t_first == t_second) is persistent  # torch's persistent workers keep theirs


def test_iterable_thread_worker_seeds_change_every_epoch() -> None:
    """Thread workers' get_worker_info().seed changes every epoch too (their global RNGs
    are seeded per batch: threads share them)."""
    loader = stoker.DataLoader(
        _SeedsInIter(),
        batch_size=None,
        num_workers=2,
        worker_mode="thread",
        persistent_workers=True,
    )
    first, second = _epoch_seeds(loader)
    assert [s for _, s, _ in first] != [s for _, s, _ in second]


def _chain_text(exc: BaseException | None) -> str:
    """str() of an exception and of its causes and contexts."""
    parts = []
    while exc is not None:
        parts.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


class _Dies:
    """Sample 3 kills its worker process with SIGKILL."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        if i == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return np.array(i)


def test_a_killed_worker_raises_with_torchs_phrase() -> None:
    """A worker killed by a signal raises RuntimeError with torch's "DataLoader worker (pid
    N) is killed by signal: " (torch puts it in the cause), then stoker's explanation."""
    phrase = r"DataLoader worker \(pid \d+\) is killed by signal: Killed\. "
    loader = tud.DataLoader(_Dies(), batch_size=1, num_workers=2)
    theirs = raised(RuntimeError, lambda: list(loader))
    assert re.search(phrase, _chain_text(theirs))
    with pytest.raises(RuntimeError, match=phrase + r"Worker 1 exited unexpectedly.*SIGKILL"):
        list(stoker.DataLoader(_Dies(), batch_size=1, num_workers=2))


def test_too_many_workers_warn_with_torchs_phrase() -> None:
    """More workers than CPUs warns with torch's sentence when an iterator starts them."""
    n = available_cpus() + 1
    seen = {}
    for name, make in (("torch", tud.DataLoader), ("stoker", stoker.DataLoader)):
        loader = make(_WhoLoads(), batch_size=4, num_workers=n)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            next(iter(loader))
        seen[name] = [
            str(w.message) for w in caught if "worker processes in total" in str(w.message)
        ]
    phrase = (
        f"This DataLoader will create {n} worker processes in total. Our suggested max number "
        f"of worker in current system is {n - 1}"
    )
    if len(os.sched_getaffinity(0)) == n - 1:  # torch counts the affinity mask only
        assert len(seen["torch"]) == 1 and phrase in seen["torch"][0]
    assert len(seen["stoker"]) == 1 and phrase in seen["stoker"][0]


class _Raises:
    """Sample 4 raises ValueError."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        if i == 4:
            raise ValueError(f"sample {i} is corrupt")
        return np.array(i)


def test_a_worker_exception_names_worker_and_sample_in_its_message() -> None:
    """str(exc) of a worker's exception has torch's "Caught ValueError in DataLoader worker
    process 0" (the same worker as torch's), then the pid, the sample indices and the
    original message; the type is the original one."""
    loader = tud.DataLoader(_Raises(), batch_size=2, num_workers=2)
    theirs = raised(ValueError, lambda: list(loader))
    with pytest.raises(ValueError) as ours:
        list(stoker.DataLoader(_Raises(), batch_size=2, num_workers=2))
    phrase = "Caught ValueError in DataLoader worker process 0"
    assert phrase in str(theirs)
    text = str(ours.value)
    assert text.startswith(phrase + " (pid ")
    assert "on sample indices [4, 5]: sample 4 is corrupt" in text


class _Nested:
    """Samples that are nested tensors (and an int)."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Any:
        return {
            "x": torch.nested.nested_tensor([torch.full((2,), float(i)), torch.ones(3)]),
            "i": i,
        }


def _unbound(batches: list[Any]) -> list[Any]:
    return [([t.tolist() for t in b["x"].unbind()], b["i"]) for b in batches]


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("method", ["fork", pytest.param("spawn", marks=_SLOW)])
def test_nested_tensors_cross_from_workers(method: str) -> None:
    """Nested tensors returned by samples come back from workers as torch's do. They are
    pickled by value (no start method's own reduction), so spawn stands for forkserver: a
    worker that did not inherit torch imports it before the batch."""
    kw = {"batch_size": None, "num_workers": 2, "multiprocessing_context": method}
    got = list(stoker.DataLoader(_Nested(), **kw))
    assert all(b["x"].is_nested for b in got)
    want = _unbound(list(tud.DataLoader(_Nested(), **{**kw, "multiprocessing_context": "fork"})))
    assert _unbound(got) == want == [([[float(i)] * 2, [1.0] * 3], i) for i in range(4)]


_LOW_NOFILE = """
import resource, sys
import torch
import stoker

class Many:
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {f"t{j}": torch.full((4,), i) for j in range(40)}

resource.setrlimit(resource.RLIMIT_NOFILE, (100, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
batches = list(stoker.DataLoader(Many(), batch_size=4, num_workers=2, timeout=60))
assert len(batches) == 16 and len(batches[0]) == 40, batches
assert batches[-1]["t39"][-1].tolist() == [63] * 4
print("ok")
"""


def _low_nofile(tmp: Path) -> Job:
    """_LOW_NOFILE in a fresh interpreter, as the session starts (see tests/_early.py)."""
    code = textwrap.dedent(_LOW_NOFILE)
    return Job([[sys.executable, "-c", code]], python_env(PYTHONWARNINGS="ignore"))


@starts_early(_low_nofile)
def test_many_tensors_load_under_a_low_open_file_limit(request: pytest.FixtureRequest) -> None:
    """A process limited to 100 open files loads batches of 40 tensors through workers
    (torch sends a descriptor per tensor and times out here: a difference, for the better;
    stoker's tensors share a slot)."""
    run = finished(request, timeout=110)
    assert run.returncode == 0, run.output[-2000:]
    assert run.output.splitlines()[-1:] == ["ok"], run.output[-2000:]


def test_batches_from_workers_are_in_shared_memory_but_not_torchs() -> None:
    """torch's worker batches say is_shared(); stoker's are views of its shared-memory
    slots, which torch cannot tell (a documented difference): share_memory_() makes one
    torch's shared tensor, with the same values."""
    x = torch.arange(40.0).reshape(20, 2)
    (theirs,) = next(iter(tud.DataLoader(tud.TensorDataset(x), batch_size=4, num_workers=2)))
    (ours,) = next(iter(stoker.DataLoader(stoker.TensorDataset(x), batch_size=4, num_workers=2)))
    assert theirs.is_shared() and not ours.is_shared()
    assert ours.clone().share_memory_().is_shared()
    assert torch.equal(ours, theirs)


class _Memmapped:
    """Samples are rows of an np.memmap."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        return np.memmap(self.path, dtype=np.float32, mode="r", shape=(8, 3))[i]


def test_memmap_samples_collate_as_torch() -> None:
    """np.memmap samples through workers: torch tensors equal to torch's with
    tensor_type="torch"; NumPy arrays (not memmaps) by the tensor_type rule otherwise."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rows.f32")
        np.arange(24, dtype=np.float32).tofile(path)
        want = list(tud.DataLoader(_Memmapped(path), batch_size=4, num_workers=2))
        got = list(
            stoker.DataLoader(_Memmapped(path), batch_size=4, num_workers=2, tensor_type="torch")
        )
        plain = list(stoker.DataLoader(_Memmapped(path), batch_size=4, num_workers=2))
    assert all(type(b) is torch.Tensor and b.dtype == torch.float32 for b in got)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert all(type(b) is np.ndarray for b in plain)
    assert [b.tolist() for b in plain] == [b.tolist() for b in want]
