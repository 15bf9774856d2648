"""Tests of stoker.vision ImageFolder / DatasetFolder and the fused JPEG fast path."""

from __future__ import annotations

import io
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import stoker.vision as V
from stoker import StringArray
from stoker.vision import _decode, _fused
from stoker.vision import transforms as T

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _photo(h: int, w: int, seed: int) -> np.ndarray:
    """A smooth random picture with grain, which JPEG compresses like a photo."""
    rng = np.random.default_rng(seed)
    small = Image.fromarray(rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8))
    arr = np.asarray(small.resize((w, h), Image.Resampling.BICUBIC)).astype(np.int16)
    return np.clip(arr + rng.integers(-10, 11, (h, w, 3)), 0, 255).astype(np.uint8)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """root/{cat,dog}/ with real JPEG files (and one PNG and a non-image to skip)."""
    for c, cls in enumerate(("dog", "cat")):
        (tmp_path / cls).mkdir()
        for i in range(3):
            Image.fromarray(_photo(60 + 10 * i, 80, seed=10 * c + i)).save(
                tmp_path / cls / f"{i}.jpg", quality=90
            )
    Image.fromarray(_photo(40, 40, 99)).save(tmp_path / "cat" / "p.png")
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    return tmp_path


def test_public_names() -> None:
    """stoker.vision's __all__ is sorted and its classes report the public module."""
    assert V.__all__ == sorted(V.__all__)
    for name in ("ImageFolder", "DatasetFolder", "CIFAR10", "CIFAR100"):
        assert getattr(V, name).__module__ == "stoker.vision"


def test_imagefolder_attributes_match_torchvision_layout(tree: Path) -> None:
    """classes sorted, class_to_idx, samples in sorted order, targets; RGB PIL samples."""
    ds = V.ImageFolder(tree)
    assert ds.classes == ["cat", "dog"] and ds.class_to_idx == {"cat": 0, "dog": 1}
    names = [Path(p).name for p, _ in ds.samples]
    assert names == ["0.jpg", "1.jpg", "2.jpg", "p.png", "0.jpg", "1.jpg", "2.jpg"]
    assert list(ds.targets) == [0, 0, 0, 0, 1, 1, 1] and ds.imgs is ds.samples
    assert ds.samples[0] == (str(tree / "cat" / "0.jpg"), 0)
    assert np.bincount(ds.targets).tolist() == [4, 3]
    img, target = ds[4]
    assert isinstance(img, Image.Image) and img.mode == "RGB" and target == 1
    assert len(ds) == 7


def test_samples_are_refcount_free_and_pickle(tree: Path) -> None:
    """samples holds a StringArray and an array (no per-file objects); pickle round-trips."""
    ds = V.ImageFolder(tree, transform=T.Compose([T.Resize(16), T.ToTensor()]))
    assert isinstance(ds.samples._paths, StringArray)
    assert isinstance(ds.samples._targets, np.ndarray)
    back = pickle.loads(pickle.dumps(ds))
    assert list(back.samples) == list(ds.samples)
    np.testing.assert_array_equal(back[1][0], ds[1][0])


def test_datasetfolder_with_custom_loader_and_filter(tree: Path) -> None:
    """DatasetFolder takes a loader, extensions or is_valid_file, and a target_transform."""
    ds = V.DatasetFolder(
        tree,
        loader=lambda p: Path(p).suffix,
        extensions=(".txt",),
        target_transform=lambda t: t * 10,
        allow_empty=True,
    )
    assert [s for s in ds] == [(".txt", 0)]
    ds2 = V.ImageFolder(tree, is_valid_file=lambda p: p.endswith("1.jpg"))
    assert len(ds2) == 2
    with pytest.raises(ValueError, match=r"extensions and is_valid_file"):
        V.make_dataset(tree, {"cat": 0}, extensions=(".jpg",), is_valid_file=lambda p: True)


def test_missing_root_and_empty_class_errors(tree: Path, tmp_path_factory) -> None:
    """A missing root or an empty class folder raises FileNotFoundError naming path and fix."""
    missing = tree / "nope"
    with pytest.raises(FileNotFoundError, match=r"does not exist.*one subfolder per class"):
        V.ImageFolder(missing)
    (tree / "empty").mkdir()
    with pytest.raises(
        FileNotFoundError, match=r"no valid file for the classes empty.*allow_empty"
    ):
        V.ImageFolder(tree)
    ds = V.ImageFolder(tree, allow_empty=True)
    assert ds.classes == ["cat", "dog", "empty"]
    flat = tmp_path_factory.mktemp("flat")
    (flat / "x.jpg").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"class folder"):
        V.ImageFolder(flat)


