"""GPU JPEG decode: workers send the JPEG bytes and their random draws; the device decodes.

``ImageFolder(..., decode="gpu")`` splits the fused path's pipeline
(:mod:`stoker.vision._fused`): a worker reads each file and draws its crop and flips
exactly as the CPU path does (:func:`~stoker.vision._fused.prepare`), and sends bytes and
draws as three columns (:func:`encode`). In the main process, before pinning, the loader
hands each batch to :func:`finish`: nvjpeg decodes it (torchvision's ``decode_jpeg`` on
``cuda``) and :func:`transform` crops, resizes, flips and normalises it there into one
N x 3 x H x W float32 tensor. With torch's loader, or a wrapper such as ``Subset``, call
the dataset's ``main_process_step`` on each batch.

A dataset argument, not a transform, so the draws cannot differ from the CPU path's; the
main process, as CUDA cannot run in forked workers. Without CUDA, this runs on the CPU,
after one warning.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from stoker import _torch
from stoker.vision import _fused
from stoker.vision.transforms._base import InterpolationMode
from stoker.vision.transforms._geometric import RandomResizedCrop, Resize

GEOMETRY_COLUMNS = ("top", "left", "height", "width", "resize_h", "resize_w", "hflip", "vflip")
"""Per sample: the crop box, the size resized to, and whether to flip (the draws)."""
_MODES = {InterpolationMode.BILINEAR: "bilinear", InterpolationMode.BICUBIC: "bicubic"}


def check_plan(p: _fused.FusedPlan | None, transform: object) -> _fused.FusedPlan:
    """``p`` when GPU decode can run it.

    Raises:
        ValueError: when the transform is not one the GPU path runs, saying which is.
    """
    if p is None or p.rest or p.geometry.interpolation not in _MODES:
        raise ValueError(
            "decode='gpu' needs a Compose of RandomResizedCrop or Resize [+ CenterCrop] "
            "(bilinear or bicubic), any flips, ToTensor and an optional Normalize, with "
            f"nothing after, and the default image loader; got {transform!r}. Use "
            "decode='cpu' (the default) for other transforms."
        )
    return p


def geometry(p: _fused.FusedPlan, job: _fused.Job) -> list[int]:
    """The :data:`GEOMETRY_COLUMNS` of one prepared job (its draws are made already).

    A random crop is cut and then resized; a Resize resizes the whole image and then cuts
    the CenterCrop (or nothing) out of it.
    """
    hflip = sum(1 for vertical in job.flips if not vertical) % 2
    vflip = sum(1 for vertical in job.flips if vertical) % 2
    oh, ow = job.out
    if type(p.geometry) is RandomResizedCrop:
        top, left, h, w = (int(v) for v in job.box)
        return [top, left, h, w, oh, ow, hflip, vflip]
    assert isinstance(p.geometry, Resize)
    height, width = job.size
    rh, rw = p.geometry.output_size(height, width)
    top, left = round((rh - oh) / 2.0), round((rw - ow) / 2.0)
    return [top, left, oh, ow, rh, rw, hflip, vflip]


def encode(
    p: _fused.FusedPlan, jobs: Sequence[_fused.Job], targets: Sequence[Any]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The batch's columns: JPEG bytes (N x longest, zero padded), their lengths, the
    geometry (N x 8 int32, :data:`GEOMETRY_COLUMNS`) and the targets (int64)."""
    lengths = np.array([len(job.data) for job in jobs], dtype=np.int64)
    data = np.zeros((len(jobs), int(lengths.max(initial=0))), dtype=np.uint8)
    for row, job in zip(data, jobs, strict=True):
        row[: len(job.data)] = np.frombuffer(job.data, np.uint8)
    geom = np.array([geometry(p, job) for job in jobs], dtype=np.int32).reshape(-1, 8)
    return data, lengths, geom, np.asarray(targets, dtype=np.int64)


