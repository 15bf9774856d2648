"""Tar shards: :class:`ShardWriter` (rolling shards + indexes) and :class:`ShardDataset`
(map-style random access through the indexes). The iterable reader is in ``_stream.py``.

The layout is WebDataset's (members ``KEY.FIELD`` grouped by key), so shards written here
read with WebDataset and the other way round; the index beside each shard is stoker's
(see :mod:`stoker.formats._index`) and is rebuilt when missing.
"""

from __future__ import annotations

import contextlib
import os
import tarfile
import tempfile
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import IO, Any

import numpy as np

from stoker._dataset import Dataset
from stoker.formats import _index, _remote
from stoker.formats._codec import (
    DICT_SPEC,
    Assembler,
    SampleLayout,
    spec_kind,
)
from stoker.formats._index import INDEX_SUFFIX, IndexBuilder, ShardIndex

_BLOCK = 512
_MAX_OPEN = 64


def _tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o444
    info.mtime = 0  # reproducible shards: the same samples give the same bytes
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def check_limits(maxcount: int, maxsize: float) -> None:
    """Check a shard writer's limits: a positive int count and a positive number of bytes.

    Raises:
        ValueError: naming the limit and the value found.
    """
    if not isinstance(maxcount, int) or isinstance(maxcount, bool) or maxcount <= 0:
        raise ValueError(f"maxcount must be a positive integer, got {maxcount!r}.")
    if not isinstance(maxsize, (int, float)) or not maxsize > 0:
        raise ValueError(f"maxsize must be a positive number of bytes, got {maxsize!r}.")


