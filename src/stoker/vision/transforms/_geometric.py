"""Geometric transforms: Resize, crops, Pad, flips and RandomRotation, as torchvision's.

Sizes are ``(height, width)``; an int size for Resize matches the shorter edge. Random
parameters come from Python's global ``random`` (see :mod:`stoker.vision.transforms`).
"""

from __future__ import annotations

import math
import numbers
import random
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from stoker.vision.transforms._base import (
    Img,
    InterpolationMode,
    check_image,
    image_size,
    interpolation_mode,
    like,
    pil_filter,
    setup_size,
    to_pil,
)

_SIZE_MSG = "Please provide only two dimensions (h, w) for size."
_PAD_MODES = ("constant", "edge", "reflect", "symmetric")


def resized_output_size(
    height: int, width: int, size: Sequence[int], max_size: int | None = None
) -> tuple[int, int]:
    """The ``(height, width)`` that Resize gives an image of ``height`` x ``width``.

    >>> resized_output_size(375, 500, [256])
    (256, 341)
    >>> resized_output_size(375, 500, [224, 224])
    (224, 224)
    """
    if len(size) == 2:
        return int(size[0]), int(size[1])
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = int(size[0]), int(int(size[0]) * long / short)
    if max_size is not None:
        if max_size <= new_short:
            raise ValueError(
                f"max_size = {max_size} must be strictly greater than the requested size "
                f"for the smaller edge size = {list(size)}."
            )
        if new_long > max_size:
            new_short, new_long = int(max_size * new_short / new_long), max_size
    new_w, new_h = (new_short, new_long) if width <= height else (new_long, new_short)
    return new_h, new_w


def resize(img: Img, size: tuple[int, int], interpolation: InterpolationMode) -> Img:
    """``img`` resampled to exactly ``size`` = (height, width) with Pillow's filter."""
    width, height = image_size(img)
    if (height, width) == tuple(size):
        return img
    pil = to_pil(img, "resize")
    return like(pil.resize((size[1], size[0]), pil_filter(interpolation)), img)


def crop(img: Img, top: int, left: int, height: int, width: int) -> Img:
    """The ``height`` x ``width`` region at (``top``, ``left``); outside the image is zero."""
    check_image(img, "crop")
    if isinstance(img, Image.Image):
        return img.crop((left, top, left + width, top + height))
    h, w = img.shape[:2]
    if top >= 0 and left >= 0 and top + height <= h and left + width <= w:
        return img[top : top + height, left : left + width]
    out = np.zeros((height, width, *img.shape[2:]), dtype=img.dtype)
    t0, l0 = max(top, 0), max(left, 0)
    t1, l1 = min(top + height, h), min(left + width, w)
    if t1 > t0 and l1 > l0:
        out[t0 - top : t1 - top, l0 - left : l1 - left] = img[t0:t1, l0:l1]
    return out


def center_crop(img: Img, size: tuple[int, int]) -> Img:
    """The centred ``size`` = (height, width) region, zero-padding an image that is smaller."""
    width, height = image_size(img)
    ch, cw = size
    if cw > width or ch > height:
        img = pad(
            img,
            [
                (cw - width) // 2 if cw > width else 0,
                (ch - height) // 2 if ch > height else 0,
                (cw - width + 1) // 2 if cw > width else 0,
                (ch - height + 1) // 2 if ch > height else 0,
            ],
        )
        width, height = image_size(img)
        if (width, height) == (cw, ch):
            return img
    top = round((height - ch) / 2.0)
    left = round((width - cw) / 2.0)
    return crop(img, top, left, ch, cw)


def _parse_padding(padding: object) -> tuple[int, int, int, int]:
    if isinstance(padding, numbers.Number) and not isinstance(padding, bool):
        p = int(padding)  # type: ignore[call-overload]
        return p, p, p, p
    if not isinstance(padding, (tuple, list)):
        raise TypeError(f"Got inappropriate padding arg: {padding!r}; pass an int or a tuple.")
    if len(padding) == 1:
        return (int(padding[0]),) * 4
    if len(padding) == 2:
        return int(padding[0]), int(padding[1]), int(padding[0]), int(padding[1])
    if len(padding) == 4:
        return int(padding[0]), int(padding[1]), int(padding[2]), int(padding[3])
    raise ValueError(
        f"Padding must be an int or a 1, 2, or 4 element tuple, not a {len(padding)} element tuple."
    )


