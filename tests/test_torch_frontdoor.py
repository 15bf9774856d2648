"""stoker.torch, the torch front door, against torch.utils.data: the same scenario on both
must give what a user observes the same (types, isinstance relations, signatures, orders,
batches, lengths, errors and warnings), and frameworks that rebuild loaders (Lightning)
must get a stoker.torch loader back, with stoker's extras still working."""

from __future__ import annotations

import importlib.util
import inspect
import pickle
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from _early import Job, finished, python_env, starts_early

torch = pytest.importorskip("torch")
import torch.utils.data as T  # noqa: E402

import stoker  # noqa: E402
import stoker.torch as S  # noqa: E402
from test_torch_collate import assert_same  # noqa: E402

API_CLASSES = [
    "Dataset", "IterableDataset", "TensorDataset", "ConcatDataset", "ChainDataset", "Subset",
    "StackDataset", "Sampler", "SequentialSampler", "RandomSampler", "SubsetRandomSampler",
    "WeightedRandomSampler", "BatchSampler", "DistributedSampler", "DataLoader",
]  # fmt: skip
API_FUNCTIONS = ["random_split", "default_collate", "default_convert", "get_worker_info"]
EXTRAS = ["ShardedIterable", "StringArray", "WorkerInfo", "LoaderStatistics"]
_SRC = str(Path(__file__).resolve().parents[1] / "src")


class Squares(T.Dataset[Any]):
    """A torch map-style dataset of NumPy samples."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return np.full(2, i * i, np.float32), i


class Stream(T.IterableDataset[int]):
    """A torch iterable dataset that yields more than its len() says."""

    def __init__(self, n: int, claimed: int) -> None:
        self.n, self.claimed = n, claimed

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.claimed


def test_names_are_torch_and_stoker_classes() -> None:
    """Every docs/contract.md name is in stoker.torch; each class subclasses torch's namesake and
    stoker's, and says it lives in stoker.torch; stoker's extras are there too."""
    assert S.__all__ == sorted(S.__all__)
    assert set(S.__all__) >= {*API_CLASSES, *API_FUNCTIONS, *EXTRAS}
    assert set(S.__all__) == set(stoker.__all__)
    for name in API_CLASSES:
        ours = getattr(S, name)
        assert issubclass(ours, getattr(T, name)), name
        assert issubclass(ours, getattr(stoker, name)), name
        assert (ours.__module__, ours.__qualname__) == ("stoker.torch", name)
    for name in API_CLASSES[1:7]:
        assert issubclass(getattr(S, name), S.Dataset), name
    for name in API_CLASSES[8:14]:
        assert issubclass(getattr(S, name), S.Sampler), name
    assert issubclass(S.ChainDataset, S.IterableDataset)
    assert issubclass(S.ShardedIterable, T.IterableDataset)
    for name in API_FUNCTIONS:
        assert callable(getattr(S, name)), name


def test_isinstance_relations_as_torch() -> None:
    """What frameworks test: loaders, datasets, samplers and splits are torch's types."""
    ds = S.TensorDataset(torch.arange(10))
    loader = S.DataLoader(ds, batch_size=4, shuffle=True)
    assert isinstance(loader, T.DataLoader) and isinstance(ds, T.Dataset)
    assert isinstance(loader.sampler, T.RandomSampler)
    assert isinstance(loader.batch_sampler, T.BatchSampler)
    assert isinstance(loader.batch_sampler.sampler, T.RandomSampler)
    assert isinstance(S.DataLoader(ds).sampler, T.SequentialSampler)
    assert isinstance(ds + ds, T.ConcatDataset) and isinstance(ds + ds, S.ConcatDataset)
    chained = S.IterableDataset.__add__(S.ChainDataset([]), S.ChainDataset([]))
    assert isinstance(chained, T.ChainDataset)
    splits = S.random_split(ds, [0.5, 0.5], generator=torch.Generator().manual_seed(0))
    assert all(isinstance(s, T.Subset) and isinstance(s, S.Subset) for s in splits)
    sampler = S.DistributedSampler(ds, num_replicas=2, rank=0)
    assert isinstance(sampler, T.DistributedSampler)


