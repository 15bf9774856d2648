"""Tests of stoker._distributed: DistributedSampler (resume, even=False), ShardedIterable,
and a run with two real torch.distributed ranks (gloo, CPU)."""

from __future__ import annotations

import json
import multiprocessing
import socket
import sys
import traceback
import types
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import pytest

from stoker._distributed import DistributedSampler, ShardedIterable
from stoker._worker_info import WorkerInfo, set_worker_info

_RANK_TIMEOUT_S = 60.0
"""Bound on one rank's whole run (spawn + import torch + gloo); typically ~3 s."""
_JOIN_TIMEOUT_S = 10.0
_N = 103  # odd, so padding, dropping and uneven shares all show


# ---------------------------------------------------------------- DistributedSampler


def test_distributed_unshuffled_matches_torch() -> None:
    """With shuffle=False every rank's list and len equal torch's, over many shapes."""
    torch = pytest.importorskip("torch")
    for n in (0, 1, 2, 3, 5, 7, 8, 10, 17):
        for replicas in (1, 2, 3, 4, 8, 13):
            for drop_last in (False, True):
                for rank in range(replicas):
                    kw = {"num_replicas": replicas, "rank": rank, "shuffle": False}
                    theirs = torch.utils.data.DistributedSampler(
                        range(n), drop_last=drop_last, **kw
                    )
                    ours = DistributedSampler(range(n), drop_last=drop_last, **kw)  # type: ignore[arg-type]
                    assert list(ours) == list(theirs), (n, replicas, drop_last, rank)
                    assert len(ours) == len(theirs)
                    assert ours.total_size == theirs.total_size


def test_distributed_ranks_disjoint_and_cover() -> None:
    """Shuffled ranks agree on one order: with drop_last disjoint, without it covering all."""
    n, replicas = 103, 4
    parts = [
        list(DistributedSampler(range(n), replicas, r, seed=3, drop_last=True))
        for r in range(replicas)
    ]
    flat = [i for p in parts for i in p]
    assert len(flat) == len(set(flat)) == (n // replicas) * replicas
    padded = [list(DistributedSampler(range(n), replicas, r, seed=3)) for r in range(replicas)]
    assert {i for p in padded for i in p} == set(range(n))
    assert {len(p) for p in padded} == {26}


def test_distributed_set_epoch_changes_order() -> None:
    """set_epoch changes the shuffled order; the same (seed, epoch) repeats it."""
    s = DistributedSampler(range(40), num_replicas=2, rank=1, seed=5)
    e0 = list(s)
    assert list(s) == e0  # no set_epoch: same order, as torch
    s.set_epoch(1)
    e1 = list(s)
    assert e1 != e0
    t = DistributedSampler(range(40), num_replicas=2, rank=1, seed=5)
    t.set_epoch(1)
    assert list(t) == e1
    with pytest.raises(TypeError):
        s.set_epoch(1.5)  # type: ignore[arg-type]


def test_distributed_world_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """num_replicas and rank come from WORLD_SIZE / RANK when no group is initialised."""
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "2")
    s = DistributedSampler(range(10), shuffle=False)
    assert (s.num_replicas, s.rank) == (3, 2)
    assert list(s) == [2, 5, 8, 1]
    assert DistributedSampler(range(10), rank=0).rank == 0


def test_distributed_missing_world_is_runtime_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without group, env vars or arguments, a RuntimeError says what to pass or set."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(RuntimeError, match="WORLD_SIZE"):
        DistributedSampler(range(10))
    with pytest.raises(RuntimeError, match="rank"):
        DistributedSampler(range(10), num_replicas=2)


def test_distributed_world_from_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """An initialised torch.distributed group supplies num_replicas and rank first."""
    fake = types.SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: True,
        get_world_size=lambda: 4,
        get_rank=lambda: 3,
    )
    monkeypatch.setitem(sys.modules, "torch.distributed", fake)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    s = DistributedSampler(range(8), shuffle=False)
    assert (s.num_replicas, s.rank) == (4, 3)
    assert list(s) == [3, 7]


