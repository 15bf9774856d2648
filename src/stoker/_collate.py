"""Collate: merge a list of samples into one batch, as torch's ``default_collate`` does.

The structure rules are torch's: a mapping stays a mapping of the same type, a namedtuple
stays a namedtuple, a tuple or list becomes a list of columns, str and bytes stay as they
are, and arrays, tensors and numbers are stacked along a new first axis.

``tensor_type`` decides what leaves become: ``None`` gives torch tensors (exactly as torch
makes them) when any leaf of a sample is a ``torch.Tensor``, else NumPy arrays; ``"numpy"``
and ``"torch"`` force one. Every decision looks at the first sample only (a batch's samples
share one structure), so each field's handler is chosen once per batch.

Given an ``alloc`` (:data:`stoker._batch.Alloc`), stacked leaves are written into the memory
it returns: a worker collates straight into shared memory, one copy.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, MutableMapping, MutableSequence, Sequence
from functools import reduce
from typing import Any, NoReturn

import numpy as np

from stoker import _torch
from stoker._batch import Alloc, ColumnBatch
from stoker.errors import CollateError

__all__ = ["DefaultCollate", "collate", "convert", "default_collate", "default_convert"]

# Kinds of leaf or container, in torch's order of dispatch (a float subclass is a float, ...).
_TENSOR, _ARRAY, _NPSCALAR, _FLOAT, _INT, _STR, _MAPPING, _NAMEDTUPLE, _SEQUENCE, _OTHER = range(10)
_NUMBER_KINDS = (_NPSCALAR, _FLOAT, _INT)
_KINDS: dict[type, int] = {}
_NP_KINDS = "biufc"  # dtype kinds that stack into numeric arrays
_FIX = "or pass a collate_fn that handles them"
_EMPTY = "default_collate needs at least one sample, got an empty batch (list index out of range)."


def _classify(tp: type) -> int:
    torch = _torch.loaded()
    if torch is not None and issubclass(tp, torch.Tensor):
        return _TENSOR
    if issubclass(tp, np.ndarray):
        return _ARRAY
    if issubclass(tp, (np.bool_, np.number, np.object_)):
        return _NPSCALAR
    if issubclass(tp, float):
        return _FLOAT
    if issubclass(tp, int):
        return _INT
    if issubclass(tp, (str, bytes)):
        return _STR
    if issubclass(tp, Mapping):
        return _MAPPING
    if issubclass(tp, tuple) and hasattr(tp, "_fields"):
        return _NAMEDTUPLE
    if issubclass(tp, Sequence):
        return _SEQUENCE
    return _OTHER


def _kind(tp: type) -> int:
    """The kind of values of type ``tp``, cached per type (a tensor type exists only once
    torch is imported, so a cached answer never goes stale)."""
    kind = _KINDS.get(tp)
    if kind is None:
        kind = _classify(tp)
        if len(_KINDS) > 4096:  # types made on the fly must not grow the cache forever
            _KINDS.clear()
        _KINDS[tp] = kind
    return kind


def check_tensor_type(tensor_type: object) -> None:
    """Raise ``ValueError`` unless ``tensor_type`` is None, ``"numpy"`` or ``"torch"``.

    >>> check_tensor_type("jax")
    Traceback (most recent call last):
    ValueError: tensor_type must be None, 'numpy' or 'torch', got 'jax'.
    """
    if tensor_type is not None and not (
        isinstance(tensor_type, str) and tensor_type in ("numpy", "torch")
    ):
        raise ValueError(f"tensor_type must be None, 'numpy' or 'torch', got {tensor_type!r}.")


def _has_tensor(x: Any) -> bool:
    kind = _kind(type(x))
    if kind == _TENSOR:
        return True
    if kind == _MAPPING:
        return any(_has_tensor(v) for v in x.values())
    if kind in (_NAMEDTUPLE, _SEQUENCE):
        return any(_has_tensor(v) for v in x)
    return False


def _resolve(tensor_type: str | None, sample: Any) -> Any:
    """The torch module when the output is tensors, None when it is NumPy arrays."""
    check_tensor_type(tensor_type)
    if tensor_type is None:
        torch = _torch.loaded()  # no torch imported: no tensor can exist
        return torch if torch is not None and _has_tensor(sample) else None
    if tensor_type == "torch":
        return _torch.require("tensor_type='torch'")
    return None


# ---------------------------------------------------------------------------- public API


def default_collate(batch: Any) -> Any:
    """Merge a list of samples into a batch with a new leading batch axis, as torch does.

    Tensors in the samples give tensors (numbers and arrays then become tensors too, as
    ``torch.utils.data.default_collate`` makes them); otherwise NumPy arrays.

    Args:
        batch: a sequence of samples of the same structure.

    Returns:
        The samples' structure with every leaf stacked: mappings keep their type, namedtuples
        stay namedtuples, tuples and lists become lists, str and bytes are left in a sequence.

    Raises:
        CollateError: (a ``RuntimeError``) arrays of different shapes, or sequences of
            different lengths, at the same place of two samples.
        TypeError: a value that cannot be batched (e.g. None, or an array of strings).

    >>> import numpy as np
    >>> default_collate([(np.zeros(2, np.float32), 0), (np.ones(2, np.float32), 1)])
    [array([[0., 0.],
           [1., 1.]], dtype=float32), array([0, 1])]
    >>> default_collate([{"x": 1.5, "name": "a"}, {"x": 2.0, "name": "b"}])
    {'x': array([1.5, 2. ]), 'name': ['a', 'b']}
    """
    return collate(batch)


def default_convert(data: Any) -> Any:
    """Convert one unbatched sample as torch's ``default_convert`` does.

    Tensors in the sample turn its NumPy arrays and scalars into tensors; otherwise arrays
    stay arrays. Tuples become lists, other containers keep their type; the rest is unchanged.

    Args:
        data: one sample.

    >>> import numpy as np
    >>> default_convert((np.arange(3), 1, "a"))
    [array([0, 1, 2]), 1, 'a']
    """
    return convert(data)


class DefaultCollate:
    """stoker's default ``collate_fn``: :func:`collate` when batching, else :func:`convert`.

    Picklable, so it travels to worker processes; the workers pass ``alloc`` to collate
    straight into shared memory (``accepts_alloc`` tells them it can).

    Args:
        tensor_type: None (follow the data), ``"numpy"`` or ``"torch"``.
        batched: whether the loader batches samples (``collate``) or not (``convert``).
    """

    accepts_alloc = True

    def __init__(self, tensor_type: str | None = None, batched: bool = True) -> None:
        check_tensor_type(tensor_type)
        self.tensor_type = tensor_type
        self.batched = bool(batched)

    def __call__(self, batch: Any, alloc: Alloc | None = None) -> Any:
        """Collate (or convert) ``batch``, writing stacked leaves into ``alloc``'s memory."""
        if self.batched:
            return collate(batch, tensor_type=self.tensor_type, alloc=alloc)
        return convert(batch, tensor_type=self.tensor_type)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DefaultCollate):
            return NotImplemented
        return (self.tensor_type, self.batched) == (other.tensor_type, other.batched)

    def __hash__(self) -> int:
        return hash((DefaultCollate, self.tensor_type, self.batched))

    def __repr__(self) -> str:
        return f"DefaultCollate(tensor_type={self.tensor_type!r}, batched={self.batched})"


