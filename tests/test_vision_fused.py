"""Tests of the fused fast path's torch resampler (where the C one is not built) and its
FusedBatch (stoker.vision._fused)."""

from __future__ import annotations

import pickle
import random
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import stoker
import stoker.vision as V
from stoker import _batch
from stoker._collate import DefaultCollate, collate
from stoker._fetch import MapFetcher
from stoker.vision import _fused
from stoker.vision import transforms as T
from test_vision_folder import _photo

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
TOL = 1 / 255 + 1e-6  # one level of 8 bits, after ToTensor


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    """root/{a,b}/ with photo-sized JPEGs (375 x 500, 480 x 640) and smaller ones."""
    sizes = [(375, 500), (480, 640), (120, 90), (375, 500)]
    for i, (h, w) in enumerate(sizes):
        folder = tmp_path / "ab"[i % 2]
        folder.mkdir(exist_ok=True)
        Image.fromarray(_photo(h, w, i)).save(folder / f"{i}.jpg", quality=90)
    return tmp_path


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records every resize through torch (the thread count it ran with), with stoker's C
    resampler off: torch's kernel is what resamples without it."""
    monkeypatch.setattr(_fused, "_NATIVE_RESAMPLE", False)
    seen: list[int] = []
    resize = _fused._torch_resize

    def spy(torch, *args):  # type: ignore[no-untyped-def]
        seen.append(torch.get_num_threads())
        return resize(torch, *args)

    monkeypatch.setattr(_fused, "_torch_resize", spy)
    return seen


def _outputs(ds: V.ImageFolder, seeds: range) -> list[np.ndarray]:
    out = []
    for seed in seeds:
        random.seed(seed)
        out.extend(np.array(ds[i][0]) for i in range(len(ds)))
    return out


def test_torch_resample_matches_pillow_for_random_crops(
    photos: Path, calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """RandomResizedCrop resampled by torch equals the Pillow-resampled fast path within 1/255."""
    pytest.importorskip("torch")
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor()])
    ds = V.ImageFolder(photos, transform=tf)
    with_torch = _outputs(ds, range(4))
    # all but crops decoded at reduced DCT scale whose box is not on whole pixels (Pillow)
    assert len(calls) >= len(with_torch) - 4
    monkeypatch.setattr(_fused, "_TORCH_RESAMPLE", False)
    count = len(calls)
    with_pillow = _outputs(ds, range(4))
    diffs = [np.abs(a - b).max() for a, b in zip(with_torch, with_pillow, strict=True)]
    assert max(diffs) <= TOL and len(calls) == count


def test_torch_resample_writes_interleaved_pixels() -> None:
    """torch resizes a crop into an interleaved H x W x 3 array, not into planes that it would
    first have to repack (a sixth of the resample's time)."""
    torch = pytest.importorskip("torch")
    crop = np.random.default_rng(0).integers(0, 256, (90, 120, 3), dtype=np.uint8)[5:80, 7:100]
    out = _fused._torch_resize(torch, crop, 32, 40)
    assert out.shape == (32, 40, 3) and out.flags.c_contiguous
    given = np.zeros((32, 40, 3), np.uint8)
    into = _fused._torch_resize(torch, crop, 32, 40, given)
    assert into is given and np.array_equal(given, out)  # written in place, the same pixels


@pytest.mark.parametrize("geometry", [(T.Resize(256), T.CenterCrop(224)), (T.Resize((96, 80)),)])
def test_resize_stays_on_pillow_and_matches_plain_path(
    photos: Path, calls: list[int], geometry: tuple[object, ...]
) -> None:
    """Resize [+ CenterCrop] stays on Pillow even with torch imported: within 1/255 of the
    plain path, as torchvision."""
    pytest.importorskip("torch")
    tf = T.Compose([*geometry, T.ToTensor()])
    fast = V.ImageFolder(photos, transform=tf)
    plain = V.ImageFolder(photos, transform=tf, loader=lambda p: V.pil_loader(p))
    for i in range(len(fast)):
        a, b = fast[i][0], np.asarray(plain[i][0])
        assert a.shape == b.shape and np.abs(a - b).max() <= TOL
    assert calls == []


