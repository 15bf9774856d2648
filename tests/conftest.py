"""Suite-wide fixtures: every test must leave no child process, descriptor, thread or segment.

The check runs after each test (autouse). Worker pools shut down from ``weakref.finalize``,
and a process that was told to exit, a thread that was joined elsewhere or a segment
unlinked by a worker may take a while to disappear (on a busy machine, seconds): so while
something is left, the fixture looks again, collects garbage, and only what is still
there after :data:`_LEAK_WAIT_S` fails the test that left it. When nothing is left, as
after most tests, the check costs one look. A look costs a fraction of a millisecond, a
full collection more (tenths of a second with the suite's modules loaded, were they not
frozen), so the fixture collects only when looks alone have not seen the leftovers go
(:data:`_COLLECT_S`).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

import _early

_LEAK_WAIT_S = 30.0
"""How long a leftover may take to disappear after the test ends: generous, since a loaded
machine may leave an exiting worker without a CPU for seconds; a real leak stays."""
_RECHECK_S = (0.002, 0.05)
"""The first and the longest pause between two looks (doubling from one to the other)."""
_COLLECT_S = (0.01, 0.25)
"""When the first full garbage collection comes (seconds after the first look), and how
often the next ones do: what a collection frees (a reference cycle that holds a pool)
goes at the next look; an exiting worker or a joined thread goes by itself. With the
collection's objects frozen (:func:`pytest_collection_finish`), one takes milliseconds."""

_SHM_DIR = "/dev/shm"

_E = TypeVar("_E", bound=BaseException)


def _children() -> set[int]:
    pids: set[int] = set()
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                pids.update(int(p) for p in f.read().split())
    except OSError:  # not Linux: multiprocessing's view only
        pids.update(p.pid for p in multiprocessing.active_children() if p.pid)
    return pids - _service_pids()


def _service_pids() -> set[int]:
    """multiprocessing's own long-lived helpers (forkserver, resource tracker)."""
    out: set[int] = set()
    try:
        from multiprocessing import forkserver, resource_tracker

        pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
        if pid:
            out.add(pid)
        pid = getattr(resource_tracker._resource_tracker, "_pid", None)
        if pid:
            out.add(pid)
    except Exception:
        pass
    return out


def _service_fds() -> set[int]:
    out: set[int] = set()
    try:
        from multiprocessing import forkserver, resource_tracker

        for fd in (
            getattr(forkserver._forkserver, "_forkserver_alive_fd", None),
            getattr(resource_tracker._resource_tracker, "_fd", None),
        ):
            if fd is not None:
                out.add(fd)
    except Exception:
        pass
    return out


def _fds() -> set[int]:
    try:
        return {int(fd) for fd in os.listdir("/proc/self/fd")} - _service_fds()
    except OSError:
        return set()


def _segments() -> set[str]:
    """This process's stoker segments (other sessions on the machine make their own)."""
    mine = f"stoker_{os.getpid()}_"
    try:
        return {n for n in os.listdir(_SHM_DIR) if n.startswith(mine)}
    except OSError:
        return set()


def _threads() -> set[int]:
    return {t.ident for t in threading.enumerate() if t.ident is not None}


def _snapshot() -> dict[str, set[object]]:
    return {
        "child processes": set(_children()),
        "open file descriptors": set(_fds()),
        "threads": set(_threads()),
        "/dev/shm segments": set(_segments()),
    }


def leftovers(before: dict[str, set[object]]) -> dict[str, set[object]]:
    """What exists now that did not before, after garbage collection and a bounded wait
    for it to go (see the module docstring)."""
    start = time.monotonic()
    deadline = start + _LEAK_WAIT_S
    pause, longest = _RECHECK_S
    collect_at = start + _COLLECT_S[0]
    while True:
        now = _snapshot()
        extra = {k: now[k] - before[k] for k in now if now[k] - before[k]}
        if not extra or time.monotonic() > deadline:
            return extra
        if time.monotonic() >= collect_at:
            gc.collect()  # then look again at once
            collect_at = time.monotonic() + _COLLECT_S[1]
            continue
        time.sleep(pause)  # polls a condition no event announces, up to the bound
        pause = min(2 * pause, longest)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests whose subprocesses start early go last (see ``tests/_early.py``)."""
    items.sort(key=_early.is_early)  # stable: the others keep their order


def pytest_collection_finish(session: pytest.Session) -> None:
    """Before the first test: freeze what collection made (every test module, torch,
    Accelerate, datasets...) out of the garbage collector's sight, and start the subprocess
    checks of the selected tests, beside the others (see ``tests/_early.py``), so that
    every leak check sees their processes. Frozen, those objects (none of them a test's)
    cost nothing at each full collection, which took 0.2-0.4 s with them, nor copies of
    their pages in forked workers, which a collection's writes made."""
    if session.config.option.collectonly:
        return
    gc.collect()
    gc.freeze()
    _early.start(session.items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    _early.stop_all()


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test if it leaves a child process, descriptor, thread or segment behind."""
    before = _snapshot()
    yield
    extra = leftovers(before)
    if extra:
        fds = extra.get("open file descriptors", set())
        named = {fd: _fd_target(fd) for fd in fds}  # type: ignore[arg-type]
        pytest.fail(f"{request.node.nodeid} left behind: {extra} {named}", pytrace=False)


def _fd_target(fd: int) -> str:
    """What descriptor ``fd`` is (a path, ``socket:[inode]``, ``pipe:[inode]``...)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


def raised(expected: type[_E], fn: Callable[[], object]) -> _E:
    """What ``fn`` raises (it must be ``expected``), its chain's tracebacks dropped.

    torch's loader re-raises a worker's error from a frame that holds the exception, so the
    traceback is a cycle that keeps the iterator. Collected later by gc, with its queues
    closed first, that iterator waits 5 s for each live worker: without the traceback it
    is freed, and shuts down, as soon as the error is caught.
    """
    try:
        fn()
    except expected as exc:
        caught = exc
    else:
        pytest.fail(f"{expected.__name__} was not raised")
    link: BaseException | None = caught
    while link is not None:
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    return caught
