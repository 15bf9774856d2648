"""The ``stoker`` command. Subcommands import what they need lazily, so ``--help`` is instant.

Every subcommand goes through one error path (see :mod:`stoker._command`): a bad value on
the command line is a usage error with exit status 2, a failure while the command runs is
``stoker CMD: error: ...`` with exit status 1, and neither shows a traceback unless
``--debug`` is given.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from stoker import _command


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stoker`` console script; returns the exit status."""
    from stoker import _bench, _doctor
    from stoker.formats import _cli as formats_cli

    adders = [_add_demo, _bench.add_subcommand, _doctor.add_subcommand]
    adders.append(formats_cli.add_subcommands)
    description = "stoker keeps the accelerator fed: fast data loading."
    return run(_command.parser(adders, description).parse_args(argv))


def _add_demo(sub: Any) -> None:
    positive = _command.number(int, 1)
    demo = sub.add_parser("demo", help="load a dataset stoker makes itself and say how fast")
    demo.add_argument("--samples", type=positive, default=200_000, help="samples in the dataset")
    demo.add_argument("--batch-size", type=positive, default=256)
    demo.add_argument("--epochs", type=positive, default=3)


def run(args: argparse.Namespace) -> int:
    """Run the parsed subcommand (``args.command``) through the one error path; returns the
    exit status."""
    return _command.run(args, _dispatch)


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


if __name__ == "__main__":
    sys.exit(main())
