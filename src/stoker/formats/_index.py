"""Tar shards in WebDataset layout: the per-shard index, and reading members safely.

A shard is a plain tar whose members ``KEY.FIELD`` are grouped by key. Beside each shard
``NAME.tar`` lies ``NAME.tar.index.json``:

.. code-block:: json

    {"format": "stoker-tar-index", "version": 1, "shard_bytes": 1234, "kind": "tuple",
     "spec": ["jpg;png", "cls"], "codecs": {"jpg": "bytes", "cls": "int"}, "extra": {},
     "keys": ["000000", ...], "fields": ["jpg", "cls"],
     "starts": [0, 2, ...], "field": [0, 1, ...], "offset": [512, ...], "size": [...],
     "crc32": [...], "index_crc32": 1234}

``starts[i]:starts[i+1]`` are sample ``i``'s members, each with its field, data offset,
size and CRC-32; ``index_crc32`` covers the rest. A missing or stale index is rebuilt by
scanning the shard, as is a file there that is no stoker index (empty, not JSON, another
format; with a warning); a damaged stoker index is an error naming both files. Absolute
member names, ``..`` and links are rejected; a truncated shard raises naming the file.
"""

from __future__ import annotations

import collections
import json
import os
import re
import tarfile
import warnings
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from stoker.formats import _remote
from stoker.formats._codec import CorruptRecordError, split_name

INDEX_SUFFIX = ".index.json"
_TAIL_READS = 4
"""How many of a stream's last reads are kept, to re-read where tarfile stopped."""
_CHECKSUM = re.compile(rb',"index_crc32":(\d+)}\s*$')
FORMAT = "stoker-tar-index"
_CLAIM = re.compile(rb'\s*\{\s*"format"\s*:\s*"%s"' % FORMAT.encode())
"""How a stoker index starts (``format`` is written first), even one cut short."""
VERSION = 1


class TruncatedShardError(CorruptRecordError):
    """A shard ends before a member's data does; the message names the file and the key.

    >>> issubclass(TruncatedShardError, CorruptRecordError)
    True
    """


