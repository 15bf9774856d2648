"""Hostile input to the formats: damaged LMDB files, shards and indexes, failing writers.

Every file here is a real file damaged by the test (cut, overwritten, bit-flipped). Cases
that could kill the interpreter (LMDB maps files, and a bad map is SIGBUS, not an
exception) run in a subprocess, so a regression shows as a failed test, not a dead pytest.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from stoker.formats import (
    CorruptRecordError,
    ShardDataset,
    ShardIterable,
    ShardWriter,
)

_SUBPROCESS_TIMEOUT_S = 60.0


def run_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (same PYTHONPATH); bounded."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=_SUBPROCESS_TIMEOUT_S,
    )


def write_lmdb(path: Path, n: int = 200) -> None:
    """An LMDB file of ``n`` samples of 4 KB each: about 100 pages of data."""
    from stoker.formats import LMDBWriter

    with LMDBWriter(path) as w:
        for i in range(n):
            w.write((np.full(1000, i, dtype=np.int32), i))


def write_numbers(pattern: str, n: int, maxcount: int = 100) -> list[str]:
    """Shards of samples ``{"cls": i, "bin": 64 bytes of i}``."""
    with ShardWriter(pattern, maxcount=maxcount) as w:
        for i in range(n):
            w.write({"cls": i, "bin": bytes([i % 256]) * 64})
    return w.shards


# -- LMDB ---------------------------------------------------------------------------------

READ_ALL = """
import json, sys
from stoker.formats import LMDBDataset
from stoker._cli import main
out = {}
for path in sys.argv[1:]:
    try:
        ds = LMDBDataset(path)
        out[path] = ["read", sum(ds[i][1] for i in range(len(ds)))]
    except Exception as exc:
        out[path] = [type(exc).__name__, str(exc), isinstance(exc, ValueError)]
    out[path].append(main(["inspect", path]))
print(json.dumps(out))
"""


def test_truncated_lmdb_raises_naming_the_file_not_sigbus(tmp_path: Path) -> None:
    """An LMDB file cut to 50%, 90% or 99% raises an error naming it (reader and inspect),
    where LMDB alone kills the process with SIGBUS."""
    pytest.importorskip("lmdb")
    good = tmp_path / "good.lmdb"
    write_lmdb(good)
    data = good.read_bytes()
    paths = []
    for pct in (50, 90, 99):
        cut = tmp_path / f"cut{pct}.lmdb"
        cut.write_bytes(data[: len(data) * pct // 100])
        paths.append(str(cut))
    proc = run_python(READ_ALL, str(good), *paths)
    assert proc.returncode == 0, (
        f"exit {proc.returncode} (negative: killed by a signal)\n{proc.stderr}"
    )
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out[str(good)] == ["read", sum(range(200)), 0]
    for path in paths:
        kind, message, is_value_error, inspect_status = out[path]
        assert kind == "CorruptRecordError" and is_value_error
        assert path in message and "truncated" in message and "copy it again" in message
        assert inspect_status == 1
    assert proc.stderr.count("stoker inspect: error: truncated LMDB file") == 3


@pytest.mark.parametrize(
    "content", [b"", b"hello, world\n" * 100, os.urandom(20000)], ids=["empty", "text", "random"]
)
def test_non_lmdb_file_raises_value_error_naming_it(tmp_path: Path, content: bytes) -> None:
    """An empty, text or random file given as an LMDB file raises ValueError naming it,
    as the docstring says (LMDB itself raises lmdb.Error)."""
    pytest.importorskip("lmdb")
    from stoker.formats import LMDBDataset

    path = tmp_path / "not.lmdb"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="not an LMDB file") as err:
        LMDBDataset(path)
    assert str(path) in str(err.value)


def test_lmdb_writer_failing_at_close_leaves_no_temporary_or_lock_file(tmp_path: Path) -> None:
    """When the final rename fails (a folder took the file's name), close raises and the
    temporary file and its lock file are gone; what stands under the name is untouched."""
    pytest.importorskip("lmdb")
    from stoker.formats import LMDBWriter

    path = tmp_path / "out.lmdb"
    writer = LMDBWriter(path)
    with pytest.raises(OSError), writer:
        writer.write((b"abc", 1))
        path.mkdir()
        (path / "keep").write_bytes(b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.lmdb"]
    assert [p.name for p in path.iterdir()] == ["keep"]


# -- shards -------------------------------------------------------------------------------


def flip_member_byte(shard: str, member: int) -> None:
    """Flip one byte in the data of ``member`` (its offset read from the shard's index)."""
    doc = json.loads(Path(shard + ".index.json").read_bytes())
    offset = doc["offset"][member] + 3
    with open(shard, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x40]))


