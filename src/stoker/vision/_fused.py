"""The fused JPEG fast path: decode at reduced scale, crop + resize, flip, ToTensor, Normalize.

A :class:`FusedPlan` is made from a ``Compose`` whose transforms start with::

    RandomResizedCrop | Resize [CenterCrop]    # the geometry
    RandomHorizontalFlip / RandomVerticalFlip  # any number, in any order
    ToTensor
    Normalize                                  # optional
    ...                                        # anything else, applied afterwards

For a JPEG file it draws the crop first (the same calls to ``random``, in the same order,
as the plain transforms), decodes at the smallest DCT scale whose crop still covers the
output, resamples the crop once, flips with views and normalises in one pass. Other
transforms, non-JPEG files and CMYK JPEGs take the plain path. Resize [+ CenterCrop]
matches torchvision within 1/255; RandomResizedCrop draws the same crops but decodes with
the fast IDCT (``_FAST_RANDOM_DECODE``). ``docs/fast-path.md`` says which resampler runs
where, how close each step stays to torchvision, and how batches reuse memory.
"""

from __future__ import annotations

import functools
import math
import os
import random
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import PIL
from PIL import Image

from stoker import _torch, _worker_info
from stoker._batch import Alloc, ColumnBatch, output_alloc
from stoker._worker_info import get_worker_info
from stoker.vision import _decode
from stoker.vision._workspace import lend, workspace
from stoker.vision.transforms._base import Compose, pil_filter
from stoker.vision.transforms._geometric import (
    CenterCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    RandomVerticalFlip,
    Resize,
    random_resized_crop_params,
)
from stoker.vision.transforms._tensor import Normalize, ToTensor

try:  # stoker's optional C kernels (see setup.py)
    from stoker.vision import _native
except ImportError:  # pragma: no cover - exercised where they could not be built
    _native = None  # type: ignore[assignment]

_PLAIN_COLORSPACES = ("YCbCr", "Gray", "RGB")
_MAX_THREADS = 8
_FAST_RANDOM_DECODE = True
"""Whether RandomResizedCrop decodes with the fast IDCT and upsampling (read by :func:`plan`)."""
_NATIVE_RESAMPLE = True
"""Whether stoker's C resampler runs where it is built (see :func:`_resample`)."""
_TORCH_RESAMPLE = True
"""Whether bilinear resampling uses torch's uint8 kernel when torch is already imported (and
the C resampler does not run)."""
_TORCH_NORMALIZE = True
"""Whether ToTensor + Normalize run on torch's kernels where torch is imported and runs one
thread (see :func:`_torch_may_normalize`)."""
_NATIVE_FILTERS = frozenset(
    int(f)
    for f in (
        Image.Resampling.LANCZOS,
        Image.Resampling.BILINEAR,
        Image.Resampling.BICUBIC,
        Image.Resampling.BOX,
        Image.Resampling.HAMMING,
    )
)
"""Pillow's filters that the C resampler computes as Pillow does (all but NEAREST)."""
_PILLOW_13_ORDER = int(PIL.__version__.split(".")[0]) >= 13
"""Whether the installed Pillow orders a resize's two passes as Pillow 13 does (the C
resampler follows it, so that its bytes are this Pillow's)."""


@dataclass(frozen=True)
class FusedPlan:
    """What the fast path does for one Compose; built by :func:`plan`.

    Attributes:
        geometry: the leading RandomResizedCrop or Resize.
        center: the CenterCrop after a Resize, or None.
        flips: the flip transforms, in order, as (vertical, probability).
        scale: per channel, 1 / (255 * std) (1/255 without Normalize).
        offset: per channel, mean / std (0 without Normalize).
        rest: the transforms applied after, to the C x H x W array.
        fast_decode: decode with the fast IDCT and upsampling (RandomResizedCrop only).
    """

    geometry: RandomResizedCrop | Resize
    center: CenterCrop | None
    flips: tuple[tuple[bool, float], ...]
    scale: np.ndarray[Any, Any]
    offset: np.ndarray[Any, Any]
    rest: tuple[Callable[[Any], Any], ...]
    fast_decode: bool = False

    @functools.cached_property
    def coefficients(self) -> tuple[list[float], list[float]]:
        """``scale`` and ``offset`` as 3 floats each, for the C kernel (made once per plan,
        not per image)."""
        return self.scale.ravel().tolist(), self.offset.ravel().tolist()


