"""ShardIterable resumes mid-pass in O(1): its state says where its reader stands and which
samples its shuffle buffer holds, so a resume reads those and what follows, nothing else;
through the loader, each worker resumes from its own state."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import stoker
from stoker.formats import ShardIterable, ShardWriter
from test_stateful import _batches, _resumed


def _shards(tmp_path: Path, n: int, maxcount: int) -> list[str]:
    with ShardWriter(str(tmp_path / "s-%02d.tar"), maxcount=maxcount) as w:
        for i in range(n):
            w.write({"cls": i, "bin": bytes([i % 256]) * 700})  # members over 512 bytes
    return w.shards


def _reader(shards: list[str], buffer_size: int) -> ShardIterable:
    return ShardIterable(shards, fields=["cls"], buffer_size=buffer_size, seed=7)


@pytest.mark.parametrize("buffer_size", [0, 5])
def test_resumes_exactly_after_every_sample(tmp_path: Path, buffer_size: int) -> None:
    """After any sample of a pass (in a shard, at a shard's end, while the buffer drains),
    a new reader given the state (through JSON) yields exactly the rest."""
    shards = _shards(tmp_path, 23, maxcount=6)
    full = list(_reader(shards, buffer_size))
    for cut in range(1, len(full) + 1):  # before its first sample, a reader has no state
        saver = _reader(shards, buffer_size)
        stream = iter(saver)
        head = [next(stream) for _ in range(cut)]
        state = json.loads(json.dumps(saver.state_dict()))
        fresh = _reader(shards, buffer_size)
        fresh.load_state_dict(state)
        assert head + list(fresh) == full, cut


def test_fewer_shards_than_consumers_resume_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One shard read by 3 ranks (every 3rd sample each) resumes exactly too."""
    shards = _shards(tmp_path, 20, maxcount=50)
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "1")
    full = list(_reader(shards, 3))
    for cut in range(1, len(full)):
        saver = _reader(shards, 3)
        stream = iter(saver)
        head = [next(stream) for _ in range(cut)]
        fresh = _reader(shards, 3)
        fresh.load_state_dict(saver.state_dict())
        assert head + list(fresh) == full, cut


def test_resume_reads_nothing_before_its_position(tmp_path: Path) -> None:
    """The shards a state no longer needs (every sample read, none buffered) may be gone:
    a resume never opens them, where a replay would read them all again."""
    shards = _shards(tmp_path, 40, maxcount=5)
    full = list(_reader(shards, 3))
    saver = _reader(shards, 3)
    stream = iter(saver)
    head = [next(stream) for _ in range(30)]
    state = saver.state_dict()
    position = state["position"]
    needed = {position["shard"]} | {shard for shard, _ in position["buffer"]}
    urls, _ = saver.plan(7, 0, 0, 1)
    gone = [url for i, url in enumerate(urls) if i < min(needed)]
    assert len(gone) >= 4
    for url in gone:
        os.remove(url)
    fresh = _reader(shards, 3)
    fresh.load_state_dict(state)
    assert head + list(fresh) == full


def test_older_state_without_position_still_resumes(tmp_path: Path) -> None:
    """A state of an older stoker (no "position") resumes by counting samples again."""
    shards = _shards(tmp_path, 17, maxcount=4)
    full = list(_reader(shards, 4))
    saver = _reader(shards, 4)
    stream = iter(saver)
    head = [next(stream) for _ in range(9)]
    state = {k: v for k, v in saver.state_dict().items() if k != "position"}
    fresh = _reader(shards, 4)
    fresh.load_state_dict(state)
    assert head + list(fresh) == full


@pytest.mark.parametrize("persistent", [False, True], ids=["workers", "persistent"])
def test_loader_resumes_shards_at_every_batch(tmp_path: Path, persistent: bool) -> None:
    """Through the loader with 2 workers (each its own shards), a checkpoint after any batch
    resumes exactly, each worker from its own state; persistent workers in place."""
    shards = _shards(tmp_path, 26, maxcount=4)

    def make() -> stoker.DataLoader[Any]:
        ds = _reader(shards, 3)
        return stoker.DataLoader(ds, batch_size=3, num_workers=2, persistent_workers=persistent)

    full = _batches(make())
    for cut in range(len(full) + 1):
        head, rest, loader = _resumed(make, cut, same_loader=persistent)
        assert head + rest == full, cut
        assert loader.statistics().resume == "state"


def test_remote_shards_resume_exactly() -> None:
    """Remote shards (fsspec's memory://, no cache) resume from the position too: the
    stream opened at its byte, the buffered samples read back by range."""
    pytest.importorskip("fsspec")
    with ShardWriter("memory://resume/s-%02d.tar", maxcount=5) as w:
        for i in range(18):
            w.write({"cls": i, "bin": bytes([i]) * 600})
    full = list(_reader(w.shards, 4))
    for cut in (3, 11, 16):
        saver = _reader(w.shards, 4)
        stream = iter(saver)
        head = [next(stream) for _ in range(cut)]
        fresh = _reader(w.shards, 4)
        fresh.load_state_dict(json.loads(json.dumps(saver.state_dict())))
        assert head + list(fresh) == full, cut
