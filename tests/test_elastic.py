"""Elastic resume: ``DistributedSampler(elastic=True)`` gives the same global batches, draws
included, at any world size, and a state saved on R ranks resumes on R' ranks (real gloo
process groups on CPU) with every sample of the epoch delivered exactly once."""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import random
import traceback
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stoker
from stoker._distributed import DistributedSampler

_RANK_TIMEOUT_S = 120.0
"""Bound on one rank's answer to a job (spawn, import torch, gloo, a tiny epoch)."""
_JOIN_TIMEOUT_S = 10.0
_N, _G, _SEED = 46, 8, 7
"""46 samples in global batches of 8: five whole, a sixth of 6 (padded to 8 on 4 ranks)."""


class Augmenting(stoker.Dataset):  # type: ignore[type-arg]
    """Sample ``i``: its index and one draw from each of Python's, NumPy's and torch's
    global RNGs, as a random augmentation makes them."""

    def __len__(self) -> int:
        return _N

    def __getitem__(self, i: int) -> np.ndarray[Any, Any]:
        import torch

        draws = [random.randrange(10**6), np.random.randint(10**6), int(torch.randint(10**6, ()))]
        return np.array([i, *draws], dtype=np.int64)


class AugmentingStream(stoker.IterableDataset):  # type: ignore[type-arg]
    """The samples of :class:`Augmenting` as a stream, drawn as they are read."""

    def __iter__(self) -> Any:
        return map(Augmenting().__getitem__, range(_N))


def _loader(share: Any, world: int, workers: int, mode: str = "process") -> Any:
    """A rank's loader over its elastic share (a sampler, or a stream); process workers
    forked, as under torchrun (a spawned rank would spawn them, each importing torch
    again: seconds a worker on a busy machine)."""
    stream = isinstance(share, stoker.ShardedIterable)
    return stoker.DataLoader(
        share if stream else Augmenting(),
        batch_size=_G // world,
        sampler=None if stream else share,
        num_workers=workers,
        worker_mode=mode,
        multiprocessing_context="fork" if workers and mode == "process" else None,
    )


def _run(job: dict[str, Any], world: int, rank: int | None) -> dict[str, Any]:
    """One rank's part of ``job``: epoch ``job["epoch"]`` (resumed from ``job["state"]``,
    or cut after ``job["stop"]`` batches with its state), then the next epoch whole; over
    a ``ShardedIterable`` where ``job["stream"]``."""
    kw: dict[str, Any] = {} if rank is None else {"num_replicas": world, "rank": rank}
    if job.get("stream"):
        sampler: Any = stoker.ShardedIterable(AugmentingStream(), elastic=True, seed=_SEED, **kw)
    else:
        sampler = DistributedSampler(Augmenting(), seed=_SEED, elastic=True, **kw)  # type: ignore[arg-type]
    sampler.set_epoch(job["epoch"])
    loader = _loader(sampler, sampler.num_replicas, job["workers"], job.get("mode", "process"))
    if job.get("state") is not None:
        loader.load_state_dict(job["state"])
    batches, state = [], None
    for batch in loader:
        batches.append(batch.tolist())
        if len(batches) == job.get("stop"):
            state = loader.state_dict()
            break
    if state is not None:
        return {"batches": batches, "state": state, "next": None}
    sampler.set_epoch(sampler.epoch + 1)
    return {"batches": batches, "state": None, "next": [b.tolist() for b in loader]}


def _next_job(conn: Connection) -> Any:
    """The next job, or None: told to end, or the test's end of the pipe closed."""
    try:
        return conn.recv()
    except EOFError:
        return None


