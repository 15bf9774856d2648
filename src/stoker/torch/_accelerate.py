"""Accelerate keeps stoker: ``accelerator.prepare(stoker.torch.DataLoader(...))`` prepares
the loader in place instead of rebuilding it as a plain torch ``DataLoader``.

Accelerate returns a loader that says it is prepared (``_is_accelerate_prepared``) as it is,
and its ``save_state()`` / ``load_state()`` keep the ``state_dict()`` of one that says
``use_stateful_dataloader``: duck-typed checks of many releases. Asked, the loader shards
itself as Accelerate's ``BatchSamplerShard`` does, keeps its shuffling generator in step
across processes, and becomes a :class:`PreparedLoader` (batches on the device, the
gradient state told, a ``state_dict()`` of the batches seen). Where the settings need what
stoker does not do, Accelerate rebuilds it, after a warning (once a reason) naming what is
lost and the fix. ``docs/guide.md``, "Accelerate and HF Trainer".
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from types import FrameType
from typing import Any, NamedTuple

from stoker._dataset import is_iterable_dataset

_WARNED: set[str] = set()
_CLASSES: dict[type, type] = {}


class AccelerateSettings(NamedTuple):
    """What a prepared loader needs of the Accelerator that prepared it."""

    device: Any
    num_processes: int
    process_index: int
    rng_types: list[str]
    generator: Any
    non_blocking: bool
    split_batches: bool


def prepare_in_place(loader: Any, caller: FrameType | None) -> bool:
    """Prepare ``loader`` for the Accelerator whose ``prepare_data_loader`` is the frame
    ``caller``, and say whether it is now prepared (False: Accelerate rebuilds it, after a
    warning naming what is lost)."""
    if caller is None or not caller.f_globals.get("__name__", "").startswith("accelerate"):
        return False  # asked by someone else: nothing to prepare
    acc, placement = _asking_accelerator(caller)
    why = _unsupported(acc, loader)
    if why is not None:
        _warn_lost(why)
        return False
    assert acc is not None
    # Accelerate keeps a generator in step only where processes share the epoch
    generator = _synchronized_generator(loader) if acc.num_processes > 1 else None
    rng_types = [t for t in acc.rng_types if t != "generator" or generator is not None]
    if acc.num_processes > 1:
        object.__setattr__(loader, "batch_sampler", _shard(loader, acc))
    settings = AccelerateSettings(
        device=acc.device if placement else None,
        num_processes=acc.num_processes,
        process_index=acc.process_index,
        rng_types=rng_types,
        generator=generator,
        non_blocking=bool(acc.non_blocking),
        split_batches=bool(acc.split_batches),
    )
    loader.__class__ = _prepared_class(type(loader))
    loader._accelerate_begin(settings)
    return True


def _asking_accelerator(caller: FrameType | None) -> tuple[Any, bool]:
    """(the Accelerator of the ``prepare_data_loader`` frame ``caller``, whether it places
    batches on its device), or (None, False) where the caller is no such frame."""
    try:
        from accelerate import Accelerator
        from accelerate.utils import DistributedType
    except ImportError:  # pragma: no cover - asked by something that is not Accelerate
        return None, False
    if caller is None or caller.f_code.co_name != "prepare_data_loader":
        return None, False
    acc = caller.f_locals.get("self")
    if not isinstance(acc, Accelerator):
        return None, False
    placement = caller.f_locals.get("device_placement")
    if placement is None:
        placement = acc.device_placement and acc.distributed_type != DistributedType.XLA
    return acc, bool(placement)


def _unsupported(acc: Any, loader: Any) -> str | None:
    """Why ``loader`` cannot stay stoker's under ``acc``, or None."""
    if acc is None:
        return "this Accelerate version asked in a way stoker does not know"
    from accelerate.utils import DistributedType

    if acc.distributed_type in (DistributedType.XLA, DistributedType.MEGATRON_LM):
        return f"Accelerate's {acc.distributed_type} loading is its own"
    if acc.dispatch_batches:
        return "dispatch_batches=True has the main process load every batch"
    config = getattr(acc, "parallelism_config", None)
    if config is not None and (config.tp_enabled or config.cp_enabled):
        return "tensor or context parallelism gives ranks the same batches"
    if acc.num_processes > 1 and is_iterable_dataset(loader.dataset):
        return "an IterableDataset is sharded by Accelerate's IterableDatasetShard"
    if acc.num_processes > 1 and loader.batch_sampler is None:
        return "batch_size=None leaves no batches to shard"
    return None


