"""Tests of stoker's C kernels (stoker.vision._native): region decode, resample (against a
slow NumPy reference and Pillow) and normalise, and the fused path that uses them against
the fused path without them."""

from __future__ import annotations

import io
import math
import os
import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import stoker.vision as V
from stoker.vision import _decode, _fused
from stoker.vision import transforms as T
from stoker.vision._workspace import workspace
from test_vision_folder import _photo

_native = _fused._native
needs_native = pytest.mark.skipif(_native is None, reason="stoker's C kernels were not built")
needs_decode = pytest.mark.skipif(
    not _decode.decodes_regions(), reason="stoker's C kernels were built without libjpeg-turbo"
)
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


@needs_decode
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


@needs_decode
def test_region_decodes_of_one_image_size_share_one_buffer() -> None:
    """The decode buffer is sized for the whole image: a larger crop after a smaller one
    reuses it (growing it crop by crop would fault in fresh pages in every fresh worker)."""
    data = _jpeg(_photo(75, 101, 5), quality=90)
    workspace().pop("decode", None)  # as in a new thread
    small = _decode.decode_region(data, "x.jpg", (75, 101), 1, (10, 10, 30, 40), True)
    buffer = workspace()["decode"]
    large = _decode.decode_region(data, "x.jpg", (75, 101), 1, (0, 0, 75, 101), True)
    assert small.shape == (20, 30, 3) and large.shape == (75, 101, 3)
    assert workspace()["decode"] is buffer and np.shares_memory(large, buffer)


@needs_decode
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


@needs_decode
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
    whether the crop is decoded alone, resampled and normalised in C or decoded down to its
    bottom row by simplejpeg, resampled by Pillow and normalised by NumPy, at full and
    reduced DCT scale."""
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
    monkeypatch.setattr(_fused, "_TORCH_RESAMPLE", False)  # Pillow: the C resampler's bytes
    without = outputs()
    assert {1, 2} <= seen_divisors
    assert all(np.array_equal(a, b) for a, b in zip(with_c, without, strict=True))


# The resampler: a slow, obviously correct NumPy model of Pillow's algorithm (float64
# weights normalised to sum 1, rounded to 22 fractional bits; each pass summed exactly in
# int64, rounded by adding half and shifting, clamped), then the kernels against it.
_BITS = 22


def _weight(flt: int, x: float) -> float:
    """Pillow's filters by number: 1 LANCZOS, 2 BILINEAR, 3 BICUBIC, 4 BOX, 5 HAMMING."""
    ax = abs(x)
    if flt == 4:
        return 1.0 if -0.5 < x <= 0.5 else 0.0
    if flt == 2:
        return 1.0 - ax if ax < 1.0 else 0.0
    if flt == 5:
        if ax == 0.0:
            return 1.0
        t = ax * math.pi
        return (
            0.0 if ax >= 1.0 else math.sin(t) / t * (0.54 + float(np.float32(0.46)) * math.cos(t))
        )
    if flt == 3:
        a = -0.5
        if ax < 1.0:
            return ((a + 2.0) * ax - (a + 3.0)) * ax * ax + 1
        return (((ax - 5) * ax + 8) * ax - 4) * a if ax < 2.0 else 0.0

    def sinc(v: float) -> float:
        return 1.0 if v == 0.0 else math.sin(v * math.pi) / (v * math.pi)

    return sinc(x) * sinc(x / 3) if -3.0 <= x < 3.0 else 0.0


_SUPPORT = {1: 3.0, 2: 1.0, 3: 2.0, 4: 0.5, 5: 1.0}


def _ref_weights(
    flt: int, size: int, in0: float, in1: float, out: int
) -> list[tuple[int, list[int]]]:
    """Per output pixel: its first input pixel and its fixed-point weights."""
    lo, hi = np.float32(in0), np.float32(in1)
    scale = float(hi - lo) / out  # the box's extent in float32, as Pillow's C takes it
    fscale = max(scale, 1.0)
    support = _SUPPORT[flt] * fscale
    rows = []
    for i in range(out):
        center = float(lo) + (i + 0.5) * scale
        first, last = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), size)
        w = [_weight(flt, (x - center + 0.5) / fscale) for x in range(first, last)]
        total = sum(w)
        w = [v / total for v in w] if total != 0.0 else w
        rows.append((first, [int(v * (1 << _BITS) + (0.5 if v >= 0 else -0.5)) for v in w]))
    return rows