@pytest.mark.parametrize("mode", [T.InterpolationMode.BICUBIC, T.InterpolationMode.NEAREST])
def test_other_filters_stay_on_pillow(
    photos: Path, calls: list[int], monkeypatch: pytest.MonkeyPatch, mode: T.InterpolationMode
) -> None:
    """Bicubic (up to 3/255 off in torch) and nearest resample with Pillow, exactly as before."""
    pytest.importorskip("torch")
    ds = V.ImageFolder(
        photos, transform=T.Compose([T.RandomResizedCrop(64, interpolation=mode), T.ToTensor()])
    )
    first = _outputs(ds, range(2))
    monkeypatch.setattr(_fused, "_TORCH_RESAMPLE", False)
    second = _outputs(ds, range(2))
    assert calls == [] and all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))


@pytest.mark.parametrize("view", ["plain", "vflip", "hflip", "both", "crop", "read-only"])
def test_torch_normalize_gives_numpys_values_bit_for_bit(
    view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ToTensor + Normalize by torch equal NumPy's, for flipped and cropped views too."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(_fused, "_native", None)  # torch normalises where the C kernel is not
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a worker: torch normalises only then
    calls: list[object] = []
    monkeypatch.setattr(_fused, "_torch_normalize", _counted(_fused._torch_normalize, calls))
    p = _fused.plan(_train_tf())
    assert p is not None
    a = np.random.default_rng(0).integers(0, 256, (37, 41, 3), dtype=np.uint8)
    views = {"plain": a, "vflip": a[::-1], "hflip": a[:, ::-1], "both": a[::-1, ::-1]}
    views["crop"] = a[3:20, 5:30][:, ::-1]
    views["read-only"] = a.copy()
    views["read-only"].flags.writeable = False  # torch does not wrap it: NumPy does the work
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # torch warns when it wraps a read-only array
            by_torch = _fused.normalize(p, views[view])
    finally:
        torch.set_num_threads(threads)
    assert len(calls) == (view != "read-only")
    monkeypatch.setattr(_fused, "_TORCH_NORMALIZE", False)
    assert np.array_equal(by_torch, _fused.normalize(p, views[view]))


def _counted(fn: Any, calls: list[object]) -> Any:
    """``fn``, appending its first argument to ``calls`` on each call."""

    def spy(*args: Any) -> Any:
        calls.append(args[0])
        return fn(*args)

    return spy


def test_fast_path_never_imports_torch(photos: Path) -> None:
    """Without torch imported, the fast path resamples with stoker's C kernel where it is
    built (else Pillow) and does not import torch."""
    code = (
        "import sys\n"
        "from stoker.vision import ImageFolder, _fused, transforms as T\n"
        "calls = []\n"
        "if _fused._native is not None:\n"
        "    kernel = _fused._native.resample\n"
        "    _fused._native.resample = lambda *a: calls.append(a) or kernel(*a)\n"
        f"ds = ImageFolder({str(photos)!r}, transform=T.Compose([T.Resize(32), T.ToTensor()]))\n"
        "assert ds[0][0].shape[0] == 3 and len(ds.__getitems__([0, 1])) == 2\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert len(calls) == (3 if _fused._native is not None else 0), calls\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make __getitems__ return the plain list of samples, as before FusedBatch."""
    monkeypatch.setattr(_fused, "one_size", lambda jobs: False)


def _train_tf() -> T.Compose:
    return T.Compose(
        [T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
    )


def test_fused_batch_collates_straight_into_alloc(
    photos: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """collate copies a FusedBatch made outside a fetch into alloc's memory, bit for bit the
    values of the plain path."""
    ds = V.ImageFolder(photos, transform=_train_tf())
    idx = [3, 0, 2, 1, 0]
    random.seed(7)
    batch = ds.__getitems__(idx)
    assert isinstance(batch, _fused.FusedBatch)
    given: list[np.ndarray] = []

    def alloc(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        given.append(np.full(shape, -1, dtype))
        return given[-1]

    images, targets = collate(batch, tensor_type="numpy", alloc=alloc)
    assert images is given[0] and images.shape == (5, 3, 48, 48) and images.dtype == np.float32
    assert targets.dtype == np.int64 and targets.tolist() == [ds.targets[i] for i in idx]
    _eager(monkeypatch)
    random.seed(7)
    plain = ds.__getitems__(idx)
    assert type(plain) is list
    np.testing.assert_array_equal(images, np.stack([s for s, _ in plain]))


def test_a_fetch_normalises_images_straight_into_its_collate_memory(
    photos: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loaded by a fetcher for stoker's collate, the images are written into the collate's
    memory while they are decoded (each as it is resampled), and collate copies nothing:
    the same values as the plain path."""
    ds = V.ImageFolder(photos, transform=_train_tf())
    fetcher = MapFetcher(ds, True, DefaultCollate("numpy"))
    loading = [False]
    getitems = ds.__getitems__

    def spy(indices: list[int]) -> Any:
        loading[0] = True
        try:
            return getitems(indices)
        finally:
            loading[0] = False

    monkeypatch.setattr(ds, "__getitems__", spy)
    given: list[tuple[bool, np.ndarray]] = []

    def alloc(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        given.append((loading[0], np.full(shape, -1, dtype)))
        return given[-1][1]

    idx = [3, 0, 2, 1]
    random.seed(5)
    images, targets = fetcher.fetch(idx, alloc=alloc)
    assert [during for during, _ in given] == [True, False]  # the images, then the targets
    assert images is given[0][1] and targets is given[1][1]
    assert _batch.output_alloc() is None  # nothing left behind for the next load
    monkeypatch.setattr(ds, "__getitems__", getitems)
    _eager(monkeypatch)
    random.seed(5)
    plain = ds.__getitems__(idx)
    np.testing.assert_array_equal(images, np.stack([s for s, _ in plain]))


def test_fused_batch_is_the_list_of_samples(photos: Path) -> None:
    """A FusedBatch indexes, iterates, slices and pickles as the samples __getitem__ gives."""
    ds = V.ImageFolder(photos, transform=_train_tf())
    idx = [1, 3, 3, 0]
    random.seed(3)
    batch = ds.__getitems__(idx)
    random.seed(3)
    single = [ds[i] for i in idx]
    assert isinstance(batch, _fused.FusedBatch) and len(batch) == 4
    for (a, ta), (b, tb) in zip(batch, single, strict=True):
        assert ta == tb and type(ta) is int
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(batch[1:3][1][0], single[2][0])
    back = pickle.loads(pickle.dumps(batch))
    assert type(back) is list and back[3][1] == single[3][1]
    np.testing.assert_array_equal(back[3][0], single[3][0])


def test_target_transform_and_rest_keep_the_list_path(photos: Path) -> None:
    """Non-int targets or transforms after Normalize give the plain list, same values."""
    tf = T.Compose([T.RandomResizedCrop(16), T.ToTensor(), T.Lambda(lambda x: x * 2)])
    for ds in (
        V.ImageFolder(photos, transform=_train_tf(), target_transform=str),
        V.ImageFolder(photos, transform=tf),
    ):
        random.seed(1)
        batch = ds.__getitems__([0, 1])
        random.seed(1)
        single = [ds[0], ds[1]]
        assert type(batch) is list
        for (a, ta), (b, tb) in zip(batch, single, strict=True):
            assert ta == tb
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_batches_equal_the_eager_path(
    photos: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """DataLoader batches (main process, thread workers) equal those of the plain list path."""
    ds = V.ImageFolder(photos, transform=_train_tf())

    def batches() -> list[list[np.ndarray]]:
        kw = {"worker_mode": "thread"} if workers else {}
        loader = stoker.DataLoader(
            ds, batch_size=3, shuffle=True, generator=4, num_workers=workers, **kw
        )
        return [[np.array(x) for x in b] for b in loader]

    lazy = batches()
    _eager(monkeypatch)
    eager = batches()
    assert len(lazy) == len(eager) == 2
    for a, b in zip(lazy, eager, strict=True):
        assert all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_concat_of_image_folders_merges_fused_batches(photos: Path) -> None:
    """ConcatDataset of two ImageFolders collates their FusedBatches into one batch, in order."""
    ds = V.ImageFolder(photos, transform=_train_tf())
    both = stoker.ConcatDataset([ds, ds])
    random.seed(9)
    images, targets = collate(both.__getitems__([5, 0, 6]), tensor_type="numpy")
    random.seed(9)
    a0, a1, a2 = ds[0], ds[1], ds[2]  # ConcatDataset fetches per member, in member order
    single = [a1, a0, a2]
    assert targets.tolist() == [t for _, t in single]
    np.testing.assert_array_equal(images, np.stack([s for s, _ in single]))
