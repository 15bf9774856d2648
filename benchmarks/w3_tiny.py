"""W3, tiny samples: 200k pairs (8 float32, int64 label), batch 256, shuffled, one epoch.

Runs torch.utils.data.DataLoader and stoker's DataLoader side by side (stoker on NumPy
arrays and on torch tensors; with workers, both also with persistent workers, and stoker
also with the same rows in a dataset class of the user's, which keeps its workers, and in
process for comparison), alternating,
and prints the median samples/s and ratios; grain and torchdata's StatefulDataLoader run
the same workload when installed (``benchmarks/peers.py``), else they are left out.

    python benchmarks/w3_tiny.py [--workers N] [--repeats R] [--warmup W]

With workers, a loader of stoker's rows moves in process after its first epoch (after its
second with persistent workers, which are not judged by the epoch that started them), and
the trial; ``--warmup 3`` times the steady state only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import harness
import peers
import stoker

N, FEATURES, BATCH = 200_000, 8, 256


class UserRows(stoker.TensorDataset):
    """The same rows in a dataset class of the user's (its code could run in a worker)."""


def epoch(loader: Any) -> Callable[[], dict[str, float]]:
    """A run: one full epoch of ``loader``, counting samples."""

    def run() -> dict[str, float]:
        n = 0
        for _, y in loader:
            n += len(y)
        assert n == N
        return {"samples": n}

    return run


def main() -> None:
    args = harness.cli(__doc__ or "", repeats=7, workers=0)
    import torch

    x = np.random.default_rng(0).standard_normal((N, FEATURES), dtype=np.float32)
    y = np.arange(N, dtype=np.int64)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    kw: dict[str, Any] = {"batch_size": BATCH, "shuffle": True, "num_workers": args.workers}
    contenders = {
        "torch": epoch(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tx, ty), **kw)),
        "stoker (numpy)": epoch(stoker.DataLoader(stoker.TensorDataset(x, y), **kw)),
        "stoker (torch tensors)": epoch(stoker.DataLoader(stoker.TensorDataset(tx, ty), **kw)),
    }
    if args.workers:  # workers kept from one epoch to the next: no start-up per run
        keep = {**kw, "persistent_workers": True}
        tds = torch.utils.data.TensorDataset(tx, ty)
        contenders["torch persistent"] = epoch(torch.utils.data.DataLoader(tds, **keep))
        contenders["stoker (numpy) persistent"] = epoch(
            stoker.DataLoader(stoker.TensorDataset(x, y), **keep)
        )
        contenders["stoker (numpy) num_workers=auto"] = epoch(
            stoker.DataLoader(stoker.TensorDataset(x, y), **{**kw, "num_workers": "auto"})
        )
        # The rows above move in process once an epoch shows the workers slower (none of
        # the user's code runs in them); a dataset class of the user's keeps its workers.
        for name, more in (("", {}), (" persistent", {"persistent_workers": True})):
            contenders[f"stoker (numpy) workers kept{name}"] = epoch(
                stoker.DataLoader(UserRows(x, y), **kw, **more)
            )
        contenders["stoker in process"] = epoch(
            stoker.DataLoader(stoker.TensorDataset(x, y), **{**kw, "num_workers": 0})
        )
        contenders["stoker in process, user's class"] = epoch(
            stoker.DataLoader(UserRows(x, y), **{**kw, "num_workers": 0})
        )
    contenders = peers.add(
        contenders,
        {
            "grain": peers.grain_w3(x, y, batch_size=BATCH, workers=args.workers, wrap=epoch),
            "torchdata StatefulDataLoader": peers.statefuldl(
                torch.utils.data.TensorDataset(tx, ty), wrap=epoch, **kw
            ),
        },
    )
    harness.compare(
        f"w3_tiny_{args.workers}w",
        contenders,
        repeats=args.repeats,
        warmup=args.warmup,
        config={"samples": N, "features": FEATURES, "batch_size": BATCH, **kw},
    )


if __name__ == "__main__":
    main()
