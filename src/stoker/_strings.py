"""StringArray: an immutable sequence of str or bytes kept in a few NumPy buffers.

A Python list of millions of file names holds millions of refcounted objects; forked
workers that merely read them write those counts, so every page is copied into every
worker (PyTorch issue 13246). A :class:`StringArray` keeps the characters in one NumPy
byte buffer and the boundaries in one offsets array, so the pages stay shared; items are
decoded on access.

File names repeat most of themselves: ``/data/train/n01440764/n01440764_10026.JPEG``
shares its directory, its name's start and its extension with its whole class. Where that
saves a quarter of the memory, a StringArray keeps a small table of *frames* (directory
plus common name prefix, and extension) and per item only its frame number and the bytes
between; an item is rebuilt in O(1). Offsets are uint32 when the bytes fit in 4 GiB.
"""

from __future__ import annotations

import itertools
import operator
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, SupportsIndex, overload

import numpy as np

_CHUNK = 1 << 16  # items per step when building: bounds the temporary arrays to a few MB
_SLASH, _DOT = ord("/"), ord(".")
_Array = np.ndarray[Any, Any]
# (frame number per item, text of the frames' prefixes and suffixes, their piece offsets)
_Frames = tuple[_Array, _Array, _Array]


class StringArray(Sequence[Any]):
    """An immutable, picklable sequence of ``str`` (or of ``bytes``) held in NumPy buffers.

    Args:
        items: the strings, all ``str`` or all ``bytes`` (a NumPy array of strings works).

    Raises:
        TypeError: for items that are not all ``str`` or all ``bytes``.

    >>> names = StringArray(["cat.jpg", "dög.png", ""])
    >>> len(names), names[1], names[-1], list(names[:2])
    (3, 'dög.png', '', ['cat.jpg', 'dög.png'])
    >>> StringArray([b"a", b"bc"])[1]
    b'bc'
    >>> import pickle
    >>> pickle.loads(pickle.dumps(names)) == names
    True
    """

    __slots__ = ("_data", "_frames", "_is_bytes", "_offsets", "_pieces", "_views")

    def __init__(self, items: Iterable[str] | Iterable[bytes] = ()) -> None:
        values: Iterable[Any] = items.tolist() if isinstance(items, np.ndarray) else items
        full, offsets, is_bytes = _encode(values)
        frames = _framed(full, offsets)
        if frames is not None:
            data, offsets, ids, text, bounds = frames
            self._set(data, offsets, is_bytes, (ids, text, bounds))
        else:
            self._set(full[: int(offsets[-1])], _narrow(offsets), is_bytes, None)
        del full, offsets, frames
        if len(self) >= _CHUNK:
            _release_freed_heap()

    def _set(
        self,
        data: _Array,
        offsets: _Array,
        is_bytes: bool,
        frames: _Frames | None,
        pieces: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        self._data = data
        self._offsets = offsets
        self._is_bytes = is_bytes
        self._frames = frames
        # Each frame's prefix and suffix as bytes, made on first use in each process: one
        # pair per frame (there are at most one per 32 items), not per item.
        self._pieces = pieces
        # memoryviews (``.data``): indexing one gives a Python int at once, without a NumPy scalar.
        ids = None if frames is None else frames[0].data
        self._views = (data.data, offsets.data, ids)

    @classmethod
    def _from_parts(
        cls, data: _Array, offsets: _Array, is_bytes: bool, frames: _Frames | None = None
    ) -> StringArray:
        out = cls.__new__(cls)
        out._set(data, offsets, is_bytes, frames)
        return out

    def _frame_pieces(self) -> list[tuple[bytes, bytes]]:
        """Each frame's (prefix, suffix) bytes; made once (empty without frames)."""
        if self._pieces is None:
            text, bounds = (b"", [0]) if self._frames is None else self._frames[1:]
            raw, ends = bytes(text), np.asarray(bounds).tolist()
            self._pieces = [
                (raw[ends[f] : ends[f + 1]], raw[ends[f + 1] : ends[f + 2]])
                for f in range(0, len(ends) - 1, 2)
            ]
        return self._pieces

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, i: SupportsIndex) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> StringArray: ...
    def __getitem__(self, i: SupportsIndex | slice) -> Any:
        if type(i) is not int:
            if isinstance(i, slice):
                return self._slice(i)
            i = operator.index(i)
        data, offs, ids = self._views
        n = len(offs) - 1
        if not -n <= i < n:
            raise IndexError(f"StringArray index {i} out of range for length {n}.")
        if i < 0:
            i += n
        piece = data[offs[i] : offs[i + 1]]
        if ids is not None:
            head, tail = (self._pieces or self._frame_pieces())[ids[i]]
            raw = b"".join((head, piece, tail))
            return raw if self._is_bytes else raw.decode("utf-8", "surrogatepass")
        return piece.tobytes() if self._is_bytes else str(piece, "utf-8", "surrogatepass")

    def _slice(self, s: slice) -> StringArray:
        """The items of ``s``: a view of the same buffers when the step is 1."""
        start, stop, step = s.indices(len(self))
        if step != 1:
            return StringArray(self[j] for j in range(start, stop, step))
        stop = max(start, stop)
        frames = self._frames
        if frames is not None:
            frames = (frames[0][start:stop], frames[1], frames[2])
        out = StringArray.__new__(StringArray)
        out._set(self._data, self._offsets[start : stop + 1], self._is_bytes, frames, self._pieces)
        return out

    def __iter__(self) -> Iterator[Any]:
        pieces = self._frame_pieces()
        data, offs, ids = self._views
        for k in range(0, len(self), _CHUNK):
            ends = offs[k : k + _CHUNK + 1].tolist()
            if ids is None:
                for a, b in itertools.pairwise(ends):
                    yield self._decode(data[a:b])
                continue
            for f, a, b in zip(ids[k : k + _CHUNK].tolist(), ends, ends[1:], strict=False):
                head, tail = pieces[f]
                yield self._decode(b"".join((head, data[a:b], tail)))

    def _decode(self, raw: bytes | memoryview) -> Any:
        """``raw`` as an item: bytes, or str decoded from UTF-8."""
        return bytes(raw) if self._is_bytes else str(raw, "utf-8", "surrogatepass")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray):
            if self._is_bytes != other._is_bytes:
                return False
        elif not isinstance(other, (list, tuple)):
            return NotImplemented
        return len(self) == len(other) and all(map(operator.eq, self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = ", ".join(repr(x) for x in self[:3])
        more = ", ..." if len(self) > 3 else ""
        return f"StringArray([{head}{more}], len={len(self)})"

    def __reduce__(self) -> tuple[Any, ...]:
        offsets = self._offsets
        a, b = int(offsets[0]), int(offsets[-1])
        return (
            StringArray._from_parts,
            (self._data[a:b], offsets - offsets[0], self._is_bytes, self._frames),
        )

    @property
    def nbytes(self) -> int:
        """Bytes held by the NumPy buffers (all of them, for a slice that shares them)."""
        arrays = (self._data, self._offsets, *(self._frames or ()))
        return sum(int(a.nbytes) for a in arrays)


def _encode(values: Iterable[Any]) -> tuple[_Array, _Array, bool]:
    """All items as UTF-8 (or raw) bytes end to end (then 8 zero bytes), their int64
    offsets, and whether they are bytes.

    Items go in chunks, joined by C loops: building from a generator never holds all the
    items as Python objects at once (their freed pages would stay in the parent's heap).
    """
    it = iter(values)
    blobs: list[bytes] = []
    lengths: list[_Array] = []
    kind: type | None = None
    count = 0
    while True:
        part = list(itertools.islice(it, _CHUNK))
        if not part:
            break
        if kind is None:
            kind = bytes if isinstance(part[0], bytes) else str
        blob = _join(part, kind, count)
        sizes = np.fromiter(map(len, part), np.int64, len(part))
        if len(blob) != int(sizes.sum()):  # not ASCII: measure each item's UTF-8
            encoded = (len(s.encode("utf-8", "surrogatepass")) for s in part)
            sizes = np.fromiter(encoded, np.int64, len(part))
        blobs.append(blob)
        lengths.append(sizes)
        count += len(part)
    offsets = np.zeros(count + 1, np.int64)
    if lengths:
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
    data = np.zeros(int(offsets[-1]) + 8, np.uint8)  # padding: see _words
    pos = 0
    for blob in blobs:
        data[pos : pos + len(blob)] = np.frombuffer(blob, np.uint8)
        pos += len(blob)
    return data, offsets, kind is bytes


def _join(part: list[Any], kind: type, first: int) -> bytes:
    """The items of ``part`` encoded end to end; TypeError names any item not of ``kind``.

    >>> _join(["a", "é"], str, 0)
    b'a\\xc3\\xa9'
    """
    try:
        if kind is str:
            return "".join(part).encode("utf-8", "surrogatepass")
        if all(isinstance(v, bytes) for v in part):
            return b"".join(part)
    except TypeError:
        pass
    i, v = next((i, v) for i, v in enumerate(part) if not isinstance(v, kind))
    raise TypeError(
        f"StringArray items must be all str or all bytes; item 0 is {kind.__name__} but "
        f"item {first + i} is {type(v).__name__} ({v!r:.40})."
    )


def _release_freed_heap() -> None:
    """Returns the freed pages of the C heap to the OS (glibc only; elsewhere a no-op).

    Building churns through temporary arrays; glibc keeps the pages it freed, and workers
    forked afterwards would count them as memory shared with the parent.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return
    trim(0)


def _narrow(offsets: _Array) -> _Array:
    """``offsets`` (int64, ascending) as uint32 when they fit: half the memory.

    >>> _narrow(np.array([0, 3])).dtype, _narrow(np.array([0, 2**32])).dtype
    (dtype('uint32'), dtype('int64'))
    """
    return offsets.astype(_offset_dtype(int(offsets[-1])))


def _offset_dtype(total: int) -> type[np.unsignedinteger[Any]] | type[np.signedinteger[Any]]:
    """The dtype of offsets up to ``total``."""
    return np.uint32 if total < 2**32 else np.int64


def _narrow_ids(ids: _Array, count: int) -> _Array:
    """Frame numbers in the smallest unsigned dtype that holds ``count`` frames."""
    for dtype in (np.uint8, np.uint16):
        if count <= np.iinfo(dtype).max + 1:
            return ids.astype(dtype)
    return ids.astype(np.uint32)


def _spans(lo: _Array, hi: _Array) -> _Array:
    """The positions inside the spans ``[lo, hi)``, end to end.

    >>> _spans(np.array([5, 9]), np.array([7, 10])).tolist()
    [5, 6, 9]
    """
    width = hi - lo
    starts = np.zeros(len(width) + 1, np.int64)
    np.cumsum(width, out=starts[1:])
    owner = np.repeat(np.arange(len(width)), width)
    out: _Array = np.arange(int(starts[-1])) + (lo - starts[:-1])[owner]
    return out


def _split(data: _Array, lo: _Array, hi: _Array) -> tuple[_Array, _Array]:
    """Where each item's file name starts (after its last '/') and its extension starts.

    The extension begins at the name's last '.', or is empty (``hi``) when it has none.

    >>> data = np.frombuffer(b"a/b.jpgcde.x/y", np.uint8)
    >>> [c.tolist() for c in _split(data, np.array([0, 7]), np.array([7, 14]))]
    [[2, 13], [3, 14]]
    """
    base = int(lo[0])
    part = data[base : int(hi[-1])]
    cut = _last_before(np.flatnonzero(part == _SLASH) + base, hi)
    cut = np.where(cut >= lo, cut + 1, lo)
    dot = _last_before(np.flatnonzero(part == _DOT) + base, hi)
    return cut, np.where(dot >= cut, dot, hi)


def _last_before(positions: _Array, ends: _Array) -> _Array:
    """Per end, the last of the sorted ``positions`` before it, or -1.

    >>> _last_before(np.array([1, 4, 6]), np.array([1, 5, 9])).tolist()
    [-1, 4, 6]
    """
    at = np.searchsorted(positions, ends) - 1
    return np.where(at >= 0, np.append(positions, -1)[at], -1)


_MASKS = np.array([(1 << (8 * r)) - 1 for r in range(9)], np.uint64)  # the low r bytes


def _words(full: _Array) -> _Array:
    """A view of ``full`` as the little-endian uint64 word starting at every byte.

    ``full`` ends in 8 bytes of padding, so every word that starts in the data exists.

    >>> hex(int(_words(np.frombuffer(b"abcdefghi" + bytes(8), np.uint8))[1]))
    '0x6968676665646362'
    """
    return np.ndarray((len(full) - 7,), "<u8", buffer=full, strides=(1,))


def _word_rows(words: _Array, start: _Array, width: _Array, k: int = 0) -> _Array:
    """Each span ``[start, start + width)`` as a row of uint64 words, zero past its width.

    >>> w = _words(np.frombuffer(b"abcdefghij" + bytes(8), np.uint8))
    >>> [[hex(int(x)) for x in row] for row in _word_rows(w, np.array([0, 8]), np.array([9, 1]))]
    [['0x6867666564636261', '0x69'], ['0x69', '0x0']]
    """
    k = k or _word_count(width)
    out: _Array = words[_word_at(words, start, k)] & _mask(width, k)
    return out


def _word_at(words: _Array, start: _Array, k: int) -> _Array:
    """Where the ``k`` words from each ``start`` begin (clipped to the last word)."""
    at = start[:, None] + 8 * np.arange(k)
    if len(start) and int(start.max()) + 8 * (k - 1) >= len(words):
        np.minimum(at, len(words) - 1, out=at)
    return at


def _word_count(width: _Array) -> int:
    """How many words hold the longest span of ``width`` (at least one)."""
    return max(1, -(-int(width.max(initial=0)) // 8))


def _mask(width: _Array, k: int) -> _Array:
    """Per span, masks keeping the first ``width`` bytes of its ``k`` words."""
    out: _Array = _MASKS[np.clip(width[:, None] - 8 * np.arange(k), 0, 8)]
    return out


def _append_rows(table: _Array, rows: _Array) -> _Array:
    """``rows`` under ``table``, both widened with zero columns to the wider of the two."""
    k = max(table.shape[1], rows.shape[1])
    return np.concatenate((_widen(table, k), _widen(rows, k)))


def _widen(table: _Array, k: int) -> _Array:
    """``table`` with zero columns added up to ``k`` columns."""
    if table.shape[1] >= k:
        return table
    return np.pad(table, ((0, 0), (0, k - table.shape[1])))


def _mix(j: _Array) -> _Array:
    """A fixed pseudo-random odd uint64 per integer in ``j`` (SplitMix64's finaliser)."""
    z = j.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    out: _Array = z ^ (z >> np.uint64(31)) | np.uint64(1)
    return out


def _digest(rows: _Array, salt: int) -> _Array:
    """A hash of each row of uint64 words, the same whatever zero words pad it on the right.

    >>> a, b = _digest(np.array([[5, 0, 0], [5, 1, 0]], np.uint64), 0).tolist()
    >>> a == int(_digest(np.array([[5]], np.uint64), 0)[0]) != b
    True
    """
    weights = _mix(np.arange(salt, salt + rows.shape[1]))
    out: _Array = (rows * weights).sum(1, dtype=np.uint64)  # wraps mod 2**64
    return out


def _shared_prefix(a: _Array, b: _Array, width: _Array) -> _Array:
    """How many leading bytes, up to ``width``, agree between rows of words ``a`` and ``b``.

    >>> w = _words(np.frombuffer(b"abcdefghijabcdefghiX" + bytes(8), np.uint8))
    >>> rows = _word_rows(w, np.array([0, 10]), np.array([10, 10]))
    >>> _shared_prefix(rows[[0, 0]], rows[[1, 1]], np.array([10, 3])).tolist()
    [9, 3]
    """
    diff = (a ^ b) & _mask(width, a.shape[1])
    nonzero = diff != 0
    word = nonzero.argmax(1)
    x = diff[np.arange(len(diff)), word]
    lowest = x & (~x + np.uint64(1))  # the lowest set bit: its byte is the first mismatch
    byte = np.log2(np.maximum(lowest, 1).astype(np.float64)).astype(np.int64) // 8
    out: _Array = np.where(nonzero.any(1), 8 * word + byte, width)
    return out


def _framed(full: _Array, offsets: _Array) -> tuple[_Array, _Array, _Array, _Array, _Array] | None:
    """The compact layout of the items (see the module docstring), or None when it saves
    less than a quarter of the memory or finds more frames than one per 32 items.

    Args:
        full: the items' bytes end to end, then 8 bytes of padding.
        offsets: the items' int64 offsets.

    Returns:
        The bytes between frame prefix and suffix, their offsets, each item's frame, the
        frames' text (prefix, suffix, prefix, ...) and its piece offsets.
    """
    n = len(offsets) - 1
    if n < 64:
        return None
    data, words = full[: int(offsets[-1])], _words(full)
    frames = _FrameFinder(words, limit=max(1024, n // 32))
    ids = np.empty(n, np.int64)
    cuts = np.empty(n, np.int64)
    dots = np.empty(n, np.int64)
    for k in range(0, n, _CHUNK):
        lo, hi = offsets[k : k + _CHUNK + 1][:-1], offsets[k + 1 : k + _CHUNK + 1]
        cut, dot = _split(data, lo, hi)
        cuts[k : k + len(lo)], dots[k : k + len(lo)] = cut, dot
        widths = np.stack((cut - lo, hi - dot), 1)
        dirs, exts = _word_rows(words, lo, widths[:, 0]), _word_rows(words, dot, widths[:, 1])
        digest = (
            _digest(dirs, 0) + _digest(exts, 1 << 20) + _digest(widths.astype(np.uint64), 1 << 21)
        )
        f = frames.assign(digest, np.stack((lo, cut, dot, hi), 1), dirs, exts)
        if f is None or not frames.matches(f, widths, dirs, exts):
            return None
        ids[k : k + len(lo)] = f
        frames.shorten(f, cut, dot)
    return _pack(data, offsets, ids, cuts, dots, frames.refs, frames.common)


class _FrameFinder:
    """The frames :func:`_framed` has found so far, looked up by the hash of their keys.

    A frame is a directory, an extension and the name prefix its items share; its first
    item stands for it in the exact checks, because hashes may collide.
    """

    def __init__(self, words: _Array, limit: int) -> None:
        self.words = words
        self.limit = limit
        self.refs = np.empty((0, 4), np.int64)  # per frame, its first item's (start, cut, dot, end)
        self.common = np.empty(0, np.int64)  # per frame, how many name bytes all its items share
        self.hashes = np.empty(0, np.uint64)  # the frames' hashes, sorted
        self.hashes_frame = np.empty(0, np.int64)  # the frame of each
        # the words of each frame's directory, extension and first name, for the checks
        self.dirs, self.exts, self.names = (np.empty((0, 1), np.uint64) for _ in range(3))

    def assign(self, digest: _Array, rows: _Array, dirs: _Array, exts: _Array) -> _Array | None:
        """Each item's frame: known ones by binary search in the sorted hashes, then new ones
        numbered on; None once there are more frames than ``limit``.

        ``rows`` holds each item's (start, cut, dot, end); ``dirs`` and ``exts`` the words of
        its directory and extension.
        """
        f = np.full(len(digest), -1, np.int64)
        if len(self.hashes):
            at = np.minimum(np.searchsorted(self.hashes, digest), len(self.hashes) - 1)
            f = np.where(self.hashes[at] == digest, self.hashes_frame[at], f)
        new = np.flatnonzero(f < 0)
        if not len(new):
            return f
        fresh, first, inverse = np.unique(digest[new], return_index=True, return_inverse=True)
        count = len(self.refs)
        f[new] = count + inverse
        first = new[first]
        self.hashes_frame = np.append(self.hashes_frame, np.arange(count, count + len(fresh)))
        self.refs = np.concatenate((self.refs, rows[first]))
        if len(self.refs) > self.limit:
            return None
        _, cut, dot, _ = rows[first].T
        self.common = np.concatenate((self.common, dot - cut))
        self.hashes = np.concatenate((self.hashes, fresh))
        order = np.argsort(self.hashes)
        self.hashes, self.hashes_frame = self.hashes[order], self.hashes_frame[order]
        self.dirs = _append_rows(self.dirs, dirs[first])
        self.exts = _append_rows(self.exts, exts[first])
        self.names = _append_rows(self.names, _word_rows(self.words, cut, dot - cut))
        return f

    def matches(self, f: _Array, widths: _Array, dirs: _Array, exts: _Array) -> bool:
        """Whether every item has the directory and extension of its frame's first item."""
        ref = self.refs[f]
        return (
            np.array_equal(np.stack((ref[:, 1] - ref[:, 0], ref[:, 3] - ref[:, 2]), 1), widths)
            and np.array_equal(_widen(self.dirs, dirs.shape[1])[f, : dirs.shape[1]], dirs)
            and np.array_equal(_widen(self.exts, exts.shape[1])[f, : exts.shape[1]], exts)
        )

    def shorten(self, f: _Array, cut: _Array, dot: _Array) -> None:
        """Shortens each frame's common prefix to what its items' names (``cut:dot``) share.

        Only the names that do not start with the frame's first name are compared in full.
        """
        words, common = self.words, self.common
        width = np.minimum(dot - cut, common[f])
        k_stem = _word_count(width)
        mask = _mask(width, k_stem)
        names = words[_word_at(words, cut, k_stem)] & mask
        theirs = _widen(self.names, k_stem)[f, :k_stem] & mask
        short = np.flatnonzero((width < common[f]) | (names != theirs).any(1))
        same = _shared_prefix(names[short], theirs[short], width[short])
        np.minimum.at(common, f[short], same)


def _pack(
    data: _Array,
    offsets: _Array,
    ids: _Array,
    cuts: _Array,
    dots: _Array,
    refs: _Array,
    common: _Array,
) -> tuple[_Array, _Array, _Array, _Array, _Array] | None:
    """Cuts each item down to its middle and builds the frame table (see :func:`_framed`)."""
    n = len(ids)
    starts = cuts + common[ids]
    middles = [
        data[_spans(starts[k : k + _CHUNK], dots[k : k + _CHUNK])] for k in range(0, n, _CHUNK)
    ]
    mid_off = np.zeros(n + 1, np.int64)
    np.cumsum(dots - starts, out=mid_off[1:])
    start, cut, dot, end = refs.T
    piece_lo = np.stack((start, dot), 1).ravel()
    piece_hi = np.stack((cut + common, end), 1).ravel()
    bounds = np.zeros(len(piece_lo) + 1, np.int64)
    np.cumsum(piece_hi - piece_lo, out=bounds[1:])
    packed = (
        np.concatenate(middles),
        _narrow(mid_off),
        _narrow_ids(ids, len(refs)),
        data[_spans(piece_lo, piece_hi)],
        _narrow(bounds),
    )
    plain = data.nbytes + np.dtype(_offset_dtype(len(data))).itemsize * len(offsets)
    if 4 * sum(a.nbytes for a in packed) > 3 * plain:
        return None
    return packed
