"""The drop-in's last mile, differentially: the moment samplers draw, torch's phrases in
collate, StackDataset and the IterableDataset length warning, the too-many-workers warning
at construction, and ``iterator._workers``.

Each scenario runs on ``torch.utils.data`` and on stoker (both front doors where they
differ) and compares what a user observes: indices, exception types and phrases, the
moment a warning or a draw happens.
"""

from __future__ import annotations

import json
import multiprocessing
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import stoker
import stoker.torch as st
from test_torch_errors import _overrunning

torch = pytest.importorskip("torch")
td = torch.utils.data

MODULES = {"torch": td, "stoker": stoker, "stoker.torch": st}

SAMPLERS: dict[str, Callable[[Any, Any], Any]] = {
    "random": lambda m, g: m.RandomSampler(range(11), generator=g),
    "random_replacement": lambda m, g: m.RandomSampler(range(11), True, 40, generator=g),
    "subset": lambda m, g: m.SubsetRandomSampler([5, 3, 17, 2, 11, 8], generator=g),
    "weighted": lambda m, g: m.WeightedRandomSampler([0.5, 2, 0, 3, 1], 9, generator=g),
    "batch": lambda m, g: m.BatchSampler(m.RandomSampler(range(11), generator=g), 3, False),
}


def _as_list(x: Any) -> Any:
    return [int(i) for i in x] if isinstance(x, list) else int(x)


def _seed_between(make: Callable[[Any, Any], Any], m: Any, shared: bool) -> list[Any]:
    """``it = iter(sampler)``, then the stream is seeded, then the epoch is read."""
    torch.manual_seed(5)
    g = torch.Generator().manual_seed(1) if shared else None
    it = iter(make(m, g))
    if g is not None:
        g.manual_seed(77)
    torch.manual_seed(0)
    return [_as_list(x) for x in it]


@pytest.mark.parametrize("shared", [False, True], ids=["global", "generator"])
@pytest.mark.parametrize("name", list(SAMPLERS))
def test_samplers_draw_at_the_first_next_as_torch(name: str, shared: bool) -> None:
    """A seed set between iter() and the first next() decides the epoch, as in torch
    (whose __iter__ is a generator): stoker's samplers draw at the first next() too."""
    theirs = _seed_between(SAMPLERS[name], td, shared)
    for m in (stoker, st):
        assert _seed_between(SAMPLERS[name], m, shared) == theirs


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_interleaved_iterators_of_one_sampler_as_torch(name: str) -> None:
    """Two iterators of one sampler on one generator, the second read first, give
    torch's epochs (the first next() of each draws)."""

    def run(m: Any) -> list[Any]:
        s = SAMPLERS[name](m, torch.Generator().manual_seed(3))
        a, b = iter(s), iter(s)
        second = [_as_list(x) for x in b]
        return [[_as_list(x) for x in a], second]

    theirs = run(td)
    assert run(stoker) == theirs and run(st) == theirs


def _two_loaders(m: Any, workers: int, draw_between: bool) -> list[list[int]]:
    """Two shuffling loaders on one generator; iterators made, then (perhaps) a draw from
    the generator, then the second read before the first."""
    g = torch.Generator().manual_seed(11)
    kw: dict[str, Any] = {"batch_size": 3, "shuffle": True, "generator": g}
    if workers:
        kw["num_workers"] = workers
    first, second = m.DataLoader(list(range(14)), **kw), m.DataLoader(list(range(14)), **kw)
    a, b = iter(first), iter(second)
    if draw_between:
        torch.randint(0, 10, (5,), generator=g)
    out_b = [int(i) for batch in b for i in batch]
    return [[int(i) for batch in a for i in batch], out_b]


