"""ImageFolder(decode="gpu"): the batch-wise crop, resize, flip and normalise, on the CPU here.

The device step (:mod:`stoker.vision._gpu`) takes tensors on any device; on the CPU its
images are decoded by Pillow, the CPU path's decoder, so its batches must equal the plain
CPU path's (Pillow crop + resize, flips, ToTensor, Normalize) with the same draws, within
TOL: one 8-bit level per value for bilinear (torch's float antialiased filter rounded to
levels against Pillow's fixed-point one), three for bicubic. On CUDA (nvjpeg decodes) the
same tests run with the CUDA_* tolerances: nvjpeg's IDCT and chroma upsampling are not
libjpeg's.
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import stoker
import stoker.vision as V
from stoker.vision import _gpu
from stoker.vision import transforms as T
from test_vision_folder import _photo

torch = pytest.importorskip("torch")

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
TOL = 1.0 + 1e-3
"""Largest difference allowed from the plain CPU path on the CPU device, in 8-bit levels
(bilinear; torch's bicubic differs from Pillow's by up to BICUBIC_TOL)."""
BICUBIC_TOL = 3.0 + 1e-3
CUDA_MEAN_TOL, CUDA_P99_TOL = 2.0, 12.0
"""On CUDA: the mean and 99th percentile of the difference allowed, in 8-bit levels."""


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """root/{a,b}/ with JPEGs of several sizes, one grayscale."""
    root = tmp_path_factory.mktemp("photos")
    sizes = [(375, 500), (480, 640), (120, 90), (300, 301), (64, 64)]
    for i, (h, w) in enumerate(sizes):
        folder = root / "ab"[i % 2]
        folder.mkdir(exist_ok=True)
        Image.fromarray(_photo(h, w, i)).save(folder / f"{i}.jpg", quality=90)
    Image.fromarray(_photo(200, 150, 9)[..., 0]).save(root / "a" / "gray.jpg", quality=90)
    return root


def _pipelines() -> list[T.Compose]:
    flips = [T.RandomHorizontalFlip(), T.RandomVerticalFlip(0.3)]
    return [
        T.Compose([T.RandomResizedCrop(64), *flips, T.ToTensor(), T.Normalize(MEAN, STD)]),
        T.Compose(
            [
                T.RandomResizedCrop((48, 80), interpolation=T.InterpolationMode.BICUBIC),
                T.RandomHorizontalFlip(),
                T.ToTensor(),
            ]
        ),
        T.Compose(
            [
                T.Resize(72),
                T.CenterCrop(64),
                T.RandomHorizontalFlip(),
                T.ToTensor(),
                T.Normalize(MEAN, STD),
            ]
        ),
    ]


def _levels(ours: Any, plain: np.ndarray, tf: T.Compose) -> np.ndarray:
    """|ours - plain| in 8-bit levels (undoing Normalize's std)."""
    norm = [t for t in tf.transforms if isinstance(t, T.Normalize)]
    std = np.asarray(norm[0].std if norm else [1.0]).reshape(-1, 1, 1)
    return np.abs(np.asarray(ours.cpu()) - plain) * std * 255


@pytest.mark.parametrize("index", range(3))
def test_device_step_equals_the_plain_cpu_path_with_the_same_draws(
    photos: Path, index: int
) -> None:
    """The worker half (draws + bytes) and the device half (decode, crop, resize, flip,
    normalise) give the plain path's batch for the same seed, within TOL, for random crops
    (bilinear and bicubic), Resize + CenterCrop, flips, and a grayscale JPEG."""
    tf = _pipelines()[index]
    plain = V.ImageFolder(photos, tf, loader=V.default_loader.__call__)  # not the fast path
    ours = V.ImageFolder(photos, tf, decode="gpu")
    n = len(plain)
    random.seed(7)
    want = np.stack([plain[i][0] for i in range(n)])
    random.seed(7)
    columns = stoker.default_collate(ours.__getitems__(list(range(n))))
    step = ours.main_process_step
    assert step is not None
    step.device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    images, targets = step(columns)
    assert images.shape == want.shape and images.dtype == torch.float32
    assert images.device.type == step.device.type
    assert targets.tolist() == [t for _, t in plain.samples]
    diff = _levels(images, want, tf)
    if step.device.type == "cpu":
        assert diff.max() <= (BICUBIC_TOL if index == 1 else TOL)
    else:
        assert diff.mean() <= CUDA_MEAN_TOL and np.percentile(diff, 99) <= CUDA_P99_TOL


def test_loader_runs_the_step_and_draws_as_the_cpu_path(photos: Path) -> None:
    """Through stoker's DataLoader (2 worker processes, seeded), decode='gpu' yields
    [N x 3 x H x W float32, targets] equal to the CPU path's batches of the same seed within
    TOL (CUDA_* on a GPU); without CUDA it warns once and runs on the CPU."""
    tf = _pipelines()[0]
    kw: dict[str, Any] = {"batch_size": 3, "shuffle": True, "tensor_type": "torch"}
    plain = V.ImageFolder(photos, tf, loader=V.default_loader.__call__)
    want = list(stoker.DataLoader(plain, generator=np.random.default_rng(5), **kw))
    ours = V.ImageFolder(photos, tf, decode="gpu")
    loader = stoker.DataLoader(ours, num_workers=2, generator=np.random.default_rng(5), **kw)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = list(loader)
    if not torch.cuda.is_available():
        assert sum("decode='gpu'" in str(w.message) for w in seen) == 1
    assert len(got) == len(want)
    for (images, targets), (w_images, w_targets) in zip(got, want, strict=True):
        assert targets.tolist() == w_targets.tolist()
        diff = _levels(images, w_images.numpy(), tf)
        assert diff.max() <= TOL if images.device.type == "cpu" else diff.mean() <= CUDA_MEAN_TOL


def test_decode_argument_is_checked(photos: Path) -> None:
    """decode takes 'cpu' or 'gpu'; 'gpu' needs a pipeline the device step runs, and says
    which it got and what to use instead."""
    with pytest.raises(ValueError, match="decode must be 'cpu'"):
        V.ImageFolder(photos, decode="cuda")
    with pytest.raises(ValueError, match="decode='gpu' needs a Compose") as err:
        V.ImageFolder(photos, T.Compose([T.ColorJitter(0.1), T.ToTensor()]), decode="gpu")
    assert "decode='cpu'" in str(err.value)
    with pytest.raises(ValueError, match="decode='gpu' needs"):
        V.ImageFolder(photos, _pipelines()[0], loader=V.default_loader.__call__, decode="gpu")
    assert V.ImageFolder(photos, _pipelines()[0]).main_process_step is None


def test_a_file_the_device_cannot_decode_is_named(photos: Path, tmp_path: Path) -> None:
    """A PNG among the JPEGs: decode='gpu' names the file and says what to do."""
    (tmp_path / "c").mkdir()
    Image.fromarray(_photo(32, 32, 1)).save(tmp_path / "c" / "x.png")
    ds = V.ImageFolder(tmp_path, _pipelines()[0], decode="gpu")
    with pytest.raises(ValueError, match=r"x\.png"):
        ds.__getitems__([0])


def test_geometry_columns_record_the_draws(photos: Path) -> None:
    """Per sample, the worker sends its crop box, resize size and flips: a random crop lies
    inside its image, a flip drawn twice cancels out."""
    tf = T.Compose(
        [
            T.RandomResizedCrop(32),
            T.RandomHorizontalFlip(1.0),
            T.RandomHorizontalFlip(1.0),
            T.ToTensor(),
        ]
    )
    ds = V.ImageFolder(photos, tf, decode="gpu")
    _, lengths, geom, _ = stoker.default_collate(ds.__getitems__(list(range(len(ds)))))
    assert geom.shape == (len(ds), len(_gpu.GEOMETRY_COLUMNS))
    for row, n, (path, _) in zip(geom.tolist(), lengths.tolist(), ds.samples, strict=True):
        top, left, h, w, rh, rw, hflip, vflip = row
        with Image.open(path) as img:
            width, height = img.size
        assert top >= 0 and top + h <= height and left >= 0 and left + w <= width
        assert (rh, rw, hflip, vflip) == (32, 32, 0, 0)
        assert n == Path(path).stat().st_size