def _ref_pass(a: np.ndarray, axis: int, weights: list[tuple[int, list[int]]]) -> np.ndarray:
    """One pass along ``axis`` (0 rows, 1 columns) of the int64 image ``a``, rounded to uint8."""
    parts = []
    for first, ks in weights:
        acc = np.full(np.delete(a.shape, axis), 1 << (_BITS - 1), np.int64)
        for t, k in enumerate(ks):
            acc += k * np.take(a, first + t, axis=axis)
        parts.append(np.clip(acc >> _BITS, 0, 255))
    return np.stack(parts, axis=axis).astype(np.int64)


def _ref_resample(
    src: np.ndarray, oh: int, ow: int, box: tuple[float, ...], flt: int
) -> np.ndarray:
    """Pillow 13's resize of ``src``'s ``box`` to ``oh`` x ``ow``: the NumPy model."""
    a = src.astype(np.int64)
    h, w = src.shape[:2]
    need_h = ow != w or box[0] != 0 or box[2] != ow
    need_v = oh != h or box[1] != 0 or box[3] != oh
    wh, wv = _ref_weights(flt, w, box[0], box[2], ow), _ref_weights(flt, h, box[1], box[3], oh)
    vertical_first = h > oh and (h - oh) > (w - ow) * 2  # Pillow 13's order of the passes
    for axis in (0, 1) if vertical_first else (1, 0):
        if axis == 1 and need_h:
            a = _ref_pass(a, 1, wh)
        if axis == 0 and need_v:
            a = _ref_pass(a, 0, wv)
    return a.astype(np.uint8)


def _resample_cases() -> list[tuple[tuple[int, int, int], tuple[int, int], tuple[float, ...], int]]:
    """(src shape, out size, box, filter): random sizes up and down, odd and extreme aspect
    ratios (1 x N, N x 1), boxes of one pixel and less, greyscale, every filter."""
    rng = random.Random(21)
    cases = []
    for n in range(120):
        c = 1 if n % 4 == 0 else 3
        h, w = rng.choice([1, 2, 3, rng.randint(1, 97)]), rng.choice([1, 5, rng.randint(1, 131)])
        if n % 9 == 0:
            h, w = (1, rng.randint(100, 300)) if n % 2 else (rng.randint(100, 300), 1)
        oh, ow = rng.choice([1, rng.randint(1, 150)]), rng.choice([1, 2, rng.randint(1, 150)])
        box: tuple[float, ...] = (0.0, 0.0, float(w), float(h))
        if n % 3 == 1:  # a box inside, on fractional pixels
            x0, y0 = rng.uniform(0, w * 0.9), rng.uniform(0, h * 0.9)
            box = (x0, y0, rng.uniform(x0 + 1e-3, w), rng.uniform(y0 + 1e-3, h))
        elif n % 3 == 2:  # one whole pixel, or less
            x, y = rng.randrange(w), rng.randrange(h)
            box = (x, y, x + 1.0, y + 1.0) if n % 2 else (x + 0.25, y + 0.5, x + 0.75, y + 1.0)
        cases.append(((h, w, c), (oh, ow), box, rng.choice([1, 2, 3, 4, 5])))
    return cases


@needs_native
def test_resample_equals_the_numpy_reference_and_pillow() -> None:
    """On 120 random cases the C resampler (its fastest kernel here, and its plain C one)
    gives the NumPy reference's bytes and Pillow's: exactly, every byte."""
    rng = np.random.default_rng(7)
    newer = int(Image.__version__.split(".")[0]) >= 13  # Pillow's own order, for Pillow's bytes
    for (h, w, c), (oh, ow), box, flt in _resample_cases():
        big = rng.integers(0, 256, (h + 2, w + 3, c), dtype=np.uint8)
        src = big[1 : h + 1, 2 : w + 2]  # a view with a longer row stride, as a crop is
        src = src[..., 0] if c == 1 and h % 2 else src  # greyscale as H x W, or H x W x 1
        what = ((h, w, c), (oh, ow), box, flt)
        ref = _ref_resample(src, oh, ow, box, flt)
        if newer:
            pil = Image.fromarray(np.ascontiguousarray(src.reshape(h, w) if c == 1 else src))
            by_pillow = np.asarray(pil.resize((ow, oh), flt, box=box))
            assert np.array_equal(ref.reshape(by_pillow.shape), by_pillow), what
        for portable in (False, True):
            out = np.full(ref.shape, 7, np.uint8)
            _native.resample(src, out, box, flt, True, portable)
            assert np.array_equal(out, ref), (*what, portable)


