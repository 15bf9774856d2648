"""LMDB: a map-style dataset over one LMDB file, and the writer that makes it.

Layout (one file, ``subdir=False``): each field of a sample is one entry ``KEY.FIELD``
(``000042.jpg``, ``000042.cls``) holding the field's bytes as its codec stores them
(:mod:`stoker.formats._codec`: raw bytes, ``.npy``, JSON, ASCII int, UTF-8 text; never a
pickle). Three entries describe the file:

- ``__stoker__/meta``: JSON with the format, version, length, the read spec, the codec of
  every field, the field sets, and the writer's ``extra`` (e.g. ``classes``);
- ``__stoker__/keys``: the sample keys in order, a ``.npy`` array of byte strings;
- ``__stoker__/fieldsets``: per sample, which field set it has (``.npy`` int array).

The reader opens the environment read-only (``lock=False``, ``readahead=False``) lazily in
the process that first reads, and again after a fork (it tracks the pid): an LMDB handle
must never cross a fork. Keys and field sets live in NumPy arrays, which forked workers
share without copying.
"""

from __future__ import annotations

import io
import json
import os
import struct
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import numpy as np

from stoker._dataset import Dataset
from stoker.formats import _remote
from stoker.formats._codec import (
    Assembler,
    CorruptRecordError,
    SampleLayout,
    spec_kind,
)

META_KEY = b"__stoker__/meta"
KEYS_KEY = b"__stoker__/keys"
SETS_KEY = b"__stoker__/fieldsets"
FORMAT = "stoker-lmdb"
VERSION = 1
_COMMIT_EVERY = 256
_INITIAL_MAP_SIZE = 1 << 30

# LMDB's meta page (mdb.c of LMDB 0.9; native byte order and word size W): a page header
# (pgno W, pad, flags, lower, upper: 2 bytes each), then MDB_meta: magic, version (4 bytes
# each), address, map size (W each), two MDB_db records (pad 4, flags 2, depth 2, five W;
# the first one's pad is the page size), the last page number used and the txn id (W each).
# Pages 0 and 1 are both meta pages; LMDB uses the one with the larger txn id.
_W = "Q" if struct.calcsize("P") == 8 else "I"
_DB = f"IHH{_W * 5}"
_META_PAGE = struct.Struct(f"={_W}HHHH II{_W}{_W}{_DB}{_DB}{_W}{_W}")
_MAGIC = 0xBEEFC0DE
_DATA_VERSION = 1


def _lmdb() -> Any:
    try:
        import lmdb
    except ImportError as exc:
        raise ModuleNotFoundError(
            "LMDB files need the lmdb package: `pip install 'stoker[lmdb]'`."
        ) from exc
    return lmdb


