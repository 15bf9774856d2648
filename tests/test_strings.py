"""StringArray: an immutable sequence of str or bytes in one buffer, picklable, fork-friendly."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest

from stoker import DataLoader, _strings
from stoker._strings import StringArray


def test_items_round_trip_in_order() -> None:
    """Items come back equal, in order, including non-ASCII, empty and surrogate strings."""
    items = ["a.jpg", "", "dög/é.png", "\udcff", "x" * 1000]
    arr = StringArray(items)
    assert len(arr) == 5 and list(arr) == items and [arr[i] for i in range(-5, 5)] == items * 2


def test_bytes_items_and_numpy_input() -> None:
    """bytes stay bytes; a NumPy array of strings is accepted."""
    assert list(StringArray([b"\x00a", b""])) == [b"\x00a", b""]
    assert list(StringArray(np.array(["ab", "c"]))) == ["ab", "c"]


def test_mixed_types_rejected() -> None:
    """str and bytes (or other objects) cannot be mixed: TypeError naming the item."""
    with pytest.raises(TypeError, match="item 1 is bytes"):
        StringArray(["a", b"b"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="item 1 is int"):
        StringArray(["a", 3])  # type: ignore[arg-type]


def test_slices_and_bounds() -> None:
    """Slices are StringArrays; out-of-range indices raise IndexError."""
    arr = StringArray([str(i) for i in range(10)])
    assert isinstance(arr[2:5], StringArray) and list(arr[2:5]) == ["2", "3", "4"]
    assert list(arr[::3]) == ["0", "3", "6", "9"] and list(arr[5:2]) == []
    with pytest.raises(IndexError):
        arr[10]


def test_pickle_of_a_slice_carries_only_the_slice() -> None:
    """Pickling a slice round-trips it without the rest of the buffer."""
    arr = StringArray(["x" * 1000] * 100)
    part = arr[:2]
    assert pickle.loads(pickle.dumps(part)) == part
    assert len(pickle.dumps(part)) < 3000


def test_is_a_sequence_that_never_holds_python_strings() -> None:
    """Two arrays hold everything (uint32 offsets); equality against lists works."""
    arr = StringArray(["ab", "c"])
    assert arr == ["ab", "c"] and arr != ["ab"] and arr != ["ab", "d"]
    assert arr.nbytes == 3 + 3 * 4 and arr._offsets.dtype == np.uint32
    assert "c" in arr and arr.index("c") == 1


def test_indices_behave_like_a_list() -> None:
    """NumPy integers index; floats raise TypeError and out-of-range IndexError, as list."""
    arr = StringArray(["a", "b", "c"])
    assert arr[np.int64(1)] == "b" and arr[-3] == "a"
    with pytest.raises(TypeError):
        arr[1.0]  # type: ignore[call-overload]
    with pytest.raises(IndexError, match="out of range"):
        arr[-4]


def _paths(n: int, seed: int = 0) -> list[str]:
    """ImageNet-like paths, plus names that stress the split: non-ASCII (a shared prefix
    that ends inside a character), lone surrogates, dots in directories, no extension, no
    directory, dot-files."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        d = rnd.randrange(12)
        kind = rnd.randrange(6)
        if kind == 0:
            out.append(f"/data/tr.ain/d{d}/{'éè'[i % 2]}{i}.jpg")
        elif kind == 1:
            out.append(f"rel/d{d}/README")
        elif kind == 2:
            out.append(f"n{d}_{i}.png")
        elif kind == 3:
            out.append(f"/data/d{d}/.hidden{i % 3}")
        elif kind == 4:
            out.append(f"/s{d}/\udcff{i}.x")
        else:
            out.append(f"/data/train/n{d:08d}/n{d:08d}_{i:08d}.JPEG")
    return [*out, "", "/", "a/", ".", "x.", "/ü/ü.ü"]


def test_file_names_take_the_compact_layout_and_round_trip() -> None:
    """Paths sharing directories are stored as frames + middles, under half the plain
    size, and every item, slice, pickle and iteration gives back the original strings."""
    items = _paths(3000)
    arr = StringArray(items)
    plain = sum(len(s.encode("utf-8", "surrogatepass")) for s in items) + 4 * (len(items) + 1)
    assert arr._frames is not None and arr.nbytes < plain / 2
    assert list(arr) == items and [arr[i] for i in range(-len(items), 0)] == items
    part = arr[1000:1500]
    assert list(part) == items[1000:1500] and list(arr[::7]) == items[::7]
    assert list(pickle.loads(pickle.dumps(part))) == items[1000:1500]
    assert len(pickle.dumps(part)) < len(pickle.dumps(arr)) / 3


def test_bytes_file_names_take_the_compact_layout() -> None:
    """bytes items (even invalid UTF-8) are framed alike and come back as bytes."""
    items = [f"/d{i % 5}/f_{i:06d}.bin".encode() + b"\xff" * (i % 2) for i in range(500)]
    arr = StringArray(items)
    assert arr._frames is not None and list(arr) == items and arr[-1] == items[-1]


def test_unrelated_strings_stay_in_the_plain_layout() -> None:
    """Strings that share no structure (a directory each) keep the plain layout."""
    items = [f"/u{i}/x" for i in range(2000)]
    arr = StringArray(items)
    assert arr._frames is None and list(arr) == items


def test_hash_collisions_fall_back_to_the_plain_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """If different directories ever hashed alike, the exact check keeps results correct."""
    monkeypatch.setattr(_strings, "_digest", lambda rows, salt: np.zeros(len(rows), np.uint64))
    items = _paths(500)
    arr = StringArray(items)
    assert arr._frames is None and list(arr) == items


class _Names:
    def __init__(self) -> None:
        self.names = StringArray(f"img_{i:05d}.jpg" for i in range(100))

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int) -> str:
        return str(self.names[i])


def test_works_as_dataset_storage_in_workers() -> None:
    """A dataset backed by a (compact) StringArray yields its names through process workers."""
    ds = _Names()
    assert ds.names._frames is not None
    got = [n for b in DataLoader(ds, batch_size=10, num_workers=2) for n in b]
    assert got == [f"img_{i:05d}.jpg" for i in range(100)]
