"""Shared pieces of the transforms: interpolation modes, size parsing, image adapters, Compose.

Every geometric and colour transform takes a PIL image or an H x W x C (or H x W) uint8
NumPy array and returns the same kind. NumPy arrays are wrapped as PIL images (no pixel
copy for the common RGB / L layouts) so that both kinds go through the same Pillow kernels
and give the same pixels as torchvision does on PIL images.

Randomness: every random transform draws from Python's global ``random`` module (never
from NumPy's or torch's). stoker's DataLoader seeds ``random`` before each batch from
(seed, epoch, batch index), so augmentations are reproducible and independent of which
worker ran them; call ``random.seed(...)`` to make a direct call repeatable.
"""

from __future__ import annotations

import enum
import numbers
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from PIL import Image

Img = Any
"""A PIL image or an H x W (x C) uint8 NumPy array."""


class InterpolationMode(enum.Enum):
    """Resampling filters, with torchvision's names and string values."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


_PIL_FILTERS = {
    InterpolationMode.NEAREST: Image.Resampling.NEAREST,
    InterpolationMode.NEAREST_EXACT: Image.Resampling.NEAREST,
    InterpolationMode.BILINEAR: Image.Resampling.BILINEAR,
    InterpolationMode.BICUBIC: Image.Resampling.BICUBIC,
    InterpolationMode.BOX: Image.Resampling.BOX,
    InterpolationMode.HAMMING: Image.Resampling.HAMMING,
    InterpolationMode.LANCZOS: Image.Resampling.LANCZOS,
}
_FROM_PIL = {int(v): k for k, v in _PIL_FILTERS.items() if k is not InterpolationMode.NEAREST_EXACT}


def interpolation_mode(value: object) -> InterpolationMode:
    """The :class:`InterpolationMode` for ``value``.

    Accepts stoker's or torchvision's ``InterpolationMode``, its string value, or a Pillow
    filter constant.

    >>> interpolation_mode("bicubic")
    <InterpolationMode.BICUBIC: 'bicubic'>
    >>> interpolation_mode(2).name
    'BILINEAR'
    """
    if isinstance(value, InterpolationMode):
        return value
    is_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if is_int and int(value) in _FROM_PIL:  # type: ignore[call-overload]
        return _FROM_PIL[int(value)]  # type: ignore[call-overload]
    raw = getattr(value, "value", value)  # torchvision's enum carries the same strings
    if isinstance(raw, str):
        try:
            return InterpolationMode(raw)
        except ValueError:
            pass
    raise TypeError(
        "interpolation must be an InterpolationMode (or its string value, or a Pillow "
        f"filter constant), got {value!r}."
    )


def pil_filter(mode: InterpolationMode) -> Image.Resampling:
    """The Pillow resampling filter that implements ``mode``."""
    return _PIL_FILTERS[mode]


def setup_size(size: object, error_msg: str) -> tuple[int, int]:
    """``(height, width)`` from an int or a sequence of one or two ints.

    >>> setup_size(224, "")
    (224, 224)
    >>> setup_size([32, 48], "")
    (32, 48)
    """
    if isinstance(size, numbers.Number) and not isinstance(size, bool):
        return int(size), int(size)  # type: ignore[call-overload]
    if isinstance(size, Sequence) and len(size) == 1:
        return int(size[0]), int(size[0])
    if not isinstance(size, Sequence) or len(size) != 2:
        raise ValueError(error_msg)
    return int(size[0]), int(size[1])


def check_image(img: object, who: str) -> None:
    """Raise ``TypeError`` unless ``img`` is a PIL image or an H x W (x C) NumPy array."""
    if isinstance(img, Image.Image):
        return
    if isinstance(img, np.ndarray) and img.ndim in (2, 3):
        return
    found = f"an array of shape {img.shape}" if isinstance(img, np.ndarray) else type(img).__name__
    raise TypeError(
        f"{who} expects a PIL image or an H x W x C uint8 NumPy array, got {found}; "
        "apply it before ToTensor."
    )


def image_size(img: Img) -> tuple[int, int]:
    """``(width, height)`` of a PIL image or an H x W (x C) array, as torchvision orders it."""
    if isinstance(img, Image.Image):
        return img.size
    return int(img.shape[1]), int(img.shape[0])


def to_pil(img: Img, who: str) -> Image.Image:
    """``img`` as a PIL image (NumPy uint8 arrays are wrapped without copying where possible)."""
    check_image(img, who)
    if isinstance(img, Image.Image):
        return img
    arr = np.asarray(img)
    if arr.dtype != np.uint8:
        raise TypeError(
            f"{who} expects a uint8 image array, got dtype {arr.dtype}; convert it with "
            "arr.astype(np.uint8) or apply the transform before ToTensor."
        )
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if arr.ndim == 3 and arr.shape[2] not in (3, 4):
        raise TypeError(f"{who} expects 1, 3 or 4 channels, got an array of shape {arr.shape}.")
    return Image.fromarray(np.ascontiguousarray(arr))


def like(result: Image.Image, original: Img) -> Img:
    """``result`` in the kind of ``original``: PIL stays PIL, arrays come back as arrays."""
    if isinstance(original, Image.Image):
        return result
    arr = np.asarray(result)
    if arr.ndim == 2 and original.ndim == 3:
        arr = arr[:, :, None]
    return arr


class Compose:
    """Applies transforms one after the other.

    Args:
        transforms: the transforms (callables), applied in order.

    >>> Compose([lambda x: x + 1, lambda x: x * 2])(3)
    8
    """

    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, img: Any) -> Any:
        for t in self.transforms:
            img = t(img)
        return img

    def __repr__(self) -> str:
        lines = "".join(f"\n    {t}" for t in self.transforms)
        return f"{type(self).__name__}({lines}\n)"


class RandomApply:
    """Applies a list of transforms together with probability ``p``.

    Args:
        transforms: the transforms applied (in order) when the draw says so.
        p: the probability of applying them.
    """

    def __init__(self, transforms: Sequence[Callable[[Any], Any]], p: float = 0.5) -> None:
        self.transforms = list(transforms)
        self.p = p

    def __call__(self, img: Any) -> Any:
        if self.p < random.random():
            return img
        for t in self.transforms:
            img = t(img)
        return img

    def __repr__(self) -> str:
        lines = "".join(f"\n    {t}" for t in self.transforms)
        return f"{type(self).__name__}(\n    p={self.p}{lines}\n)"


class Lambda:
    """Applies a user function as a transform.

    Args:
        lambd: the function to apply.

    Raises:
        TypeError: when ``lambd`` is not callable.
    """

    def __init__(self, lambd: Callable[[Any], Any]) -> None:
        if not callable(lambd):
            raise TypeError(f"Argument lambd should be callable, got {type(lambd).__name__!r}.")
        self.lambd = lambd

    def __call__(self, img: Any) -> Any:
        return self.lambd(img)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
