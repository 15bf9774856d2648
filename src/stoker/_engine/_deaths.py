"""What a pool says when a worker dies or cannot start: one record, the texts users read.

:class:`WorkerDeath` is what a pool knows of a dead worker (its id, pid, exit code and
what ended it early); :meth:`WorkerDeath.error` is the ``WorkerError`` raised for it, with
torch's words first (users search for them). A pool that replaces dead workers would read
the same record instead of raising it (see ``ProcessPool.lost``).
:func:`explain_unpicklable` names the object a start method could not send to a worker.
"""

from __future__ import annotations

import pickle
import signal
from typing import Any, NamedTuple

from stoker._engine._errors import add_note, safe_str
from stoker.errors import WorkerError


class WorkerDeath(NamedTuple):
    """A worker that ended while the pool still needed it.

    ``wid``: its worker id; ``pid``: its process id (None for a thread); ``code``: a
    process's exit code (negative: the signal that killed it), None when unknown or for a
    thread; ``why``: what ended it early, as the worker said (``sys.exit()`` in the
    dataset), or None; ``thread``: a worker thread, not a process.
    """

    wid: int
    pid: int | None
    code: int | None
    why: str | None
    thread: bool = False

    def error(self) -> WorkerError:
        """The error the iterator raises for this death."""
        if self.thread:
            why = self.why or "its thread ended without saying why"
            return WorkerError(f"DataLoader worker thread {self.wid} exited unexpectedly: {why}.")
        ended = f"; it was ended by {self.why}" if self.why else ""
        return WorkerError(
            f"{torch_phrase(self.pid, self.code)}Worker {self.wid} exited unexpectedly: "
            f"{signal_text(self.code)}{ended}."
        )


def torch_phrase(pid: int | None, code: int | None) -> str:
    """torch's words for a worker's death, which users search for: "DataLoader worker (pid
    N) is killed by signal: Killed. " (or "... exited unexpectedly with exit code 1. ")."""
    if code is not None and code < 0:
        try:
            name = signal.strsignal(-code) or f"signal {-code}"
        except ValueError:
            name = f"signal {-code}"
        return f"DataLoader worker (pid {pid}) is killed by signal: {name}. "
    if code is not None:
        return f"DataLoader worker (pid {pid}) exited unexpectedly with exit code {code}. "
    return f"DataLoader worker (pid {pid}) exited unexpectedly. "


def signal_text(code: int | None) -> str:
    """How a process ended, and the likely cause of a signal."""
    if code is None:
        return "its exit status is unknown"
    if code >= 0:
        return f"it exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    cause = {
        "SIGKILL": "most often the out-of-memory killer (see `dmesg`); lower batch_size, "
        "num_workers or prefetch_factor, or the dataset's memory use",
        "SIGSEGV": "a crash in native code (a C extension used by the dataset or collate)",
        "SIGBUS": "a bad memory access, e.g. shared memory (/dev/shm) exhausted",
        "SIGTERM": "something outside stoker terminated it",
    }.get(name, "an external signal or a crash")
    return f"it was killed by {name}; likely cause: {cause}"


def explain_unpicklable(exc: BaseException, parts: dict[str, Any], method: str) -> None:
    """Add a note naming the object (of ``parts``) that the start method could not pickle."""
    for name, obj in parts.items():
        try:
            pickle.dumps(obj)
        except Exception as err:
            try:
                shown = f"{obj!r:.80}"
            except Exception:  # a repr that fails too: the type name says enough
                shown = "object"
            add_note(
                exc,
                f"The DataLoader's {name} ({type(obj).__qualname__} {shown}) cannot be "
                f"pickled ({safe_str(err)}), and the '{method}' start method must pickle it to "
                "send it to worker processes. Define it at module level (not inside a function, "
                "not a lambda), or use multiprocessing_context='fork' or worker_mode='thread'.",
            )
            return
