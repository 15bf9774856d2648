"""W3, tiny samples: 200k pairs (8 float32, int64 label), batch 256, shuffled, one epoch.

Runs torch.utils.data.DataLoader and stoker's DataLoader side by side, alternating, and
prints the median samples/s and ratios: stoker on NumPy arrays and on torch tensors; with
workers, both also with persistent workers, and stoker also with the same rows in a
dataset class of the user's (which keeps its workers) and in process, for comparison.
grain, torchdata's StatefulDataLoader and SPDL (its process workers, or in process its own
pipeline with one thread) run the same workload when installed (``benchmarks/peers.py``),
else they are left out.

    python benchmarks/w3_tiny.py [--workers N] [--repeats R] [--warmup W] [--stoker-only]
        [--front {stoker,torch}]

``--front torch`` builds stoker's contenders from ``stoker.torch``, the torch front door.

With workers, a loader of stoker's rows moves in process after its first epoch (after its
second with persistent workers, which are not judged by the epoch that started them) and
the trial epoch; ``--warmup 4`` times the steady state only. ``--stoker-only`` runs stoker's
contenders alone, as ratios to stoker in process: short rounds, so this machine's slow
phases (seconds long) hit every contender of a round alike.
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


def stoker_contenders(
    x: Any, y: Any, tx: Any, ty: Any, kw: dict[str, Any], st: Any = stoker
) -> dict[str, Any]:
    """stoker's contenders for ``kw`` (with workers: persistent, auto, a dataset class of
    the user's, and in process for comparison), built from the front ``st`` (``stoker``
    or ``stoker.torch``)."""
    out = {
        "stoker (numpy)": epoch(st.DataLoader(st.TensorDataset(x, y), **kw)),
        "stoker (torch tensors)": epoch(st.DataLoader(st.TensorDataset(tx, ty), **kw)),
    }
    if not kw["num_workers"]:
        return out
    out["stoker (numpy) persistent"] = epoch(
        st.DataLoader(st.TensorDataset(x, y), **kw, persistent_workers=True)
    )
    out["stoker (numpy) num_workers=auto"] = epoch(
        st.DataLoader(st.TensorDataset(x, y), **{**kw, "num_workers": "auto"})
    )
    # The rows above move in process once an epoch shows the workers slower (none of the
    # user's code runs in them); a dataset class of the user's keeps its workers.
    for name, more in (("", {}), (" persistent", {"persistent_workers": True})):
        out[f"stoker (numpy) workers kept{name}"] = epoch(
            st.DataLoader(UserRows(x, y), **kw, **more)
        )
    in_process = {**kw, "num_workers": 0}
    out["stoker in process"] = epoch(st.DataLoader(st.TensorDataset(x, y), **in_process))
    out["stoker in process, user's class"] = epoch(st.DataLoader(UserRows(x, y), **in_process))
    return out


def main() -> None:
    import argparse

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--stoker-only", action="store_true")
    ours, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    args = harness.cli(__doc__ or "", repeats=7, workers=0, front=True)
    import torch

    x = np.random.default_rng(0).standard_normal((N, FEATURES), dtype=np.float32)
    y = np.arange(N, dtype=np.int64)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    kw: dict[str, Any] = {"batch_size": BATCH, "shuffle": True, "num_workers": args.workers}
    config = {"samples": N, "features": FEATURES, "batch_size": BATCH, **kw}
    ours_only = stoker_contenders(x, y, tx, ty, kw, harness.stoker_front(args.front))
    if ours.stoker_only and args.workers:
        base = "stoker in process"
        harness.compare(
            f"w3_tiny_{args.workers}w_stoker{harness.front_suffix(args.front)}",
            {base: ours_only.pop(base), **ours_only},
            repeats=args.repeats,
            baseline=base,
            warmup=args.warmup,
            config=config,
        )
        return
    tds = torch.utils.data.TensorDataset(tx, ty)
    contenders = {"torch": epoch(torch.utils.data.DataLoader(tds, **kw))}
    if args.workers:  # workers kept from one epoch to the next: no start-up per run
        keep = {**kw, "persistent_workers": True}
        contenders["torch persistent"] = epoch(torch.utils.data.DataLoader(tds, **keep))
    contenders.update(ours_only)
    contenders = peers.add(
        contenders,
        {
            "grain": peers.grain_w3(x, y, batch_size=BATCH, workers=args.workers, wrap=epoch),
            "torchdata StatefulDataLoader": peers.statefuldl(tds, wrap=epoch, **kw),
            "spdl": peers.spdl(tds, wrap=epoch, **kw)
            or peers.spdl_in_process(
                stoker.TensorDataset(x, y),
                batch_size=BATCH,
                aggregate=peers.pairs,
                wrap=epoch,
                shuffle=True,
            ),
        },
    )
    harness.compare(
        f"w3_tiny_{args.workers}w{harness.front_suffix(args.front)}",
        contenders,
        repeats=args.repeats,
        warmup=args.warmup,
        config=config,
    )


if __name__ == "__main__":
    main()
