"""Resume cost: time from ``load_state_dict`` to the first batch, at batch 10,000 vs batch 0.

A 1M-sample shuffled ``TensorDataset``, batch 64 (15,625 batches an epoch), in process.
stoker skips delivered batches without fetching them, so resuming deep into an epoch
should cost about what resuming at its start does (target: < 50 ms more).

    python benchmarks/resume_cost.py [--repeats R]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import harness
import stoker

N, BATCH, DEEP = 1_000_000, 64, 10_000


def time_to_first_batch(dataset: Any, state: dict[str, Any]) -> float:
    """Seconds from a fresh loader's ``load_state_dict(state)`` to its first batch."""
    loader = stoker.DataLoader(dataset, batch_size=BATCH, shuffle=True, generator=0)
    t0 = time.perf_counter()
    loader.load_state_dict(state)
    next(iter(loader))
    return time.perf_counter() - t0


def main() -> None:
    args = harness.cli(__doc__ or "", repeats=11)
    x = np.arange(N, dtype=np.float32)
    dataset = stoker.TensorDataset(x)
    state = stoker.DataLoader(dataset, batch_size=BATCH, shuffle=True, generator=0).state_dict()
    deep = {**state, "delivered": DEEP}
    times: dict[str, list[float]] = {"batch 0": [], f"batch {DEEP:,}": []}
    for _ in range(args.repeats):
        times["batch 0"].append(time_to_first_batch(dataset, state))
        times[f"batch {DEEP:,}"].append(time_to_first_batch(dataset, deep))
    med = {k: statistics.median(v) for k, v in times.items()}
    extra_ms = (med[f"batch {DEEP:,}"] - med["batch 0"]) * 1e3
    print(f"resume, 1M samples shuffled, batch {BATCH}, median of {args.repeats}:")
    for k, v in med.items():
        print(f"  resume at {k:<13} {v * 1e3:8.2f} ms to the first batch")
    print(f"  extra cost of resuming deep: {extra_ms:.2f} ms (target < 50 ms)")
    record = {
        "workload": "resume_cost",
        "command": harness.command(),
        "config": {"samples": N, "batch_size": BATCH, "deep": DEEP},
        "repeats": args.repeats,
        "cores": harness.os.cpu_count(),
        "versions": harness.versions(),
        "median_ms": {k: v * 1e3 for k, v in med.items()},
        "extra_ms": extra_ms,
    }
    harness.RESULTS.mkdir(exist_ok=True)
    (harness.RESULTS / "resume_cost.json").write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