def collate(batch: Any, *, tensor_type: str | None = None, alloc: Alloc | None = None) -> Any:
    """Collate ``batch`` into tensors or arrays per ``tensor_type`` (see the module docs).

    Args:
        batch: a sequence of samples, or a :class:`~stoker._batch.ColumnBatch`.
        tensor_type: None (tensors when a sample holds a tensor), ``"numpy"`` or ``"torch"``.
        alloc: where to write every stacked leaf; by default fresh memory.

    Raises:
        ValueError: ``tensor_type`` is not one of None, ``"numpy"``, ``"torch"``.
        IndexError: the batch is empty (as torch).
        CollateError: shapes or lengths differ between samples.
        TypeError: a value that cannot be batched.
    """
    if isinstance(batch, ColumnBatch):
        return _collate_columns(batch, tensor_type, alloc)
    try:
        first = batch[0]
    except IndexError:
        check_tensor_type(tensor_type)
        raise IndexError(_EMPTY) from None
    return _collate(batch, "", _resolve(tensor_type, first), alloc)


def convert(data: Any, *, tensor_type: str | None = None) -> Any:
    """Convert one sample's leaves per ``tensor_type`` without batching them.

    In torch mode this is torch's ``default_convert``: NumPy arrays and scalars become
    tensors (arrays of strings or objects stay). In NumPy mode tensors become arrays and
    NumPy values stay. Either way tuples become lists, as torch does.

    Args:
        data: one sample.
        tensor_type: None (tensors when the sample holds a tensor), ``"numpy"`` or ``"torch"``.
    """
    return _convert(data, "data", _resolve(tensor_type, data))


