"""ShardIterable: tar shards as a stream, shuffled by shard and within a buffer, split across
ranks x workers, resumable.

Each *consumer* (one worker of one rank) reads its own shards sequentially, so a stream
needs no index and no random access: this is the reader for object storage. Which
shards a consumer reads, and the order of samples, depend only on (seed, epoch, shard
list, number of consumers), so every rank and worker agrees without talking.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Any

import numpy as np

from stoker import _random, _torch
from stoker._dataset import IterableDataset
from stoker._worker_info import get_worker_info
from stoker.formats import _index, _remote
from stoker.formats._codec import DICT_SPEC, Assembler, CorruptRecordError, spec_kind
from stoker.formats._index import INDEX_SUFFIX, ShardIndex, iter_members

RawSample = tuple[dict[str, bytes], str, str, int, int]
"""A sample as read: its fields' bytes, its shard, its key, the byte its first header
starts at, and the byte the next sample's starts at."""


def consumer() -> tuple[int, int]:
    """``(id, count)`` of the calling consumer among ranks x workers.

    The rank and world size come from ``torch.distributed`` when it is initialised, else
    from the ``RANK`` / ``WORLD_SIZE`` environment variables (1 process when unset); the
    worker from stoker's ``get_worker_info()``, or torch's under torch's DataLoader.
    """
    rank, world = _rank_world()
    info: Any = get_worker_info()
    torch = _torch.loaded()
    if info is None and torch is not None:
        info = torch.utils.data.get_worker_info()
    wid, workers = (0, 1) if info is None else (int(info.id), int(info.num_workers))
    return rank * workers + wid, world * workers


def _rank_world() -> tuple[int, int]:
    torch = _torch.loaded()
    if torch is not None:
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def group_samples(
    url: str,
    cache_dir: str | None,
    storage_options: Mapping[str, Any],
    verify: bool = True,
    start: int = 0,
) -> Iterator[RawSample]:
    """The samples of shard ``url`` in order, from the one whose first header is at byte
    ``start``, as ``({field: bytes}, url, key, its start, the next one's start)``.

    With ``verify`` and a current index beside the shard, each member is checked against
    it as :class:`~stoker.formats.ShardDataset` checks (size and CRC-32).
    """
    index = _index.current(url, storage_options) if verify else None
    with _remote.open_stream(url, cache_dir, storage_options) as f:
        yield from _grouped(_at(f, start), url, index, start)


def _at(f: IO[bytes], start: int) -> IO[bytes]:
    """``f`` at byte ``start``: a seek, or for a stream that cannot seek, ``start`` bytes
    read and dropped."""
    try:
        f.seek(start)
    except (OSError, ValueError, io.UnsupportedOperation):  # a stream, read from its start
        left = start
        while left > 0 and (chunk := f.read(min(left, 1 << 20))):
            left -= len(chunk)
    return f


