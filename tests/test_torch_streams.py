"""torch's random streams: on a ``torch.Generator``, or on torch's global RNG (generator
None with torch imported), stoker's samplers, ``random_split`` and shuffling ``DataLoader``
give exactly torch's indices, epoch after epoch, and their checkpoints resume them exactly.

Every test is differential: the same scenario runs on ``torch.utils.data`` and on stoker.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import stoker

torch = pytest.importorskip("torch")
td = torch.utils.data

EPOCHS = 3

SAMPLERS: dict[str, Callable[[Any, Any], Any]] = {
    "random": lambda m, g: m.RandomSampler(range(13), generator=g),
    "random_replacement": lambda m, g: m.RandomSampler(range(13), True, generator=g),
    "random_replacement_many": lambda m, g: m.RandomSampler(range(7), True, 75, generator=g),
    "random_more": lambda m, g: m.RandomSampler(range(6), num_samples=20, generator=g),
    "random_multiple": lambda m, g: m.RandomSampler(range(6), num_samples=12, generator=g),
    "random_fewer": lambda m, g: m.RandomSampler(range(9), num_samples=4, generator=g),
    "subset": lambda m, g: m.SubsetRandomSampler([5, 3, 17, 2, 11, 8], generator=g),
    "weighted": lambda m, g: m.WeightedRandomSampler([0.5, 2, 0, 3, 1], 17, generator=g),
    "weighted_no_replacement": lambda m, g: m.WeightedRandomSampler(
        [0.5, 2, 0, 3, 1, 4], 5, replacement=False, generator=g
    ),
}


def _stream(kind: str) -> Any:
    """A fresh torch stream: a seeded Generator, or None after seeding the global RNG."""
    if kind == "generator":
        return torch.Generator().manual_seed(1234)
    torch.manual_seed(99)
    return None


def _epochs(sampler: Any, n: int = EPOCHS) -> list[list[int]]:
    return [[int(i) for i in sampler] for _ in range(n)]


@pytest.mark.parametrize("stream", ["generator", "global"])
@pytest.mark.parametrize("name", list(SAMPLERS))
def test_sampler_gives_torchs_indices_epoch_after_epoch(name: str, stream: str) -> None:
    """Each random sampler yields torch's indices for several epochs, and leaves the
    stream where torch leaves it."""
    theirs = _epochs(SAMPLERS[name](td, _stream(stream)))
    after_theirs = torch.rand(4)
    ours = _epochs(SAMPLERS[name](stoker, _stream(stream)))
    if stream == "global":
        assert torch.equal(torch.rand(4), after_theirs)  # the global RNG moved as torch's
    assert ours == theirs


@pytest.mark.parametrize("stream", ["generator", "global"])
@pytest.mark.parametrize("name", list(SAMPLERS))
def test_sampler_state_resumes_torch_stream(name: str, stream: str) -> None:
    """A sampler state taken between epochs (and one taken after an epoch was drawn, as the
    loader takes it) resumes torch's indices, through JSON, into a fresh sampler."""
    theirs = _epochs(SAMPLERS[name](td, _stream(stream)), 4)
    gen = _stream(stream)
    ours = SAMPLERS[name](stoker, gen)
    assert _epochs(ours, 1) == theirs[:1]
    between = json.loads(json.dumps(ours.state_dict()))
    global_state = torch.get_rng_state()
    assert _epochs(ours, 1) == theirs[1:2]
    within = json.loads(json.dumps(ours._drawn_state()))  # the state that draws epoch 1
    assert within["epoch"] == 1

    fresh = SAMPLERS[name](stoker, torch.Generator() if stream == "generator" else None)
    fresh.load_state_dict(between)
    torch.set_rng_state(global_state)  # on the global RNG a resumed run restores it too
    assert _epochs(fresh, 3) == theirs[1:]

    fresh = SAMPLERS[name](stoker, torch.Generator() if stream == "generator" else None)
    fresh.load_state_dict(within)
    assert _epochs(fresh, 1) == theirs[1:2]
    if stream == "generator":  # the generator's own stream goes on as in the first run
        assert _epochs(fresh, 2) == theirs[2:]