# ---------------------------------------------------------------------------- structure


def _where(i: int, field: str) -> str:
    return f"batch[{i}]{field}"


def _collate(batch: Sequence[Any], field: str, torch: Any, alloc: Alloc | None) -> Any:
    """Collate one field: ``batch`` holds its value in every sample."""
    elem = batch[0]
    kind = _KINDS.get(type(elem))
    if kind is None:
        kind = _kind(type(elem))
    if kind == _ARRAY:
        if torch is None:
            return _arrays_numpy(batch, field, alloc)
        return _arrays_torch(batch, field, torch, alloc)
    if kind in _NUMBER_KINDS:
        if torch is None:
            return _numbers_numpy(batch, field, kind, alloc)
        return _numbers_torch(batch, field, kind, torch, alloc)
    if kind == _TENSOR:
        return _stack_tensors(batch, field, _torch.loaded(), alloc, to_numpy=torch is None)
    if kind == _STR:
        return batch  # as torch: the column itself (a list, or a tuple from a transposition)
    if kind == _MAPPING:
        return _collate_mapping(batch, field, torch, alloc)
    if kind in (_NAMEDTUPLE, _SEQUENCE):
        return _collate_sequence(batch, field, torch, alloc, kind)
    raise TypeError(
        f"default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; "
        f"found {type(elem)} at {_where(0, field)} (str and bytes are kept as lists). Convert "
        f"it in the dataset (or drop it), {_FIX}."
    )


def _collate_mapping(batch: Sequence[Any], field: str, torch: Any, alloc: Alloc | None) -> Any:
    elem = batch[0]
    out = {}
    for key in elem:
        try:
            column = [d[key] for d in batch]
        except KeyError:
            i = next(i for i, d in enumerate(batch) if key not in d)
            raise KeyError(
                f"{_where(i, field)} has no key {key!r}, which {_where(0, field)} has; every "
                f"sample needs the same keys: fill in a default in the dataset, {_FIX}."
            ) from None
        except TypeError as exc:
            raise _structure_error(batch, field, exc) from exc
        out[key] = _collate(column, f"{field}[{key!r}]", torch, alloc)
    return out if type(elem) is dict else _like_mapping(elem, out)


def _like_mapping(like: Any, out: dict[Any, Any]) -> Any:
    """``out`` as a mapping of ``like``'s type (a copy keeps its extra state), as torch."""
    try:
        if isinstance(like, MutableMapping):
            clone = copy.copy(like)
            clone.update(out)
            return clone
        return type(like)(out)
    except TypeError:  # the type cannot be copied or built from a dict
        return out


