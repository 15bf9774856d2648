"""W2: transport throughput, torch's DataLoader vs stoker's: 1 MiB float32 samples that cost
nothing to make, batch 100, 2 workers (and in-process for reference). GB/s moved to the
training loop; the limit is one memcpy. grain, torchdata's StatefulDataLoader and SPDL run
the same workload, with workers and in process, when installed (``benchmarks/peers.py``),
else they are left out.

"2 workers" is one loader per contender iterated once per run, so every run (epoch) starts
fresh workers, as a training loop over epochs does without ``persistent_workers`` (until
2026-11-29 each run built a new loader; the per-loader state both libraries may keep across
epochs, e.g. stoker's warm shared-memory segments, was then never exercised). The dataset
returns one preallocated array: no per-sample allocation on either side. In process, too,
each contender is one loader iterated once per run (``stoker in-process, new loader`` makes a
loader per run, for reference: per-loader memory is then made anew each run).

Run: ``python benchmarks/w2_transport.py [--quick] [--workers 2] [--front {stoker,torch}]``
(``--front torch`` builds stoker's contenders from ``stoker.torch``).
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
    args = harness.cli(__doc__ or "", repeats=5, workers=2, front=True)
    import torch.utils.data as tud

    stoker = harness.stoker_front(args.front)
    w = args.workers
    contenders = {
        f"torch {w} workers": _epochs(
            tud.DataLoader(TorchSamples(), batch_size=BATCH, num_workers=w)
        ),
        f"stoker {w} workers": _epochs(
            stoker.DataLoader(NumpySamples(), batch_size=BATCH, num_workers=w)
        ),
        f"stoker {w} workers, persistent": _persistent(stoker, w),
        "stoker in-process": _epochs(stoker.DataLoader(NumpySamples(), batch_size=BATCH)),
        "stoker in-process, new loader": lambda: drain(
            stoker.DataLoader(NumpySamples(), batch_size=BATCH)
        ),
        "torch in-process": _epochs(tud.DataLoader(TorchSamples(), batch_size=BATCH)),
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
            f"spdl {w} workers": peers.spdl(
                TorchSamples(), wrap=_epochs, batch_size=BATCH, num_workers=w
            ),
            "grain in-process": peers.grain_w2(
                NumpySamples(), batch_size=BATCH, workers=0, wrap=_epochs
            ),
            "torchdata StatefulDataLoader in-process": peers.statefuldl(
                TorchSamples(), wrap=_epochs, batch_size=BATCH
            ),
            "spdl in-process": peers.spdl_in_process(
                NumpySamples(), batch_size=BATCH, aggregate=np.stack, wrap=_epochs
            ),
        },
    )
    harness.compare(
        f"w2_transport_{w}w{harness.front_suffix(args.front)}",
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
