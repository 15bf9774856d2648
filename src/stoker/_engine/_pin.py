"""Pinned (page-locked) memory: decide whether batches can be pinned, and pin them.

Pinning needs torch and an accelerator. Without them ``pin_memory=True`` warns once per
loader and batches go on unpinned, as torch does.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from stoker import _torch


def pin_device(pin_memory_device: str) -> str | None:
    """The device to pin for, or None (after one warning) when pinning is impossible.

    Args:
        pin_memory_device: the loader's ``pin_memory_device``; "" means the current
            accelerator.
    """
    try:
        torch = _torch.require("pin_memory=True")
    except ModuleNotFoundError as exc:
        warnings.warn(f"{exc} Batches are not pinned.", UserWarning, stacklevel=4)
        return None
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        available = accelerator.is_available()
        current = accelerator.current_accelerator() if available else None
        device = current.type if current is not None else ""
    else:  # torch < 2.6
        available = torch.cuda.is_available()
        device = "cuda"
    if not available:
        warnings.warn(
            "pin_memory=True but no accelerator is available, so batches are not pinned; "
            "set pin_memory=False to silence this warning.",
            UserWarning,
            stacklevel=4,
        )
        return None
    return pin_memory_device or device


def pin(data: Any, device: str) -> Any:
    """``data`` with every tensor (and every object with a ``pin_memory()``) pinned.

    NumPy arrays and other leaves are returned unchanged; containers are rebuilt with
    their own type where possible.
    """
    if _torch.is_tensor(data):
        return data.pin_memory()
    if hasattr(data, "pin_memory") and not isinstance(data, type):
        return data.pin_memory()
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, Mapping):
        pinned = {k: pin(v, device) for k, v in data.items()}
        try:
            return type(data)(pinned)  # type: ignore[call-arg]
        except TypeError:
            return pinned
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(pin(v, device) for v in data))
    if isinstance(data, Sequence):
        items = [pin(v, device) for v in data]
        if isinstance(data, list):
            return items
        try:
            return type(data)(items)  # type: ignore[call-arg]
        except TypeError:
            return items
    return data