@dataclass
class ShardIndex:
    """Where every member of one shard lies. Arrays, so forked workers share them untouched.

    Attributes:
        url: the shard.
        shard_bytes: the shard's size when indexed.
        keys: sample keys (byte strings).
        fields: the distinct field names; ``field`` holds indices into it.
        starts: per sample, the first member (length: samples + 1).
        field, offset, size, crc32: per member.
        meta: ``kind``, ``spec``, ``codecs`` and ``extra`` as the writer stored them (empty
            for an index rebuilt from a shard made elsewhere).
    """

    url: str
    shard_bytes: int
    keys: np.ndarray[Any, Any]
    fields: list[str]
    starts: np.ndarray[Any, Any]
    field: np.ndarray[Any, Any]
    offset: np.ndarray[Any, Any]
    size: np.ndarray[Any, Any]
    crc32: np.ndarray[Any, Any]
    meta: dict[str, Any]

    def __len__(self) -> int:
        return len(self.keys)

    def sample_fields(self, i: int) -> list[str]:
        """The field names of sample ``i``, in shard order."""
        lo, hi = int(self.starts[i]), int(self.starts[i + 1])
        return [self.fields[int(f)] for f in self.field[lo:hi]]

    def to_json(self) -> bytes:
        """The index file's content."""
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "shard_bytes": self.shard_bytes,
            **self.meta,
            "keys": [k.decode() for k in self.keys.tolist()],
            "fields": self.fields,
            "starts": self.starts.tolist(),
            "field": self.field.tolist(),
            "offset": self.offset.tolist(),
            "size": self.size.tolist(),
            "crc32": self.crc32.tolist(),
        }
        body = json.dumps(doc, separators=(",", ":")).encode()
        return body[:-1] + b',"index_crc32":%d}' % zlib.crc32(body)

    @classmethod
    def from_json(cls, url: str, data: bytes) -> ShardIndex:
        """Parse and check an index file of ``url``.

        Every array is checked against the others and against ``shard_bytes`` (lengths,
        order, ranges), so that a damaged index is an error here, not a huge read, a
        negative offset or an index past an array later.

        Raises:
            CorruptRecordError: when it is not a stoker tar index or is inconsistent; the
                message names the shard and the index file.
        """
        try:
            _check_sum(data)
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                raise ValueError(f"its format is not {FORMAT!r}")
            meta = {k: doc[k] for k in ("kind", "spec", "codecs", "extra") if k in doc}
            index = cls(
                url=url,
                shard_bytes=int(doc["shard_bytes"]),
                keys=np.array([k.encode() for k in doc["keys"]], dtype=bytes).reshape(-1),
                fields=[str(f) for f in doc["fields"]],
                starts=np.asarray(doc["starts"], dtype=np.int64).reshape(-1),
                field=np.asarray(doc["field"], dtype=np.int64).reshape(-1),
                offset=np.asarray(doc["offset"], dtype=np.int64).reshape(-1),
                size=np.asarray(doc["size"], dtype=np.int64).reshape(-1),
                crc32=np.asarray(doc["crc32"], dtype=np.int64).reshape(-1),
                meta=meta,
            )
            index._check()
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
            raise CorruptRecordError(
                f"damaged index {url + INDEX_SUFFIX!r} of shard {url!r}: {exc}. Delete the "
                "index: stoker rebuilds it from the shard."
            ) from exc
        index.field = index.field.astype(np.int32)
        index.crc32 = index.crc32.astype(np.uint32)
        return index

    def _check(self) -> None:
        """Raise ValueError unless the arrays describe members inside ``shard_bytes``."""
        members = len(self.offset)
        starts = self.starts
        if len(starts) != len(self.keys) + 1 or starts[0] != 0 or starts[-1] != members:
            raise ValueError(
                f"{len(self.keys)} keys need {len(self.keys) + 1} sample starts from 0 to "
                f"the {members} members, found {len(starts)}"
            )
        if np.any(np.diff(starts) <= 0):
            raise ValueError("sample starts do not increase")
        if not len(self.field) == len(self.size) == len(self.crc32) == members:
            raise ValueError("the member arrays (field, offset, size, crc32) differ in length")
        if members and (self.field.min() < 0 or self.field.max() >= len(self.fields)):
            raise ValueError(f"a member's field number is not one of the {len(self.fields)}")
        if members and (self.crc32.min() < 0 or self.crc32.max() >= 1 << 32):
            raise ValueError("a CRC-32 is out of range")
        ends = self.offset + self.size
        if (
            members
            and (
                self.offset.min() < 0
                or self.size.min() < 0
                or np.any(np.diff(self.offset) <= 0)
                or np.any(ends < self.offset)  # an overflow of offset + size
                or np.any(ends[:-1] > self.offset[1:])  # members overlap
                or ends.max() > self.shard_bytes
            )
        ):
            raise ValueError(
                f"member offsets and sizes must increase and lie within the shard's "
                f"{self.shard_bytes} bytes"
            )


def _check_sum(data: bytes) -> None:
    """Check the CRC-32 that ends an index file (``,"index_crc32":N}``) against the rest:
    any flipped bit is found, even one that leaves valid JSON (a field name, a size).
    Indexes written before the checksum existed have none and pass.

    >>> _check_sum(b'{"a":1,"index_crc32":%d}' % zlib.crc32(b'{"a":1}'))
    """
    m = _CHECKSUM.search(data)
    if m is not None and zlib.crc32(data[: m.start()] + b"}") != int(m.group(1)):
        raise ValueError("its CRC-32 does not match its content")


class IndexBuilder:
    """Collects members (key, field, offset, size, crc) in shard order into a ShardIndex."""

    def __init__(self, url: str, meta: dict[str, Any] | None = None) -> None:
        self.url = url
        self.meta = meta or {}
        self.keys: list[bytes] = []
        self.fields: dict[str, int] = {}
        self.starts: list[int] = []
        self.members: list[tuple[int, int, int, int]] = []
        self._seen: set[str] = set()

    def add(self, key: str, field: str, offset: int, size: int, crc: int) -> None:
        """Record one member; a new key (or a repeated field) starts a new sample."""
        if not self.keys or self.keys[-1] != key.encode() or field in self._seen:
            self.keys.append(key.encode())
            self.starts.append(len(self.members))
            self._seen = set()
        self._seen.add(field)
        fid = self.fields.setdefault(field, len(self.fields))
        self.members.append((fid, offset, size, crc))

    def build(self, shard_bytes: int) -> ShardIndex:
        """The finished index of a shard of ``shard_bytes`` bytes."""
        cols = np.asarray(self.members, dtype=np.int64).reshape(-1, 4)
        return ShardIndex(
            url=self.url,
            shard_bytes=shard_bytes,
            keys=np.array(self.keys, dtype=bytes).reshape(-1) if self.keys else np.zeros(0, "S1"),
            fields=list(self.fields),
            starts=np.asarray([*self.starts, len(self.members)], dtype=np.int64),
            field=cols[:, 0].astype(np.int32),
            offset=cols[:, 1].copy(),
            size=cols[:, 2].copy(),
            crc32=cols[:, 3].astype(np.uint32),
            meta=self.meta,
        )


