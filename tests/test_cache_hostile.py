"""stoker.cached under attack: full file systems, SIGKILL, absurd budgets, planted files.

The crash and leak cases run in a child interpreter, most of them with ``/dev/shm`` or the
cache folder a small private tmpfs (a mount namespace of its own: ``unshare -m``, needs
root; skipped without), so that a SIGBUS or a leftover segment can only touch that child.
"""

from __future__ import annotations

import copy
import gc
import multiprocessing
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stoker
from stoker import _cache

_MIB = 1 << 20
_WAIT_S = 60.0

_PRELUDE = """
import os, signal, sys, warnings
import numpy as np
import stoker

class Rows:
    def __init__(self, n=64, size=1 << 20):
        self.n, self.size = n, size
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        return np.full(self.size, i % 251, np.uint8)
    def __repr__(self):
        return f"Rows({self.n}, {self.size})"

def fill(folder, leave):
    # take a file system's space but ``leave`` bytes, as another program would
    st = os.statvfs(folder)
    with open(os.path.join(folder, "filler"), "wb") as f:
        f.write(b"x" * max(0, st.f_bavail * st.f_frsize - leave))

def load_all(ds):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ok = all(int(ds[i][0]) == i % 251 for i in range(len(ds)))
    print("loaded", ok, ds.statistics().entries, *[str(w.message) for w in seen][:1])
"""


