"""Samples as fields: names, value codecs, and turning stored fields back into samples.

Both formats store a sample as named fields, WebDataset's convention: a tar shard holds
members ``KEY.FIELD`` (``000042.jpg``, ``000042.cls``) and an LMDB file holds entries under
the same names. A field's *codec* says how its bytes become a value; none of them unpickles:

============  ===================================================  =====================
codec         value                                                default for fields
============  ===================================================  =====================
``bytes``     the raw bytes (images stay encoded until decoded)    anything else
``npy``       a NumPy array (``np.save``, ``allow_pickle=False``)  ``*.npy``
``json``      any JSON value                                       ``*.json``
``int``       an int, written as ASCII digits                      ``*.cls``, ``*.id`` ...
``str``       text, UTF-8                                          ``*.txt``, ``*.text``
============  ===================================================  =====================

A *field spec* says which fields make the sample a reader returns: a list of names, each
one name or alternatives separated by ``;`` (``"jpg;png"`` takes whichever the sample has),
as WebDataset's ``to_tuple``. A spec of one name gives the bare value; ``"__dict__"`` gives
the whole ``{field: value}`` dict (with ``"__key__"``).
"""

from __future__ import annotations

import io
import json
import posixpath
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from stoker import _torch

CODECS = ("bytes", "int", "json", "npy", "str")
IMAGE_FIELDS = ("jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp")
DICT_SPEC = "__dict__"
_BY_SUFFIX = {
    "npy": "npy",
    "json": "json",
    "cls": "int",
    "cls2": "int",
    "index": "int",
    "id": "int",
    "txt": "str",
    "text": "str",
}


class CorruptRecordError(OSError, ValueError):
    """A stored record cannot be read back: the message names the file and the key.

    An ``OSError`` as a corrupt image file is for Pillow and torchvision, and a
    ``ValueError`` as a malformed value is for ``json`` and ``np.load``: either catches it.

    >>> issubclass(CorruptRecordError, OSError), issubclass(CorruptRecordError, ValueError)
    (True, True)
    """


def default_codec(field: str) -> str:
    """The codec a field gets from its last suffix.

    >>> default_codec("jpg"), default_codec("0.npy"), default_codec("cls")
    ('bytes', 'npy', 'int')
    """
    return _BY_SUFFIX.get(field.rsplit(".", 1)[-1].lower(), "bytes")


def split_name(name: str, where: str) -> tuple[str, str]:
    """The ``(key, field)`` of a member name ``dir/key.field``, after checking it is safe.

    The key is everything before the first dot of the last path part (directories kept).

    >>> split_name("a/000001.seg.png", "x.tar")
    ('a/000001', 'seg.png')

    Raises:
        ValueError: for an absolute name, a ``..`` part, or a name with no ``.field``.
    """
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise ValueError(
            f"{where}: member {name!r} has an absolute path; stoker reads only relative "
            "member names (KEY.FIELD). The archive may be malicious: do not extract it."
        )
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        raise ValueError(
            f"{where}: member {name!r} contains '..'; stoker rejects names that climb out "
            "of the archive. The archive may be malicious: do not extract it."
        )
    head, base = posixpath.split(name)
    stem, dot, field = base.partition(".")
    if not dot or not stem or not field:
        raise ValueError(
            f"{where}: member {name!r} is not named KEY.FIELD (e.g. 000001.jpg); "
            "write shards with ShardWriter or `stoker pack`."
        )
    return (f"{head}/{stem}" if head else stem), field


def check_key(key: str) -> str:
    """``key`` if it can name a sample (non-empty, no dot in its last part, relative).

    >>> check_key("000042")
    '000042'
    """
    base = key.rsplit("/", 1)[-1]
    if not key or "." in base or key.startswith("/") or ".." in key.split("/"):
        raise ValueError(
            f"a sample key must be non-empty, relative, without '..' and without a dot in "
            f"its last part, got {key!r}; use e.g. '000042' or 'train/000042'."
        )
    return key


