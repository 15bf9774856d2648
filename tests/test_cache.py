"""stoker.cached and ImageFolder's pixel cache: one shared copy, the budget, safety, identity.

Real shared memory, real files, real worker processes (fork and spawn) and threads. The
memory test reads the workers' own /proc/PID/smaps.
"""

from __future__ import annotations

import gc
import io
import multiprocessing
import os
import pickle
import re
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import stoker
from stoker import _cache
from stoker._engine import _shm_errors
from stoker.vision import ImageFolder
from stoker.vision import transforms as T

_WAIT_S = 10.0


class Squares:
    """A deterministic dataset that counts its loads: sample i is (i-filled array, i, dict)."""

    def __init__(self, n: int = 64, size: int = 256, cost_s: float = 0.0) -> None:
        self.n, self.size, self.cost_s = n, size, cost_s
        self.loads = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        self.loads += 1
        if self.cost_s:
            time.sleep(self.cost_s)  # the cost of producing a sample, not synchronisation
        return np.full(self.size, i, np.float32), i, {"name": f"s{i}", "v": np.arange(3) + i}

    def __repr__(self) -> str:
        return f"Squares({self.n}, {self.size})"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def test_samples_round_trip_as_read_only_views_and_pickles() -> None:
    """Arrays of any dtype and shape inside tuples, lists and dicts come back equal and
    read-only; other objects (a set, an object array) are pickled in the entry."""

    class Mixed:
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int) -> Any:
            return [
                np.arange(6, dtype=np.int16).reshape(2, 3) * i,
                np.float64(i),
                np.array(True),
                {"s": "x" * i, "o": np.array([None, i], dtype=object), "set": {i}},
                b"\x00" * i,
                None,
            ]

    inner = Mixed()
    ds = stoker.cached(inner, 1 << 20, always=True)
    for _ in range(2):
        for i in range(3):
            got, want = ds[i], inner[i]
            assert _same(got[0], want[0]) and not got[0].flags.writeable
            assert got[1] == want[1] and type(got[1]) is np.float64
            assert got[3]["set"] == {i} and got[3]["o"].tolist() == [None, i]
            assert got[3]["s"] == want[3]["s"] and got[4] == want[4] and got[5] is None
    stats = ds.statistics()
    assert (stats.hits, stats.misses, stats.entries) == (3, 3, 3)
    with pytest.raises(IndexError, match="out of range"):
        ds[3]
    assert _same(ds[-1], inner[2])


def test_bad_arguments_say_what_must_hold() -> None:
    with pytest.raises(ValueError, match="budget must be a positive number of bytes"):
        stoker.cached(Squares(), 0)
    with pytest.raises(ValueError, match="header and index table"):
        stoker.cached(Squares(), 4096)
    with pytest.raises(TypeError, match="map-style dataset"):
        stoker.cached(iter([1, 2]), 1 << 20)  # type: ignore[arg-type]


def _segment_bytes(ds: _cache.CachedDataset) -> int:
    st = os.fstat(ds._opened().fd)
    return max(st.st_size, st.st_blocks * 512)


def test_budget_is_never_exceeded_and_keeps_a_fixed_subset() -> None:
    """Over a budget for about a third of the samples, shuffled epochs keep the same first
    indices (no thrashing), the segment never grows past the budget, the rest always miss."""
    inner = Squares(n=90, size=2048)  # ~8.3 KB an entry
    budget = 300_000
    ds = stoker.cached(inner, budget, always=True)
    loader = stoker.DataLoader(ds, batch_size=10, shuffle=True, generator=3)
    kept = None
    for _ in range(3):
        for _ in loader:
            assert _segment_bytes(ds) <= budget
        stats = loader.statistics().cache
        assert stats is not None and stats.used_bytes + ds._store.data_start <= budget  # type: ignore[union-attr]
        ready = set(np.flatnonzero(ds._store.column(0) == _cache.READY).tolist())  # type: ignore[union-attr]
        assert ready == set(range(stats.admitted or 0))
        kept = ready if kept is None else kept
        assert ready == kept
    assert 20 <= len(kept) < 90
    assert stats.hits == 2 * len(kept) and stats.misses == 3 * 90 - 2 * len(kept)
    assert inner.loads == stats.misses


