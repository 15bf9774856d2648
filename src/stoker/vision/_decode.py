"""Image decoding: Pillow for any file, and a fast JPEG path at reduced DCT scale.

A corrupt, truncated or non-image file raises ``OSError`` naming the file and the fix
(``PIL.UnidentifiedImageError`` where Pillow cannot identify it), as torchvision's loader
does; Pillow's decompression-bomb limit applies to the fast path too.

The fast path decodes with libjpeg-turbo, through ``simplejpeg`` where installed, else
Pillow's ``draft`` mode. JPEG's DCT gives the image at 1/2, 1/4 or 1/8 of its size for a
fraction of the work, so when the crop is at least twice the output, a reduced scale
loses nothing the resize would keep (only power-of-two scales: the others are slower than
a full decode). A sequential JPEG can be decoded down to a given row only
(:func:`with_height`). Pixels stay in a per-thread buffer, and only the rectangle a
transform reads becomes a Pillow image (:func:`region`).
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from stoker.vision._workspace import workspace

try:  # optional: a faster libjpeg-turbo binding
    import simplejpeg as _simplejpeg
except ImportError:  # pragma: no cover - exercised where simplejpeg is missing
    _simplejpeg = None
try:  # optional: stoker's own extension (setup.py); its decode needs libjpeg-turbo
    from stoker.vision import _native
except ImportError:  # pragma: no cover - exercised where it could not be built
    _native = None  # type: ignore[assignment]

Data = bytes | memoryview
"""A file's bytes: ``bytes``, or a view of a reused buffer (see :func:`_workspace.read`)."""
_JPEG_MAGIC = b"\xff\xd8\xff"
_EOI = b"\xff\xd9"
_HEADER_SCAN = 1 << 20  # where to give up looking for the frame header
_STANDALONE = frozenset((0x01, *range(0xD0, 0xD9)))  # markers without a length
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

    >>> import os, tempfile
    >>> from PIL import Image
    >>> with tempfile.TemporaryDirectory() as root:
    ...     path = os.path.join(root, "grey.png")
    ...     Image.new("L", (3, 2)).save(path)
    ...     image = pil_loader(path)
    >>> image.mode, image.size
    ('RGB', (3, 2))
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
    """The loader ImageFolder uses by default: :func:`pil_loader`.

    >>> import os, tempfile
    >>> from PIL import Image
    >>> with tempfile.TemporaryDirectory() as root:
    ...     path = os.path.join(root, "clear.png")
    ...     Image.new("RGBA", (2, 2)).save(path)
    ...     default_loader(path).mode
    'RGB'
    """
    return pil_loader(path)


def is_jpeg(data: Data) -> bool:
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


