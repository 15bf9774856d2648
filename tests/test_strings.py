"""StringArray: an immutable sequence of str or bytes in one buffer, picklable, fork-friendly."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from stoker import DataLoader
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
        StringArray(["a", b"b"])
    with pytest.raises(TypeError, match="item 1 is int"):
        StringArray(["a", 3])  # type: ignore[list-item]


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
    """Two arrays hold everything (no per-item objects); equality against lists works."""
    arr = StringArray(["ab", "c"])
    assert arr == ["ab", "c"] and arr != ["ab"] and arr.nbytes == 3 + 3 * 8
    assert "c" in arr and arr.index("c") == 1


class _Names:
    def __init__(self) -> None:
        self.names = StringArray(f"img_{i:05d}.jpg" for i in range(100))

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int) -> str:
        return self.names[i]


def test_works_as_dataset_storage_in_workers() -> None:
    """A dataset backed by a StringArray yields its names through process workers."""
    got = [n for b in DataLoader(_Names(), batch_size=10, num_workers=2) for n in b]
    assert got == [f"img_{i:05d}.jpg" for i in range(100)]
