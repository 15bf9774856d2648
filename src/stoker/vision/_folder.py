"""DatasetFolder and ImageFolder: a ``root/<class>/<file>`` tree as (sample, class_index) pairs.

Arguments, attributes and the order of samples are torchvision's. The file list lives in
:class:`~stoker.vision._lists.SampleList` (NumPy arrays, no per-file Python objects) so
that workers share it without copying. An ImageFolder whose transform is a ``Compose``
that starts with a crop/resize, flips, ``ToTensor`` and ``Normalize`` decodes JPEG files
through the fused fast path (:mod:`stoker.vision._fused`); anything else runs the plain
``loader`` + ``transform``. With ``decode="gpu"`` the same pipeline's draws are made in the
workers and the JPEGs are decoded and transformed on the GPU (:mod:`stoker.vision._gpu`).

With ``cache=`` the decoded pixels of each file are kept in a :func:`stoker.cached` store
shared by all workers (:class:`_Pixels`): the transforms (random crops and flips included)
then run on the cached pixels every epoch, and the files are decoded once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from PIL import Image

from stoker import _cache
from stoker._batch import ColumnBatch
from stoker.vision import _fused, _gpu, _workspace
from stoker.vision._decode import default_loader, pil_loader
from stoker.vision._lists import SampleList
from stoker.vision.transforms._geometric import RandomResizedCrop

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_LAYOUT = "root/<class_name>/<file>, e.g. root/cat/001.jpg"


def has_file_allowed_extension(filename: str, extensions: str | tuple[str, ...]) -> bool:
    """Whether ``filename`` ends with one of ``extensions`` (case-insensitive).

    >>> has_file_allowed_extension("a/B.JPG", (".jpg", ".png"))
    True
    """
    exts = extensions if isinstance(extensions, str) else tuple(extensions)
    return filename.lower().endswith(exts)


def is_image_file(filename: str) -> bool:
    """Whether ``filename`` has one of :data:`IMG_EXTENSIONS`."""
    return has_file_allowed_extension(filename, IMG_EXTENSIONS)


def _check_root(directory: str | os.PathLike[str]) -> str:
    path = os.path.expanduser(os.fspath(directory))
    if not os.path.isdir(path):
        what = "is not a directory" if os.path.exists(path) else "does not exist"
        raise FileNotFoundError(
            f"dataset root {path!r} {what}: pass the folder that holds one subfolder per "
            f"class ({_LAYOUT})."
        )
    return path


def find_classes(directory: str | os.PathLike[str]) -> tuple[list[str], dict[str, int]]:
    """The class folders of ``directory``, sorted, and their indices.

    Raises:
        FileNotFoundError: when ``directory`` is missing or holds no subfolder.

    >>> import os, tempfile
    >>> with tempfile.TemporaryDirectory() as root:
    ...     for name in ["dog", "cat"]:
    ...         os.mkdir(os.path.join(root, name))
    ...     find_classes(root)
    (['cat', 'dog'], {'cat': 0, 'dog': 1})
    """
    path = _check_root(directory)
    classes = sorted(entry.name for entry in os.scandir(path) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {path!r}: expected {_LAYOUT}.")
    return classes, {name: i for i, name in enumerate(classes)}


def _class_files(target_dir: str, is_valid_file: Callable[[str], bool]) -> list[str]:
    """The valid files under one class's folder in ``os.walk`` order (links followed), with
    folders and names sorted; none where the folder is missing."""
    if not os.path.isdir(target_dir):
        return []
    return [
        os.path.join(root, fname)
        for root, _, fnames in sorted(os.walk(target_dir, followlinks=True))
        for fname in sorted(fnames)
        if is_valid_file(os.path.join(root, fname))
    ]


def make_dataset(
    directory: str | os.PathLike[str],
    class_to_idx: dict[str, int] | None = None,
    extensions: str | tuple[str, ...] | None = None,
    is_valid_file: Callable[[str], bool] | None = None,
    allow_empty: bool = False,
) -> list[tuple[str, int]]:
    """The ``(path, class_index)`` pairs under ``directory``, in torchvision's order.

    Classes in sorted name order; within a class, ``os.walk`` order (following links) with
    directories and file names sorted.

    Raises:
        ValueError: when ``class_to_idx`` is empty, or both or neither of ``extensions``
            and ``is_valid_file`` are given.
        FileNotFoundError: when a class has no valid file and ``allow_empty`` is False.

    >>> import os, tempfile
    >>> with tempfile.TemporaryDirectory() as root:
    ...     os.mkdir(os.path.join(root, "cat"))
    ...     for name in ["2.jpg", "1.jpg", "notes.txt"]:
    ...         open(os.path.join(root, "cat", name), "wb").close()
    ...     pairs = make_dataset(root, {"cat": 0}, extensions=(".jpg",))
    ...     [(os.path.relpath(path, root), target) for path, target in pairs]
    [('cat/1.jpg', 0), ('cat/2.jpg', 0)]
    """
    path = _check_root(directory)
    if class_to_idx is None:
        _, class_to_idx = find_classes(path)
    elif not class_to_idx:
        raise ValueError("'class_to_index' must have at least one entry to collect any samples.")
    if (extensions is None) == (is_valid_file is None):
        raise ValueError(
            "Both extensions and is_valid_file cannot be None or not None at the same time: "
            "pass exactly one of them."
        )
    if extensions is not None:
        exts = extensions

        def is_valid_file(x: str) -> bool:
            return has_file_allowed_extension(x, exts)

    assert is_valid_file is not None
    instances: list[tuple[str, int]] = []
    available: set[str] = set()
    for target_class in sorted(class_to_idx):
        found = _class_files(os.path.join(path, target_class), is_valid_file)
        instances.extend((file_path, class_to_idx[target_class]) for file_path in found)
        if found:
            available.add(target_class)
    empty = set(class_to_idx) - available
    if empty and not allow_empty:
        msg = f"Found no valid file for the classes {', '.join(sorted(empty))} in {path!r}. "
        if extensions is not None:
            shown = extensions if isinstance(extensions, str) else ", ".join(extensions)
            msg += f"Supported extensions are: {shown}. "
        msg += "Add files, remove the empty folders, or pass allow_empty=True."
        raise FileNotFoundError(msg)
    return instances


_NONE, _FUSED, _PLAIN = 0, 1, 2
"""What a pixel cache entry holds: nothing usable (load the file), the fast path's decode,
or the loader's RGB image as an array."""


