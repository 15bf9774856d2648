"""Restart cost: the wait for the batches after a worker is SIGKILLed, against none.

A loader with ``worker_restarts=1`` over 100,000 augmented samples (a 16-float array each,
NumPy noise added), batch 64, one worker process (the worst case: no other worker has the
next batches ready), iterated to batch 20. The next ``LATER`` batches are timed, once as
they come and once right after ``SIGKILL`` of the worker (the first of them may be in the
main process already; the later ones wait for the new worker): the difference is the cost
of one restart (the death seen, a new worker started, its tasks loaded again), and the
batches must be the same bytes. Target: < 1 s. Fork and spawn (torch not imported: a
spawned worker imports NumPy only).

    python benchmarks/restart_cost.py [--repeats R] [--quick]
"""

from __future__ import annotations

import json
import logging
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import harness
import stoker

N, BATCH, AT, LATER = 100_000, 64, 20, 10


class Augmented:
    """Sample ``i``: 16 floats of value ``i`` plus noise from NumPy's global RNG."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(16, i, np.float32) + np.random.rand(16).astype(np.float32)


def next_batches_s(method: str, kill: bool) -> tuple[float, bytes]:
    """Seconds of the ``LATER`` batches after batch ``AT`` (after SIGKILL of the worker if
    ``kill``), and their bytes."""
    loader = stoker.DataLoader(
        Augmented(),
        batch_size=BATCH,
        shuffle=True,
        generator=0,
        num_workers=1,
        multiprocessing_context=method,
        worker_restarts=1,
    )
    it: Any = iter(loader)
    for _ in range(AT):
        next(it)
    if kill:
        os.kill(it._workers[0].pid, signal.SIGKILL)
    t0 = time.perf_counter()
    batches = [next(it).tobytes() for _ in range(LATER)]
    seconds = time.perf_counter() - t0
    if kill:
        assert len(loader.statistics().worker_restarts) == 1, "the worker was not restarted"
    it.shutdown()
    return seconds, b"".join(batches)


def main() -> None:
    args = harness.cli(__doc__ or "", repeats=7)
    logging.getLogger("stoker").setLevel(logging.ERROR)  # one restart warning per run
    rows: dict[str, dict[str, float]] = {}
    for method in ("fork", "spawn"):
        times: dict[str, list[float]] = {"no kill": [], "after SIGKILL": []}
        for _ in range(args.warmup + args.repeats):
            calm, calm_bytes = next_batches_s(method, kill=False)
            killed, killed_bytes = next_batches_s(method, kill=True)
            assert calm_bytes == killed_bytes, "the batches after the restart differ"
            times["no kill"].append(calm)
            times["after SIGKILL"].append(killed)
        med = {k: statistics.median(v[args.warmup :]) for k, v in times.items()}
        med["restart"] = med["after SIGKILL"] - med["no kill"]
        rows[method] = med
        runs = ", ".join(f"{t * 1e3:.0f}" for t in times["after SIGKILL"][args.warmup :])
        print(
            f"{method}: {LATER} batches {med['no kill'] * 1e3:.2f} ms without a kill, "
            f"{med['after SIGKILL'] * 1e3:.1f} ms after SIGKILL (runs: {runs} ms); one "
            f"restart costs {med['restart'] * 1e3:.1f} ms (target < 1000 ms)"
        )
    record = {
        "workload": "restart_cost",
        "command": harness.command(),
        "config": {"samples": N, "batch_size": BATCH, "at": AT, "later": LATER, "num_workers": 1},
        "repeats": args.repeats,
        "cores": harness.os.cpu_count(),
        "versions": harness.versions(),
        "median_ms": {m: {k: v * 1e3 for k, v in r.items()} for m, r in rows.items()},
    }
    harness.RESULTS.mkdir(exist_ok=True)
    (harness.RESULTS / "restart_cost.json").write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
