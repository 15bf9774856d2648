"""stoker.torch's default_collate / default_convert against torch's, and through the loader.

Differential: each sample kind goes through ``torch.utils.data`` and ``stoker.torch`` and
the results must be the same objects (types, dtypes, shapes, values), or the same exception
type carrying torch's key phrase. The kinds follow torch's own collate tests: NumPy arrays
of every dtype, NumPy scalars, Python numbers, memmaps, str and bytes, None, nested
mappings, namedtuples and sequences (their types kept or not as torch keeps them), and
mismatched sizes.
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.utils.data as T  # noqa: E402

import stoker.torch as S  # noqa: E402


class Point(NamedTuple):
    x: Any
    y: Any


class Tagged(dict[str, Any]):
    """A dict subclass with state of its own, which torch keeps by copying the first sample."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.tag = "t"


class Row(list[Any]):
    """A list subclass: torch keeps its type."""


TYPE_PHRASE = "batch must contain tensors, numpy arrays, numbers, dicts or lists; found"


def _memmap(tmp: Path) -> np.memmap[Any, Any]:
    mm = np.memmap(tmp / "m.dat", dtype=np.float32, mode="w+", shape=(4, 3))
    mm[:] = np.arange(12, dtype=np.float32).reshape(4, 3)
    mm.flush()
    return np.memmap(tmp / "m.dat", dtype=np.float32, mode="r", shape=(4, 3))


def cases(tmp: Path) -> dict[str, list[Any]]:
    """Batches by name: every kind of sample torch's default_collate handles or rejects."""
    mm = _memmap(tmp)
    out: dict[str, list[Any]] = {}
    for dt in ("f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "?", "c8"):
        out[f"array {dt}"] = [np.ones((2, 3), dt), np.zeros((2, 3), dt)]
        if dt != "u8":  # torch cannot make a tensor of uint64 scalars: see ERRORS
            out[f"scalar {dt}"] = [np.ones((), dt)[()], np.zeros((), dt)[()]]
    out.update(
        {
            "arrays of two dtypes": [np.ones(3, np.int32), np.zeros(3, np.float32)],
            "0-d arrays": [np.array(1.5), np.array(2.5)],
            "non-contiguous arrays": [np.arange(6.0).reshape(2, 3).T] * 2,
            "read-only arrays": [mm[0], mm[1]],
            "memmap rows": [mm[0], mm[3]],
            "memmaps": [mm, mm],
            "ints": [1, 2, -3],
            "bools": [True, False],
            "floats": [1.0, 2.5],
            "int then float": [1, 2.5],
            "float then int": [1.5, 2],
            "np.str_": [np.str_("a"), np.str_("b")],
            "str": ["a", "b"],
            "bytes": [b"a", b"b"],
            "dict": [{"a": 1, "b": np.ones(2)}, {"a": 2, "b": np.zeros(2)}],
            "dict subclass": [Tagged(a=1), Tagged(a=2)],
            "OrderedDict": [collections.OrderedDict(b=1.0, a=2.0)] * 2,
            "defaultdict": [collections.defaultdict(int, a=1), collections.defaultdict(int, a=2)],
            "namedtuple": [Point(1, np.ones(2)), Point(2, np.zeros(2))],
            "tuple": [(1, "a", np.float32(1)), (2, "b", np.float32(2))],
            "list": [[1, 2.0], [3, 4.0]],
            "list subclass": [Row([1, 2]), Row([3, 4])],
            "nested": [
                {"x": [(1, np.ones(1, np.uint8)), {"y": b"z"}], "p": Point("s", 0.5)},
                {"x": [(2, np.ones(1, np.uint8)), {"y": b"w"}], "p": Point("t", 1.5)},
            ],
            "tensors": [torch.ones(2), torch.zeros(2)],
            "tensors of two dtypes": [torch.ones(2, dtype=torch.int32), torch.zeros(2)],
            "0-d tensors": [torch.tensor(1), torch.tensor(2)],
            "tensor and str": [(torch.ones(1), "a"), (torch.ones(1), "b")],
        }
    )
    return out


# name: (batch, torch's key phrase that both messages must hold)
ERRORS: dict[str, tuple[list[Any], str]] = {
    "None": ([None, None], TYPE_PHRASE),
    "complex": ([1j, 2j], TYPE_PHRASE),
    "set": ([{1}, {2}], TYPE_PHRASE),
    "object": ([object(), object()], TYPE_PHRASE),
    "str array": ([np.array(["a"]), np.array(["b"])], TYPE_PHRASE),
    "object array": ([np.array([None]), np.array([1])], TYPE_PHRASE),
    "array shapes": ([np.ones(3), np.ones(4)], "stack expects each tensor to be equal size"),
    "tensor shapes": ([torch.ones(2), torch.ones(3)], "stack expects each tensor to be equal size"),
    "list lengths": ([[1, 2], [1]], "each element in list of batch should be of equal size"),
    "int beyond int64": ([2**63, 1], "Overflow when unpacking long"),
    "int then None": ([1, None], "Could not infer dtype of NoneType"),
    "empty": ([], "list index out of range"),
    "uint64 scalars": ([np.uint64(1), np.uint64(2)], "an integer is required"),
}


def assert_same(ours: Any, theirs: Any, where: str = "batch") -> None:
    """The same types, dtypes, shapes and values, all the way down."""
    assert type(ours) is type(theirs), (where, type(ours), type(theirs))
    if isinstance(theirs, torch.Tensor):
        assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape), where
        assert torch.equal(ours, theirs), where
    elif isinstance(theirs, dict):
        assert list(ours) == list(theirs), where
        assert vars(ours) == vars(theirs) if hasattr(theirs, "__dict__") else True, where
        assert getattr(ours, "default_factory", None) is getattr(theirs, "default_factory", None)
        for k in theirs:
            assert_same(ours[k], theirs[k], f"{where}[{k!r}]")
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    else:
        assert ours == theirs, where