def plan(transform: object) -> FusedPlan | None:
    """The fast-path plan for ``transform``, or None when it does not start as required.

    >>> from stoker.vision import transforms as T
    >>> plan(T.Compose([T.RandomResizedCrop(8), T.ToTensor()])) is not None
    True
    >>> plan(T.Compose([T.ColorJitter(0.1), T.ToTensor()])) is None
    True
    """
    if type(transform) is not Compose:
        return None
    ts: Sequence[Any] = transform.transforms
    pos = 0
    center = None
    if pos < len(ts) and type(ts[pos]) in (RandomResizedCrop, Resize):
        geometry = ts[pos]
        pos += 1
    else:
        return None
    if type(geometry) is Resize and pos < len(ts) and type(ts[pos]) is CenterCrop:
        center = ts[pos]
        pos += 1
    flips = []
    while pos < len(ts) and type(ts[pos]) in (RandomHorizontalFlip, RandomVerticalFlip):
        flips.append((type(ts[pos]) is RandomVerticalFlip, float(ts[pos].p)))
        pos += 1
    if pos >= len(ts) or type(ts[pos]) is not ToTensor:
        return None
    pos += 1
    mean, std = [0.0], [1.0]
    if pos < len(ts) and type(ts[pos]) is Normalize:
        mean, std = list(ts[pos].mean), list(ts[pos].std)
        pos += 1
        if len(mean) not in (1, 3) or len(std) not in (1, 3) or 0 in std:
            return None  # the plain path raises the right error
    std_a = np.broadcast_to(np.asarray(std, dtype=np.float64), (3,))
    mean_a = np.broadcast_to(np.asarray(mean, dtype=np.float64), (3,))
    scale = (1.0 / (255.0 * std_a)).astype(np.float32).reshape(3, 1, 1)
    offset = (mean_a / std_a).astype(np.float32).reshape(3, 1, 1)
    fast = _FAST_RANDOM_DECODE and type(geometry) is RandomResizedCrop
    return FusedPlan(geometry, center, tuple(flips), scale, offset, tuple(ts[pos:]), fast)


_Box = tuple[float, float, float, float, int, int]


def _box(p: FusedPlan, height: int, width: int) -> _Box | None:
    """The source box (top, left, h, w) and output (h, w); draws as the plain path.

    None, before any random draw, when the plain path must run instead.
    """
    g = p.geometry
    if type(g) is RandomResizedCrop:
        top, left, h, w = random_resized_crop_params(width, height, g.scale, g.ratio)
        return top, left, h, w, g.size[0], g.size[1]
    assert isinstance(g, Resize)
    rh, rw = g.output_size(height, width)
    if p.center is None:
        return 0.0, 0.0, height, width, rh, rw
    ch, cw = p.center.size
    if ch > rh or cw > rw:
        return None  # CenterCrop would pad: the plain path does that
    ct = round((rh - ch) / 2.0)
    cl = round((rw - cw) / 2.0)
    sy, sx = height / rh, width / rw
    return ct * sy, cl * sx, ch * sy, cw * sx, ch, cw


@dataclass(frozen=True)
class Job:
    """One image's work after its random draws: decode, resample, flip, normalise.

    :func:`execute` runs it without touching any random state, so jobs of a batch can run
    in any order or in parallel threads and still give the sequential result.
    """

    path: str
    data: _decode.Data
    size: tuple[int, int]
    box: tuple[float, float, float, float]
    out: tuple[int, int]
    flips: tuple[bool, ...]
    decoded: np.ndarray[Any, Any] | None = None
    """The image already decoded at 1/``divisor`` scale (a pixel cache's entry), or None."""
    divisor: int = 1


def prepare(p: FusedPlan, path: str, data: _decode.Data) -> Job | None:
    """Draw the random parameters for one JPEG, or None (before any draw) for the plain path.

    Raises:
        OSError: for an unreadable JPEG header (the message names the file).
    """
    if not _decode.is_jpeg(data):
        return None
    header = _decode.jpeg_header(data, path)
    if header is None:
        height, width, mode = _decode.jpeg_size_pillow(data, path)
        if mode not in ("RGB", "L"):
            return None
    else:
        height, width, colorspace = header
        if colorspace not in _PLAIN_COLORSPACES:
            return None  # CMYK / YCCK: Pillow converts those
    return _draw(p, path, data, (height, width))


