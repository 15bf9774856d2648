"""Tests of stoker.vision.transforms: shapes, ranges, errors, and the parameter distributions."""

from __future__ import annotations

import math
import pickle
import random

import numpy as np
import pytest
from PIL import Image

from stoker.vision import transforms as T
from stoker.vision.transforms._geometric import random_resized_crop_params


def _rgb(h: int = 30, w: int = 40, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def test_public_names_sorted_and_report_public_module() -> None:
    """__all__ is sorted and every public class says it lives in stoker.vision.transforms."""
    assert T.__all__ == sorted(T.__all__)
    for name in T.__all__:
        assert getattr(T, name).__module__ == "stoker.vision.transforms"


def test_to_tensor_gives_chw_float32_in_unit_range() -> None:
    """ToTensor turns HWC uint8 (array or PIL) into CHW float32 in [0, 1], values / 255."""
    arr = _rgb()
    for x in (arr, Image.fromarray(arr)):
        out = T.ToTensor()(x)
        assert isinstance(out, np.ndarray)
        assert out.shape == (3, 30, 40) and out.dtype == np.float32
        np.testing.assert_allclose(out, arr.transpose(2, 0, 1) / 255.0, atol=1e-7)
    assert T.ToTensor()(np.zeros((5, 6), np.uint8)).shape == (1, 5, 6)
    with pytest.raises(TypeError, match="PIL Image or ndarray"):
        T.ToTensor()([1, 2])


def test_normalize_standardises_channels_and_checks_input() -> None:
    """Normalize computes (x - mean) / std per channel and rejects non-float or zero std."""
    x = T.ToTensor()(_rgb())
    out = T.Normalize([0.5, 0.4, 0.3], [0.2, 0.25, 0.5])(x)
    expect = (x - np.array([0.5, 0.4, 0.3])[:, None, None]) / np.array([0.2, 0.25, 0.5])[
        :, None, None
    ]
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-6)
    assert out.dtype == np.float32 and out is not x
    with pytest.raises(TypeError, match="ToTensor"):
        T.Normalize([0.5], [0.5])(Image.fromarray(_rgb()))
    with pytest.raises(TypeError, match="float"):
        T.Normalize([0.5], [0.5])(_rgb().transpose(2, 0, 1))
    with pytest.raises(ValueError, match="zero"):
        T.Normalize([0.5, 0.5, 0.5], [0.5, 0.0, 0.5])(x)


def test_normalize_accepts_torch_tensors() -> None:
    """Normalize on a torch tensor gives the same numbers as on the NumPy array."""
    torch = pytest.importorskip("torch")
    x = T.ToTensor()(_rgb())
    n = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    np.testing.assert_allclose(n(torch.from_numpy(x.copy())).numpy(), n(x), rtol=1e-6)


def test_geometric_transforms_keep_kind_and_give_expected_sizes() -> None:
    """Each geometric transform returns the input's kind with torchvision's output size."""
    arr = _rgb(30, 40)
    cases = [
        (T.Resize(15), (15, 20)),
        (T.Resize((10, 12)), (10, 12)),
        (T.Resize(20, max_size=25), (19, 25)),
        (T.CenterCrop(16), (16, 16)),
        (T.CenterCrop((50, 60)), (50, 60)),
        (T.RandomCrop(12, padding=2), (12, 12)),
        (T.RandomCrop(50, pad_if_needed=True), (50, 50)),
        (T.Pad((1, 2)), (34, 42)),
        (T.Pad((1, 2, 3, 4), padding_mode="reflect"), (36, 44)),
        (T.RandomResizedCrop(24), (24, 24)),
        (T.RandomHorizontalFlip(1.0), (30, 40)),
        (T.RandomVerticalFlip(1.0), (30, 40)),
        (T.RandomRotation(30), (30, 40)),
        (T.ColorJitter(0.4, 0.4, 0.4, 0.1), (30, 40)),
    ]
    for t, (h, w) in cases:
        out_arr = t(arr)
        assert isinstance(out_arr, np.ndarray) and out_arr.shape == (h, w, 3), t
        assert out_arr.dtype == np.uint8
        out_pil = t(Image.fromarray(arr))
        assert isinstance(out_pil, Image.Image) and out_pil.size == (w, h), t