class LMDBWriter:
    """Writes samples into a new LMDB file, under a temporary name renamed on success.

    Use it as a context manager: leaving the block normally commits, syncs and renames the
    file to ``path`` (replacing an older one); an exception removes the temporary file and
    leaves ``path`` as it was. Call methods from one thread of one process.

    Args:
        path: the LMDB file to create (a local path).
        fields: names for the items of tuple samples, or the read spec (``"jpg;png"``
            alternatives allowed); default: chosen by type.
        codecs: codec per field name, overriding the default by suffix.
        extra: JSON-serialisable metadata stored with the file (e.g. ``{"classes": [...]}``).
        map_size: the initial map size in bytes; it grows when full.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "t.lmdb")
    >>> with LMDBWriter(path) as w:
    ...     key = w.write((b"abc", 1))
    >>> LMDBDataset(path)[0]
    (b'abc', 1)
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fields: Sequence[str] | None = None,
        codecs: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
        map_size: int = _INITIAL_MAP_SIZE,
    ) -> None:
        self.path = os.path.abspath(_remote.local_path(os.fspath(path)))
        if _remote.is_remote(os.fspath(path)):
            raise ValueError(
                f"LMDBWriter writes local files, got {os.fspath(path)!r}; write locally and "
                "upload the finished file (it is one file)."
            )
        if os.path.isdir(self.path):
            raise IsADirectoryError(
                f"{self.path!r} is a directory; LMDBWriter writes one file: pick a file name."
            )
        if not isinstance(map_size, int) or map_size <= 0:
            raise ValueError(
                f"map_size must be a positive number of bytes, got {map_size!r}; it is only "
                "the first size of the map, which grows as needed."
            )
        self.layout = SampleLayout(fields, codecs)
        self.extra = dict(extra or {})
        self._keys: list[bytes] = []
        self._sets: list[int] = []
        self._set_ids: dict[tuple[str, ...], int] = {}
        self._pending: list[tuple[bytes, bytes]] = []
        self._map_size = int(map_size)
        self._env: Any = None
        self._tmp: str | None = None

    def __enter__(self) -> LMDBWriter:
        self.open()
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

    def open(self) -> None:
        """Create the temporary file (called by ``with``); removes stale ones of dead writers."""
        lmdb = _lmdb()
        with _remote.writing(self.path):
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
        _remote.sweep_stale(self.path)
        self._tmp = _remote.temp_name(self.path)
        try:
            self._env = lmdb.open(
                self._tmp, subdir=False, map_size=self._map_size, readahead=False, meminit=False
            )
        except lmdb.Error as exc:
            failed = self._failed(exc, "create")
            self.abort()
            raise failed from exc

    def _failed(self, exc: BaseException, doing: str) -> OSError:
        """An OSError naming the file for an LMDB error (read-only folder, full disk ...)."""
        return OSError(
            f"cannot {doing} the LMDB file {self.path!r} ({exc}); pick a folder that is "
            "writable and has free space."
        )

    def write(self, sample: object) -> str:
        """Add one sample (a dict of fields, a tuple, or a value); returns its key."""
        if self._env is None:
            raise RuntimeError("LMDBWriter is not open: use it as `with LMDBWriter(path) as w:`.")
        key, fields = self.layout.fields_of(sample)
        names = tuple(fields)
        set_id = self._set_ids.setdefault(names, len(self._set_ids))
        self._keys.append(key.encode())
        self._sets.append(set_id)
        self._pending.extend((f"{key}.{n}".encode(), data) for n, data in fields.items())
        if len(self._pending) >= _COMMIT_EVERY:
            self._flush()
        return key

    def _flush(self) -> None:
        lmdb = _lmdb()
        while self._pending:
            try:
                with self._env.begin(write=True) as txn:
                    for k, v in self._pending:
                        if not txn.put(k, v, overwrite=False):
                            raise ValueError(
                                f"duplicate sample key {k.decode()!r} in {self.path!r}: "
                                "every sample needs its own __key__."
                            )
                self._pending = []
            except lmdb.MapFullError:
                self._map_size *= 2  # the transaction was aborted: grow and retry it
                self._env.set_mapsize(self._map_size)
            except lmdb.Error as exc:
                raise self._failed(exc, "write") from exc

    def close(self) -> None:
        """Store the metadata, sync, and rename the file to its final name."""
        if self._env is None or self._tmp is None:
            return
        spec = self.layout.spec()
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "length": len(self._keys),
            "kind": self.layout.read_kind(),
            "spec": spec,
            "codecs": self.layout.codecs,
            "fieldsets": [list(s) for s in self._set_ids],
            "extra": self.extra,
        }
        keys = np.array(self._keys, dtype=bytes) if self._keys else np.zeros(0, dtype="S1")
        self._pending += [
            (KEYS_KEY, _npy(keys)),
            (SETS_KEY, _npy(np.asarray(self._sets, dtype=np.int32))),
            (META_KEY, json.dumps(meta).encode()),
        ]
        try:
            self._flush()
            try:
                self._env.sync(True)
            except _lmdb().Error as exc:
                raise self._failed(exc, "sync") from exc
            self._env.close()
            self._env = None
            os.replace(self._tmp, self.path)
        except BaseException:
            self.abort()  # a close that fails leaves no temporary or lock file behind
            raise
        _remote.remove(self._tmp + "-lock")
        self._tmp = None

    def abort(self) -> None:
        """Drop everything written: remove the temporary file; ``path`` is untouched."""
        if self._env is not None:
            self._env.close()
            self._env = None
        if self._tmp is not None:
            _remote.remove(self._tmp)
            _remote.remove(self._tmp + "-lock")
            self._tmp = None

    def __len__(self) -> int:
        return len(self._keys)


def check_file(path: str, subdir: bool) -> None:
    """Check an LMDB file against its meta pages before it is mapped.

    LMDB maps the whole file and trusts it: a file cut short makes a read touch a page past
    its end, which kills the process with SIGBUS instead of raising. The newer of the two
    meta pages says which page is the last one used; the file must reach it.

    Raises:
        ValueError: when the file is not an LMDB file (empty, text, random bytes).
        CorruptRecordError: when it is shorter than its meta pages say (truncated).
    """
    file = os.path.join(path, "data.mdb") if subdir else path
    with open(file, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        first = f.read(_META_PAGE.size)
        meta = _META_PAGE.unpack(first) if len(first) == _META_PAGE.size else None
        if meta is None or meta[5] != _MAGIC or meta[6] != _DATA_VERSION:
            raise ValueError(
                f"{file!r} is not an LMDB file (of data version {_DATA_VERSION}): its "
                f"{size} bytes do not start with an LMDB meta page; write it with LMDBWriter "
                "or `stoker pack SRC DST --format lmdb`."
            )
        psize = meta[9]
        if psize < 512 or psize > 1 << 16 or psize & (psize - 1):
            raise CorruptRecordError(
                f"corrupt LMDB file {file!r}: its meta page gives a page size of {psize}. "
                "Copy the file again or rewrite it."
            )
        f.seek(psize)
        second = f.read(_META_PAGE.size)
    metas = [meta]
    if len(second) == _META_PAGE.size:
        metas.append(_META_PAGE.unpack(second))
    newest = max((m for m in metas if m[5] == _MAGIC), key=lambda m: m[26])
    needed = max(2, newest[25] + 1) * psize
    if size < needed or newest[8] < needed:
        raise CorruptRecordError(
            f"truncated LMDB file {file!r}: its meta page says it holds {needed} bytes "
            f"({needed // psize} pages of {psize}) in a map of {newest[8]} bytes, but it has "
            f"{size}. It was cut short (an interrupted copy or download, a full disk): copy it "
            "again or rewrite it; reading it as it is would crash the process (SIGBUS)."
        )


_ENVS: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
_ENV_PIDS: dict[str, int] = {}
_ENV_LOCK = threading.Lock()


def shared_env(path: str, subdir: bool) -> Any:
    """This process's read-only environment of ``path``, shared by every dataset on it.

    LMDB allows one environment per file per process (py-lmdb refuses a second open), so
    datasets on the same file share one; it closes when the last of them lets it go. An
    environment inherited through a fork is never used: the child closes its copy (for a
    read-only environment without locks this only unmaps the child's own pages; the
    parent's stays valid) and opens its own.
    """
    key = os.path.realpath(path)
    with _ENV_LOCK:
        env = _ENVS.get(key)
        if env is not None and _ENV_PIDS.get(key) != os.getpid():
            env.close()
            env = None
        if env is None:
            check_file(path, subdir)
            env = _open_readonly(path, subdir)
            _ENVS[key] = env
            _ENV_PIDS[key] = os.getpid()
        return env


def _open_readonly(path: str, subdir: bool) -> Any:
    lmdb = _lmdb()
    try:
        return lmdb.open(
            path,
            subdir=subdir,
            readonly=True,
            lock=False,
            readahead=False,
            meminit=False,
            max_readers=2048,
        )
    except lmdb.Error as exc:
        raise ValueError(
            f"{path!r} cannot be opened as an LMDB file ({exc}); write it with LMDBWriter or "
            "`stoker pack SRC DST --format lmdb`."
        ) from exc


def _npy(arr: np.ndarray[Any, Any]) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _local_file(
    path: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str] | None,
    storage_options: Mapping[str, Any] | None,
) -> str:
    """The local LMDB file (or folder) for ``path``: a remote one downloaded to ``cache_dir``.

    Raises:
        FileNotFoundError: the file is missing, or is a folder without ``data.mdb``.
    """
    url = os.fspath(path)
    if _remote.is_remote(url) and cache_dir is None:
        import tempfile

        cache_dir = os.path.join(tempfile.gettempdir(), "stoker-cache")
    local = _remote.cached(url, cache_dir, _remote.check_storage_options(storage_options))
    assert local is not None
    if not os.path.exists(local):
        raise FileNotFoundError(
            f"LMDB file {local!r} does not exist; create it with LMDBWriter or "
            "`stoker pack SRC DST --format lmdb`."
        )
    if os.path.isdir(local) and not os.path.isfile(os.path.join(local, "data.mdb")):
        raise FileNotFoundError(
            f"{local!r} is a folder without an LMDB data.mdb; pass the LMDB file itself "
            "(or a folder LMDB wrote with subdir=True)."
        )
    return local


class LMDBDataset(Dataset[Any]):
    """A map-style dataset over an LMDB file written by :class:`LMDBWriter` or ``stoker pack``.

    Sample ``i`` holds the fields the spec names, e.g. ``(image_bytes, class_index)``; with a
    ``transform`` the image is decoded first (``__getitems__`` decodes a batch in parallel).

    Args:
        path: the LMDB file (or directory); a remote URL is downloaded to ``cache_dir``.
        fields: the read spec (``["jpg;png", "cls"]``, ``["__dict__"]``); default: the writer's.
        transform: applied to the first entry of each sample.
        target_transform: applied to the second entry.
        decode: decode image bytes to RGB PIL images (default: with a transform).
        cache_dir: local folder for remote files (default: a ``stoker`` temp folder).
        storage_options: fsspec keyword arguments for a remote ``path``.

    Attributes:
        keys: the sample keys (a NumPy array of byte strings).
        classes: the class names stored by ``stoker pack`` (empty otherwise).
        meta: the stored metadata.

    Raises:
        FileNotFoundError: when the file is missing.
        ValueError: when it is not a stoker LMDB file.

    >>> import os, tempfile
    >>> with tempfile.TemporaryDirectory() as root:
    ...     path = os.path.join(root, "data.lmdb")
    ...     with LMDBWriter(path, fields=["txt", "cls"]) as writer:
    ...         for i in range(3):
    ...             _ = writer.write((f"sample {i}", i))
    ...     records = LMDBDataset(path)
    ...     len(records), records[2]
    (3, ('sample 2', 2))
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        fields: Sequence[str] | None = None,
        *,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        decode: bool | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.path = _local_file(path, cache_dir, storage_options)
        self._subdir = os.path.isdir(self.path)
        self._env: Any = None
        self._pid = -1
        meta, self.keys, self._sets = self._read_meta()
        self.meta: dict[str, Any] = meta
        self._fieldsets = [tuple(s) for s in self.meta["fieldsets"]]
        spec = list(fields) if fields is not None else list(self.meta["spec"])
        kind = self.meta.get("kind") if fields is None else spec_kind(spec, None)
        self.classes: list[str] = list(self.meta.get("extra", {}).get("classes", []))
        self._asm = Assembler(spec, kind, self.meta["codecs"], transform, target_transform, decode)

    def _read_meta(self) -> tuple[Any, np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """The writer's metadata (parsed JSON), sample keys and field sets, checked.

        The handle is closed after, so that no forked worker inherits it.

        Raises:
            ValueError: the file holds no stoker metadata, or of another version.
            CorruptRecordError: the metadata cannot be read or parsed.
        """
        local = self.path
        try:
            with self._open_env().begin(buffers=False) as txn:
                raw_meta = txn.get(META_KEY)
                raw_keys = txn.get(KEYS_KEY)
                raw_sets = txn.get(SETS_KEY)
        except _lmdb().Error as exc:
            raise self._corrupt(exc, "__stoker__/meta") from exc
        self._close_env()  # never keep a handle that a forked worker would inherit
        if raw_meta is None or raw_keys is None or raw_sets is None:
            raise ValueError(
                f"{local!r} is an LMDB file without stoker's metadata (__stoker__/meta); "
                "write it with LMDBWriter or `stoker pack`."
            )
        try:
            meta = json.loads(raw_meta)
            keys: np.ndarray[Any, Any] = np.load(io.BytesIO(raw_keys), allow_pickle=False)
            sets: np.ndarray[Any, Any] = np.load(io.BytesIO(raw_sets), allow_pickle=False)
        except ValueError as exc:
            raise CorruptRecordError(
                f"corrupt metadata in {local!r} (__stoker__/*): {exc}. Rewrite the file."
            ) from exc
        if meta.get("format") != FORMAT or len(keys) != meta.get("length"):
            raise ValueError(
                f"{local!r} does not hold stoker LMDB metadata of version {VERSION} "
                f"(found format {meta.get('format')!r}); rewrite it with LMDBWriter."
            )
        return meta, keys, sets

    @property
    def transform(self) -> Callable[[Any], Any] | None:
        """The transform applied to the first entry of each sample."""
        return self._asm.transform

    @transform.setter
    def transform(self, value: Callable[[Any], Any] | None) -> None:
        self._asm.transform = value

    def _open_env(self) -> Any:
        if self._env is None or self._pid != os.getpid():
            self._env = shared_env(self.path, self._subdir)
            self._pid = os.getpid()
        return self._env

    def _close_env(self) -> None:
        self._env = None  # the environment closes when its last dataset drops it
        self._pid = -1

    def field_sizes(self) -> dict[str, list[int]]:
        """Each field's stored bytes, sample by sample (``stoker inspect``)."""
        sizes: dict[str, list[int]] = {}
        with self._open_env().begin(buffers=True) as txn:
            for i, key in enumerate(self.keys.tolist()):
                for name in self._fieldsets[int(self._sets[i])]:
                    value = txn.get(f"{key.decode()}.{name}".encode())
                    sizes.setdefault(name, []).append(0 if value is None else len(value))
        self._close_env()
        return sizes

    def __len__(self) -> int:
        return len(self.keys)

    def _raw(self, txn: Any, index: int) -> tuple[dict[str, bytes], str, str]:
        n = len(self.keys)
        if not -n <= index < n:
            raise IndexError(f"index {index} is out of range for an LMDB dataset of {n} samples.")
        key = self.keys[index].decode()
        names = self._asm.needed(self._fieldsets[int(self._sets[index])], self.path, key)
        raw = {}
        for name in names:
            value = txn.get(f"{key}.{name}".encode())
            if value is None:
                raise CorruptRecordError(
                    f"corrupt LMDB file {self.path!r}: key {key!r} has no entry "
                    f"{key}.{name} although its metadata lists it. Rewrite the file."
                )
            raw[name] = value
        return raw, self.path, key

    def _corrupt(self, exc: BaseException, where: str) -> CorruptRecordError:
        return CorruptRecordError(
            f"corrupt LMDB file {self.path!r}: reading {where} failed ({exc}). Copy the file "
            "again or rewrite it."
        )

    def _read(self, indices: Sequence[int]) -> list[tuple[dict[str, bytes], str, str]]:
        """The raw fields of ``indices``, read in one transaction."""
        try:
            with self._open_env().begin(buffers=False) as txn:
                return [self._raw(txn, int(i)) for i in indices]
        except _lmdb().Error as exc:  # a damaged page: LMDB reports it, stoker names the file
            raise self._corrupt(exc, f"samples {list(indices)[:8]}") from exc

    def __getitem__(self, index: int) -> Any:
        return self._asm.build(*self._read([index])[0])

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The samples at ``indices``, read in one transaction, JPEGs decoded in parallel."""
        return self._asm.build_batch(self._read(indices))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_env"] = None  # each process opens its own handle
        state["_pid"] = -1
        return state

    def __repr__(self) -> str:
        return f"LMDBDataset({self.path!r}, {len(self)} samples, fields={self._asm.spec})"