class _Pixels:
    """The decoded pixels of a folder's files, by index: the dataset a pixel cache caches.

    Entry ``i`` is ``(pixels, meta)``: H x W x 3 uint8 and int64 ``[kind, height, width,
    divisor]``. For a JPEG the fast path takes, the whole image decoded as the fast path
    decodes it (:func:`stoker.vision._fused.decode_for_cache`); for other files with the
    default loader, its RGB image; otherwise nothing (the file is loaded every time).
    """

    def __init__(self, folder: DatasetFolder, reduce: bool) -> None:
        self.folder = folder
        self.samples = folder.samples
        self.reduce = reduce
        fast = folder._fast_plan()
        self.mode = "none" if fast is None else f"{type(fast.geometry).__name__}/{fast.fast_decode}"
        if fast is not None and reduce and isinstance(fast.geometry, RandomResizedCrop):
            self.mode += f"/cover{max(fast.geometry.size)}"

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        folder = self.folder
        path = self.samples[index][0]
        fast = folder._fast_plan()
        if fast is not None:
            with open(path, "rb") as f:
                data = f.read()
            job = _fused.decode_for_cache(fast, path, data, self.reduce)
            if job is not None and job.decoded is not None:
                h, w = job.size
                return job.decoded, np.array([_FUSED, h, w, job.divisor], np.int64)
        if folder.loader is default_loader or folder.loader is pil_loader:
            image = np.asarray(folder.loader(path))
            return image, np.array([_PLAIN, *image.shape[:2], 1], np.int64)
        return np.zeros((0, 0, 3), np.uint8), np.array([_NONE, 0, 0, 0], np.int64)

    def __repr__(self) -> str:
        return f"pixels of {self.folder.root!r} ({self.mode}, reduce={self.reduce})"


