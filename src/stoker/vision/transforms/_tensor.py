"""ToTensor and Normalize: images to C x H x W float32 NumPy arrays, then standardised.

ToTensor always returns NumPy; the DataLoader's ``tensor_type`` rule turns batches into
torch tensors when the user asks for them, so transforms stay framework-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from stoker import _torch


def to_tensor(pic: Any) -> np.ndarray[Any, Any]:
    """A PIL image or H x W (x C) array as a C x H x W array; uint8 becomes float32 in [0, 1].

    Other dtypes keep their values and type, as torchvision's ``to_tensor`` does.

    >>> import numpy as np
    >>> x = to_tensor(np.full((2, 3, 3), 255, np.uint8))
    >>> x.shape, x.dtype, float(x.max())
    ((3, 2, 3), dtype('float32'), 1.0)
    """
    if isinstance(pic, Image.Image):
        arr = np.asarray(pic.convert("L")) if pic.mode == "1" else np.asarray(pic)
    elif isinstance(pic, np.ndarray):
        if pic.ndim not in (2, 3):
            raise ValueError(
                f"pic should be 2 or 3 dimensional (H x W or H x W x C), got {pic.ndim} dimensions."
            )
        arr = pic
    else:
        raise TypeError(f"pic should be PIL Image or ndarray, got {type(pic).__name__}.")
    if arr.ndim == 2:
        arr = arr[:, :, None]
    chw = arr.transpose(2, 0, 1)
    if arr.dtype == np.uint8:
        out = np.empty(chw.shape, dtype=np.float32)
        np.multiply(chw, np.float32(1.0 / 255.0), out=out)
        return out
    return np.ascontiguousarray(chw)


class ToTensor:
    """Converts a PIL image or H x W x C uint8 array to a C x H x W float32 array in [0, 1]."""

    def __call__(self, pic: Any) -> np.ndarray[Any, Any]:
        return to_tensor(pic)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _check_float_chw(x: Any) -> None:
    if x.ndim < 3:
        raise ValueError(
            "Expected tensor to be a tensor image of size (..., C, H, W), got shape "
            f"{tuple(x.shape)}; apply ToTensor first."
        )


class Normalize:
    """Standardises each channel: ``(x - mean[c]) / std[c]`` on a C x H x W float array.

    Works on the NumPy arrays that :class:`ToTensor` gives and on torch tensors.

    Args:
        mean: per-channel means.
        std: per-channel standard deviations (none may be zero).
        inplace: write the result into the input.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float], inplace: bool = False) -> None:
        self.mean = list(mean) if isinstance(mean, Sequence) else [float(mean)]
        self.std = list(std) if isinstance(std, Sequence) else [float(std)]
        self.inplace = inplace

    def __call__(self, x: Any) -> Any:
        if _torch.is_tensor(x):
            return self._torch(x)
        if not isinstance(x, np.ndarray):
            raise TypeError(
                f"Normalize expects a C x H x W float array or tensor, got {type(x).__name__}; "
                "put ToTensor() before Normalize."
            )
        if not np.issubdtype(x.dtype, np.floating):
            raise TypeError(
                f"Input tensor should be a float tensor. Got {x.dtype}; put ToTensor() before "
                "Normalize."
            )
        _check_float_chw(x)
        mean = np.asarray(self.mean, dtype=x.dtype)
        std = np.asarray(self.std, dtype=x.dtype)
        if (std == 0).any():
            raise ValueError(
                f"std evaluated to zero after conversion to {x.dtype}, leading to division by "
                f"zero (std={self.std})."
            )
        shape = (-1, 1, 1)
        out = x if self.inplace else np.empty_like(x)
        np.subtract(x, mean.reshape(shape), out=out)
        np.divide(out, std.reshape(shape), out=out)
        return out

    def _torch(self, x: Any) -> Any:
        torch = _torch.loaded()
        assert torch is not None  # x is a tensor, so torch is imported
        if not x.is_floating_point():
            raise TypeError(f"Input tensor should be a float tensor. Got {x.dtype}.")
        _check_float_chw(x)
        mean = torch.as_tensor(self.mean, dtype=x.dtype, device=x.device).view(-1, 1, 1)
        std = torch.as_tensor(self.std, dtype=x.dtype, device=x.device).view(-1, 1, 1)
        if (std == 0).any():
            raise ValueError(
                f"std evaluated to zero after conversion to {x.dtype}, leading to division by "
                f"zero (std={self.std})."
            )
        if not self.inplace:
            x = x.clone()
        return x.sub_(mean).div_(std)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mean={self.mean}, std={self.std})"
