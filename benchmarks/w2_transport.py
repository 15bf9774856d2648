"""W2: transport throughput, torch's DataLoader vs stoker's: 1 MiB float32 samples that cost
nothing to make, batch 100, 2 workers (and in-process for reference). GB/s moved to the
training loop; the limit is one memcpy. grain and torchdata's StatefulDataLoader run the
same workload when installed (``benchmarks/peers.py``), else they are left out.

"2 workers" is one loader per contender iterated once per run, so every run (epoch) starts
fresh workers, as a training loop over epochs does without ``persistent_workers`` (until
2026-11-29 each run built a new loader; the per-loader state both libraries may keep across
epochs, e.g. stoker's warm shared-memory segments, was then never exercised). The dataset
returns one preallocated array: no per-sample allocation on either side.

Run: ``python benchmarks/w2_transport.py [--quick] [--workers 2]``
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import harness
import peers

N, BATCH, FLOATS = 1000, 100, 1 << 18  # 1 MiB of float32 per sample


class NumpySamples:
    """N samples, each the same 1 MiB float32 array (no work per sample)."""

    def __init__(self) -> None:
        self.sample = np.ones(FLOATS, np.float32)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> Any:
        return self.sample


class TorchSamples(NumpySamples):
    """The same samples as torch tensors (torch's collate stacks tensors)."""

    def __init__(self) -> None:
        import torch

        self.sample = torch.ones(FLOATS, dtype=torch.float32)


def drain(loader: Any) -> dict[str, float]:
    """Consume one epoch; count samples and bytes."""
    samples = nbytes = 0
    for batch in loader:
        samples += len(batch)
        nbytes += batch.nbytes if isinstance(batch, np.ndarray) else batch.numel() * 4
    return {"GB": nbytes / 1e9, "samples": samples}


def main() -> None:
    """Run the comparison and print medians and ratios."""
    args = harness.cli(__doc__ or "", repeats=5, workers=2)
    import torch.utils.data as tud

    import stoker

    w = args.workers
    contenders = {
        f"torch {w} workers": _epochs(
            tud.DataLoader(TorchSamples(), batch_size=BATCH, num_workers=w)
        ),
        f"stoker {w} workers": _epochs(
            stoker.DataLoader(NumpySamples(), batch_size=BATCH, num_workers=w)
        ),
        f"stoker {w} workers, persistent": _persistent(stoker, w),
        "stoker in-process": lambda: drain(stoker.DataLoader(NumpySamples(), batch_size=BATCH)),
        "torch in-process": lambda: drain(tud.DataLoader(TorchSamples(), batch_size=BATCH)),
    }
    contenders = peers.add(
        contenders,
        {
            f"grain {w} workers": peers.grain_w2(
                NumpySamples(), batch_size=BATCH, workers=w, wrap=_epochs
            ),
            f"torchdata StatefulDataLoader {w} workers": peers.statefuldl(
                TorchSamples(), wrap=_epochs, batch_size=BATCH, num_workers=w
            ),
        },
    )
    harness.compare(
        f"w2_transport_{w}w",
        contenders,
        repeats=args.repeats,
        baseline=f"torch {w} workers",
        config={"samples": N, "batch": BATCH, "sample_bytes": FLOATS * 4, "workers": w},
        warmup=args.warmup,
    )


def _epochs(loader: Any) -> Any:
    """A run: one epoch of ``loader`` (fresh workers each run unless persistent)."""
    return lambda: drain(loader)


def _persistent(stoker: Any, w: int) -> Any:
    loader = stoker.DataLoader(
        NumpySamples(), batch_size=BATCH, num_workers=w, persistent_workers=True
    )
    return lambda: drain(loader)


if __name__ == "__main__":
    main()