@pytest.mark.parametrize("kind", ["garbage", "truncated", "empty"])
def test_corrupt_files_raise_naming_the_file(tmp_path: Path, kind: str) -> None:
    """Corrupt, truncated or empty files raise OSError naming the file, on both paths."""
    (tmp_path / "c").mkdir()
    buf = io.BytesIO()
    Image.fromarray(_photo(64, 64, 1)).save(buf, "JPEG")
    data = {
        "garbage": b"\xff\xd8\xff" + b"nonsense" * 50,
        "truncated": buf.getvalue()[:600],
        "empty": b"",
    }[kind]
    bad = tmp_path / "c" / "bad.jpg"
    bad.write_bytes(data)
    fused = T.Compose([T.RandomResizedCrop(16), T.ToTensor()])
    for ds in (V.ImageFolder(tmp_path), V.ImageFolder(tmp_path, transform=fused)):
        with pytest.raises(OSError, match=r"bad.jpg"):
            ds[0]
        with pytest.raises(OSError, match=r"bad.jpg"):
            ds.__getitems__([0])


def test_decompression_bomb_limit_stays_on(tmp_path: Path, monkeypatch) -> None:
    """Images over twice Pillow's pixel limit are refused on the plain and the fast path."""
    (tmp_path / "c").mkdir()
    Image.fromarray(_photo(64, 64, 2)).save(tmp_path / "c" / "big.jpg")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    fused = T.Compose([T.Resize(16), T.ToTensor()])
    for ds in (V.ImageFolder(tmp_path), V.ImageFolder(tmp_path, transform=fused)):
        with pytest.raises(Image.DecompressionBombError, match=r"big.jpg"):
            ds[0]


@pytest.mark.parametrize("mode", ["L", "P", "RGBA", "CMYK", "LA"])
def test_every_mode_comes_out_rgb(tmp_path: Path, mode: str) -> None:
    """Greyscale, palette, alpha and CMYK images load as 3-channel RGB on both paths."""
    (tmp_path / "c").mkdir()
    img = Image.fromarray(_photo(32, 32, 3)).convert(mode)
    ext = "jpg" if mode in ("L", "CMYK") else "png"
    img.save(tmp_path / "c" / f"x.{ext}")
    assert V.ImageFolder(tmp_path)[0][0].mode == "RGB"
    fused = T.Compose([T.RandomResizedCrop(16), T.ToTensor()])
    out = V.ImageFolder(tmp_path, transform=fused)[0][0]
    assert out.shape == (3, 16, 16) and out.dtype == np.float32


def test_plan_accepts_the_fast_prefix_only() -> None:
    """The fused plan is made for crop/resize + flips + ToTensor [+ Normalize] prefixes only."""
    ok = [
        [T.RandomResizedCrop(8), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)],
        [T.Resize(8), T.CenterCrop(8), T.ToTensor()],
        [T.Resize((8, 9)), T.ToTensor(), T.Normalize(MEAN, STD), T.Lambda(lambda x: x)],
    ]
    bad = [
        [T.RandomResizedCrop(8), T.ColorJitter(0.1), T.ToTensor()],
        [T.CenterCrop(8), T.ToTensor()],
        [T.RandomResizedCrop(8)],
    ]
    assert all(_fused.plan(T.Compose(ts)) is not None for ts in ok)
    assert all(_fused.plan(T.Compose(ts)) is None for ts in bad)
    assert _fused.plan(lambda x: x) is None


def _both(tree: Path, tf: T.Compose) -> tuple[V.ImageFolder, V.ImageFolder]:
    fast = V.ImageFolder(tree, transform=tf)
    plain = V.ImageFolder(tree, transform=tf, loader=lambda p: V.pil_loader(p))
    assert fast._fast_plan() is not None and plain._fast_plan() is None
    return fast, plain


def test_fast_path_matches_plain_path_at_full_scale(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the same seed and the accurate IDCT, full-scale fused output equals the plain path."""
    monkeypatch.setattr(_fused, "_FAST_RANDOM_DECODE", False)
    monkeypatch.setattr(_fused, "_TORCH_RESAMPLE", False)  # Pillow's filter, as the plain path
    tf = T.Compose(
        [T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
    )
    fast, plain = _both(tree, tf)
    for i in range(len(fast)):
        for seed in range(4):
            random.seed(seed)
            a, ta = fast[i]
            random.seed(seed)
            b, tb = plain[i]
            assert ta == tb and a.shape == b.shape == (3, 48, 48)
            np.testing.assert_allclose(a, b, atol=1e-4)


def test_random_crop_fast_decode_stays_close_to_plain_path(tree: Path) -> None:
    """RandomResizedCrop's fast IDCT decode draws the same crop and differs by a few /255."""
    tf = T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ToTensor()])
    fast, plain = _both(tree, tf)
    assert fast._fast_plan().fast_decode  # type: ignore[union-attr]
    diffs = []
    for i in range(len(fast)):
        for seed in range(4):
            random.seed(seed)
            a = fast[i][0]
            after_fast = random.random()
            random.seed(seed)
            b = plain[i][0]
            assert random.random() == after_fast  # same draws, in the same number
            diffs.append(np.abs(a - np.asarray(b)))
    assert np.mean([d.mean() for d in diffs]) < 3 / 255
    assert max(d.max() for d in diffs) < 64 / 255