class DatasetFolder:
    """A generic ``root/<class>/<file>`` dataset: sample ``i`` is ``(loader(path), class_index)``.

    Args:
        root: the folder holding one subfolder per class.
        loader: reads a sample from its path.
        extensions: the file endings to keep (or ``is_valid_file``).
        transform, target_transform: applied to each sample, each class index.
        is_valid_file: decides which files to keep (or ``extensions``).
        allow_empty: accept class folders with no valid file.
        decode: "cpu" (default, in the workers) or "gpu" (:mod:`stoker.vision._gpu`).
        cache: None, "memory" or a directory: decoded pixels kept in one store for all
            workers, transformed anew every epoch (docs/caching.md).
        cache_budget: the store's size in bytes (required with ``cache``).
        cache_reduce: keep a random crop's pixels at the least DCT scale covering the output.

    Attributes:
        classes: the class names, sorted.
        class_to_idx: class name to index.
        samples: the ``(path, class_index)`` pairs (list-like, NumPy-backed).
        targets: the class index of every sample.

    Raises:
        FileNotFoundError: for a missing root or an empty class folder.

    >>> import os, tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as root:
    ...     for name in ["a/x.txt", "b/y.txt"]:
    ...         os.makedirs(os.path.join(root, os.path.dirname(name)), exist_ok=True)
    ...         _ = Path(root, name).write_text(name)
    ...     texts = DatasetFolder(root, loader=lambda p: Path(p).read_text(), extensions=(".txt",))
    ...     texts.classes, texts[1]
    (['a', 'b'], ('b/y.txt', 1))
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        loader: Callable[[str], Any],
        extensions: tuple[str, ...] | None = None,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
        *,
        decode: str = "cpu",
        cache: str | os.PathLike[str] | None = None,
        cache_budget: int | None = None,
        cache_reduce: bool = False,
    ) -> None:
        if decode not in ("cpu", "gpu"):
            raise ValueError(
                f"decode must be 'cpu' (decode in the workers) or 'gpu' (send the JPEG bytes "
                f"and draws, decode on the GPU in the main process), got {decode!r}."
            )
        self.decode = decode
        self.root = os.fspath(root)
        self.transform = transform
        self.target_transform = target_transform
        classes, class_to_idx = self.find_classes(self.root)
        pairs = self.make_dataset(
            self.root,
            class_to_idx=class_to_idx,
            extensions=extensions,
            is_valid_file=is_valid_file,
            allow_empty=allow_empty,
        )
        self.loader = loader
        self.extensions = extensions
        self.classes = classes
        self.class_to_idx = class_to_idx
        self.samples: Sequence[tuple[str, int]] = (
            pairs if isinstance(pairs, SampleList) else SampleList.from_pairs(pairs)
        )
        self.targets: Sequence[int] = (
            self.samples.targets()
            if isinstance(self.samples, SampleList)
            else [s[1] for s in self.samples]
        )
        self._plan_for: object = None
        self._plan: _fused.FusedPlan | None = None
        self._step: _gpu.BatchStep | None = None
        if decode == "gpu":
            _gpu.check_plan(self._fast_plan(), transform)
        self._pixel_cache: _cache.CachedDataset | None = None
        if cache is not None:
            if decode != "cpu" or cache_budget is None:
                raise ValueError(
                    "cache keeps decoded pixels for decode='cpu' and needs cache_budget (the "
                    f"store's bytes), got decode={decode!r}, cache_budget={cache_budget!r}."
                )
            self._pixel_cache = _cache.CachedDataset(
                _Pixels(self, cache_reduce), cache_budget, cache, always=True
            )

    def _pixels(self, index: int) -> tuple[np.ndarray[Any, Any], int, int, int, int] | None:
        """The pixel cache's entry for ``index`` as (pixels, kind, height, width, divisor)."""
        if self._pixel_cache is None:
            return None
        pixels, meta = self._pixel_cache[index]
        kind, h, w, d = (int(x) for x in meta)
        return pixels, kind, h, w, d

    def _cached_job(self, fast: _fused.FusedPlan, index: int) -> tuple[_fused.Job | None, Any]:
        """With a pixel cache: (the fast path's job drawn on the cached pixels, None), or
        (None, the sample loaded as the plain path would); without: (None, None)."""
        entry = self._pixels(index)
        if entry is None:
            return None, None
        pixels, kind, h, w, d = entry
        path = self.samples[index][0]
        if kind == _FUSED:
            job = _fused.prepare_decoded(fast, path, (h, w), pixels, d)
            if job is not None:
                return job, None
        return None, self._plain(index, entry)

    def _plain(self, index: int, entry: tuple[Any, ...] | None) -> Any:
        """``transform(loader(path))``, on the cached RGB image when there is one."""
        if entry is not None and entry[1] == _PLAIN:
            sample: Any = Image.fromarray(entry[0], "RGB")
        else:
            sample = self.loader(self.samples[index][0])
        return sample if self.transform is None else self.transform(sample)

    @staticmethod
    def make_dataset(
        directory: str | os.PathLike[str],
        class_to_idx: dict[str, int],
        extensions: str | tuple[str, ...] | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
    ) -> list[tuple[str, int]]:
        """The ``(path, class_index)`` pairs; override to change how files are found."""
        if class_to_idx is None:
            raise ValueError("The class_to_idx parameter cannot be None.")
        return make_dataset(
            directory,
            class_to_idx,
            extensions=extensions,
            is_valid_file=is_valid_file,
            allow_empty=allow_empty,
        )

    def find_classes(self, directory: str | os.PathLike[str]) -> tuple[list[str], dict[str, int]]:
        """The class names and indices; override for another layout."""
        return find_classes(directory)

    def _fast_plan(self) -> _fused.FusedPlan | None:
        """The fused plan for the current transform and loader, cached per transform object."""
        transform = self.transform
        if transform is not self._plan_for:
            self._plan_for = transform
            uses_pil = self.loader is default_loader or self.loader is pil_loader
            self._plan = _fused.plan(transform) if uses_pil else None
        return self._plan

    @property
    def main_process_step(self) -> _gpu.BatchStep | None:
        """With decode='gpu', what the loader runs on each batch in the main process (the
        decode and transforms on the device, see :mod:`stoker.vision._gpu`); else None."""
        if self.decode != "gpu":
            return None
        fast = _gpu.check_plan(self._fast_plan(), self.transform)
        if self._step is None or self._step.plan is not fast:
            self._step = _gpu.BatchStep(fast)
        return self._step

    def _encoded(self, indices: Sequence[int]) -> ColumnBatch:
        """decode='gpu': the samples' JPEG bytes and random draws, as columns."""
        fast = _gpu.check_plan(self._fast_plan(), self.transform)
        jobs, targets = [], []
        for index in indices:
            path, target = self.samples[index]
            with open(path, "rb") as f:
                data = f.read()
            job = _fused.prepare(fast, path, data)
            if job is None:
                raise ValueError(
                    f"decode='gpu' decodes RGB or grayscale JPEG files, and {path!r} is not "
                    "one (another format, or CMYK); convert it, or use decode='cpu'."
                )
            jobs.append(job)
            targets.append(target)
        if self.target_transform is not None:  # the draws are made: decoding draws none
            targets = [self.target_transform(target) for target in targets]
        return ColumnBatch(_gpu.encode(fast, jobs, targets), np.arange(len(jobs)))

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        if self.decode == "gpu":
            return self._encoded([index])[0]  # type: ignore[no-any-return]
        path, target = self.samples[index]
        sample: Any = None
        fast = self._fast_plan()
        if self._pixel_cache is not None:
            if fast is None:
                sample = self._plain(index, self._pixels(index))
            else:
                job, sample = self._cached_job(fast, index)
                if job is not None:
                    sample = _fused.finish(fast, _fused.execute(fast, job))
        elif fast is not None:
            with open(path, "rb") as f:
                data = f.read()
            sample = _fused.run(fast, path, data)
        if sample is None:
            sample = self.loader(path)
            if self.transform is not None:
                sample = self.transform(sample)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target

    def __getitems__(self, indices: Sequence[int]) -> Sequence[tuple[Any, Any]]:
        """The samples at ``indices``, as ``[self[i] for i in indices]`` gives them.

        On the fast path the random draws happen first, in order, and the decodes then run
        in parallel threads (see :mod:`stoker.vision._fused`); otherwise one by one. When
        every sample took the fast path to the same size with int targets, the result is
        a :class:`~stoker.vision._fused.FusedBatch`, which stoker's collate writes
        straight into the batch buffer; otherwise a list.
        """
        if self.decode == "gpu":
            return self._encoded(indices)
        fast = self._fast_plan()
        if fast is None:
            return [self[i] for i in indices]  # (the pixel cache serves them there)
        items: list[Any] = []
        jobs: list[_fused.Job] = []
        targets: list[Any] = []
        for slot, index in enumerate(indices):
            path, target = self.samples[index]
            if self._pixel_cache is not None:
                job, plain = self._cached_job(fast, index)
            else:
                job, plain = _fused.prepare(fast, path, _workspace.read(path, slot)), None
            if job is None:  # not a JPEG the fast path takes: the plain path, in order
                if plain is None:
                    sample = self.loader(path)
                    plain = sample if self.transform is None else self.transform(sample)
                items.append(plain)
            else:
                items.append(len(jobs))
                jobs.append(job)
            targets.append(target)
        if len(jobs) == len(items) > 0 and not fast.rest and _fused.one_size(jobs):
            if self.target_transform is not None:  # the draws are made: decoding draws none
                targets = [self.target_transform(target) for target in targets]
            if all(type(target) is int for target in targets):
                return _fused.fused_batch(fast, jobs, targets)
            return list(zip(_fused.run_batch(fast, jobs), targets, strict=True))
        images = _fused.run_batch(fast, jobs)
        out = []
        for item, target in zip(items, targets, strict=True):
            sample = _fused.finish(fast, images[item]) if isinstance(item, int) else item
            if self.target_transform is not None:
                target = self.target_transform(target)
            out.append((sample, target))
        return out

    def __len__(self) -> int:
        return len(self.samples)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_plan_for"] = None  # rebuilt on first use: keeps pickles independent of plans
        state["_plan"] = None
        state["_step"] = None
        return state

    def __repr__(self) -> str:
        lines = [
            f"Dataset {type(self).__name__}",
            f"    Number of datapoints: {len(self)}",
            f"    Root location: {self.root}",
        ]
        if self.transform is not None:
            lines.append("    " + repr(self.transform).replace("\n", "\n    "))
        return "\n".join(lines)