def test_caching_turns_itself_off_when_producing_is_cheaper_than_reading() -> None:
    class Ints:
        def __len__(self) -> int:
            return 40

        def __getitem__(self, i: int) -> int:
            return i

    cheap = stoker.cached(Ints(), 1 << 20)
    assert [cheap[i] for i in range(40)] == list(range(40))
    stats = cheap.statistics()
    assert stats.decision.startswith("off (producing a sample took"), stats.decision
    assert stats.entries == _cache.MEASURE_ENTRIES  # nothing stored after the decision
    costly = stoker.cached(Squares(n=12, cost_s=0.005), 1 << 20)
    [costly[i] for i in range(12)]
    assert costly.statistics().decision.startswith("caching ("), costly.statistics().decision


def test_preload_fills_in_index_order_then_serves_everything() -> None:
    inner = Squares(n=16)
    ds = stoker.cached(inner, 1 << 20, preload=True)
    assert inner.loads == 16
    assert all(_same(ds[i], inner[i]) for i in range(16))
    assert inner.loads == 32  # the 16 comparisons above, not the cache
    stats = ds.statistics()
    assert stats.decision == "preloaded"
    assert (stats.entries, stats.hits) == (16, 16)


def test_two_threads_missing_one_index_publish_one_whole_entry() -> None:
    """Both compute (the dataset waits until both are inside it); one publishes; both
    return equal samples; the store holds one entry."""
    barrier = threading.Barrier(2, timeout=_WAIT_S)

    class Slow(Squares):
        def __getitem__(self, i: int) -> Any:
            barrier.wait()
            return super().__getitem__(i)

    inner = Slow(n=4)
    ds = stoker.cached(inner, 1 << 20, always=True)
    out: list[Any] = [None, None]

    def load(k: int) -> None:
        out[k] = ds[2]

    threads = [threading.Thread(target=load, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(_WAIT_S)
    assert not any(t.is_alive() for t in threads)
    assert inner.loads == 2 and _same(out[0], out[1])
    stats = ds.statistics()
    assert stats.entries == 1 and stats.misses == 2
    assert stats.used_bytes == ds._store.table[2 * _cache._T_FIELDS + _cache._T_LENGTH]  # type: ignore[union-attr]
    barrier.abort()  # the next loads are hits: they never reach it
    assert _same(ds[2], out[0]) and ds.statistics().hits == 1


def _epochs(dataset: Any, epochs: int = 2, **kw: Any) -> tuple[list[list[Any]], Any]:
    loader = stoker.DataLoader(dataset, batch_size=8, shuffle=True, generator=11, **kw)
    runs = [[b for b in loader] for _ in range(epochs)]
    return runs, loader.statistics()


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"num_workers": 2, "multiprocessing_context": "fork"},
        {"num_workers": 2, "multiprocessing_context": "spawn", "persistent_workers": True},
        {"num_workers": 2, "multiprocessing_context": "forkserver"},
        {"num_workers": 2, "worker_mode": "thread"},
    ],
    ids=["in-process", "fork", "spawn", "forkserver", "threads"],
)
def test_cached_batches_equal_uncached_ones_and_workers_share_the_counts(
    kw: dict[str, Any],
) -> None:
    """The same seed gives byte-identical batches with and without the cache, epoch after
    epoch; the second epoch is all hits, counted by the workers in the shared header.
    (ImageFolder's random crops are compared with the same workers below.)"""
    plain, _ = _epochs(Squares(n=48))  # no draws in the dataset: any worker setup agrees
    ds = stoker.cached(Squares(n=48), 1 << 20, always=True)
    cached, stats = _epochs(ds, **kw)
    assert all(_same(a, b) for a, b in zip(plain, cached, strict=True))
    assert stats.cache.hits == 48 and stats.cache.misses == 48
    assert stats.cache.hit_rate == 0.5 and stats.cache.entries == 48
    ds.close()


