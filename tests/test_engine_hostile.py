"""Hostile workers: datasets and hooks that end their worker, hang, or raise the unraisable.

Each fault runs on real workers: forked and spawned processes and threads. What must hold
for every one of them: no hang (every wait here is bounded, and a test that would hang
fails instead), no silent loss (batches finished before the fault reach the user), and a
clear error in the main process naming the worker and the cause. The leak fixture checks
that nothing (process, thread, descriptor, segment) is left behind.
"""

from __future__ import annotations

import functools
import os
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import raised
from stoker import DataLoader
from stoker._engine import _threads
from stoker._engine._messages import Ready
from stoker.errors import WorkerError

MODES = ["fork", "spawn", "thread"]
SAME_IN_ANY_PROCESS = ["fork", "thread"]
"""For what a worker does alike under any start method (its code is the same once it runs)
and what the main process does alone: a spawned worker would only add its seconds of start
(it imports torch when the main process has it)."""
_BOUND_S = 30.0
"""The longest any one scenario may take before it counts as a hang."""


class Fatal(BaseException):
    """A BaseException that is neither SystemExit nor KeyboardInterrupt."""


class BadStr(Exception):
    """An exception whose ``__str__`` itself raises."""

    def __str__(self) -> str:
        raise ValueError("__str__ of BadStr fails")


class BadStrUnpicklable(BadStr):
    """As BadStr, and it cannot be pickled either (it holds a lock)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.lock = threading.Lock()


class Hostile:
    """Sample ``at`` misbehaves as told; the others are ``np.full(4, i)``."""

    def __init__(self, how: str, at: int = 3, n: int = 8) -> None:
        self.how, self.at, self.n = how, at, n
        self.main_pid = os.getpid()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if i == self.at:
            how = self.how
            if how == "sys.exit":
                sys.exit(3)
            if how == "os._exit":
                os._exit(0)
            if how == "KeyboardInterrupt":
                raise KeyboardInterrupt
            if how == "BaseException":
                raise Fatal("the dataset gives up")
            if how == "bad __str__":
                raise BadStr("sample 3")
            if how == "bad __str__, unpicklable":
                raise BadStrUnpicklable("sample 3")
            if how == "SIGINT to main":
                os.kill(self.main_pid, signal.SIGINT)
        return np.full(4, i, np.float32)


def _loader(dataset: Any, mode: str, **kw: Any) -> DataLoader[Any]:
    kw.setdefault("batch_size", 1)
    kw.setdefault("num_workers", 1)
    if mode == "thread":
        return DataLoader(dataset, worker_mode="thread", **kw)
    return DataLoader(dataset, multiprocessing_context=mode, **kw)


def _within(seconds: float, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a helper thread; fails the test if it has not returned in
    ``seconds`` (a hang), else returns its result or raises its exception."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append((True, fn(*args)))
        except BaseException as exc:
            out.append((False, exc))

    t = threading.Thread(target=run, daemon=True, name="test-bounded")
    t.start()
    t.join(seconds)
    if not out:
        pytest.fail(f"still waiting after {seconds:g} s: the loader hangs")
    ok, value = out[0]
    if not ok:
        raise value
    return value


def _take_all(it: Iterator[Any]) -> tuple[list[int], BaseException | None, float]:
    """The first values of the batches taken until ``it`` raised, the exception, and how
    long the failing ``next`` took."""
    got: list[int] = []
    while True:
        t0 = time.monotonic()
        try:
            batch = next(it)
        except StopIteration:
            return got, None, 0.0
        except BaseException as exc:
            return got, exc, time.monotonic() - t0
        got.append(int(batch[0, 0]))


# -- 1, 5: a worker that ends itself is a dead worker, and what it sent arrives ------------


# The ending becomes an exit code in the worker's own loop; only the exit itself differs by
# start method (a spawned worker's os._exit), so spawn runs one ending, not three.
@pytest.mark.parametrize(
    ("mode", "how"),
    [
        (mode, how)
        for mode in MODES
        for how in ["sys.exit", "KeyboardInterrupt", "BaseException"]
        if mode != "spawn" or how == "sys.exit"
    ],
)
def test_a_worker_that_ends_itself_is_reported_after_its_batches(mode: str, how: str) -> None:
    """``sys.exit(3)``, KeyboardInterrupt or another BaseException in ``__getitem__``: the
    batches before it arrive in order, then a WorkerError (a RuntimeError) names the worker,
    what ended it, and, for a process, its pid and exit code; never a hang."""
    it = iter(_loader(Hostile(how), mode))
    pid = None if mode == "thread" else it._pool.workers[0].pid
    got, exc, took = _within(_BOUND_S, _take_all, it)
    assert got == [0, 1, 2]
    assert isinstance(exc, WorkerError), repr(exc)
    text = str(exc)
    assert "exited unexpectedly" in text
    assert {"sys.exit": "SystemExit", "BaseException": "Fatal"}.get(how, how) in text
    assert "[3]" in text  # the sample it was loading
    if mode == "thread":
        assert "worker thread 0" in text
    else:
        assert f"pid {pid}" in text
        assert f"code {3 if how == 'sys.exit' else 1}" in text
    assert took < 2.0
    assert not it._pool.alive
    del it, exc


@pytest.mark.parametrize("mode", ["fork", "spawn"])
def test_a_batch_sent_before_os_exit_arrives(mode: str) -> None:
    """A worker that sends batch 0 and calls ``os._exit(0)`` in the next ``__getitem__``
    (no clean-up at all): batch 0 arrives, then the error with the pid and exit code, and
    the segments it left are unlinked (the leak fixture)."""
    it = iter(_loader(Hostile("os._exit", at=1), mode))
    pid = it._pool.workers[0].pid
    got, exc, _ = _within(_BOUND_S, _take_all, it)
    assert got == [0]
    assert isinstance(exc, WorkerError), repr(exc)
    assert f"pid {pid}" in str(exc) and "code 0" in str(exc)
    del it, exc


@pytest.mark.parametrize("mode", ["fork", "thread"])
def test_a_persistent_loader_starts_fresh_workers_after_a_dead_one(mode: str) -> None:
    """With ``persistent_workers``, the epoch after a worker ended itself runs on fresh
    workers: the same batches, then the same error, never a silently empty epoch."""
    loader = _loader(Hostile("sys.exit"), mode, persistent_workers=True)
    for _ in range(2):
        got, exc, _ = _within(_BOUND_S, _take_all, iter(loader))
        assert got == [0, 1, 2] and isinstance(exc, WorkerError), (got, exc)
    del loader, exc


def test_a_dead_thread_is_not_reported_as_alive_under_timeout() -> None:
    """With ``timeout=``, a thread that ended itself is reported dead at once, not as "alive
    but made no progress" after the timeout."""
    it = iter(_loader(Hostile("sys.exit", at=0), "thread", timeout=10))
    got, exc, took = _within(_BOUND_S, _take_all, it)
    assert got == [] and isinstance(exc, WorkerError)
    assert "alive" not in str(exc) and "SystemExit" in str(exc)
    assert took < 2.0
    del it, exc