class ImageFolder(DatasetFolder):
    """Images in ``root/<class>/<file>`` (extensions :data:`IMG_EXTENSIONS`), loaded as RGB.

    Args:
        root: the folder holding one subfolder per class.
        transform: applied to each PIL image; a ``Compose`` starting with the fast-path
            transforms decodes JPEGs through the fused path.
        target_transform: applied to each class index.
        loader: reads an image from its path (default: RGB through Pillow).
        is_valid_file: decides which files to keep (then any extension counts).
        allow_empty: accept class folders with no valid file.
        decode: "cpu" (default) or "gpu" (see :class:`DatasetFolder`).
        cache: None, "memory" or a directory: keep decoded pixels, shared by all workers.
        cache_budget: the pixel store's size in bytes (required with ``cache``).
        cache_reduce: keep a random crop's pixels at a reduced size that still covers the
            output.

    Attributes:
        imgs: the same as ``samples``.

    >>> import os, tempfile
    >>> from PIL import Image
    >>> with tempfile.TemporaryDirectory() as root:
    ...     for name in ["cat/1.png", "cat/2.png", "dog/1.png"]:
    ...         os.makedirs(os.path.join(root, os.path.dirname(name)), exist_ok=True)
    ...         Image.new("RGB", (6, 4)).save(os.path.join(root, name))
    ...     images = ImageFolder(root, transform=transforms.ToTensor())
    ...     image, target = images[2]
    >>> images.classes, len(images), image.shape, image.dtype, target
    (['cat', 'dog'], 3, (3, 4, 6), dtype('float32'), 1)
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        loader: Callable[[str], Any] = default_loader,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
        *,
        decode: str = "cpu",
        cache: str | os.PathLike[str] | None = None,
        cache_budget: int | None = None,
        cache_reduce: bool = False,
    ) -> None:
        super().__init__(
            root,
            loader,
            IMG_EXTENSIONS if is_valid_file is None else None,
            transform=transform,
            target_transform=target_transform,
            is_valid_file=is_valid_file,
            allow_empty=allow_empty,
            decode=decode,
            cache=cache,
            cache_budget=cache_budget,
            cache_reduce=cache_reduce,
        )
        self.imgs = self.samples
