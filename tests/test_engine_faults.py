"""One test per worker fault row of docs/reliability.md, each under fork and spawn.

Workers here are real processes. A "stuck" worker sleeps in its dataset; nothing in the
tests sleeps to synchronise. Bounds are checked with wall-clock measurements.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import select
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stoker import DataLoader
from stoker.errors import SharedMemoryError, WorkerError

METHODS = ["fork", "spawn"]
_GONE_WAIT_S = 30.0
"""How long stopped workers may take to be gone: a worker that said goodbye may take seconds
to exit on a busy machine (the pool kills it after ``_reap.EXIT_WAIT_S``); a leak stays."""


class Faulty:
    """Sample 3 misbehaves as told: raise, raise an odd type, die, or hang."""

    def __init__(self, how: str, n: int = 8) -> None:
        self.how = how
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if i == 3:
            if self.how == "raise":
                raise ValueError("bad sample 3")
            if self.how == "odd":
                raise OddError("x", 3)
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.how == "hang":
                time.sleep(60)
        return np.full(4, i, np.float32)


class OddError(Exception):
    """An exception whose constructor takes two arguments (PyTorch issue 30147)."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what} failed with {code}")
        self.code = code


def _loader(how: str, method: str, **kw: Any) -> DataLoader[Any]:
    return DataLoader(
        Faulty(how), batch_size=1, num_workers=1, multiprocessing_context=method, **kw
    )


@pytest.mark.parametrize("method", METHODS)
def test_worker_exception_keeps_type_message_and_context(method: str) -> None:
    """A worker's exception re-raises with its type and message, worker id, index, traceback."""
    it = iter(_loader("raise", method))
    got = [next(it) for _ in range(3)]
    with pytest.raises(ValueError, match="bad sample 3") as info:
        next(it)
    note = "\n".join(info.value.__notes__)
    assert "worker 0" in note and "[3]" in note and "__getitem__" in note
    assert [int(b[0, 0]) for b in got] == [0, 1, 2]
    assert int(next(it)[0, 0]) == 4  # the loader goes on after a failed batch
    del it, info


@pytest.mark.parametrize("method", METHODS)
def test_odd_exception_type_still_reported(method: str) -> None:
    """An exception that cannot be rebuilt arrives as RuntimeError naming it, with a cause."""
    it = iter(_loader("odd", method))
    for _ in range(3):
        next(it)
    with pytest.raises(RuntimeError, match="OddError: x failed with 3") as info:
        next(it)
    assert "__getitem__" in str(info.value.__cause__)
    del it, info


@pytest.mark.parametrize("method", METHODS)
def test_killed_worker_reported_within_a_second(method: str) -> None:
    """A worker killed by SIGKILL raises WorkerError naming pid and signal, in under 1 s.

    Batches it finished just before may be lost with it (tiny batches are sent in groups).
    """
    it = iter(_loader("kill", method))
    pid = it._pool.workers[0].pid
    got = []
    with pytest.raises(WorkerError, match=f"pid {pid}.*SIGKILL") as info:
        while True:
            t0 = time.monotonic()
            got.append(int(next(it)[0, 0]))
    assert time.monotonic() - t0 < 1.0
    assert got == list(range(len(got))) and len(got) <= 3
    assert "memory" in str(info.value)
    del it, info


@pytest.mark.parametrize("method", METHODS)
def test_stuck_worker_times_out(method: str) -> None:
    """With timeout, a worker that makes no progress raises within timeout + 1 s."""
    it = iter(_loader("hang", method, timeout=0.5))
    for _ in range(3):
        next(it)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"timed out after 0.5 seconds.*worker 0") as info:
        next(it)
    assert time.monotonic() - t0 < 1.5
    assert not it._pool.alive
    del it, info


