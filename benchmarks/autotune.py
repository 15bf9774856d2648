"""Autotune acceptance: ``"auto"`` against the best fixed count (and mode), side by side.

Workloads, each through ``harness.compare`` (alternating runs, medians, JSON under
``benchmarks/results/``):

- ``w1``: W1's dataset (1000 samples of 1 MiB float32, 5 ms wait each, batch 100): waiting.
- ``w4``: a W4-like JPEG folder (500 x 375) through stoker.vision's fused fast path
  (RandomResizedCrop(224) + flip + ToTensor + Normalize), batch 64: CPU-bound.
- ``w3``: W3's tiny in-memory rows (200k x 8 float32 + label), batch 256, shuffled; an
  epoch takes ~10 ms, so a reused loader's run is ``EPOCHS_PER_RUN`` epochs (a fresh
  loader's is its first epoch alone).
- ``gil``: the same JPEGs held in memory as bytes, decoded by simplejpeg (which releases
  the GIL) and centre-cropped to 224 x 224, batch 32.

Contenders: each fixed ``num_workers`` of ``--sweep`` in each mode of ``--modes``, then
``auto`` (process workers) and ``auto x auto`` (``worker_mode="auto"`` too). A plain name is
one loader iterated once per run (epochs of a reused loader; its tuning happens in the
untimed warm-up epoch and the first timed ones); ``fresh`` builds a new loader every run
(a brand-new loader's first epoch), in a pass of its own after the reused loaders are
gone (their kept shared memory would weigh on the fresh ones' page faults). The summary
gives each auto's median rate as a fraction of the best fixed contender of the same kind
(fresh or reused), measured in a run of their own against it (``_final``, see ``_judge``)::

    python benchmarks/autotune.py [--workload w1 w4 w3 gil] [--sweep 0 1 2 4 8]
        [--modes process thread] [--repeats 3] [--confirm 11]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import harness

EPOCHS_PER_RUN = {"w3": 10}
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def _drain(loader: Any) -> dict[str, float]:
    n = 0
    for batch in loader:
        n += len(batch[0]) if isinstance(batch, (tuple, list)) else len(batch)
    return {"samples": float(n)}


def w1_factory() -> Any:
    """Returns make(num_workers, worker_mode) -> loader, over W1's dataset."""
    import stoker
    from w1_sleep import BATCH, Sleepy

    ds = Sleepy()
    return lambda w, m: stoker.DataLoader(ds, batch_size=BATCH, num_workers=w, worker_mode=m)


def w4_factory(images: int) -> Any:
    """Returns make(num_workers, worker_mode) -> loader, over a W4-like image folder."""
    import stoker
    from stoker.vision import ImageFolder
    from stoker.vision import transforms as T
    from w4_images import make_folder

    root = make_folder(Path(tempfile.gettempdir()) / "stoker_w4", images)
    tf = T.Compose(
        [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
    )
    ds = ImageFolder(str(root), transform=tf)
    return lambda w, m: stoker.DataLoader(
        ds, batch_size=64, shuffle=True, num_workers=w, worker_mode=m
    )


def w3_factory() -> Any:
    """Returns make(num_workers, worker_mode) -> loader, over W3's tiny rows."""
    import numpy as np

    import stoker
    from w3_tiny import BATCH, FEATURES, N

    rng = np.random.default_rng(0)
    ds = stoker.TensorDataset(
        rng.random((N, FEATURES), dtype=np.float32), rng.integers(0, 10, N, dtype=np.int64)
    )
    return lambda w, m: stoker.DataLoader(
        ds, batch_size=BATCH, shuffle=True, generator=0, num_workers=w, worker_mode=m
    )


class JpegBytes:
    """JPEG files held in memory, decoded by simplejpeg (the GIL released) and cropped."""

    def __init__(self, root: Path) -> None:
        self.blobs = [p.read_bytes() for p in sorted(root.rglob("*.jpg"))]

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int) -> Any:
        import simplejpeg

        img = simplejpeg.decode_jpeg(self.blobs[i])
        h, w = img.shape[0] // 2 - 112, img.shape[1] // 2 - 112
        return img[h : h + 224, w : w + 224].copy()


def gil_factory(images: int) -> Any:
    """Returns make(num_workers, worker_mode) -> loader, over JPEG bytes in memory."""
    import stoker
    from w4_images import make_folder

    ds = JpegBytes(make_folder(Path(tempfile.gettempdir()) / "stoker_w4", images))
    return lambda w, m: stoker.DataLoader(
        ds, batch_size=32, shuffle=True, generator=0, num_workers=w, worker_mode=m
    )