def _theirs(fn: Any, arg: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns on read-only arrays
        return fn(arg)


def test_default_collate_gives_torch_batches(tmp_path: Path) -> None:
    """Every sample kind collates to exactly torch's batch (types, dtypes, values)."""
    for name, batch in cases(tmp_path).items():
        assert_same(S.default_collate(batch), _theirs(T.default_collate, batch), name)


def test_default_convert_gives_torch_samples(tmp_path: Path) -> None:
    """Every sample kind converts (without batching) exactly as torch's default_convert."""
    for name, batch in cases(tmp_path).items():
        assert_same(S.default_convert(batch[0]), _theirs(T.default_convert, batch[0]), name)
    assert_same(S.default_convert(np.array(["a"])), T.default_convert(np.array(["a"])))


def test_default_collate_errors_keep_torch_types_and_phrases() -> None:
    """Batches torch cannot collate raise the same exception type with torch's phrase."""
    for name, (batch, phrase) in ERRORS.items():
        with pytest.raises(Exception) as theirs:
            T.default_collate(batch)
        with pytest.raises(Exception) as ours:
            S.default_collate(batch)
        assert isinstance(ours.value, type(theirs.value)), (name, ours.value, theirs.value)
        assert phrase in str(theirs.value), (name, str(theirs.value))
        assert phrase in str(ours.value), (name, str(ours.value))


class Samples(T.Dataset[Any]):
    """A torch Dataset giving NumPy, memmap, scalar, number and str fields."""

    def __init__(self, mm: np.memmap[Any, Any]) -> None:
        self.mm = mm

    def __len__(self) -> int:
        return len(self.mm)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "row": self.mm[i],
            "label": np.int64(i),
            "weight": np.float32(i) / 2,
            "x": float(i),
            "n": i,
            "ok": i % 2 == 0,
            "name": f"s{i}",
            "pair": (np.full(2, i, np.int16), b"b"),
        }


def _batches(module: Any, ds: Any, **kw: Any) -> Iterator[Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield from module.DataLoader(ds, **kw)


@pytest.mark.multiprocess
def test_loader_batches_equal_torch_loader_batches(tmp_path: Path) -> None:
    """stoker.torch's DataLoader gives torch's DataLoader's batches for NumPy-valued samples,
    in process, from process and thread workers, batched and not (default_convert)."""
    ds = Samples(_memmap(tmp_path))
    configs: list[dict[str, Any]] = [
        {"batch_size": 3},
        {"batch_size": None},
        {"batch_size": 2, "num_workers": 2, "multiprocessing_context": "fork"},
        {"batch_size": 3, "num_workers": 1, "worker_mode": "thread"},
    ]
    for kw in configs:
        # torch's batches do not depend on its workers: in process, it leaves no process
        # exiting late for the leak check to see
        theirs = list(_batches(T, ds, batch_size=kw["batch_size"]))
        ours = list(_batches(S, S.Subset(ds, range(len(ds))), **kw))
        assert len(ours) == len(theirs), kw
        for a, b in zip(ours, theirs, strict=True):
            assert_same(a, b, str(kw))


def test_numpy_tensor_type_gives_arrays() -> None:
    """tensor_type='numpy' is the one way to NumPy batches from stoker.torch's loader."""
    ds = S.TensorDataset(np.arange(6, dtype=np.int32), np.ones(6))
    (x, y), *_ = S.DataLoader(ds, batch_size=4, tensor_type="numpy")
    assert type(x) is np.ndarray and x.dtype == np.int32 and y.dtype == np.float64
    (x, y), *_ = S.DataLoader(ds, batch_size=4)
    assert type(x) is torch.Tensor and x.dtype == torch.int32


def test_a_read_only_array_converts_to_a_tensor_of_its_own() -> None:
    """Differential: torch's default_convert shares a read-only array's memory (warning,
    once a process, that writing is undefined); stoker's gives the same values in memory of
    their own, so a tensor written in place cannot reach what the array protects (a cache's
    entry)."""
    ro = np.arange(6, dtype=np.float32)
    ro.flags.writeable = False
    theirs = _theirs(T.default_convert, ro)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = S.default_convert(ro)
    assert theirs.data_ptr() == ro.ctypes.data and ours.data_ptr() != ro.ctypes.data
    assert torch.equal(ours, theirs) and ours.dtype == theirs.dtype
    ours.add_(1)
    assert ro.tolist() == list(range(6))