def test_shard_iterable_verifies_crcs_like_shard_dataset(tmp_path: Path) -> None:
    """A flipped byte in a shard with its index beside it: both readers raise
    CorruptRecordError naming the shard and the key; without verify both deliver it."""
    (shard,) = write_numbers(str(tmp_path / "s-%d.tar"), 6)
    flip_member_byte(shard, 2 * 3 + 1)  # sample 3's "bin" (members: cls, bin per sample)
    with pytest.raises(CorruptRecordError, match="CRC-32") as mapped:
        [ShardDataset(shard)[i] for i in range(6)]
    with pytest.raises(CorruptRecordError, match="CRC-32") as streamed:
        list(ShardIterable(shard, buffer_size=0, seed=0))
    for err in (mapped, streamed):
        assert shard in str(err.value) and "'000000003'" in str(err.value)
    got = [s["bin"] for s in ShardIterable(shard, buffer_size=0, seed=0, verify=False)]
    assert got[3] != bytes([3]) * 64 and got[4] == bytes([4]) * 64


def damage(doc: dict[str, object], how: str) -> bytes:
    """The index ``doc`` damaged as ``how`` says."""
    d = json.loads(json.dumps(doc))
    if how == "truncated":
        return json.dumps(d).encode()[: len(json.dumps(d)) // 2]
    if how == "huge size":
        d["size"][1] = 1 << 40  # type: ignore[index]
    elif how == "negative offset":
        d["offset"][1] = -512  # type: ignore[index]
    elif how == "starts past members":
        d["starts"][-1] = 10**6  # type: ignore[index]
    elif how == "absurd count":
        d["keys"] = d["keys"] * 1000  # type: ignore[operator]
    elif how == "field out of range":
        d["field"][0] = 99  # type: ignore[index]
    elif how == "wrong types":
        d["offset"] = "everywhere"
    return json.dumps(d).encode()


DAMAGE = [
    "truncated",
    "huge size",
    "negative offset",
    "starts past members",
    "absurd count",
    "field out of range",
    "wrong types",
]


@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_index_raises_value_error_naming_shard_and_index(tmp_path: Path, how: str) -> None:
    """A damaged index (cut, absurd counts or offsets, wrong types) gives a ValueError naming
    the shard and the index in every reader and in inspect: never MemoryError, OSError
    [Errno 22] or IndexError."""
    from stoker.formats import inspect

    (shard,) = write_numbers(str(tmp_path / "s-%d.tar"), 6)
    index = Path(shard + ".index.json")
    index.write_bytes(damage(json.loads(index.read_bytes()), how))
    readers = [
        lambda: [ShardDataset(shard)[i] for i in range(6)],
        lambda: list(ShardIterable(shard, buffer_size=0, seed=0)),
        lambda: inspect(shard),
    ]
    for read in readers:
        with pytest.raises(ValueError, match="damaged index") as err:
            read()
        assert str(index) in str(err.value) and "Delete the index" in str(err.value)
    index.unlink()  # the fix the message gives: the index is rebuilt from the shard
    assert [ShardDataset(shard)[i]["cls"] for i in range(6)] == list(range(6))


NOT_AN_INDEX = {
    "empty": b"",
    "not JSON": b"\x00\xffgarbage{",
    "a JSON list": b"[]",
    "another format": b'{"format": "webdataset-wids", "shards": []}',
    "no format": b'{"hello": "world"}',
}


@pytest.mark.parametrize("how", list(NOT_AN_INDEX))
def test_a_file_that_is_no_index_is_rebuilt_from_the_intact_shard(tmp_path: Path, how: str) -> None:
    """An index file that holds no stoker index at all (empty, not JSON, ``[]``, another
    format): the shard is intact and the index derived data, so both readers read the
    shard with a warning naming the file (the stream as without an index), and ShardDataset
    saves the index it rebuilt over it."""
    (shard,) = write_numbers(str(tmp_path / "s-%d.tar"), 6)
    index = Path(shard + ".index.json")
    readers = [
        lambda: [s["cls"] for s in ShardIterable(shard, buffer_size=0, seed=0)],
        lambda: [ShardDataset(shard)[i]["cls"] for i in range(6)],
    ]
    for read in readers:
        index.write_bytes(NOT_AN_INDEX[how])
        with pytest.warns(RuntimeWarning, match="is not a stoker index") as seen:
            assert read() == list(range(6))
        assert str(index) in str(seen[0].message) and "rebuilt from the shard" in str(
            seen[0].message
        )
    assert json.loads(index.read_bytes())["format"] == "stoker-tar-index"  # saved over it


def test_bit_flipped_index_raises_value_error_naming_the_shard(tmp_path: Path) -> None:
    """One flipped bit at 40 places of an index: every read raises a ValueError naming the
    shard (the index's checksum finds flips that leave valid JSON: a field name, a size)."""
    (shard,) = write_numbers(str(tmp_path / "s-%d.tar"), 6)
    index = Path(shard + ".index.json")
    good = index.read_bytes()
    rng = np.random.default_rng(0)
    for pos in rng.choice(len(good), 40, replace=False):
        bad = bytearray(good)
        bad[int(pos)] ^= 1 << int(rng.integers(8))
        for read in (
            lambda: [ShardDataset(shard)[i]["cls"] for i in range(6)],
            lambda: [s["cls"] for s in ShardIterable(shard, buffer_size=0, seed=0)],
        ):
            index.write_bytes(bytes(bad))
            with pytest.raises(ValueError, match="damaged index") as err:
                read()
            assert shard in str(err.value)


# -- paths --------------------------------------------------------------------------------


@pytest.mark.parametrize("odd", ["run[1]", "what?", "all*", "s-{0..1}"])
def test_existing_paths_with_pattern_characters_read_as_they_are(tmp_path: Path, odd: str) -> None:
    """A folder or shard whose name holds [, ?, * or a brace range reads back as itself (the
    folder, an explicit list, one shard); a pattern naming nothing is still expanded."""
    folder = tmp_path / odd
    shards = write_numbers(str(folder / f"{odd}-%d.tar"), 6, maxcount=2)
    assert len(shards) == 3
    every = list(range(6))
    for urls in (str(folder), folder, shards, shards[0]):
        got = [s["cls"] for s in ShardIterable(urls, buffer_size=0, shuffle_shards=False)]
        assert got == (every if urls != shards[0] else [0, 1])
        assert len(ShardDataset(urls)) == len(got)
    if "{" not in odd:  # braces have no escape: a pattern under such a folder cannot name it
        pattern = os.path.join(glob.escape(str(folder)), "*.tar")
        assert ShardDataset(pattern).urls == shards


# -- writers and bad values ---------------------------------------------------------------


def test_shard_writer_failing_at_close_leaves_no_temporary_file_or_orphan_index(
    tmp_path: Path,
) -> None:
    """When the last shard cannot take its name (a folder took it), close raises and leaves
    neither the temporary shard nor an index without its shard."""
    writer = ShardWriter(str(tmp_path / "s-%d.tar"))
    with pytest.raises(OSError), writer:
        writer.write({"cls": 1})
        (tmp_path / "s-0.tar").mkdir()
        (tmp_path / "s-0.tar" / "keep").write_bytes(b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s-0.tar"]
    assert [p.name for p in (tmp_path / "s-0.tar").iterdir()] == ["keep"]


@pytest.mark.parametrize("how", ["flipped header", "cut at a member boundary"])
def test_damaged_tar_structure_raises_naming_the_shard(tmp_path: Path, how: str) -> None:
    """A flipped bit in a member's tar header, or a shard cut just before a header (no
    index beside it): both readers raise a ValueError naming the shard, where tarfile
    alone ends the stream there and the samples after it are silently lost."""
    (shard,) = write_numbers(str(tmp_path / "s-%d.tar"), 6)
    os.unlink(shard + ".index.json")
    data = bytearray(Path(shard).read_bytes())
    headers = [i for i in range(0, len(data), 512) if data[i + 257 : i + 262] == b"ustar"]
    if how == "flipped header":
        data[headers[4] + 2] ^= 0x08  # member 4's name: its checksum no longer matches
    else:
        del data[headers[4] :]
    Path(shard).write_bytes(bytes(data))
    for read in (lambda: ShardDataset(shard), lambda: list(ShardIterable(shard, seed=0))):
        with pytest.raises(ValueError, match="truncated or corrupt shard") as err:
            read()
        assert shard in str(err.value) and "000000001.bin" in str(err.value)


LMDB_FLIPS = """
import sys
import numpy as np
from stoker.formats import LMDBDataset
good = open(sys.argv[1], "rb").read()
for seed in range(int(sys.argv[2])):
    data = bytearray(good)
    rng = np.random.default_rng(seed)
    for _ in range(8):  # past the two meta pages: branch, leaf and overflow pages
        data[int(rng.integers(2 * 4096, len(data)))] ^= 1 << int(rng.integers(8))
    path = f"{sys.argv[3]}/flip{seed}.lmdb"
    open(path, "wb").write(bytes(data))
    print(seed, end=" ", flush=True)  # a crash shows after the seed that caused it
    try:
        ds = LMDBDataset(path)
        [ds[i] for i in range(len(ds))]
        print("read", flush=True)
    except ValueError as exc:
        assert path in str(exc), exc
        print("ValueError", flush=True)
"""


def test_bit_flipped_lmdb_pages_never_kill_the_process(tmp_path: Path) -> None:
    """Flipped bits in an LMDB file's data pages (20 seeds): each read delivers or raises a
    ValueError naming the file; none crashes the interpreter. LMDB keeps no checksums, so
    a flip inside a value's bytes arrives as data (shards, with CRC-32s, catch it)."""
    pytest.importorskip("lmdb")
    good = tmp_path / "good.lmdb"
    write_lmdb(good)
    proc = run_python(LMDB_FLIPS, str(good), "20", str(tmp_path))
    assert proc.returncode == 0, f"exit {proc.returncode} at seed {proc.stdout}\n{proc.stderr}"
    outcomes = [line.split()[1] for line in proc.stdout.splitlines()]
    assert len(outcomes) == 20 and set(outcomes) <= {"read", "ValueError"}
    assert "ValueError" in outcomes


def test_bad_values_to_writers_and_pack_are_refused_up_front(tmp_path: Path) -> None:
    """Bad sizes, counts and paths are ValueErrors naming the value before anything is
    written; pack never writes over its own source."""
    from stoker.formats import LMDBDataset, LMDBWriter, inspect, pack

    pytest.importorskip("lmdb")
    with pytest.raises(ValueError, match="map_size must be a positive"):
        LMDBWriter(tmp_path / "m.lmdb", map_size=-1)
    src = tmp_path / "src"
    write_numbers(str(src / "s-%d.tar"), 3)
    for kwargs in ({"maxcount": 0}, {"maxsize": float("nan")}, {"maxcount": 2.5}):
        with pytest.raises(ValueError, match="must be a positive"):
            pack(src, tmp_path / "out", "shards", progress=False, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="replace the source"):
        pack(src, src, "shards", overwrite=True, progress=False)
    with pytest.raises(ValueError, match="replace the source"):
        pack(src, tmp_path, "lmdb", overwrite=True, progress=False)
    assert len(ShardDataset(src)) == 3  # the source is intact
    with pytest.raises(ValueError, match="samples must be a non-negative"):
        inspect(src, samples=-1)
    with pytest.raises(FileNotFoundError, match=r"without an LMDB data\.mdb"):
        LMDBDataset(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