def _warn_lost(why: str) -> None:
    """Warn, once a reason, that Accelerate rebuilds a stoker loader as torch's."""
    if why in _WARNED:
        return
    _WARNED.add(why)
    warnings.warn(
        "accelerator.prepare() rebuilds this stoker.torch.DataLoader as Accelerate's "
        f"DataLoaderShard over a plain torch DataLoader, because {why}: stoker's workers, "
        "shared-memory transport, seeding, statistics() and state_dict() are lost. Fix: "
        "prepare with the Accelerator's defaults (dispatch_batches=None, no tensor or "
        "context parallelism, a map-style dataset with a batch_size), or shard the data "
        "per process yourself (stoker.torch.DistributedSampler or ShardedIterable) and "
        "iterate the stoker loader without prepare().",
        UserWarning,
        stacklevel=_caller_level(),
    )


def _caller_level() -> int:
    """The ``stacklevel`` of the user's ``accelerator.prepare()`` line, for a warning made
    by this module's caller (the first frame outside stoker and Accelerate)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in _INNER:
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


_INNER = ("stoker", "accelerate")


def _synchronized_generator(loader: Any) -> Any:
    """The shuffling sampler's ``torch.Generator``, made (seeded from torch's global RNG)
    where it has none, as Accelerate does: every process draws the same order from it
    once the generator's state is broadcast at each epoch."""
    import torch

    sampler = getattr(loader.batch_sampler, "sampler", loader.sampler)
    if not hasattr(sampler, "generator"):
        return None
    if sampler.generator is None:
        generator = torch.Generator()
        generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        sampler.generator = generator
    return sampler.generator if isinstance(sampler.generator, torch.Generator) else None


def _shard(loader: Any, acc: Any) -> Any:
    """The loader's batch sampler, sharded as Accelerate shards it (with a state)."""
    from accelerate.data_loader import BatchSamplerShard

    shard_class = _CLASSES.get(BatchSamplerShard)
    if shard_class is None:
        shard_class = _CLASSES[BatchSamplerShard] = type(
            "ShardedBatchSampler", (_ShardState, BatchSamplerShard), {"__module__": __name__}
        )
    return shard_class(
        loader.batch_sampler,
        num_processes=acc.num_processes,
        process_index=acc.process_index,
        split_batches=acc.split_batches,
        even_batches=acc.even_batches,
    )