def _rank_loop(index: int, conn: Connection) -> None:
    """A spawned rank process: for each job received, join a gloo group, run the job, leave
    the group, send the result; ends at None."""
    import torch.distributed as dist

    timeout = timedelta(seconds=_RANK_TIMEOUT_S)
    while (msg := _next_job(conn)) is not None:
        init_method, world, job = msg
        try:
            dist.init_process_group("gloo", init_method, timeout, world, index)
            try:
                result = _run(job, world, None)  # the world from the process group
                assert dist.get_world_size() == world and dist.get_rank() == index
            finally:
                dist.destroy_process_group()
            conn.send(("ok", result))
        except BaseException:
            conn.send(("error", traceback.format_exc()))
    conn.close()


def _hub(conns: list[Connection]) -> None:
    """A spawned process that imports torch once and forks the ranks (four spawned ranks
    would import it four times: seconds each on a busy machine); ends after them."""
    import torch.distributed  # noqa: F401  (before the fork: no thread started yet)

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_rank_loop, args=(i, c)) for i, c in enumerate(conns)]
    for proc in procs:
        proc.start()
    for conn in conns:
        conn.close()
    for proc in procs:
        proc.join()


class _Ranks:
    """Four rank processes, each joining one gloo group (of 1 to 4) per scenario."""

    def __init__(self, count: int, folder: Path) -> None:
        ctx = multiprocessing.get_context(
            "spawn"
        )  # torch.distributed in forked children is fragile
        self.folder, self.groups = folder, 0
        pipes = [ctx.Pipe() for _ in range(count)]
        self.conns = [mine for mine, _ in pipes]
        self.hub = ctx.Process(target=_hub, args=([theirs for _, theirs in pipes],))
        self.hub.start()
        for _, theirs in pipes:
            theirs.close()

    def run(self, world: int, job: dict[str, Any]) -> list[dict[str, Any]]:
        """``job`` on ranks ``0 .. world - 1`` of a new group; their results in rank order."""
        self.groups += 1
        init_method = f"file://{self.folder / f'group{self.groups}'}"
        for conn in self.conns[:world]:
            conn.send((init_method, world, job))
        results = []
        for rank, conn in enumerate(self.conns[:world]):
            if not conn.poll(_RANK_TIMEOUT_S):
                pytest.fail(f"rank {rank} of {world} answered nothing within {_RANK_TIMEOUT_S} s")
            try:
                status, payload = conn.recv()
            except EOFError:
                pytest.fail(f"rank {rank} of {world} died before answering")
            assert status == "ok", f"rank {rank} of {world} failed:\n{payload}"
            results.append(payload)
        return results

    def close(self) -> None:
        """Tell the ranks to end (a rank whose pipe closes ends too), and wait for them."""
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(None)
            conn.close()
        self.hub.join(_JOIN_TIMEOUT_S + _RANK_TIMEOUT_S)
        if self.hub.is_alive():
            self.hub.kill()
            self.hub.join(_JOIN_TIMEOUT_S)
        self.hub.close()


def _global(per_rank: list[list[Any]]) -> list[list[Any]]:
    """Global batch ``k`` of each ``k``: the union of the ranks' batches ``k``, sorted."""
    count = max(len(batches) for batches in per_rank)
    return [
        sorted(s for batches in per_rank if k < len(batches) for s in batches[k])
        for k in range(count)
    ]


def _uninterrupted(world: int, epoch: int, stream: bool = False) -> list[list[Any]]:
    """The global batches of epoch ``epoch`` on ``world`` ranks, run without interruption
    (each rank in turn, here; the world given, no process group)."""
    job = {"epoch": epoch, "workers": 0, "stop": None, "stream": stream}
    return _global([_run(job, world, rank)["batches"] for rank in range(world)])