def check_member(member: tarfile.TarInfo, where: str) -> tuple[str, str] | None:
    """The (key, field) of a regular-file member; None for a directory; else an error.

    Raises:
        ValueError: for absolute names, ``..``, links, devices and badly named members.
    """
    if member.isdir():
        split_name(member.name.rstrip("/") + "/x.x", where)  # same path checks
        return None
    key, field = split_name(member.name, where)
    if not member.isfile():
        raise ValueError(
            f"{where}: member {member.name!r} is a link or special file; shards hold only "
            "regular files. The archive may be malicious: do not extract it."
        )
    return key, field


class _Tail:
    """A read-only stream that keeps its last few reads, so that where ``tarfile`` stopped
    can be read again: it ends a stream silently at a header that is damaged or missing
    (the archive cut at a member boundary), as it does at the end-of-archive blocks.
    ``tarfile`` reads whole records (``RECORDSIZE``), so the header it stopped at is in
    the last two.
    """

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.pos = 0
        self.kept: collections.deque[bytes] = collections.deque(maxlen=_TAIL_READS)

    def read(self, size: int = -1) -> bytes:
        data = self.f.read(size)
        if data:
            self.pos += len(data)
            self.kept.append(data)
        return data

    def rest_is_end(self, offset: int) -> bool:
        """Whether the stream holds only NUL bytes from ``offset`` on, and some of them
        (the end-of-archive blocks)."""
        kept = b"".join(self.kept)
        start = self.pos - len(kept)
        if offset < start:
            return False
        rest = kept[offset - start :]
        while True:
            if rest.strip(b"\0"):
                return False
            more = self.f.read(tarfile.RECORDSIZE)
            if not more:
                return self.pos > offset or bool(rest)
            self.pos += len(more)
            rest = more


def iter_members(
    f: IO[bytes], where: str, base: int = 0
) -> Iterator[tuple[str, str, int, bytes, int]]:
    """``(key, field, data_offset, data, header_offset)`` of each file member of a tar read
    as a stream; ``f`` positioned at byte ``base`` of the archive (a member's header), which
    the offsets count from.

    Raises:
        TruncatedShardError: when the shard ends inside a member or without its end blocks,
            or a header is damaged (names file and key).
        ValueError: for unsafe member names (see :func:`check_member`).
    """
    last = "(before the first member)"
    tail = _Tail(f)
    try:
        with tarfile.open(fileobj=tail, mode="r|") as tf:  # type: ignore[call-overload]
            for member in tf:
                checked = check_member(member, where)
                if checked is None:
                    continue
                key, field = checked
                last = f"{key}.{field}"
                reader = tf.extractfile(member)
                assert reader is not None
                data = reader.read()
                if len(data) != member.size:
                    raise tarfile.ReadError(f"got {len(data)} of {member.size} bytes")
                yield key, field, base + member.offset_data, data, base + member.offset
            if not tail.rest_is_end(tf.offset):
                raise tarfile.ReadError(
                    f"the header at byte {tf.offset} is damaged, or the archive ends there "
                    "without its end blocks"
                )
    except (tarfile.ReadError, EOFError, zlib.error) as exc:
        raise TruncatedShardError(
            f"truncated or corrupt shard {where!r}: reading stopped after member {last!r} "
            f"({exc}). Re-download or rewrite the shard."
        ) from exc


def scan(url: str, f: IO[bytes], shard_bytes: int) -> ShardIndex:
    """Build the index of the shard ``url`` open as ``f`` by reading it once."""
    builder = IndexBuilder(url)
    for key, field, offset, data, _ in iter_members(f, url):
        if offset + len(data) > shard_bytes:
            raise TruncatedShardError(
                f"truncated shard {url!r}: member {key}.{field} ends past the file's end."
            )
        builder.add(key, field, offset, len(data), zlib.crc32(data))
    return builder.build(shard_bytes)