def _settings(sweep: list[int], modes: list[str]) -> dict[str, tuple[Any, str]]:
    """Every fixed count x mode, then the two autos: name -> (num_workers, worker_mode)."""
    settings: dict[str, tuple[Any, str]] = {}
    for w in sweep:
        for m in modes if w else ["process"]:
            settings[f"{w} {m}" if w else "0 workers"] = (w, m)
    settings["auto"] = ("auto", "process")
    settings["auto x auto"] = ("auto", "auto")
    return settings


def _reused(make: Any, settings: dict[str, tuple[Any, str]], found: list[Any], epochs: int) -> dict:
    """One loader per setting, iterated ``epochs`` times per run."""
    out: dict[str, harness.Run] = {}
    for name, (w, m) in settings.items():
        loader = make(w, m)

        def reused(loader: Any = loader, auto: bool = name == "auto x auto") -> dict:
            got = {"samples": sum(_drain(loader)["samples"] for _ in range(epochs))}
            if auto:
                found.append(loader.statistics())
            return got

        out[name] = reused
    return out


def run(
    name: str, make: Any, sweep: list[int], modes: list[str], repeats: int, confirm: int
) -> dict:
    """Sweep and autos side by side, reused loaders first, then fresh ones (in a pass of
    their own: the reused loaders, and the memory they keep, are gone by then); returns
    the summary (also written as JSON)."""
    found: list[Any] = []
    settings = _settings(sweep, modes)
    summary: dict[str, Any] = {"workload": name, "cores": os.cpu_count()}
    reused = _reused(make, settings, found, EPOCHS_PER_RUN.get(name, 1))
    summary["reused"] = _judge(f"autotune_{name}", reused, "", repeats, confirm)
    del reused
    gc.collect()
    fresh = {f"{k} fresh": lambda w=w, m=m: _drain(make(w, m)) for k, (w, m) in settings.items()}
    summary["fresh"] = _judge(f"autotune_{name}_fresh", fresh, " fresh", repeats, confirm)
    last = found[-1]
    summary["auto_x_auto_decisions"] = list(last.autotune)
    for d in last.autotune:
        print(f"    {d}")
    (harness.RESULTS / f"autotune_{name}_summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _judge(workload: str, runs: dict, suffix: str, repeats: int, confirm: int) -> dict:
    """The autos' share of the best fixed contender (and of the best in process mode).

    The sweep picks the best; then the autos run against it alone, ``confirm`` times each:
    the best of many near-equal rows is the one whose noise ran high (on W3 every row
    loads in process), so judged on the sweep's own runs an auto as fast would fall short.
    """
    rates = _rates(harness.compare(workload, runs, repeats=repeats, baseline=f"0 workers{suffix}"))
    fixed = {k: r for k, r in rates.items() if not k.startswith("auto")}
    best = max(fixed, key=fixed.__getitem__)
    best_p = max((k for k in fixed if "thread" not in k), key=fixed.__getitem__)
    auto, both = f"auto{suffix}", f"auto x auto{suffix}"
    final = {k: runs[k] for k in dict.fromkeys([best, best_p, auto, both])}
    rates = _rates(harness.compare(f"{workload}_final", final, repeats=confirm, baseline=best))
    out = {
        "best": best,
        "best_process": best_p,
        "auto_vs_best_process": rates[auto] / rates[best_p],
        "auto_x_auto_vs_best": rates[both] / rates[best],
    }
    print(
        f"{workload}: auto {out['auto_vs_best_process']:.0%} of {best_p}; "
        f"auto x auto {out['auto_x_auto_vs_best']:.0%} of {best}"
    )
    return out


def _rates(record: dict) -> dict[str, float]:
    return {k: v["samples_per_s"] for k, v in record["results"].items()}


def main() -> None:
    """Parse the command line and run the chosen workloads."""
    extra = argparse.ArgumentParser(add_help=False)
    choices = ["w1", "w4", "w3", "gil"]
    extra.add_argument("--workload", nargs="+", default=choices, choices=choices)
    extra.add_argument("--sweep", type=int, nargs="+", default=[0, 1, 2, 4, 8])
    extra.add_argument("--modes", nargs="+", default=["process", "thread"])
    extra.add_argument("--images", type=int, default=512)
    extra.add_argument("--confirm", type=int, default=11, help="runs of the autos against the best")
    ours, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    args = harness.cli((__doc__ or "").splitlines()[0], repeats=3)
    factories = {
        "w1": w1_factory,
        "w4": lambda: w4_factory(ours.images),
        "w3": w3_factory,
        "gil": lambda: gil_factory(ours.images),
    }
    for name in ours.workload:
        run(name, factories[name](), ours.sweep, ours.modes, args.repeats, ours.confirm)


if __name__ == "__main__":
    main()
