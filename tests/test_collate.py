"""Tests of stoker._collate: torch's default_collate/default_convert as the oracle, the
tensor_type rule, NumPy dtypes, error paths, collating into given buffers, ColumnBatch."""

from __future__ import annotations

import collections
import copy
import pickle
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import pytest

from stoker._batch import ColumnBatch
from stoker._collate import DefaultCollate, collate, convert, default_collate, default_convert
from stoker.errors import CollateError


class Point(NamedTuple):
    x: Any
    y: Any


class FrozenMap(Mapping[str, Any]):
    """A read-only mapping whose constructor takes no dict: collate falls back to dict."""

    def __init__(self, **kw: Any) -> None:
        self._d = dict(kw)

    def __getitem__(self, k: str) -> Any:
        return self._d[k]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


class TaggedDict(dict[str, Any]):
    """A dict subclass with extra state, which torch keeps by copying the first sample."""

    tag = "t"


def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _samples(n: int, make: Callable[[int], Any]) -> list[Any]:
    return [make(i) for i in range(n)]


# Batches without tensors: (name, builder). Each builder returns a fresh list of samples.
PLAIN: list[tuple[str, Callable[[], Any]]] = [
    ("ints", lambda: [0, 5, -3]),
    ("floats", lambda: [0.5, 1.0, -2.25]),
    ("bools", lambda: [True, False, True]),
    ("ints_and_bools", lambda: [True, 2, 3]),
    ("np_float32", lambda: [np.float32(i) for i in range(3)]),
    ("np_float16", lambda: [np.float16(i) for i in range(3)]),
    ("np_int8", lambda: [np.int8(i) for i in range(3)]),
    ("np_uint8", lambda: [np.uint8(i) for i in range(3)]),
    ("np_uint16", lambda: [np.uint16(i) for i in range(3)]),
    ("np_int32", lambda: [np.int32(i) for i in range(3)]),
    ("np_bool", lambda: [np.bool_(i % 2) for i in range(3)]),
    ("np_complex64", lambda: [np.complex64(i + 1j) for i in range(3)]),
    ("np_float64", lambda: [np.float64(i) / 3 for i in range(3)]),
    ("arrays_f32", lambda: _samples(4, lambda i: _rng().random((3, 2)).astype(np.float32) + i)),
    ("arrays_i64", lambda: _samples(4, lambda i: np.arange(5) * i)),
    ("arrays_u8", lambda: _samples(3, lambda i: np.full((2, 2), i, np.uint8))),
    ("arrays_bool", lambda: _samples(3, lambda i: np.array([i % 2 == 0, True]))),
    ("arrays_0d", lambda: [np.array(1.5), np.array(2.5)]),
    ("arrays_mixed_dtype", lambda: [np.zeros(3, np.float32), np.ones(3, np.int64)]),
    ("arrays_noncontig", lambda: _samples(3, lambda i: np.arange(12.0).reshape(3, 4).T + i)),
    ("strs", lambda: ["a", "bb", "c"]),
    ("bytes", lambda: [b"a", b"b"]),
    ("tuples", lambda: [(np.arange(2) + i, i, "s") for i in range(3)]),
    ("lists", lambda: [[i, float(i), np.float32(i)] for i in range(3)]),
    (
        "dicts",
        lambda: [{"img": np.zeros((2, 2)) + i, "label": i, "name": f"n{i}"} for i in range(3)],
    ),
    ("ordered_dicts", lambda: [collections.OrderedDict(b=i, a=np.ones(2) * i) for i in range(2)]),
    ("defaultdict", lambda: [collections.defaultdict(int, a=i) for i in range(2)]),
    ("tagged_dict", lambda: [TaggedDict(a=i) for i in range(2)]),
    ("frozen_map", lambda: [FrozenMap(a=i, b=float(i)) for i in range(2)]),
    ("namedtuples", lambda: [Point(np.arange(3) * i, float(i)) for i in range(3)]),
    ("range", lambda: [range(2), range(2)]),
    ("bytearray", lambda: [bytearray(b"ab"), bytearray(b"cd")]),
    ("empty_lists", lambda: [[], []]),
    (
        "nested",
        lambda: [
            {"a": [(i, {"b": np.full(2, i, np.int16)}), Point("p", [i, i])], "c": (b"x", 2.5)}
            for i in range(3)
        ],
    ),
    ("batch_as_tuple", lambda: (1, 2, 3)),
]


