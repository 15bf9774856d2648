"""The shared benchmark harness: run contenders side by side, alternating, and report medians.

Each benchmark program builds a dict of contenders (``"torch"``, ``"stoker"``, ...), each a
zero-argument callable that performs one timed run and returns a dict of counts for it
(``{"samples": n, "bytes": b, ...}``; the harness adds ``seconds``). The harness warms each
up once, then runs them ``repeats`` times in alternating order (so drift on this noisy
machine hits all alike), and reports per contender the median time, rates per second and the
ratio to the baseline, as a table on stdout and a JSON record under ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
Run = Callable[[], dict[str, float]]


def cli(
    description: str, repeats: int = 5, workers: int | None = None, front: bool = False
) -> argparse.Namespace:
    """The common command line: ``--repeats N``, ``--warmup N`` (untimed runs first),
    ``--quick`` (one repeat, no warm-up, for smoke runs), when ``workers`` is given,
    ``--workers N`` with that default, and with ``front``, ``--front {stoker,torch}`` (see
    :func:`stoker_front`)."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    if workers is not None:
        parser.add_argument("--workers", type=int, default=workers, help="num_workers")
    if front:
        parser.add_argument(
            "--front",
            choices=("stoker", "torch"),
            default="stoker",
            help="build stoker's contenders from stoker or from stoker.torch",
        )
    parser.add_argument("--repeats", type=int, default=repeats, help="timed runs per contender")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per contender")
    parser.add_argument("--quick", action="store_true", help="one repeat, no warm-up")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.warmup = 1, 0
    return args


def stoker_front(front: str) -> Any:
    """The module stoker's contenders are built from: ``stoker``, or for ``"torch"`` the
    torch front door ``stoker.torch`` (same classes and arguments, torch-native defaults).

    Raises:
        SystemExit: ``stoker.torch`` is asked for but does not import here.
    """
    import importlib

    name = "stoker.torch" if front == "torch" else "stoker"
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise SystemExit(
            f"--front {front} needs {name}, which does not import here ({exc}); "
            "use --front stoker, or a stoker that has its torch front door"
        ) from exc


def front_suffix(front: str) -> str:
    """What a results file's name gets for a run through ``front`` ("" for ``stoker``)."""
    return "" if front == "stoker" else f"_{front}front"


def versions() -> dict[str, str]:
    """Versions of Python and of the libraries that a result depends on."""
    out = {"python": platform.python_version()}
    for name in (
        "stoker",
        "numpy",
        "torch",
        "torchvision",
        "PIL",
        "simplejpeg",
        "grain",
        "torchdata",
        "spdl",
    ):
        mod = sys.modules.get(name)
        if mod is not None:
            out[name] = str(getattr(mod, "__version__", "?"))
    return out


def command() -> str:
    """The command line that ran this program, as a user would type it from the repo root."""
    root = str(Path(__file__).resolve().parent.parent) + "/"
    argv = ["python", *(a.removeprefix(root) for a in sys.orig_argv[1:])]
    return " ".join(argv)


_PF_EXITING = 0x4
"""The kernel's flag of a process that is exiting (its memory being torn down)."""


def _exiting_children() -> int:
    """How many processes started by this one are exiting but not yet zombies (Linux; 0
    elsewhere): idle persistent workers do not count."""
    count = 0
    for task in Path("/proc/self/task").glob("*"):
        try:
            pids = (task / "children").read_text().split()
        except OSError:
            continue
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[6]) & _PF_EXITING:
                count += 1
    return count


def _reaping() -> bool:
    """Whether a stoker thread still waits for exiting workers (they may not have reached
    the kernel's exit yet)."""
    return any(t.name == "stoker-reaper" for t in threading.enumerate())


def settle(limit_s: float = 5.0) -> None:
    """Wait (at most ``limit_s``) until no process started by an earlier run is still
    exiting: workers torn down in the background must not slow the next contender's run."""
    deadline = time.monotonic() + limit_s
    while (_reaping() or _exiting_children()) and time.monotonic() < deadline:
        time.sleep(0.001)


def timed(run: Run) -> dict[str, float]:
    """One run of ``run`` (once earlier runs' processes are gone) with its wall time added
    as ``seconds``, unless the run timed itself (``seconds`` in its counts: the part that
    is the work, without the run's own bookkeeping, such as reading CPU times)."""
    settle()
    t0 = time.perf_counter()
    counts = run()
    return {"seconds": time.perf_counter() - t0, **counts}


def compare(
    workload: str,
    contenders: dict[str, Run],
    *,
    repeats: int,
    baseline: str = "torch",
    config: dict[str, Any] | None = None,
    warmup: int = 1,
    extra: Callable[[], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Runs every contender ``repeats`` times, alternating; prints and saves the medians.

    Args:
        warmup: untimed runs of each contender first (``True`` is one).
        extra: called after the runs; its fields are added to the record (e.g. memory).

    Returns:
        The JSON record: config, versions, cores, and per contender the raw runs, the median
        seconds, the median rate of each count per second, and ``ratio`` (the contender's
        median rate of the first count over the baseline's, > 1 is faster).
    """
    for _ in range(int(warmup)):
        for run in contenders.values():
            run()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
    names = list(contenders)
    for i in range(repeats):
        for name in names if i % 2 == 0 else reversed(names):
            runs[name].append(timed(contenders[name]))
    summary: dict[str, Any] = {}
    for name, rs in runs.items():
        rates = {
            f"{k}_per_s": statistics.median(r[k] / r["seconds"] for r in rs)
            for k in rs[0]
            if k != "seconds"
        }
        summary[name] = {
            "median_seconds": statistics.median(r["seconds"] for r in rs),
            **rates,
            "runs": rs,
        }
    first_rate = next((k for k in summary[names[0]] if k.endswith("_per_s")), None)
    if baseline in summary and first_rate:
        base = summary[baseline][first_rate]
        for s in summary.values():
            s["ratio"] = s[first_rate] / base if base else float("nan")
    record = {
        "workload": workload,
        "command": command(),
        "config": config or {},
        "repeats": repeats,
        "warmup": int(warmup),
        "cores": os.cpu_count(),
        "versions": versions(),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "results": summary,
        **(extra() if extra is not None else {}),
    }
    _print(record, first_rate)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{workload}.json").write_text(json.dumps(record, indent=2))
    return record


def _print(record: dict[str, Any], rate: str | None) -> None:
    print(f"\n{record['workload']}  (median of {record['repeats']}, {record['cores']} cores)")
    print(f"{'contender':<40} {'median s':>10} {rate or '':>18} {'ratio':>8}")
    for name, s in record["results"].items():
        value = f"{s[rate]:,.1f}" if rate else ""
        ratio = f"{s['ratio']:.2f}x" if "ratio" in s else ""
        print(f"{name:<40} {s['median_seconds']:>10.4f} {value:>18} {ratio:>8}")