@needs_native
def test_resample_orders_its_passes_as_the_pillow_asked_for() -> None:
    """Where the two orders of the passes give different bytes, ``newer_order`` picks Pillow
    13's (vertical first when the height shrinks by more than twice the width), else the
    horizontal pass runs first, as in earlier Pillows."""
    src = np.random.default_rng(3).integers(0, 256, (95, 72), dtype=np.uint8)
    box = (0.0, 0.0, 72.0, 95.0)
    newer, older = np.empty((8, 63), np.uint8), np.empty((8, 63), np.uint8)
    _native.resample(src, newer, box, 2, True)
    _native.resample(src, older, box, 2, False)
    across = np.empty((95, 63), np.uint8)  # horizontal first, by hand
    _native.resample(src, across, box, 2)
    by_hand = np.empty((8, 63), np.uint8)
    _native.resample(across, by_hand, (0.0, 0.0, 63.0, 95.0), 2)
    assert np.array_equal(newer, _ref_resample(src, 8, 63, box, 2))
    assert np.array_equal(older, by_hand) and not np.array_equal(newer, older)


@needs_native
def test_resample_rejects_what_it_cannot_do() -> None:
    """Other layouts, a box outside the source or empty, a channel mismatch and NEAREST (or
    an unknown filter) raise ValueError saying what must hold."""
    src, out = np.zeros((10, 12, 3), np.uint8), np.zeros((4, 5, 3), np.uint8)
    box = (0.0, 0.0, 12.0, 10.0)
    with pytest.raises(ValueError, match="filter must be 1 to 5"):
        _native.resample(src, out, box, 0)
    with pytest.raises(ValueError, match="H x W x C uint8 array"):
        _native.resample(src.astype(np.float32), out, box, 2)
    with pytest.raises(ValueError, match="H x W x C uint8 array"):
        _native.resample(np.zeros((10, 12, 4), np.uint8), out, box, 2)
    with pytest.raises(ValueError, match="H x W x C uint8 array"):
        _native.resample(src, out[:, ::-1], box, 2)
    with pytest.raises(ValueError, match="same number of channels"):
        _native.resample(src, np.zeros((4, 5), np.uint8), box, 2)
    for bad in [(0.0, 0.0, 12.5, 10.0), (-1.0, 0.0, 12.0, 10.0), (3.0, 0.0, 3.0, 10.0)]:
        with pytest.raises(ValueError, match="inside src and not be empty"):
            _native.resample(src, out, bad, 2)
    with pytest.raises(TypeError):
        _native.resample(src, out.copy(), box, 2, True, False, 1)  # type: ignore[call-arg]
    ro = out.copy()
    ro.flags.writeable = False
    with pytest.raises((ValueError, BufferError)):
        _native.resample(src, ro, box, 2)


@needs_native
@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_the_fused_path_resamples_in_c_with_torch_imported_or_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """RandomResizedCrop and Resize + CenterCrop resample with the C kernel, not torch's nor
    Pillow's, whether or not torch is imported, and give Pillow's bytes (the fused path
    without the C resampler, Pillow's filter)."""
    pytest.importorskip("torch")  # imported: the C kernel must still be the one that runs
    (tmp_path / "c").mkdir()
    for i, (h, w) in enumerate([(375, 500), (120, 90)]):
        Image.fromarray(_photo(h, w, i)).save(tmp_path / "c" / f"{i}.jpg", quality=90)
    interpolation = T.InterpolationMode(mode)
    geometries = [
        [T.RandomResizedCrop(64, interpolation=interpolation)],
        [T.Resize(80, interpolation=interpolation), T.CenterCrop(64)],
    ]
    calls: list[object] = []
    kernel = _native.resample
    monkeypatch.setattr(_native, "resample", lambda *a: calls.append(a) or kernel(*a))
    monkeypatch.setattr(_fused, "_torch_resize", lambda *a: pytest.fail("torch resampled"))
    for geometry in geometries:
        ds = V.ImageFolder(tmp_path, transform=T.Compose([*geometry, T.ToTensor()]))
        random.seed(0)
        with_c = [np.array(ds[i][0]) for i in range(len(ds))]
        assert len(calls) == len(ds)
        calls.clear()
        with monkeypatch.context() as m:
            m.setattr(_fused, "_NATIVE_RESAMPLE", False)
            m.setattr(_fused, "_TORCH_RESAMPLE", False)
            random.seed(0)
            by_pillow = [np.array(ds[i][0]) for i in range(len(ds))]
        assert calls == []
        assert all(np.array_equal(a, b) for a, b in zip(with_c, by_pillow, strict=True))
