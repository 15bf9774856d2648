"""Run every benchmark program, each in its own process, then regenerate BENCHMARKS.md.

    python benchmarks/run_all.py [--quick] [--only w1_sleep,w3_tiny] [--list]
                                 [--torchvision-python PYTHON] [--no-report]

Each program (see ``PROGRAMS``) runs as a subprocess with its own arguments, ``--quick``
passed through, its table printed as it goes. W4's image benchmark compares against
torchvision, which need not be installed beside stoker: it runs with the interpreter given
by ``--torchvision-python``, else with this one when torchvision imports here, else it is
skipped with a note. The peers of W2 and W3 (grain, torchdata's StatefulDataLoader) run
when this interpreter has them. Each results file records the command that made it (see
``harness.py``), which ``report.py`` quotes under its table. The exit status is 1 when any
program failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
_PROGRAM_TIMEOUT_S = 3600.0
"""The longest one program may run before it is stopped and counted as failed."""


@dataclass(frozen=True)
class Program:
    """One benchmark run: a program in ``benchmarks/`` and its arguments."""

    script: str
    args: tuple[str, ...] = ()
    needs_torchvision: bool = False

    @property
    def name(self) -> str:
        """The script and its arguments, e.g. ``w3_tiny --workers 2``."""
        return " ".join([self.script, *self.args])


PROGRAMS = (
    Program("w1_sleep", ("--workers", "2")),
    Program("w1_sleep", ("--workers", "4")),
    Program("w2_transport", ("--workers", "2")),
    Program("w3_tiny", ("--workers", "0")),
    Program("w3_tiny", ("--workers", "2", "--warmup", "4")),
    Program("w3_tiny", ("--workers", "2", "--warmup", "4", "--repeats", "31", "--stoker-only")),
    Program("w4_images", ("--workers", "0", "2"), needs_torchvision=True),
    Program("w4_formats", ("--workers", "0", "2")),
    Program("w5_first_batch", ("--workers", "2")),
    Program("w6_memory", ("--workers", "2")),
    Program("import_time"),
    Program("resume_cost"),
    Program("elastic_resume"),
    Program("autotune"),
)


def interpreter(program: Program, torchvision_python: str | None) -> tuple[str | None, str]:
    """The Python to run ``program`` with, or None and why it is skipped."""
    if not program.needs_torchvision:
        return sys.executable, ""
    if torchvision_python:
        return torchvision_python, ""
    if importlib.util.find_spec("torchvision") is not None:
        return sys.executable, ""
    return None, (
        f"skipped {program.name}: torchvision is not importable here; pass "
        "--torchvision-python PATH (an interpreter with torch, torchvision and stoker)."
    )


def command(program: Program, python: str, quick: bool) -> list[str]:
    """The argv running ``program``."""
    return [python, str(HERE / f"{program.script}.py"), *program.args, *(["--quick"] * quick)]


def shown(argv: list[str]) -> str:
    """``argv`` as a command to type from the repository root, this interpreter as python.

    >>> shown([sys.executable, str(HERE / "w3_tiny.py"), "--workers", "2"])
    'python benchmarks/w3_tiny.py --workers 2'
    """
    python = "python" if argv[0] == sys.executable else argv[0]
    script = Path(argv[1])
    rel = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join([python, str(rel), *argv[2:]])


def main(argv: list[str] | None = None) -> int:
    """Run the selected programs in order; returns 1 if any failed."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="passed to every program")
    parser.add_argument("--only", default="", help="comma-separated scripts, e.g. w1_sleep")
    parser.add_argument("--torchvision-python", default=None, metavar="PATH")
    parser.add_argument("--list", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--no-report", action="store_true", help="leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = only - {p.script for p in PROGRAMS}
    if unknown:
        parser.error(
            f"--only names scripts among {sorted({p.script for p in PROGRAMS})}, "
            f"got {sorted(unknown)}."
        )
    summary: list[tuple[str, str]] = []
    for program in PROGRAMS:
        if only and program.script not in only:
            continue
        python, why = interpreter(program, args.torchvision_python)
        if python is None:
            print(why, flush=True)
            summary.append((program.name, "skipped (no torchvision)"))
            continue
        cmd = command(program, python, args.quick)
        if args.list:
            print(shown(cmd))
            continue
        print(f"\n=== {shown(cmd)}", flush=True)
        t0 = time.perf_counter()
        try:
            status = subprocess.run(cmd, cwd=ROOT, timeout=_PROGRAM_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            status = -1
        seconds = time.perf_counter() - t0
        outcome = "ok" if status == 0 else f"FAILED (status {status})"
        summary.append((program.name, f"{outcome}, {seconds:.1f} s"))
    if args.list:
        return 0
    print("\nsummary:")
    for name, outcome in summary:
        print(f"  {name:<32} {outcome}")
    failed = any("FAILED" in outcome for _, outcome in summary)
    if not args.no_report:
        report = [sys.executable, str(HERE / "report.py")]
        failed |= subprocess.run(report, cwd=ROOT, timeout=_PROGRAM_TIMEOUT_S).returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