def _grouped(f: IO[bytes], url: str, index: ShardIndex | None, start: int) -> Iterator[RawSample]:
    """The samples of the shard open as ``f`` at byte ``start`` (see :func:`group_samples`)."""
    fields: dict[str, bytes] = {}
    current: str | None = None
    first = end = start
    for key, field, offset, data, header in iter_members(f, url, start):
        if index is not None:
            _index.verify(index, _member_at(index, offset, key, field), data, key, field)
        if current is not None and (key != current or field in fields):
            yield fields, url, current, first, header
            fields = {}
        if not fields:
            first = header
        current = key
        fields[field] = data
        end = offset + len(data)
    if current is not None:
        yield fields, url, current, first, -(-end // 512) * 512  # the next header


def read_samples(
    url: str,
    offsets: list[int],
    cache_dir: str | None,
    storage_options: Mapping[str, Any],
    verify: bool = True,
) -> list[RawSample]:
    """The samples of shard ``url`` whose first headers are at ``offsets`` (one open, a
    seek each; a remote shard without a cached copy by byte-range requests)."""
    index = _index.current(url, storage_options) if verify else None
    local = _remote.cached(url, cache_dir, storage_options)
    with (
        open(local, "rb") if local is not None else _remote.open_random(url, storage_options)
    ) as f:
        return [next(_grouped(_at(f, at), url, index, at)) for at in offsets]


def _member_at(index: ShardIndex, offset: int, key: str, field: str) -> int:
    """The member of ``index`` whose data starts at ``offset``.

    Raises:
        CorruptRecordError: when the index has none (it does not describe this shard).
    """
    m = int(np.searchsorted(index.offset, offset))
    if m >= len(index.offset) or int(index.offset[m]) != offset:
        raise CorruptRecordError(
            f"corrupt shard or index {index.url!r}: member {key}.{field} at byte {offset} is "
            f"not in the index {index.url + INDEX_SUFFIX!r}. Re-download or rewrite the shard, "
            "or delete the index to rebuild it."
        )
    return m


class _Reader:
    """A consumer's shards read in order, from a position: shard ``shard`` of ``urls`` at
    byte ``offset``, ``n`` samples of the shards counted before it (with fewer shards than
    consumers, every ``stride``-th is this consumer's). After each sample it yields, its
    position is the next one's: a state, with no sample read twice on resume."""

    def __init__(self, ds: ShardIterable, urls: list[str], stride: int, cid: int) -> None:
        self.ds, self.urls, self.stride, self.cid = ds, urls, stride, cid
        self.shard = self.offset = self.n = 0
        self.shard_of = {url: i for i, url in enumerate(urls)}

    def __iter__(self) -> Iterator[RawSample]:
        ds, stride, cid = self.ds, self.stride, self.cid
        while self.shard < len(self.urls):
            url = self.urls[self.shard]
            for sample in group_samples(
                url, ds.cache_dir, ds.storage_options, ds.verify, self.offset
            ):
                n, self.n, self.offset = self.n, self.n + 1, sample[4]
                if stride == 1 or n % stride == cid:
                    yield sample
            self.shard, self.offset = self.shard + 1, 0


class _Shuffler:
    """Samples shuffled through a buffer of ``size`` (none when ``size`` <= 1): once it is
    full, each new sample takes the place of one drawn to go out; at the end, what is left
    goes out in a drawn order. Its state is the buffer's samples (where each starts), the
    generator's state and, at the end, the order left, so a resume reads only those.

    >>> out = list(_Shuffler(iter(range(10)), 4, np.random.default_rng(0)))
    >>> sorted(out) == list(range(10)), out != list(range(10))
    (True, True)
    """

    def __init__(self, items: Iterator[Any], size: int, rng: np.random.Generator) -> None:
        self.items, self.size, self.rng = items, size, rng
        self.buf: list[Any] = []
        self.drain: list[Any] | None = None  # the order left, once the input ended

    def __iter__(self) -> Iterator[Any]:
        size, rng, buf = self.size, self.rng, self.buf
        if self.drain is None:
            for item in self.items:
                if size <= 1:
                    yield item
                    continue
                if len(buf) < size:
                    buf.append(item)
                    continue
                j = int(rng.integers(size))
                buf[j], item = item, buf[j]
                yield item
            self.drain = [buf[int(j)] for j in rng.permutation(len(buf))][::-1]
            buf.clear()
        while self.drain:
            yield self.drain.pop()


class ShardIterable(IterableDataset[Any]):
    """An iterable dataset over tar shards: shuffled shards, a shuffle buffer, split across
    ranks x workers.

    Consumer ``c`` of ``C`` (ranks x workers, :func:`consumer`) takes every ``C``-th shard
    of the epoch's permutation (every ``C``-th sample, with fewer shards), shuffled in a
    buffer drawn from (seed, epoch, c); with several ranks pass one int ``seed`` and call
    :meth:`set_epoch`. :meth:`load_state_dict` resumes a pass where it stopped.

    Args:
        urls: shard paths or URLs (see :class:`ShardDataset`).
        fields: the read spec; default: the writer's, else the whole dict.
        shuffle_shards: permute the shards each epoch.
        buffer_size: the shuffle buffer in samples (0 or 1: none).
        seed: the int seed; None: drawn (in workers, the loader's base seed).
        transform, target_transform, decode: as for :class:`ShardDataset`.
        cache_dir: local folder for remote shards; without it they are streamed.
        verify: check sizes and CRC-32s against each shard's index.
        storage_options: fsspec keyword arguments for remote ``urls``.

    Attributes:
        storage_options: the options given.

    >>> import os, tempfile
    >>> with tempfile.TemporaryDirectory() as root:
    ...     with ShardWriter(os.path.join(root, "s-%06d.tar"), maxcount=2) as writer:
    ...         for i in range(5):
    ...             _ = writer.write((np.full(2, i), i))
    ...     sorted(target for _, target in ShardIterable(root, seed=0))
    [0, 1, 2, 3, 4]
    """

    def __init__(
        self,
        urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        fields: Sequence[str] | None = None,
        *,
        shuffle_shards: bool = True,
        buffer_size: int = 1000,
        seed: int | None = None,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        decode: bool | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        verify: bool = True,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(buffer_size, int) or buffer_size < 0:
            raise ValueError(f"buffer_size must be a non-negative integer, got {buffer_size!r}.")
        if seed is not None:
            _random.check_generator(seed, "seed")
        self.storage_options = _remote.check_storage_options(storage_options)
        self.urls = _remote.expand(urls, ".tar", self.storage_options)
        self.shuffle_shards = shuffle_shards
        self.buffer_size = buffer_size
        self.seed = seed
        self.epoch = 0
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.verify = verify
        meta = _first_meta(self.urls[0], self.storage_options)
        spec = list(fields) if fields is not None else list(meta.get("spec", [DICT_SPEC]))
        kind = meta.get("kind", "dict") if fields is None else spec_kind(spec, None)
        self.classes: list[str] = list(meta.get("extra", {}).get("classes", []))
        self._asm = Assembler(
            spec, kind, meta.get("codecs", {}), transform, target_transform, decode
        )
        self._state: dict[str, int] = {}
        self._resume: dict[str, Any] | None = None
        self._pipe: tuple[_Reader, _Shuffler] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch that, with the seed, orders shards and samples (call before iter)."""
        self.epoch = int(epoch)

    def _seed(self) -> int:
        if self.seed is not None:
            return int(self.seed)
        info = get_worker_info()
        if info is not None:
            return int(info.seed) - int(info.id)  # the loader's base seed: same in all workers
        return _random.draw_seed(None)

    def plan(self, seed: int, epoch: int, cid: int, count: int) -> tuple[list[str], int]:
        """The shards consumer ``cid`` of ``count`` reads, and its sample stride (1 or count)."""
        order = np.arange(len(self.urls))
        if self.shuffle_shards:
            order = _random.rng(seed, epoch).permutation(len(self.urls))
        urls = [self.urls[int(i)] for i in order]
        if len(urls) >= count:
            return urls[cid::count], 1
        return urls, count

    def __iter__(self) -> Iterator[Any]:
        cid, count = consumer()
        resume, self._resume = self._resume, None
        if resume is not None:
            seed, epoch, skip = resume["seed"], resume["epoch"], resume["consumed"]
        else:
            seed, epoch, skip = self._seed(), self.epoch, 0
        self._state = {"seed": seed, "epoch": epoch, "consumer": cid, "consumers": count}
        self._state["consumed"] = skip
        urls, stride = self.plan(seed, epoch, cid, count)
        reader = _Reader(self, urls, stride, cid)
        pipe = _Shuffler(iter(reader), self.buffer_size, _random.rng(seed, epoch, cid))
        self._pipe = reader, pipe
        if resume is not None and resume.get("position") is not None:
            self._restore(reader, pipe, resume["position"])  # read only what it names
            skip = 0
        for raw, url, key, _, _ in pipe:
            if skip:  # a state without its position (an older stoker's): counted again
                skip -= 1
                continue
            wanted = self._asm.needed(list(raw), url, key)
            sample = self._asm.build({f: raw[f] for f in wanted}, url, key)
            self._state["consumed"] += 1
            yield sample

    def _restore(self, reader: _Reader, pipe: _Shuffler, position: Mapping[str, Any]) -> None:
        """Put the pass's reader, buffer and generator where ``position`` says."""
        reader.shard, reader.offset, reader.n = (int(position[k]) for k in ("shard", "offset", "n"))
        pipe.buf[:] = self._read_refs(reader.urls, position["buffer"])
        if position["drain"] is not None:
            pipe.drain = self._read_refs(reader.urls, position["drain"])
        pipe.rng.bit_generator.state = position["rng"]

    def _read_refs(self, urls: list[str], refs: Sequence[Sequence[int]]) -> list[RawSample]:
        """The samples at ``refs`` ((shard, byte) each), in their order: one open a shard."""
        by_shard: dict[int, list[int]] = {}
        for n, (shard, _) in enumerate(refs):
            by_shard.setdefault(int(shard), []).append(n)
        out: list[Any] = [None] * len(refs)
        for shard, places in by_shard.items():
            offsets = [int(refs[n][1]) for n in places]
            read = read_samples(
                urls[shard], offsets, self.cache_dir, self.storage_options, self.verify
            )
            for n, sample in zip(places, read, strict=True):
                out[n] = sample
        return out

    def state_dict(self) -> dict[str, Any]:
        """This consumer's position: ``seed``, ``epoch``, ``consumer``, ``consumers``,
        ``consumed`` (samples yielded in the current pass) and ``position`` (where its
        reader stands and, as (shard, byte) each, the samples its shuffle buffer holds,
        with its generator's state: a resume reads only those). Empty before the first
        iter."""
        state: dict[str, Any] = dict(self._state)
        if state and self._pipe is not None:
            reader, pipe = self._pipe

            def refs(samples: list[RawSample]) -> list[list[int]]:
                return [[reader.shard_of[s[1]], s[3]] for s in samples]

            state["position"] = {
                "shard": reader.shard,
                "offset": reader.offset,
                "n": reader.n,
                "buffer": refs(pipe.buf),
                "drain": None if pipe.drain is None else refs(pipe.drain),
                "rng": pipe.rng.bit_generator.state,
            }
        return state

    def load_state_dict(self, state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Resume the next ``iter()`` where ``state`` left off (see the class docstring).

        ``state`` is one :meth:`state_dict`, or a list of them (one per consumer), of
        which the calling consumer takes its own.

        Raises:
            ValueError: when ``state`` does not fit this consumer.
        """
        states = [state] if isinstance(state, Mapping) else list(state)
        cid, count = consumer()
        for s in states:
            if not s:
                continue
            if int(s["consumers"]) != count:
                raise ValueError(
                    f"the state was saved with {s['consumers']} consumers (ranks x workers) "
                    f"but this run has {count}; resume with the same world size and "
                    "num_workers."
                )
            if int(s["consumer"]) == cid:
                self._resume = {k: int(s[k]) for k in ("seed", "epoch", "consumed")}
                self._resume["position"] = s.get("position")
                self.epoch = int(s["epoch"])
                return
        raise ValueError(
            f"no state for consumer {cid} of {count} in the {len(states)} given; pass the "
            "state_dict() of every consumer."
        )

    def __repr__(self) -> str:
        return (
            f"ShardIterable({len(self.urls)} shards, buffer_size={self.buffer_size}, "
            f"seed={self.seed})"
        )


def _first_meta(url: str, storage_options: Mapping[str, Any]) -> dict[str, Any]:
    """The writer's metadata from ``url``'s index file, or {} when it has none.

    Raises:
        CorruptRecordError: when the index is damaged.
    """
    index = _index.read(url, storage_options)
    return {} if index is None else index.meta