def test_state_dict_resume_is_unchanged_by_the_cache() -> None:
    def resumed(dataset: Any) -> list[Any]:
        loader = stoker.DataLoader(dataset, batch_size=4, shuffle=True, generator=5)
        it = iter(loader)
        [next(it) for _ in range(3)]
        state = loader.state_dict()
        del it
        again = stoker.DataLoader(dataset, batch_size=4, shuffle=True, generator=5)
        again.load_state_dict(state)
        return list(again)

    ds = stoker.cached(Squares(n=24), 1 << 20, always=True)
    [ds[i] for i in range(24)]
    assert all(_same(a, b) for a, b in zip(resumed(Squares(n=24)), resumed(ds), strict=True))


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
def test_torch_front_door_is_a_torch_dataset_and_matches_torchs_loader() -> None:
    """Differential: torch's DataLoader over stoker.torch.cached(ds) gives what it gives over
    ds (torch warns, once, that the cached arrays are read-only: they are shared)."""
    torch = pytest.importorskip("torch")
    import stoker.torch as st

    ds = st.cached(Squares(n=20), 1 << 20, always=True)
    assert isinstance(ds, torch.utils.data.Dataset)
    runs = []
    for dataset in (Squares(n=20), ds, ds):
        g = torch.Generator().manual_seed(0)
        runs.append(
            list(torch.utils.data.DataLoader(dataset, batch_size=6, shuffle=True, generator=g))
        )
    for batches in runs[1:]:
        for a, b in zip(runs[0], batches, strict=True):
            assert (
                torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2]["name"] == b[2]["name"]
            )
    assert pickle.loads(pickle.dumps(ds))[3][1] == 3


def _mapping_pss_kb(pid: int, name: str) -> int:
    """Pss of the mappings of segment ``name`` in process ``pid`` (from /proc/PID/smaps)."""
    total, inside = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:
                inside = line.rstrip().endswith(name) or line.rstrip().endswith(f"{name} (deleted)")
            elif inside and head[0] == "Pss:":
                total += int(head[1])
    return total


class PidSquares(Squares):
    def __getitem__(self, i: int) -> Any:
        return os.getpid()


def test_two_workers_hold_one_copy_of_the_cached_bytes() -> None:
    """Summed Pss of the segment in 2 real worker processes is within 10% of one copy."""
    inner = Squares(n=64, size=32768)  # 128 KiB an entry, 8 MiB in all
    ds = stoker.cached(inner, 16 << 20, always=True)
    pids = stoker.cached(PidSquares(n=64), 1 << 20, always=True)
    both = stoker.StackDataset(ds, pids)
    loader = stoker.DataLoader(
        both,
        batch_size=8,
        shuffle=True,
        generator=1,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="fork",
    )
    seen: set[int] = set()
    for _ in range(2):
        for batch in loader:
            seen.update(int(p) for p in batch[1])
    assert len(seen) == 2 and os.getpid() not in seen
    cached_bytes = ds.statistics().used_bytes
    pss = sum(_mapping_pss_kb(pid, ds._name) for pid in seen) * 1024
    assert abs(pss - cached_bytes) <= 0.10 * cached_bytes, (pss, cached_bytes)
    stats = loader.statistics().cache  # found inside the StackDataset: its first cache
    assert stats is not None and (stats.hits, stats.misses) == (64, 64)
    del loader


def test_memory_cache_leaves_nothing_and_counts_in_the_engines_shm_check() -> None:
    before = _cache.shm_room_bytes()
    assert before is not None
    ds = stoker.cached(Squares(), 32 << 20)  # (a budget must fit: docker's default is 64 MiB)
    name = ds._name
    assert not os.path.exists(f"/dev/shm/{name}")  # unlinked at once: nothing can leak
    reserved = _cache.shm_reserved_bytes()
    assert reserved > 30 << 20  # sparse: nothing written yet, all of it may still be
    room = _cache.shm_room_bytes()
    assert room is not None and room <= before - 30 * (1 << 20) + (1 << 20)
    told = re.search(r"([\d,]+) bytes are free", str(_shm_errors.shm_error(1 << 40, 2, 4)))
    assert told is not None and abs(int(told[1].replace(",", "")) - room) < 1 << 20
    del ds
    assert _cache.shm_reserved_bytes() == 0


def _close_copy(ds: _cache.CachedDataset) -> None:
    ds.close()
    gc.collect()