def load(
    url: str,
    cache_dir: str | os.PathLike[str] | None,
    storage_options: Mapping[str, Any],
    rebuild: bool = True,
) -> ShardIndex:
    """The index of shard ``url``: its index file if present and current, else a scan.

    A rebuilt index of a local shard is written beside it (atomically) when the folder is
    writable; a remote one is kept in memory.

    Raises:
        FileNotFoundError: when the shard does not exist.
    """
    if not _remote.exists(url, storage_options):
        raise FileNotFoundError(
            f"shard {url!r} does not exist; check the path or pattern (ShardWriter and "
            "`stoker pack --format shards` write shards)."
        )
    shard_bytes = _remote.size(url, storage_options)
    idx_url = url + INDEX_SUFFIX
    index = read(url, storage_options)
    if index is not None and index.shard_bytes == shard_bytes:
        return index
    if not rebuild:
        raise FileNotFoundError(f"shard {url!r} has no current index {idx_url!r}.")
    meta = index.meta if index is not None else {}  # a stale index keeps the writer's meta
    with _remote.open_stream(url, cache_dir, storage_options) as f:
        index = scan(url, f, shard_bytes)
    index.meta = meta
    if not _remote.is_remote(url):
        save(index, _remote.local_path(idx_url), missing_ok=True)
    return index


def read(url: str, storage_options: Mapping[str, Any]) -> ShardIndex | None:
    """The index file beside shard ``url``, parsed and checked; None when there is none.

    Raises:
        CorruptRecordError: when the index is damaged (see :meth:`ShardIndex.from_json`).
    """
    idx_url = url + INDEX_SUFFIX
    if not _remote.exists(idx_url, storage_options):
        return None
    data = _remote.read_bytes(idx_url, storage_options)
    foreign = _not_an_index(data)
    if foreign is not None:
        warnings.warn(
            f"{idx_url!r} is not a stoker index of shard {url!r} ({foreign}); the index is "
            "rebuilt from the shard (and saved over it where the folder is writable).",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return ShardIndex.from_json(url, data)


def _not_an_index(data: bytes) -> str | None:
    """Why ``data`` holds no stoker index at all (so nothing is lost rebuilding it), or
    None for what is one, even damaged: a damaged stoker index is an error, as its CRC-32s
    are what the shard's members are checked against.

    >>> _not_an_index(b""), _not_an_index(b"[]"), _not_an_index(b'{"format": "x"}')
    ('it is empty', 'it is JSON of another kind', 'it is JSON of another kind')
    >>> _not_an_index(b'{"format":"stoker-tar-index","ver') is None
    True
    """
    if _CLAIM.match(data) or _CHECKSUM.search(data):
        return None
    if not data.strip():
        return "it is empty"
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return "it is not JSON"
    if isinstance(doc, dict) and doc.get("format") == FORMAT:
        return None
    return "it is JSON of another kind"


def current(url: str, storage_options: Mapping[str, Any]) -> ShardIndex | None:
    """The index beside shard ``url`` when it describes the shard as it is now, else None
    (no index, or a stale one: the shard's size differs)."""
    index = read(url, storage_options)
    if index is None or index.shard_bytes != _remote.size(url, storage_options):
        return None
    return index


def verify(index: ShardIndex, member: int, data: bytes, key: str, field: str) -> None:
    """Check the bytes read for ``member`` of ``index`` against its size and CRC-32; the
    one check both shard readers make.

    Raises:
        TruncatedShardError: when fewer bytes came than the index says (the shard is short).
        CorruptRecordError: when the CRC-32 differs (a damaged byte).
    """
    offset, size = int(index.offset[member]), int(index.size[member])
    if len(data) != size:
        raise TruncatedShardError(
            f"truncated shard {index.url!r}: key {key!r}, field {field!r} needs bytes "
            f"{offset}..{offset + size} but the file ends first. Re-download or rewrite the "
            "shard (and delete its stale index)."
        )
    if zlib.crc32(data) != int(index.crc32[member]):
        raise CorruptRecordError(
            f"corrupt record in {index.url!r}: key {key!r}, field {field!r} does not match the "
            "CRC-32 in its index. Re-download or rewrite the shard."
        )


def save(index: ShardIndex, path: str, missing_ok: bool = False) -> None:
    """Write ``index`` to the local ``path`` through a temporary name."""
    tmp = _remote.temp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(index.to_json())
        os.replace(tmp, path)
    except OSError:
        _remote.remove(tmp)
        if not missing_ok:  # a read-only folder: the index lives in memory only
            raise
    except BaseException:
        _remote.remove(tmp)
        raise