def _silent_thread(args: Any, inbox: Any, outbox: Any) -> None:
    outbox.put((args.worker_id, Ready()))  # then it ends without a word


def test_a_thread_that_ends_without_a_word_is_seen_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread pool checks that its threads live: one that ended without saying so
    (here, a worker function that just returns) is a dead worker, seen within seconds."""
    monkeypatch.setattr(_threads, "thread_worker", _silent_thread)
    it = iter(_loader(Hostile("none"), "thread"))
    got, exc, took = _within(_BOUND_S, _take_all, it)
    assert got == [] and isinstance(exc, WorkerError)
    assert "worker thread 0" in str(exc) and "exited unexpectedly" in str(exc)
    assert took < 3.0
    del it, exc


# -- 1, 3: exceptions that fail to print or to pickle --------------------------------------


@pytest.mark.parametrize("mode", SAME_IN_ANY_PROCESS)
def test_an_exception_whose_str_raises_keeps_its_type(mode: str) -> None:
    """An exception whose ``__str__`` raises re-raises in the main process with its own type
    (as torch does), with the worker and sample noted; the loader goes on after it."""
    it = iter(_loader(Hostile("bad __str__"), mode))
    got, exc, _ = _within(_BOUND_S, _take_all, it)
    assert got == [0, 1, 2]
    assert type(exc) is BadStr, repr(exc)
    note = "\n".join(exc.__notes__)
    assert "worker" in note and "[3]" in note and "__getitem__" in note
    assert int(_within(_BOUND_S, next, it)[0, 0]) == 4
    del it, exc


@pytest.mark.parametrize("mode", SAME_IN_ANY_PROCESS)
def test_an_unpicklable_exception_whose_str_raises_is_reported(mode: str) -> None:
    """Cannot be printed nor pickled: a process worker's error arrives as a RuntimeError that
    names the type and carries the worker's traceback (a thread's keeps the object)."""
    it = iter(_loader(Hostile("bad __str__, unpicklable"), mode))
    got, exc, _ = _within(_BOUND_S, _take_all, it)
    assert got == [0, 1, 2]
    if mode == "thread":
        assert type(exc) is BadStrUnpicklable
    else:
        assert type(exc) is RuntimeError, repr(exc)
        assert "BadStrUnpicklable" in str(exc) and "worker 0" in str(exc)
        assert "__getitem__" in str(exc.__cause__)
        assert "exited" not in str(exc)
    assert int(_within(_BOUND_S, next, it)[0, 0]) == 4
    del it, exc


# -- 2: timeout= covers worker_init_fn ----------------------------------------------------

_RELEASE = threading.Event()


def _stuck_init(worker_id: int) -> None:
    _RELEASE.wait(60)  # a process's copy is never set: it is killed; a thread is released


def _exiting_init(worker_id: int) -> None:
    sys.exit(2)


@pytest.mark.parametrize("mode", MODES)
def test_timeout_covers_a_stuck_worker_init_fn(mode: str) -> None:
    """``timeout=1`` and a ``worker_init_fn`` that never returns: a RuntimeError after about
    a second from the worker's start (as torch), naming the init function and the seconds."""
    _RELEASE.clear()
    loader = _loader(Hostile("none"), mode, timeout=1, worker_init_fn=_stuck_init)
    t0 = time.monotonic()
    it = iter(loader)
    try:
        _, exc, took = _within(_BOUND_S, _take_all, it)
    finally:
        _RELEASE.set()
    assert isinstance(exc, RuntimeError), repr(exc)
    text = str(exc)
    assert "timed out after 1 seconds" in text and "in its worker_init_fn _stuck_init" in text
    assert ("worker thread 0" if mode == "thread" else "worker 0 (pid") in text
    assert time.monotonic() - t0 >= 1.0
    if mode != "spawn":  # spawn's start-up (seconds on a busy machine) is not counted
        assert took < 3.0
    del it, exc


