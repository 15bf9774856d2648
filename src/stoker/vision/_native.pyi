"""Types of stoker's optional C kernels (``_native.c``).

A build without libjpeg-turbo (``STOKER_NO_JPEG``) has no ``decode``,
``LIBJPEG_TURBO_VERSION`` or ``JPEG_LINKAGE``: test with ``hasattr``.
"""

from collections.abc import Sequence
from typing import Any

LIBJPEG_TURBO_VERSION: int
JPEG_LINKAGE: str  # "static" (linked into the extension: a wheel) or "shared" (the system's)
RESAMPLE_KERNEL: str

def decode(
    data: Any,
    out: Any,
    divisor: int,
    top: int,
    left: int,
    bottom: int,
    right: int,
    fast: bool,
    strict: bool,
) -> tuple[int, int]: ...
def normalize(
    src: Any,
    out: Any,
    hflip: bool,
    vflip: bool,
    scale: Sequence[float],
    offset: Sequence[float],
) -> None: ...
def resample(
    src: Any,
    out: Any,
    box: tuple[float, float, float, float],
    filter: int,
    newer_order: bool = True,
    portable: bool = False,
) -> None: ...