def _run(tmp_path: Path, body: str, mounts: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``body`` (after the prelude) in a child interpreter with a tmpfs of the given
    size mounted at each path of ``mounts`` in a private mount namespace."""
    if mounts and (os.geteuid() != 0 or shutil.which("unshare") is None):
        pytest.skip("needs root and unshare(1) to mount a private tmpfs")
    script = tmp_path / "hostile_cache.py"
    script.write_text(textwrap.dedent(_PRELUDE) + textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    mount = "".join(
        f"mkdir -p {p} && mount -t tmpfs -o size={size} tmpfs {p} || exit 97; "
        for p, size in mounts.items()
    )
    shell = f'{mount}"$0" "$1"; echo "exit $?"; ls -a /dev/shm'
    cmd = ["unshare", "-m", "sh", "-c", shell] if mounts else ["sh", "-c", shell]
    done = subprocess.run(
        [*cmd, sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    if done.returncode == 97 or "unshare failed" in done.stderr:
        pytest.skip(f"cannot mount a private tmpfs here: {done.stderr[-200:]}")
    return done


def _exit_status(done: subprocess.CompletedProcess[str]) -> int:
    line = next(x for x in done.stdout.splitlines() if x.startswith("exit "))
    return int(line.split()[1])


# -- space: never SIGBUS ----------------------------------------------------------------


def test_a_memory_budget_beyond_dev_shm_is_an_error_naming_the_room(tmp_path: Path) -> None:
    """cached(ds, 64 MiB) with an 8 MiB /dev/shm: an OSError at cached() naming /dev/shm,
    the bytes free, the budget and the fix; nothing left in /dev/shm (SIGBUS before)."""
    done = _run(
        tmp_path,
        """
        try:
            ds = stoker.cached(Rows(), 64 << 20, always=True)
            load_all(ds)
        except OSError as exc:
            print("OSError", exc)
        """,
        {"/dev/shm": "8m"},
    )
    assert _exit_status(done) == 0, done
    assert "OSError" in done.stdout and "/dev/shm" in done.stdout, done.stdout
    assert "67,108,864" in done.stdout and "bytes free" in done.stdout
    assert "--shm-size" in done.stdout and "stoker_" not in done.stdout


def test_a_disk_budget_beyond_the_free_space_is_an_error_naming_the_folder(
    tmp_path: Path,
) -> None:
    """A 32 MiB disk cache in a 4 MiB file system: an OSError at cached() naming the
    folder, the bytes free and the budget; no store file is left there."""
    folder = str(tmp_path / "cache")
    done = _run(
        tmp_path,
        f"""
        try:
            ds = stoker.cached(Rows(), 32 << 20, where={folder!r}, always=True)
            load_all(ds)
        except OSError as exc:
            print("OSError", exc)
        print("left", sorted(n for n in os.listdir({folder!r}) if n.endswith(".bin")))
        """,
        {folder: "4m"},
    )
    assert _exit_status(done) == 0, done
    assert "OSError" in done.stdout and folder in done.stdout, done.stdout
    assert "33,554,432" in done.stdout and "bytes free" in done.stdout
    assert "left []" in done.stdout


@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_a_file_system_that_fills_up_later_never_kills_the_process(
    tmp_path: Path, kind: str
) -> None:
    """A budget that fit when the cache was made, then another program takes the space:
    the entries that no longer fit are not stored (one warning naming the place), every
    sample still arrives right, and the process lives (SIGBUS before)."""
    folder = "/dev/shm" if kind == "memory" else str(tmp_path / "cache")
    where = "memory" if kind == "memory" else folder
    done = _run(
        tmp_path,
        f"""
        ds = stoker.cached(Rows(16), 12 << 20, where={where!r}, always=True)
        fill({folder!r}, 3 << 20)
        load_all(ds)
        load_all(ds)
        """,
        {folder: "16m"},
    )
    assert _exit_status(done) == 0, done
    first, again = [x for x in done.stdout.splitlines() if x.startswith("loaded")]
    assert first.startswith("loaded True") and "is full" in first, first
    stored = int(first.split()[2])
    assert 0 < stored < 16 and again.startswith(f"loaded True {stored}")


# -- leaks: SIGKILL, absurd budgets -------------------------------------------------------


@pytest.mark.parametrize("workers", ["none", "fork", "spawn"])
def test_a_sigkilled_main_process_leaves_no_cache_segment(tmp_path: Path, workers: str) -> None:
    """The main process SIGKILLed (as the OOM killer does) with a memory cache, with or
    without workers that use it: no cache segment stays in /dev/shm."""
    done = _run(
        tmp_path,
        f"""
        if __name__ == "__main__":
            ds = stoker.cached(Rows(8, 4096), 1 << 20, always=True)
            ds[0]
            if {workers!r} != "none":
                loader = stoker.DataLoader(ds, batch_size=2, num_workers=2,
                                           multiprocessing_context={workers!r})
                it = iter(loader)
                next(it)
            os.kill(os.getpid(), signal.SIGKILL)
        """,
        {"/dev/shm": "64m"},
    )
    assert _exit_status(done) == 128 + 9, done
    assert "_cache_" not in done.stdout, done.stdout


def test_a_budget_past_int64_is_a_value_error_and_leaves_nothing() -> None:
    """2**63 and more: ValueError naming the limit (OverflowError and a leftover segment
    before); 2**62 fits the header but not /dev/shm: the OSError naming the room."""
    before = set(os.listdir("/dev/shm"))
    for budget in (2**63, 2**64 + 5):
        with pytest.raises(ValueError, match=r"positive number of bytes below 2\*\*63"):
            stoker.cached(list(range(10)), budget)
    with pytest.raises(OSError, match="bytes free for a budget of 4,611,686,018,427,387,904"):
        stoker.cached(list(range(10)), 2**62)
    assert set(os.listdir("/dev/shm")) == before


def test_a_spawned_worker_reads_the_memory_cache_its_maker_holds() -> None:
    """A memory cache whose name was unlinked at once still reaches spawned workers (they
    open it through the maker's descriptor): their loads are hits on the maker's entries."""
    ds = stoker.cached(Squares(16), 1 << 20, always=True)
    [ds[i] for i in range(16)]
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="spawn")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = np.concatenate([b[:, 0] for b in loader])
    assert got.tolist() == list(range(16))
    assert ds.statistics().hits == 16
    del loader


# -- cached data cannot be changed through a view ------------------------------------------


class Squares:
    """A deterministic dataset: sample i is an array of ``i``s."""

    def __init__(self, n: int = 8) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return np.full(16, i, np.float32)

    def __repr__(self) -> str:
        return f"Squares({self.n})"


@pytest.mark.parametrize("workers", [0, 2])
def test_a_tensor_written_in_place_never_changes_the_cache(workers: int) -> None:
    """``x.add_(100)`` on each sample of stoker.torch's loader over a cache (batch_size=None,
    no workers or threads, where a tensor could share the cached bytes) changes nothing
    that a later epoch or a NumPy reader sees; the NumPy view's flag cannot be reset."""
    torch = pytest.importorskip("torch")
    import stoker.torch as st

    ds = st.cached(Squares(), 1 << 20, always=True)
    loader = st.DataLoader(
        ds, batch_size=None, num_workers=workers, worker_mode="thread" if workers else "auto"
    )
    for _epoch in range(3):
        for i, x in enumerate(loader):
            assert torch.equal(x, torch.full((16,), float(i)))
            x.add_(100)
    assert ds.statistics().hits >= 16
    assert float(ds[3][0]) == 3.0
    with pytest.raises(ValueError):
        ds[3].flags.writeable = True


# -- disk folders shared by processes ---------------------------------------------------


def _open_at_once(folder: str, go: Any, out: Any) -> None:
    go.wait(_WAIT_S)
    ds = stoker.cached(Squares(64), 1 << 20, where=folder, always=True)
    st = os.fstat(ds._opened().fd)
    ds[os.getpid() % 64]
    out.put((st.st_dev, st.st_ino))
    ds.close()


def test_processes_opening_one_empty_folder_at_once_share_one_file(tmp_path: Path) -> None:
    """Four processes (as DDP ranks) open the same empty folder at the same moment: all map
    one file (the same inode), and one store file is all the folder holds."""
    ctx = multiprocessing.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_open_at_once, args=(str(tmp_path), go, out)) for _ in range(4)]
    for p in procs:
        p.start()
    go.set()
    inodes = {out.get(timeout=_WAIT_S) for _ in procs}
    for p in procs:
        p.join(_WAIT_S)
    assert [p.exitcode for p in procs] == [0] * 4
    out.close()
    out.join_thread()
    assert len(inodes) == 1
    assert len(list(tmp_path.glob("*.bin"))) == 1 and not list(tmp_path.glob("*.tmp"))