def test_distributed_real_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real one-process gloo group is detected (world size 1, rank 0)."""
    pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("torch.distributed unavailable or already initialised")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        s = DistributedSampler(range(5), shuffle=False)
    finally:
        dist.destroy_process_group()
    assert (s.num_replicas, s.rank, list(s)) == (1, 0, [0, 1, 2, 3, 4])


@pytest.mark.parametrize(
    ("num_replicas", "rank", "exc"),
    [(2, 2, ValueError), (2, -1, ValueError), (0, 0, ValueError), (2, 1.0, TypeError)],
)
def test_distributed_invalid_rank(num_replicas: int, rank: object, exc: type) -> None:
    """rank outside [0, num_replicas) is a ValueError, as torch; non-ints a TypeError."""
    with pytest.raises(exc):
        DistributedSampler(range(4), num_replicas=num_replicas, rank=rank)  # type: ignore[arg-type]


def test_distributed_invalid_rank_type_matches_torch() -> None:
    """torch raises ValueError for an out-of-range rank too."""
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError):
        torch.utils.data.DistributedSampler(range(4), num_replicas=2, rank=2)


def test_distributed_state_fixes_next_epochs() -> None:
    """A state loaded into a sampler built with another seed repeats the next epochs;
    it is JSON-serialisable and the same on every rank."""
    s = DistributedSampler(range(40), num_replicas=3, rank=1, seed=5)
    for epoch in (0, 3):
        s.set_epoch(epoch)
        sd = json.loads(json.dumps(s.state_dict()))
        assert sd == {"kind": "DistributedSampler", "seed": 5, "epoch": epoch}
        expected = list(s)
        t = DistributedSampler(range(40), num_replicas=3, rank=1, seed=99)
        t.load_state_dict(sd)
        assert list(t) == expected and t.state_dict() == s.state_dict()
    other_rank = DistributedSampler(range(40), num_replicas=3, rank=2, seed=5)
    other_rank.set_epoch(3)
    assert other_rank.state_dict() == s.state_dict()


def test_distributed_state_epoch_edit_and_validation() -> None:
    """Editing "epoch" skips ahead; bad states raise TypeError/ValueError."""
    s = DistributedSampler(range(20), num_replicas=2, rank=0, seed=1)
    s.set_epoch(6)
    sixth = list(s)
    t = DistributedSampler(range(20), num_replicas=2, rank=0, seed=1)
    sd = t.state_dict()
    sd["epoch"] = 6
    t.load_state_dict(sd)
    assert list(t) == sixth and t.epoch == 6
    with pytest.raises(TypeError, match=r"'epoch'\] must be an int, got '6'"):
        t.load_state_dict({**sd, "epoch": "6"})
    with pytest.raises(ValueError, match="got kind 'RandomSampler'"):
        t.load_state_dict({**sd, "kind": "RandomSampler"})
    with pytest.raises(ValueError, match="lacks"):
        t.load_state_dict({"kind": "DistributedSampler", "epoch": 1})
    assert t.epoch == 6 and t.seed == 1


# ---------------------------------------------------------------- even=False


@pytest.mark.parametrize("shuffle", [False, True])
def test_uneven_mode_covers_each_index_once(shuffle: bool) -> None:
    """even=False: ranks are disjoint, cover range(n), and len() is exact on each rank."""
    for n in (0, 1, 2, 5, 7, 16, 17):
        for replicas in (1, 2, 3, 4, 8):
            parts = []
            for rank in range(replicas):
                s = DistributedSampler(range(n), replicas, rank, shuffle, seed=2, even=False)
                part = list(s)
                assert len(part) == len(s), (n, replicas, rank)
                parts.append(part)
            flat = [i for p in parts for i in p]
            assert sorted(flat) == list(range(n)), (n, replicas)
            assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_uneven_mode_equals_even_when_divisible() -> None:
    """When num_replicas divides n, even=False gives exactly torch's split."""
    for rank in range(4):
        a = DistributedSampler(range(24), 4, rank, seed=3, even=False)
        b = DistributedSampler(range(24), 4, rank, seed=3)
        a.set_epoch(2)
        b.set_epoch(2)
        assert list(a) == list(b)