def _with_tensors(torch: Any) -> list[tuple[str, list[Any]]]:
    return [
        ("tensors_f32", [torch.arange(6.0).reshape(2, 3) + i for i in range(4)]),
        ("tensors_i64", [torch.tensor([i, i]) for i in range(3)]),
        ("tensors_bf16", [torch.ones(2, dtype=torch.bfloat16) * i for i in range(3)]),
        ("tensors_0d", [torch.tensor(float(i)) for i in range(3)]),
        ("tensors_mixed_dtype", [torch.zeros(2), torch.ones(2, dtype=torch.int64)]),
        ("tensor_and_more", [(torch.ones(2) * i, i, np.float32(i), "a") for i in range(3)]),
        ("tensor_in_dict", [{"x": torch.ones(3), "y": np.zeros(2), "z": 1.5} for _ in range(2)]),
        ("tensor_namedtuple", [Point(torch.zeros(1), [np.int8(1)]) for _ in range(2)]),
        ("array_then_tensor", [np.zeros(2), torch.ones(2, dtype=torch.float64)]),
    ]


def _assert_same(ours: Any, theirs: Any, torch: Any, where: str = "out") -> None:
    """Equal structure, container types, tensor dtypes, shapes and values."""
    assert type(ours) is type(theirs), f"{where}: {type(ours)} != {type(theirs)}"
    if isinstance(theirs, torch.Tensor):
        assert ours.dtype == theirs.dtype, where
        assert ours.shape == theirs.shape, where
        assert torch.equal(ours, theirs), where
    elif isinstance(theirs, Mapping):
        assert list(ours) == list(theirs), where
        for k in theirs:
            _assert_same(ours[k], theirs[k], torch, f"{where}[{k!r}]")
        assert getattr(ours, "__dict__", None) == getattr(theirs, "__dict__", None)
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs), where
        for j, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            _assert_same(a, b, torch, f"{where}[{j}]")
    elif isinstance(theirs, np.ndarray):
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs), where
    else:
        assert ours == theirs, where


