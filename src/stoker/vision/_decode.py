"""Image decoding: Pillow for any file, and a fast JPEG path at reduced DCT scale.

Every failure to read an image raises an error that names the file. A corrupt, truncated
or non-image file raises ``OSError`` (``PIL.UnidentifiedImageError`` when Pillow could not
identify it), as torchvision's loader does, with the path and the fix in the message.
Pillow's decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``) stays on, and the fast
JPEG path applies the same limit before decoding.

The fast path decodes with libjpeg-turbo: through ``simplejpeg`` when it is installed,
else through Pillow's ``draft`` mode. JPEG's DCT lets a decoder produce the image at 1/2,
1/4 or 1/8 of its size for a fraction of the work, so when the crop that a transform will
take is at least twice the output size, decoding at a reduced scale loses nothing the
resize would keep. Only power-of-two scales are used: libjpeg-turbo's other factors
(3/8, 5/8, ...) are slower than a full decode.
"""

from __future__ import annotations

import math
import os
import threading
import warnings
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

try:  # optional: a faster libjpeg-turbo binding
    import simplejpeg as _simplejpeg
except ImportError:  # pragma: no cover - exercised where simplejpeg is missing
    _simplejpeg = None

_JPEG_MAGIC = b"\xff\xd8\xff"
_local = threading.local()  # per thread: the reusable decode buffer
_KEEP_BUFFER_BYTES = 64 << 20
_SCALES = (8, 4, 2, 1)
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, IndexError, EOFError)
_FIX = (
    "The file is corrupt, truncated or not an image: replace or remove it, or leave it out "
    "with is_valid_file=."
)


def decode_error(path: str | os.PathLike[str], exc: BaseException) -> BaseException:
    """The error to raise for ``exc`` while reading ``path``: same kind, naming the file."""
    msg = f"cannot decode image file {os.fspath(path)!r}: {exc}. {_FIX}"
    if isinstance(exc, Image.DecompressionBombError):
        return Image.DecompressionBombError(
            f"image file {os.fspath(path)!r}: {exc} Raise PIL.Image.MAX_IMAGE_PIXELS only "
            "for files you trust."
        )
    if isinstance(exc, UnidentifiedImageError):
        return UnidentifiedImageError(msg)
    return OSError(msg)


def pil_loader(path: str | os.PathLike[str]) -> Image.Image:
    """The image at ``path`` as an RGB PIL image (grey, palette, CMYK and alpha converted).

    Raises:
        FileNotFoundError: when ``path`` does not exist.
        OSError: when the file is not a readable image (the message names it).
        PIL.Image.DecompressionBombError: when it has more pixels than Pillow allows.
    """
    with open(path, "rb") as f:
        try:
            img = Image.open(f)
            return img.convert("RGB")
        except (*_DECODE_ERRORS, Image.DecompressionBombError) as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise decode_error(path, exc) from exc


def default_loader(path: str | os.PathLike[str]) -> Image.Image:
    """The loader ImageFolder uses by default: :func:`pil_loader`."""
    return pil_loader(path)


def is_jpeg(data: bytes) -> bool:
    """Whether ``data`` starts with a JPEG start-of-image marker.

    >>> is_jpeg(b"\\xff\\xd8\\xff\\xe0...") , is_jpeg(b"\\x89PNG")
    (True, False)
    """
    return data[:3] == _JPEG_MAGIC


def check_pixels(width: int, height: int, path: str) -> None:
    """Apply Pillow's decompression-bomb limit to a ``width`` x ``height`` image at ``path``."""
    limit = Image.MAX_IMAGE_PIXELS
    if limit is None:
        return
    pixels = width * height
    if pixels > 2 * limit:
        raise Image.DecompressionBombError(
            f"image file {path!r} has {pixels} pixels, more than twice the limit of {limit} "
            "(PIL.Image.MAX_IMAGE_PIXELS): it could be a decompression bomb. Raise the limit "
            "only for files you trust."
        )
    if pixels > limit:
        warnings.warn(
            f"image file {path!r} has {pixels} pixels, over the limit of {limit}: it could "
            "be a decompression bomb.",
            Image.DecompressionBombWarning,
            stacklevel=3,
        )