def pad(img: Img, padding: object, fill: object = 0, padding_mode: str = "constant") -> Img:
    """``img`` padded by ``padding`` (int, (lr, tb) or (l, t, r, b)); negative values crop.

    Args:
        img: the image.
        padding: pixels to add on each border.
        fill: the value (or per-channel values) of new pixels in ``"constant"`` mode.
        padding_mode: ``"constant"``, ``"edge"``, ``"reflect"`` or ``"symmetric"``.
    """
    left, top, right, bottom = _parse_padding(padding)
    if padding_mode not in _PAD_MODES:
        raise ValueError(
            "Padding mode should be either constant, edge, reflect or symmetric, "
            f"got {padding_mode!r}."
        )
    check_image(img, "Pad")
    pil = img if isinstance(img, Image.Image) else None
    arr = np.asarray(img)
    h, w = arr.shape[:2]
    arr = arr[max(-top, 0) : h - max(-bottom, 0), max(-left, 0) : w - max(-right, 0)]
    left, top, right, bottom = max(left, 0), max(top, 0), max(right, 0), max(bottom, 0)
    h, w = arr.shape[:2]
    if padding_mode == "constant":
        out = np.empty((h + top + bottom, w + left + right, *arr.shape[2:]), dtype=arr.dtype)
        fill_values = np.asarray(0 if fill is None else fill, dtype=np.float64)
        if fill_values.ndim and arr.ndim == 3 and fill_values.size not in (1, arr.shape[2]):
            raise ValueError(
                f"fill must be a number or one value per channel ({arr.shape[2]}), got {fill!r}."
            )
        out[...] = fill_values.reshape(-1)[0] if arr.ndim == 2 else fill_values
        out[top : top + h, left : left + w] = arr
    else:
        widths = ((top, bottom), (left, right)) + ((0, 0),) * (arr.ndim - 2)
        out = np.pad(arr, widths, mode=padding_mode)  # type: ignore[call-overload]
    if pil is None:
        return out
    result = Image.fromarray(out)
    if pil.mode == "P":
        palette = pil.getpalette()
        if palette is not None:
            result.putpalette(palette)
    return result


def hflip(img: Img) -> Img:
    """``img`` mirrored left to right."""
    check_image(img, "hflip")
    if isinstance(img, Image.Image):
        return img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.ascontiguousarray(img[:, ::-1])


def vflip(img: Img) -> Img:
    """``img`` mirrored top to bottom."""
    check_image(img, "vflip")
    if isinstance(img, Image.Image):
        return img.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
    return np.ascontiguousarray(img[::-1])


