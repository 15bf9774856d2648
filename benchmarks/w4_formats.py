"""W4 from storage formats: the W4 image pipeline read from LMDB and from tar shards versus
from the JPEG folder, all with stoker's DataLoader, side by side (see ``harness.py``)::

    python benchmarks/w4_formats.py [--workers 2] [--images 512] [--quick]

The folder is W4's (``w4_images.make_folder``: 500 x 375 JPEGs, about 80 KB); it is packed
once with ``stoker.formats.pack`` into an LMDB file and a folder of shards beside it. Every
contender runs the same pipeline, RandomResizedCrop(224) + flip + ToTensor + Normalize
through stoker.vision (its fused JPEG path), batch 64, shuffled. The baseline is the
folder: a ratio >= 1 means the format is at least as fast. ``shards_stream`` is the
iterable reader (shuffle buffer 256).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import harness
from w4_images import BATCH, MEAN, STD, make_folder


def _transform() -> tuple[Any, str]:
    from stoker.vision import transforms as T

    tf = T.Compose(
        [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
    )
    return tf, "RandomResizedCrop(224)+flip+ToTensor+Normalize (stoker.vision)"


def _epoch(loader: Any) -> dict[str, float]:
    n = 0
    for images, _ in loader:
        n += len(images)
    return {"images": float(n)}


def contenders(root: Path, workers: int) -> tuple[dict[str, harness.Run], str]:
    """One run per format: one shuffled epoch through stoker's DataLoader."""
    import stoker
    from stoker.formats import LMDBDataset, ShardDataset, ShardIterable, pack

    lmdb_path = root.with_name(root.name + ".lmdb")
    shard_dir = root.with_name(root.name + ".shards")
    if not lmdb_path.exists():
        pack(root, lmdb_path, "lmdb", progress=False)
    if not shard_dir.exists():
        pack(root, shard_dir, "shards", maxcount=128, progress=False)
    tf, label = _transform()
    from stoker.vision import ImageFolder

    datasets: dict[str, Any] = {
        "folder": ImageFolder(str(root), transform=tf),
        "lmdb": LMDBDataset(lmdb_path, transform=tf),
        "shards": ShardDataset(shard_dir, transform=tf),
    }
    runs: dict[str, harness.Run] = {}
    for name, ds in datasets.items():
        loader = stoker.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=workers)
        runs[name] = lambda loader=loader: _epoch(loader)
    stream = ShardIterable(shard_dir, transform=tf, buffer_size=256)
    it_loader = stoker.DataLoader(stream, batch_size=BATCH, num_workers=workers)
    runs["shards_stream"] = lambda: _epoch(it_loader)
    return runs, label


def main() -> None:
    """Parse the command line, build and pack the folder, and compare per worker count."""
    import argparse

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--workers", type=int, nargs="+", default=[2])
    extra.add_argument("--images", type=int, default=512)
    extra.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "stoker_w4f"))
    ours, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    args = harness.cli(__doc__.splitlines()[0], repeats=5)
    root = make_folder(Path(ours.data) / f"img{ours.images}", ours.images)
    for workers in ours.workers:
        runs, label = contenders(root, workers)
        harness.compare(
            f"w4_formats_{workers}w",
            runs,
            repeats=args.repeats,
            baseline="folder",
            config={
                "images": ours.images,
                "batch_size": BATCH,
                "num_workers": workers,
                "size": "500x375",
                "transform": label,
            },
            warmup=args.warmup,
        )


if __name__ == "__main__":
    main()
