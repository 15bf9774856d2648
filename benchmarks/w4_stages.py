"""W4's CPU per image, by stage, in process, on both of stoker's paths.

The W4 folder (see ``w4_images.py``) through RandomResizedCrop(224) + RandomHorizontalFlip
+ ToTensor + Normalize. Each path runs in its own fresh process: ``numpy`` never imports
torch (NumPy batches), ``torch`` imports it first (``tensor_type="torch"``). Run with
stoker's environment (torch only for the torch path)::

    python benchmarks/w4_stages.py [--images 256] [--rounds 3] [--path numpy torch]

Per image, on one thread, the fast path's steps one by one, as ``_fused.execute`` runs
them (thread CPU time, medians over the images of all rounds): read (the file's bytes),
Python (the header and random draws of ``prepare``), decode (the crop's rectangle),
resample, normalise. Then one in-process DataLoader epoch per round (``num_workers=0``,
batch 64, shuffled; its decode threads included): its images/s and CPU per image; "rest"
is that CPU less the stages' sum: the loader, the batch (no transport in process), threads
and Python glue.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from w4_images import BATCH, MEAN, STD, make_folder

STAGES = ("read", "python", "decode", "resample", "normalize")


def _stages(plan: Any, paths: list[str]) -> dict[str, list[float]]:
    """Each stage's thread CPU time per image, in microseconds, run as ``execute`` runs it."""
    import numpy as np

    from stoker.vision import _decode, _fused, _workspace
    from stoker.vision.transforms._base import pil_filter

    clock = time.thread_time_ns
    got: dict[str, list[float]] = {s: [] for s in STAGES}
    scratch = np.empty((224, 224, 3), np.uint8)
    out = np.empty((3, 224, 224), np.float32)
    flt = pil_filter(plan.geometry.interpolation)
    for path in paths:
        t0 = clock()
        data = _workspace.read(path, 0)  # as ImageFolder reads a batch's files
        t1 = clock()
        job = _fused.prepare(plan, path, data)
        t2 = clock()
        assert job is not None
        divisor = _decode.dct_divisor(*job.box[2:], *job.out)
        origin, src = _fused._decode_crop(job, divisor)
        t3 = clock()
        hwc = _fused._resample(src, job, divisor, True, flt, origin, scratch)
        for vertical in job.flips:
            hwc = hwc[::-1] if vertical else hwc[:, ::-1]
        t4 = clock()
        _fused.normalize(plan, hwc, out)
        t5 = clock()
        marks = (t0, t1, t2, t3, t4, t5)
        for i, stage in enumerate(STAGES):
            got[stage].append((marks[i + 1] - marks[i]) / 1e3)
    return got


def run_path(path: str, root: Path, rounds: int) -> dict[str, Any]:
    """This process's measurements for one path (``numpy`` must not have imported torch)."""
    if path == "torch":
        import torch  # noqa: F401  (imported first, as a torch user's process has it)
    import stoker
    from stoker.vision import ImageFolder, _fused
    from stoker.vision import transforms as T

    tf = T.Compose(
        [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
    )
    ds = ImageFolder(str(root), transform=tf)
    plan = ds._fast_plan()
    assert plan is not None and _fused._native is not None, "needs the C kernels built"
    files = [str(p) for p, _ in ds.samples]
    stages: dict[str, list[float]] = {s: [] for s in STAGES}
    loader = stoker.DataLoader(ds, batch_size=BATCH, shuffle=True, tensor_type=path)
    epochs = []
    for _ in range(rounds):
        for stage, values in _stages(plan, files).items():
            stages[stage].extend(values)
        cpu, start, n = time.process_time(), time.perf_counter(), 0
        for images, _ in loader:
            n += len(images)
        epochs.append((n, time.perf_counter() - start, time.process_time() - cpu))
    if path == "numpy":
        assert "torch" not in sys.modules, "the NumPy path imported torch"
    per_stage = {s: statistics.median(v) for s, v in stages.items()}
    cpu_us = statistics.median(c / n * 1e6 for n, _, c in epochs)
    return {
        "path": path,
        "resample_kernel": _fused._native.RESAMPLE_KERNEL,
        "stages_us": per_stage,
        "loader_images_per_s": [n / s for n, s, _ in epochs],
        "loader_cpu_us_per_image": cpu_us,
        "rest_us": cpu_us - math.fsum(per_stage.values()),
    }


def main() -> None:
    """Run each asked path in a fresh process, then print the table."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--path", nargs="+", default=["numpy", "torch"])
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "stoker_w4"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    root = make_folder(Path(args.data), args.images)
    if args.child:
        print(json.dumps(run_path(args.path[0], root, args.rounds)))
        return
    results = []
    for path in args.path:
        cmd = [sys.executable, __file__, "--child", "--path", path, "--data", args.data]
        cmd += ["--images", str(args.images), "--rounds", str(args.rounds)]
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"W4 per image, in process, {args.images} images x {args.rounds} rounds (us of CPU)")
    print("| path | " + " | ".join(STAGES) + " | rest | loader CPU | images/s (rounds) |")
    print("|---" * (len(STAGES) + 4) + "|")
    for r in results:
        cells = [f"{r['stages_us'][s]:.0f}" for s in STAGES]
        rates = ", ".join(f"{v:.0f}" for v in r["loader_images_per_s"])
        print(
            f"| {r['path']} ({r['resample_kernel']}) | "
            + " | ".join(cells)
            + f" | {r['rest_us']:.0f} | {r['loader_cpu_us_per_image']:.0f} | {rates} |"
        )


if __name__ == "__main__":
    main()