class _InterruptsSecondPickle(Hostile):
    """Its second pickling (the second spawned worker's start) is interrupted (Ctrl-C)."""

    pickled = 0

    def __reduce__(self) -> Any:
        type(self).pickled += 1
        if type(self).pickled == 2:
            raise KeyboardInterrupt
        return (Hostile, ("none",))


def test_ctrl_c_while_a_spawned_worker_starts_stops_the_started_one() -> None:
    """KeyboardInterrupt while the second spawned worker starts (while its arguments are
    pickled): it propagates from ``iter()``, and the worker already started is stopped."""
    loader = _loader(_InterruptsSecondPickle("none"), "spawn", num_workers=2)
    with pytest.raises(KeyboardInterrupt) as info:
        iter(loader)
    held = info.value.__traceback__
    assert _InterruptsSecondPickle.pickled == 2
    assert _wait_no_children(_BOUND_S) == []
    del held, info


@pytest.mark.parametrize("mode", MODES)
def test_a_worker_init_fn_that_exits_is_a_dead_worker(mode: str) -> None:
    """``sys.exit(2)`` in ``worker_init_fn``: a WorkerError naming the worker and the hook,
    with the exit code for a process; never a hang."""
    it = iter(_loader(Hostile("none"), mode, worker_init_fn=_exiting_init))
    got, exc, _ = _within(_BOUND_S, _take_all, it)
    assert got == [] and isinstance(exc, WorkerError), repr(exc)
    assert "SystemExit" in str(exc) and "worker_init_fn" in str(exc)
    if mode != "thread":
        assert "code 2" in str(exc)
    del it, exc