class ShardWriter:
    """Writes samples into tar shards, starting a new shard by count or size.

    Each shard is written under a temporary name and renamed when full (or at ``close``),
    its index first: a shard under its final name is complete. A remote ``pattern`` is
    written locally and uploaded shard by shard. Use from one thread, as a context manager.

    Args:
        pattern: the shard names, with a ``%d``-style slot (``"out/train-%06d.tar"``).
        maxcount: samples per shard at most.
        maxsize: bytes per shard at most (a larger sample gets a shard of its own).
        fields: names for tuple items or the read spec (see :class:`LMDBWriter`).
        codecs: codec per field name.
        extra: JSON-serialisable metadata stored in every index (e.g. ``classes``).
        start_shard: the number of the first shard.
        storage_options: fsspec keyword arguments for a remote ``pattern``.

    Attributes:
        shards: the names of the shards finished so far.

    >>> import os, tempfile
    >>> with tempfile.TemporaryDirectory() as root:
    ...     with ShardWriter(os.path.join(root, "s-%06d.tar"), maxcount=2) as writer:
    ...         for i in range(5):
    ...             _ = writer.write((np.full(2, i), i))
    ...     [os.path.basename(shard) for shard in writer.shards]
    ['s-000000.tar', 's-000001.tar', 's-000002.tar']
    """

    def __init__(
        self,
        pattern: str,
        maxcount: int = 100_000,
        maxsize: float = 3e9,
        *,
        fields: Sequence[str] | None = None,
        codecs: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
        start_shard: int = 0,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        pattern = os.fspath(pattern)
        try:
            pattern % 0
        except TypeError as exc:
            raise ValueError(
                f"pattern must hold one %d-style slot for the shard number, got {pattern!r}; "
                "e.g. 'out/train-%06d.tar'."
            ) from exc
        check_limits(maxcount, maxsize)
        self.pattern = pattern
        self.maxcount = maxcount
        self.maxsize = float(maxsize)
        self.layout = SampleLayout(fields, codecs)
        self.extra = dict(extra or {})
        self.storage_options = _remote.check_storage_options(storage_options)
        self.shards: list[str] = []
        self._next = start_shard
        self._file: IO[bytes] | None = None
        self._tmp: str | None = None
        self._final: str | None = None
        self._builder: IndexBuilder | None = None
        self._pos = 0
        self._count = 0
        self._local_dir: str | None = None
        self.total = 0

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _start(self) -> None:
        final = self.pattern % self._next
        self._next += 1
        if _remote.is_remote(final):
            if self._local_dir is None:
                self._local_dir = tempfile.mkdtemp(prefix="stoker-shards-")
            tmp = os.path.join(self._local_dir, os.path.basename(final))
        else:
            final = os.path.abspath(_remote.local_path(final))
            os.makedirs(os.path.dirname(final), exist_ok=True)
            _remote.sweep_stale(final)
            tmp = _remote.temp_name(final)
        self._final, self._tmp = final, tmp
        with _remote.writing(final):
            self._file = open(tmp, "wb")  # noqa: SIM115 - stays open across write() calls
        self._builder = IndexBuilder(final)
        self._pos = 0
        self._count = 0

    def write(self, sample: object) -> str:
        """Add one sample (a dict of fields, a tuple, or a value); returns its key."""
        key, fields = self.layout.fields_of(sample)
        headers = {name: _tar_header(f"{key}.{name}", len(d)) for name, d in fields.items()}
        need = sum(len(headers[n]) + len(d) + (-len(d) % _BLOCK) for n, d in fields.items())
        need += 2 * _BLOCK  # the end-of-archive blocks
        if self._file is not None and (
            self._count >= self.maxcount or (self._count and self._pos + need > self.maxsize)
        ):
            self._finish()
        if self._file is None:
            self._start()
        assert self._file is not None and self._builder is not None and self._final is not None
        with _remote.writing(self._final):
            for name, data in fields.items():
                header = headers[name]
                pad = -len(data) % _BLOCK
                self._file.write(header)
                self._file.write(data)
                self._file.write(b"\0" * pad)
                offset = self._pos + len(header)
                self._builder.add(key, name, offset, len(data), zlib.crc32(data))
                self._pos = offset + len(data) + pad
        self._count += 1
        self.total += 1
        return key

    def _finish(self) -> None:
        assert self._final is not None
        with _remote.writing(self._final):
            self._finish_shard()

    def _finish_shard(self) -> None:
        assert self._file is not None and self._builder is not None
        assert self._tmp is not None and self._final is not None
        self._file.write(b"\0" * (2 * _BLOCK))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        self._builder.meta = {
            "kind": self.layout.read_kind(),
            "spec": self.layout.spec(),
            "codecs": self.layout.codecs,
            "extra": self.extra,
        }
        index = self._builder.build(self._pos + 2 * _BLOCK)
        if _remote.is_remote(self._final):
            idx_tmp = self._tmp + INDEX_SUFFIX
            _index.save(index, idx_tmp)
            _remote.upload(idx_tmp, self._final + INDEX_SUFFIX, self.storage_options)
            _remote.upload(self._tmp, self._final, self.storage_options)
            _remote.remove(idx_tmp)
            _remote.remove(self._tmp)
        else:
            _index.save(index, self._final + INDEX_SUFFIX)
            try:
                os.replace(self._tmp, self._final)
            except BaseException:
                _remote.remove(self._final + INDEX_SUFFIX)  # no index without its shard
                raise
        self.shards.append(self._final)
        self._tmp = None

    def close(self) -> None:
        """Finish the last shard (an empty writer writes none) and clean up; when that
        fails, the unfinished shard's temporary file is removed too."""
        if self._file is not None:
            try:
                self._finish()
            except BaseException:
                self.abort()
                raise
        if self._local_dir is not None:
            _remote.remove(self._local_dir)
            self._local_dir = None

    def abort(self) -> None:
        """Drop the shard being written; finished shards stay."""
        if self._file is not None:
            with contextlib.suppress(OSError):  # a full disk fails the flush again: moot
                self._file.close()
            self._file = None
        if self._tmp is not None:
            _remote.remove(self._tmp)
            self._tmp = None
        if self._local_dir is not None:
            _remote.remove(self._local_dir)
            self._local_dir = None


class _Handles:
    """Open shard files of one process: a local fd read with ``os.pread`` (safe across
    threads), or an fsspec file behind its own lock. Never crosses a fork or a pickle.

    At most ``_MAX_OPEN`` files stay open; when more are needed, those no thread is
    reading are closed (a use count per file, under one lock, makes that safe).
    """

    def __init__(self, cache_dir: str | None, storage_options: Mapping[str, Any]) -> None:
        self.cache_dir = cache_dir
        self.storage_options = storage_options
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.open: dict[str, _Handle] = {}

    def read(self, url: str, offset: int, size: int) -> bytes:
        """``size`` bytes of shard ``url`` from ``offset`` (fewer if the file ends first)."""
        with self.lock:
            handle = self.open.get(url)
            if handle is None:
                if len(self.open) >= _MAX_OPEN:
                    self._close_idle()
                handle = _Handle(url, self.cache_dir, self.storage_options)
                self.open[url] = handle
            handle.users += 1
        try:
            return handle.read(offset, size)
        finally:
            with self.lock:
                handle.users -= 1

    def _close_idle(self) -> None:
        for url, handle in list(self.open.items()):
            if handle.users == 0:
                handle.close()
                del self.open[url]

    def close(self) -> None:
        """Close every file (only in the process that opened them)."""
        if self.pid == os.getpid():
            with self.lock:
                for handle in self.open.values():
                    handle.close()
        self.open = {}


class _Handle:
    """One open shard: a local fd, or a remote fsspec file with a lock for seek + read."""

    def __init__(self, url: str, cache_dir: str | None, storage_options: Mapping[str, Any]) -> None:
        local = _remote.cached(url, cache_dir, storage_options)
        self.users = 0
        self.fd: int | None = None
        self.file: Any = None
        if local is not None:
            self.fd = os.open(local, os.O_RDONLY)
        else:
            self.file = _remote.open_random(url, storage_options)
        self.lock = threading.Lock()

    def read(self, offset: int, size: int) -> bytes:
        """``size`` bytes from ``offset``."""
        if self.fd is not None:
            return os.pread(self.fd, size, offset)
        with self.lock:
            self.file.seek(offset)
            return bytes(self.file.read(size))

    def close(self) -> None:
        """Close the file."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        elif self.file is not None:
            self.file.close()
            self.file = None


class ShardDataset(Dataset[Any]):
    """A map-style dataset over tar shards, reading members by offset through the indexes.

    Sample ``i`` counts through the shards in the order given, shaped as in
    :class:`LMDBDataset`.

    Args:
        urls: shard paths or URLs: a list, a brace range (``"s-{000000..000009}.tar"``),
            a glob, or a directory of ``*.tar``; a name that exists is never expanded.
        fields: the read spec; default: the writer's, else the whole dict.
        transform: applied to the first entry of each sample.
        target_transform: applied to the second.
        decode: decode image bytes to RGB PIL images (default: with a transform).
        cache_dir: local folder for remote shards (downloaded whole, once); without it,
            members are read by byte ranges.
        verify: check each member's CRC-32 against the index.
        storage_options: fsspec keyword arguments for remote ``urls``, pickled with the
            dataset for ``spawn`` and ``forkserver`` workers.

    Attributes:
        urls: the shards. classes: the class names stored by ``stoker pack``.
        storage_options: the options given (a dict).

    >>> import os, tempfile
    >>> with tempfile.TemporaryDirectory() as root:
    ...     with ShardWriter(os.path.join(root, "s-%06d.tar"), maxcount=2) as writer:
    ...         for i in range(5):
    ...             _ = writer.write((np.full(2, i), i))
    ...     records = ShardDataset(root)
    ...     len(records), records[3][0].tolist(), records[3][1]
    (5, [3, 3], 3)
    """

    def __init__(
        self,
        urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        fields: Sequence[str] | None = None,
        *,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        decode: bool | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        verify: bool = True,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.storage_options = _remote.check_storage_options(storage_options)
        self.urls = _remote.expand(urls, ".tar", self.storage_options)
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.indexes: list[ShardIndex] = [
            _index.load(u, self.cache_dir, self.storage_options) for u in self.urls
        ]
        self._cum = np.cumsum([0, *(len(ix) for ix in self.indexes)]).astype(np.int64)
        meta = next((ix.meta for ix in self.indexes if ix.meta), {})
        self.meta = meta
        spec = list(fields) if fields is not None else list(meta.get("spec", [DICT_SPEC]))
        kind = meta.get("kind", "dict") if fields is None else spec_kind(spec, None)
        self.classes: list[str] = list(meta.get("extra", {}).get("classes", []))
        self.verify = verify
        self._asm = Assembler(
            spec, kind, meta.get("codecs", {}), transform, target_transform, decode
        )
        self._handles: _Handles | None = None

    @property
    def transform(self) -> Callable[[Any], Any] | None:
        """The transform applied to the first entry of each sample."""
        return self._asm.transform

    @transform.setter
    def transform(self, value: Callable[[Any], Any] | None) -> None:
        self._asm.transform = value

    def __len__(self) -> int:
        return int(self._cum[-1])

    def locate(self, index: int) -> tuple[int, int]:
        """The (shard number, position in the shard) of sample ``index``."""
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"index {index} is out of range for {n} samples in the shards.")
        index %= n
        shard = int(np.searchsorted(self._cum, index, side="right")) - 1
        return shard, index - int(self._cum[shard])

    def _files(self) -> _Handles:
        if self._handles is None or self._handles.pid != os.getpid():
            # A fresh set in each process.
            self._handles = _Handles(self.cache_dir, self.storage_options)
        return self._handles

    def _raw(self, index: int) -> tuple[dict[str, bytes], str, str]:
        shard, j = self.locate(index)
        ix = self.indexes[shard]
        key = ix.keys[j].decode()
        names = ix.sample_fields(j)
        wanted = self._asm.needed(names, ix.url, key)
        lo = int(ix.starts[j])
        files = self._files()
        raw = {}
        for name in wanted:
            m = lo + names.index(name)
            data = files.read(ix.url, int(ix.offset[m]), int(ix.size[m]))
            if self.verify or len(data) != int(ix.size[m]):
                _index.verify(ix, m, data, key, name)
            raw[name] = data
        return raw, ix.url, key

    def __getitem__(self, index: int) -> Any:
        raw, file, key = self._raw(int(index))
        return self._asm.build(raw, file, key)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The samples at ``indices``; JPEGs on the fast path decode in parallel threads."""
        return self._asm.build_batch([self._raw(int(i)) for i in indices])

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"] = None  # each process opens its own files
        return state

    def __del__(self) -> None:
        handles = getattr(self, "_handles", None)
        if handles is not None:
            # At interpreter shutdown there may be nothing left to release.
            with contextlib.suppress(Exception):
                handles.close()

    def __repr__(self) -> str:
        return f"ShardDataset({len(self.urls)} shards, {len(self)} samples)"