@pytest.mark.parametrize("draw_between", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_loaders_sharing_a_generator_order_as_torch(workers: int, draw_between: bool) -> None:
    """Loaders sharing one torch.Generator, or a draw from it between iter() and the
    first next(), give torch's orders: in process the sampler draws at the first next(),
    with workers at iter() (torch's prefetch), each after the iterator's own seed draw."""
    if workers:
        pytest.importorskip("multiprocessing")
    theirs = _two_loaders(td, workers, draw_between)
    for m in (stoker, st):
        assert _two_loaders(m, workers, draw_between) == theirs


@pytest.mark.parametrize("workers", [0, 2])
def test_zipped_loaders_on_one_generator_order_as_torch(workers: int) -> None:
    """zip() of two shuffling loaders on one generator (batch by batch, in turns): each
    epoch's orders are torch's, also where a sampler draws two permutations an epoch."""

    def run(m: Any) -> list[Any]:
        g = torch.Generator().manual_seed(4)
        kw: dict[str, Any] = {"batch_size": 4, "generator": g, "num_workers": workers}
        a = m.DataLoader(list(range(10)), shuffle=True, **kw)
        b = m.DataLoader(list(range(7)), sampler=m.RandomSampler(range(7), num_samples=12,
                                                                  generator=g), **kw)
        return [[(x.tolist(), y.tolist()) for x, y in zip(a, b, strict=False)] for _ in range(2)]

    assert run(stoker) == run(td) == run(st)


@pytest.mark.parametrize("stream", ["generator", "global", "seed"])
def test_checkpoint_between_iter_and_first_next_resumes_exactly(stream: str) -> None:
    """A state_dict() after iter() and a draw, before the first next(), resumes the epoch
    that iterator gives, on another loader (whatever its generator)."""

    def make(gen: Any) -> Any:
        return st.DataLoader(list(range(17)), batch_size=4, shuffle=True, generator=gen)

    torch.manual_seed(2)
    g = {"generator": torch.Generator().manual_seed(9), "global": None, "seed": 4}[stream]
    loader = make(g)
    it = iter(loader)
    if isinstance(g, torch.Generator):
        g.manual_seed(123)
    torch.manual_seed(321)
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["in_epoch"]
    torch.manual_seed(321)
    expected = [b.tolist() for b in it]
    fresh = make(torch.Generator() if stream == "generator" else 8)
    fresh.load_state_dict(state)
    assert [b.tolist() for b in fresh] == expected


# -- torch's phrases -------------------------------------------------------------------


def _outcome(fn: Callable[[], Any]) -> BaseException:
    try:
        fn()
    except Exception as exc:
        return exc
    raise AssertionError("nothing raised")


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_nested_tensors_in_default_collate_raise_torchs_error() -> None:
    """A batch of nested tensors: torch's RuntimeError and phrase, in both front doors
    and through a loader (at the first next())."""
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.ones(3)])
    phrase = "not currently supported by the default collate_fn"
    theirs = _outcome(lambda: td.default_collate([nested, nested]))
    assert type(theirs) is RuntimeError and phrase in str(theirs)
    for collate in (stoker.default_collate, st.default_collate):
        ours = _outcome(lambda c=collate: c([nested, nested]))  # type: ignore[misc]
        assert isinstance(ours, RuntimeError) and phrase in str(ours)
        assert "nested" in str(ours) and "collate_fn" in str(ours)
    for m in (td, st):
        it = iter(m.DataLoader([nested, nested], batch_size=2))
        assert phrase in str(_outcome(lambda it=it: next(it)))  # type: ignore[misc]


class _Short:
    """A dataset whose ``__getitems__`` returns one sample too few."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return i

    def __getitems__(self, indices: list[int]) -> list[int]:
        return list(indices)[:-1]


@pytest.mark.parametrize("m", [stoker, st], ids=["stoker", "stoker.torch"])
def test_stack_dataset_phrases_as_torch(m: Any) -> None:
    """StackDataset's "Nested dataset's output size mismatch" (a member's __getitems__
    returns too few) and "Supported either" (args and kwargs): torch's type and phrase."""
    for build, phrase in (
        (lambda mod: mod.StackDataset(_Short(), _Short()).__getitems__([0, 1, 2]),
         "Nested dataset's output size mismatch. Expected 3, got 2"),
        (lambda mod: mod.StackDataset(a=_Short()).__getitems__([0, 1]),
         "Nested dataset's output size mismatch. Expected 2, got 1"),
        (lambda mod: mod.StackDataset([1], a=[1]), "Supported either"),
    ):  # fmt: skip
        theirs, ours = _outcome(lambda b=build: b(td)), _outcome(lambda b=build: b(m))
        assert type(theirs) is ValueError and phrase in str(theirs)
        assert isinstance(ours, ValueError) and phrase in str(ours), ours