def _like_sequence(like: Any, out: list[Any]) -> Any:
    """``out`` as a sequence of ``like``'s type, a list for tuples, as torch."""
    if isinstance(like, tuple) or type(like) is list:
        return out  # torch turns tuples into lists (backwards compatibility)
    try:
        if isinstance(like, MutableSequence):
            clone = copy.copy(like)
            for j, value in enumerate(out):
                clone[j] = value
            return clone
        return type(like)(out)
    except TypeError:  # e.g. range
        return out


def _collate_sequence(
    batch: Sequence[Any], field: str, torch: Any, alloc: Alloc | None, kind: int
) -> Any:
    elem = batch[0]
    try:
        # torch zips namedtuples without a length check
        columns = list(zip(*batch, strict=kind != _NAMEDTUPLE))
    except ValueError as exc:
        raise _length_error(batch, field, exc) from exc
    except TypeError as exc:
        raise _structure_error(batch, field, exc) from exc
    if kind == _NAMEDTUPLE:
        return type(elem)(
            *(
                _collate(col, f"{field}.{name}", torch, alloc)
                for name, col in zip(elem._fields, columns, strict=False)
            )
        )
    return _like_sequence(
        elem, [_collate(c, f"{field}[{j}]", torch, alloc) for j, c in enumerate(columns)]
    )


def _convert(data: Any, where: str, torch: Any) -> Any:
    kind = _kind(type(data))
    if kind == _TENSOR:
        return data if torch is not None else _tensor_to_numpy(data, where)
    if kind in (_ARRAY, _NPSCALAR, _OTHER):
        # torch converts objects of numpy's own types, except arrays of strings or objects
        if torch is None or type(data).__module__ != "numpy":
            return data
        if kind == _ARRAY and data.dtype.kind in "OSU":
            return data
        if kind == _ARRAY and not data.flags.writeable:
            # a tensor ignores the flag: sharing would let a tensor write into what the
            # array protects (a cache's entry), so a read-only array is handed out copied
            data = data.copy()
        try:
            return torch.as_tensor(data)
        except (TypeError, ValueError, RuntimeError) as exc:
            _reraise(exc, where)
    if kind == _MAPPING:
        return _like_mapping(
            data, {k: _convert(v, f"{where}[{k!r}]", torch) for k, v in data.items()}
        )
    if kind == _NAMEDTUPLE:
        return type(data)(
            *(_convert(v, f"{where}.{n}", torch) for n, v in zip(data._fields, data, strict=True))
        )
    if kind == _SEQUENCE:
        return _like_sequence(
            data, [_convert(v, f"{where}[{j}]", torch) for j, v in enumerate(data)]
        )
    return data


def _collate_columns(batch: ColumnBatch, tensor_type: str | None, alloc: Alloc | None) -> Any:
    """Collate a :class:`ColumnBatch` by gathering whole columns (no per-sample work)."""
    check_tensor_type(tensor_type)
    if len(batch) == 0:
        raise IndexError(_EMPTY)
    if not batch.numeric():
        # strings or objects: the samples decide what they become, as torch does
        return collate(list(batch), tensor_type=tensor_type, alloc=alloc)
    if tensor_type is None:
        torch = _torch.loaded() if batch.any_tensor() else None
    else:
        torch = _resolve(tensor_type, None)
    columns = batch.gather(alloc)
    if torch is not None:
        columns = [c if _torch.is_tensor(c) else torch.from_numpy(c) for c in columns]
    else:
        where = "batch[:]"
        columns = [_tensor_to_numpy(c, where) if _torch.is_tensor(c) else c for c in columns]
    return dict(zip(batch.keys, columns, strict=True)) if batch.keys is not None else columns


# ---------------------------------------------------------------------------- leaves


def _empty(shape: tuple[int, ...], dtype: np.dtype[Any], alloc: Alloc | None) -> Any:
    return np.empty(shape, dtype) if alloc is None else alloc(shape, dtype)