# -- 6: Ctrl-C in the main process while it waits, and during start-up --------------------


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    """Python's own SIGINT handler (KeyboardInterrupt) for the test, whatever the runner
    inherited: a shell starts background jobs with SIGINT ignored, and Python then installs
    none."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.usefixtures("sigint_raises")
def test_ctrl_c_while_waiting_for_a_batch_leaves_nothing(mode: str) -> None:
    """A real SIGINT reaches the main process while it waits for batch 3: KeyboardInterrupt
    is raised there (not turned into another error), and dropping the iterator stops the
    workers (the leak fixture). The batches are held: a dropped batch's release runs
    Python's ``weakref.finalize``, whose first line can swallow a SIGINT (the gap in
    docs/reliability.md), and this test is about the wait, not that gap."""
    it = iter(_loader(Hostile("SIGINT to main"), mode))
    held = []
    with pytest.raises(KeyboardInterrupt):
        for _ in range(8):
            held.append(next(it))
    del it, held


class _InterruptedSampler:
    def __iter__(self) -> Iterator[int]:
        raise KeyboardInterrupt
        yield 0  # pragma: no cover

    def __len__(self) -> int:
        return 8


@pytest.mark.parametrize("mode", MODES)
def test_ctrl_c_while_the_workers_start_stops_them_at_once(mode: str) -> None:
    """KeyboardInterrupt while ``iter()`` starts the workers (here, from the sampler): the
    workers are stopped before it propagates, even while its traceback is still held."""
    loader = _loader(Hostile("none"), mode, sampler=_InterruptedSampler(), num_workers=2)
    with pytest.raises(KeyboardInterrupt) as info:
        iter(loader)
    held = info.value.__traceback__
    left = _wait_no_children(_BOUND_S) if mode != "thread" else _wait_no_threads(_BOUND_S)
    assert left == [], left
    del held, info


def _wait_no_children(timeout_s: float) -> list[int]:
    import multiprocessing

    deadline = time.monotonic() + timeout_s
    while True:
        alive = [p.pid for p in multiprocessing.active_children() if p.pid]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)  # a bounded re-check of the kernel's reaping, not synchronisation


def _wait_no_threads(timeout_s: float) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [t.name for t in threading.enumerate() if t.name.startswith("stoker-worker")]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)  # as above


# -- 6: results that cannot cross ---------------------------------------------------------


def _collate_with_lambda(samples: list[Any]) -> Any:
    return {"x": np.stack(samples), "f": lambda: None}


@pytest.mark.parametrize("mode", ["fork", "spawn"])
def test_an_unpicklable_batch_is_an_error_of_that_batch(mode: str) -> None:
    """A collate_fn whose batch cannot be pickled: each batch raises the pickling error with
    the worker and the indices noted, and the worker lives on."""
    it = iter(_loader(Hostile("none", n=4), mode, collate_fn=_collate_with_lambda))
    for i in range(2):
        with pytest.raises(Exception, match=r"(?i)pickle") as info:
            _within(_BOUND_S, next, it)
        assert f"[{i}]" in "\n".join(getattr(info.value, "__notes__", []))
    assert it._pool.alive
    del it, info


class _BigBytes:
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> bytes:
        return bytes([i]) * (24 << 20)


def test_a_big_non_array_batch_crosses_the_pipe() -> None:
    """A 24 MiB bytes object per batch (pickled into the message, not a slot) arrives whole."""
    it = iter(DataLoader(_BigBytes(), batch_size=None, num_workers=1))
    got = _within(_BOUND_S, list, it)
    assert [len(b) for b in got] == [24 << 20] * 2 and got[1][-1] == 1
    del it, got


# -- 4: /dev/shm too small, in a private tmpfs ---------------------------------------------

_SHM_SCRIPT = """
import os, sys
import numpy as np
from stoker import DataLoader

class Rows:
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return np.full(int(sys.argv[2]), i, np.uint8)

if __name__ == "__main__":
    loader = DataLoader(Rows(), batch_size=1, num_workers=2, prefetch_factor=2,
                        multiprocessing_context=sys.argv[1])
    got = 0
    try:
        for batch in loader:
            got += 1
    except Exception as exc:
        print(type(exc).__name__, got, exc, flush=True)
    else:
        print("no error", got, flush=True)
