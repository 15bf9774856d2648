"""Lazy access to torch: stoker never imports torch unless the user's data or options need it.

A value can only be a ``torch.Tensor`` if torch is already imported, so type checks look in
``sys.modules`` instead of importing torch (which costs about a second).
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any


def loaded() -> ModuleType | None:
    """The torch module if the process has imported it, else None (never imports it)."""
    return sys.modules.get("torch")


def is_tensor(x: object) -> bool:
    """Whether ``x`` is a ``torch.Tensor``, without importing torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def require(purpose: str) -> Any:
    """Import and return torch, or raise ``ModuleNotFoundError`` saying what needed it.

    Args:
        purpose: what needs torch, completing "... needs torch", e.g. "tensor_type='torch'".
    """
    try:
        import torch
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"{purpose} needs torch, which is not installed; install it with "
            "`pip install 'stoker[torch]'` or use NumPy batches (tensor_type='numpy')."
        ) from exc
    return torch