class _ShardState:
    """The state of a sharded batch sampler: its wrapped batch sampler's (the sharding is
    the same in every run with the same processes)."""

    batch_sampler: Any

    def state_dict(self) -> dict[str, Any]:
        return self._wrap("state_dict")

    def _drawn_state(self) -> dict[str, Any]:
        return self._wrap("_drawn_state")

    def _pending_state(self) -> dict[str, Any]:
        return self._wrap("_pending_state")

    def _wrap(self, method: str) -> dict[str, Any]:
        get = getattr(self.batch_sampler, method, None)
        if get is None:
            get = getattr(self.batch_sampler, "state_dict", None)
        return {"kind": type(self).__name__, "sampler": get() if callable(get) else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        inner = state_dict["sampler"]
        if inner is not None:
            self.batch_sampler.load_state_dict(inner)


def _prepared_class(cls: type) -> type:
    """``cls`` (a stoker.torch.DataLoader class) with :class:`PreparedLoader`'s iteration:
    a subclass of ``cls`` alone (an instance's class can change only to one of its own
    layout), holding PreparedLoader's members."""
    prepared = _CLASSES.get(cls)
    if prepared is None:
        members = {k: v for k, v in vars(PreparedLoader).items() if k not in _NOT_COPIED}
        members.update(__module__=cls.__module__, __qualname__=cls.__qualname__)
        prepared = _CLASSES[cls] = type(cls.__name__, (cls,), members)
    return prepared


_NOT_COPIED = ("__dict__", "__weakref__", "__doc__")


def _base(loader: Any) -> Any:
    """The class the prepared loader was (its methods come next)."""
    return type(loader).__mro__[1]


class PreparedLoader:
    """A stoker loader that Accelerate prepared: iterated as Accelerate's ``DataLoaderShard``
    (generators in step, one batch ahead to know the end, batches on the device, the
    gradient state told), its ``state_dict()`` the batches the loop has seen. Its members
    are copied into a subclass of the loader's class (:func:`_prepared_class`)."""

    _is_accelerate_prepared = True
    use_stateful_dataloader = True  # Accelerate's save_state() / load_state() keep its state
    end_of_dataloader = False
    remainder = -1

    def _accelerate_begin(self, settings: AccelerateSettings) -> None:
        from accelerate.state import GradientState

        self._accelerate = settings
        self._seen: dict[str, Any] | None = None
        self.gradient_state = GradientState()
        self.iteration = 0
        self.device = settings.device

    @property
    def total_batch_size(self) -> int:
        """Samples a step takes over all processes, as Accelerate's loaders say."""
        s, size = self._accelerate, self.batch_sampler.batch_size  # type: ignore[attr-defined]
        return int(size if s.split_batches else size * s.num_processes)

    @property
    def total_dataset_length(self) -> int:
        return len(self.dataset)  # type: ignore[attr-defined]

    def set_epoch(self, epoch: int) -> None:
        """The epoch to draw next, told to samplers that take one (as Accelerate does)."""
        self.iteration = epoch
        inner: Any = getattr(self.batch_sampler, "batch_sampler", self.batch_sampler)  # type: ignore[attr-defined]
        for s in (inner, getattr(inner, "sampler", None)):
            set_epoch = getattr(s, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The loader's state after the batches the loop has seen (not the one fetched
        ahead to know the end)."""
        if self._seen is not None:
            return dict(self._seen)
        return _base(self).state_dict(self)  # type: ignore[no-any-return]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from a :meth:`state_dict` (as ``accelerator.load_state()`` does)."""
        _base(self).load_state_dict(self, state_dict)
        self._seen = None

    def __iter__(self) -> Any:
        from accelerate.utils import send_to_device, synchronize_rng_states

        s = self._accelerate
        if s.rng_types:
            synchronize_rng_states(s.rng_types, s.generator)
        self._seen = None
        self._start()
        self.set_epoch(self.iteration)
        base = _base(self)
        it = base.__iter__(self)
        try:
            batch = next(it)
            while True:
                if s.device is not None:
                    batch = send_to_device(batch, s.device, non_blocking=s.non_blocking)
                self._seen = base.state_dict(self)
                try:
                    ahead = next(it)
                except StopIteration:
                    self.end_of_dataloader = True
                    self._seen = base.state_dict(self)
                    yield batch
                    break
                yield batch
                batch = ahead
            self.iteration += 1
        except StopIteration:
            pass
        finally:  # the last state seen stays: a loop that stopped early saves it
            self.gradient_state._remove_dataloader(self)

    def _start(self) -> None:
        """Tell Accelerate's gradient state that this loader runs (and its padding)."""
        self.end_of_dataloader, self.remainder = False, -1
        if not self.drop_last and self.batch_sampler is not None:  # type: ignore[attr-defined]
            with contextlib.suppress(TypeError):  # a dataset without len()
                self.remainder = len(self.dataset) % self.total_batch_size  # type: ignore[attr-defined]
        self.gradient_state._add_dataloader(self)