"""
_MIB = 1 << 20


def _run_in_small_shm(tmp_path: Path, method: str, shm_bytes: int, row_bytes: int) -> str:
    """Run the script with ``/dev/shm`` a private tmpfs of ``shm_bytes`` (a mount namespace
    of its own); its stdout, after checking it exited 0 and wrote nothing to stderr."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to mount a private tmpfs")
    script = tmp_path / "small_shm.py"
    script.write_text(textwrap.dedent(_SHM_SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    shell = (
        f'mount -t tmpfs -o size={shm_bytes} tmpfs /dev/shm && exec "$0" "$@"; '
        "echo cannot-mount >&2; exit 97"
    )
    cmd = ["unshare", "-m", "sh", "-c", shell, sys.executable, str(script), method]
    done = subprocess.run(
        [*cmd, str(row_bytes)], capture_output=True, env=env, timeout=120, check=False
    )
    if done.returncode == 97 or b"unshare failed" in done.stderr:
        pytest.skip(f"cannot mount a private tmpfs here: {done.stderr.decode()[-200:]}")
    assert (done.returncode, done.stderr.decode()) == (0, "")
    return done.stdout.decode()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_shm_too_small_for_the_window_says_so(method: str, tmp_path: Path) -> None:
    """A 3 MiB /dev/shm holds one 1 MiB batch, not the window of 2 workers x 2 prefetched:
    the error that reaches the main process is the SharedMemoryError with the bytes the
    window needs, the bytes free and the fix (nothing on the workers' stderr)."""
    out = _run_in_small_shm(tmp_path, method, 3 * _MIB, _MIB)
    kind, _, text = out.split(" ", 2)
    assert kind == "SharedMemoryError", out
    assert "2 workers x 2 prefetch_factor" in text and "bytes are free" in text
    assert "--shm-size" in text and "prefetch_factor" in text


def test_one_batch_bigger_than_shm_says_so(tmp_path: Path) -> None:
    """A single 8 MiB batch in a 3 MiB /dev/shm: SharedMemoryError at the first batch."""
    out = _run_in_small_shm(tmp_path, "fork", 3 * _MIB, 8 * _MIB)
    kind, got, text = out.split(" ", 2)
    assert (kind, got) == ("SharedMemoryError", "0"), out
    assert "bytes are free" in text and "--shm-size" in text


# -- differential tests against torch, last: once torch is imported, spawned workers import
# it too, and a spawned interpreter with torch loaded takes 1.5-3 s to exit here.


def test_a_bad_str_exception_keeps_its_type_as_in_torch() -> None:
    """Differential: torch's fork worker re-raises the original type too."""
    torch_data = pytest.importorskip("torch.utils.data")
    loader = torch_data.DataLoader(Hostile("bad __str__"), batch_size=1, num_workers=1)
    raised(BadStr, lambda: list(loader))
    with pytest.raises(BadStr):
        for _ in _loader(Hostile("bad __str__"), "fork"):
            pass


def _wait_readable(fd: int, worker_id: int) -> None:
    select.select([fd], [], [], 60)


def test_timeout_covers_a_stuck_worker_init_fn_as_in_torch() -> None:
    """Differential (fork): torch and stoker both raise RuntimeError "timed out after 1
    seconds" about a second after the first ``next``; the init function is then released
    (a byte on a pipe) so that both shut their worker down at once."""
    torch_data = pytest.importorskip("torch.utils.data")
    took = {}
    for name, make in [("torch", torch_data.DataLoader), ("stoker", DataLoader)]:
        r, w = os.pipe()
        try:
            loader = make(
                Hostile("none"),
                batch_size=1,
                num_workers=1,
                timeout=1,
                worker_init_fn=functools.partial(_wait_readable, r),
                multiprocessing_context="fork",
            )
            it = iter(loader)
            t0 = time.monotonic()
            error = raised(RuntimeError, functools.partial(_within, _BOUND_S, next, it))
            took[name] = time.monotonic() - t0
            assert "timed out after 1 seconds" in str(error), (name, error)
            os.write(w, b"x")
            del it, loader
        finally:
            os.close(r)
            os.close(w)
    assert all(1.0 <= t < 3.0 for t in took.values()), took


def _interrupt() -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize("mode", [*SAME_IN_ANY_PROCESS, "in process"])
def test_ctrl_c_in_a_batch_finalizer_is_raised_at_the_next_batch(mode: str) -> None:
    """A KeyboardInterrupt that lands in one of stoker's finalizers (a batch's memory going
    home), which Python would ignore, is raised by the iterator's next step."""
    import weakref

    from stoker._engine._interrupts import deferred

    loader = DataLoader(range(8), batch_size=2) if mode == "in process" else None
    it = iter(loader if loader is not None else _loader(Hostile("none"), mode))
    next(it)

    class Owner:
        pass

    owner = Owner()
    weakref.finalize(owner, deferred(_interrupt))
    del owner  # Python would print "KeyboardInterrupt ignored" and go on
    with pytest.raises(KeyboardInterrupt):
        next(it)
    del it