def test_a_forked_copy_closing_leaves_the_segment_to_the_others() -> None:
    """A forked worker's copy of a memory cache, closed or collected, leaves the segment
    to the parent and its other workers."""
    ds = stoker.cached(Squares(), 1 << 20, always=True)
    ds[0]
    child = multiprocessing.get_context("fork").Process(target=_close_copy, args=(ds,))
    child.start()
    child.join(_WAIT_S)
    assert child.exitcode == 0
    assert _same(ds[0], Squares()[0])
    assert ds.statistics().hits == 1


def _photo(seed: int, size: tuple[int, int] = (48, 64)) -> bytes:
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for i in range(6):
        d = tmp_path / "imgs" / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i}.jpg").write_bytes(_photo(i))
    (tmp_path / "imgs" / "c0" / "x.png").write_bytes(_png(7))
    return tmp_path / "imgs"


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (40, 30, 3), np.uint8)).save(
        buf, "PNG"
    )
    return buf.getvalue()


_TRAIN = T.Compose(
    [
        T.RandomResizedCrop(32),
        T.RandomHorizontalFlip(),
        T.ToTensor(),
        T.Normalize([0.5] * 3, [0.2] * 3),
    ]
)
_EVAL = T.Compose([T.Resize(40), T.CenterCrop(32), T.ToTensor()])
_OTHER = T.Compose([T.RandomResizedCrop(24), T.ColorJitter(0.3), T.ToTensor()])


@pytest.mark.parametrize(
    "transform", [_TRAIN, _EVAL, _OTHER], ids=["fused-train", "fused-eval", "plain"]
)
def test_image_folder_pixel_cache_gives_the_uncached_batches(folder: Path, transform: Any) -> None:
    """Fused (random crop and Resize) and plain transforms run on cached pixels: the same
    seed gives the uncached batches byte for byte, in process and in 2 forked workers."""
    kw: dict[str, Any] = {"num_workers": 2, "multiprocessing_context": "fork"}
    plain, _ = _epochs(ImageFolder(folder, transform), **kw)
    ds = ImageFolder(folder, transform, cache="memory", cache_budget=4 << 20)
    cached, stats = _epochs(ds, **kw)
    again, _ = _epochs(ds)
    for a, b, c in zip(plain, cached, again, strict=True):
        assert _same(a, b) and _same(a, c)
    assert stats.cache.entries == 7 and stats.cache.hits == 7


def test_reduced_pixels_still_cover_the_output(tmp_path: Path) -> None:
    root = tmp_path / "big" / "a"
    root.mkdir(parents=True)
    (root / "0.jpg").write_bytes(_photo(1, (256, 320)))
    full = ImageFolder(tmp_path / "big", _TRAIN, cache="memory", cache_budget=1 << 20)
    small = ImageFolder(
        tmp_path / "big", _TRAIN, cache="memory", cache_budget=1 << 20, cache_reduce=True
    )
    assert full._pixels(0)[0].shape == (256, 320, 3)  # type: ignore[index]
    pixels, _, h, w, d = small._pixels(0)  # type: ignore[misc]
    assert (h, w, d) == (256, 320, 8) and pixels.shape == (32, 40, 3)
    assert small[0][0].shape == (3, 32, 32)
    assert (
        small._pixel_cache.statistics().used_bytes < full._pixel_cache.statistics().used_bytes / 30
    )  # type: ignore[union-attr]


def test_a_changed_file_invalidates_its_entry(folder: Path) -> None:
    ds = ImageFolder(folder, _EVAL, cache="memory", cache_budget=4 << 20)
    before = [ds[i][0] for i in range(len(ds))]
    path = Path(ds.samples[2][0])
    path.write_bytes(_photo(99))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a new time, surely
    fresh = ImageFolder(folder, _EVAL)
    after = [ds[i][0] for i in range(len(ds))]
    assert _same(after, [fresh[i][0] for i in range(len(ds))])
    assert not _same(after[2], before[2]) and _same(after[3], before[3])
    stats = ds._pixel_cache.statistics()  # type: ignore[union-attr]
    assert stats.stale == 1 and stats.hits == len(ds) - 1


def _disk(tmp_path: Path, inner: Squares) -> _cache.CachedDataset:
    return stoker.cached(inner, 1 << 20, where=tmp_path / "c", always=True)


