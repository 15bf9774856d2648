"""Image datasets (ImageFolder, DatasetFolder, CIFAR10/100) and torchvision-style transforms.

Framework-free: samples are PIL images or NumPy arrays; ``transforms.ToTensor`` gives
C x H x W float32 arrays, which stoker's DataLoader batches as NumPy or torch tensors.
Needs Pillow; uses ``simplejpeg`` for faster JPEG decoding when it is installed.
"""

from __future__ import annotations

from stoker.vision import transforms
from stoker.vision._cifar import CIFAR10, CIFAR100
from stoker.vision._decode import default_loader, pil_loader
from stoker.vision._folder import (
    IMG_EXTENSIONS,
    DatasetFolder,
    ImageFolder,
    find_classes,
    has_file_allowed_extension,
    make_dataset,
)

__all__ = [
    "CIFAR10",
    "CIFAR100",
    "DatasetFolder",
    "IMG_EXTENSIONS",
    "ImageFolder",
    "default_loader",
    "find_classes",
    "has_file_allowed_extension",
    "make_dataset",
    "pil_loader",
    "transforms",
]

# Public objects report the public path, so tracebacks read ``stoker.vision.ImageFolder``
# and pickles (sent to workers, stored in checkpoints) survive moving a private module.
for _name in __all__:
    _obj = globals()[_name]
    if callable(_obj) and hasattr(_obj, "__module__"):
        _obj.__module__ = "stoker.vision"
del _name, _obj
