"""W1, the seed's num-workers bench: 1000 samples of 1 MiB float32, each ``__getitem__``
waits 5 ms (I/O), batch 100. torch vs stoker with process workers (and stoker's thread
mode with 16 workers). The limit is 5 s / workers of waiting plus one copy of the data.

As in the seed's script, each contender is one loader iterated once per run (an epoch; the
workers start afresh each epoch, ``persistent_workers`` is off), so per-loader state that a
library keeps across epochs counts, as it does in training. grain, torchdata's
StatefulDataLoader and SPDL run it too where installed (``benchmarks/peers.py``).

    python benchmarks/w1_sleep.py [--workers N] [--repeats R] [--quick]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import harness
import peers

N, BATCH, FLOATS, WAIT_S = 1000, 100, 1 << 18, 0.005


class Sleepy:
    """1 MiB float32 samples, each after a 5 ms wait that releases the GIL."""

    def __init__(self, tensor: bool = False) -> None:
        self.sample: Any = np.ones(FLOATS, np.float32)
        if tensor:
            import torch

            self.sample = torch.from_numpy(self.sample)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> Any:
        time.sleep(WAIT_S)
        return self.sample


def drain(loader: Any) -> dict[str, float]:
    """One epoch; counts samples."""
    n = 0
    for batch in loader:
        n += len(batch)
    assert n == N
    return {"samples": n}


def main() -> None:
    """Run the comparison and print medians, ratios and the limit."""
    args = harness.cli(__doc__ or "", repeats=3, workers=2)
    import torch.utils.data as tud

    import stoker

    w = args.workers
    loaders = {
        f"torch {w} workers": tud.DataLoader(Sleepy(tensor=True), batch_size=BATCH, num_workers=w),
        f"stoker {w} workers": stoker.DataLoader(Sleepy(), batch_size=BATCH, num_workers=w),
        "stoker 16 threads": stoker.DataLoader(
            Sleepy(), batch_size=BATCH, num_workers=16, worker_mode="thread"
        ),
    }
    contenders = {name: (lambda loader=loader: drain(loader)) for name, loader in loaders.items()}
    contenders = peers.add(
        contenders,
        {
            f"grain {w} workers": peers.grain_loader_run(
                Sleepy(), batch_size=BATCH, workers=w, wrap=_epochs
            ),
            f"torchdata StatefulDataLoader {w} workers": peers.statefuldl(
                Sleepy(tensor=True), wrap=_epochs, batch_size=BATCH, num_workers=w
            ),
            f"spdl {w} workers": peers.spdl(
                Sleepy(tensor=True), wrap=_epochs, batch_size=BATCH, num_workers=w
            ),
        },
    )
    record = harness.compare(
        f"w1_sleep_{w}w",
        contenders,
        repeats=args.repeats,
        baseline=f"torch {w} workers",
        config={"samples": N, "batch": BATCH, "sample_bytes": FLOATS * 4, "wait_s": WAIT_S},
        warmup=args.warmup,
        extra=lambda: {"one_copy_s": one_copy_seconds()},
    )
    copy_s = record["one_copy_s"]
    for name, workers in ((f"stoker {w} workers", w), ("stoker 16 threads", 16)):
        limit = N * WAIT_S / workers + copy_s
        got = record["results"][name]["median_seconds"]
        print(
            f"{name}: {got:.3f} s vs the limit {limit:.3f} s ({N * WAIT_S / workers:.3f} s of "
            f"waiting + {copy_s:.3f} s for one copy): {got / limit:.2f}x"
        )


def _epochs(loader: Any) -> Any:
    """A run: one epoch of ``loader``."""
    return lambda: drain(loader)


def one_copy_seconds(repeats: int = 5) -> float:
    """The limit's copy: the epoch's samples stacked into batch buffers already in use."""
    sample = np.ones(FLOATS, np.float32)
    out = np.ones((BATCH, FLOATS), np.float32)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(N // BATCH):
            np.stack([sample] * BATCH, out=out)
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


if __name__ == "__main__":
    main()
