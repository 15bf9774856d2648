"""Colour transforms: ColorJitter and Grayscale, with torchvision's factors and Pillow's kernels."""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image, ImageEnhance

from stoker.vision.transforms._base import Img, like, to_pil


def adjust_brightness(img: Image.Image, factor: float) -> Image.Image:
    """``img`` with its brightness scaled by ``factor`` (0 black, 1 unchanged)."""
    return ImageEnhance.Brightness(img).enhance(factor)


def adjust_contrast(img: Image.Image, factor: float) -> Image.Image:
    """``img`` blended with its mean grey level (0 flat grey, 1 unchanged)."""
    return ImageEnhance.Contrast(img).enhance(factor)


def adjust_saturation(img: Image.Image, factor: float) -> Image.Image:
    """``img`` blended with its greyscale version (0 grey, 1 unchanged)."""
    return ImageEnhance.Color(img).enhance(factor)


def adjust_hue(img: Image.Image, factor: float) -> Image.Image:
    """``img`` with its hue rotated by ``factor`` turns, in [-0.5, 0.5].

    Single-band images (L, 1, I, F) have no hue and are returned unchanged.
    """
    if not -0.5 <= factor <= 0.5:
        raise ValueError(f"hue_factor ({factor}) is not in [-0.5, 0.5].")
    mode = img.mode
    if mode in {"L", "1", "I", "F"}:
        return img
    h, s, v = img.convert("HSV").split()
    # The shift wraps around the uint8 hue circle; int() truncates toward zero as a
    # float-to-uint8 cast of the factor times 255 does.
    shift = np.uint8(int(factor * 255) % 256)
    hue = np.asarray(h, dtype=np.uint8) + shift
    h = Image.fromarray(hue.astype(np.uint8))
    return Image.merge("HSV", (h, s, v)).convert(mode)


def _check_range(
    value: Any,
    name: str,
    center: float = 1.0,
    bound: tuple[float, float] = (0.0, math.inf),
    clip_first_on_zero: bool = True,
) -> tuple[float, float] | None:
    """The (min, max) factor range of a ColorJitter argument, or None when it is a no-op."""
    if isinstance(value, numbers.Number) and not isinstance(value, bool):
        v = float(value)  # type: ignore[arg-type]
        if v < 0:
            raise ValueError(f"If {name} is a single number, it must be non negative, got {v}.")
        lo, hi = center - v, center + v
        if clip_first_on_zero:
            lo = max(lo, 0.0)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        lo, hi = float(value[0]), float(value[1])
    else:
        raise TypeError(
            f"{name} should be a single number or a list/tuple with length 2, got {value!r}."
        )
    if not bound[0] <= lo <= hi <= bound[1]:
        raise ValueError(f"{name} values should be between {bound}, but got {[lo, hi]}.")
    if lo == hi == center:
        return None
    return lo, hi


class ColorJitter:
    """Randomly changes brightness, contrast, saturation and hue, in a random order.

    Args:
        brightness: b for factors in [max(0, 1 - b), 1 + b], or (min, max).
        contrast: as ``brightness``.
        saturation: as ``brightness``.
        hue: h in [0, 0.5] for shifts in [-h, h], or (min, max) within [-0.5, 0.5].
    """

    def __init__(
        self,
        brightness: float | Sequence[float] = 0,
        contrast: float | Sequence[float] = 0,
        saturation: float | Sequence[float] = 0,
        hue: float | Sequence[float] = 0,
    ) -> None:
        self.brightness = _check_range(brightness, "brightness")
        self.contrast = _check_range(contrast, "contrast")
        self.saturation = _check_range(saturation, "saturation")
        self.hue = _check_range(hue, "hue", center=0.0, bound=(-0.5, 0.5), clip_first_on_zero=False)

    @staticmethod
    def get_params(
        brightness: tuple[float, float] | None,
        contrast: tuple[float, float] | None,
        saturation: tuple[float, float] | None,
        hue: tuple[float, float] | None,
    ) -> tuple[list[int], float | None, float | None, float | None, float | None]:
        """A random order of the four adjustments and a factor for each one that is on."""
        order = random.sample(range(4), 4)
        factors = [
            None if r is None else random.uniform(r[0], r[1])
            for r in (brightness, contrast, saturation, hue)
        ]
        return order, factors[0], factors[1], factors[2], factors[3]

    def __call__(self, img: Img) -> Img:
        pil = to_pil(img, "ColorJitter")
        order, b, c, s, h = self.get_params(
            self.brightness, self.contrast, self.saturation, self.hue
        )
        for fn_id in order:
            if fn_id == 0 and b is not None:
                pil = adjust_brightness(pil, b)
            elif fn_id == 1 and c is not None:
                pil = adjust_contrast(pil, c)
            elif fn_id == 2 and s is not None:
                pil = adjust_saturation(pil, s)
            elif fn_id == 3 and h is not None:
                pil = adjust_hue(pil, h)
        return like(pil, img)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(brightness={self.brightness}, contrast={self.contrast}, "
            f"saturation={self.saturation}, hue={self.hue})"
        )


class Grayscale:
    """Converts to greyscale (ITU-R 601-2 luma, as Pillow's ``convert("L")``).

    Args:
        num_output_channels: 1, or 3 for the grey level repeated in R, G and B.
    """

    def __init__(self, num_output_channels: int = 1) -> None:
        if num_output_channels not in (1, 3):
            raise ValueError(
                f"num_output_channels should be either 1 or 3, got {num_output_channels}."
            )
        self.num_output_channels = num_output_channels

    def __call__(self, img: Img) -> Img:
        grey = to_pil(img, "Grayscale").convert("L")
        if self.num_output_channels == 3:
            arr = np.asarray(grey)
            return like(Image.fromarray(np.dstack([arr, arr, arr])), img)
        if isinstance(img, np.ndarray):
            arr = np.asarray(grey)
            return arr[:, :, None] if img.ndim == 3 else arr
        return grey

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_output_channels={self.num_output_channels})"