_MAIN_SCRIPT = """
import os, sys, time
import numpy as np
from stoker import DataLoader

class Slow:
    def __len__(self):
        return 100
    def __getitem__(self, i):
        if i > 1:
            time.sleep(60)
        return np.zeros(1000, np.float32)

if __name__ == "__main__":
    it = iter(DataLoader(Slow(), batch_size=1, num_workers=2,
                         multiprocessing_context=sys.argv[1]))
    batches = [next(it), next(it)]  # every worker started
    print(" ".join(str(w.pid) for w in it._pool.workers), flush=True)
    time.sleep(60)
"""


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """Pids still alive after ``timeout_s`` (waits on pidfds, no polling)."""
    fds = {}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            fds[os.pidfd_open(pid)] = pid
    deadline = time.monotonic() + timeout_s
    try:
        pending = set(fds)
        while pending and time.monotonic() < deadline:
            ready, _, _ = select.select(list(pending), [], [], deadline - time.monotonic())
            pending -= set(ready)
        return [fds[fd] for fd in pending]
    finally:
        for fd in fds:
            os.close(fd)


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds")
@pytest.mark.parametrize("method", METHODS)
def test_main_process_killed_workers_exit_and_unlink(method: str, tmp_path: Path) -> None:
    """SIGKILL of the main process: its workers exit by themselves (the parent's death is a
    signal to them) and unlink their segments."""
    script = tmp_path / "main.py"
    script.write_text(textwrap.dedent(_MAIN_SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    with subprocess.Popen(
        [sys.executable, str(script), method], stdout=subprocess.PIPE, env=env
    ) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2, line
        proc.kill()
        proc.wait()
        assert _wait_gone(pids, _GONE_WAIT_S) == []
    left = [n for n in os.listdir("/dev/shm") if n.startswith(f"stoker_{proc.pid}_")]
    assert left == []


_EXIT_SCRIPT = """
import sys
import numpy as np
from stoker import DataLoader, TensorDataset

if __name__ == "__main__":
    persistent = sys.argv[2] == "persistent"
    loaders = [DataLoader(TensorDataset(np.arange(400.0)), batch_size=10, num_workers=2,
                          multiprocessing_context=sys.argv[1], persistent_workers=persistent)
               for _ in range(4)]
    for loader in loaders:  # fresh pools end (and are reaped) just before the exit
        for _ in loader:
            pass
    print("done", flush=True)
"""


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("persistent", ["persistent", "fresh"])
def test_interpreter_exit_is_quiet(method: str, persistent: str, tmp_path: Path) -> None:
    """A script that ends with live or just-stopped workers exits 0 and writes no error.

    multiprocessing joins its children at exit while stoker's reaper closes them: the exit
    must wait for the reaper, or the join fails with "process object is closed".
    """
    script = tmp_path / "main.py"
    script.write_text(textwrap.dedent(_EXIT_SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    done = subprocess.run(
        [sys.executable, str(script), method, persistent],
        capture_output=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, b"done\n", b"")


# How the loop lets go of the iterator is the main process's affair, alike for any workers;
# stopping spawned workers is their own code: spawn runs the hardest way (the collector).
@pytest.mark.parametrize(
    ("method", "how"),
    [
        (method, how)
        for method in METHODS
        for how in ["exception", "break_del", "gc"]
        if method == "fork" or how == "gc"
    ],
)
def test_interrupted_loops_leave_nothing(method: str, how: str) -> None:
    """Ctrl-C or an error in the loop, break + del, or GC: the workers go, quietly."""
    loader = DataLoader(
        Faulty("none", 40), batch_size=2, num_workers=2, multiprocessing_context=method
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        it = iter(loader)
        taken = [next(it), next(it)]  # both workers started and busy
        pids = [w.pid for w in it._pool.workers]
        assert None not in pids and len(taken) == 2
        if how == "exception":
            with pytest.raises(KeyboardInterrupt):
                for _ in it:
                    raise KeyboardInterrupt
        if how == "gc":
            it._self_cycle = it  # only the cycle collector can free it
        del it
        if how == "gc":
            import gc

            gc.collect()
        assert _wait_gone([p for p in pids if p is not None], _GONE_WAIT_S) == []
        del taken  # the workers went while the loop still held its batches


def _no_shm_space(worker_id: int) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    os.posix_fallocate = full  # this worker's /dev/shm is "full"


@pytest.mark.parametrize("method", METHODS)
def test_shm_too_small_says_needed_free_and_fix(method: str) -> None:
    """A full /dev/shm raises SharedMemoryError with bytes needed, bytes free and the fix."""
    loader = DataLoader(
        Faulty("none"),
        batch_size=2,
        num_workers=1,
        multiprocessing_context=method,
        worker_init_fn=_no_shm_space,
    )
    it = iter(loader)
    with pytest.raises(SharedMemoryError, match=r"(?s)bytes.*free.*--shm-size") as info:
        next(it)
    assert isinstance(info.value, RuntimeError)
    del it, info


class Unpicklable:
    """A dataset holding a lambda: fine under fork, impossible to send under spawn."""

    def __init__(self) -> None:
        self.transform = lambda x: x

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Any:
        return self.transform(np.float32(i))


@pytest.mark.parametrize("method", METHODS)
def test_unpicklable_dataset_named_at_iter(method: str) -> None:
    """Under spawn, iter() fails naming the dataset and the start method; fork just works."""
    loader = DataLoader(Unpicklable(), batch_size=2, num_workers=1, multiprocessing_context=method)
    if method == "fork":
        assert [b.tolist() for b in loader] == [[0.0, 1.0], [2.0, 3.0]]
        return
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)) as info:
        iter(loader)
    note = "\n".join(getattr(info.value, "__notes__", []))
    assert "dataset" in note and "'spawn'" in note and "Unpicklable" in note
    del info
