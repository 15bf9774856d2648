"""stoker's DataLoader as a subclass of torch's, with torch's default collate.

Frameworks rebuild loaders they recognise: Lightning, for one, reads a loader's attributes
(or the arguments it was made with) and makes a new one of the same class with a
``DistributedSampler``. So the loader is a ``torch.utils.data.DataLoader``, its default
sampler and batch sampler are :mod:`stoker.torch`'s (subclasses of torch's, so shuffling is
recognised), and batches are tensors unless ``tensor_type="numpy"`` is asked.
"""

from __future__ import annotations

import multiprocessing.context
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch.utils.data as torch_data

from stoker import _collate, _loader, _random
from stoker._dataset import is_iterable_dataset
from stoker.torch._sampling import BatchSampler, RandomSampler, Sampler, SequentialSampler

T_co = TypeVar("T_co", covariant=True)

__all__ = ["DataLoader", "default_collate", "default_convert"]


def default_collate(batch: Any) -> Any:
    """Merge a list of samples into a batch exactly as ``torch.utils.data.default_collate``.

    NumPy arrays, NumPy scalars and Python numbers become tensors of torch's dtypes
    (``int64`` for ints, ``float64`` for floats), str and bytes stay in a list, mappings,
    namedtuples and sequences keep their structure.

    Args:
        batch: a sequence of samples of the same structure.
    """
    return _collate.collate(batch, tensor_type="torch")


def default_convert(data: Any) -> Any:
    """Convert one unbatched sample exactly as ``torch.utils.data.default_convert``.

    Args:
        data: one sample; NumPy arrays (not of strings or objects) and scalars in it become
            tensors, tuples become lists.
    """
    return _collate.convert(data, tensor_type="torch")


class DataLoader(_loader.DataLoader[T_co], torch_data.DataLoader[T_co]):  # type: ignore[misc]
    """stoker's DataLoader (see :class:`stoker.DataLoader`) that is also torch's.

    The arguments are the same; ``tensor_type`` defaults to tensors (``"torch"``), as torch's
    ``default_collate`` makes them; ``"numpy"`` gives NumPy batches.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler[Any] | Iterable[Any] | Any = None,
        batch_sampler: Sampler[Any] | Iterable[Any] | Any = None,
        num_workers: int | str = 0,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: str | multiprocessing.context.BaseContext | None = None,
        generator: _random.GeneratorLike = None,
        *,
        prefetch_factor: int | str | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        tensor_type: str | None = None,
        worker_mode: str = "process",
        skip_errors: int | float = 0,
    ) -> None:
        # The default samplers are made here, as stoker.torch's classes, so that frameworks
        # see torch's types; stoker's loader makes the same ones otherwise.
        default_sampler = sampler is None and batch_sampler is None
        if default_sampler and not is_iterable_dataset(dataset):
            if shuffle:
                sampler = RandomSampler(dataset, generator=generator)
            else:
                sampler = SequentialSampler(dataset)
            shuffle = None
        super().__init__(
            dataset,
            batch_size,
            shuffle,
            sampler,
            batch_sampler,
            num_workers,
            collate_fn,
            pin_memory,
            drop_last,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
            tensor_type="torch" if tensor_type is None else tensor_type,
            worker_mode=worker_mode,
            skip_errors=skip_errors,
        )
        if batch_sampler is None and self.batch_sampler is not None:
            # the loader's own BatchSampler, made again as stoker.torch's (frozen attribute)
            own = BatchSampler(self.sampler, self.batch_sampler.batch_size, self.drop_last)
            object.__setattr__(self, "batch_sampler", own)

    @property
    def _is_accelerate_prepared(self) -> bool:
        """Asked by Accelerate's ``Accelerator.prepare_data_loader``: the loader is then
        prepared in place, on stoker's engine (see :mod:`stoker.torch._accelerate`)."""
        if "_accelerate_prepared" in self.__dict__:
            return bool(self.__dict__["_accelerate_prepared"])
        from stoker.torch._accelerate import prepare_in_place

        return prepare_in_place(self, sys._getframe(1))

    @_is_accelerate_prepared.setter
    def _is_accelerate_prepared(self, value: bool) -> None:
        self.__dict__["_accelerate_prepared"] = value
