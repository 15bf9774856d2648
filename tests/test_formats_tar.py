"""Tar shards: writer, indexed map-style reader, streaming reader, safety checks."""

from __future__ import annotations

import io
import os
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

import stoker
from stoker.formats import (
    CorruptRecordError,
    ShardDataset,
    ShardIterable,
    ShardWriter,
    TruncatedShardError,
    pack,
)


def make_folder(root: Path, count: int = 12, classes: int = 3) -> list[tuple[bytes, int]]:
    """Write small JPEGs into class folders; return (bytes, label) in ImageFolder order."""
    from PIL import Image

    rng = np.random.default_rng(1)
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True)
    for i in range(count):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)).save(buf, "JPEG")
        (root / f"c{i % classes}" / f"{i:03d}.jpg").write_bytes(buf.getvalue())
    return [(p.read_bytes(), c) for c in range(classes) for p in sorted((root / f"c{c}").iterdir())]


def write_numbers(pattern: str, n: int, maxcount: int) -> list[str]:
    """Shards of samples (i as .cls, a 2-vector as .npy), keys 000000000 ..."""
    with ShardWriter(pattern, maxcount=maxcount) as w:
        for i in range(n):
            w.write({"cls": i, "npy": np.array([i, -i], dtype=np.int16)})
    return w.shards


def test_roundtrip_folder_pack_loader_gives_original_bytes(tmp_path: Path) -> None:
    """folder -> pack(shards) -> DataLoader gives the original bytes and labels, 0 workers."""
    expected = make_folder(tmp_path / "img")
    summary = pack(tmp_path / "img", tmp_path / "sh", "shards", maxcount=5, progress=False)
    assert summary.samples == 12 and len(summary.files) == 6  # 3 shards + 3 indexes
    ds = ShardDataset(tmp_path / "sh")
    assert len(ds.urls) == 3 and ds.classes == ["c0", "c1", "c2"]
    got = [s for b in stoker.DataLoader(ds, batch_size=5, collate_fn=list) for s in b]
    assert got == expected


def test_roundtrip_with_two_workers(tmp_path: Path) -> None:
    """The same round trip through two worker processes."""
    expected = make_folder(tmp_path / "img")
    pack(tmp_path / "img", tmp_path / "sh", "shards", maxcount=4, progress=False)
    ds = ShardDataset(tmp_path / "sh")
    assert ds[0] == expected[0]  # files opened in the parent before the fork
    loader = stoker.DataLoader(ds, batch_size=3, num_workers=2, collate_fn=list)
    assert [s for b in loader for s in b] == expected


def test_writer_rolls_by_count_and_size(tmp_path: Path) -> None:
    """maxcount and maxsize start new shards; each has an index and no temp file remains."""
    shards = write_numbers(str(tmp_path / "a-%03d.tar"), 10, maxcount=4)
    assert [os.path.basename(s) for s in shards] == ["a-000.tar", "a-001.tar", "a-002.tar"]
    assert all(os.path.exists(s + ".index.json") for s in shards)
    with ShardWriter(str(tmp_path / "b-%03d.tar"), maxsize=6200) as w:  # 2 per shard
        for _ in range(6):
            w.write({"bin": bytes(1500)})
    assert len(w.shards) == 3
    assert not [n for n in os.listdir(tmp_path) if "stoker-tmp" in n]
    ds = ShardDataset(str(tmp_path / "a-{000..002}.tar"), fields=["cls", "npy"])
    assert [ds[i][0] for i in range(10)] == list(range(10))
    np.testing.assert_array_equal(ds[7][1], [7, -7])


def test_shards_read_with_tarfile(tmp_path: Path) -> None:
    """Shards are plain tars with KEY.FIELD members in order (WebDataset layout)."""
    (shard,) = write_numbers(str(tmp_path / "s-%d.tar"), 2, maxcount=10)
    with tarfile.open(shard) as tf:
        assert tf.getnames() == [
            "000000000.cls",
            "000000000.npy",
            "000000001.cls",
            "000000001.npy",
        ]
        assert tf.extractfile("000000001.cls").read() == b"1"  # type: ignore[union-attr]