def _params(fn: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_signatures_and_defaults_as_torch() -> None:
    """torch's parameters come first with torch's names, kinds and defaults; DataLoader's
    own extras are keyword-only."""
    for name in [*API_CLASSES, *API_FUNCTIONS]:
        ours, theirs = getattr(S, name), getattr(T, name)
        if name in ("Sampler", "Dataset", "IterableDataset"):
            continue  # torch's take (*args, **kwargs) (object's) and ignore them
        if isinstance(ours, type):
            ours, theirs = ours.__init__, theirs.__init__
        expected = _params(theirs)
        if name == "random_split":  # torch's default is its global generator; None means it
            expected[-1] = (*expected[-1][:2], None)
        assert _params(ours)[: len(expected)] == expected, name
    extra = list(inspect.signature(S.DataLoader.__init__).parameters.values())[18:]
    assert [p.name for p in extra] == [
        "tensor_type",
        "worker_mode",
        "skip_errors",
        "snapshot_every_n_steps",
        "ray_options",
        "worker_restarts",
    ]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in extra)


def test_sequential_orders_batches_and_lengths_as_torch() -> None:
    """The same loader arguments give the same batches and len() on both."""
    configs: list[dict[str, Any]] = [
        {},
        {"batch_size": 3},
        {"batch_size": 3, "drop_last": True},
        {"batch_size": None},
        {"sampler": S.SequentialSampler(range(10)), "batch_size": 4},
        {"batch_sampler": [[3, 1], [0], [9, 8, 7]]},
    ]
    for kw in configs:
        theirs = T.DataLoader(Squares(), **kw)
        ours = S.DataLoader(Squares(), **kw)
        assert len(ours) == len(theirs), kw
        for a, b in zip(ours, theirs, strict=True):
            assert_same(a, b, str(kw))
    assert list(S.SequentialSampler(range(5))) == list(T.SequentialSampler(range(5)))
    batches = S.BatchSampler(S.SequentialSampler(range(5)), 2, False)
    assert list(batches) == list(T.BatchSampler(T.SequentialSampler(range(5)), 2, False))


def test_frozen_attributes_raise_as_torch() -> None:
    """Assigning the frozen attributes raises torch's ValueError and phrase; others work."""
    frozen = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset")
    for name in (*frozen, "persistent_workers"):
        for module in (T, S):
            loader = module.DataLoader(Squares(), num_workers=1)
            with pytest.raises(ValueError, match=f"{name} attribute should not be set after"):
                setattr(loader, name, None)
    loader = S.DataLoader(Squares())
    loader.num_workers = 0
    loader.collate_fn = S.default_collate


def test_iterable_length_warning_as_torch() -> None:
    """An iterable dataset yielding more than its len() gives torch's warning on both."""
    for module in (T, S):
        loader = module.DataLoader(Stream(5, 3), batch_size=None)
        assert len(loader) == 3
        with pytest.warns(UserWarning, match="Length of IterableDataset .* was reported to be 3"):
            assert list(loader) == list(range(5))


def test_pickles_name_stoker_torch() -> None:
    """Pickles of the classes name stoker.torch, and a fresh interpreter (as a spawned
    worker is) loads them."""
    objs = [
        S.TensorDataset(np.arange(4)),
        S.SequentialSampler(range(3)),
        S.BatchSampler(S.RandomSampler(range(3), generator=1), 2, False),
    ]
    for obj in objs:
        data = pickle.dumps(obj)
        assert b"stoker.torch" in data and b"stoker._" not in data, type(obj)
        assert type(pickle.loads(data)) is type(obj)
    code = (
        "import pickle, sys; objs = pickle.loads(sys.stdin.buffer.read()); "
        "print(*(f'{type(o).__module__}.{type(o).__name__}' for o in objs))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(objs), capture_output=True, timeout=120
    )
    assert out.returncode == 0, out.stderr.decode()
    expected = ["TensorDataset", "SequentialSampler", "BatchSampler"]
    assert out.stdout.decode().split() == [f"stoker.torch.{n}" for n in expected]


def test_stoker_extras_through_the_torch_door() -> None:
    """state_dict resume, skip_errors, thread workers and statistics() work on stoker.torch's
    loader, which keeps stoker's unseeded fast path for its TensorDataset."""
    ds = S.TensorDataset(np.arange(12, dtype=np.int64))
    full = [b[0].tolist() for b in S.DataLoader(ds, batch_size=3, shuffle=True, generator=7)]
    loader = S.DataLoader(ds, batch_size=3, shuffle=True, generator=7)
    it = iter(loader)
    first = [next(it)[0].tolist()]
    state = loader.state_dict()
    resumed = S.DataLoader(ds, batch_size=3, shuffle=True, generator=7)
    resumed.load_state_dict(state)
    assert first + [b[0].tolist() for b in resumed] == full
    assert loader.statistics().batches >= 1

    class Flaky(S.Dataset[int]):
        def __len__(self) -> int:
            return 6

        def __getitem__(self, i: int) -> int:
            if i == 2:
                raise OSError("bad file")
            return i

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = [b.tolist() for b in S.DataLoader(Flaky(), batch_size=2, skip_errors=1)]
    assert got == [[0, 1], [3], [4, 5]]
    threads = S.DataLoader(ds, batch_size=4, num_workers=2, worker_mode="thread")
    assert [b[0].tolist() for b in threads] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    from stoker._dataset import draws_nothing

    assert draws_nothing(S.Subset(ds, [1, 2])) and not draws_nothing(Squares())