def jpeg_header(data: bytes, path: str) -> tuple[int, int, str] | None:
    """``(height, width, colorspace)`` of a JPEG, or None without simplejpeg.

    Raises:
        OSError: when the header is unreadable (the message names ``path``).
    """
    if _simplejpeg is None:
        return None
    try:
        height, width, colorspace, _ = _simplejpeg.decode_jpeg_header(data)
    except _DECODE_ERRORS as exc:
        raise decode_error(path, exc) from exc
    return int(height), int(width), str(colorspace)


def dct_divisor(crop_h: float, crop_w: float, out_h: int, out_w: int) -> int:
    """The largest of 8, 4, 2, 1 that keeps a ``crop_h`` x ``crop_w`` crop >= the output.

    >>> dct_divisor(375, 500, 224, 224), dct_divisor(1000, 900, 224, 224)
    (1, 4)
    """
    for d in _SCALES:
        if crop_h >= d * out_h and crop_w >= d * out_w:
            return d
    return 1


def _decode_buffer(nbytes: int) -> np.ndarray[Any, Any]:
    """This thread's reusable decode buffer, at least ``nbytes`` long.

    Reusing it keeps every decode out of fresh memory: a new ~750 KB buffer per image costs
    about 200 page faults (a third of a millisecond of system time) on every decode.
    """
    buf: np.ndarray[Any, Any] | None = getattr(_local, "buffer", None)
    if buf is None or buf.nbytes < nbytes:
        buf = np.empty(nbytes, dtype=np.uint8)
        if nbytes <= _KEEP_BUFFER_BYTES:  # do not hold on to a huge image's memory
            _local.buffer = buf
    return buf


def decode_scaled(
    data: bytes, path: str, size: tuple[int, int], divisor: int, fast: bool = False
) -> tuple[Image.Image, float, float]:
    """Decode a JPEG to RGB at 1/``divisor`` of its ``size`` = (height, width).

    With simplejpeg the pixels live in a buffer that this thread reuses: the image is valid
    until this thread's next call, so use it (resize, copy) before decoding again.

    Args:
        data: the JPEG file's bytes.
        path: the file, for error messages.
        size: the full-size (height, width), from the header.
        divisor: 1, 2, 4 or 8, the DCT scale.
        fast: use libjpeg-turbo's fast integer IDCT and plain chroma upsampling (about 10%
            faster, pixels differ by a few /255; for random augmentation only).

    Returns:
        The image (mode RGB, or RGBX whose fourth band is padding), and its x and y scale
        relative to the full-size image.

    Raises:
        OSError: when the data is corrupt or truncated (the message names ``path``).
    """
    height, width = size
    check_pixels(width, height, path)
    try:
        if _simplejpeg is not None:
            # RGBX is Pillow's own layout for RGB images: frombuffer then wraps the decoded
            # pixels without the copy that fromarray of a 3-channel array makes.
            dh, dw = math.ceil(height / divisor), math.ceil(width / divisor)
            arr = _simplejpeg.decode_jpeg(
                data,
                "RGBX",
                fastdct=fast,
                fastupsample=fast,
                min_height=dh,
                min_width=dw,
                buffer=_decode_buffer(4 * dh * dw),
            )
            img = Image.frombuffer("RGBX", (arr.shape[1], arr.shape[0]), arr, "raw", "RGBX", 0, 1)
        else:
            img = _pillow_draft(data, width, height, divisor)
    except (*_DECODE_ERRORS, Image.DecompressionBombError) as exc:
        raise decode_error(path, exc) from exc
    return img, img.size[0] / width, img.size[1] / height


def _pillow_draft(data: bytes, width: int, height: int, divisor: int) -> Image.Image:
    import io

    img: Any = Image.open(io.BytesIO(data))
    if divisor > 1:
        img.draft("RGB", (math.ceil(width / divisor), math.ceil(height / divisor)))
    return img.convert("RGB")  # type: ignore[no-any-return]


def jpeg_size_pillow(data: bytes, path: str) -> tuple[int, int, str]:
    """``(height, width, mode)`` of an image from its header, through Pillow."""
    import io

    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.size[1], img.size[0], img.mode
    except (*_DECODE_ERRORS, Image.DecompressionBombError) as exc:
        raise decode_error(path, exc) from exc
