"""Tests of stoker's C kernels (stoker.vision._native): region decode and normalise, and the
fused path that uses them against the fused path without them."""

from __future__ import annotations

import io
import os
import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import stoker.vision as V
from stoker.vision import _decode, _fused
from stoker.vision import transforms as T
from test_vision_folder import _photo

_native = _fused._native
needs_native = pytest.mark.skipif(_native is None, reason="stoker's C kernels were not built")
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _jpeg(arr: np.ndarray, **save: object) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", **save)
    return buf.getvalue()


def test_the_extension_is_built_where_ci_requires_it() -> None:
    """CI's machine has a compiler and libjpeg-turbo's headers: the kernels must be there."""
    if os.environ.get("STOKER_REQUIRE_NATIVE") != "1":
        pytest.skip("set STOKER_REQUIRE_NATIVE=1 to require the extension")
    assert _decode.decodes_regions() and _fused._native is not None


JPEGS = {
    "4:2:0": dict(quality=90),
    "4:4:4": dict(quality=95, subsampling=0),
    "progressive": dict(quality=85, progressive=True),
}


@needs_native
@pytest.mark.parametrize("kind", [*JPEGS, "grey"])
@pytest.mark.parametrize("fast", [True, False])
def test_a_region_is_the_full_decode_cut_to_it(kind: str, fast: bool) -> None:
    """Any rectangle at any DCT scale has the pixels of the full decode with the same settings
    (which is simplejpeg's, bit for bit), for grey, 4:4:4 and progressive files too."""
    simplejpeg = pytest.importorskip("simplejpeg")
    arr = _photo(75, 101, 3)
    data = _jpeg(arr[..., 0], quality=90) if kind == "grey" else _jpeg(arr, **JPEGS[kind])
    rng = random.Random(kind)
    for divisor in (1, 2, 4, 8):
        h, w = -(-75 // divisor), -(-101 // divisor)
        full = np.empty((h, w, 3), np.uint8)
        assert _native.decode(data, full, divisor, 0, 0, h, w, fast, True) == (h, w)
        ref = simplejpeg.decode_jpeg(
            data, "RGB", fastdct=fast, fastupsample=True, min_height=h, min_width=w
        )
        assert np.array_equal(full, ref)
        for _ in range(25):
            top, left = rng.randrange(h), rng.randrange(w)
            bottom, right = rng.randrange(top + 1, h + 1), rng.randrange(left + 1, w + 1)
            got = _decode.decode_region(
                data, "x.jpg", (75, 101), divisor, (top, left, bottom, right), fast
            )
            assert np.array_equal(got, full[top:bottom, left:right]), (
                divisor,
                top,
                left,
                bottom,
                right,
            )


@needs_native
def test_region_decodes_of_one_image_size_share_one_buffer() -> None:
    """The decode buffer is sized for the whole image: a larger crop after a smaller one
    reuses it (growing it crop by crop would fault in fresh pages in every fresh worker)."""
    data = _jpeg(_photo(75, 101, 5), quality=90)
    _decode._local.__dict__.pop("buffer", None)  # as in a new thread
    small = _decode.decode_region(data, "x.jpg", (75, 101), 1, (10, 10, 30, 40), True)
    buffer = _decode._local.buffer
    large = _decode.decode_region(data, "x.jpg", (75, 101), 1, (0, 0, 75, 101), True)
    assert small.shape == (20, 30, 3) and large.shape == (75, 101, 3)
    assert _decode._local.buffer is buffer and np.shares_memory(large, buffer)


@needs_native
def test_region_decode_errors_name_the_file_or_the_rectangle() -> None:
    """Truncated and non-JPEG data raise OSError naming the file; a rectangle outside the
    image, or a buffer too small, ValueError saying what was asked."""
    data = _jpeg(_photo(40, 48, 1), quality=90)
    with pytest.raises(OSError, match=r"'cut\.jpg'.*corrupt, truncated"):
        _decode.decode_region(data[: len(data) // 2], "cut.jpg", (40, 48), 1, (0, 0, 40, 48), True)
    with pytest.raises(OSError, match=r"'junk\.jpg'"):
        _decode.decode_region(
            b"\xff\xd8\xff" + b"\0" * 64, "junk.jpg", (40, 48), 1, (0, 0, 4, 4), True
        )
    out = np.empty((40, 48, 3), np.uint8)
    with pytest.raises(ValueError, match=r"inside the scaled image.*rows \[0, 41\).*40 x 48"):
        _native.decode(data, out, 1, 0, 0, 41, 48, True, True)
    with pytest.raises(ValueError, match="smaller than rows x cols x 3"):
        _native.decode(data, out[:10], 1, 0, 0, 40, 48, True, True)
    with pytest.raises(ValueError, match="divisor must be 1, 2, 4 or 8"):
        _native.decode(data, out, 3, 0, 0, 4, 4, True, True)


@needs_native
def test_a_damaged_file_that_ends_cleanly_decodes_as_in_the_fallback() -> None:
    """A file that ends with its end-of-image marker decodes despite libjpeg's warnings, as
    the fallback (simplejpeg, not strict) decodes it; only a file that lacks the marker is
    decoded strictly."""
    simplejpeg = pytest.importorskip("simplejpeg")
    data = _jpeg(_photo(40, 48, 2), quality=90)
    damaged = data[:-200] + b"\xff\xd9"  # scan data cut short, then a clean end
    got = _decode.decode_region(damaged, "d.jpg", (40, 48), 1, (0, 0, 40, 48), True)
    ref = simplejpeg.decode_jpeg(damaged, "RGB", fastdct=True, fastupsample=True, strict=False)
    assert np.array_equal(got, ref)


@needs_native
@pytest.mark.parametrize("view", ["plain", "vflip", "hflip", "both", "crop", "read-only"])
def test_native_normalize_gives_numpys_values_bit_for_bit(
    view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ToTensor + Normalize by the C kernel equal NumPy's, for flipped and cropped views too."""
    p = _fused.plan(T.Compose([T.RandomResizedCrop(8), T.ToTensor(), T.Normalize(MEAN, STD)]))
    assert p is not None
    a = np.random.default_rng(0).integers(0, 256, (37, 41, 3), dtype=np.uint8)
    views = {"plain": a, "vflip": a[::-1], "hflip": a[:, ::-1], "both": a[::-1, ::-1]}
    views["crop"] = a[3:20, 5:30][::-1, ::-1]
    views["read-only"] = a.copy()
    views["read-only"].flags.writeable = False
    calls: list[object] = []
    kernel = _native.normalize
    monkeypatch.setattr(_native, "normalize", lambda *args: calls.append(args) or kernel(*args))
    by_c = _fused.normalize(p, views[view])
    assert len(calls) == 1
    monkeypatch.setattr(_fused, "_native", None)
    monkeypatch.setattr(_fused, "_TORCH_NORMALIZE", False)
    assert np.array_equal(by_c, _fused.normalize(p, views[view]))


@needs_native
def test_native_normalize_rejects_other_layouts() -> None:
    """Non-uint8 or wrongly sized arrays raise ValueError; the fused path normalises a layout
    the kernel does not take (pixels not 3 bytes apart) with NumPy."""
    out = np.empty((3, 4, 5), np.float32)
    with pytest.raises(ValueError, match="H x W x 3 uint8"):
        _native.normalize(np.zeros((4, 5, 3), np.float32), out, False, False, (1, 1, 1), (0, 0, 0))
    with pytest.raises(ValueError, match="3 x H x W float32"):
        _native.normalize(np.zeros((4, 6, 3), np.uint8), out, False, False, (1, 1, 1), (0, 0, 0))
    p = _fused.plan(T.Compose([T.Resize(4), T.ToTensor()]))
    assert p is not None
    rgbx = np.random.default_rng(1).integers(0, 256, (4, 5, 4), dtype=np.uint8)
    expected = rgbx[..., :3].transpose(2, 0, 1) / np.float32(255)
    assert np.allclose(_fused.normalize(p, rgbx[..., :3]), expected)  # pixels 4 bytes apart


@needs_native
def test_fused_output_is_the_same_with_and_without_the_kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RandomResizedCrop + flips + ToTensor + Normalize give the same values, bit for bit,
    whether the crop is decoded alone and normalised in C or decoded down to its bottom
    row by simplejpeg and normalised by NumPy, at full and reduced DCT scale."""
    pytest.importorskip("simplejpeg")
    for i, (h, w) in enumerate([(375, 500), (600, 900), (64, 80)]):
        (tmp_path / "c").mkdir(exist_ok=True)
        Image.fromarray(_photo(h, w, i)).save(tmp_path / "c" / f"{i}.jpg", quality=90)
    tf = T.Compose(
        [
            T.RandomResizedCrop(96, scale=(0.05, 1.0)),
            T.RandomHorizontalFlip(),
            T.RandomVerticalFlip(),
            T.ToTensor(),
            T.Normalize(MEAN, STD),
        ]
    )
    ds = V.ImageFolder(tmp_path, transform=tf)
    seen_divisors = set()
    divisor = _decode.dct_divisor

    def spy(*args: float) -> int:
        seen_divisors.add(divisor(*args))  # type: ignore[arg-type]
        return divisor(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(_decode, "dct_divisor", spy)

    def outputs() -> list[np.ndarray]:
        got = []
        for seed in range(12):
            random.seed(seed)
            got.extend(np.array(ds[i][0]) for i in range(len(ds)))
        return got

    with_c = outputs()
    monkeypatch.setattr(_decode, "_native", None)
    monkeypatch.setattr(_fused, "_native", None)
    monkeypatch.setattr(_fused, "_TORCH_NORMALIZE", False)
    without = outputs()
    assert {1, 2} <= seen_divisors
    assert all(np.array_equal(a, b) for a, b in zip(with_c, without, strict=True))
