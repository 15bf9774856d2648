"""Elastic resume cost: a state saved on 2 ranks at batch 10,000 of a 1M-sample epoch,
loaded on rank 0 of 4 (another world size, the same global batch size), to the first batch.

The dataset draws from NumPy's global RNG in each sample, so each sample is fetched under
its own seed (``DistributedSampler(elastic=True)``); global batches of 64 (32 a rank on 2,
16 on 4), 15,625 of them an epoch. The delivered batches are skipped without being fetched:
the cost is the epoch's shuffle, placing this rank's share and skipping 10,000 index
batches (target: under 1 s); resuming at batch 0 is reported beside it.

    python benchmarks/elastic_resume.py [--repeats R] [--quick]
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

N, GLOBAL_BATCH, DEEP, OLD, NEW = 1_000_000, 64, 10_000, 2, 4


class Jittered(stoker.Dataset):  # type: ignore[type-arg]
    """N samples, each its index and a draw from NumPy's global RNG (an augmentation)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> np.ndarray[Any, Any]:
        return np.array([i, np.random.randint(1000)], dtype=np.int64)


def loader(world: int, rank: int) -> stoker.DataLoader[Any]:
    """Rank ``rank`` of ``world``: an elastic sampler, the global batch size fixed."""
    sampler = stoker.DistributedSampler(Jittered(), world, rank, seed=1, elastic=True)
    return stoker.DataLoader(Jittered(), batch_size=GLOBAL_BATCH // world, sampler=sampler)


def saved_state(batches: int) -> dict[str, Any]:
    """Rank 0 of 2's state after ``batches`` batches (made by editing the one after the
    first batch, which is what a run that got there saves)."""
    saver = loader(OLD, 0)
    next(iter(saver))
    state = saver.state_dict()
    state["delivered"] = batches
    return state


def first_batch_s(state: dict[str, Any]) -> float:
    """Seconds from a fresh rank-0-of-4 loader's ``load_state_dict(state)`` to its first
    batch, checked to be its part of global batch ``state["delivered"]``."""
    resumed = loader(NEW, 0)
    t0 = time.perf_counter()
    resumed.load_state_dict(state)
    batch = next(iter(resumed))
    seconds = time.perf_counter() - t0
    uninterrupted = loader(NEW, 0).sampler
    order = list(uninterrupted)
    k, b = state["delivered"], GLOBAL_BATCH // NEW
    assert batch[:, 0].tolist() == order[k * b : (k + 1) * b], "resumed at the wrong batch"
    return seconds


def main() -> None:
    args = harness.cli(__doc__ or "", repeats=11)
    states = {"batch 0": saved_state(0), f"batch {DEEP:,}": saved_state(DEEP)}
    times: dict[str, list[float]] = {k: [] for k in states}
    for _ in range(args.repeats):
        for name, state in states.items():
            times[name].append(first_batch_s(state))
    med = {k: statistics.median(v) for k, v in times.items()}
    deep_s = med[f"batch {DEEP:,}"]
    print(
        f"elastic resume, 1M samples shuffled, global batch {GLOBAL_BATCH}, saved on {OLD} "
        f"ranks, loaded on {NEW}, median of {args.repeats}:"
    )
    for k, v in med.items():
        print(f"  resume at {k:<13} {v * 1e3:8.2f} ms to the first batch")
    print(f"  elastic resume at batch {DEEP:,}: {deep_s * 1e3:.1f} ms (target < 1,000 ms)")
    record = {
        "workload": "elastic_resume",
        "command": harness.command(),
        "config": {"samples": N, "global_batch_size": GLOBAL_BATCH, "deep": DEEP},
        "worlds": [OLD, NEW],
        "repeats": args.repeats,
        "cores": harness.os.cpu_count(),
        "versions": harness.versions(),
        "median_ms": {k: v * 1e3 for k, v in med.items()},
    }
    harness.RESULTS.mkdir(exist_ok=True)
    (harness.RESULTS / "elastic_resume.json").write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
