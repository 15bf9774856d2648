"""A worker's exception, packed to cross to the main process and raised there again.

Exceptions travel as :class:`RemoteError` payloads that rebuild the original type with a
note (worker, indices, traceback), or a ``RuntimeError`` whose ``__cause__`` carries the
worker's traceback when the type cannot be rebuilt (PyTorch issue 30147).
"""

from __future__ import annotations

import contextlib
import pickle
import re
import traceback


class RemoteError:
    """An exception raised in a worker, packed to cross to the main process.

    The one place where a worker's exception (any ``BaseException``, of process or thread
    workers) becomes what the main process raises. Building it never raises: an exception
    whose ``__str__``, traceback or pickling fails is still described by its type name and
    what could be read of it.

    Args:
        exc: the exception.
        where: who raised it and on what, e.g. "worker 1 (pid 42), indices [3, 4]".
        keep_object: pass the exception object itself (thread workers), not a pickle.
    """

    def __init__(self, exc: BaseException, where: str, keep_object: bool = False) -> None:
        self.where = where
        self.type_name = f"{type(exc).__module__}.{type(exc).__qualname__}"
        self.text = safe_str(exc)
        self.tb = _format(exc)
        self.exc: BaseException | None = exc if keep_object else None
        self.pickled: bytes | None = None
        if not keep_object:
            try:
                pickled = pickle.dumps(exc)
                pickle.loads(pickled)  # several-argument constructors fail here (#30147)
                self.pickled = pickled
            except Exception:
                self.pickled = None

    def summary(self) -> str:
        """'SystemExit(3) in worker 0 (pid 42) on sample indices [3]': what ended a worker."""
        name = self.type_name.removeprefix("builtins.")
        return f"{name}({self.text}) in {self.where}" if self.text else f"{name} in {self.where}"

    def rebuild(self) -> BaseException:
        """The exception to raise in the main process, with the worker's context noted."""
        note = f"Raised in DataLoader {self.where}. The worker's traceback:\n{self.tb}"
        exc = self.exc
        if exc is None and self.pickled is not None:
            try:
                exc = pickle.loads(self.pickled)
            except Exception:
                exc = None
        if exc is None or not isinstance(exc, BaseException):
            err = RuntimeError(
                f"DataLoader {self.where} raised {self.type_name}: {self.text}; the exception "
                "could not be rebuilt in the main process (its type cannot be pickled with "
                "its arguments), so it is reported as this RuntimeError, caused by the "
                "worker's traceback."
            )
            err.__cause__ = _RemoteTraceback(self.tb)
            return err
        if self.where.startswith("worker "):  # a process's "worker 1 (pid 42) ...", a thread's
            who = re.sub(r"^worker (?=\d)", "worker process ", self.where)  # torch's words
            with contextlib.suppress(Exception):  # an exception may refuse new arguments
                _restate(exc, f"Caught {type(exc).__name__} in DataLoader {who}")
        add_note(exc, note)
        return exc


class _Message(str):
    """A message that a ``KeyError`` shows as it is, not quoted (``KeyError`` shows the
    ``repr`` of its one argument)."""

    def __repr__(self) -> str:
        return str(self)


def _restate(exc: BaseException, head: str) -> None:
    """Put ``head`` (torch's "Caught ValueError in DataLoader worker process 0", then the
    pid and sample indices) before ``str(exc)``, keeping the exception's type and attributes:
    where its message is its one argument (or it has none), a ``KeyError``'s key, or an
    ``OSError``'s ``strerror``. Others (their own ``__str__``) keep the note only."""
    args = exc.args
    kind = type(exc).__str__
    if kind is BaseException.__str__ and (not args or (len(args) == 1 and type(args[0]) is str)):
        exc.args = (f"{head}: {args[0]}" if args and args[0] else f"{head}.",)
    elif isinstance(exc, KeyError) and kind is KeyError.__str__ and len(args) == 1:
        exc.args = (_Message(f"{head}: {args[0]!r}"),)
    elif isinstance(exc, OSError) and kind is OSError.__str__ and exc.strerror:
        exc.strerror = f"{exc.strerror} ({head})"


def safe_str(exc: BaseException) -> str:
    """``str(exc)``, or a placeholder naming what went wrong when ``__str__`` raises.

    >>> class Bad(Exception):
    ...     def __str__(self): raise ValueError("no")
    >>> safe_str(Bad()), safe_str(KeyError("k"))
    ('<str() of the exception raised ValueError: no>', "'k'")
    """
    try:
        return str(exc)
    except Exception as err:
        try:
            return f"<str() of the exception raised {type(err).__name__}: {err}>"
        except Exception:
            return "<str() of the exception failed>"


def _format(exc: BaseException) -> str:
    """The formatted traceback of ``exc`` (``traceback`` copes with a failing ``__str__``;
    this copes with anything else that fails on the way)."""
    try:
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except Exception:
        return f"{type(exc).__qualname__}: {safe_str(exc)} (its traceback could not be formatted)"


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` that never raises (an exception may refuse notes)."""
    with contextlib.suppress(Exception):
        exc.add_note(note)


class _RemoteTraceback(Exception):
    """Carries a worker's formatted traceback as an exception cause."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return "\n" + self.tb
