"""The ``stoker`` command. Subcommands import what they need lazily, so ``--help`` is instant."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stoker`` console script; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="stoker", description="stoker keeps the accelerator fed: fast data loading."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="load a dataset stoker makes itself and say how fast")
    demo.add_argument("--samples", type=int, default=200_000, help="samples in the dataset")
    demo.add_argument("--batch-size", type=int, default=256)
    demo.add_argument("--epochs", type=int, default=3)
    from stoker import _bench, _doctor
    from stoker.formats import _cli as formats_cli

    _bench.add_subcommand(sub)
    _doctor.add_subcommand(sub)
    formats_cli.add_subcommands(sub)
    args = parser.parse_args(argv)
    if args.command == "bench":
        return _bench.run(args)
    if args.command == "doctor":
        return _doctor.run(args)
    if args.command in formats_cli.COMMANDS:
        return formats_cli.run(args)
    if args.command == "demo":
        from stoker._demo import run_demo

        return run_demo(samples=args.samples, batch_size=args.batch_size, epochs=args.epochs)
    return 2  # unreachable: argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