def _one_dtype(batch: Sequence[Any]) -> bool:
    """Whether every item has the same ``dtype`` (tensors' dtypes never equal arrays')."""
    try:
        return len({a.dtype for a in batch}) == 1
    except AttributeError:
        return False


def _fill(batch: Sequence[Any], field: str, dtype: np.dtype[Any], alloc: Alloc | None) -> Any:
    """Stack arrays of one dtype: one assignment from the list copies each sample once, at
    a fraction of np.stack's per-array cost, and rejects samples of another shape."""
    out = _empty((len(batch), *batch[0].shape), dtype, alloc)
    try:
        out[...] = batch
    except ValueError as exc:
        raise _shape_error(batch, field, exc) from exc
    return out


def _arrays_numpy(batch: Sequence[Any], field: str, alloc: Alloc | None) -> Any:
    elem = batch[0]
    dtype = elem.dtype
    if dtype.kind not in _NP_KINDS:
        raise _dtype_error(field, dtype)
    if _one_dtype(batch):
        return _fill(batch, field, dtype, alloc)
    _check_shapes(batch, field)
    arrays = [np.asarray(a) for a in batch]
    dtype = reduce(np.promote_types, {a.dtype for a in arrays})
    if dtype.kind not in _NP_KINDS:
        raise _dtype_error(field, dtype)
    out = _empty((len(arrays), *elem.shape), dtype, alloc)
    np.stack(arrays, out=out)
    return out


_TORCH_FROM_NP: dict[np.dtype[Any], bool] = {}
_NP_FROM_TORCH: dict[Any, np.dtype[Any] | None] = {}


def _torch_takes(torch: Any, dtype: np.dtype[Any]) -> bool:
    """Whether ``torch.from_numpy`` accepts arrays of ``dtype`` (cached)."""
    if dtype not in _TORCH_FROM_NP:
        try:
            _TORCH_FROM_NP[dtype] = torch.from_numpy(np.empty(0, dtype)) is not None
        except (TypeError, ValueError):
            _TORCH_FROM_NP[dtype] = False
    return _TORCH_FROM_NP[dtype]


def numpy_dtype(torch: Any, dtype: Any) -> np.dtype[Any] | None:
    """The NumPy dtype of a torch dtype, or None when NumPy has none (bfloat16, ...)."""
    if dtype not in _NP_FROM_TORCH:
        try:
            _NP_FROM_TORCH[dtype] = torch.empty(0, dtype=dtype).numpy().dtype
        except TypeError:
            _NP_FROM_TORCH[dtype] = None
    return _NP_FROM_TORCH[dtype]


def _arrays_torch(batch: Sequence[Any], field: str, torch: Any, alloc: Alloc | None) -> Any:
    elem = batch[0]
    dtype = elem.dtype
    if dtype.kind in "OSU":
        raise _dtype_error(field, dtype)
    if _one_dtype(batch) and _torch_takes(torch, dtype):
        # Same result as torch's as_tensor-then-stack, with one copy and no per-sample tensor.
        return torch.from_numpy(_fill(batch, field, dtype, alloc))
    _check_shapes(batch, field)
    try:
        tensors = [torch.as_tensor(a) for a in batch]
    except (TypeError, ValueError, RuntimeError) as exc:
        _reraise(exc, _where(0, field))
    return _stack_tensors(tensors, field, torch, alloc, to_numpy=False)