_LIGHTNING_PASSED_TO_FIT = """
import numpy as np
import torch.utils.data as T
from lightning.pytorch.utilities import data as pl_data
import stoker.torch as S

ds = S.TensorDataset(np.arange(10))
loader = S.DataLoader(ds, batch_size=2, shuffle=True, drop_last=True, generator=3)
assert pl_data._is_dataloader_shuffled(loader)
assert not pl_data._is_dataloader_shuffled(S.DataLoader(ds, batch_size=2))
sampler = T.DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=0)
rebuilt = pl_data._update_dataloader(loader, sampler)
assert type(rebuilt) is S.DataLoader
assert rebuilt.batch_sampler.sampler is sampler
assert (rebuilt.batch_sampler.batch_size, rebuilt.batch_sampler.drop_last) == (2, True)
assert rebuilt.generator == 3 and rebuilt.tensor_type == "torch"
got = [i for (b,) in rebuilt for i in b.tolist()]
assert got == [i for i in sampler][:4] and len(rebuilt) == 2
print("checked")
"""

_LIGHTNING_MADE_IN_A_HOOK = """
import numpy as np
import torch.utils.data as T
from lightning.fabric.utilities.data import _replace_dunder_methods
from lightning.pytorch.utilities import data as pl_data
import stoker.torch as S

ds = S.TensorDataset(np.arange(8))
with _replace_dunder_methods(T.DataLoader, "dataset"), _replace_dunder_methods(T.BatchSampler):
    loader = S.DataLoader(ds, batch_size=2, shuffle=True, num_workers=0)
assert hasattr(loader, "__pl_saved_args")
sampler = T.DistributedSampler(ds, num_replicas=2, rank=0, shuffle=False)
rebuilt = pl_data._update_dataloader(loader, sampler)
assert type(rebuilt) is S.DataLoader and rebuilt.batch_sampler.sampler is sampler
assert [b[0].tolist() for b in rebuilt] == [[0, 2], [4, 6]]
print("checked")
"""


def _in_lightning(code: str) -> Any:
    """A job running ``code`` in a fresh interpreter (None without Lightning): Lightning's
    import (torch's compiler and sympy with it, seconds) stays out of the suite's process
    and runs as the session starts (see tests/_early.py)."""

    def job(tmp: Path) -> Job | None:
        if importlib.util.find_spec("lightning") is None:
            return None
        return Job([[sys.executable, "-c", code]], python_env(_SRC))

    return job


def _lightning_checked(request: pytest.FixtureRequest) -> None:
    if importlib.util.find_spec("lightning") is None:  # so its job did not start
        pytest.skip("lightning is not installed")
    out = finished(request, timeout=110)
    assert out.returncode == 0 and out.output.splitlines()[-1:] == ["checked"], out.output


@starts_early(_in_lightning(_LIGHTNING_PASSED_TO_FIT))
def test_lightning_rebuilds_a_loader_passed_to_fit(request: pytest.FixtureRequest) -> None:
    """Lightning's rebuild from a loader's attributes gives a stoker.torch loader with the
    DistributedSampler in, and the other arguments kept."""
    _lightning_checked(request)


@starts_early(_in_lightning(_LIGHTNING_MADE_IN_A_HOOK))
def test_lightning_rebuilds_a_loader_made_in_a_hook(request: pytest.FixtureRequest) -> None:
    """A loader made inside Lightning's patched __init__ (as in train_dataloader()) is
    rebuilt from its recorded arguments into a stoker.torch loader."""
    _lightning_checked(request)


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_distributed_sampler_gives_torchs_shards(shuffle: bool, drop_last: bool) -> None:
    """stoker.torch's DistributedSampler gives each rank torch's indices, epoch after epoch."""
    for rank in range(3):
        ours = S.DistributedSampler(
            range(10), num_replicas=3, rank=rank, shuffle=shuffle, seed=5, drop_last=drop_last
        )
        theirs = T.DistributedSampler(
            range(10), num_replicas=3, rank=rank, shuffle=shuffle, seed=5, drop_last=drop_last
        )
        for epoch in range(3):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs) and len(ours) == len(theirs)