def test_resize_path_is_exact_on_large_images(tmp_path: Path) -> None:
    """Resize + CenterCrop decodes at full scale even when DCT scaling would apply: exact."""
    (tmp_path / "c").mkdir()
    Image.fromarray(_photo(480, 640, 7)).save(tmp_path / "c" / "big.jpg", quality=92)
    tf = T.Compose([T.Resize(64), T.CenterCrop(56), T.ToTensor()])
    fast, plain = _both(tmp_path, tf)
    assert not fast._fast_plan().fast_decode  # type: ignore[union-attr]
    a, b = fast[0][0], plain[0][0]
    assert a.shape == b.shape == (3, 56, 56)
    np.testing.assert_allclose(a, b, atol=1e-4)


def test_random_crop_dct_scaling_stays_close(tmp_path: Path) -> None:
    """A random crop decoded at reduced DCT scale stays within mean 6/255 of the plain path."""
    (tmp_path / "c").mkdir()
    Image.fromarray(_photo(480, 640, 7)).save(tmp_path / "c" / "big.jpg", quality=92)
    tf = T.Compose([T.RandomResizedCrop(32, scale=(0.9, 1.0)), T.ToTensor()])
    fast, plain = _both(tmp_path, tf)
    random.seed(3)
    a = fast[0][0]
    random.seed(3)
    b = plain[0][0]
    diff = np.abs(a - np.asarray(b))
    assert diff.mean() < 6 / 255 and diff.max() < 64 / 255


def test_batch_array_is_reused_only_when_no_sample_is_alive(tree: Path) -> None:
    """__getitems__ reuses batch memory once no sample of it is alive, never memory in use."""
    tf = T.Compose([T.RandomResizedCrop(20), T.ToTensor()])
    ds = V.ImageFolder(tree, transform=tf)
    first = ds.__getitems__([0, 1, 2])
    kept = first[1][0].copy()
    second = ds.__getitems__([4, 5, 6])  # first still alive: must not be overwritten
    np.testing.assert_array_equal(first[1][0], kept)
    assert not np.shares_memory(first[0][0], second[0][0])
    address = first[0][0].__array_interface__["data"][0]
    del first  # as in a training loop, the last batch is still held
    third = ds.__getitems__([0, 1, 2])
    assert third[0][0].__array_interface__["data"][0] == address
    assert not np.shares_memory(third[0][0], second[0][0])


