"""``stoker.torch.StatefulDataLoader`` against torchdata's: ``snapshot_every_n_steps``
keeps the same snapshots (a resumed worker starts from the same position), and each loader
refuses the other's state with an error that says so."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
torchdata_sdl = pytest.importorskip("torchdata.stateful_dataloader")

import stoker.torch as S  # noqa: E402


class Positions(torch.utils.data.IterableDataset):  # type: ignore[misc,name-defined]
    """Worker ``w`` of ``c`` yields ``[x, began]`` for x in ``range(w, n, c)``: ``began``
    is the position its iterator began at (0 afresh, else where its state said), so the
    batches after a resume show which snapshot each worker was given."""

    def __init__(self, n: int) -> None:
        self.n, self.pos, self._start = n, 0, 0

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        wid, count = (0, 1) if info is None else (info.id, info.num_workers)
        items = list(range(wid, self.n, count))
        began, self._start = self._start, 0
        self.pos = began
        while self.pos < len(items):
            self.pos += 1
            yield [items[self.pos - 1], began]

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._start = state["pos"]


def _run(cls: Any, every: int | None, cut: int, workers: int) -> tuple[list[Any], list[Any]]:
    """(the first ``cut`` batches, those after a resume from the state saved then)."""
    kw: dict[str, Any] = {"batch_size": 2, "num_workers": workers}
    saver = cls(Positions(21), snapshot_every_n_steps=every, **kw)
    it = iter(saver)
    head = [[t.tolist() for t in next(it)] for _ in range(cut)]
    state = saver.state_dict()
    del it
    fresh = cls(Positions(21), snapshot_every_n_steps=every, **kw)
    fresh.load_state_dict(state)
    return head, [[t.tolist() for t in b] for b in fresh]


@pytest.mark.parametrize("every", [1, 3, None])
def test_snapshot_every_n_steps_as_torchdata(every: int | None) -> None:
    """Resumed after each batch, with snapshots every batch, every 3, or never, the batches
    after the resume are torchdata's: the same values, and each worker restarted from the
    same snapshot (the position it began at); so is the whole epoch."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchdata's deprecation warnings
        for cut in (0, 4, 7, 10):
            theirs = _run(torchdata_sdl.StatefulDataLoader, every, cut, 2)
            ours = _run(S.StatefulDataLoader, every, cut, 2)
            assert ours == theirs, cut


@pytest.mark.parametrize("workers", [0, 2])
def test_each_loader_refuses_the_others_state(workers: int) -> None:
    """torchdata's state is refused by stoker (ValueError naming torchdata), and stoker's by
    torchdata (its AssertionError naming the key it misses), before anything is loaded."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kw: dict[str, Any] = {"batch_size": 2, "num_workers": workers}
        theirs = torchdata_sdl.StatefulDataLoader(list(range(10)), **kw)
        it = iter(theirs)
        next(it)
        their_state = theirs.state_dict()
        del it
        ours = S.StatefulDataLoader(list(range(10)), **kw)
        with pytest.raises(ValueError, match=r"torchdata's.*not stoker's"):
            ours.load_state_dict(their_state)
        it = iter(ours)
        next(it)
        our_state = ours.state_dict()
        del it
        other = torchdata_sdl.StatefulDataLoader(list(range(10)), **kw)
        other.load_state_dict(our_state)
        key = "_snapshot" if workers else "_num_yielded"
        with pytest.raises(AssertionError, match=f"State doesn't contain key '{key}'"):
            iter(other)


def test_stateful_dataloader_is_stokers_and_torchs() -> None:
    """The name is stoker.torch's DataLoader under torchdata's name: a torch DataLoader;
    as torchdata's, it takes an empty state as no state at all."""
    ours = S.StatefulDataLoader(list(range(6)), batch_size=2)
    theirs = torchdata_sdl.StatefulDataLoader(list(range(6)), batch_size=2)
    for loader in (ours, theirs):
        loader.load_state_dict({})
    assert [b.tolist() for b in ours] == [b.tolist() for b in theirs] == [[0, 1], [2, 3], [4, 5]]
    assert issubclass(S.StatefulDataLoader, S.DataLoader)
    assert issubclass(S.StatefulDataLoader, torch.utils.data.DataLoader)
    assert S.StatefulDataLoader.__module__ == "stoker.torch"