def infer_field(value: object, position: int | None) -> str:
    """A field name for ``value`` by its type, prefixed by its tuple position if any.

    >>> infer_field(b"x", 0), infer_field(3, 1), infer_field([1.5], None)
    ('0.bin', '1.cls', 'json')
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        suffix = "bin"
    elif isinstance(value, np.ndarray | np.generic) or _torch.is_tensor(value):
        suffix = "npy"
    elif isinstance(value, bool):
        suffix = "json"
    elif isinstance(value, int):
        suffix = "cls"
    elif isinstance(value, str):
        suffix = "txt"
    elif _is_pil(value):
        suffix = "png"
    else:
        suffix = "json"
    return suffix if position is None else f"{position}.{suffix}"


def _is_pil(value: object) -> bool:
    cls = type(value)
    return cls.__module__.startswith("PIL.") and hasattr(value, "save")


def encode(field: str, value: object, codec: str) -> bytes:
    """The stored bytes of ``value`` under ``codec``.

    >>> encode("cls", 7, "int"), decode(encode("x.npy", np.arange(3), "npy"), "npy").tolist()
    (b'7', [0, 1, 2])

    Raises:
        TypeError: when the value does not fit the codec (the message says which fits).
    """
    if codec == "bytes":
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        if _is_pil(value):
            buf = io.BytesIO()
            value.save(buf, format="PNG")  # type: ignore[attr-defined]
            return buf.getvalue()
        raise TypeError(
            f"field {field!r} stores raw bytes, got {type(value).__name__}; name the field "
            "*.npy for arrays, *.json for other values, *.cls for ints, *.txt for text."
        )
    if codec == "npy":
        if _torch.is_tensor(value):
            value = value.detach().cpu().numpy()  # type: ignore[attr-defined]
        buf = io.BytesIO()
        try:
            np.save(buf, np.asarray(value), allow_pickle=False)
        except ValueError as exc:
            raise TypeError(
                f"field {field!r} (.npy) needs a numeric array, got {type(value).__name__}: "
                f"{exc}. Store objects in a *.json field instead."
            ) from exc
        return buf.getvalue()
    if codec == "int":
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            return str(int(value)).encode()
        raise TypeError(f"field {field!r} stores an int, got {value!r}; name it *.json instead.")
    if codec == "str":
        if isinstance(value, str):
            return value.encode()
        raise TypeError(f"field {field!r} stores text, got {type(value).__name__}.")
    if codec == "json":
        try:
            return json.dumps(value, separators=(",", ":"), allow_nan=True).encode()
        except TypeError as exc:
            raise TypeError(
                f"field {field!r} (.json) needs a JSON-serialisable value: {exc}. "
                "Store arrays as *.npy and bytes as *.bin."
            ) from exc
    raise ValueError(f"codec must be one of {', '.join(CODECS)}, got {codec!r}.")


def decode(data: bytes, codec: str) -> Any:
    """The value of stored ``data`` under ``codec`` (never unpickles).

    >>> decode(b"12", "int"), decode(b'{"a":1}', "json")
    (12, {'a': 1})
    """
    if codec == "bytes":
        return data
    if codec == "npy":
        return np.load(io.BytesIO(data), allow_pickle=False)
    if codec == "int":
        return int(data)
    if codec == "str":
        return data.decode()
    if codec == "json":
        return json.loads(data)
    raise ValueError(f"codec must be one of {', '.join(CODECS)}, got {codec!r}.")


def decode_field(data: bytes, field: str, codec: str, file: str, key: str) -> Any:
    """:func:`decode`, turning any failure into :class:`CorruptRecordError` naming the record."""
    try:
        return decode(data, codec)
    except (ValueError, OSError, EOFError, UnicodeDecodeError) as exc:
        raise CorruptRecordError(
            f"corrupt record in {file!r}: key {key!r}, field {field!r} is not valid {codec} "
            f"({len(data)} bytes): {exc}. Rewrite the file (stoker pack) or drop the sample."
        ) from exc


def resolve_spec(spec: Sequence[str], fields: Sequence[str], file: str, key: str) -> list[str]:
    """The stored field chosen for each entry of ``spec`` among a sample's ``fields``.

    >>> resolve_spec(["jpg;png", "cls"], ["png", "cls"], "f", "k")
    ['png', 'cls']

    Raises:
        KeyError: when the sample has none of an entry's alternatives.
    """
    chosen = []
    for entry in spec:
        for alt in entry.split(";"):
            if alt in fields:
                chosen.append(alt)
                break
        else:
            raise KeyError(
                f"sample {key!r} in {file!r} has no field {entry!r} (it has "
                f"{', '.join(fields)}); pass fields= naming fields the samples hold."
            )
    return chosen


class SampleLayout:
    """Turns the samples a writer gets (dicts, tuples or single values) into named fields.

    A dict's keys are its field names (``__key__`` sets the sample key); a tuple's items
    are named ``0.EXT``, ``1.EXT`` ... and a single value ``EXT``, with ``EXT`` chosen by
    type unless ``fields`` names them. The first sample fixes the kind.
    """

    def __init__(self, fields: Sequence[str] | None, codecs: Mapping[str, str] | None) -> None:
        self.fields = list(fields) if fields is not None else None
        self.codecs: dict[str, str] = dict(codecs or {})
        self.kind: str | None = None
        self.order: list[str] = []  # fields in order of first appearance
        self.count = 0

    def fields_of(self, sample: object) -> tuple[str, dict[str, bytes]]:
        """The key and encoded fields of ``sample``."""
        key = f"{self.count:09d}"
        if isinstance(sample, Mapping):
            kind = "dict"
            items = dict(sample)
            key = str(items.pop("__key__", key))
        elif isinstance(sample, (tuple, list)):
            kind = "tuple"
            names = self.fields or [infer_field(v, i) for i, v in enumerate(sample)]
            if len(names) != len(sample):
                raise ValueError(
                    f"sample {self.count} has {len(sample)} items but fields= names "
                    f"{len(names)}; pass one field name per item."
                )
            items = {n.split(";")[0]: v for n, v in zip(names, sample, strict=True)}
        else:
            kind = "value"
            names = self.fields or [infer_field(sample, None)]
            items = {names[0].split(";")[0]: sample}
        if self.kind is None:
            self.kind = kind
        elif kind != self.kind:
            raise TypeError(
                f"sample {self.count} is a {kind} but the first sample was a {self.kind}; "
                "every sample of a file must have the same kind."
            )
        check_key(key)
        encoded = {}
        for name, value in items.items():
            if name.startswith("__"):
                continue
            codec = self.codecs.setdefault(name, default_codec(name))
            encoded[name] = encode(name, value, codec)
            if name not in self.order:
                self.order.append(name)
        if not encoded:
            raise ValueError(f"sample {key!r} has no field to store.")
        self.count += 1
        return key, encoded

    def spec(self) -> list[str]:
        """The read spec stored with the data: ``fields`` if given, else every field seen
        (for dict samples: the whole dict)."""
        if self.fields is not None:
            return list(self.fields)
        return [DICT_SPEC] if self.kind == "dict" else list(self.order)

    def read_kind(self) -> str:
        """How readers shape a sample by default: ``"dict"``, ``"tuple"`` or ``"value"``."""
        return spec_kind(self.spec(), self.kind)


def spec_kind(spec: Sequence[str], written: str | None) -> str:
    """The sample shape a read spec gives: a dict, a bare value, or a tuple.

    >>> spec_kind(["__dict__"], "dict"), spec_kind(["npy"], "value"), spec_kind(["a"], "tuple")
    ('dict', 'value', 'tuple')
    """
    if list(spec) == [DICT_SPEC]:
        return "dict"
    if len(spec) == 1 and written != "tuple":
        return "value"
    return "tuple"


class Assembler:
    """Builds samples from stored fields: decodes, picks the spec, decodes images, transforms.

    With a ``transform``, the first entry of the sample, when it is an image stored as raw
    bytes, is decoded to an RGB PIL image (through stoker.vision's fused JPEG path when the
    transform allows) before the transform; ``target_transform`` applies to the second.
    Made in the parent, called in whichever process reads.
    """

    def __init__(
        self,
        spec: Sequence[str],
        sample_kind: str,
        codecs: Mapping[str, str],
        transform: Callable[[Any], Any] | None,
        target_transform: Callable[[Any], Any] | None,
        decode_images: bool | None,
    ) -> None:
        self.spec = list(spec)
        self.kind = sample_kind  # "tuple", "value" or "dict"
        self.codecs = dict(codecs)
        self.transform = transform
        self.target_transform = target_transform
        self.decode_images = transform is not None if decode_images is None else decode_images
        self._plan: Any = None
        self._plan_for: object = None

    def codec(self, field: str) -> str:
        """The codec of ``field``: the stored one, else the default for its suffix."""
        return self.codecs.get(field) or default_codec(field)

    def fast_plan(self) -> Any:
        """The fused JPEG plan for the transform, or None (cached per transform object)."""
        if self.transform is not self._plan_for:
            self._plan_for = self.transform
            self._plan = None
            if self.decode_images and self.transform is not None:
                try:
                    from stoker.vision import _fused
                except ImportError:  # Pillow missing: the plain path raises a clear error
                    return None
                self._plan = _fused.plan(self.transform)
        return self._plan

    def needed(self, fields: Sequence[str], file: str, key: str) -> list[str]:
        """The stored fields a sample with ``fields`` must read, in spec order."""
        if self.kind == "dict":
            return list(fields)
        return resolve_spec(self.spec, fields, file, key)

    def build(self, raw: Mapping[str, bytes], file: str, key: str) -> Any:
        """The sample from its stored fields ``raw`` (only the needed ones)."""
        if self.kind == "dict":
            out = {"__key__": key}
            out.update({f: decode_field(d, f, self.codec(f), file, key) for f, d in raw.items()})
            return out
        names = list(raw)
        values = []
        for pos, f in enumerate(names):
            data = raw[f]
            if pos == 0 and self.decode_images and self.codec(f) == "bytes" and _is_image(f):
                values.append(self._image(data, file, key, f))
            else:
                value = decode_field(data, f, self.codec(f), file, key)
                if pos == 0 and self.transform is not None:
                    value = self.transform(value)
                values.append(value)
        if len(values) > 1 and self.target_transform is not None:
            values[1] = self.target_transform(values[1])
        return values[0] if self.kind == "value" else tuple(values)

    def _image(self, data: bytes, file: str, key: str, field: str) -> Any:
        where = f"{file}[{key}.{field}]"
        plan = self.fast_plan()
        if plan is not None:
            from stoker.vision import _fused

            out = _fused.run(plan, where, data)
            if out is not None:
                return out
        img = decode_image(data, where)
        return img if self.transform is None else self.transform(img)

    def build_batch(self, raws: Sequence[tuple[Mapping[str, bytes], str, str]]) -> list[Any]:
        """Samples of a batch; JPEGs on the fused path decode in parallel threads."""
        plan = self.fast_plan()
        if plan is None or self.kind == "dict":
            return [self.build(raw, file, key) for raw, file, key in raws]
        from stoker.vision import _fused

        jobs: list[Any] = []
        partial: list[tuple[Any, list[Any]]] = []
        for raw, file, key in raws:
            names = list(raw)
            first = names[0]
            job = None
            if self.codec(first) == "bytes" and _is_image(first):
                job = _fused.prepare(plan, f"{file}[{key}.{first}]", raw[first])
            if job is None:
                partial.append((self.build(raw, file, key), []))
                continue
            rest = [decode_field(raw[f], f, self.codec(f), file, key) for f in names[1:]]
            if rest and self.target_transform is not None:
                rest[0] = self.target_transform(rest[0])
            partial.append((len(jobs), rest))
            jobs.append(job)
        images = _fused.run_batch(plan, jobs)
        out = []
        for head, rest in partial:
            if not isinstance(head, int) or isinstance(head, bool):
                out.append(head)
                continue
            image = _fused.finish(plan, images[head])
            out.append(image if self.kind == "value" else (image, *rest))
        return out

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_plan"] = None
        state["_plan_for"] = None
        return state


def _is_image(field: str) -> bool:
    return field.rsplit(".", 1)[-1].lower() in IMAGE_FIELDS


def decode_image(data: bytes, where: str) -> Any:
    """The image in ``data`` as an RGB PIL image; errors name ``where`` (file and key).

    Pillow's decompression-bomb limit stays on.
    """
    try:
        from PIL import Image
    except ImportError as exc:
        raise ModuleNotFoundError(
            "decoding images needs Pillow: `pip install 'stoker[vision]'`, or read the raw "
            "bytes (no transform, decode=False)."
        ) from exc
    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.convert("RGB")
    except Image.DecompressionBombError:
        raise
    except (OSError, ValueError, SyntaxError, IndexError, EOFError) as exc:
        raise CorruptRecordError(
            f"corrupt record {where}: cannot decode the image ({len(data)} bytes): {exc}. "
            "Rewrite the file (stoker pack) or drop the sample."
        ) from exc
