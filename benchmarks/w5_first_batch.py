"""W5, time to first batch: a cold iterator with 2 workers, until the first batch arrives;
and the second epoch's first batch with persistent workers. torch vs stoker, and grain,
torchdata's StatefulDataLoader and SPDL where installed (``benchmarks/peers.py``; only
StatefulDataLoader keeps workers across epochs, so only it has the second-epoch row).

    python benchmarks/w5_first_batch.py [--workers N] [--repeats R] [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import harness
import peers

N, FEATURES, BATCH = 10_000, 8, 64


def first_batch(make: Any) -> Any:
    """A run: build a loader, time iter() + next() (the harness times the whole call)."""

    def run() -> dict[str, float]:
        loader = make()
        it = iter(loader)
        next(it)
        del it
        return {"first_batches": 1}

    return run


def second_epoch(make: Any) -> Any:
    """A run: with persistent workers, time the first batch of another epoch."""
    loader = make(persistent_workers=True)
    for _ in loader:
        pass

    def run() -> dict[str, float]:
        it = iter(loader)
        next(it)
        return {"first_batches": 1}

    return run


def main() -> None:
    """Run the comparison and print medians and ratios."""
    args = harness.cli(__doc__ or "", repeats=15, workers=2)
    import torch
    import torch.utils.data as tud

    import stoker

    w = args.workers
    x = np.random.default_rng(0).standard_normal((N, FEATURES), dtype=np.float32)
    y = np.arange(N)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def torch_loader(**kw: Any) -> Any:
        return tud.DataLoader(tud.TensorDataset(tx, ty), batch_size=BATCH, num_workers=w, **kw)

    def stoker_loader(**kw: Any) -> Any:
        return stoker.DataLoader(stoker.TensorDataset(x, y), batch_size=BATCH, num_workers=w, **kw)

    contenders = {
        f"torch {w} workers": first_batch(torch_loader),
        f"stoker {w} workers": first_batch(stoker_loader),
        f"torch {w} persistent, epoch 2": second_epoch(torch_loader),
        f"stoker {w} persistent, epoch 2": second_epoch(stoker_loader),
    }
    if peers.available("grain"):
        source = peers.PairSource(x, y)
        contenders[f"grain {w} workers"] = first_batch(
            lambda: peers.grain_loader(source, batch_size=BATCH, workers=w)
        )
    if peers.available("torchdata.stateful_dataloader"):
        from torchdata.stateful_dataloader import StatefulDataLoader

        def stateful(**kw: Any) -> Any:
            ds = tud.TensorDataset(tx, ty)
            return StatefulDataLoader(ds, batch_size=BATCH, num_workers=w, **kw)

        contenders[f"torchdata StatefulDataLoader {w} workers"] = first_batch(stateful)
        contenders[f"torchdata StatefulDataLoader {w} persistent, epoch 2"] = second_epoch(stateful)
    if peers.available("spdl.dataloader") and w:
        from spdl.dataloader import get_pytorch_dataloader

        contenders[f"spdl {w} workers"] = first_batch(
            lambda: get_pytorch_dataloader(
                tud.TensorDataset(tx, ty), batch_size=BATCH, num_workers=w, in_order=True
            )
        )
    harness.compare(
        f"w5_first_batch_{w}w",
        contenders,
        repeats=args.repeats,
        baseline=f"torch {w} workers",
        config={"samples": N, "batch": BATCH, "workers": w},
        warmup=args.warmup,
    )


if __name__ == "__main__":
    main()