@pytest.mark.parametrize("m", [stoker, st], ids=["stoker", "stoker.torch"])
def test_iterable_length_warning_says_samples_as_torch(m: Any) -> None:
    """The overrun warning says "N samples have been fetched" as torch's does, at the same
    items, with the dataset and the length in torch's words."""
    said = {}
    for name, mod in (("torch", td), ("ours", m)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = mod.DataLoader(_overrunning(mod), batch_size=None)  # len 2, yields 4
            assert len(loader) == 2
            list(loader)
        said[name] = [str(w.message) for w in caught if "Length of Iterable" in str(w.message)]
    assert len(said["ours"]) == len(said["torch"]) == 2
    for k, text in enumerate(said["ours"]):
        for message in (said["torch"][k], text):
            assert "was reported to be 2" in message and "when accessing len(" in message
            assert f"but {3 + k} samples have been fetched" in message


# -- workers ---------------------------------------------------------------------------


def _worker_warnings(make: Callable[[], Any]) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make()
    return [w for w in caught if "worker processes in total" in str(w.message)]


def test_too_many_workers_warn_at_construction_as_the_installed_torch() -> None:
    """DataLoader(num_workers=1000) warns when it is made, as the installed torch does,
    with torch's phrase, pointing at the user's line; thread workers do not warn."""
    phrase = "excessive worker creation might get DataLoader running slow or even freeze"
    theirs = _worker_warnings(lambda: td.DataLoader(list(range(4)), num_workers=1000))
    for m in (stoker, st):
        ours = _worker_warnings(lambda m=m: m.DataLoader(list(range(4)), num_workers=1000))
        assert len(ours) == len(theirs)
        if theirs:
            assert phrase in str(theirs[0].message) and phrase in str(ours[0].message)
            assert ours[0].filename == __file__
    threads = _worker_warnings(
        lambda: stoker.DataLoader(list(range(4)), num_workers=1000, worker_mode="thread")
    )
    assert threads == []


class _Pid:
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        import os

        return np.array([i, os.getpid()])


@pytest.mark.multiprocess
def test_iterator_workers_are_processes_with_pids_as_torch() -> None:
    """iter(loader)._workers lists the worker processes (started, with the pids that load
    the batches), as torch's iterator does; in process there is none, as in torch."""
    for m in (td, st):
        it = iter(m.DataLoader(_Pid(), batch_size=2, num_workers=2))
        workers = it._workers
        assert len(workers) == 2
        assert all(isinstance(w, multiprocessing.process.BaseProcess) for w in workers)
        pids = {w.pid for w in workers}
        assert None not in pids and all(w.is_alive() for w in workers)
        assert {int(b[0][1]) for b in it} <= pids
        del it
        assert not hasattr(iter(m.DataLoader(_Pid())), "_workers")
    # a fixed count may load in process where only stoker's code runs: then no workers
    for _ in range(2):
        it = iter(st.DataLoader(st.TensorDataset(np.arange(8)), batch_size=2, num_workers=2))
        assert isinstance(it._workers, list)
        assert len(list(it)) == 4


def test_thread_workers_are_listed_as_threads() -> None:
    """With worker_mode="thread", _workers lists the worker threads (no pid: they are
    this process)."""
    it = iter(stoker.DataLoader(_Pid(), batch_size=2, num_workers=2, worker_mode="thread"))
    workers = it._workers
    assert len(workers) == 2 and all(isinstance(w, threading.Thread) for w in workers)
    assert all(w.is_alive() for w in workers)
    assert len(list(it)) == 4


def test_drawing_at_the_first_next_adds_no_reference_cycle() -> None:
    """The lazily drawn epoch holds neither the loader nor itself: a loader and its
    iterator, dropped mid-epoch, are freed at once, without the cyclic collector."""
    import gc
    import weakref

    gc.collect()
    gc.disable()
    try:
        loader = st.DataLoader(list(range(10)), batch_size=2, shuffle=True)
        it = iter(loader)
        next(it)
        refs = [weakref.ref(loader), weakref.ref(it), weakref.ref(loader._current)]
        del it, loader
        assert [r() for r in refs] == [None, None, None]
    finally:
        gc.enable()
