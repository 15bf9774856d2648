"""Autotune acceptance: ``num_workers="auto"`` against a sweep of fixed counts, side by side.

Two workloads, each through ``harness.compare`` (alternating runs, medians, JSON under
``benchmarks/results/``):

- ``w1``: W1's dataset (1000 samples of 1 MiB float32, 5 ms wait each, batch 100): wait-bound.
- ``w4``: a W4-like JPEG folder (500 x 375) through stoker.vision's fused fast path
  (RandomResizedCrop(224) + flip + ToTensor + Normalize), batch 64: CPU-bound.

Contenders: fixed ``num_workers`` from ``--sweep`` and ``"auto"``, each one loader iterated
once per run, as the seed's num-workers script does (one loader per setting, several
epochs; workers restart each epoch). ``auto`` keeps the count it found from one epoch to the
next, as in training; its tuning happens in the untimed warm-up epoch and the first timed
ones. ``auto fresh`` builds a new loader every run, so every run tunes from scratch: the
cost of tuning within one short epoch. The summary line gives each auto's median rate as a
fraction of the best fixed count's (the acceptance asks >= 90%)::

    python benchmarks/autotune.py [--workload w1 w4] [--sweep 0 1 2 3 4 6 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import harness

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def _drain(loader: Any) -> dict[str, float]:
    n = 0
    for batch in loader:
        n += len(batch[0]) if isinstance(batch, (tuple, list)) else len(batch)
    return {"samples": float(n)}


def w1_factory() -> Any:
    """Returns make(num_workers) -> loader, over W1's dataset."""
    import stoker
    from w1_sleep import BATCH, Sleepy

    ds = Sleepy()
    return lambda w: stoker.DataLoader(ds, batch_size=BATCH, num_workers=w)


def w4_factory(images: int) -> Any:
    """Returns make(num_workers) -> loader, over a W4-like image folder."""
    import stoker
    from stoker.vision import ImageFolder
    from stoker.vision import transforms as T
    from w4_images import make_folder

    root = make_folder(Path(tempfile.gettempdir()) / "stoker_w4", images)
    tf = T.Compose(
        [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
    )
    ds = ImageFolder(str(root), transform=tf)
    return lambda w: stoker.DataLoader(ds, batch_size=64, shuffle=True, num_workers=w)


def run(name: str, make: Any, sweep: list[int], repeats: int) -> dict[str, Any]:
    """Sweep and auto side by side; returns the summary (also written as JSON)."""
    loaders = {f"{w} workers": make(w) for w in sweep}
    contenders: dict[str, harness.Run] = {
        name: (lambda loader=loader: _drain(loader)) for name, loader in loaders.items()
    }
    reused = make("auto")
    found: list[Any] = []

    def auto_reused() -> dict[str, float]:
        out = _drain(reused)
        found.append(reused.statistics())
        return out

    contenders["auto"] = auto_reused
    contenders["auto fresh"] = lambda: _drain(make("auto"))
    record = harness.compare(f"autotune_{name}", contenders, repeats=repeats, baseline="0 workers")
    rates = {k: v["samples_per_s"] for k, v in record["results"].items()}
    fixed = {k: r for k, r in rates.items() if k.endswith("workers")}
    best = max(fixed, key=fixed.__getitem__)
    last = found[-1]
    summary = {
        "workload": name,
        "best_fixed": best,
        "best_fixed_rate": fixed[best],
        "auto_fresh_fraction": rates["auto fresh"] / fixed[best],
        "auto_fraction": rates["auto"] / fixed[best],
        "auto_workers": last.num_workers,
        "auto_input_bound": last.input_bound,
        "auto_decisions": list(last.autotune),
        "cores": os.cpu_count(),
    }
    print(
        f"{name}: best fixed = {best} ({fixed[best]:,.0f} samples/s); auto fresh "
        f"{summary['auto_fresh_fraction']:.0%}, auto {summary['auto_fraction']:.0%}"
        f" of it (auto settled on {last.num_workers} workers)"
    )
    for d in last.autotune:
        print(f"    {d}")
    (harness.RESULTS / f"autotune_{name}_summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def main() -> None:
    """Parse the command line and run the chosen workloads."""
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--workload", nargs="+", default=["w1", "w4"], choices=["w1", "w4"])
    extra.add_argument("--sweep", type=int, nargs="+", default=[0, 1, 2, 3, 4, 6, 8])
    extra.add_argument("--images", type=int, default=1024)
    ours, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    args = harness.cli((__doc__ or "").splitlines()[0], repeats=3)
    for name in ours.workload:
        make = w1_factory() if name == "w1" else w4_factory(ours.images)
        run(name, make, ours.sweep, args.repeats)


if __name__ == "__main__":
    main()