def jpeg_header(data: Data, path: str) -> tuple[int, int, str] | None:
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

    Reusing it keeps every decode out of fresh memory, whose page faults a new buffer per
    image would pay on every decode.
    """
    buf: np.ndarray[Any, Any] | None = workspace().get("decode")
    if buf is None or buf.nbytes < nbytes:
        buf = np.empty(nbytes, dtype=np.uint8)
        if nbytes <= _KEEP_BUFFER_BYTES:  # do not hold on to a huge image's memory
            workspace()["decode"] = buf
    return buf


Decoded = np.ndarray[Any, Any] | Image.Image
"""A decoded RGB image: an (h, w, 3) uint8 array (simplejpeg) or a PIL image (Pillow)."""


def decode_scaled(
    data: Data,
    path: str,
    size: tuple[int, int],
    divisor: int,
    fast: bool = False,
    rows: int | None = None,
) -> Decoded:
    """Decode a JPEG to RGB at 1/``divisor`` of its ``size`` = (height, width).

    With simplejpeg the result is an (h, w, 3) uint8 array in a buffer this thread reuses:
    use it before this thread decodes again. Without simplejpeg it is a PIL RGB image
    decoded in Pillow's draft mode.

    Args:
        data: the JPEG file's bytes.
        path: the file, for error messages.
        size: the full-size (height, width), from the header.
        divisor: 1, 2, 4 or 8, the DCT scale.
        fast: use libjpeg-turbo's fast integer IDCT and plain chroma upsampling (faster;
            pixels differ by a few /255, so for random augmentation only).
        rows: with ``fast``, how many full-size rows from the top are needed: a complete
            baseline JPEG is then decoded down to that row only (:func:`with_height`), so
            the result may have fewer rows than ``height / divisor``.

    Raises:
        OSError: when the data is corrupt or truncated (the message names ``path``).
    """
    height, width = size
    check_pixels(width, height, path)
    try:
        if _simplejpeg is not None:
            # A file that does not end with its end-of-image marker is decoded strictly, so
            # that truncation raises as it does in Pillow; in a complete file, libjpeg's
            # recoverable warnings are ignored, as Pillow ignores them.
            complete = data[-2:] == _EOI
            if fast and rows is not None and complete and rows < height:
                shorter = with_height(data, rows)
                if shorter is not None:
                    data, height = shorter, rows
            # Three channels, not RGBX: a quarter less to resample, and region() copies
            # only the crop into Pillow's layout.
            dh, dw = math.ceil(height / divisor), math.ceil(width / divisor)
            arr: np.ndarray[Any, Any] = _simplejpeg.decode_jpeg(
                data,
                "RGB",
                fastdct=fast,
                fastupsample=fast,
                min_height=dh,
                min_width=dw,
                buffer=_decode_buffer(3 * dh * dw),
                strict=not complete,
            )
            return arr
        return _pillow_draft(data, width, height, divisor)
    except (*_DECODE_ERRORS, Image.DecompressionBombError) as exc:
        raise decode_error(path, exc) from exc


def decodes_regions() -> bool:
    """Whether :func:`decode_region` is available (stoker's extension was built with
    libjpeg-turbo: built without it, the extension has no ``decode``)."""
    return hasattr(_native, "decode")


def decode_region(
    data: Data,
    path: str,
    size: tuple[int, int],
    divisor: int,
    rect: tuple[int, int, int, int],
    fast: bool,
) -> np.ndarray[Any, Any]:
    """The rectangle ``rect`` = (top, left, bottom, right) of a JPEG at 1/``divisor`` scale.

    Only what the rectangle needs is decoded: the rows above it are entropy-decoded and
    skipped, the columns beside it (beyond whole blocks) are not converted, and decoding
    stops below it. The pixels are those of a full decode with the same settings, cut to
    ``rect``, with plain chroma upsampling; ``fast`` takes the fast integer IDCT. The result,
    ``(bottom - top, right - left, 3)`` uint8 and C-contiguous, lies in this thread's decode
    buffer (see :func:`decode_scaled`). Needs :func:`decodes_regions`.

    Args:
        data: the JPEG file's bytes.
        path: the file, for error messages.
        size: the full-size (height, width), from the header.
        divisor: 1, 2, 4 or 8, the DCT scale.
        rect: the rectangle, in pixels of the scaled image.
        fast: use the fast integer IDCT (for random augmentation only).

    Raises:
        OSError: when the data is corrupt or truncated (the message names ``path``).
    """
    assert _native is not None, "decode_region needs stoker.vision._native"
    height, width = size
    check_pixels(width, height, path)
    top, left, bottom, right = rect
    shape = (bottom - top, right - left, 3)
    # Sized for the whole scaled image (up to what a thread keeps), not the rectangle: one
    # buffer serves every crop of images this size, where growing it crop by crop would
    # fault in fresh pages each time, in every fresh worker.
    nbytes = math.prod(shape)
    whole = 3 * math.ceil(height / divisor) * math.ceil(width / divisor)
    out = _decode_buffer(max(nbytes, min(whole, _KEEP_BUFFER_BYTES)))[:nbytes].reshape(shape)
    try:
        # As with simplejpeg: strict only for a file that lacks its end-of-image marker.
        _native.decode(data, out, divisor, top, left, bottom, right, fast, data[-2:] != _EOI)
    except _DECODE_ERRORS as exc:
        raise decode_error(path, exc) from exc
    return out


def with_height(data: Data, rows: int) -> bytes | None:
    """A baseline JPEG whose frame header says ``rows`` rows, so decoding stops there.

    A sequential JPEG codes its image top to bottom, so with a smaller height in the frame
    header libjpeg decodes the first ``rows`` rows exactly as in the full decode (with the
    plain upsampling of the fast mode: fancy upsampling would blend the last row with the
    next) and skips the rest of the data without decoding it. None for progressive, lossless and
    arithmetic-coded files, whose data is not in row order, and for headers it cannot read.

    >>> sof = b"\\xff\\xc0\\x00\\x11\\x08\\x01\\x77\\x01\\xf4"  # 375 x 500
    >>> with_height(b"\\xff\\xd8" + sof + b"\\x00" * 12, 5)[5:9]
    b'\\x11\\x08\\x00\\x05'
    """
    pos, end = 2, min(len(data), _HEADER_SCAN)
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        if marker in (0xC0, 0xC1):  # baseline or extended sequential, Huffman-coded
            at = pos + 5
            if at + 2 > len(data) or int.from_bytes(data[at : at + 2], "big") <= rows:
                return None
            return b"".join((data[:at], rows.to_bytes(2, "big"), data[at + 2 :]))
        if (0xC2 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC)) or marker == 0xDA:
            return None  # another frame type, or the scan began without a frame header
        pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
    return None


def decoded_size(image: Decoded) -> tuple[int, int]:
    """``(height, width)`` of a decoded image.

    >>> decoded_size(np.zeros((3, 5, 3), np.uint8)), decoded_size(Image.new("RGB", (5, 3)))
    ((3, 5), (3, 5))
    """
    if isinstance(image, np.ndarray):
        return int(image.shape[0]), int(image.shape[1])
    return image.size[1], image.size[0]


def region(image: Decoded, left: int, top: int, right: int, bottom: int) -> Image.Image:
    """The rectangle ``[left, right) x [top, bottom)`` of ``image`` as a PIL RGB image.

    From an array, only the rectangle's rows are unpacked into Pillow's layout (one copy of
    the rectangle, not of the image); the whole of a PIL image is returned as it is.

    >>> a = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    >>> bool((np.asarray(region(a, 1, 2, 4, 4)) == a[2:4, 1:4]).all())
    True
    """
    height, width = decoded_size(image)
    if isinstance(image, Image.Image):
        whole = (left, top, right, bottom) == (0, 0, width, height)
        return image if whole else image.crop((left, top, right, bottom))
    flat = image.reshape(-1)  # a view: the decode buffer is contiguous
    start = 3 * (top * width + left)
    # The raw decoder reads each row's 3 * (right - left) bytes, then steps by the stride.
    return Image.frombuffer(
        "RGB", (right - left, bottom - top), flat[start:], "raw", "RGB", 3 * width, 1
    )


def _pillow_draft(data: Data, width: int, height: int, divisor: int) -> Image.Image:
    import io

    img: Any = Image.open(io.BytesIO(data))
    if divisor > 1:
        img.draft("RGB", (math.ceil(width / divisor), math.ceil(height / divisor)))
    return img.convert("RGB")  # type: ignore[no-any-return]


def jpeg_size_pillow(data: Data, path: str) -> tuple[int, int, str]:
    """``(height, width, mode)`` of an image from its header, through Pillow."""
    import io

    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.size[1], img.size[0], img.mode
    except (*_DECODE_ERRORS, Image.DecompressionBombError) as exc:
        raise decode_error(path, exc) from exc
