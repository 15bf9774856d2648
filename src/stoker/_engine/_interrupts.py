"""Ctrl-C that lands in one of stoker's ``weakref.finalize`` callbacks is kept, not lost.

A batch's memory goes back to its worker (or the loader's buffer pool) from a finalizer
when the batch's last view dies, which happens in the training loop's own thread, at any
line. Python ignores exceptions raised in finalizers ("KeyboardInterrupt ignored in
finalize object"), so a SIGINT handled there would vanish. :func:`deferred` wraps such a
callback to keep the interrupt, and the iterators call :func:`raise_pending` at each step.
One window stays: a SIGINT handled on the first line of ``weakref.finalize.__call__``
(Python's code, before ``run``'s ``try``) is still ignored by Python.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_pending = False


def deferred(callback: Callable[..., Any]) -> Callable[..., None]:
    """``callback`` for ``weakref.finalize``: a KeyboardInterrupt raised in it is kept for
    :func:`raise_pending` instead of being ignored."""

    def run(*args: Any) -> None:
        global _pending
        try:
            callback(*args)
        except KeyboardInterrupt:
            _pending = True

    return run


def raise_pending() -> None:
    """Raise the KeyboardInterrupt a finalizer kept, if any (called by the iterators)."""
    global _pending
    if _pending:
        _pending = False
        raise KeyboardInterrupt