def _leaves(x: Any) -> Iterator[Any]:
    if isinstance(x, Mapping):
        for v in x.values():
            yield from _leaves(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _leaves(v)
    else:
        yield x


def _torch_collate(torch: Any, batch: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns on lists of arrays and read-only arrays
        return torch.utils.data.default_collate(batch)


# The cases run in loops, not parametrized: the suite's leak-check fixture costs ~0.3 s per test.


def test_torch_mode_matches_torch_default_collate() -> None:
    """tensor_type='torch' gives what torch's default_collate gives: structure, dtypes, values."""
    torch = pytest.importorskip("torch")
    for name, make in PLAIN:
        theirs = _torch_collate(torch, make())
        _assert_same(collate(make(), tensor_type="torch"), theirs, torch, name)


def test_tensor_batches_match_torch_default_collate() -> None:
    """Batches holding tensors collate as torch's default_collate, in torch and None modes."""
    torch = pytest.importorskip("torch")
    for name, batch in _with_tensors(torch):
        theirs = _torch_collate(torch, batch)
        _assert_same(collate(batch, tensor_type="torch"), theirs, torch, name)
        if name != "array_then_tensor":  # the first sample decides: it holds no tensor
            _assert_same(collate(batch), theirs, torch, name)
            _assert_same(default_collate(batch), theirs, torch, name)


def test_numpy_mode_mirrors_torch_dtypes() -> None:
    """Without tensors the batch is NumPy, with torch's structure and the same dtypes/values."""
    torch = pytest.importorskip("torch")

    def to_torch(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            return torch.from_numpy(x)
        if isinstance(x, Mapping) and type(x) is not FrozenMap:
            out: Any = copy.copy(x)
            for k in x:
                out[k] = to_torch(x[k])
            return out
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return type(x)(*map(to_torch, x))
        if isinstance(x, list):
            return [to_torch(v) for v in x]
        return x

    for name, make in PLAIN:
        if name == "arrays_mixed_dtype":  # NumPy promotes f32 with i64 to f64, torch to f32
            continue
        ours = default_collate(make())
        assert not any(isinstance(leaf, torch.Tensor) for leaf in _leaves(ours)), name
        _assert_same(to_torch(ours), _torch_collate(torch, make()), torch, name)


def test_numpy_mode_dtypes() -> None:
    """Python ints -> int64, floats -> float64, bools -> bool, NumPy scalars keep their dtype."""
    expect: list[tuple[list[Any], type[Any]]] = [
        ([1, 2], np.int64),
        ([1.0, 2], np.float64),
        ([True, False], np.bool_),
        ([np.float32(1), np.float32(2)], np.float32),
        ([np.uint8(1), np.uint8(2)], np.uint8),
        ([np.uint64(1), np.uint64(2)], np.uint64),
        ([np.float16(1), np.float16(2)], np.float16),
        ([np.zeros(2, np.int16), np.ones(2, np.int16)], np.int16),
    ]
    for batch, dtype in expect:
        out = collate(batch, tensor_type="numpy")
        assert type(out) is np.ndarray and out.dtype == dtype, batch
        assert out.tolist() == np.stack([np.asarray(x) for x in batch]).tolist()


def test_numpy_mode_stacks_like_np_stack() -> None:
    """Arrays are stacked as np.stack does, mixed dtypes promoted, with or without alloc."""
    batch: list[Any] = [np.arange(6, dtype=np.int8).reshape(2, 3), np.ones((2, 3), np.float32)]
    expect = np.stack(batch)
    for alloc in (None, lambda shape, dtype: np.empty(shape, dtype)):
        out = collate(batch, tensor_type="numpy", alloc=alloc)
        assert out.dtype == expect.dtype and np.array_equal(out, expect)


def test_none_rule_tensor_anywhere_gives_torch_everywhere() -> None:
    """A tensor deep in a sample makes every number and array of the batch a tensor."""
    torch = pytest.importorskip("torch")
    batch = [{"a": [np.zeros(2), {"deep": torch.tensor(i)}], "b": i, "c": 0.5} for i in range(3)]
    out = collate(batch)
    assert all(isinstance(leaf, torch.Tensor) for leaf in _leaves(out))
    assert out["b"].dtype == torch.int64 and out["c"].dtype == torch.float64


def test_none_rule_without_tensor_gives_numpy_even_with_torch() -> None:
    """With torch imported but no tensor in the samples, the batch is NumPy arrays."""
    torch = pytest.importorskip("torch")
    out = collate([(np.zeros(2, np.float32), 1, 2.0, True)] * 2)
    assert all(type(leaf) is np.ndarray for leaf in _leaves(out))
    assert not any(isinstance(leaf, torch.Tensor) for leaf in _leaves(out))


def test_none_rule_does_not_import_torch() -> None:
    """NumPy data collates to NumPy in a fresh interpreter, and torch stays unimported."""
    code = (
        "import sys, numpy as np\n"
        "from stoker._collate import collate, convert\n"
        "out = collate([{'x': np.zeros(2), 'y': 1}] * 3)\n"
        "conv = convert((np.zeros(1), 1))\n"
        "print(type(out['x']).__name__, out['y'].dtype, type(conv[0]).__name__, "
        "'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["ndarray", "int64", "ndarray", "False"]


def test_forced_tensor_types() -> None:
    """'numpy' turns tensors into arrays; 'torch' turns arrays and numbers into tensors."""
    torch = pytest.importorskip("torch")
    batch = [(torch.ones(2, dtype=torch.float16), np.int8(3), 4) for _ in range(3)]
    out = collate(batch, tensor_type="numpy")
    assert [type(x) for x in out] == [np.ndarray] * 3
    assert [x.dtype for x in out] == [np.float16, np.int8, np.int64]
    out = collate([(np.ones(2, np.float32), 1)] * 2, tensor_type="torch")
    assert [x.dtype for x in out] == [torch.float32, torch.int64]


def test_numpy_mode_rejects_tensors_without_numpy_dtype() -> None:
    """A bfloat16 tensor cannot become NumPy: TypeError naming the path and the fix."""
    torch = pytest.importorskip("torch")
    batch = [{"w": torch.ones(2, dtype=torch.bfloat16)}] * 2
    with pytest.raises(TypeError, match=r"batch\[0\]\['w'\].*tensor_type='torch'"):
        collate(batch, tensor_type="numpy")


def test_torch_mode_without_torch_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """tensor_type='torch' without an importable torch raises ModuleNotFoundError saying why."""
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    with pytest.raises(ModuleNotFoundError, match="tensor_type='torch'"):
        collate([1, 2], tensor_type="torch")
    assert collate([1, 2]).tolist() == [1, 2]


def test_tensor_type_is_validated() -> None:
    """Unknown tensor_type values raise ValueError listing the accepted values."""
    column_batch = ColumnBatch([np.arange(3)], np.arange(2))
    bad_values: list[Any] = ["jax", "NUMPY", 1, np.float32]
    for bad in bad_values:
        for call in (
            partial(collate, [1], tensor_type=bad),
            partial(collate, [], tensor_type=bad),
            partial(collate, column_batch, tensor_type=bad),
            partial(convert, 1, tensor_type=bad),
            partial(DefaultCollate, bad),
        ):
            with pytest.raises(ValueError, match=r"None, 'numpy' or 'torch'"):
                call()


# Bad batches: torch's exception type must be ours too (CollateError is a RuntimeError).
BAD: list[tuple[str, Callable[[], Any]]] = [
    ("empty", lambda: []),
    ("none", lambda: [None, None]),
    ("set", lambda: [{1}, {2}]),
    ("complex", lambda: [1j, 2j]),
    ("datetime64", lambda: [np.datetime64(1, "s")] * 2),
    ("object_array", lambda: [np.array([1, None])] * 2),
    ("str_array", lambda: [np.array(["a"]), np.array(["b"])]),
    ("array_shapes", lambda: [np.zeros(3), np.zeros(4)]),
    ("array_vs_int", lambda: [np.zeros(2), 1]),
    ("int_vs_array", lambda: [1, np.zeros(2)]),
    ("int_vs_str", lambda: [1, "a"]),
    ("float_vs_none", lambda: [1.0, None]),
    ("float_vs_complex", lambda: [1.0, 1j]),
    ("int_overflow", lambda: [2**70, 1]),
    ("int_overflow_u64", lambda: [2**63, 1]),
    ("float_then_list", lambda: [1.0, [2.0]]),
    ("seq_lengths", lambda: [[1, 2], [1]]),
    ("seq_vs_int", lambda: [[1, 2], 1]),
    ("missing_key", lambda: [{"a": 1}, {"b": 1}]),
    ("dict_vs_int", lambda: [{"a": 1}, 3]),
    ("nested_shapes", lambda: [{"a": (np.zeros((2, 2)),)}, {"a": (np.zeros((2, 3)),)}]),
]


def test_bad_batches_raise_torch_exception_types() -> None:
    """Each bad batch raises the exception type torch raises, in every tensor_type."""
    torch = pytest.importorskip("torch")
    for name, make in BAD:
        with pytest.raises(Exception) as theirs:  # the oracle decides the type
            _torch_collate(torch, make())
        expected = type(theirs.value)
        for tensor_type in (None, "numpy", "torch"):
            try:
                collate(make(), tensor_type=tensor_type)
            except Exception as exc:
                assert isinstance(exc, expected), (name, tensor_type, exc, expected)
            else:
                pytest.fail(f"{name} ({tensor_type}): no {expected.__name__} raised")


def test_bad_tensor_batches_raise_torch_exception_types() -> None:
    """Tensors of different shapes raise RuntimeError (CollateError), as torch does."""
    torch = pytest.importorskip("torch")
    batch = [torch.zeros(2), torch.zeros(3)]
    with pytest.raises(RuntimeError):
        _torch_collate(torch, batch)
    for tensor_type in (None, "numpy", "torch"):
        with pytest.raises(CollateError, match=r"batch\[1\] has shape \(3,\)"):
            collate(batch, tensor_type=tensor_type)
    sparse = [torch.eye(2).to_sparse()] * 2
    with pytest.raises(RuntimeError):
        _torch_collate(torch, sparse)
    with pytest.raises(CollateError, match="sparse"):
        collate(sparse)


def test_shape_mismatch_message_names_path_shapes_and_fix() -> None:
    """CollateError names the sample and field, both shapes, and says to pad or resize."""
    batch = [{"image": np.zeros((3, 4, 4)), "label": i} for i in range(5)]
    batch[3]["image"] = np.zeros((3, 4, 5))
    for tensor_type in ("numpy", "torch", None):
        if tensor_type == "torch":
            pytest.importorskip("torch")
        with pytest.raises(CollateError) as info:
            collate(batch, tensor_type=tensor_type)
        msg = str(info.value)
        assert "batch[3]['image']" in msg and "(3, 4, 5)" in msg and "(3, 4, 4)" in msg
        assert "pad or resize" in msg.lower() and "collate_fn" in msg
        assert isinstance(info.value, RuntimeError)


def test_length_mismatch_message_names_path() -> None:
    """Sequences of unequal length raise CollateError naming the sample, field and lengths."""
    batch = [(0, [1, 2, 3]), (1, [1, 2, 3]), (2, [1, 2])]
    with pytest.raises(CollateError, match=r"batch\[2\]\[1\] has length 2 .* length 3.*[Pp]ad"):
        collate(batch)


def test_type_error_messages_name_path() -> None:
    """Unsupported values, string arrays, missing keys and type changes name their path."""
    cases: list[tuple[list[Any], type[Exception], str]] = [
        ([{"meta": None}, {"meta": None}], TypeError, r"NoneType'> at batch\[0\]\['meta'\]"),
        ([Point(np.array(["s"]), 1)] * 2, TypeError, r"dtype <U1 at batch\[0\]\.x"),
        ([{"a": 1}, {"a": 2}, {"b": 3}], KeyError, r"batch\[2\] has no key 'a'"),
        ([(1, 2.0), (1, None)], TypeError, r"batch\[1\]\[1\] has type NoneType"),
        ([[0, {"k": 1}], [0, 5]], TypeError, r"batch\[1\]\[1\] has type int"),
    ]
    for batch, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            collate(batch)


def _recording_alloc() -> tuple[list[np.ndarray[Any, Any]], Any]:
    handed: list[np.ndarray[Any, Any]] = []

    def alloc(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        buf = np.full(shape, 0, dtype)  # C-contiguous and writable, like a shm slice
        handed.append(buf)
        return buf

    return handed, alloc


def test_alloc_receives_every_leaf_numpy_mode() -> None:
    """Every stacked leaf (arrays, numbers, mixed dtypes) lives in memory alloc handed out."""
    batch = [
        {"img": np.full((2, 3), i, np.uint8), "y": i, "w": 0.5 * i, "ok": True, "s": "a",
         "mix": np.ones(2, np.float32) if i else np.ones(2, np.int64), "n": np.float16(i)}
        for i in range(4)
    ]  # fmt: skip
    handed, alloc = _recording_alloc()
    out = collate(batch, tensor_type="numpy", alloc=alloc)
    expect = collate(batch, tensor_type="numpy")
    arrays = [v for k, v in out.items() if k != "s"]
    assert len(handed) == len(arrays) == 6
    for key, arr in out.items():
        if key == "s":
            continue
        assert any(np.shares_memory(arr, buf) for buf in handed), key
        assert arr.dtype == expect[key].dtype and np.array_equal(arr, expect[key]), key


def test_alloc_receives_every_leaf_torch_mode() -> None:
    """In torch mode every tensor leaf (from tensors, arrays, numbers) is over alloc's memory."""
    torch = pytest.importorskip("torch")
    batch = [
        (torch.full((2,), float(i)), np.full(3, i, np.int16), i, 1.5, np.float32(i),
         [torch.tensor([i, i], dtype=torch.int32)])
        for i in range(3)
    ]  # fmt: skip
    handed, alloc = _recording_alloc()
    out = collate(batch, tensor_type="torch", alloc=alloc)
    _assert_same(out, _torch_collate(torch, batch), torch)
    leaves = list(_leaves(out))
    assert len(handed) == len(leaves) == 6
    for leaf in leaves:
        assert any(np.shares_memory(leaf.numpy(), buf) for buf in handed)


def test_alloc_falls_back_for_dtypes_without_numpy() -> None:
    """A bfloat16 stack cannot live in a NumPy buffer: fresh memory, same result as torch."""
    torch = pytest.importorskip("torch")
    batch = [torch.ones(2, dtype=torch.bfloat16) * i for i in range(3)]
    handed, alloc = _recording_alloc()
    out = collate(batch, alloc=alloc)
    assert handed == [] and out.dtype == torch.bfloat16
    assert torch.equal(out, _torch_collate(torch, batch))


def test_alloc_with_tensors_in_numpy_mode() -> None:
    """Forced NumPy output of tensor leaves still lands in alloc's buffers."""
    torch = pytest.importorskip("torch")
    batch = [torch.arange(4, dtype=torch.float32) * i for i in range(3)]
    handed, alloc = _recording_alloc()
    out = collate(batch, tensor_type="numpy", alloc=alloc)
    assert type(out) is np.ndarray and np.shares_memory(out, handed[0])
    assert np.array_equal(out, np.stack([t.numpy() for t in batch]))


def test_column_batch_numpy_sources() -> None:
    """A ColumnBatch collates to its gathered columns, equal to collating its samples."""
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    y = np.arange(10) * 3
    cb = ColumnBatch((x, y), np.array([4, 1, 7]))
    out = collate(cb)
    assert type(out) is list and [type(c) for c in out] == [np.ndarray, np.ndarray]
    for got, want in zip(out, collate(list(cb)), strict=True):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    keyed = collate(ColumnBatch((x, y), np.array([0, 9]), keys=("x", "y")))
    assert list(keyed) == ["x", "y"] and keyed["y"].tolist() == [0, 27]
    handed, alloc = _recording_alloc()
    out = collate(cb, alloc=alloc)
    assert len(handed) == 2 and all(
        np.shares_memory(c, b) for c, b in zip(out, handed, strict=True)
    )


def test_column_batch_tensor_types_match_torch() -> None:
    """ColumnBatch follows the None rule and converts columns, matching torch per sample."""
    torch = pytest.importorskip("torch")
    xt = torch.arange(12.0).reshape(6, 2)
    yn = np.arange(6, dtype=np.int32)
    idx = np.array([5, 0, 2])
    mixed = ColumnBatch((xt, yn), idx)
    assert mixed.any_tensor()
    _assert_same(collate(mixed), _torch_collate(torch, list(mixed)), torch)
    numpy_only = ColumnBatch((yn,), idx, keys=("y",))
    _assert_same(
        collate(numpy_only, tensor_type="torch"), _torch_collate(torch, list(numpy_only)), torch
    )
    out = collate(mixed, tensor_type="numpy")
    assert [type(c) for c in out] == [np.ndarray, np.ndarray]
    assert out[0].tolist() == xt[torch.from_numpy(idx)].tolist()
    for tensor_type, as_array in (("numpy", np.asarray), (None, lambda t: t.numpy())):
        handed, alloc = _recording_alloc()
        out = collate(mixed, tensor_type=tensor_type, alloc=alloc)
        assert len(handed) == 2
        assert all(any(np.shares_memory(as_array(c), b) for b in handed) for c in out)


def test_column_batch_string_column_collates_per_sample() -> None:
    """A string column gives torch's per-sample result (a list of strings), not an array."""
    cb = ColumnBatch((np.array(["a", "b", "c"]), np.arange(3)), np.array([2, 0]))
    names, nums = collate(cb)
    assert list(names) == ["c", "a"] and nums.tolist() == [2, 0]
    with pytest.raises(IndexError):
        collate(ColumnBatch((np.arange(3),), np.array([], dtype=np.int64)))


SAMPLES: list[tuple[str, Callable[[], Any]]] = [
    ("int", lambda: 3),
    ("float", lambda: 2.5),
    ("str", lambda: "ab"),
    ("none", lambda: None),
    ("set", lambda: {1}),
    ("array", lambda: np.arange(3)),
    ("np_scalar", lambda: np.float32(1.5)),
    ("object_array", lambda: np.array([None])),
    ("str_array", lambda: np.array(["a"])),
    ("np_str", lambda: np.str_("a")),
    ("masked", lambda: np.ma.array([1, 2])),
    ("tuple", lambda: (1, np.zeros(2), "a")),
    ("namedtuple", lambda: Point(np.int8(1), [np.ones(1)])),
    ("dict", lambda: {"a": np.ones(2), "b": (1, 2)}),
    ("ordered_dict", lambda: collections.OrderedDict(a=np.ones(1))),
    ("frozen_map", lambda: FrozenMap(a=np.zeros(1))),
    ("range", lambda: range(3)),
    ("nested", lambda: [{"a": (np.zeros(2), [np.float64(1)])}, b"x"]),
]


def test_convert_torch_mode_matches_torch_default_convert() -> None:
    """convert(tensor_type='torch') equals torch's default_convert on one sample."""
    torch = pytest.importorskip("torch")
    for name, make in SAMPLES:
        theirs = torch.utils.data.default_convert(make())
        ours = convert(make(), tensor_type="torch")
        if isinstance(theirs, np.ndarray):  # left unchanged (strings, objects, masked)
            assert type(ours) is type(theirs) and ours.dtype == theirs.dtype, name
        else:
            _assert_same(ours, theirs, torch, name)


def test_convert_numpy_mode_and_none_rule() -> None:
    """NumPy mode keeps arrays and scalars, turns tensors into arrays and tuples into lists."""
    torch = pytest.importorskip("torch")
    sample = (np.arange(2), np.float32(1), 3, "s", Point(1, (2,)))
    out = default_convert(sample)
    assert type(out) is list and out[0] is sample[0] and out[1] is sample[1]
    assert out[2:] == [3, "s", Point(1, [2])]
    out = convert({"t": torch.ones(2), "a": np.ones(2)}, tensor_type="numpy")
    assert type(out["t"]) is np.ndarray and out["a"] is not None
    out = default_convert({"t": torch.ones(2), "a": np.ones(2, np.float32)})
    assert isinstance(out["a"], torch.Tensor) and out["a"].dtype == torch.float32


def test_default_collate_object() -> None:
    """DefaultCollate pickles, compares, reprs, and collates or converts as configured."""
    fn = DefaultCollate("numpy")
    assert DefaultCollate.accepts_alloc is True
    clone = pickle.loads(pickle.dumps(fn))
    assert clone == fn and hash(clone) == hash(fn) and clone != DefaultCollate("numpy", False)
    assert repr(fn) == "DefaultCollate(tensor_type='numpy', batched=True)"
    assert fn([(1, 2.0), (3, 4.0)])[0].tolist() == [1, 3]
    handed, alloc = _recording_alloc()
    out = fn([np.ones(2), np.zeros(2)], alloc=alloc)
    assert np.shares_memory(out, handed[0])
    assert DefaultCollate(batched=False)((1, np.ones(1))) == [1, np.ones(1)]


def test_public_functions_use_the_none_rule() -> None:
    """default_collate/default_convert equal collate/convert with tensor_type=None."""
    batch = [{"a": (np.ones(2), 1)} for _ in range(2)]
    a, b = default_collate(batch), collate(batch)
    assert a.keys() == b.keys() and all(
        np.array_equal(x, y) for x, y in zip(a["a"], b["a"], strict=True)
    )
    assert default_convert((1, 2)) == convert((1, 2)) == [1, 2]