def test_disk_cache_survives_a_restart(tmp_path: Path) -> None:
    first = _disk(tmp_path, Squares(n=8))
    [first[i] for i in range(8)]
    first.close()
    inner = Squares(n=8)
    second = _disk(tmp_path, inner)
    assert all(_same(second[i], Squares(n=8)[i]) for i in range(8))
    assert inner.loads == 0 and second.statistics().hits == 8
    other = _disk(tmp_path, Squares(n=9))  # another key: another file, never the first's
    assert other._store.name != second._store.name  # type: ignore[union-attr]


def test_disk_cache_truncated_or_corrupted_is_detected_and_rebuilt(tmp_path: Path) -> None:
    first = _disk(tmp_path, Squares(n=8))
    [first[i] for i in range(8)]
    path = first._store.name  # type: ignore[union-attr]
    t = first._store.table  # type: ignore[union-attr]
    row = 5 * _cache._T_FIELDS
    offset, length = t[row + _cache._T_OFFSET], t[row + _cache._T_LENGTH]
    del t
    first.close()
    # a corrupted entry: one byte of sample 5's array flipped
    with open(path, "r+b") as f:
        f.seek(offset + length - 70)
        byte = f.read(1)
        f.seek(offset + length - 70)
        f.write(bytes([byte[0] ^ 0xFF]))
    inner = Squares(n=8)
    second = _disk(tmp_path, inner)
    assert all(_same(second[i], Squares(n=8)[i]) for i in range(8))
    assert inner.loads == 1 and second.statistics().corrupt == 1
    assert _same(second[5], Squares(n=8)[5])  # rewritten: a hit now
    second.close()
    # a truncated file: rebuilt from nothing, every sample loaded again
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    inner = Squares(n=8)
    third = _disk(tmp_path, inner)
    assert os.path.getsize(path) == 1 << 20
    assert all(_same(third[i], Squares(n=8)[i]) for i in range(8)) and inner.loads == 8
    third.close()
    # a foreign header
    with open(path, "r+b") as f:
        f.write(b"garbage!")
    inner = Squares(n=8)
    fourth = _disk(tmp_path, inner)
    assert _same(fourth[0], Squares(n=8)[0]) and inner.loads == 1
    assert not [p for p in os.listdir(tmp_path / "c") if p.endswith(".tmp")]


def test_a_writer_that_died_mid_entry_leaves_no_served_entry(tmp_path: Path) -> None:
    """A row left "being written" (a crash) is reset by the next sole opener; an entry
    whose bytes did not all reach the file fails its checksum."""
    first = _disk(tmp_path, Squares(n=4))
    [first[i] for i in range(4)]
    path = first._store.name  # type: ignore[union-attr]
    t = first._store.table  # type: ignore[union-attr]
    t[1 * _cache._T_FIELDS + _cache._T_STATE] = _cache.WRITING
    crc = t[2 * _cache._T_FIELDS + _cache._T_CRC]
    t[2 * _cache._T_FIELDS + _cache._T_CRC] = crc ^ 1 if crc != zlib.crc32(b"") else crc
    del t
    first.close()
    inner = Squares(n=4)
    second = _disk(tmp_path, inner)
    assert all(_same(second[i], Squares(n=4)[i]) for i in range(4))
    assert inner.loads == 2 and second.statistics().corrupt == 1
    assert os.path.exists(path)


# -- torch, last: once torch is imported, spawned workers import it too (seconds each)


@pytest.mark.parametrize("where", ["memory", "disk"])
def test_tensors_are_stored_raw_and_each_load_gets_its_own(tmp_path: Path, where: str) -> None:
    """CPU tensors (a transposed one too) are stored without pickle, memory or disk, and
    each load is a tensor of its own: writing into it changes no later load."""
    torch = pytest.importorskip("torch")

    class Tensors:
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int) -> Any:
            return torch.arange(6).reshape(2, 3).t() + i, {"y": torch.tensor(i + 0.5)}

    place: Any = "memory" if where == "memory" else tmp_path
    ds = stoker.cached(Tensors(), 1 << 20, where=place, always=True)
    for _ in range(2):
        for i in range(3):
            x, d = ds[i]
            assert torch.equal(x, Tensors()[i][0]) and float(d["y"]) == i + 0.5
            x.add_(100)
    assert ds.statistics().entries == 3 and ds.statistics().hits >= 3
    ds.close()