def test_uneven_mode_arguments() -> None:
    """even is keyword-only and a bool, and conflicts with drop_last=True."""
    with pytest.raises(ValueError, match="not both"):
        DistributedSampler(range(5), 2, 0, drop_last=True, even=False)
    with pytest.raises(TypeError, match="bool"):
        DistributedSampler(range(5), 2, 0, even=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        DistributedSampler(range(5), 2, 0, True, 0, False, False)  # type: ignore[call-arg]


# ---------------------------------------------------------------- ShardedIterable


def _as_worker(sharded: ShardedIterable[Any], worker_id: int, num_workers: int) -> list[Any]:
    """What ``sharded`` yields in worker ``worker_id`` of ``num_workers`` (thread-local info)."""
    set_worker_info(WorkerInfo(worker_id, num_workers, 0, sharded), whole_process=False)
    try:
        return list(sharded)
    finally:
        set_worker_info(None, whole_process=False)


def test_sharded_iterable_ranks_times_workers() -> None:
    """Ranks x workers shards are disjoint and complete; a rank's items and len() do not
    depend on its number of workers."""
    for world in (1, 2, 3):
        by_rank: dict[int, set[int]] = {}
        for workers in (1, 2, 4):
            seen: list[int] = []
            for rank in range(world):
                sharded = ShardedIterable(range(_N), num_replicas=world, rank=rank)
                mine = [i for w in range(workers) for i in _as_worker(sharded, w, workers)]
                assert len(mine) == len(sharded)
                assert by_rank.setdefault(rank, set(mine)) == set(mine)
                seen += mine
            assert sorted(seen) == list(range(_N)), (world, workers)


def test_sharded_iterable_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without group or env it is a single process; WORLD_SIZE / RANK are read; a half
    given world is a RuntimeError."""
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert list(ShardedIterable(iter(range(4)))) == [0, 1, 2, 3]
    with pytest.raises(RuntimeError, match="rank"):
        ShardedIterable(range(4), num_replicas=2)
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "1")
    s = ShardedIterable(range(10))
    assert (s.num_replicas, s.rank, list(s)) == (3, 1, [1, 4, 7])
    with pytest.raises(ValueError, match="Invalid rank"):
        ShardedIterable(range(4), num_replicas=2, rank=2)


def test_sharded_iterable_uses_torch_worker_info(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torch's DataLoader (no stoker worker info) torch's get_worker_info is used."""
    info = types.SimpleNamespace(id=1, num_workers=2)
    fake = types.SimpleNamespace(get_worker_info=lambda: info)
    monkeypatch.setitem(sys.modules, "torch.utils.data", fake)
    assert list(ShardedIterable(range(12), num_replicas=2, rank=0)) == [2, 6, 10]


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_sharded_iterable_with_loader_workers(mode: str) -> None:
    """Through stoker's DataLoader with 2 workers, two ranks still see each item once."""
    from stoker import DataLoader

    seen = []
    for rank in (0, 1):
        ds = ShardedIterable(range(23), num_replicas=2, rank=rank)
        loader: Any = DataLoader(ds, batch_size=None, num_workers=2, worker_mode=mode)
        seen += [int(x) for x in loader]
    assert sorted(seen) == list(range(23))


# ---------------------------------------------------------------- two real ranks


def _rank_main(rank: int, world: int, init_method: str, n: int, conn: Connection) -> None:
    """One rank (a spawned process): join the gloo group, shard, send the indices back."""
    try:
        import torch.distributed as dist

        dist.init_process_group(
            "gloo",
            init_method=init_method,
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=_RANK_TIMEOUT_S),
        )
        try:
            train = DistributedSampler(range(n), seed=5)  # world from the group
            train.set_epoch(2)
            evals = DistributedSampler(range(n), seed=5, even=False)
            sharded = ShardedIterable(range(n))
            states: list[Any] = [None] * world
            dist.all_gather_object(states, train.state_dict())
            resumed = DistributedSampler(range(n), seed=123)
            resumed.load_state_dict(states[0])  # rank 0's checkpoint, on every rank
            result = {
                "world": (train.num_replicas, train.rank, sharded.num_replicas, sharded.rank),
                "train": list(train),
                "resumed": list(resumed),
                "eval": list(evals),
                "eval_len": len(evals),
                "shards": {w: [_as_worker(sharded, i, w) for i in range(w)] for w in (1, 3)},
                "states": states,
            }
        finally:
            dist.destroy_process_group()
        conn.send(("ok", result))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _run_ranks(world: int, n: int) -> list[dict[str, Any]]:
    """Run ``_rank_main`` in ``world`` spawned processes; their results, in rank order."""
    ctx = multiprocessing.get_context("spawn")  # torch.distributed in forked children is fragile
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    procs: list[Any] = []
    conns: list[Connection] = []
    try:
        for rank in range(world):
            recv, send = ctx.Pipe(duplex=False)
            conns.append(recv)
            proc = ctx.Process(target=_rank_main, args=(rank, world, init_method, n, send))
            proc.start()
            procs.append(proc)
            send.close()
        results = []
        for rank, conn in enumerate(conns):
            if not conn.poll(_RANK_TIMEOUT_S):
                pytest.fail(f"rank {rank} sent nothing within {_RANK_TIMEOUT_S} s")
            try:
                status, payload = conn.recv()
            except EOFError:
                procs[rank].join(_JOIN_TIMEOUT_S)
                pytest.fail(f"rank {rank} died (exit code {procs[rank].exitcode}) before reporting")
            assert status == "ok", f"rank {rank} failed:\n{payload}"
            results.append(payload)
        for proc in procs:
            proc.join(_JOIN_TIMEOUT_S)
            assert proc.exitcode == 0
        return results
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(_JOIN_TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
                proc.join(_JOIN_TIMEOUT_S)
            proc.close()
        for conn in conns:
            conn.close()


@pytest.mark.multiprocess
def test_two_real_ranks_disjoint_and_complete() -> None:
    """Two gloo ranks on CPU: the sampler (padded and even=False) and ShardedIterable
    split the data disjointly and completely, and one rank's state resumes both."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    r0, r1 = _run_ranks(2, _N)
    assert r0["world"] == (2, 0, 2, 0) and r1["world"] == (2, 1, 2, 1)
    # Training mode: padded to 104, each rank 52, all of range(n) covered, one repeat.
    train = r0["train"] + r1["train"]
    assert len(r0["train"]) == len(r1["train"]) == 52
    assert sorted(set(train)) == list(range(_N)) and len(train) == _N + 1
    # Every rank resumed from rank 0's state yields what it would have.
    state = {"kind": "DistributedSampler", "seed": 5, "epoch": 2}
    assert r0["states"] == r1["states"] == [state, state]
    assert r0["resumed"] == r0["train"] and r1["resumed"] == r1["train"]
    # Evaluation mode: every index exactly once, lengths 52 and 51.
    assert sorted(r0["eval"] + r1["eval"]) == list(range(_N))
    assert (r0["eval_len"], r1["eval_len"]) == (52, 51) == (len(r0["eval"]), len(r1["eval"]))
    # Iterable sharding, ranks x workers, with 1 and 3 workers per rank.
    for workers in (1, 3):
        shards = r0["shards"][workers] + r1["shards"][workers]
        flat = [i for shard in shards for i in shard]
        assert sorted(flat) == list(range(_N)), workers
