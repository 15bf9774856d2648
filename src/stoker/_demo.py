"""``stoker demo``: the whole product on data stoker makes itself, with the figures that matter.

1. Images: a small JPEG folder written to a temp dir, loaded through ``ImageFolder`` and the
   fused fast-path transforms with ``num_workers="auto"``; images/s and the loader's
   statistics (how input-bound, how many workers, why).
2. Checkpoint: ``state_dict()`` mid-epoch, then a fresh loader resumes it; the remaining
   batches hash the same as those of the uninterrupted run.
3. Tensors: an in-process ``TensorDataset`` throughput line.

The command prints (it is a command, not library code); the temp dir is always removed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from stoker import DataLoader, TensorDataset

_IMAGES = 256
_SIZE = (500, 375)
_IMAGE_BATCH = 32
_CHECKPOINT_AT = 3
_MEAN = [0.485, 0.456, 0.406]
_STD = [0.229, 0.224, 0.225]


def run_demo(samples: int, batch_size: int, epochs: int) -> int:
    """Runs the three parts (images, checkpoint, tensors) and prints what they show; returns 0.

    Args:
        samples: samples in the in-process TensorDataset part.
        batch_size: its batch size.
        epochs: its epochs.
    """
    if importlib.util.find_spec("PIL") is None:
        print("stoker demo: Pillow is not installed, so the image part is skipped")
        print("  (pip install 'stoker[vision]' to see it).")
    else:
        with tempfile.TemporaryDirectory(prefix="stoker-demo-") as tmp:
            root = _write_images(Path(tmp))
            _images(root)
            _checkpoint(root)
    _tensors(samples, batch_size, epochs)
    from stoker._doctor import fast_paths_off

    if fast_paths_off():
        print(
            "\nSome fast paths are off here: `stoker doctor` says which, and how to turn them on."
        )
    return 0


def _write_images(root: Path) -> Path:
    """Write ``_IMAGES`` photo-like JPEGs in 4 class folders under ``root``."""
    from PIL import Image

    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    width, height = _SIZE
    for i in range(_IMAGES):
        small = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize(_SIZE, Image.Resampling.BICUBIC)
        grain = rng.integers(-14, 15, (height, width, 3))
        pixels = np.clip(np.asarray(img).astype(np.int16) + grain, 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "JPEG", quality=90)
        folder = root / f"class{i % 4}"
        folder.mkdir(exist_ok=True)
        (folder / f"{i:04d}.jpg").write_bytes(buf.getvalue())
    took = time.perf_counter() - t0
    print(f"stoker demo: wrote {_IMAGES} JPEGs of {width}x{height} to {root} ({took:.1f} s)")
    return root


def _image_loader(root: Path) -> DataLoader[Any]:
    """ImageFolder + the fast-path transforms, shuffled, seeded, workers on auto."""
    from stoker.vision import ImageFolder
    from stoker.vision import transforms as T

    tf = T.Compose(
        [
            T.RandomResizedCrop(224),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(_MEAN, _STD),
        ]
    )
    dataset = ImageFolder(str(root), transform=tf)
    return DataLoader(
        dataset,
        batch_size=_IMAGE_BATCH,
        shuffle=True,
        generator=0,
        num_workers="auto",
        persistent_workers=True,
    )


def _images(root: Path) -> None:
    """Two epochs through the image loader; images/s and the statistics of each."""
    loader = _image_loader(root)
    print(
        f"\nImageFolder -> RandomResizedCrop(224) + flip + ToTensor + Normalize, "
        f"batch {_IMAGE_BATCH}, num_workers='auto' (persistent)"
    )
    for epoch in range(2):
        t0 = time.perf_counter()
        n = sum(len(labels) for _, labels in loader)
        took = time.perf_counter() - t0
        s = loader.statistics()
        print(
            f"  epoch {epoch}: {n / took:,.0f} images/s; waited for data "
            f"{s.input_bound:.0%} of the time; {s.num_workers} workers, prefetch "
            f"{s.prefetch_factor}; {s.bytes_moved / 2**20:,.0f} MiB moved"
        )
    print("  autotune decisions:")
    for decision in loader.statistics().autotune or ("(none)",):
        print(f"    - {decision}")
    del loader  # stops its persistent workers


def _digest(batches: Any) -> tuple[int, str]:
    """(count, sha256) over every array of the batches."""
    h = hashlib.sha256()
    count = 0
    for images, labels in batches:
        h.update(np.ascontiguousarray(images).tobytes())
        h.update(np.ascontiguousarray(labels).tobytes())
        count += 1
    return count, h.hexdigest()[:16]


def _checkpoint(root: Path) -> None:
    """state_dict() after a few batches; a fresh loader resumes to the same bytes."""
    loader = _image_loader(root)
    it = iter(loader)
    for _ in range(_CHECKPOINT_AT):
        next(it)
    state = loader.state_dict()
    count, straight = _digest(it)
    del it, loader
    resumed = _image_loader(root)
    resumed.load_state_dict(state)
    again_count, again = _digest(resumed)
    del resumed
    verdict = "exact resume" if (count, straight) == (again_count, again) else "MISMATCH"
    print(
        f"\nCheckpoint after batch {_CHECKPOINT_AT}: state_dict() = {len(str(state))} chars; "
        f"the remaining {count} batches hash {straight}, resumed in a new loader "
        f"{again_count} batches hash {again}: {verdict}"
    )


def _tensors(samples: int, batch_size: int, epochs: int) -> None:
    """In-process throughput over a TensorDataset of small rows."""
    rng = np.random.default_rng(0)
    features = rng.standard_normal((samples, 8), dtype=np.float32)
    labels = rng.integers(0, 10, samples)
    loader: DataLoader[Any] = DataLoader(
        TensorDataset(features, labels), batch_size=batch_size, shuffle=True, generator=0
    )
    print(
        f"\nTensorDataset: {samples:,} samples (8 float32 features, int64 label), "
        f"batch_size={batch_size}, shuffled, in-process"
    )
    for epoch in range(epochs):
        t0 = time.perf_counter()
        seen = sum(len(y) for _, y in loader)
        took = time.perf_counter() - t0
        print(f"  epoch {epoch}: {seen:,} samples in {took * 1e3:.1f} ms = "
              f"{seen / took / 1e6:.2f} M samples/s")  # fmt: skip
    print("Same seed, same batches: DataLoader(..., generator=0) repeats a run exactly.")