def test_missing_or_stale_index_is_rebuilt(tmp_path: Path) -> None:
    """Without its index (or with a stale one) a shard is scanned and the index rewritten."""
    (shard,) = write_numbers(str(tmp_path / "s-%d.tar"), 5, maxcount=10)
    index = Path(shard + ".index.json")
    good = index.read_bytes()
    index.unlink()
    ds = ShardDataset(shard, fields=["cls"])
    assert [ds[i] for i in range(5)] == [0, 1, 2, 3, 4]
    assert index.exists()
    write_numbers(str(tmp_path / "s-%d.tar"), 6, maxcount=10)  # a new shard of the same name
    current = index.read_bytes()
    index.write_bytes(good)  # the index of the 5-sample shard: stale now
    assert ShardDataset(shard, fields=["cls"])[5] == 5
    assert index.read_bytes() == current


def test_foreign_shards_read_as_dicts(tmp_path: Path) -> None:
    """A tar made by another tool (no index, no metadata) reads as dicts with __key__."""
    path = tmp_path / "w.tar"
    with tarfile.open(path, "w") as tf:
        for name, data in [("a/x1.txt", b"hello"), ("a/x1.json", b'{"k": 1}'), ("a/x2.txt", b"")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    ds = ShardDataset(path)
    assert ds[0] == {"__key__": "a/x1", "txt": "hello", "json": {"k": 1}}
    assert ds[1] == {"__key__": "a/x2", "txt": ""}
    assert list(ShardIterable(path, buffer_size=0, seed=0)) == [ds[0], ds[1]]


@pytest.mark.parametrize("name", ["../evil.txt", "/etc/evil.txt", "a/../../evil.txt"])
def test_unsafe_member_names_are_rejected(tmp_path: Path, name: str) -> None:
    """Members with absolute paths or '..' raise ValueError naming the member, both readers."""
    path = tmp_path / "bad.tar"
    with tarfile.open(path, "w") as tf:
        info = tarfile.TarInfo(name)
        info.size = 3
        tf.addfile(info, io.BytesIO(b"abc"))
    with pytest.raises(ValueError, match="malicious") as err:
        ShardDataset(path)
    assert repr(name) in str(err.value) and str(path) in str(err.value)
    with pytest.raises(ValueError, match="malicious"):
        list(ShardIterable(path, seed=0))


def test_links_are_rejected(tmp_path: Path) -> None:
    """A symlink member is refused: shards hold regular files only."""
    path = tmp_path / "link.tar"
    with tarfile.open(path, "w") as tf:
        info = tarfile.TarInfo("k.txt")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        tf.addfile(info)
    with pytest.raises(ValueError, match="link"):
        ShardDataset(path)


def test_truncated_shard_error_names_file_and_key(tmp_path: Path) -> None:
    """Cutting a shard inside a member: both readers raise naming the shard and the key."""
    with ShardWriter(str(tmp_path / "t-%d.tar")) as w:
        for i in range(4):
            w.write({"__key__": f"k{i}", "bin": bytes([i]) * 3000})
    shard = w.shards[0]
    size = os.path.getsize(shard)
    with open(shard, "r+b") as f:
        f.truncate(size - 1024 - 2000)  # inside the data of k3
    with pytest.raises(TruncatedShardError, match="k3") as err:
        ShardDataset(shard)  # the index is stale now: the scan that rebuilds it fails
    assert shard in str(err.value)
    with pytest.raises(TruncatedShardError, match="k3"):
        list(ShardIterable(shard, seed=0))


def test_truncated_shard_with_kept_index_names_key(tmp_path: Path) -> None:
    """A shard cut after its index was loaded: reading the lost member names file and key."""
    with ShardWriter(str(tmp_path / "t-%d.tar")) as w:
        for i in range(4):
            w.write({"__key__": f"k{i}", "bin": bytes([i]) * 3000})
    ds = ShardDataset(w.shards[0], fields=["bin"])
    with open(w.shards[0], "r+b") as f:
        f.truncate(4000)
    assert ds[0] == b"\0" * 3000
    with pytest.raises(TruncatedShardError, match=r"'k2'") as err:
        ds[2]
    assert w.shards[0] in str(err.value)


def test_corrupt_member_fails_crc_check(tmp_path: Path) -> None:
    """A flipped byte in a member's data raises CorruptRecordError naming file and key."""
    with ShardWriter(str(tmp_path / "c-%d.tar")) as w:
        w.write({"__key__": "one", "bin": b"x" * 100})
        w.write({"__key__": "two", "bin": b"y" * 100})
    ds = ShardDataset(w.shards[0], fields=["bin"])
    offset = int(ds.indexes[0].offset[1])
    with open(w.shards[0], "r+b") as f:
        f.seek(offset + 5)
        f.write(b"Z")
    assert ds[0] == b"x" * 100
    with pytest.raises(CorruptRecordError, match="'two'"):
        ds[1]
    assert ShardDataset(w.shards[0], fields=["bin"], verify=False)[1][5:6] == b"Z"


def test_iterable_yields_every_sample_once_shuffled(tmp_path: Path) -> None:
    """One pass yields each sample once; the order depends on seed and epoch only."""
    shards = write_numbers(str(tmp_path / "s-%02d.tar"), 40, maxcount=7)
    it = ShardIterable(shards, fields=["cls"], buffer_size=8, seed=3)
    first = list(it)
    assert sorted(first) == list(range(40)) and first != list(range(40))
    assert list(ShardIterable(shards, fields=["cls"], buffer_size=8, seed=3)) == first
    it.set_epoch(1)
    assert list(it) != first
    plain = ShardIterable(shards, fields=["cls"], shuffle_shards=False, buffer_size=0)
    assert list(plain) == list(range(40))


def test_iterable_splits_across_two_workers(tmp_path: Path) -> None:
    """With 2 workers every sample arrives exactly once."""
    shards = write_numbers(str(tmp_path / "s-%02d.tar"), 30, maxcount=4)
    ds = ShardIterable(shards, fields=["cls"], buffer_size=5)
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=2)
    got = [int(x) for b in loader for x in b]
    assert sorted(got) == list(range(30))