def _stack_tensors(
    batch: Sequence[Any], field: str, torch: Any, alloc: Alloc | None, *, to_numpy: bool
) -> Any:
    elem = batch[0]
    if elem.is_nested or elem.layout != torch.strided:
        kind = "nested" if elem.is_nested else "sparse"
        raise CollateError(
            f"Batches of {kind} tensors are not currently supported by the default "
            f"collate_fn: {_where(0, field)} is a "
            f"{'nested' if elem.is_nested else elem.layout} tensor, and default_collate "
            f"stacks only dense tensors; convert them to dense tensors {_FIX}."
        )
    out = _tensor_out(batch, torch, alloc) if alloc is not None else None
    try:
        result = torch.stack(batch, 0, out=out)
    except RuntimeError as exc:
        raise _shape_error(batch, field, exc) from exc
    except TypeError as exc:
        _reraise(exc, _where(0, field))
    return _tensor_to_numpy(result, _where(0, field)) if to_numpy else result


def _tensor_out(batch: Sequence[Any], torch: Any, alloc: Alloc) -> Any:
    """A tensor over ``alloc``'s memory for ``torch.stack(batch)``, or None to use fresh memory."""
    elem = batch[0]
    if elem.device.type != "cpu":
        return None
    dtype = elem.dtype
    try:
        for t in batch:
            if t.requires_grad:  # out= does not support autograd
                return None
            if t.dtype is not dtype:
                dtype = torch.promote_types(dtype, t.dtype)
    except AttributeError:  # not a tensor: torch.stack will say so
        return None
    np_dtype = numpy_dtype(torch, dtype)
    if np_dtype is None:
        return None
    return torch.from_numpy(alloc((len(batch), *elem.shape), np_dtype))


def _tensor_to_numpy(t: Any, where: str) -> Any:
    try:
        return t.numpy(force=True)
    except TypeError as exc:
        raise TypeError(
            f"{where}: a {t.dtype} tensor has no NumPy equivalent ({exc}); use "
            "tensor_type='torch', or convert it (e.g. with .float()) in the dataset."
        ) from exc


def _numbers_numpy(batch: Sequence[Any], field: str, kind: int, alloc: Alloc | None) -> Any:
    try:
        arr = np.array(batch)
    except (ValueError, TypeError) as exc:
        raise _numbers_error(batch, field, TypeError) from exc
    k = arr.dtype.kind
    if kind == _INT and k in "Of":
        _check_int64(batch, field)  # numpy turns ints beyond int64 into objects or floats
    if arr.ndim != 1 or k not in _NP_KINDS or (kind == _FLOAT and k == "c"):
        raise _numbers_error(batch, field, TypeError)
    if kind == _FLOAT:
        arr = arr.astype(np.float64, copy=False)
    elif kind == _INT and k in "iu" and arr.dtype != np.int64:
        _check_int64(batch, field)
        arr = arr.astype(np.int64)
    if alloc is None:
        return arr
    out = alloc(arr.shape, arr.dtype)
    out[...] = arr
    return out


def _check_int64(batch: Sequence[Any], field: str) -> None:
    if any(type(x) is int and not -(2**63) <= x < 2**63 for x in batch):
        raise _numbers_error(batch, field, ValueError)  # as torch: "Overflow when unpacking"


def _numbers_torch(
    batch: Sequence[Any], field: str, kind: int, torch: Any, alloc: Alloc | None
) -> Any:
    try:  # torch's own calls, for its exact dtypes (e.g. float32 for ints mixed with floats)
        if kind == _NPSCALAR:
            t = torch.as_tensor(batch)
        else:
            t = torch.tensor(batch, dtype=torch.float64 if kind == _FLOAT else None)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise _numbers_error(batch, field, type(exc), exc) from exc
    if alloc is None:
        return t
    np_dtype = numpy_dtype(torch, t.dtype)
    if np_dtype is None:
        return t
    out = torch.from_numpy(alloc(tuple(t.shape), np_dtype))
    out.copy_(t)
    return out


# ---------------------------------------------------------------------------- errors


def _reraise(exc: BaseException, where: str) -> NoReturn:
    """Raise ``exc`` again with ``where`` in its message, keeping its type."""
    if type(exc) in (TypeError, ValueError, RuntimeError, KeyError, IndexError):
        raise type(exc)(f"{where}: {exc}") from exc
    exc.add_note(f"while collating {where}")
    raise exc