class Resize:
    """Resizes to ``size``: (h, w), or an int for the shorter edge (keeping the aspect).

    Args:
        size: the output size.
        interpolation: the resampling filter (default bilinear, antialiased as Pillow does).
        max_size: the longest edge allowed when ``size`` is an int.
        antialias: accepted for torchvision compatibility; Pillow always antialiases.
    """

    def __init__(
        self,
        size: int | Sequence[int],
        interpolation: Any = InterpolationMode.BILINEAR,
        max_size: int | None = None,
        antialias: bool | None = True,
    ) -> None:
        if not isinstance(size, (int, Sequence)) or isinstance(size, bool):
            raise TypeError(f"Size should be int or sequence. Got {type(size).__name__}.")
        if isinstance(size, Sequence) and len(size) not in (1, 2):
            raise ValueError(f"If size is a sequence, it should have 1 or 2 values, got {size!r}.")
        if max_size is not None and isinstance(size, Sequence) and len(size) != 1:
            raise ValueError(
                "max_size should only be passed if size specifies the length of the smaller "
                f"edge, i.e. size should be an int or a sequence of length 1; got {size!r}."
            )
        self.size = size
        self.max_size = max_size
        self.interpolation = interpolation_mode(interpolation)
        self.antialias = antialias

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) this transform gives an image of ``height`` x ``width``."""
        size = [self.size] if isinstance(self.size, int) else list(self.size)
        return resized_output_size(height, width, size, self.max_size)

    def __call__(self, img: Img) -> Img:
        check_image(img, "Resize")
        width, height = image_size(img)
        return resize(img, self.output_size(height, width), self.interpolation)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(size={self.size}, interpolation={self.interpolation.value}, "
            f"max_size={self.max_size}, antialias={self.antialias})"
        )


class CenterCrop:
    """Crops the centre ``size`` region (zero-padding a smaller image first).

    Args:
        size: (h, w), or an int for a square.
    """

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = setup_size(size, _SIZE_MSG)

    def __call__(self, img: Img) -> Img:
        check_image(img, "CenterCrop")
        return center_crop(img, self.size)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size})"


class Pad:
    """Pads every border; see :func:`pad` for the arguments."""

    def __init__(self, padding: Any, fill: Any = 0, padding_mode: str = "constant") -> None:
        _parse_padding(padding)
        if not isinstance(fill, (numbers.Number, tuple, list)):
            raise TypeError(f"Got inappropriate fill arg {fill!r}: pass a number or a tuple.")
        if padding_mode not in _PAD_MODES:
            raise ValueError(
                "Padding mode should be either constant, edge, reflect or symmetric, "
                f"got {padding_mode!r}."
            )
        self.padding = padding
        self.fill = fill
        self.padding_mode = padding_mode

    def __call__(self, img: Img) -> Img:
        return pad(img, self.padding, self.fill, self.padding_mode)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(padding={self.padding}, fill={self.fill}, "
            f"padding_mode={self.padding_mode})"
        )


class RandomCrop:
    """Crops a random ``size`` region, optionally padding first.

    Args:
        size: (h, w), or an int for a square.
        padding: padding applied before cropping (see :class:`Pad`).
        pad_if_needed: pad an image smaller than ``size`` up to it.
        fill: the fill value for ``"constant"`` padding.
        padding_mode: as :class:`Pad`.
    """

    def __init__(
        self,
        size: int | Sequence[int],
        padding: Any = None,
        pad_if_needed: bool = False,
        fill: Any = 0,
        padding_mode: str = "constant",
    ) -> None:
        self.size = setup_size(size, _SIZE_MSG)
        if padding is not None:
            _parse_padding(padding)
        self.padding = padding
        self.pad_if_needed = pad_if_needed
        self.fill = fill
        self.padding_mode = padding_mode

    @staticmethod
    def get_params(img: Img, output_size: tuple[int, int]) -> tuple[int, int, int, int]:
        """A random (top, left, height, width) of an ``output_size`` crop of ``img``."""
        width, height = image_size(img)
        th, tw = output_size
        if height < th or width < tw:
            raise ValueError(
                f"Required crop size {(th, tw)} is larger than input image size "
                f"{(height, width)}; pass pad_if_needed=True or a smaller size."
            )
        if width == tw and height == th:
            return 0, 0, height, width
        return random.randint(0, height - th), random.randint(0, width - tw), th, tw

    def __call__(self, img: Img) -> Img:
        check_image(img, "RandomCrop")
        if self.padding is not None:
            img = pad(img, self.padding, self.fill, self.padding_mode)
        width, height = image_size(img)
        if self.pad_if_needed and width < self.size[1]:
            img = pad(img, [self.size[1] - width, 0], self.fill, self.padding_mode)
        width, height = image_size(img)
        if self.pad_if_needed and height < self.size[0]:
            img = pad(img, [0, self.size[0] - height], self.fill, self.padding_mode)
        top, left, h, w = self.get_params(img, self.size)
        return crop(img, top, left, h, w)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, padding={self.padding})"


def random_resized_crop_params(
    width: int, height: int, scale: Sequence[float], ratio: Sequence[float]
) -> tuple[int, int, int, int]:
    """A random (top, left, height, width) crop, drawn as torchvision's RandomResizedCrop.

    Up to ten tries draw an area fraction uniformly in ``scale`` and a log-uniform aspect
    ratio in ``ratio``; the first crop that fits is placed uniformly; else a central crop
    with the ratio clamped into ``ratio``.
    """
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target_area = area * random.uniform(scale[0], scale[1])
        aspect = math.exp(random.uniform(log_lo, log_hi))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            return random.randint(0, height - h), random.randint(0, width - w), h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = round(w / min(ratio))
    elif in_ratio > max(ratio):
        h = height
        w = round(h * max(ratio))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class RandomResizedCrop:
    """Crops a random area and aspect ratio, then resizes to ``size``.

    Args:
        size: the output (h, w), or an int for a square.
        scale: bounds of the crop's area as a fraction of the image's.
        ratio: bounds of the crop's aspect ratio (width / height), sampled log-uniformly.
        interpolation: the resampling filter.
        antialias: accepted for torchvision compatibility; Pillow always antialiases.
    """

    def __init__(
        self,
        size: int | Sequence[int],
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
        interpolation: Any = InterpolationMode.BILINEAR,
        antialias: bool | None = True,
    ) -> None:
        self.size = setup_size(size, _SIZE_MSG)
        if not isinstance(scale, Sequence):
            raise TypeError(f"Scale should be a sequence, got {type(scale).__name__}.")
        if not isinstance(ratio, Sequence):
            raise TypeError(f"Ratio should be a sequence, got {type(ratio).__name__}.")
        if scale[0] > scale[1] or ratio[0] > ratio[1]:
            warnings.warn("Scale and ratio should be of kind (min, max)", stacklevel=2)
        self.scale = scale
        self.ratio = ratio
        self.interpolation = interpolation_mode(interpolation)
        self.antialias = antialias

    @staticmethod
    def get_params(
        img: Img, scale: Sequence[float], ratio: Sequence[float]
    ) -> tuple[int, int, int, int]:
        """A random (top, left, height, width) crop of ``img``."""
        width, height = image_size(img)
        return random_resized_crop_params(width, height, scale, ratio)

    def __call__(self, img: Img) -> Img:
        check_image(img, "RandomResizedCrop")
        top, left, h, w = self.get_params(img, self.scale, self.ratio)
        return resize(crop(img, top, left, h, w), self.size, self.interpolation)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(size={self.size}, scale={tuple(self.scale)}, "
            f"ratio={tuple(self.ratio)}, interpolation={self.interpolation.value}, "
            f"antialias={self.antialias})"
        )


class RandomHorizontalFlip:
    """Mirrors left to right with probability ``p``."""

    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, img: Img) -> Img:
        return hflip(img) if random.random() < self.p else img

    def __repr__(self) -> str:
        return f"{type(self).__name__}(p={self.p})"


class RandomVerticalFlip:
    """Mirrors top to bottom with probability ``p``."""

    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, img: Img) -> Img:
        return vflip(img) if random.random() < self.p else img

    def __repr__(self) -> str:
        return f"{type(self).__name__}(p={self.p})"


def _fill_for(fill: Any, img: Image.Image) -> Any:
    """Pillow's ``fillcolor`` for ``img`` from a number or a per-band sequence."""
    bands = len(img.getbands())
    if fill is None:
        fill = 0
    if isinstance(fill, (int, float)) and bands > 1:
        fill = (fill,) * bands
    if isinstance(fill, (list, tuple)):
        if len(fill) == 1:
            fill = tuple(fill) * bands
        if len(fill) != bands:
            raise ValueError(
                f"The number of elements in 'fill' does not match the number of bands of the "
                f"image ({len(fill)} != {bands})."
            )
        return tuple(fill) if img.mode == "F" else tuple(int(x) for x in fill)
    return fill if img.mode == "F" else int(fill)


