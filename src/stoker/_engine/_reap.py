"""The life of worker processes beyond their pool: starting one, closing the main process's
pipe ends in a forked child, and reaping the exits of workers that were stopped.

A worker's exit tears down its copy of the main process's address space, which takes a
while with torch loaded: :func:`reaper` waits for it in a thread, so the loop need not.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing.util  # noqa: F401  # its exit hook first: _join_reapers runs before it
import os
import queue
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from stoker._engine._segments import unlink_prefix

EXIT_WAIT_S = 5.0
"""How long a worker that said goodbye may take to exit before it is killed."""
KILLED_REAP_S = 60.0
"""How long the reaper waits for a killed worker to end: a SIGKILL always ends it, but on a
busy machine its teardown may take seconds, and a worker left unjoined stays a zombie, its
sentinel descriptor open, until the interpreter exits."""

# The main process's ends of all live workers' pipes. A process forked later (another
# loader's worker, or the user's own fork) must not keep them open, or a worker would never
# see end-of-file on its pipe when the main process dies.
PARENT_ENDS: weakref.WeakSet[Any] = weakref.WeakSet()

# Threads reaping workers that said goodbye. multiprocessing joins its live children at
# interpreter exit; a reaper closing one of them meanwhile makes that join fail with
# "process object is closed", so the exit waits for the reapers first (see _join_reapers).
_REAPERS: set[threading.Thread] = set()


class Leaving(Protocol):
    """What the reaper needs of a stopped worker's handle."""

    proc: Any
    prefix: str
    said_bye: bool


@atexit.register  # after multiprocessing.util's registration: runs before its exit hook
def _join_reapers() -> None:
    """Wait for the reaper threads still running (each is bounded by its own timeouts)."""
    for t in list(_REAPERS):
        t.join(EXIT_WAIT_S + KILLED_REAP_S)


def _close_parent_ends_in_child() -> None:
    for conn in list(PARENT_ENDS):
        with contextlib.suppress(OSError):
            conn.close()
    PARENT_ENDS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_parent_ends_in_child)


def start_process(proc: Any) -> None:
    """``proc.start()``, without Python 3.12+'s warning that forking a multi-threaded
    process may deadlock the child when the only other threads are stoker's reapers: they
    only wait for workers' exits and hold no lock a child could need. Any other thread
    (the user's) still gets the warning."""
    me = threading.current_thread()
    ours = all(t is me or t in _REAPERS for t in threading.enumerate())
    if not _REAPERS or not ours:
        proc.start()
        return
    with warnings.catch_warnings():  # safe: no other thread warns meanwhile
        warnings.filterwarnings("ignore", r".*multi-threaded, use of fork\(\)", DeprecationWarning)
        proc.start()


def reaper() -> Callable[[list[Any]], None]:
    """Start a thread that waits for the exits of the workers handed to it; return the hand.

    A worker that does not exit in time is killed; one that failed has its segments
    unlinked for it. The thread starts before the workers are told to stop: started while
    they tear down, it would wait for a core, and ``Thread.start`` with it. The hand must
    be called once, even with no workers.
    """
    handed: queue.SimpleQueue[list[Leaving]] = queue.SimpleQueue()

    def run() -> None:
        for w in handed.get():
            w.proc.join(EXIT_WAIT_S)
            if w.proc.exitcode is None:
                with contextlib.suppress(OSError):
                    w.proc.kill()
                w.proc.join(KILLED_REAP_S)
            if w.proc.exitcode != 0 or not w.said_bye:
                unlink_prefix(w.prefix)  # it could not unlink its own segments
            with contextlib.suppress(ValueError):
                w.proc.close()  # frees the sentinel descriptor now, not at GC
        _REAPERS.discard(threading.current_thread())

    def now(workers: list[Any]) -> None:
        handed.put(workers)
        run()

    if not threading.main_thread().is_alive():  # interpreter exit: no thread may race
        return now  # multiprocessing's own join of its children
    thread = threading.Thread(target=run, name="stoker-reaper", daemon=True)
    _REAPERS.add(thread)
    try:
        thread.start()
    except RuntimeError:  # the interpreter is shutting down: no new threads
        _REAPERS.discard(thread)
        return now
    return handed.put