def prepare_decoded(
    p: FusedPlan, path: str, size: tuple[int, int], decoded: np.ndarray[Any, Any], divisor: int
) -> Job | None:
    """:func:`prepare` for an image already decoded (H x W x 3 uint8 at 1/``divisor`` of
    its full ``size``): the same draws, and no decode when the job runs."""
    return _draw(p, path, b"", size, decoded, divisor)


def _draw(
    p: FusedPlan,
    path: str,
    data: _decode.Data,
    size: tuple[int, int],
    decoded: np.ndarray[Any, Any] | None = None,
    divisor: int = 1,
) -> Job | None:
    box = _box(p, *size)
    if box is None:
        return None
    top, left, bh, bw, oh, ow = box
    flips = tuple(vertical for vertical, prob in p.flips if random.random() < prob)
    return Job(path, data, size, (top, left, bh, bw), (oh, ow), flips, decoded, divisor)


def decode_for_cache(p: FusedPlan, path: str, data: bytes, reduce: bool) -> Job | None:
    """The pixels a pixel cache keeps for a JPEG: a Job whose ``decoded`` is the whole image,
    decoded as :func:`pixels` would (the accurate decode for Resize, which must match
    torchvision; the fast one for RandomResizedCrop), at full scale, or with ``reduce`` (a
    random crop only) at the smallest DCT scale whose shorter side still covers the output.
    None (drawing nothing) when the fast path does not take the file."""
    if not _decode.is_jpeg(data):
        return None
    header = _decode.jpeg_header(data, path)
    if header is None or header[2] not in _PLAIN_COLORSPACES:
        return None
    height, width, _ = header
    divisor = 1
    g = p.geometry
    if reduce and type(g) is RandomResizedCrop:
        need = max(g.size)
        for d in (8, 4, 2):
            if math.ceil(min(height, width) / d) >= need:
                divisor = d
                break
    src = _decode.decode_scaled(data, path, (height, width), divisor, p.fast_decode, None)
    if not isinstance(src, np.ndarray) or src.shape[:2] != (
        math.ceil(height / divisor),
        math.ceil(width / divisor),
    ):
        return None
    return Job(path, b"", (height, width), (0, 0, 0, 0), (0, 0), (), src, divisor)


def execute(
    p: FusedPlan, job: Job, out: np.ndarray[Any, Any] | None = None
) -> np.ndarray[Any, Any]:
    """The C x H x W float32 image of ``job`` (before ``p.rest``), written into ``out`` if given.

    Decoding and resampling release the GIL, so threads run jobs in parallel.

    Raises:
        OSError: for a corrupt or truncated file (the message names it).
    """
    oh, ow = job.out
    scratch = _batch_array((oh, ow, 3), np.uint8)  # this thread's, reused image to image
    return normalize(p, pixels(p, job, scratch), out)


def pixels(p: FusedPlan, job: Job, out: np.ndarray[Any, Any] | None = None) -> np.ndarray[Any, Any]:
    """The job's image decoded, resampled and flipped: H x W x 3 uint8 (possibly a view).

    Args:
        p: the plan.
        job: the image and its random draws.
        out: a C-contiguous output-sized H x W x 3 uint8 array that the C resampler (or
            torch's) writes into, so that no image takes fresh memory. The result (``out``,
            Pillow's array, or a view of this thread's decode buffer when a crop of
            exactly the output size needs no resample) is valid until this thread's next
            decode: use it before then.

    Raises:
        OSError: for a corrupt or truncated file (the message names it).
    """
    random_crop = type(p.geometry) is RandomResizedCrop
    top, _, bh, bw = job.box
    oh, ow = job.out
    # Only the random crop decodes at reduced scale: Resize must match torchvision exactly.
    divisor = _decode.dct_divisor(bh, bw, oh, ow) if random_crop else 1
    origin = (0, 0)
    src: _decode.Decoded
    if job.decoded is not None:  # a pixel cache's image
        divisor, src = job.divisor, job.decoded
    elif random_crop and p.fast_decode and _decode.decodes_regions():
        origin, src = _decode_crop(job, divisor)
    else:
        # The random crop needs the rows down to its bottom only: the decoder stops there.
        rows = math.ceil(top + bh) if random_crop else None
        src = _decode.decode_scaled(job.data, job.path, job.size, divisor, p.fast_decode, rows)
    flt = pil_filter(p.geometry.interpolation)
    hwc = _resample(src, job, divisor, random_crop, flt, origin, out)
    for vertical in job.flips:
        hwc = hwc[::-1] if vertical else hwc[:, ::-1]
    return hwc