def test_weighted_past_torchs_category_limit_still_draws() -> None:
    """Beyond 2**24 weights torch's multinomial raises; stoker draws (from the stream)."""
    w = np.zeros(2**24 + 3)
    w[[5, 2**24 + 1]] = 1.0
    with pytest.raises(RuntimeError, match="cannot exceed 2\\^24"):
        list(td.WeightedRandomSampler(w, 4, generator=torch.Generator()))
    g = torch.Generator().manual_seed(0)
    drawn = [list(stoker.WeightedRandomSampler(w, 8, generator=g)) for _ in range(2)]
    assert all(set(e) <= {5, 2**24 + 1} and len(e) == 8 for e in drawn)
    assert drawn[0] != drawn[1]


@pytest.mark.parametrize("stream", ["generator", "global"])
@pytest.mark.parametrize("lengths", [[3, 7], [0.3, 0.3, 0.4], [0.5, 0.5]])
def test_random_split_is_torchs(lengths: list[float], stream: str) -> None:
    """random_split gives torch's subsets for the same stream (issue #20's example too)."""
    theirs = [list(s.indices) for s in td.random_split(range(10), lengths, _stream(stream))]
    ours = [list(s.indices) for s in stoker.random_split(range(10), lengths, _stream(stream))]
    assert ours == theirs
    example = stoker.random_split(range(10), [3, 7], generator=torch.Generator().manual_seed(1))
    assert [list(s) for s in example] == [[5, 6, 1], [2, 0, 8, 9, 3, 7, 4]]


def test_int_and_numpy_generators_keep_stokers_draws() -> None:
    """An int seed or a NumPy generator keeps stoker's (seed, epoch) orders."""
    a = _epochs(stoker.RandomSampler(range(20), generator=5))
    assert a == _epochs(stoker.RandomSampler(range(20), generator=5))
    assert a[0] == stoker._random.rng(5, 0).permutation(20).tolist()
    b = _epochs(stoker.RandomSampler(range(20), generator=np.random.default_rng(5)))
    seed = stoker._random.draw_seed(np.random.default_rng(5))
    assert b == [stoker._random.rng(seed, e).permutation(20).tolist() for e in range(EPOCHS)]


LOADERS = {
    "in_process": {},
    "threads": {"num_workers": 2, "worker_mode": "thread"},
    "processes": {"num_workers": 2},
    "persistent": {"num_workers": 2, "worker_mode": "thread", "persistent_workers": True},
}


def _loader_epochs(module: Any, stream: str, kw: dict[str, Any], n: int = EPOCHS) -> list[Any]:
    gen = _stream(stream)
    loader = module.DataLoader(list(range(22)), batch_size=4, shuffle=True, generator=gen, **kw)
    return [[int(i) for batch in loader for i in batch] for _ in range(n)]


@pytest.mark.parametrize("stream", ["generator", "global"])
@pytest.mark.parametrize("kind", list(LOADERS))
def test_shuffling_loader_gives_torchs_order(kind: str, stream: str) -> None:
    """DataLoader(shuffle=True) orders each epoch as torch's does on the same stream (the
    iterator's own draw before the sampler's, once only with persistent workers)."""
    kw = LOADERS[kind]
    torch_kw = {k: v for k, v in kw.items() if k != "worker_mode"}
    assert _loader_epochs(stoker, stream, kw) == _loader_epochs(td, stream, torch_kw)


@pytest.mark.parametrize("stream", ["generator", "global"])
@pytest.mark.parametrize("cut", [(0, 2), (1, 0), (1, 3)])
def test_loader_checkpoint_resumes_torchs_order(stream: str, cut: tuple[int, int]) -> None:
    """A loader checkpoint after `cut` = (epochs, batches) resumes torch's order exactly,
    for that epoch and (restoring the global RNG where it is the stream) the next."""
    theirs = _loader_epochs(td, stream, {}, 3)
    epochs, batches = cut
    loader = stoker.DataLoader(
        list(range(22)), batch_size=4, shuffle=True, generator=_stream(stream)
    )
    for _ in range(epochs):
        list(loader)
    it = iter(loader)
    head = [int(i) for _ in range(batches) for i in next(it)]
    state = json.loads(json.dumps(loader.state_dict()))
    global_state = torch.get_rng_state()
    del it
    gen = torch.Generator() if stream == "generator" else None
    fresh = stoker.DataLoader(list(range(22)), batch_size=4, shuffle=True, generator=gen)
    fresh.load_state_dict(state)
    torch.set_rng_state(global_state)
    rest = [int(i) for batch in fresh for i in batch]
    assert head + rest == theirs[epochs]
    assert [int(i) for batch in fresh for i in batch] == theirs[epochs + 1]
