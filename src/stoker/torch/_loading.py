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

__all__ = ["DataLoader", "StatefulDataLoader", "default_collate", "default_convert"]


def default_collate(batch: Any) -> Any:
    """Merge a list of samples into a batch exactly as ``torch.utils.data.default_collate``.

    NumPy arrays, NumPy scalars and Python numbers become tensors of torch's dtypes
    (``int64`` for ints, ``float64`` for floats), str and bytes stay in a list, mappings,
    namedtuples and sequences keep their structure.

    Args:
        batch: a sequence of samples of the same structure.

    >>> default_collate([(np.array([1, 2]), 0.5), (np.array([3, 4]), 1.5)])
    [tensor([[1, 2],
            [3, 4]]), tensor([0.5000, 1.5000], dtype=torch.float64)]
    """
    return _collate.collate(batch, tensor_type="torch")


def default_convert(data: Any) -> Any:
    """Convert one unbatched sample exactly as ``torch.utils.data.default_convert``.

    Args:
        data: one sample; NumPy arrays (not of strings or objects) and scalars in it become
            tensors, tuples become lists.

    >>> default_convert((np.array([1.0, 2.0]), "a"))
    [tensor([1., 2.], dtype=torch.float64), 'a']
    """
    return _collate.convert(data, tensor_type="torch")


class DataLoader(_loader.DataLoader[T_co], torch_data.DataLoader[T_co]):  # type: ignore[misc]
    """stoker's DataLoader (see :class:`stoker.DataLoader`) that is also torch's.

    The arguments are the same; ``tensor_type`` defaults to tensors (``"torch"``), as torch's
    ``default_collate`` makes them; ``"numpy"`` gives NumPy batches.

    >>> import torch, torch.utils.data as td
    >>> loader = DataLoader(TensorDataset(torch.arange(6)), batch_size=4)
    >>> isinstance(loader, td.DataLoader), [batch.tolist() for (batch,) in loader]
    (True, [[0, 1, 2, 3], [4, 5]])
    >>> next(iter(DataLoader(np.arange(6), batch_size=4)))
    tensor([0, 1, 2, 3])
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
        snapshot_every_n_steps: int | None = 1,
        ray_options: dict[str, Any] | None = None,
        worker_restarts: int = 0,
    ) -> None:
        default_sampler = sampler is None and batch_sampler is None  # of torch's types, then
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
            snapshot_every_n_steps=snapshot_every_n_steps,
            ray_options=ray_options,
            worker_restarts=worker_restarts,
        )
        self._torch_samplers(sampler is None, batch_sampler is None)

    def _torch_samplers(self, no_sampler: bool, no_batch_sampler: bool) -> None:
        """Make the samplers stoker's loader made (frozen attributes) torch's types, as
        torch's loader has them: the loader's own ``BatchSampler``, as stoker.torch's (over
        what stoker's iterates: a sampler of the wrong kind raises, naming it); a
        ``SequentialSampler`` beside a given batch_sampler; torch's
        ``_InfiniteConstantSampler`` over an IterableDataset."""
        if no_batch_sampler and self.batch_sampler is not None:
            over = self.batch_sampler.sampler
            own = BatchSampler(over, self.batch_sampler.batch_size, self.drop_last)
            object.__setattr__(self, "batch_sampler", own)
        if is_iterable_dataset(self.dataset):
            infinite = getattr(torch_data.dataloader, "_InfiniteConstantSampler", None)
            if infinite is not None:
                object.__setattr__(self, "sampler", infinite())
        elif no_sampler and not no_batch_sampler:
            object.__setattr__(self, "sampler", SequentialSampler(self.dataset))

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


class StatefulDataLoader(DataLoader[T_co], _loader.StatefulDataLoader[T_co]):  # type: ignore[misc]
    """torchdata's ``StatefulDataLoader`` name for :class:`DataLoader`, which is one already:
    ``state_dict()`` mid-epoch, ``load_state_dict()``, ``snapshot_every_n_steps``, and the
    ``Stateful`` protocol of datasets, their iterators and samplers. Its state is stoker's,
    not torchdata's: each loader refuses the other's, saying so.

    >>> loader = StatefulDataLoader(range(6), batch_size=2)
    >>> it = iter(loader); first = next(it); state = loader.state_dict()
    >>> resumed = StatefulDataLoader(range(6), batch_size=2)
    >>> resumed.load_state_dict(state)
    >>> [b.tolist() for b in resumed]
    [[2, 3], [4, 5]]
    """
