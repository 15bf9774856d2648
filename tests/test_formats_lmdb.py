"""LMDB files: writer, reader, codecs, atomic writes, fork safety and corrupt records."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest

lmdb = pytest.importorskip("lmdb")

import stoker  # noqa: E402
from stoker.formats import CorruptRecordError, LMDBDataset, LMDBWriter, pack  # noqa: E402


def make_folder(root: Path, count: int = 12, classes: int = 3) -> list[tuple[bytes, int]]:
    """Write small JPEGs (and one PNG) into class folders; return (bytes, label) in
    ImageFolder order."""
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True)
    for i in range(count):
        c = i % classes
        arr = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
        buf = io.BytesIO()
        fmt, ext = ("PNG", "png") if i == 0 else ("JPEG", "jpg")
        Image.fromarray(arr).save(buf, fmt)
        (root / f"c{c}" / f"{i:03d}.{ext}").write_bytes(buf.getvalue())
    for c in range(classes):
        for p in sorted((root / f"c{c}").iterdir()):
            out.append((p.read_bytes(), c))
    return out


def test_roundtrip_folder_pack_loader_gives_original_bytes(tmp_path: Path) -> None:
    """folder -> pack(lmdb) -> DataLoader gives exactly the original bytes and labels."""
    expected = make_folder(tmp_path / "img")
    summary = pack(tmp_path / "img", tmp_path / "d.lmdb", "lmdb", progress=False)
    assert summary.samples == len(expected)
    ds = LMDBDataset(tmp_path / "d.lmdb")
    assert ds.classes == ["c0", "c1", "c2"]
    loader = stoker.DataLoader(ds, batch_size=5, collate_fn=list)
    got = [s for batch in loader for s in batch]
    assert got == expected


def test_roundtrip_with_two_workers(tmp_path: Path) -> None:
    """The same round trip through two worker processes, each opening its own handle."""
    expected = make_folder(tmp_path / "img")
    pack(tmp_path / "img", tmp_path / "d.lmdb", "lmdb", progress=False)
    ds = LMDBDataset(tmp_path / "d.lmdb")
    assert ds[3] == expected[3]  # the parent reads first: a handle exists before the fork
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=list)
    got = [s for batch in loader for s in batch]
    assert got == expected


def test_handle_is_reopened_in_another_process(tmp_path: Path) -> None:
    """After a fork the child opens its own environment instead of the inherited one."""
    with LMDBWriter(tmp_path / "x.lmdb") as w:
        w.write((b"a", 1))
    ds = LMDBDataset(tmp_path / "x.lmdb")
    ds[0]
    parent_env = ds._env
    r, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: read, and report whether a new handle was made
        ok = ds[0] == (b"a", 1) and ds._env is not parent_env and ds._pid == os.getpid()
        os.write(wfd, b"1" if ok else b"0")
        os._exit(0)
    os.close(wfd)
    answer = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert answer == b"1"
    assert ds._env is parent_env
    ds._close_env()


def test_codecs_roundtrip_arrays_json_text_and_dicts(tmp_path: Path) -> None:
    """npy arrays, JSON, ints and text come back equal; dict samples come back as dicts."""
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    with LMDBWriter(tmp_path / "t.lmdb") as w:
        w.write((arr, {"a": [1, 2]}, 7, "hi"))
        w.write((arr * 2, None, 8, "yo"))
    ds = LMDBDataset(tmp_path / "t.lmdb")
    x, meta, label, text = ds[1]
    np.testing.assert_array_equal(x, arr * 2)
    assert x.dtype == np.float32 and (meta, label, text) == (None, 8, "yo")
    assert ds[0][1] == {"a": [1, 2]}
    with LMDBWriter(tmp_path / "d.lmdb") as w:
        w.write({"__key__": "k1", "npy": arr, "json": {"b": 1}})
    d = LMDBDataset(tmp_path / "d.lmdb")
    assert d[0]["__key__"] == "k1" and d[0]["json"] == {"b": 1}
    assert LMDBDataset(tmp_path / "d.lmdb", fields=["json"])[0] == {"b": 1}


def test_object_arrays_are_refused_not_pickled(tmp_path: Path) -> None:
    """An object array cannot be stored as .npy: TypeError pointing to JSON, no pickle."""
    with pytest.raises(TypeError, match="json"), LMDBWriter(tmp_path / "o.lmdb") as w:
        w.write((np.array([{"a": 1}], dtype=object),))
    assert not (tmp_path / "o.lmdb").exists()


def test_interrupted_writer_leaves_old_file_intact(tmp_path: Path) -> None:
    """An exception inside the writer keeps the old file and leaves no temporary file."""
    path = tmp_path / "a.lmdb"
    with LMDBWriter(path) as w:
        w.write((b"old", 0))
    with pytest.raises(RuntimeError, match="boom"), LMDBWriter(path) as w:
        w.write((b"new", 1))
        raise RuntimeError("boom")
    assert LMDBDataset(path)[0] == (b"old", 0)
    assert sorted(os.listdir(tmp_path)) == ["a.lmdb"]


def test_map_grows_when_full(tmp_path: Path) -> None:
    """Writing more than the initial map size grows the map instead of failing."""
    blob = bytes(200_000)
    with LMDBWriter(tmp_path / "g.lmdb", map_size=1 << 20) as w:
        for _ in range(20):
            w.write((blob,))
    ds = LMDBDataset(tmp_path / "g.lmdb")
    assert len(ds) == 20 and ds[19] == (blob,)


def test_corrupt_value_error_names_file_and_key(tmp_path: Path) -> None:
    """A value that is not valid for its codec raises CorruptRecordError naming the key."""
    path = tmp_path / "c.lmdb"
    with LMDBWriter(path) as w:
        w.write({"__key__": "good", "npy": np.zeros(3)})
        w.write({"__key__": "bad", "npy": np.zeros(3)})
    env = lmdb.open(str(path), subdir=False)
    with env.begin(write=True) as txn:
        txn.put(b"bad.npy", b"\x93NUMPY garbage")
    env.close()
    os.unlink(str(path) + "-lock")
    ds = LMDBDataset(path, fields=["npy"])
    assert ds[0].shape == (3,)
    with pytest.raises(CorruptRecordError, match=r"'bad'.*npy") as info:
        ds[1]
    assert str(path) in str(info.value) and isinstance(info.value, ValueError)


def test_corrupt_image_error_names_key(tmp_path: Path) -> None:
    """Decoding a broken image (with a transform) raises an error naming file and key."""
    with LMDBWriter(tmp_path / "i.lmdb") as w:
        w.write({"__key__": "broken", "jpg": b"\xff\xd8\xff\xe0 not a jpeg", "cls": 0})
    ds = LMDBDataset(tmp_path / "i.lmdb", fields=["jpg", "cls"], transform=lambda im: im)
    with pytest.raises(OSError, match="broken"):
        ds[0]


def test_transform_decodes_images(tmp_path: Path) -> None:
    """With a transform, images are decoded to RGB and transformed; labels too."""
    expected = make_folder(tmp_path / "img", count=4)
    pack(tmp_path / "img", tmp_path / "d.lmdb", progress=False)
    ds = LMDBDataset(tmp_path / "d.lmdb", transform=lambda im: im.size, target_transform=str)
    assert [ds[i] for i in range(4)] == [((32, 24), str(c)) for _, c in expected]


def test_not_a_stoker_file_is_explained(tmp_path: Path) -> None:
    """A plain LMDB file without metadata raises ValueError saying how to make one."""
    env = lmdb.open(str(tmp_path / "p.lmdb"), subdir=False)
    with env.begin(write=True) as txn:
        txn.put(b"k", b"v")
    env.close()
    with pytest.raises(ValueError, match="LMDBWriter"):
        LMDBDataset(tmp_path / "p.lmdb")
    with pytest.raises(FileNotFoundError, match="stoker pack"):
        LMDBDataset(tmp_path / "missing.lmdb")


def test_index_out_of_range_raises_index_error(tmp_path: Path) -> None:
    """Indices past the end raise IndexError; negative ones count from the end."""
    with LMDBWriter(tmp_path / "n.lmdb") as w:
        for i in range(3):
            w.write((i,))
    ds = LMDBDataset(tmp_path / "n.lmdb")
    assert ds[-1] == (2,)
    with pytest.raises(IndexError):
        ds[3]