def test_flips_and_center_crop_pixels() -> None:
    """Flips mirror the pixels; CenterCrop takes the centred window; Pad fills constants."""
    arr = _rgb(6, 8)
    np.testing.assert_array_equal(T.RandomHorizontalFlip(1.0)(arr), arr[:, ::-1])
    np.testing.assert_array_equal(T.RandomVerticalFlip(1.0)(arr), arr[::-1])
    np.testing.assert_array_equal(T.RandomHorizontalFlip(0.0)(arr), arr)
    np.testing.assert_array_equal(T.CenterCrop((2, 4))(arr), arr[2:4, 2:6])
    padded = T.Pad(1, fill=(9, 8, 7))(arr)
    assert padded[0, 0].tolist() == [9, 8, 7]
    np.testing.assert_array_equal(padded[1:-1, 1:-1], arr)
    pil_out = np.asarray(T.CenterCrop((2, 4))(Image.fromarray(arr)))
    np.testing.assert_array_equal(pil_out, arr[2:4, 2:6])


def test_grayscale_channels() -> None:
    """Grayscale gives 1 or 3 equal channels of the ITU-R 601 luma."""
    arr = _rgb()
    one = T.Grayscale()(arr)
    three = T.Grayscale(3)(arr)
    assert one.shape == (30, 40, 1) and three.shape == (30, 40, 3)
    np.testing.assert_array_equal(three[..., 0], three[..., 2])
    luma = arr @ np.array([0.299, 0.587, 0.114])
    assert np.abs(one[..., 0] - luma).max() <= 1.0
    with pytest.raises(ValueError, match="1 or 3"):
        T.Grayscale(2)


def test_compose_randomapply_lambda() -> None:
    """Compose chains, RandomApply applies all-or-nothing, Lambda checks callability."""
    assert T.Compose([T.Lambda(lambda x: x + 1), T.Lambda(lambda x: x * 3)])(1) == 6
    random.seed(0)
    hits = sum(T.RandomApply([T.Lambda(lambda x: x + 1)], p=0.3)(0) for _ in range(4000))
    assert abs(hits / 4000 - 0.3) < 0.03
    with pytest.raises(TypeError, match="callable"):
        T.Lambda(3)  # type: ignore[arg-type]


