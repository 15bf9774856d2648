"""``stoker pack`` and ``stoker inspect``: convert a dataset to LMDB or shards, describe files.

:func:`pack` reads an image folder (one subfolder per class, as ImageFolder) without
decoding anything, storing each file's bytes under its extension and the class index as
``cls``; or any map-style dataset made by a ``"module:factory"`` callable. The result
appears under its final name only when complete: LMDB through :class:`LMDBWriter`'s
temporary file, shards in a temporary folder renamed at the end.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from stoker.formats import _remote
from stoker.formats._codec import IMAGE_FIELDS
from stoker.formats._index import INDEX_SUFFIX

FORMATS = ("lmdb", "shards")
SHARD_NAME = "shard-%06d.tar"


@dataclass(frozen=True)
class PackSummary:
    """What :func:`pack` wrote: ``samples``, ``bytes`` on disk, ``seconds``, output ``files``.

    >>> import os, tempfile
    >>> with tempfile.TemporaryDirectory() as root:
    ...     summary = pack([(b"x", 0), (b"y", 1)], os.path.join(root, "d.lmdb"), progress=False)
    >>> summary.format, summary.samples
    ('lmdb', 2)
    """

    dst: str
    format: str
    samples: int
    bytes: int
    seconds: float
    files: tuple[str, ...]

    def __str__(self) -> str:
        rate = self.samples / self.seconds if self.seconds > 0 else float("inf")
        return (
            f"packed {self.samples} samples into {self.dst} ({self.format}, "
            f"{len(self.files)} file(s), {_human(self.bytes)}) in {self.seconds:.1f} s "
            f"({rate:,.0f} samples/s)"
        )


def _human(n: float) -> str:
    """``n`` bytes in a readable unit.

    >>> _human(2048), _human(3 * 1024**3)
    ('2.0 KiB', '3.0 GiB')
    """
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


class _Progress:
    """A tqdm bar when tqdm is installed, else a ``\\r``-updated line on ``stream``."""

    def __init__(self, total: int, label: str, stream: TextIO | None) -> None:
        self.total, self.label, self.stream = total, label, stream
        self.done = 0
        self._bar: Any = None
        self._last = 0.0
        if stream is None:
            return
        try:
            tqdm = importlib.import_module("tqdm").tqdm
        except ImportError:
            stream.write(f"{label}: 0/{total} samples\n")
            stream.flush()
        else:
            self._bar = tqdm(total=total, desc=label, unit="sample", file=stream)

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.stream is None:
            return
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last >= 0.2 or self.done == self.total:
            self._last = now
            pct = 100.0 * self.done / self.total if self.total else 100.0
            self.stream.write(f"\r{self.label}: {self.done}/{self.total} samples ({pct:.0f}%)")
            self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.stream is not None:
            self.stream.write("\n")
            self.stream.flush()


def load_factory(spec: str) -> Any:
    """The dataset made by ``"module:factory"`` (the factory is called with no argument).

    Raises:
        ValueError: when ``spec`` is not ``module:attribute``, or names no attribute.
        ImportError: when the module cannot be imported.
    """
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(
            f"a dataset source must be a folder or 'module:factory', got {spec!r}; e.g. "
            "'mypkg.data:make_train_set' (a callable returning a map-style dataset)."
        )
    try:
        obj: Any = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module.startswith(exc.name):
            raise  # the module exists, but something it imports does not
        raise ValueError(
            f"dataset source {spec!r} is neither a folder nor an importable 'module:factory' "
            f"({exc}); check the path, or the module's name and sys.path."
        ) from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(
                f"dataset source {spec!r}: module {module!r} has no attribute {attr!r}; name "
                "a callable defined in it (or an image folder that exists)."
            )
        obj = getattr(obj, part)
    return obj() if callable(obj) else obj


def _folder_samples(root: str) -> tuple[int, Iterator[dict[str, Any]], list[str], list[str]]:
    from stoker.vision import find_classes, make_dataset
    from stoker.vision._folder import IMG_EXTENSIONS

    classes, class_to_idx = find_classes(root)
    pairs = make_dataset(root, class_to_idx, extensions=IMG_EXTENSIONS)
    exts = sorted({os.path.splitext(p)[1][1:].lower() for p, _ in pairs})
    spec = [";".join(e for e in IMAGE_FIELDS if e in exts) or "jpg", "cls"]

    def gen() -> Iterator[dict[str, Any]]:
        for i, (path, target) in enumerate(pairs):
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as exc:  # read() errors (EIO ...) carry no file name
                raise OSError(
                    exc.errno,
                    f"cannot read image {i} of {root!r} ({exc.strerror or exc}); fix or "
                    "remove the file and pack again",
                    path,
                ) from exc
            ext = os.path.splitext(path)[1][1:].lower()
            yield {"__key__": f"{i:09d}", ext: data, "cls": int(target)}

    return len(pairs), gen(), spec, classes


def _dataset_samples(ds: Any) -> tuple[int, Iterator[Any]]:
    try:
        n = len(ds)
    except TypeError as exc:
        raise TypeError(
            f"pack needs a map-style dataset with __len__, got {type(ds).__name__}."
        ) from exc
    return n, (ds[i] for i in range(n))


def pack(
    src: str | os.PathLike[str] | Any,
    dst: str | os.PathLike[str],
    format: str = "lmdb",
    *,
    maxcount: int = 10_000,
    maxsize: float = 1e9,
    overwrite: bool = False,
    progress: bool | TextIO = True,
) -> PackSummary:
    """Convert a dataset into an LMDB file or a folder of tar shards.

    Args:
        src: an image folder (``root/<class>/<file>``), a ``"module:factory"`` string, or
            a map-style dataset object.
        dst: the LMDB file, or the folder of shards (``shard-000000.tar``, ...).
        format: ``"lmdb"`` or ``"shards"``.
        maxcount: samples per shard at most (shards only).
        maxsize: bytes per shard at most (shards only).
        overwrite: replace an existing ``dst`` (only once the new one is complete).
        progress: show progress on stderr (True), not at all (False), or on a stream.

    Returns:
        A summary (``str()`` of it is one line).

    Raises:
        ValueError: for an unknown format, bad shard limits, a bad source string, or a
            ``dst`` that is ``src`` or holds it (overwriting it would delete the source).
        FileExistsError: when ``dst`` exists and ``overwrite`` is False.

    >>> import os, tempfile
    >>> with tempfile.TemporaryDirectory() as root:
    ...     out = os.path.join(root, "shards")
    ...     summary = pack([(b"x", 0), (b"y", 1)], out, "shards", progress=False)
    ...     sorted(os.listdir(out))
    ['shard-000000.tar', 'shard-000000.tar.index.json']
    """
    from stoker.formats._tar import check_limits

    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}.")
    check_limits(maxcount, maxsize)
    dst = os.path.abspath(_remote.local_path(os.fspath(dst)))
    _check_destination(src, dst, overwrite)
    t0 = time.perf_counter()
    n, samples, fields, extra = _source_samples(src)
    stream = sys.stderr if progress is True else (None if progress is False else progress)
    bar = _Progress(n, f"stoker pack -> {os.path.basename(dst)}", stream)
    try:
        if format == "lmdb":
            files = _pack_lmdb(samples, dst, fields, extra, bar)
        else:
            files = _pack_shards(samples, dst, fields, extra, bar, maxcount, maxsize)
    finally:
        bar.close()
    size = sum(os.path.getsize(f) for f in files)
    return PackSummary(dst, format, bar.done, size, time.perf_counter() - t0, tuple(files))


def _check_destination(src: Any, dst: str, overwrite: bool) -> None:
    """Raises unless :func:`pack` may write ``dst``: not over its source, not over an
    existing file unless ``overwrite``."""
    if isinstance(src, (str, os.PathLike)) and os.path.exists(os.fspath(src)):
        source = os.path.realpath(os.fspath(src))
        if os.path.commonpath([source, os.path.realpath(dst)]) == os.path.realpath(dst):
            raise ValueError(
                f"the output {dst!r} is the source {os.fspath(src)!r} or a folder holding "
                "it; writing there would replace the source: pick another output."
            )
    if os.path.lexists(dst) and not overwrite:
        raise FileExistsError(
            f"{dst!r} already exists; pass overwrite=True (--overwrite) or pick another name."
        )


def _source_samples(src: Any) -> tuple[int, Iterator[Any], list[str] | None, dict[str, Any]]:
    """What :func:`pack` reads from ``src``: the sample count, the samples, the field spec
    (an image folder's; None for a dataset's own) and the metadata to store beside them."""
    if isinstance(src, (str, os.PathLike)) and os.path.isdir(os.fspath(src)):
        n, samples, fields, classes = _folder_samples(os.fspath(src))
        return n, samples, fields, {"classes": classes, "source": os.path.abspath(os.fspath(src))}
    if isinstance(src, str):
        n, samples = _dataset_samples(load_factory(src))
        return n, samples, None, {"source": src}
    n, samples = _dataset_samples(src)
    return n, samples, None, {}


def _pack_lmdb(
    samples: Iterator[Any],
    dst: str,
    fields: list[str] | None,
    extra: dict[str, Any],
    bar: _Progress,
) -> list[str]:
    from stoker.formats._lmdb import LMDBWriter

    with LMDBWriter(dst, fields=fields, extra=extra) as writer:
        for sample in samples:
            writer.write(sample)
            bar.update()
    return [dst]


def _pack_shards(
    samples: Iterator[Any],
    dst: str,
    fields: list[str] | None,
    extra: dict[str, Any],
    bar: _Progress,
    maxcount: int,
    maxsize: float,
) -> list[str]:
    from stoker.formats._tar import ShardWriter

    tmp = _remote.temp_name(dst)
    with _remote.writing(dst):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        _remote.sweep_stale(dst)
        os.makedirs(tmp)
    try:
        with ShardWriter(
            os.path.join(tmp, SHARD_NAME), maxcount, maxsize, fields=fields, extra=extra
        ) as writer:
            for sample in samples:
                writer.write(sample)
                bar.update()
        names = [os.path.basename(s) for s in writer.shards]
        if os.path.lexists(dst):  # overwrite: move the old one aside only now
            old = _remote.temp_name(dst)
            os.replace(dst, old)
            os.replace(tmp, dst)
            _remote.remove(old)
        else:
            os.replace(tmp, dst)
    except BaseException:
        _remote.remove(tmp)
        raise
    return [os.path.join(dst, n) for n in names] + [
        os.path.join(dst, n + INDEX_SUFFIX) for n in names
    ]


def inspect(
    path: str | os.PathLike[str],
    *,
    samples: int = 3,
    storage_options: Mapping[str, Any] | None = None,
) -> str:
    """A text description of an LMDB file or a set of shards: count, keys, fields, sizes.

    Args:
        path: an LMDB file, a shard, a folder of shards, a pattern or a URL.
        samples: how many keys to show.
        storage_options: keyword arguments for the fsspec filesystem of a remote ``path``
            (an endpoint, credentials ...); ignored for a local one.

    >>> import os, tempfile
    >>> with tempfile.TemporaryDirectory() as root:
    ...     path = os.path.join(root, "d.lmdb")
    ...     _ = pack([(b"x", 0), (b"y", 1)], path, progress=False)
    ...     print(inspect(path).replace(root, "ROOT"))
    ROOT/d.lmdb: stoker LMDB file, version 1
      samples: 2   file size: ...
      sample shape: tuple of ['0.bin', '1.cls']
      first keys: 000000000, 000000001
      field            codec      count    mean size        total
      0.bin            bytes          2          1 B          2 B
      1.cls            int            2          1 B          2 B
    """
    if not isinstance(samples, int) or samples < 0:
        raise ValueError(f"samples must be a non-negative integer (keys to show), got {samples!r}.")
    url = os.fspath(path)
    local = None if _remote.is_remote(url) else _remote.local_path(url)
    if local is not None and os.path.isfile(local) and not local.endswith(".tar"):
        return _inspect_lmdb(local, samples)
    if (
        local is not None
        and os.path.isdir(local)
        and os.path.exists(os.path.join(local, "data.mdb"))
    ):
        return _inspect_lmdb(local, samples)
    return _inspect_shards(url, samples, storage_options)


def _field_lines(sizes: dict[str, list[int]], codecs: dict[str, str]) -> list[str]:
    from stoker.formats._codec import default_codec

    lines = [f"  {'field':<16} {'codec':<6} {'count':>9} {'mean size':>12} {'total':>12}"]
    for name in sorted(sizes):
        s = sizes[name]
        codec = codecs.get(name) or default_codec(name)
        mean = _human(sum(s) / len(s)) if s else "-"
        lines.append(f"  {name:<16} {codec:<6} {len(s):>9} {mean:>12} {_human(sum(s)):>12}")
    return lines


def _inspect_lmdb(path: str, samples: int) -> str:
    from stoker.formats._lmdb import LMDBDataset

    ds = LMDBDataset(path)
    sizes = ds.field_sizes()
    meta = ds.meta
    lines = [
        f"{path}: stoker LMDB file, version {meta.get('version')}",
        f"  samples: {len(ds)}   file size: {_human(os.path.getsize(path))}",
        f"  sample shape: {meta.get('kind')} of {meta.get('spec')}",
        f"  first keys: {', '.join(k.decode() for k in ds.keys[:samples].tolist())}",
    ]
    if ds.classes:
        lines.append(f"  classes ({len(ds.classes)}): {', '.join(ds.classes[:10])}")
    return "\n".join(lines + _field_lines(sizes, meta.get("codecs", {})))


def _inspect_shards(url: str, samples: int, storage_options: Mapping[str, Any] | None) -> str:
    from stoker.formats._tar import ShardDataset

    ds = ShardDataset(url, storage_options=storage_options)
    sizes: dict[str, list[int]] = {}
    for ix in ds.indexes:
        field = np.asarray(ix.field)
        for fid, name in enumerate(ix.fields):
            sizes.setdefault(name, []).extend(ix.size[field == fid].tolist())
    total = sum(ix.shard_bytes for ix in ds.indexes)
    counts = [len(ix) for ix in ds.indexes]
    first = ds.indexes[0].keys[:samples].tolist() if ds.indexes else []
    lines = [
        f"{url}: {len(ds.urls)} tar shard(s) (WebDataset layout)",
        f"  samples: {len(ds)}   total size: {_human(total)}   per shard: "
        f"{min(counts)}..{max(counts)} samples",
        f"  sample shape: {ds.meta.get('kind', 'dict')} of {ds.meta.get('spec', ['__dict__'])}",
        f"  first keys: {', '.join(k.decode() for k in first)}",
    ]
    if ds.classes:
        lines.append(f"  classes ({len(ds.classes)}): {', '.join(ds.classes[:10])}")
    return "\n".join(lines + _field_lines(sizes, ds.meta.get("codecs", {})))
