"""Types of stoker's optional C kernels (``_native.c``)."""

from collections.abc import Sequence
from typing import Any

LIBJPEG_TURBO_VERSION: int
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