def _total(world: int) -> int:
    """Samples an epoch delivers on ``world`` ranks: padded to a multiple of ``world``."""
    return -(-_N // world) * world


@pytest.mark.multiprocess
def test_elastic_resume_across_world_sizes(tmp_path: Path) -> None:
    """Saved mid-epoch on 2 ranks, resumed on 1 and on 4; saved on 4, resumed on 2: the
    rest of the epoch holds every sample not yet delivered exactly once (padding as the
    new world size pads), its global batches, draws included, are those of an uninterrupted
    run at the new size, and the next epoch too."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    runs = {w: _uninterrupted(w, 3) for w in (1, 2, 4)}
    after = {w: _uninterrupted(w, 4) for w in (1, 2, 4)}
    # The same global batches at every world size; only the last one's padding differs.
    assert runs[1][:-1] == runs[2][:-1] == runs[4][:-1]
    assert after[1][:-1] == after[2][:-1] == after[4][:-1]
    ranks = _Ranks(4, tmp_path)
    try:
        for old, workers, new, new_workers, mode in (
            (2, 2, 1, 2, "thread"),
            (2, 2, 4, 0, "process"),
            (4, 1, 2, 1, "process"),
        ):
            saved = ranks.run(old, {"epoch": 3, "workers": workers, "stop": 2})
            states = [r["state"] for r in saved]
            assert [{**s, "seed": 0} for s in states] == [{**states[0], "seed": 0}] * old, states
            before = _global([r["batches"] for r in saved])
            assert before == runs[old][:2]
            job = {"epoch": 0, "workers": new_workers, "mode": mode, "state": states[0]}
            resumed = ranks.run(new, job)
            rest = _global([r["batches"] for r in resumed])
            assert before + rest == runs[new], (old, new)
            ids = collections.Counter(s[0] for batch in before + rest for s in batch)
            assert set(ids) == set(range(_N)) and sum(ids.values()) == _total(new)
            assert _global([r["next"] for r in resumed]) == after[new], (old, new)
        # A stream, dealt by global batches: saved on 2 ranks, resumed (replayed) on 4.
        stream = {w: _uninterrupted(w, 3, stream=True) for w in (2, 4)}
        assert stream[2] == stream[4]  # no padding: the last global batch too
        saved = ranks.run(2, {"epoch": 3, "workers": 2, "stop": 2, "stream": True})
        before = _global([r["batches"] for r in saved])
        job = {"epoch": 0, "workers": 1, "state": saved[0]["state"], "stream": True}
        rest = _global([r["batches"] for r in ranks.run(4, job)])
        assert before + rest == stream[4]
        ids = collections.Counter(s[0] for batch in before + rest for s in batch)
        assert sorted(ids.elements()) == list(range(_N))
    finally:
        ranks.close()


def _state_after(world: int, batches: int, **kw: Any) -> dict[str, Any]:
    """Rank 0's loader state after ``batches`` batches of epoch 0 on ``world`` ranks."""
    sampler = DistributedSampler(Augmenting(), world, 0, seed=kw.pop("seed", _SEED), elastic=True)  # type: ignore[arg-type]
    loader = stoker.DataLoader(Augmenting(), batch_size=_G // world, sampler=sampler, **kw)
    it = iter(loader)
    for _ in range(batches):
        next(it)
    return loader.state_dict()


def test_a_state_that_cannot_resume_is_refused_naming_both_values() -> None:
    """Another global batch size, seed, dataset length or sampling mode: ValueError naming
    what the state holds and what the loader has; nothing is applied."""
    state = _state_after(2, 1)
    sampler = DistributedSampler(Augmenting(), 4, 1, seed=_SEED, elastic=True)  # type: ignore[arg-type]
    loader = stoker.DataLoader(Augmenting(), batch_size=3, sampler=sampler)
    with pytest.raises(
        ValueError, match=r"global_batch_size=8 \(on 2 ranks\).*global_batch_size=12 \(on 4 ranks\)"
    ):
        loader.load_state_dict(state)
    other_seed = DistributedSampler(Augmenting(), 4, 1, seed=8, elastic=True)  # type: ignore[arg-type]
    loader = stoker.DataLoader(Augmenting(), batch_size=2, sampler=other_seed)
    with pytest.raises(ValueError, match="seed=7, but this DistributedSampler has seed=8"):
        loader.load_state_dict(state)
    assert other_seed.seed == 8 and other_seed.epoch == 0
    shorter = DistributedSampler(range(40), 4, 1, seed=_SEED, elastic=True)  # type: ignore[arg-type]
    loader = stoker.DataLoader(list(range(40)), batch_size=2, sampler=shorter)
    with pytest.raises(
        ValueError, match="dataset length=46, but this loader has dataset length=40"
    ):
        loader.load_state_dict(state)
    plain = DistributedSampler(Augmenting(), 2, 1, seed=_SEED)  # type: ignore[arg-type]
    loader = stoker.DataLoader(Augmenting(), batch_size=4, sampler=plain)
    with pytest.raises(ValueError, match="elastic=True, but this sampler has elastic=False"):
        loader.load_state_dict(state)


def test_out_of_order_deliveries_resume_only_on_the_same_world_size() -> None:
    """A state with batches delivered beyond its prefix (``in_order=False``) tells the
    saving rank's part of those batches only: refused on another world size, taken on the
    same one."""
    state = _state_after(2, 2)
    state["delivered_beyond"] = [3]
    four = DistributedSampler(Augmenting(), 4, 0, seed=_SEED, elastic=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="saved on 2 ranks with batches delivered out of order"):
        stoker.DataLoader(Augmenting(), batch_size=2, sampler=four).load_state_dict(state)
    two = DistributedSampler(Augmenting(), 2, 0, seed=_SEED, elastic=True)  # type: ignore[arg-type]
    stoker.DataLoader(Augmenting(), batch_size=4, sampler=two).load_state_dict(state)


def test_elastic_needs_stokers_batching() -> None:
    """Without the loader's batch size (``batch_size=None``, or another batch sampler) the
    places of a batch's samples are unknown: ValueError saying what to pass."""
    sampler = DistributedSampler(Augmenting(), 2, 0, elastic=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="elastic DistributedSampler places each sample"):
        stoker.DataLoader(Augmenting(), batch_size=None, sampler=sampler)
    stoker.DataLoader(Augmenting(), batch_size=4, sampler=sampler)
    with pytest.raises(ValueError, match="serves batches of 4"):
        stoker.DataLoader(Augmenting(), batch_size=2, sampler=sampler)


def test_the_torch_front_door_gives_the_same_global_batches() -> None:
    """``stoker.torch.DistributedSampler(elastic=True)``: torch's shuffle, and the same
    global batches, draws included, on 1 and 2 ranks, with tensors."""
    torch = pytest.importorskip("torch")
    import stoker.torch as st

    def run(world: int) -> list[list[Any]]:
        per_rank = []
        for rank in range(world):
            sampler = st.DistributedSampler(Augmenting(), world, rank, seed=1, elastic=True)
            loader = st.DataLoader(Augmenting(), batch_size=_G // world, sampler=sampler)
            per_rank.append([b.tolist() for b in loader])
        return _global(per_rank)

    one, two = run(1), run(2)
    assert one == two
    order = list(torch.utils.data.DistributedSampler(range(_N), 1, 0, seed=1))
    assert [s[0] for s in one[0]] == sorted(order[:_G])


def test_a_non_elastic_share_refuses_another_world_size_within_an_epoch() -> None:
    """Torch's interleaved ``DistributedSampler`` and ``ShardedIterable`` deal the rest of
    an epoch out otherwise on another world size: a state saved within an epoch is refused
    there (naming both sizes), taken on the same size, and at an epoch's end on any."""
    saver = stoker.DataLoader(range(40), batch_size=4, sampler=DistributedSampler(range(40), 2, 0))
    it = iter(saver)
    next(it)
    state = saver.state_dict()
    assert state["world"] == 2
    four = stoker.DataLoader(range(40), batch_size=4, sampler=DistributedSampler(range(40), 4, 0))
    with pytest.raises(ValueError, match=r"saved within an epoch on 2 ranks.* among 4"):
        four.load_state_dict(state)
    again = stoker.DataLoader(range(40), batch_size=4, sampler=DistributedSampler(range(40), 2, 1))
    again.load_state_dict(state)
    list(it)
    four.load_state_dict(saver.state_dict())  # the epoch's end: the next is dealt afresh
    stream = stoker.DataLoader(stoker.ShardedIterable(range(40), num_replicas=2, rank=0), 4)
    next(iter(stream))
    other = stoker.DataLoader(stoker.ShardedIterable(range(40), num_replicas=4, rank=0), 4)
    with pytest.raises(ValueError, match="loader's ShardedIterable shares the data among 4"):
        other.load_state_dict(stream.state_dict())


def test_an_elastic_stream_checks_its_state_and_workers() -> None:
    """An elastic ``ShardedIterable``: its state resumes with other worker counts on
    another world size, and is refused with another global batch size or seed, or by a
    non-elastic share, naming both values; thread workers (which share the RNGs each
    item is seeded in) are refused."""
    stream = stoker.ShardedIterable(AugmentingStream(), num_replicas=2, rank=0, elastic=True)
    saver = stoker.DataLoader(stream, batch_size=4)
    it = iter(saver)
    next(it)
    state = saver.state_dict()
    assert state["elastic"] == {"global_batch_size": 8, "num_replicas": 2, "seed": 0, "epoch": 0}

    def share(**kw: Any) -> Any:
        return stoker.ShardedIterable(AugmentingStream(), num_replicas=4, rank=3, **kw)

    stoker.DataLoader(share(elastic=True), batch_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match=r"global_batch_size=8 \(on 2 ranks\).*=4 \(on 4"):
        stoker.DataLoader(share(elastic=True), batch_size=1).load_state_dict(state)
    with pytest.raises(ValueError, match="seed=0, but this ShardedIterable has seed=1"):
        stoker.DataLoader(share(elastic=True, seed=1), batch_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match="elastic=True, but this loader's has elastic=False"):
        stoker.DataLoader(share(), batch_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match="thread workers share"):
        stoker.DataLoader(share(elastic=True), batch_size=2, num_workers=1, worker_mode="thread")


class Poisoned(Augmenting):
    """:class:`Augmenting` whose sample 5 fails to load."""

    def __getitem__(self, i: int) -> np.ndarray[Any, Any]:
        if i == 5:
            raise OSError("sample 5 is unreadable")
        return super().__getitem__(i)


def test_a_failing_elastic_sample_is_named_or_skipped_keeping_the_others_draws() -> None:
    """In an elastic batch, a sample that raises is named by the batch's indices (from a
    worker process), and with ``skip_errors`` left out while every other sample keeps the
    draws of its place."""
    pytest.importorskip("torch")

    def batches(dataset: Any, **kw: Any) -> list[list[Any]]:
        sampler = DistributedSampler(dataset, 1, 0, seed=_SEED, elastic=True)
        return [b.tolist() for b in stoker.DataLoader(dataset, 4, sampler=sampler, **kw)]

    clean = [s for batch in batches(Augmenting()) for s in batch]
    skipped = [s for batch in batches(Poisoned(), skip_errors=1) for s in batch]
    assert len(skipped) == _N - 1 and skipped == [s for s in clean if s[0] != 5]
    batch = next(b for b in batches(Augmenting()) if 5 in [s[0] for s in b])
    assert f"sample indices {[s[0] for s in batch]}" in _error_of(
        lambda: batches(Poisoned(), num_workers=1, multiprocessing_context="fork")
    )


def _error_of(run: Any) -> str:
    """The text and notes of the ``OSError`` that ``run()`` raises (the exception dropped
    here: its traceback holds the loader's iterator, and so its worker)."""
    try:
        run()
    except OSError as exc:
        return "\n".join([str(exc), *getattr(exc, "__notes__", [])])
    raise AssertionError("no OSError raised")
