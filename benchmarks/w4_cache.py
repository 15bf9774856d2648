"""W4 with cached pixels: the JPEG folder of ``w4_images.py``, decoded once, cropped every epoch.

Side by side in one run, alternating (``harness.py``), 2 persistent workers each:
torchvision's ImageFolder + torch's DataLoader, stoker uncached, and stoker with
``ImageFolder(cache="memory")`` (decoded pixels in one shared-memory copy; the warm-up epoch
fills it, so the timed epochs are the second epoch on). Before timing, one epoch of the
uncached and of the (filled) cached stoker with the same seed are compared batch by batch::

    PYTHONPATH=src PYTHON benchmarks/w4_cache.py [--images 512] [--quick]

It prints images/s, the ratios over torch (``ratio``) and cached over uncached stoker.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import harness
import w4_images
from w4_images import BATCH, MEAN, STD, make_folder


def stoker_loader(root: Path, workers: int, cache: bool, seed: int | None = None) -> Any:
    """stoker's W4 loader (torch tensors), with the pixel cache or without."""
    import stoker
    from stoker.vision import ImageFolder
    from stoker.vision import transforms as T

    tf = T.Compose(
        [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
    )
    kw: dict[str, Any] = {}
    if cache:  # every decoded image at full size, with room to spare
        kw = {"cache": "memory", "cache_budget": _budget(root)}
    ds = ImageFolder(str(root), transform=tf, **kw)
    return stoker.DataLoader(
        ds,
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        tensor_type="torch",
        persistent_workers=workers > 0,
        generator=seed,
    )


def _budget(root: Path) -> int:
    """Bytes for every image of the folder decoded at full size (500 x 375 RGB), and 10%."""
    files = sum(len(files) for _, _, files in os.walk(root))
    return files * 500 * 375 * 3 * 11 // 10 + (16 << 20)


def same_batches(root: Path, workers: int) -> bool:
    """Whether one epoch of the cached stoker (its cache filled first) gives the uncached
    stoker's batches, byte for byte, for the same seed."""
    cached = stoker_loader(root, workers, cache=True, seed=1234)
    plain = stoker_loader(root, workers, cache=False, seed=1234)
    for loader in (cached, plain):  # epoch 1 of both: it fills the cache
        for _ in loader:
            pass
    same = True
    for (a, ta), (b, tb) in zip(plain, cached, strict=True):
        same = same and np.array_equal(a.numpy(), b.numpy()) and np.array_equal(ta, tb)
    stats = cached.statistics().cache
    print(f"cached vs uncached batches, epoch 2, same seed: {'identical' if same else 'DIFFER'}")
    print(f"cache: {stats}")
    return same


def main() -> None:
    """Build the folder, check identity, time the three contenders, print the ratios."""
    import argparse

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--images", type=int, default=512)
    extra.add_argument("--workers", type=int, default=2)
    extra.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "stoker_w4"))
    ours, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    args = harness.cli(__doc__.splitlines()[0], repeats=5)
    root = make_folder(Path(ours.data) / f"img{ours.images}", ours.images)
    workers = ours.workers
    same = same_batches(root, workers)

    def epochs(loader: Any) -> harness.Run:
        return lambda: w4_images._epoch(loader)

    contenders = {
        "torch": w4_images.torch_contender(root, workers, persistent=True),
        "stoker": epochs(stoker_loader(root, workers, cache=False)),
        "stoker cached": epochs(stoker_loader(root, workers, cache=True)),
    }
    record = harness.compare(
        f"w4_cache_{workers}w",
        contenders,
        repeats=args.repeats,
        warmup=max(1, args.warmup),  # the cached contender's first epoch fills the cache
        config={
            "images": ours.images,
            "batch_size": BATCH,
            "num_workers": workers,
            "persistent_workers": True,
            "transform": "RandomResizedCrop(224)+flip+ToTensor+Normalize",
            "cache": "memory, decoded pixels at full size",
            "identical_batches": same,
        },
    )
    r = record["results"]
    rate = "images_per_s"
    print(
        f"stoker cached / stoker: {r['stoker cached'][rate] / r['stoker'][rate]:.2f}x; "
        f"stoker cached / torch: {r['stoker cached'][rate] / r['torch'][rate]:.2f}x; "
        f"batches identical: {same}"
    )


if __name__ == "__main__":
    main()