def _type_name(x: Any) -> str:
    if isinstance(x, np.ndarray) or _torch.is_tensor(x):
        return f"{type(x).__name__} of {x.dtype}"
    return type(x).__qualname__


def _shape_of(x: Any) -> tuple[int, ...] | None:
    try:
        return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)
    except (ValueError, TypeError):
        return None


def _shape_mismatch(batch: Sequence[Any], field: str) -> CollateError | None:
    s0 = _shape_of(batch[0])
    for i, x in enumerate(batch):
        s = _shape_of(x)
        if s != s0:
            return CollateError(
                f"stack expects each tensor to be equal size, but {_where(i, field)} has "
                f"shape {s} ({_type_name(x)}) and {_where(0, field)} "
                f"has shape {s0} ({_type_name(batch[0])}): the samples of a batch must have "
                f"equal shapes. Pad or resize them to one shape (e.g. in a transform), {_FIX} "
                "(e.g. one that pads)."
            )
    return None


def _check_shapes(batch: Sequence[Any], field: str) -> None:
    if (err := _shape_mismatch(batch, field)) is not None:
        raise err


def _shape_error(batch: Sequence[Any], field: str, exc: Exception) -> Exception:
    if (err := _shape_mismatch(batch, field)) is not None:
        return err
    if isinstance(exc, RuntimeError) or type(exc) is ValueError:
        return CollateError(f"{_where(0, field)}: cannot stack the samples: {exc}")
    return exc


def _length_error(batch: Sequence[Any], field: str, exc: Exception) -> Exception:
    n0 = len(batch[0])
    for i, x in enumerate(batch):
        if len(x) != n0:
            return CollateError(
                f"{_where(i, field)} has length {len(x)} but {_where(0, field)} has length "
                f"{n0}: sequences at the same place of every sample must have equal lengths "
                f"(each element in list of batch should be of equal size). Pad or truncate "
                f"them to one length, {_FIX} (e.g. one that pads)."
            )
    return exc


def _structure_error(batch: Sequence[Any], field: str, exc: Exception) -> TypeError:
    t0 = type(batch[0])
    i = next((i for i, x in enumerate(batch) if type(x) is not t0), 0)
    return TypeError(
        f"{_where(i, field)} has type {_type_name(batch[i])} but {_where(0, field)} has type "
        f"{t0.__qualname__} ({exc}): every sample must have the same structure; make the "
        f"dataset return one structure, {_FIX}."
    )


def _dtype_error(field: str, dtype: np.dtype[Any]) -> TypeError:
    return TypeError(
        f"default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; "
        f"found an array of dtype {dtype} at {_where(0, field)}, which cannot be stacked into "
        f"a numeric batch. Convert it in the dataset (e.g. strings to a list or to codes), "
        f"{_FIX}."
    )


def _numbers_error(
    batch: Sequence[Any], field: str, exc_type: type[Exception], exc: Exception | None = None
) -> Exception:
    detail = f" ({exc})" if exc is not None else ""
    first = batch[0]
    for i, x in enumerate(batch):
        if type(x) is int and not -(2**63) <= x < 2**63:
            return exc_type(
                f"{_where(i, field)} = {x} does not fit in int64{detail}; store it as a float "
                f"or a string in the dataset, {_FIX}."
            )
        number = isinstance(x, (int, float, np.bool_, np.number))
        if not number or (
            isinstance(first, float) and isinstance(x, (complex, np.complexfloating))
        ):
            return exc_type(
                f"{_where(i, field)} has type {_type_name(x)} but {_where(0, field)} has type "
                f"{_type_name(first)}: a batch of numbers needs a number there in every sample"
                f"{detail}. Convert it in the dataset, {_FIX}."
            )
    return exc_type(f"{_where(0, field)}: cannot make a batch of these numbers{detail}.")
