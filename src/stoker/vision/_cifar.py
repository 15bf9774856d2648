"""CIFAR10 and CIFAR100 from the official "python version" batch files.

Those batch files are Python pickles by definition of the format, and unpickling runs code
chosen by whoever wrote the file. stoker therefore unpickles them only from the local
``root`` the user passes, and only after their MD5 matches the official digest (the class
attributes below, as torchvision's). ``download=True`` fetches the official archive over
HTTPS, checks its MD5 and extracts it with a extractor that refuses unsafe members.

Images are held in one N x 32 x 32 x 3 uint8 array (no per-image Python object); sample
``i`` is ``(PIL image, class_index)`` as torchvision's, or the transform of it.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from PIL import Image

from stoker.vision._download import check_integrity, download_and_extract_archive


class CIFAR10:
    """The CIFAR-10 dataset: 50,000 training and 10,000 test 32 x 32 colour images, 10 classes.

    Args:
        root: the folder that holds (or will hold) ``cifar-10-batches-py``.
        train: the training set if True, else the test set.
        transform: applied to each PIL image.
        target_transform: applied to each class index.
        download: download and extract the archive into ``root`` unless already there.
        url: where to download from (default: the official URL, ``CIFAR10.url``).
        md5: the archive's MD5 (default: the official one, ``CIFAR10.tgz_md5``).

    Attributes:
        data: the images, an N x 32 x 32 x 3 uint8 array.
        targets: the class index of every image (a list of ints).
        classes: the class names; ``class_to_idx`` maps them to indices.

    Raises:
        RuntimeError: when the files are missing or corrupt and ``download`` is False, or
            when a download fails its checksum.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as root:
    ...     CIFAR10(root, train=False)  # download=True would fetch and check the archive
    Traceback (most recent call last):
        ...
    RuntimeError: Dataset not found or corrupted: CIFAR10 expects the official python batch ...
    >>> CIFAR10.base_folder
    'cifar-10-batches-py'
    """

    base_folder = "cifar-10-batches-py"
    url = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    filename = "cifar-10-python.tar.gz"
    tgz_md5 = "c58f30108f718f92721af3b95e74349a"
    train_list: ClassVar[list[list[str]]] = [
        ["data_batch_1", "c99cafc152244af753f735de768cd75f"],
        ["data_batch_2", "d4bba439e000b95fd0a9bffe97cbabec"],
        ["data_batch_3", "54ebc095f3ab1f0389bbae665268c751"],
        ["data_batch_4", "634d18415352ddfa80567beed471001a"],
        ["data_batch_5", "482c414d41f54cd18b22e5b47cb7c3cb"],
    ]
    test_list: ClassVar[list[list[str]]] = [["test_batch", "40351d587109b95175f43aff81a1287e"]]
    meta: ClassVar[dict[str, str]] = {
        "filename": "batches.meta",
        "key": "label_names",
        "md5": "5ff9c542aee3614f3951f8cda6e48888",
    }
    labels_key = "labels"

    def __init__(
        self,
        root: str | os.PathLike[str],
        train: bool = True,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        download: bool = False,
        *,
        url: str | None = None,
        md5: str | None = None,
    ) -> None:
        self.root = os.path.expanduser(os.fspath(root))
        self.train = train
        self.transform = transform
        self.target_transform = target_transform
        if url is not None:
            self.url = url
        if md5 is not None:
            self.tgz_md5 = md5
        if download:
            self.download()
        if not self._check_integrity():
            folder = os.path.join(self.root, self.base_folder)
            raise RuntimeError(
                f"Dataset not found or corrupted: {type(self).__name__} expects the official "
                f"python batch files in {folder!r}. Use download=True to download them, or "
                f"extract {self.filename} into {self.root!r}."
            )
        files = self.train_list if train else self.test_list
        data: list[np.ndarray[Any, Any]] = []
        targets: list[int] = []
        for name, _ in files:
            entry = self._unpickle(os.path.join(self.root, self.base_folder, name))
            data.append(np.asarray(entry["data"], dtype=np.uint8))
            targets.extend(int(t) for t in entry[self.labels_key])
        self.data = np.ascontiguousarray(
            np.vstack(data).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        )
        self.targets = targets
        self._load_meta()

    @staticmethod
    def _unpickle(path: str) -> dict[str, Any]:
        # Trusted by construction: a local file whose MD5 matched the official digest.
        with open(path, "rb") as f:
            entry: dict[str, Any] = pickle.load(f, encoding="latin1")
        return entry

    def _load_meta(self) -> None:
        path = os.path.join(self.root, self.base_folder, self.meta["filename"])
        if not check_integrity(path, self.meta["md5"]):
            raise RuntimeError(
                f"Dataset metadata file {path!r} not found or corrupted. Use download=True "
                "to download it again."
            )
        self.classes: list[str] = list(self._unpickle(path)[self.meta["key"]])
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}

    def _check_integrity(self) -> bool:
        folder = os.path.join(self.root, self.base_folder)
        return all(
            check_integrity(os.path.join(folder, name), md5)
            for name, md5 in (*self.train_list, *self.test_list)
        )

    def download(self) -> None:
        """Download, verify and extract the archive into ``root`` unless the files are there."""
        if self._check_integrity():
            return
        download_and_extract_archive(self.url, self.root, self.filename, self.tgz_md5)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        img: Any = Image.fromarray(self.data[index])
        target: Any = self.targets[index]
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target

    def __len__(self) -> int:
        return len(self.data)

    def extra_repr(self) -> str:
        """The split, as torchvision's repr shows it."""
        return f"Split: {'Train' if self.train else 'Test'}"

    def __repr__(self) -> str:
        return (
            f"Dataset {type(self).__name__}\n    Number of datapoints: {len(self)}\n"
            f"    Root location: {self.root}\n    {self.extra_repr()}"
        )


class CIFAR100(CIFAR10):
    """The CIFAR-100 dataset: as :class:`CIFAR10`, with 100 fine classes.

    >>> issubclass(CIFAR100, CIFAR10), CIFAR100.base_folder, CIFAR100.meta["key"]
    (True, 'cifar-100-python', 'fine_label_names')
    """

    base_folder = "cifar-100-python"
    url = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
    filename = "cifar-100-python.tar.gz"
    tgz_md5 = "eb9058c3a382ffc7106e4002c42a8d85"
    train_list: ClassVar[list[list[str]]] = [["train", "16019d7e3df5f24257cddd939b257f8d"]]
    test_list: ClassVar[list[list[str]]] = [["test", "f0ef6b0ae62326f3e7ffdfab6717acfc"]]
    meta: ClassVar[dict[str, str]] = {
        "filename": "meta",
        "key": "fine_label_names",
        "md5": "7973b15100ade9c7d40fb424638fde48",
    }
    labels_key = "fine_labels"