# -- no pickle on disk ----------------------------------------------------------------------


class Planted:
    """An object whose unpickling runs code: it creates the file ``marker``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (Path.touch, (Path(self.marker),))


class Carrier:
    """Samples holding an object only pickle could store."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Any:
        return np.full(8, i, np.int64), Planted(self.marker)

    def __repr__(self) -> str:
        return "Carrier()"


def test_a_disk_cache_never_stores_or_loads_a_pickle(tmp_path: Path) -> None:
    """A sample that needs pickle is not stored on disk (one warning; it is loaded from
    the dataset each time); an entry planted with a pickle and a valid CRC-32 is refused
    (counted corrupt, recomputed), so loading the cache never runs the planted code."""
    marker = tmp_path / "ran"
    folder = tmp_path / "cache"
    with pytest.warns(RuntimeWarning, match="never a pickle"):
        ds = stoker.cached(Carrier(str(marker)), 1 << 20, where=folder, always=True)
        got = ds[1]
    assert int(got[0][0]) == 1 and isinstance(got[1], Planted) and ds.statistics().entries == 0
    store = ds._opened()
    store.pickles = True  # plant: an entry with a pickle in it, and a correct checksum
    assert store.write(2, 1, ("x", Planted(str(marker))), replace=False)
    ds.close()
    assert not marker.exists()
    again = stoker.cached(Carrier(str(marker)), 1 << 20, where=folder, always=True)
    with pytest.warns(RuntimeWarning, match="never a pickle"):
        got = again[2]
    assert int(got[0][0]) == 2 and again.statistics().corrupt == 1
    assert not marker.exists()
    again.close()


# -- a damaged header, copies ---------------------------------------------------------------


def test_a_garbage_header_field_makes_the_store_rebuilt(tmp_path: Path) -> None:
    """A disk store whose header's decision (or limit, or a timing) holds garbage is
    rebuilt on open, as other damage is; statistics() then works (KeyError before). The
    same damage made while the store is mapped is a ValueError naming file and field."""
    for field, value in [(_cache._H_DECISION, 12345), (_cache._H_LIMIT, -7)]:
        ds = stoker.cached(Squares(), 1 << 20, where=tmp_path, always=True)
        [ds[i] for i in range(8)]
        path = ds._opened().name
        ds.close()
        with open(path, "r+b") as f:
            f.seek(8 + 8 * field)
            f.write(int(value).to_bytes(8, "little", signed=True))
        again = stoker.cached(Squares(), 1 << 20, where=tmp_path, always=True)
        stats = again.statistics()
        assert (stats.entries, stats.decision) == (0, "measuring")
        assert float(again[5][0]) == 5.0
        again.close()
    live = stoker.cached(Squares(), 1 << 20, where=tmp_path, always=True)
    live._opened().header[_cache._H_DECISION] = 99
    with pytest.raises(ValueError, match="header field 'decision' holds 99") as err:
        live.statistics()
    assert live._opened().name in str(err.value) and "Delete the file" in str(err.value)
    live.close()


@pytest.mark.parametrize("where", ["memory", "disk"])
def test_a_copy_works_after_the_original_is_gone(tmp_path: Path, where: str) -> None:
    """copy.deepcopy and copy.copy of a cache map the store themselves: they read and count
    on after the original is closed and collected (FileNotFoundError on a segment name
    before). A pickle is a reference to its maker's store: loaded after that store is gone,
    it says so."""
    place: Any = "memory" if where == "memory" else tmp_path
    ds = stoker.cached(Squares(), 1 << 20, where=place, always=True)
    [ds[i] for i in range(8)]
    deep, shallow, blob = copy.deepcopy(ds), copy.copy(ds), pickle.dumps(ds)
    ds.close()
    del ds
    gc.collect()
    for c in (deep, shallow):
        assert float(c[4][0]) == 4.0 and c.statistics().entries == 8
    assert deep.statistics().hits >= 2
    deep.close()
    shallow.close()
    late = pickle.loads(blob)
    if where == "memory":
        with pytest.raises(ValueError, match="store is gone"):
            late[0]
    else:
        assert float(late[0][0]) == 0.0
        late.close()