class RandomRotation:
    """Rotates by an angle drawn uniformly from ``degrees`` (counter-clockwise).

    Args:
        degrees: a number d for (-d, d), or (min, max).
        interpolation: nearest (default), bilinear or bicubic.
        expand: grow the output to hold the whole rotated image.
        center: the (x, y) centre of rotation; default the image centre.
        fill: the value of pixels outside the rotated image.
    """

    def __init__(
        self,
        degrees: float | Sequence[float],
        interpolation: Any = InterpolationMode.NEAREST,
        expand: bool = False,
        center: Sequence[float] | None = None,
        fill: Any = 0,
    ) -> None:
        if isinstance(degrees, numbers.Number):
            if degrees < 0:  # type: ignore[operator]
                raise ValueError(
                    f"If degrees is a single number, it must be positive, got {degrees}."
                )
            self.degrees = [-float(degrees), float(degrees)]  # type: ignore[arg-type]
        elif isinstance(degrees, Sequence) and len(degrees) == 2:
            self.degrees = [float(d) for d in degrees]
        else:
            raise ValueError(
                f"degrees should be a number or a sequence of length 2, got {degrees!r}."
            )
        if center is not None and (not isinstance(center, Sequence) or len(center) != 2):
            raise ValueError(f"center should be a sequence of length 2, got {center!r}.")
        if fill is not None and not isinstance(fill, (Sequence, numbers.Number)):
            raise TypeError(f"Fill should be either a sequence or a number, got {fill!r}.")
        self.interpolation = interpolation_mode(interpolation)
        self.expand = expand
        self.center = center
        self.fill = 0 if fill is None else fill

    @staticmethod
    def get_params(degrees: Sequence[float]) -> float:
        """A random angle in degrees, uniform in ``degrees``."""
        return random.uniform(float(degrees[0]), float(degrees[1]))

    def __call__(self, img: Img) -> Img:
        pil = to_pil(img, "RandomRotation")
        angle = self.get_params(self.degrees)
        center = None if self.center is None else (self.center[0], self.center[1])
        out = pil.rotate(
            angle,
            pil_filter(self.interpolation),
            self.expand,
            center,
            fillcolor=_fill_for(self.fill, pil),
        )
        return like(out, img)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(degrees={self.degrees}, "
            f"interpolation={self.interpolation.value}, expand={self.expand}, fill={self.fill})"
        )