def decode(data: Any, lengths: Any, device: Any) -> list[Any]:
    """The JPEGs (rows of ``data``, ``lengths`` bytes each) as 3 x H x W uint8 tensors on
    ``device``: nvjpeg on CUDA (one call for the batch), Pillow elsewhere."""
    torch = _torch.require("decode='gpu'")
    data = torch.as_tensor(data)
    rows = [data[i, : int(n)] for i, n in enumerate(torch.as_tensor(lengths).tolist())]
    if torch.device(device).type == "cuda":
        from torchvision.io import (  # type: ignore[import-not-found]
            ImageReadMode,
            decode_jpeg,
        )

        out: list[Any] = decode_jpeg(rows, mode=ImageReadMode.RGB, device=device)
        return out
    images = []
    for row in rows:
        with Image.open(io.BytesIO(row.numpy().tobytes())) as img:
            rgb = np.array(img.convert("RGB"))  # writable: torch wraps it
        images.append(torch.from_numpy(rgb).permute(2, 0, 1).to(device))
    return images


def transform(p: _fused.FusedPlan, images: Sequence[Any], geom: Any) -> Any:
    """Crop, resize, flip and normalise 3 x H x W uint8 ``images`` (on any one device) by
    the draws in ``geom``; N x 3 x H x W float32 on their device (a list when the output
    sizes differ, as a Resize of differently shaped images gives).

    Each resize is torch's antialiased filter on float32, rounded to uint8 levels as the
    CPU path's uint8 resample is, then ``x * (1 / (255 * std)) - mean / std`` as there.
    """
    torch = _torch.require("decode='gpu'")
    if not images:
        raise ValueError("a batch for decode='gpu' must hold at least one image, got none.")
    device = images[0].device
    mode = _MODES[p.geometry.interpolation]
    crop_first = type(p.geometry) is RandomResizedCrop
    scale = torch.from_numpy(p.scale).to(device)
    offset = torch.from_numpy(p.offset).to(device)
    out = []
    for img, g in zip(images, torch.as_tensor(geom).tolist(), strict=True):
        top, left, h, w, rh, rw, hflip, vflip = g
        x = img[:, top : top + h, left : left + w] if crop_first else img
        x = x[None].float()
        if tuple(x.shape[-2:]) != (rh, rw):
            x = torch.nn.functional.interpolate(
                x, size=(rh, rw), mode=mode, antialias=True, align_corners=False
            )
            x = x.round_().clamp_(0, 255)
        if not crop_first:
            x = x[..., top : top + h, left : left + w]
        dims = [d for d, on in ((1, vflip), (2, hflip)) if on]
        out.append(x[0].flip(dims) if dims else x[0])
    if all(o.shape == out[0].shape for o in out):
        return torch.stack(out).mul_(scale).sub_(offset)  # normalised batch-wise
    return [o.mul_(scale).sub_(offset) for o in out]


def device_for_decode() -> Any:
    """The current CUDA device, or the CPU (after one warning) without CUDA or torchvision."""
    torch = _torch.require("decode='gpu'")
    import importlib.util

    if torch.cuda.is_available() and importlib.util.find_spec("torchvision") is not None:
        return torch.device("cuda", torch.cuda.current_device())
    warnings.warn(
        "decode='gpu' but CUDA or torchvision is not available, so JPEGs are decoded and "
        "transformed on the CPU in the main process; use decode='cpu' (the default) to "
        "decode in the workers.",
        UserWarning,
        stacklevel=3,
    )
    return torch.device("cpu")


class BatchStep:
    """The main-process step of decode='gpu': a batch of columns in, [images, targets] out.

    Made by the dataset and called by the loader on each batch before pinning; the device
    is chosen on the first batch (so a dataset pickled to workers never touches CUDA).
    """

    def __init__(self, p: _fused.FusedPlan) -> None:
        self.plan = p
        self.device: Any = None

    def __call__(self, batch: Any) -> Any:
        if not (isinstance(batch, (list, tuple)) and len(batch) == 4):
            return batch  # not a batch of this dataset's columns (a custom collate_fn)
        if self.device is None:
            self.device = device_for_decode()
        data, lengths, geom, targets = batch
        torch = _torch.require("decode='gpu'")
        images = transform(self.plan, decode(data, lengths, self.device), geom)
        return [images, torch.as_tensor(targets)]
