"""torchvision-style image transforms on PIL images and H x W x C uint8 NumPy arrays.

The names, arguments and parameter sampling are torchvision's (``transforms`` v1):
``Compose([RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(), Normalize(m, s)])``
works unchanged. Differences that matter:

- ``ToTensor`` returns a C x H x W float32 NumPy array in [0, 1], never a torch tensor; the
  DataLoader makes batches torch tensors when asked (``tensor_type``).
- Random transforms draw from Python's global ``random``, which stoker's DataLoader seeds
  before every batch from (seed, epoch, batch index): the same augmentations for any
  number of workers.
- Geometric and colour transforms run Pillow's kernels for both input kinds, so they match
  torchvision's on PIL images (``benchmarks/check_transforms_vs_torchvision.py``).

An ``ImageFolder`` whose transform starts as the fused path expects (``stoker.vision._fused``)
decodes JPEG files through that path.

>>> pipeline = Compose([CenterCrop(4), ToTensor(), Normalize([0.5] * 3, [0.5] * 3)])
>>> out = pipeline(np.full((6, 8, 3), 255, dtype=np.uint8))
>>> out.shape, out.dtype, float(out.min()), float(out.max())
((3, 4, 4), dtype('float32'), 1.0, 1.0)
"""

from __future__ import annotations

from stoker.vision.transforms._base import Compose, InterpolationMode, Lambda, RandomApply
from stoker.vision.transforms._color import ColorJitter, Grayscale
from stoker.vision.transforms._geometric import (
    CenterCrop,
    Pad,
    RandomCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    RandomRotation,
    RandomVerticalFlip,
    Resize,
)
from stoker.vision.transforms._tensor import Normalize, ToTensor

__all__ = [
    "CenterCrop",
    "ColorJitter",
    "Compose",
    "Grayscale",
    "InterpolationMode",
    "Lambda",
    "Normalize",
    "Pad",
    "RandomApply",
    "RandomCrop",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "RandomRotation",
    "RandomVerticalFlip",
    "Resize",
    "ToTensor",
]

# Public classes report the public path, so reprs and tracebacks read
# ``stoker.vision.transforms.Resize`` and pickles survive moving a private module.
for _name in __all__:
    globals()[_name].__module__ = "stoker.vision.transforms"
del _name