def test_dct_divisor_covers_the_crop() -> None:
    """The decode scale never makes the crop smaller than the output."""
    for crop in range(50, 2000, 37):
        d = _decode.dct_divisor(crop, crop, 224, 224)
        assert crop / d >= 224 or d == 1
        assert d == 8 or crop / (2 * d) < 224


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("geometry", ["random", "center"])
@pytest.mark.parametrize("target_transform", [None, str])
def test_getitems_equals_getitem_sequence(
    tree: Path, monkeypatch: pytest.MonkeyPatch, threads: int, geometry: str, target_transform
) -> None:
    """__getitems__ (decoding on one thread or in two) returns exactly what successive
    __getitem__ calls do, and makes the same draws."""
    first = [T.RandomResizedCrop(20)] if geometry == "random" else [T.Resize(30), T.CenterCrop(24)]
    flips = [T.RandomHorizontalFlip(), T.RandomVerticalFlip()]
    tf = T.Compose([*first, *flips, T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = V.ImageFolder(tree, transform=tf, target_transform=target_transform)
    monkeypatch.setattr(_fused, "decode_threads", lambda: threads)
    idx = [6, 0, 3, 3, 1, 5]  # includes the PNG twice (plain path, in order)
    random.seed(11)
    batch = ds.__getitems__(idx)
    after_batch = random.random()
    random.seed(11)
    single = [ds[i] for i in idx]
    assert random.random() == after_batch
    for (a, ta), (b, tb) in zip(batch, single, strict=True):
        assert ta == tb
        np.testing.assert_array_equal(a, b)


def test_imagefolder_in_stoker_dataloader(tree: Path) -> None:
    """A DataLoader batches fast-path samples as N x 3 x H x W float32 and int64 targets."""
    import stoker

    tf = T.Compose(
        [T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
    )
    loader = stoker.DataLoader(
        V.ImageFolder(tree, transform=tf),
        batch_size=4,
        shuffle=True,
        generator=0,
        tensor_type="numpy",
    )
    batches = list(loader)
    assert [b[0].shape for b in batches] == [(4, 3, 16, 16), (3, 3, 16, 16)]
    assert batches[0][0].dtype == np.float32
    assert sorted(np.concatenate([b[1] for b in batches]).tolist()) == [0, 0, 0, 0, 1, 1, 1]


def _jpeg(arr: np.ndarray, **save: object) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=90, **save)
    return buf.getvalue()


@pytest.mark.parametrize(
    "save",
    [
        {"subsampling": "4:2:0"},
        {"subsampling": "4:2:2"},
        {"subsampling": "4:4:4"},
        {"subsampling": "4:2:0", "restart_marker_rows": 1},
        {"grey": True},
    ],
    ids=["420", "422", "444", "restart", "grey"],
)
def test_short_decode_gives_the_top_rows_exactly(save: dict[str, object]) -> None:
    """A random crop's decode that stops at the crop's bottom row equals the full decode there."""
    pytest.importorskip("simplejpeg")
    arr = _photo(75, 50, 4)
    if save.pop("grey", False):
        arr = arr[:, :, 0].copy()
    data = _jpeg(arr, **save)
    full = _decode.decode_scaled(data, "x.jpg", (75, 50), 1, fast=True).copy()
    for rows in (1, 9, 16, 17, 40, 74):
        assert _decode.with_height(data, rows) is not None
        top = _decode.decode_scaled(data, "x.jpg", (75, 50), 1, fast=True, rows=rows)
        assert isinstance(top, np.ndarray) and top.shape[0] >= rows
        np.testing.assert_array_equal(top[:rows], full[:rows])
    halves = _decode.decode_scaled(data, "x.jpg", (75, 50), 2, fast=True, rows=40)
    np.testing.assert_array_equal(
        halves[:20], _decode.decode_scaled(data, "x.jpg", (75, 50), 2, fast=True)[:20]
    )


def test_short_decode_only_for_complete_sequential_files() -> None:
    """Progressive files decode in full, and a file cut short still raises naming it."""
    data = _jpeg(_photo(64, 48, 5))
    assert _decode.with_height(_jpeg(_photo(64, 48, 5), progressive=True), 10) is None
    assert _decode.with_height(data, 64) is None and _decode.with_height(data, 63) is not None
    with pytest.raises(OSError, match=r"cut\.jpg"):
        _decode.decode_scaled(data[: len(data) // 2], "cut.jpg", (64, 48), 1, fast=True, rows=8)


def test_resize_center_crop_on_whole_pixels_matches_plain_path(tmp_path: Path) -> None:
    """Resize + CenterCrop whose box falls on whole source pixels still filters as Resize does."""
    (tmp_path / "c").mkdir()
    Image.fromarray(_photo(512, 512, 5)).save(tmp_path / "c" / "sq.jpg", quality=92)
    tf = T.Compose([T.Resize(64), T.CenterCrop(48), T.ToTensor()])  # box (64, 64, 384, 384)
    fast, plain = _both(tmp_path, tf)
    np.testing.assert_allclose(fast[0][0], plain[0][0], atol=1e-4)


def test_fast_decode_difference_on_photo_sized_images(tmp_path: Path) -> None:
    """On 500 x 375 photos, the training fast path stays within mean 3/255 of the plain path."""
    (tmp_path / "c").mkdir()
    Image.fromarray(_photo(375, 500, 8)).save(tmp_path / "c" / "p.jpg", quality=90)
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor()])
    fast, plain = _both(tmp_path, tf)
    diffs = []
    for seed in range(6):
        random.seed(seed)
        a = fast[0][0]
        random.seed(seed)
        diffs.append(np.abs(a - np.asarray(plain[0][0])).ravel())
    diff = np.concatenate(diffs) * 255
    assert diff.mean() < 3 and np.percentile(diff, 99) < 16


def test_recoverable_corruption_loads_on_both_paths(tmp_path: Path) -> None:
    """A complete JPEG with damaged data loads on the fast path too, as Pillow loads it."""
    (tmp_path / "c").mkdir()
    data = bytearray(_jpeg(_photo(64, 64, 1)))
    rng = random.Random(0)
    for i in range(len(data) // 2, len(data) // 2 + 30):
        data[i] = rng.randrange(256)
    (tmp_path / "c" / "bent.jpg").write_bytes(bytes(data))
    for geometry in (T.RandomResizedCrop(16), T.Resize((16, 16))):
        fast, plain = _both(tmp_path, T.Compose([geometry, T.ToTensor()]))
        assert fast[0][0].shape == plain[0][0].shape == (3, 16, 16)