def test_argument_errors_have_torchvision_types() -> None:
    """Bad arguments raise the same exception types as torchvision."""
    with pytest.raises(TypeError):
        T.Resize(2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        T.Resize((1, 2, 3))
    with pytest.raises(ValueError):
        T.CenterCrop((1, 2, 3))
    with pytest.raises(ValueError):
        T.Pad(1, padding_mode="wrap")
    with pytest.raises(ValueError):
        T.ColorJitter(brightness=-1)
    with pytest.raises(ValueError):
        T.ColorJitter(hue=0.7)
    with pytest.raises(ValueError):
        T.RandomRotation(-5)
    with pytest.raises(ValueError, match="larger than input"):
        T.RandomCrop(100)(_rgb())
    with pytest.raises(TypeError, match="before ToTensor"):
        T.Resize(10)(np.zeros((3, 4, 5, 6), np.uint8))


def test_transforms_pickle() -> None:
    """Every transform (but Lambda of a lambda) survives pickling, as workers need."""
    t = T.Compose(
        [
            T.RandomResizedCrop(8),
            T.ColorJitter(0.1),
            T.RandomRotation(5),
            T.ToTensor(),
            T.Normalize([0.5] * 3, [0.5] * 3),
        ]
    )
    back = pickle.loads(pickle.dumps(t))
    random.seed(1)
    a = back(_rgb())
    random.seed(1)
    b = t(_rgb())
    np.testing.assert_array_equal(a, b)


def test_random_transforms_use_python_random() -> None:
    """Seeding Python's random makes every random transform repeat; NumPy's RNG is not used."""
    t = T.Compose(
        [
            T.RandomResizedCrop(16),
            T.RandomHorizontalFlip(),
            T.ColorJitter(0.3, 0.3),
            T.RandomRotation(20),
            T.ToTensor(),
        ]
    )
    random.seed(5)
    np.random.seed(1)
    a = t(_rgb())
    random.seed(5)
    np.random.seed(2)
    b = t(_rgb())
    np.testing.assert_array_equal(a, b)


def test_random_resized_crop_distribution() -> None:
    """Crop area fractions and log aspect ratios follow torchvision's uniform draws."""
    random.seed(0)
    width = height = 3000  # square, scale <= 0.5: the first try always fits
    areas, log_ratios = [], []
    for _ in range(20000):
        top, left, h, w = random_resized_crop_params(width, height, (0.08, 0.5), (3 / 4, 4 / 3))
        assert 0 <= top <= height - h and 0 <= left <= width - w
        areas.append(h * w / (width * height))
        log_ratios.append(math.log(w / h))
    areas_a, lr = np.array(areas), np.array(log_ratios)
    assert areas_a.min() >= 0.079 and areas_a.max() <= 0.501
    assert abs(areas_a.mean() - 0.29) < 0.005  # mean of U(0.08, 0.5)
    assert abs(areas_a.std() - 0.42 / math.sqrt(12)) < 0.005
    lo, hi = math.log(3 / 4), math.log(4 / 3)
    assert lr.min() >= lo - 1e-3 and lr.max() <= hi + 1e-3
    assert abs(lr.mean()) < 0.005  # symmetric log-uniform
    assert abs(lr.std() - (hi - lo) / math.sqrt(12)) < 0.005


def test_random_resized_crop_falls_back_to_center() -> None:
    """When no try fits, the crop is central with the ratio clamped, as torchvision does."""
    random.seed(0)
    assert random_resized_crop_params(100, 10, (1.0, 1.0), (1.0, 1.0)) == (0, 45, 10, 10)
    assert random_resized_crop_params(10, 10, (2.0, 2.0), (0.5, 2.0)) == (0, 0, 10, 10)


def test_random_crop_and_flip_distributions() -> None:
    """RandomCrop offsets are uniform over every position; flips happen with probability p."""
    random.seed(0)
    img = np.zeros((10, 10, 3), np.uint8)
    tops = [T.RandomCrop.get_params(img, (7, 7))[0] for _ in range(8000)]
    counts = np.bincount(tops, minlength=4)
    assert len(counts) == 4 and counts.min() > 1800
    flips = sum(
        T.RandomHorizontalFlip(0.25)(np.arange(2).reshape(1, 2, 1))[0, 0, 0] == 1
        for _ in range(8000)
    )
    assert abs(flips / 8000 - 0.25) < 0.02


def test_rotation_and_jitter_parameter_ranges() -> None:
    """Rotation angles are uniform in degrees; ColorJitter factors stay in their ranges."""
    random.seed(0)
    angles = np.array([T.RandomRotation.get_params([-10.0, 30.0]) for _ in range(20000)])
    assert angles.min() >= -10 and angles.max() <= 30 and abs(angles.mean() - 10) < 0.3
    cj = T.ColorJitter(0.5, (0.9, 1.1), 0.2, 0.1)
    assert cj.brightness == (0.5, 1.5) and cj.hue == (-0.1, 0.1)
    orders = set()
    for _ in range(2000):
        order, b, c, s, h = cj.get_params(cj.brightness, cj.contrast, cj.saturation, cj.hue)
        orders.add(tuple(order))
        assert 0.5 <= b <= 1.5 and 0.9 <= c <= 1.1 and 0.8 <= s <= 1.2 and -0.1 <= h <= 0.1
    assert len(orders) == 24  # every order of the four adjustments occurs
    assert T.ColorJitter().get_params(None, None, None, None)[1:] == (None, None, None, None)
