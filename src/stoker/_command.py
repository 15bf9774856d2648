"""What every ``stoker`` subcommand shares: argparse number types, the parser, one error path.

A bad value on the command line is a usage error, ``stoker CMD: error: ...`` and exit
status 2 (argparse's types check each value; a subcommand that finds a bad combination
later reports it with :func:`error` and returns 2); any failure while the command runs is
caught by :func:`run` and printed as ``stoker CMD: error: ...`` (what went wrong and the
fix, from the exception's message), exit status 1. Neither shows a traceback unless
``--debug`` is given. Subcommand modules import this, never ``stoker._cli`` (which imports
them), so each can also run on its own (``python -m stoker._bench``).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

INTERRUPTED = 130
"""The exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it."""


def parser(
    adders: Sequence[Callable[[Any], None]], description: str = ""
) -> argparse.ArgumentParser:
    """The ``stoker`` parser with the subcommands that ``adders`` add to its subparsers, each
    taking ``--debug`` too (``stoker CMD ... --debug``)."""
    top = argparse.ArgumentParser(prog="stoker", description=description or None)
    top.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = top.add_subparsers(dest="command", required=True)
    for add in adders:
        add(sub)
    for command in sub.choices.values():
        command.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
    return top


def run(args: argparse.Namespace, dispatch: Callable[[argparse.Namespace], int]) -> int:
    """Run the parsed subcommand with ``dispatch`` through the one error path; returns the
    exit status."""
    try:
        return dispatch(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        error(args.command, "interrupted (Ctrl-C)")
        return INTERRUPTED
    except Exception as exc:
        if args.debug:
            raise
        error(args.command, describe(exc))
        return 1


def number(kind: Callable[[str], Any], minimum: float) -> Callable[[str], Any]:
    """An argparse type: a number of type ``kind`` that is at least ``minimum``, and, for an
    int (a count or a size), at most ``sys.maxsize`` (a bad one is a usage error naming the
    option, the rule and the value).

    >>> number(int, 1)("3")
    3
    """

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value >= minimum or not math.isfinite(value):
            noun = "an integer" if kind is int else "a finite number"
            raise argparse.ArgumentTypeError(f"must be {noun} >= {minimum}, got {text!r}.")
        if kind is int and value > sys.maxsize:
            raise argparse.ArgumentTypeError(
                f"must be an integer from {minimum} to {sys.maxsize} (2**63 - 1), got {text!r}."
            )
        return value

    return parse


def error(command: str, message: str) -> None:
    """Print the one-line error of ``stoker COMMAND`` on stderr."""
    print(f"stoker {command}: error: {message}", file=sys.stderr, flush=True)


def describe(exc: BaseException) -> str:
    """The error line for ``exc``: its message, which says what and the fix; an exception
    of a kind stoker does not raise on purpose (a bug, or a dataset's own) is named by its
    type and points at ``--debug``.

    >>> describe(ValueError("batch_size must be positive, got 0."))
    'batch_size must be positive, got 0.'
    >>> describe(KeyError("x"))
    "KeyError: 'x' (run again with --debug for the traceback)"
    """
    message = str(exc) or type(exc).__name__
    if isinstance(exc, (OSError, ValueError, TypeError, ImportError, RuntimeError)):
        return message
    return f"{type(exc).__name__}: {message} (run again with --debug for the traceback)"
