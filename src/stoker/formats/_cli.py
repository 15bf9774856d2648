"""The ``stoker pack`` and ``stoker inspect`` subcommands, for ``stoker._cli`` to add.

Only argparse runs at import; the formats load when a subcommand runs, so ``stoker --help``
stays instant. Wire them in ``stoker._cli.main`` with ``add_subcommands(sub)`` after the
subparsers are made, and ``return run(args)`` for ``args.command in COMMANDS``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stoker import _command
from stoker._command import number

COMMANDS = ("pack", "inspect")


def add_subcommands(subparsers: Any) -> None:
    """Add ``pack`` and ``inspect`` to the ``stoker`` command's ``subparsers``."""
    p = subparsers.add_parser(
        "pack",
        help="convert an image folder or a dataset to LMDB or tar shards",
        description="Convert SRC (a folder with one subfolder per class, or 'module:factory' "
        "returning a map-style dataset) into DST: an LMDB file or a folder of tar shards. "
        "DST appears only when complete.",
    )
    p.add_argument("src", help="image folder, or module:factory")
    p.add_argument("dst", help="the LMDB file, or the folder of shards")
    p.add_argument("--format", choices=("lmdb", "shards"), default="lmdb")
    p.add_argument(
        "--maxcount", type=number(int, 1), default=10_000, help="samples per shard at most"
    )
    p.add_argument("--maxsize", type=number(float, 1), default=1e9, help="bytes per shard at most")
    p.add_argument("--overwrite", action="store_true", help="replace an existing DST")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    i = subparsers.add_parser(
        "inspect",
        help="say what an LMDB file or a set of shards holds",
        description="Print the count, keys, fields and sizes of an LMDB file, a shard, a "
        "folder of shards, a brace pattern or a URL.",
    )
    i.add_argument("path")
    i.add_argument("--keys", type=number(int, 0), default=3, help="how many keys to show")


def run(args: argparse.Namespace) -> int:
    """Run the parsed ``pack`` or ``inspect`` command; returns the exit status.

    Errors propagate to the ``stoker`` command's one error path (``stoker._cli.run``).
    """
    from stoker.formats import _pack

    if args.command == "pack":
        summary = _pack.pack(
            args.src,
            args.dst,
            args.format,
            maxcount=args.maxcount,
            maxsize=args.maxsize,
            overwrite=args.overwrite,
            progress=not args.quiet,
        )
        print(summary)
        return 0
    if args.command == "inspect":
        print(_pack.inspect(args.path, samples=args.keys))
        return 0
    raise ValueError(f"command must be one of {', '.join(COMMANDS)}, got {args.command!r}.")


def main(argv: list[str] | None = None) -> int:
    """Run ``pack`` / ``inspect`` as ``stoker`` does (``python -m stoker.formats._cli``)."""
    return _command.run(_command.parser([add_subcommands]).parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
