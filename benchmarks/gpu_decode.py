"""W4 with GPU JPEG decode: images/s reaching the GPU, against two CPU pipelines.

Needs CUDA and torchvision. W4's folder (500 x 375 JPEGs, see ``w4_images.py``) through
RandomResizedCrop(224) + flip + ToTensor + Normalize, batch 64, every batch ending on the
GPU as N x 3 x 224 x 224 float32::

    PYTHONPATH=src python benchmarks/gpu_decode.py [--images 1024] [--workers 8] [--json out.json]

- torchvision: its ImageFolder and transforms, torch's DataLoader with pin_memory=True,
  then ``.to("cuda", non_blocking=True)``;
- stoker CPU: stoker.vision's ImageFolder (the fused CPU path), pin_memory=True, the same
  copy;
- stoker GPU: ``ImageFolder(..., decode="gpu")``: workers read the bytes and draw the
  crops, the GPU decodes (nvjpeg) and transforms.

Each runs persistent workers, one warm-up epoch, then ``--epochs`` epochs alternating;
images/s is the median. :func:`agreement` measures how far GPU-decoded batches are from
the CPU path's with the same seed (in 8-bit levels).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from w4_images import BATCH, MEAN, STD, make_folder

CONTENDERS = ("torchvision", "stoker CPU", "stoker GPU")


def _loader(which: str, root: Path, workers: int) -> Any:
    """A persistent loader for one contender."""
    import torch

    import stoker

    kw: dict[str, Any] = {"batch_size": BATCH, "shuffle": True, "num_workers": workers}
    kw["persistent_workers"] = workers > 0
    if which == "torchvision":
        from torchvision import datasets
        from torchvision import transforms as TT

        tf: Any = TT.Compose(
            [
                TT.RandomResizedCrop(224),
                TT.RandomHorizontalFlip(),
                TT.ToTensor(),
                TT.Normalize(MEAN, STD),
            ]
        )
        ds: Any = datasets.ImageFolder(str(root), transform=tf)
        return torch.utils.data.DataLoader(ds, pin_memory=True, **kw)
    from stoker.vision import ImageFolder
    from stoker.vision import transforms as T

    tf = T.Compose(
        [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
    )
    decode = "gpu" if which == "stoker GPU" else "cpu"
    ds = ImageFolder(str(root), transform=tf, decode=decode)
    return stoker.DataLoader(ds, tensor_type="torch", pin_memory=decode == "cpu", **kw)


def _epoch(loader: Any) -> dict[str, float]:
    """One epoch, every batch on the GPU; images/s until the GPU has the last one."""
    import torch

    n = 0
    start = time.perf_counter()
    for images, _ in loader:
        images = images.to("cuda", non_blocking=True)
        n += len(images)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {"images": n, "seconds": seconds, "images_per_s": n / seconds}


def w4(root: Path, workers: int = 8, epochs: int = 3) -> dict[str, Any]:
    """Images/s reaching the GPU per contender (median of ``epochs``), alternating."""
    loaders = {name: _loader(name, root, workers) for name in CONTENDERS}
    runs: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    for name in CONTENDERS:
        _epoch(loaders[name])  # warm-up: workers start, nvjpeg initialises
    for i in range(epochs):
        for name in CONTENDERS if i % 2 == 0 else CONTENDERS[::-1]:
            runs[name].append(_epoch(loaders[name])["images_per_s"])
    out: dict[str, Any] = {"workers": workers, "batch": BATCH}
    for name in CONTENDERS:
        out[name] = {"images_per_s": statistics.median(runs[name]), "runs": runs[name]}
    base = out["torchvision"]["images_per_s"]
    out["gpu_vs_torchvision"] = out["stoker GPU"]["images_per_s"] / base
    out["gpu_vs_stoker_cpu"] = out["stoker GPU"]["images_per_s"] / out["stoker CPU"]["images_per_s"]
    return out


def agreement(root: Path, batches: int = 2) -> dict[str, Any]:
    """GPU-decoded batches against the plain CPU path's (Pillow decode, same seed and
    draws): mean, 99th percentile and largest difference in 8-bit levels."""
    import stoker
    from stoker.vision import ImageFolder, default_loader
    from stoker.vision import transforms as T

    tf = T.Compose(
        [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
    )
    kw: dict[str, Any] = {"batch_size": BATCH, "shuffle": True, "tensor_type": "torch"}
    plain = ImageFolder(str(root), transform=tf, loader=default_loader.__call__)
    gpu = ImageFolder(str(root), transform=tf, decode="gpu")
    diffs = []
    want_it = iter(stoker.DataLoader(plain, generator=np.random.default_rng(1), **kw))
    got_it = iter(stoker.DataLoader(gpu, generator=np.random.default_rng(1), **kw))
    std = np.asarray(STD).reshape(3, 1, 1)
    for _ in range(batches):
        (want, _), (got, _) = next(want_it), next(got_it)
        assert got.device.type == "cuda", got.device
        diffs.append(np.abs(got.cpu().numpy() - want.numpy()) * std * 255)
    d = np.concatenate(diffs)
    return {
        "mean_levels": float(d.mean()),
        "p99_levels": float(np.percentile(d, 99)),
        "max_levels": float(d.max()),
        "images": int(d.shape[0]),
    }


def main() -> None:
    """Build the folder, measure, print (and write JSON with --json)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--data", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    root = Path(args.data or Path(tempfile.gettempdir()) / "stoker-w4")
    make_folder(root, args.images)
    record = {"agreement": agreement(root), "w4": w4(root, args.workers, args.epochs)}
    print(json.dumps(record, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
