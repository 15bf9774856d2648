"""Regenerate the tables of BENCHMARKS.md (repo root) from the JSON under ``results/``.

    python benchmarks/report.py [--results DIR] [--output BENCHMARKS.md] [--check]

One table per results file (one workload at one setting, as ``harness.compare`` writes
it): per contender the median seconds, every median rate, and the ratio to the run's
baseline (the contender whose ratio is exactly 1, usually torch); under it the machine's
core count, the versions, the configuration and the command that reproduces the table
(from ``results/commands.json``, which ``run_all.py`` keeps). Only the text between
``<!-- report:begin -->`` and ``<!-- report:end -->`` is replaced, so prose written by hand
around it survives; a file without the markers gets them appended. The output holds no
timestamp, so regenerating from the same JSON changes nothing (``--check`` tests that).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- report:begin -->", "<!-- report:end -->"
_SKELETON = """# stoker benchmarks

Ratios measured side by side in one run against `torch.utils.data` on the same machine
(see `/work/shared/design/PERFORMANCE.md` for the workloads and goals). Run them all with
`python benchmarks/run_all.py`; regenerate the tables below with
`python benchmarks/report.py`. Prose outside the markers is kept.

"""


def _rate(key: str, value: float) -> str:
    """A median rate for humans: bytes as GB/s, the rest with thousands separators.

    >>> _rate("bytes_per_s", 2.5e9), _rate("samples_per_s", 12345.6), _rate("x_per_s", 0.5)
    ('2.50 GB/s', '12,346', '0.5')
    """
    if key == "bytes_per_s":
        return f"{value / 1e9:.2f} GB/s"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _rate_title(key: str) -> str:
    """``samples_per_s`` -> ``samples/s``; ``bytes_per_s`` -> ``GB/s``."""
    return "GB/s" if key == "bytes_per_s" else key.removesuffix("_per_s") + "/s"


def baseline(results: dict[str, Any]) -> str | None:
    """The contender the ratios are relative to: the one whose ratio is exactly 1."""
    return next((name for name, s in results.items() if s.get("ratio") == 1.0), None)


def derived_command(workload: str, record: dict[str, Any]) -> str:
    """A command for a results file that ``run_all.py`` did not make: its program and worker
    count, read off the workload name (``w1_sleep_2w`` -> ``w1_sleep.py --workers 2``).

    >>> derived_command("w3_tiny_0w", {})
    'python benchmarks/w3_tiny.py --workers 0'
    """
    match = re.fullmatch(r"(.+?)_(\d+)w", workload)
    script, workers = (match.group(1), match.group(2)) if match else (workload, None)
    cmd = f"python benchmarks/{script}.py"
    if workers is not None:
        cmd += f" --workers {workers}"
    images = record.get("config", {}).get("images")
    if images is not None:
        cmd += f" --images {images}"
    return cmd


def table(workload: str, record: dict[str, Any], command: str | None) -> str:
    """The Markdown section of one results file."""
    results: dict[str, Any] = record["results"]
    rates = [k for k in next(iter(results.values()), {}) if k.endswith("_per_s")]
    base = baseline(results)
    head = ["contender", "median s", *map(_rate_title, rates)]
    head.append(f"ratio vs {base}" if base else "ratio")
    lines = [f"### {workload}", "", "| " + " | ".join(head) + " |"]
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|")
    for name, s in results.items():
        cells = [name, f"{s['median_seconds']:.4f}"]
        cells += [_rate(k, s[k]) if k in s else "" for k in rates]
        cells.append(f"{s['ratio']:.2f}x" if "ratio" in s else "")
        lines.append("| " + " | ".join(cells) + " |")
    versions = ", ".join(f"{k} {v}" for k, v in record.get("versions", {}).items())
    config = ", ".join(f"{k}={v}" for k, v in record.get("config", {}).items())
    lines += [
        "",
        f"Median of {record.get('repeats', '?')} runs on {record.get('cores', '?')} cores; "
        f"{versions}.",
    ]
    if config:
        lines.append(f"Config: {config}.")
    if command is None:
        command = derived_command(workload, record)
        lines.append(f"Reproduce (command not recorded, derived from the name): `{command}`")
    else:
        lines.append(f"Reproduce: `{command}`")
    return "\n".join(lines)


def load(results_dir: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The results records by workload (files without ``results`` are skipped), and the
    recorded commands."""
    records: dict[str, dict[str, Any]] = {}
    commands: dict[str, str] = {}
    for path in sorted(results_dir.glob("*.json")):
        data = json.loads(path.read_text())
        if path.name == "commands.json":
            commands = data
        elif isinstance(data, dict) and isinstance(data.get("results"), dict):
            records[str(data.get("workload", path.stem))] = data
    return records, commands


def render(records: dict[str, dict[str, Any]], commands: dict[str, str]) -> str:
    """Everything between the markers: one section per workload, in name order."""
    if not records:
        return "No results yet: run `python benchmarks/run_all.py`."
    sections = [
        table(name, rec, rec.get("command") or commands.get(name))
        for name, rec in sorted(records.items())
    ]
    head = (
        "_Generated by `python benchmarks/report.py` from `benchmarks/results/*.json`; "
        "edit the prose outside the markers, not this part._"
    )
    return "\n\n".join([head, *sections])


def splice(document: str, generated: str) -> str:
    """``document`` with the text between the markers replaced by ``generated``.

    >>> splice("intro\\n<!-- report:begin -->\\nold\\n<!-- report:end -->\\nend\\n", "new")
    'intro\\n<!-- report:begin -->\\nnew\\n<!-- report:end -->\\nend\\n'
    >>> splice("intro\\n", "new")
    'intro\\n\\n<!-- report:begin -->\\nnew\\n<!-- report:end -->\\n'
    """
    block = f"{BEGIN}\n{generated}\n{END}"
    start, stop = document.find(BEGIN), document.find(END)
    if start == -1 and stop == -1:
        return document.rstrip("\n") + "\n\n" + block + "\n"
    if start == -1 or stop < start:
        raise ValueError(
            f"BENCHMARKS.md must hold {BEGIN} before {END} (or neither); fix the markers "
            "by hand, then run the report again."
        )
    return document[:start] + block + document[stop + len(END) :]


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check``, compare) BENCHMARKS.md; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--output", type=Path, default=HERE.parent / "BENCHMARKS.md")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is not up to date")
    args = parser.parse_args(argv)
    records, commands = load(args.results)
    old = args.output.read_text() if args.output.exists() else _SKELETON
    new = splice(old, render(records, commands))
    if args.check:
        stale = not args.output.exists() or new != old
        print(f"{args.output} is {'out of date' if stale else 'up to date'}.")
        return 1 if stale else 0
    if new != old or not args.output.exists():
        args.output.write_text(new)
    print(f"wrote {args.output}: {len(records)} tables")
    return 0


if __name__ == "__main__":
    sys.exit(main())
