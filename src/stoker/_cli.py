"""The ``stoker`` command. Subcommands import what they need lazily, so ``--help`` is instant.

Every subcommand goes through one error path: a bad value on the command line is a usage
error, ``stoker CMD: error: ...`` and exit status 2 (argparse's types check each value; a
subcommand that finds a bad combination later reports it with :func:`error` and returns
2); any failure while the command runs is caught by :func:`run` and printed as ``stoker
CMD: error: ...`` (what went wrong and the fix, from the exception's message), exit status
1. Neither shows a traceback unless ``--debug`` is given.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

_INTERRUPTED = 130
"""The exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stoker`` console script; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="stoker", description="stoker keeps the accelerator fed: fast data loading."
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)
    from stoker import _bench, _doctor
    from stoker.formats import _cli as formats_cli

    positive = number(int, 1)
    demo = sub.add_parser("demo", help="load a dataset stoker makes itself and say how fast")
    demo.add_argument("--samples", type=positive, default=200_000, help="samples in the dataset")
    demo.add_argument("--batch-size", type=positive, default=256)
    demo.add_argument("--epochs", type=positive, default=3)
    _bench.add_subcommand(sub)
    _doctor.add_subcommand(sub)
    formats_cli.add_subcommands(sub)
    for command in sub.choices.values():  # `stoker CMD ... --debug` works too
        command.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
    args = parser.parse_args(argv)
    return run(args)


def run(args: argparse.Namespace) -> int:
    """Run the parsed subcommand (``args.command``) through the one error path; returns the
    exit status."""
    try:
        return _dispatch(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        error(args.command, "interrupted (Ctrl-C)")
        return _INTERRUPTED
    except Exception as exc:
        if args.debug:
            raise
        error(args.command, describe(exc))
        return 1


def _dispatch(args: argparse.Namespace) -> int:
    from stoker import _bench, _doctor
    from stoker.formats import _cli as formats_cli

    if args.command == "bench":
        return _bench.run(args)
    if args.command == "doctor":
        return _doctor.run(args)
    if args.command in formats_cli.COMMANDS:
        return formats_cli.run(args)
    if args.command == "demo":
        from stoker._demo import run_demo

        return run_demo(samples=args.samples, batch_size=args.batch_size, epochs=args.epochs)
    raise ValueError(f"unknown command {args.command!r}")  # argparse rejects it first


def number(kind: Callable[[str], Any], minimum: float) -> Callable[[str], Any]:
    """An argparse type: a number of type ``kind`` that is at least ``minimum`` (a bad one
    is a usage error naming the option, the rule and the value).

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


if __name__ == "__main__":
    sys.exit(main())
