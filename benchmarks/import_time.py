"""Import time of ``import stoker`` (spawned workers pay it each): median of fresh interpreters.

    python benchmarks/import_time.py [--repeats R]

Prints the median wall time of ``python -c "import stoker"`` minus that of ``python -c
"pass"``, and of ``import torch.utils.data`` for comparison when torch is installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness


def wall(code: str) -> float:
    """Wall time of a fresh interpreter running ``code``, in seconds."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    return time.perf_counter() - t0


def main() -> None:
    args = harness.cli(__doc__ or "", repeats=15)
    codes = {
        "python": "pass",
        "stoker": "import stoker",
        "numpy": "import numpy",
        "from stoker import DataLoader": "from stoker import DataLoader",
    }
    if importlib.util.find_spec("torch") is not None:
        codes["torch.utils.data"] = "import torch.utils.data"
    times: dict[str, list[float]] = {k: [] for k in codes}
    for _ in range(args.repeats):
        for name, code in codes.items():
            times[name].append(wall(code))
    base = statistics.median(times["python"])
    print(f"import time, median of {args.repeats} fresh interpreters, beyond bare python:")
    results = {}
    for name in codes:
        if name != "python":
            extra = statistics.median(times[name]) - base
            print(f"  {name:<18} {extra * 1e3:8.1f} ms")
            results[f"import {name}"] = {"median_seconds": extra}
    record = {
        "workload": "import_time",
        "command": harness.command(),
        "repeats": args.repeats,
        "cores": os.cpu_count(),
        "versions": harness.versions(),
        "config": {"measure": "wall time of a fresh interpreter minus bare python"},
        "results": results,
    }
    harness.RESULTS.mkdir(exist_ok=True)
    (harness.RESULTS / "import_time.json").write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