def normalize(
    p: FusedPlan, hwc: np.ndarray[Any, Any], out: np.ndarray[Any, Any] | None = None
) -> np.ndarray[Any, Any]:
    """ToTensor + Normalize of the H x W x 3 uint8 ``hwc``: C x H x W float32, into ``out``.

    One multiply and one subtract per value, from any strides of ``hwc`` (flips are views).
    When torch is already imported, its kernels do it (see :func:`_torch_normalize`).
    """
    if out is None:
        out = np.empty((3, *hwc.shape[:2]), dtype=np.float32)
    if _native is not None and _native_normalize(p, hwc, out):
        return out
    torch = _torch.loaded() if _TORCH_NORMALIZE else None
    if torch is not None and _torch_may_normalize(torch, hwc, out):
        _torch_normalize(torch, p, hwc, out)
        return out
    np.multiply(hwc.transpose(2, 0, 1), p.scale, out=out)
    np.subtract(out, p.offset, out=out)
    return out


def _native_normalize(p: FusedPlan, hwc: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> bool:
    """:func:`normalize` by stoker's C kernel, in one pass (the same float32 operations as
    NumPy's, so the same values); False, having done nothing, for layouts it does not take
    (pixels not 3 bytes apart, an output that is not C-contiguous float32)."""
    assert _native is not None
    vflip, hflip = hwc.strides[0] < 0, hwc.strides[1] < 0
    base = hwc[::-1] if vflip else hwc
    base = base[:, ::-1] if hflip else base
    if base.strides[1:] != (3, 1) or not out.flags.c_contiguous or out.dtype != np.float32:
        return False
    _native.normalize(base, out, hflip, vflip, *p.coefficients)
    return True


def _torch_may_normalize(torch: Any, hwc: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> bool:
    """Whether torch normalises: it runs one thread here (as in a worker: its intra-op
    threads would oversubscribe the decode threads) and may wrap both arrays (it warns on a
    read-only one)."""
    return bool(torch.get_num_threads() == 1 and hwc.flags.writeable and out.flags.writeable)


def _torch_normalize(
    torch: Any, p: FusedPlan, hwc: np.ndarray[Any, Any], out: np.ndarray[Any, Any]
) -> None:
    """:func:`normalize` by torch: the same float32 operations, so the same values, bit for bit.

    NumPy casts an interleaved uint8 image to planar float32 through a buffer, and more
    slowly still through a flip's negative stride; torch's copy casts and transposes in one
    pass. torch takes no negative strides: a flip is undone in the view and redone by
    ``flip`` on the uint8 image.
    """
    dims = []
    if hwc.strides[0] < 0:
        hwc, dims = hwc[::-1], [1]
    if hwc.strides[1] < 0:
        hwc, dims = hwc[:, ::-1], [*dims, 2]
    src = torch.from_numpy(hwc).permute(2, 0, 1)
    dst = torch.from_numpy(out)
    dst.copy_(src.flip(dims) if dims else src)
    dst.mul_(torch.from_numpy(p.scale))
    dst.sub_(torch.from_numpy(p.offset))


def _decode_crop(job: Job, divisor: int) -> tuple[tuple[int, int], np.ndarray[Any, Any]]:
    """The whole pixels that the job's crop covers at 1/``divisor`` scale, decoded alone
    (:func:`_decode.decode_region`), and the (row, column) of their corner in the scaled
    image."""
    height, width = job.size
    top, left, bh, bw = job.box
    y0, x0 = math.floor(top / divisor), math.floor(left / divisor)
    y1 = min(math.ceil(height / divisor), math.ceil((top + bh) / divisor))
    x1 = min(math.ceil(width / divisor), math.ceil((left + bw) / divisor))
    rect = (y0, x0, y1, x1)
    return (y0, x0), _decode.decode_region(job.data, job.path, job.size, divisor, rect, True)


def _resample(
    src: _decode.Decoded,
    job: Job,
    divisor: int,
    crop_first: bool,
    flt: int,
    origin: tuple[int, int] = (0, 0),
    out: np.ndarray[Any, Any] | None = None,
) -> np.ndarray[Any, Any]:
    """The job's box of the decoded ``src`` resampled to the output size, as H x W x 3 uint8.

    ``src`` is the scaled image, or only its part from ``origin`` = (row, column) on. stoker's
    C resampler and torch write the result into ``out`` when it is given; Pillow returns its
    own.

    With ``crop_first`` (RandomResizedCrop) the filter sees only the crop, as when the plain
    path crops and then resizes; otherwise (Resize [+ CenterCrop]) it sees the pixels around
    the box too, as when the plain path resizes the whole image and then crops. Only the
    rectangle the filter reads is resampled: by stoker's C resampler where it is built (any
    filter but NEAREST: Pillow's bytes, from the decoded array itself), else by Pillow, or
    by torch for a random crop on whole pixels (see :func:`_torch_for`).
    """
    height, width = job.size
    dh, dw = _decode.decoded_size(src)  # dh may stop below the box (see decode_scaled)
    # A DCT-scaled image is exactly 1/divisor of the full one (a last partial block rounds
    # its size up); Pillow's draft mode may have chosen another scale.
    fx = fy = 1 / divisor
    if isinstance(src, Image.Image) and dw != math.ceil(width / divisor):
        fx, fy = dw / width, dh / height
    top, left, bh, bw = job.box
    oh, ow = job.out
    oy, ox = origin
    x0, y0 = left * fx - ox, top * fy - oy
    x1, y1 = min(dw, (left + bw) * fx - ox), min(dh, (top + bh) * fy - oy)
    if crop_first or (x0, y0, x1, y1) == (0, 0, dw, dh):
        rl, rt, rr, rb = math.floor(x0), math.floor(y0), math.ceil(x1), math.ceil(y1)
    else:  # every pixel the filter reaches: Lanczos, the widest, reads 3 x scale around
        margin = math.ceil(3 * max(1.0, (x1 - x0) / ow, (y1 - y0) / oh)) + 1
        rl, rt = max(0, math.floor(x0) - margin), max(0, math.floor(y0) - margin)
        rr, rb = min(dw, math.ceil(x1) + margin), min(dh, math.ceil(y1) + margin)
    exact = (rl, rt, rr, rb) == (x0, y0, x1, y1)
    if exact and (rb - rt, rr - rl) == (oh, ow) and isinstance(src, np.ndarray):
        return src[rt:rb, rl:rr]  # nothing to resample
    native = _native is not None and _NATIVE_RESAMPLE and flt in _NATIVE_FILTERS
    if native and isinstance(src, np.ndarray):
        assert _native is not None
        dst = np.empty((oh, ow, 3), np.uint8) if out is None else out
        box = (x0 - rl, y0 - rt, x1 - rl, y1 - rt)  # the box in the region, as Pillow's
        _native.resample(src[rt:rb, rl:rr], dst, box, flt, _PILLOW_13_ORDER)
        return dst
    torch = _torch_for(flt) if crop_first and exact else None
    if torch is not None and isinstance(src, np.ndarray):
        return _torch_resize(torch, src[rt:rb, rl:rr], oh, ow, out)
    img = _decode.region(src, rl, rt, rr, rb)
    if exact:
        img = img.resize((ow, oh), flt) if img.size != (ow, oh) else img
    else:
        img = img.resize((ow, oh), flt, box=(x0 - rl, y0 - rt, x1 - rl, y1 - rt))
    return np.asarray(img)


def _torch_for(flt: int) -> Any:
    """torch, when it resamples a decoded array with filter ``flt``; else None (Pillow does).

    torch's antialiased bilinear uint8 kernel gives Pillow's result within 1/255 at about a
    third of its cost; its bicubic differs by up to 3/255, and the other filters have no
    torch equivalent, so those stay on Pillow. torch is never imported for this.
    """
    if not _TORCH_RESAMPLE or flt != Image.Resampling.BILINEAR:
        return None
    return _torch.loaded()


def _torch_resize(
    torch: Any, hwc: np.ndarray[Any, Any], oh: int, ow: int, out: np.ndarray[Any, Any] | None = None
) -> np.ndarray[Any, Any]:
    """The H x W x 3 uint8 ``hwc`` (any row stride) resized to ``oh`` x ``ow`` by torch, into
    ``out`` (C-contiguous ``oh`` x ``ow`` x 3 uint8) when given.

    NumPy copies the input once into channels-last order, the layout of torch's vectorised
    uint8 kernel (torch's own copy would split among intra-op threads that the decode threads
    then oversubscribe). The batch dimension comes first so that torch writes its output
    channels-last too, without repacking it into planes. Writing into ``out`` takes no fresh
    memory per image, so a new worker process takes no page faults for it.
    """
    t = torch.from_numpy(np.ascontiguousarray(hwc))[None].permute(0, 3, 1, 2)
    if out is None:
        r = torch.nn.functional.interpolate(
            t, size=(oh, ow), mode="bilinear", antialias=True, align_corners=False
        )
        return r[0].permute(1, 2, 0).numpy()  # type: ignore[no-any-return]
    dst = torch.from_numpy(out)[None].permute(0, 3, 1, 2)
    _resize_op(torch)(t, [oh, ow], False, None, None, out=dst)
    return out


@functools.cache
def _resize_op(torch: Any) -> Any:
    """torch's antialiased bilinear kernel, ``out=`` variant, looked up once rather than
    through three attribute lookups on torch.ops per image."""
    return torch.ops.aten._upsample_bilinear2d_aa.out


def finish(p: FusedPlan, image: np.ndarray[Any, Any]) -> Any:
    """Apply the transforms after Normalize (``p.rest``), in the calling thread."""
    result: Any = image
    for t in p.rest:
        result = t(result)
    return result


def run(p: FusedPlan, path: str, data: _decode.Data) -> Any:
    """The transformed image of the JPEG ``data`` read from ``path``, or None for the plain path.

    Raises:
        OSError: for a corrupt or truncated file (the message names it).
    """
    job = prepare(p, path, data)
    if job is None:
        return None
    return finish(p, execute(p, job))


def decode_threads() -> int:
    """How many threads decode a batch here.

    The cores this process may use in the main process, shared among the worker processes
    inside a worker, and 1 inside a thread worker.
    """
    info = get_worker_info()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = max(1, min(cores or 1, _MAX_THREADS))
    if info is None:
        return cores
    if _worker_info.in_worker_thread():
        return 1  # a thread worker: the loader already runs one thread per core
    return max(1, cores // max(1, info.num_workers))


def _refs(obj: object) -> int:
    """How many references ``obj`` has, seen from inside this call."""
    return sys.getrefcount(obj)


_KEEP_BATCHES = 2
"""Batch arrays kept per thread: the batch the training loop still holds, and a free one."""
_probe = [np.empty(1)]
_FREE_REFS = _refs(_probe[0])
"""References to a kept array that nobody else uses, counted as :func:`_batch_array` does."""
del _probe


def _batch_array(shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray[Any, Any]:
    """An array of ``shape``: one this thread made before when no view of it is alive.

    Samples and collated batches (float32), or a batch's resampled images (uint8), are
    views of it. While anything still holds a view, its memory is not handed out again; the
    thread keeps two arrays per dtype, so that the batch a training loop still holds while
    it asks for the next one does not force fresh memory (and its page faults) for every
    batch.
    """
    size = math.prod(shape)
    kept: list[np.ndarray[Any, Any]] = workspace().setdefault(np.dtype(dtype).str, [])
    for i in range(len(kept)):  # indices only: a local reference would count as a user
        if kept[i].size >= size and _refs(kept[i]) <= _FREE_REFS:
            return kept[i][:size].reshape(shape)
    if len(kept) >= _KEEP_BATCHES:
        del kept[0]
    kept.append(np.empty(size, dtype=dtype))
    return kept[-1][:size].reshape(shape)


def run_batch(
    p: FusedPlan, jobs: list[Job], batch: np.ndarray[Any, Any] | None = None
) -> list[np.ndarray[Any, Any]]:
    """Execute ``jobs`` (random draws already made), in parallel threads when that helps.

    When every job has the same output size, the images are views of one batch array:
    ``batch`` (N x 3 x H x W float32) when given, else one of :func:`_batch_array`. Each
    image is normalised as soon as it is resampled, while its pixels are in cache. The
    threads live for one batch only: starting two costs well under a millisecond against
    tens of milliseconds of decoding, and nothing is left behind in a process that forks
    workers afterwards (threads do not survive fork).
    """
    outs: list[np.ndarray[Any, Any] | None] = [None] * len(jobs)
    if one_size(jobs):
        if batch is None:
            batch = _batch_array((len(jobs), 3, *jobs[0].out))
        outs = list(batch)
        del batch
    return _in_threads(lambda job, out: execute(p, job, out), jobs, outs)


def fused_batch(p: FusedPlan, jobs: list[Job], targets: list[int]) -> FusedBatch:
    """The :class:`FusedBatch` of ``jobs`` (all of one output size) and their int targets,
    normalised straight into the memory stoker's collate will write the batch into, when a
    fetcher says which (:func:`stoker._batch.output_alloc`: shared memory in a worker
    process), else into a reusable batch array.

    Raises:
        OSError: for a corrupt or truncated file (the message names it).
    """
    alloc = output_alloc()
    shape = (len(jobs), 3, *jobs[0].out)
    images = _batch_array(shape) if alloc is None else alloc(shape, np.dtype(np.float32))
    run_batch(p, jobs, images)
    return FusedBatch(images, targets, alloc)


def one_size(jobs: list[Job]) -> bool:
    """Whether there are jobs and all have the same output size."""
    return bool(jobs) and all(job.out == jobs[0].out for job in jobs)


def _in_threads(fn: Callable[[Any, Any], Any], xs: list[Any], ys: list[Any]) -> list[Any]:
    """``[fn(x, y) for x, y in zip(xs, ys)]``, in :func:`decode_threads` threads."""
    threads = min(decode_threads(), len(xs))
    if threads <= 1:
        return [fn(x, y) for x, y in zip(xs, ys, strict=True)]
    with (
        lend(threads) as spaces,
        ThreadPoolExecutor(threads, "stoker-decode", spaces.initializer) as pool,
    ):
        return list(pool.map(fn, xs, ys))


class FusedBatch(ColumnBatch):
    """A batch of fast-path images of one size, normalised, and their int targets.

    ``ImageFolder.__getitems__`` returns it (see :func:`fused_batch`): it is the sequence
    of ``(image, target)`` samples, but stoker's default collate asks it to :meth:`gather`
    its columns. When the images were written into the memory of the collate's ``alloc``
    as they were decoded, they are handed back as they are: the float32 batch is written
    once, not written and then copied.

    Args:
        images: N x 3 x H x W float32.
        targets: per sample, the class index (an int).
        alloc: the allocator whose memory ``images`` lies in, or None.
    """

    __slots__ = ("_alloc", "_images", "_targets")

    def __init__(
        self, images: np.ndarray[Any, Any], targets: list[int], alloc: Alloc | None
    ) -> None:
        self._images = images
        self._targets = targets
        self._alloc = alloc
        self.indices = np.arange(len(images))
        self.keys = None

    @property
    def sources(self) -> tuple[Any, ...]:  # type: ignore[override]
        """The columns: the float32 images and the targets."""
        return tuple(self.gather())

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return super().__getitem__(i)
        return self._images[i], self._targets[i]

    def __reduce__(self) -> tuple[Any, ...]:
        return list, (list(self),)  # pickles as the plain list of samples

    def any_tensor(self) -> bool:
        """False: the columns are NumPy arrays."""
        return False

    def numeric(self) -> bool:
        """True: float32 images and int targets."""
        return True

    def gather(self, alloc: Alloc | None = None) -> list[Any]:
        """[N x 3 x H x W float32 images, int64 targets], in ``alloc``'s memory if given."""
        targets = np.asarray(self._targets, dtype=np.int64)
        if alloc is None:
            return [self._images, targets]
        images = self._images
        if alloc != self._alloc:  # bound methods: equal for the same allocator
            images = alloc(images.shape, images.dtype)
            images[...] = self._images
        out = alloc(targets.shape, targets.dtype)
        out[...] = targets
        return [images, out]