@pytest.mark.parametrize("maxcount", [3, 50])  # many shards, then fewer shards than ranks
def test_iterable_splits_across_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, maxcount: int
) -> None:
    """Ranks from RANK/WORLD_SIZE get disjoint samples that together cover the data."""
    shards = write_numbers(str(tmp_path / "s-%02d.tar"), 20, maxcount=maxcount)
    seen: list[int] = []
    monkeypatch.setenv("WORLD_SIZE", "3")
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        part = list(ShardIterable(shards, fields=["cls"], seed=5, buffer_size=4))
        assert part
        seen += part
    assert sorted(seen) == list(range(20))


def test_iterable_resumes_where_it_stopped(tmp_path: Path) -> None:
    """state_dict after k samples + load_state_dict on a new reader gives the exact rest."""
    shards = write_numbers(str(tmp_path / "s-%02d.tar"), 25, maxcount=6)
    full = list(ShardIterable(shards, fields=["cls"], buffer_size=6, seed=11))
    it = ShardIterable(shards, fields=["cls"], buffer_size=6, seed=11)
    stream = iter(it)
    head = [next(stream) for _ in range(9)]
    state = it.state_dict()
    assert state["consumed"] == 9 and state["seed"] == 11
    fresh = ShardIterable(shards, fields=["cls"], buffer_size=6, seed=11)
    fresh.load_state_dict(state)
    assert head + list(fresh) == full
    with pytest.raises(ValueError, match="consumers"):
        fresh.load_state_dict({**state, "consumers": 4})


def test_iterable_without_seed_draws_from_global_rng(tmp_path: Path) -> None:
    """seed=None: seeding the global RNG (torch's once imported, else NumPy's) repeats it."""
    shards = write_numbers(str(tmp_path / "s-%02d.tar"), 20, maxcount=5)
    it = ShardIterable(shards, fields=["cls"], buffer_size=5)

    def seed_globals() -> None:
        np.random.seed(0)
        if "torch" in sys.modules:
            sys.modules["torch"].manual_seed(0)

    seed_globals()
    a = list(it)
    seed_globals()
    assert list(it) == a


def test_writer_validates_arguments(tmp_path: Path) -> None:
    """A pattern without a slot or a bad maxcount is a ValueError saying what to pass."""
    with pytest.raises(ValueError, match="%d"):
        ShardWriter(str(tmp_path / "plain.tar"))
    with pytest.raises(ValueError, match="maxcount"):
        ShardWriter(str(tmp_path / "s-%d.tar"), maxcount=0)
    with pytest.raises(FileNotFoundError, match="no shard"):
        ShardDataset(str(tmp_path / "none-*.tar"))
