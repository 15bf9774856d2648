"""DataLoader: validates its arguments, builds sampling, owns the epoch, picks an iterator.

It holds no worker logic: iteration is done by the engine (``stoker._engine``), in the main
process when ``num_workers == 0`` and by workers otherwise.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import multiprocessing
import multiprocessing.context
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import numpy as np

from stoker import _random
from stoker._collate import DefaultCollate, check_tensor_type
from stoker._dataset import is_iterable_dataset
from stoker._distributed import DistributedSampler, ShardedIterable
from stoker._elastic import check_elastic
from stoker._engine._config import EngineConfig, EngineMemory
from stoker._engine._pin import pin_device
from stoker._fetch import IterableFetcher, MapFetcher, placed_tasks
from stoker._placement import Placement, may_load_in_process
from stoker._policy import DEFAULT_PREFETCH, prefetch_of
from stoker._sampler import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    batch_arrays,
    check_sampler_state,
)
from stoker._state import STATE_VERSION, Epoch, check_state
from stoker._stateful import StreamLog, is_stateful
from stoker._stats import LoaderStatistics, empty, with_cache
from stoker.errors import ArgumentError

if TYPE_CHECKING:
    from stoker._autotune import Autotuner
    from stoker._engine._multi import MultiWorkerIterator

T_co = TypeVar("T_co", covariant=True)

_WORKER_MODES = ("process", "thread", "auto", "ray")
_NO_TASK = object()  # an epoch without tasks
_FROZEN_AFTER_INIT = (
    "batch_size",
    "batch_sampler",
    "sampler",
    "drop_last",
    "dataset",
    "persistent_workers",
)


class _InfiniteSampler(Sampler[None]):
    """The sampler of an iterable dataset: an endless stream of None tasks."""

    def __iter__(self) -> Iterator[None]:
        while True:
            yield None


class DataLoader(Generic[T_co]):
    """Iterates over a dataset in batches, in the main process or in workers.

    The arguments up to ``in_order`` are torch.utils.data.DataLoader's, with its defaults,
    behaviour and validation; stoker's own are keyword-only. Listed: what stoker adds
    (details: ``docs/engine.md``, "The loader's arguments").

    Args:
        num_workers: also ``"auto"``: the workers measuring shows help (maybe none).
        generator: also an int seed or a ``numpy.random.Generator``.
        prefetch_factor: also ``"auto"``: deepen the window while the consumer waits.
        tensor_type: None follows the data; ``"numpy"`` or ``"torch"`` force one.
        worker_mode: ``"process"``, ``"thread"``, ``"auto"`` (measured) or ``"ray"``.
        skip_errors: 0 raises, as torch does; an int ``n`` or a fraction in (0, 1) skips
            up to that many failing samples per epoch, the same ones every run.
        snapshot_every_n_steps: torchdata's (see :meth:`state_dict`).
        worker_restarts: dead workers replaced per epoch (0: raise).
        ray_options: Ray's actor options for ``worker_mode="ray"`` (``docs/ray.md``).

    Raises:
        ValueError: for contradictory or out-of-range arguments, as torch raises.
        TypeError: for arguments of the wrong kind.

    >>> loader = DataLoader(np.arange(10), batch_size=4)
    >>> [batch.tolist() for batch in loader]
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    >>> shuffled = DataLoader(np.arange(10), batch_size=4, shuffle=True, generator=0)
    >>> it = iter(shuffled)
    >>> first = next(it)
    >>> again = DataLoader(np.arange(10), batch_size=4, shuffle=True, generator=0)
    >>> again.load_state_dict(shuffled.state_dict())
    >>> [b.tolist() for b in again] == [b.tolist() for b in it]
    True
    """

    dataset: Any
    batch_size: int | None
    drop_last: bool
    sampler: Any
    batch_sampler: Any
    __initialized = False

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
        _check_num_workers(num_workers)
        _check_snapshot_every(snapshot_every_n_steps)
        _check_timeout(timeout)
        if timeout < 0:
            raise ValueError(
                f"timeout option should be non-negative, got timeout={timeout}; pass the seconds "
                "to wait for a batch from a worker, or 0 to wait as long as it is alive."
            )
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError(
                "prefetch_factor option could only be specified in multiprocessing: let "
                "num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor "
                f"to None (got prefetch_factor={prefetch_factor!r})."
            )
        if num_workers != 0 and prefetch_factor is None:
            prefetch_factor = DEFAULT_PREFETCH
        if isinstance(prefetch_factor, str) and prefetch_factor != "auto":
            raise TypeError(  # torch fails comparing the string with 0
                f"prefetch_factor must be a positive int or 'auto', got {prefetch_factor!r}."
            )
        if isinstance(prefetch_factor, (int, float)) and prefetch_factor < 0:
            raise ValueError(
                f"prefetch_factor option should be non-negative, got {prefetch_factor}; pass "
                "how many batches each worker loads ahead (>= 1)."
            )
        if persistent_workers and num_workers == 0:
            raise ValueError(
                "persistent_workers option needs num_workers > 0: there are no workers to keep "
                "between epochs; pass num_workers >= 1 or persistent_workers=False."
            )
        check_tensor_type(tensor_type)
        if worker_mode not in _WORKER_MODES:
            raise ValueError(f"worker_mode must be one of {_WORKER_MODES}, got {worker_mode!r}.")
        _random.check_generator(generator)
        _check_skip_errors(skip_errors)
        _check_ray(worker_mode, num_workers, prefetch_factor, ray_options)

        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.in_order = in_order
        self.tensor_type = tensor_type
        self.worker_mode = worker_mode
        self.generator = generator
        self.snapshot_every_n_steps = snapshot_every_n_steps
        self.ray_options = ray_options

        self._iterable = is_iterable_dataset(dataset)
        _check_worker_restarts(worker_restarts, num_workers, worker_mode, self._iterable)
        self.worker_restarts = int(worker_restarts)
        self.skip_errors: int | float = (
            float(skip_errors)
            if isinstance(skip_errors, (float, np.floating))
            else int(skip_errors)
        )
        if self._iterable and skip_errors:
            raise ValueError(
                "skip_errors applies to map-style datasets only, got an IterableDataset "
                f"with skip_errors={skip_errors!r}: skip failing samples inside the "
                "dataset's __iter__, or leave skip_errors=0."
            )
        if self._iterable:
            if shuffle not in (False, None):
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified shuffle option, "
                    f"but got shuffle={shuffle}; an iterable dataset orders its own samples."
                )
            if sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified sampler option, "
                    f"but got sampler={sampler}; an iterable dataset orders its own samples."
                )
            if batch_sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified batch_sampler "
                    f"option, but got batch_sampler={batch_sampler}."
                )
        shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError(
                "sampler option is mutually exclusive with shuffle: pass shuffle=False (the "
                "sampler decides the order) or drop the sampler."
            )
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "batch_sampler option is mutually exclusive with batch_size, shuffle, "
                    "sampler, and drop_last: the batch sampler decides all of them."
                )
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError(
                "batch_size=None option disables auto-batching and is mutually exclusive "
                "with drop_last=True: without batches there is no last batch to drop; pass "
                "drop_last=False, or a batch_size."
            )
        if sampler is None:
            if self._iterable:
                sampler = _InfiniteSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)
            else:
                sampler = SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            # One that is no iterable raises, naming the argument, where torch's would.
            batches_of = sampler if _iterable(sampler) else _Unusable("sampler", sampler)
            batch_sampler = BatchSampler(cast(Any, batches_of), batch_size, drop_last)

        _bind_elastic(sampler, batch_sampler)
        _bind_stream(dataset, batch_size, num_workers, worker_mode)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        if collate_fn is None:
            collate_fn = DefaultCollate(tensor_type, batched=batch_sampler is not None)
        self.collate_fn = collate_fn
        self.persistent_workers = persistent_workers
        self.multiprocessing_context = multiprocessing_context
        self._iterable_len_reported: int | None = None
        self._iterator: MultiWorkerIterator | None = None
        self._pin_device: str | None = None
        self._pin_checked = False
        self._base_seed: int | None = None
        self._next_epoch = 0
        self._current: Epoch | None = None
        self._resume: dict[str, Any] | None = None
        self._tuner: Autotuner | None = None
        self._tuner_key: tuple[Any, ...] = ()
        self._memory = EngineMemory()  # what the engine keeps from one iterator to the next
        self.__initialized = True
        if isinstance(num_workers, (int, np.integer)) and num_workers > 0:
            from stoker._engine._multi import workers_warning

            workers_warning(int(num_workers), worker_mode)  # torch warns here too

    # -- attributes with rules ---------------------------------------------------------

    @property
    def multiprocessing_context(self) -> multiprocessing.context.BaseContext | None:
        """The start method's context for process workers, or None for the default."""
        return self.__multiprocessing_context

    @multiprocessing_context.setter
    def multiprocessing_context(
        self, ctx: str | multiprocessing.context.BaseContext | None
    ) -> None:
        if ctx is not None:
            if self.num_workers == 0:
                raise ValueError(
                    "multiprocessing_context can only be used with multi-process loading "
                    f"(num_workers > 0), but got num_workers={self.num_workers}; pass "
                    "num_workers >= 1, or leave multiprocessing_context None."
                )
            if isinstance(ctx, str):
                methods = multiprocessing.get_all_start_methods()
                if ctx not in methods:
                    raise ValueError(
                        "multiprocessing_context option should specify a valid start method "
                        f"in {methods!r}, but got multiprocessing_context={ctx!r}."
                    )
                ctx = multiprocessing.get_context(ctx)
            if not isinstance(ctx, multiprocessing.context.BaseContext):
                raise TypeError(
                    "multiprocessing_context option should be a valid context object or a "
                    "string specifying the start method, but got "
                    f"multiprocessing_context={ctx!r} ({type(ctx).__name__})."
                )
        self.__multiprocessing_context = ctx

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__initialized and name in _FROZEN_AFTER_INIT:
            raise ValueError(
                f"{name} attribute should not be set after {type(self).__name__} is "
                "initialized: build a new DataLoader instead."
            )
        super().__setattr__(name, value)

    def __getstate__(self) -> dict[str, Any]:
        """What ``pickle`` and ``copy.deepcopy`` keep: the settings, samplers, dataset and
        epoch count. The epoch in progress (its sampler's iterator), the workers, the
        tuner and the engine's memory are this loader's own: a copy begins at the next
        epoch with its own, as a copy of torch's loader does."""
        state = self.__dict__.copy()
        state.update(_iterator=None, _current=None, _tuner=None, _tuner_key=())
        state["_memory"] = EngineMemory()
        return state

    # -- iteration ----------------------------------------------------------------------

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self) -> Any:
        return self.batch_sampler if self._auto_collation else self.sampler

    def _fetcher_factory(self) -> Callable[[], MapFetcher | IterableFetcher]:
        """Makes a fresh fetcher for one iterator (in the main process or a worker); holds
        the loader's settings, not the loader. A ``collate_fn`` that cannot be called
        raises when the first batch is collated, as torch's does, naming it."""
        collate = self.collate_fn
        if not callable(collate):
            collate = _Unusable("collate_fn", collate)
        if self._iterable:
            return functools.partial(
                IterableFetcher,
                self.dataset,
                self._auto_collation,
                collate,
                self.drop_last,
                self.batch_size,
            )
        return functools.partial(
            MapFetcher, self.dataset, self._auto_collation, collate, bool(self.skip_errors)
        )

    def _skip_cap(self) -> int:
        """How many failing samples an epoch may skip (0: the first one raises)."""
        skip = self.skip_errors
        if not isinstance(skip, float):
            return int(skip)
        try:
            n = len(self.sampler)
        except TypeError:
            n = len(self.dataset)
        return math.floor(skip * n)

    def _resolved_pin_device(self) -> str | None:
        """Where batches are pinned, or None; decided (and warned about) once per loader."""
        if self.pin_memory and not self._pin_checked:
            self._pin_device = pin_device(self.pin_memory_device)
            self._pin_checked = True
        return self._pin_device

    def _tasks(self) -> Iterator[Any]:
        """This epoch's tasks: index batches (int64 arrays on the fast path) or indices.

        An iterable dataset orders itself: its tasks are an endless stream of None.
        """
        return _tasks_of(self.batch_sampler, self._index_sampler, self._iterable)

    def _seed(self) -> int:
        """The loader's base seed, drawn once from ``generator`` (``docs/contract.md``).

        On a torch stream (a ``torch.Generator``, or None with torch imported) it is the
        draw that torch's first iterator makes (see :meth:`_draw_iterator_seed`); asked
        for before that (``state_dict()`` before iterating), it is read ahead without
        moving the stream.
        """
        if self._base_seed is None:
            if _random.torch_stream(self.generator) is not None:
                return _random.peek_seed(self.generator)
            self._base_seed = _random.draw_seed(self.generator)
        return self._base_seed

    def _draw_iterator_seed(self) -> None:
        """Draw from a torch stream what torch's DataLoader draws for each new iterator
        (its workers' base seed), before the sampler draws the epoch, so that torch's
        samplers over the same stream give torch's orders. The first draw is the base
        seed; later ones only keep the stream in step (stoker seeds batches from
        ``(base seed, epoch, batch)``)."""
        if _random.torch_stream(self.generator) is None:
            return
        if self._resume is not None and self._resume.get("in_epoch"):
            return  # the epoch resumed made this draw before its checkpoint
        seed = _random.draw_seed(self.generator)
        if self._base_seed is None:
            self._base_seed = seed

    def _next_number(self) -> int:
        """The number of the epoch :meth:`_start_epoch` begins next."""
        return self._resume["epoch"] if self._resume is not None else self._next_epoch

    def _start_epoch(self) -> Epoch:
        """Begin the next epoch (or the one a loaded state resumes); iterators call it
        through :class:`_Epochs`."""
        number = self._next_number()
        resume, self._resume = self._resume, None
        self._next_epoch = number + 1
        seed = self._seed()
        # The epoch's tasks are drawn from the sampler when the iterator first takes one:
        # at the first next() in process, at iter() with workers (their prefetch), as torch.
        ref: list[weakref.ref[Epoch]] = []  # weak: the epoch holds its tasks
        tasks = _drawn_tasks(self.batch_sampler, self._index_sampler, self._iterable, ref)
        cap = self._skip_cap()
        stream = resume.get("stream") if resume is not None else None
        if resume is None or (stream is None and resume["dataset"] is not None):
            epoch = Epoch(number, seed, tasks, None, skip_cap=cap)  # or it resumes itself
        else:  # a stateful stream's workers resume from their states: nothing fetched again
            at = resume if stream is None else stream
            epoch = Epoch(
                number,
                seed,
                tasks,
                None,
                delivered=at["delivered"],
                delivered_beyond=frozenset(at["delivered_beyond"]),
                refetch=self._iterable and stream is None,
                skipped=resume["skipped"],
                skip_cap=cap,
            )
        epoch.drawn = False
        ref.append(weakref.ref(epoch))
        self._current = epoch
        if self._iterable and self.num_workers != "auto":  # "auto": workers vary, replayed
            epoch.make_stream = functools.partial(
                StreamLog, self._stream_workers(), self.snapshot_every_n_steps
            )
            if stream is not None or is_stateful(self.dataset):
                epoch.stream = epoch.make_stream(stream)
        return epoch

    def _pending_sampler_state(self) -> dict[str, Any] | None:
        """The sampler state that draws the epoch a draw now would (the epoch of an
        iterator not yet drawn from)."""
        pending = getattr(self._index_sampler, "_pending_state", None)
        return pending() if callable(pending) else self._sampler_state()

    def _stream_workers(self) -> int:
        """The worker count a stateful stream's checkpoint names (0: in process; "auto"
        keeps no states: the count it finds may differ on resume)."""
        return -1 if self.num_workers == "auto" else int(self.num_workers)

    def _sampler_state(self) -> dict[str, Any] | None:
        return _state_of(self._index_sampler, self._iterable)

    def state_dict(self) -> dict[str, Any]:
        """A small, JSON-serialisable checkpoint of where iteration stands.

        Taken after any batch, ``load_state_dict`` on a loader over the same dataset resumes
        at the next batch, and the rest of the epoch is bit-identical to an uninterrupted run:
        for map-style datasets with any ``num_workers`` and ``worker_mode``, for iterable
        datasets with the same ``num_workers``. An iterable dataset whose copy in each
        worker, or whose iterator, has ``state_dict`` / ``load_state_dict`` (torchdata's
        ``Stateful``) resumes from its workers' states, as of the last batch delivered (or
        the last multiple of ``snapshot_every_n_steps``: the batches since are fetched
        again); any other is replayed: its delivered batches are fetched again and dropped.
        A sampler without ``state_dict`` (e.g. torch's) is iterated afresh on resume: exact
        only if it gives the same order again.

        To skip ahead or rewind within the epoch, edit ``"delivered"`` before loading.
        """
        cur = self._current
        if self._resume is not None:
            return dict(self._resume)
        if cur is None or cur.finished:
            epoch, delivered, beyond, sampler = self._next_epoch, 0, [], self._sampler_state()
            skipped = 0
        else:
            epoch, delivered, beyond = cur.number, cur.prefix, sorted(cur.beyond)
            # not drawn yet (iter() without a next()): the state that draws it now
            sampler = cur.sampler_state if cur.drawn else self._pending_sampler_state()
            skipped = cur.skipped
        stream = None
        if cur is not None and not cur.finished and cur.stream is not None:
            stream = cur.stream.checkpoint(cur.prefix, cur.beyond)
        poisoned = self._memory.poisoned  # samples that killed workers (worker_restarts)
        return {
            "version": STATE_VERSION,
            "seed": self._seed(),
            "epoch": epoch,
            "delivered": delivered,
            "delivered_beyond": beyond,
            "skipped": skipped,
            "sampler": sampler,
            "dataset": None,
            "in_epoch": cur is not None and not cur.finished,
            "length": self._dataset_length(),
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "stream": stream,
            "world": self._world(),
            "elastic": _stream_state(self.dataset),
            **({"poisoned": sorted(poisoned)} if poisoned else {}),
        }

    def _world(self) -> int | None:
        """The number of ranks this loader's ``DistributedSampler`` (or ``ShardedIterable``
        dataset) shares the data among, or None."""
        for part in (self.dataset, self.sampler, getattr(self.batch_sampler, "sampler", None)):
            if isinstance(part, (DistributedSampler, ShardedIterable)):
                return part.num_replicas
        return None

    def _dataset_length(self) -> int | None:
        """``len(dataset)``, or None for a dataset without one (or an iterable one)."""
        if self._iterable:
            return None
        try:
            return len(self.dataset)
        except TypeError:
            return None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from a :meth:`state_dict`: the next ``iter(loader)`` continues there.

        The whole state is checked against this loader before any of it is applied, so a
        refused state leaves the loader as it was.

        Raises:
            ValueError: the state does not fit this loader: keys, version or counts, or a
                dataset length, ``batch_size``, ``drop_last`` or sampler kind other than
                this loader's (the message names both).
            TypeError: a field has the wrong type.
        """
        sd = check_state(state_dict)
        self._check_fits(sd)
        if sd["dataset"] is not None:  # the one part not validated first: applied first
            self.dataset.load_state_dict(sd["dataset"])
        if sd["sampler"] is not None:
            self._index_sampler.load_state_dict(sd["sampler"])
        stream = _elastic_stream(self.dataset)
        if stream is not None and sd.get("elastic") is not None:
            stream.set_epoch(sd["elastic"]["epoch"])
        self._base_seed = sd["seed"]
        self._memory.poisoned.clear()
        self._memory.poisoned.update(sd.get("poisoned", ()))
        self._resume = sd
        self._current = None

    def _check_fits(self, sd: dict[str, Any]) -> None:
        """Raise ``ValueError`` unless state ``sd`` (checked on its own) fits this loader."""
        fix = "resume with a loader built as the one that saved the state"
        elastic = self._check_elastic_fits(sd)
        for key, mine in (
            ("length", self._dataset_length()),
            ("batch_size", self.batch_size),
            ("drop_last", self.drop_last),
        ):
            if key == "batch_size" and elastic:
                continue  # per rank: the global batch size is checked instead
            if key in sd and sd[key] != mine:
                what = "dataset length" if key == "length" else key
                raise ValueError(
                    f"DataLoader state was saved with {what}={sd[key]!r}, but this loader has "
                    f"{what}={mine!r}: {fix}."
                )
        sampler = sd["sampler"]
        index_sampler = self._index_sampler
        if sampler is not None:
            if not hasattr(index_sampler, "load_state_dict"):
                raise ValueError(
                    f"DataLoader state holds a sampler state of kind {sampler.get('kind')!r}, "
                    f"but this loader's {type(index_sampler).__name__} has no load_state_dict: "
                    "resume with the sampler the state was saved with."
                )
            check_sampler_state(index_sampler, sampler)
        if sd["dataset"] is not None and not callable(
            getattr(self.dataset, "load_state_dict", None)
        ):
            raise ValueError(
                "DataLoader state holds a dataset state, but this loader's dataset "
                f"({type(self.dataset).__name__}) has no load_state_dict: {fix}."
            )
        stream = sd.get("stream")
        if stream is not None:
            self._check_stream_fits(stream, fix)
        if not elastic:
            self._check_world_fits(sd)
        if not self._iterable and sd["delivered"] > len(self):
            raise ValueError(
                f"DataLoader state says {sd['delivered']} batches were delivered, but an "
                f"epoch of this loader has {len(self)}: was it saved with another dataset "
                "or batch size?"
            )

    def _check_elastic_fits(self, sd: dict[str, Any]) -> bool:
        """Whether state ``sd`` is an elastic one for this loader's elastic sampler or
        ``ShardedIterable`` (then the global batch size is checked, not the rank's).

        Raises:
            ValueError: an elastic stream's state that cannot resume here (as an elastic
                sampler's state, which its own check refuses), or one delivered out of
                order on another world size.
        """
        sampler, stream = _elastic_sampler(self.batch_sampler), _elastic_stream(self.dataset)
        part, mid = sd.get("elastic"), bool(sd["delivered"] or sd["delivered_beyond"])
        if sampler is not None:
            saved_world, world = _saved_world(sd["sampler"]), sampler.num_replicas
        elif stream is not None and part is not None:
            if not isinstance(part.get("epoch"), int) or isinstance(part["epoch"], bool):
                raise TypeError(f"DataLoader state['elastic']['epoch'] must be an int: {part!r}.")
            shared = {k: v for k, v in part.items() if k not in ("seed", "epoch")}
            check_elastic(
                "ShardedIterable", shared, stream.elastic_part(), part.get("seed"), stream.seed
            )
            saved_world, world = part["num_replicas"], stream.num_replicas
        elif mid and (part is not None or stream is not None):
            was, now = ("True", "False") if part is not None else ("False", "True")
            raise ValueError(
                f"DataLoader state was saved within an epoch over a ShardedIterable with "
                f"elastic={was}, but this loader's has elastic={now}: the two deal items to "
                f"ranks differently; build it with elastic={was}."
            )
        else:
            return False
        if saved_world is not None and saved_world != world and sd["delivered_beyond"]:
            raise ValueError(
                f"DataLoader state was saved on {saved_world} ranks with batches delivered out "
                f"of order ({sd['delivered_beyond']} beyond the first {sd['delivered']}; "
                "in_order=False), which describe the saving rank's part of those global "
                f"batches only: it cannot resume on {world} ranks; resume on {saved_world} "
                "ranks, or save with in_order=True."
            )
        return saved_world is not None

    def _check_world_fits(self, sd: dict[str, Any]) -> None:
        """Raise ``ValueError`` if state ``sd``, saved within an epoch, was saved on another
        world size than this loader's (and its sampler is not elastic)."""
        saved, mine = sd.get("world"), self._world()
        if saved is None or mine is None or saved == mine:
            return
        if not (sd["delivered"] or sd["delivered_beyond"] or sd.get("stream") is not None):
            return  # at an epoch's end: the next one is dealt out afresh
        what, other = "DistributedSampler", "; DistributedSampler(elastic=True) resumes"
        if self._iterable:
            what, other = "ShardedIterable", "; a map-style dataset with an elastic sampler would"
        raise ValueError(
            f"DataLoader state was saved within an epoch on {saved} ranks, but this loader's "
            f"{what} shares the data among {mine}: the ranks' shares of the rest of that "
            f"epoch differ, so samples would repeat or be missed; resume on {saved} ranks, or "
            f"at an epoch's end{other} on any world size."
        )

    def _check_stream_fits(self, stream: dict[str, Any], fix: str) -> None:
        """Raise ``ValueError`` unless a stateful stream's part fits this loader."""
        if not self._iterable:
            raise ValueError(
                "DataLoader state holds a stateful stream's worker states, but this loader's "
                f"dataset ({type(self.dataset).__name__}) is map-style: {fix}."
            )
        if stream["num_workers"] != self._stream_workers():
            raise ValueError(
                f"DataLoader state holds the states of {stream['num_workers']} workers of a "
                f"stateful stream, but this loader has num_workers={self.num_workers!r}: each "
                "worker resumes its own part of the stream; resume with num_workers="
                f"{stream['num_workers']}."
            )
        if not is_stateful(self.dataset) and any(
            w is not None and w.get("dataset") is not None for w in stream["workers"]
        ):
            raise ValueError(
                "DataLoader state holds a dataset state, but this loader's dataset "
                f"({type(self.dataset).__name__}) has no load_state_dict: {fix}."
            )

    def statistics(self) -> LoaderStatistics:
        """What the current (or last) iterator of this loader did: see :class:`LoaderStatistics`.

        Counting is always on and costs one clock read and a few additions per batch.
        """
        stats = self._memory.stats
        if stats is None:
            snapshot = empty(tuple(self._tuner.decisions) if self._tuner is not None else ())
        else:
            snapshot = stats.snapshot()
        if self._iterable:
            cur = self._current
            stateful = (cur is not None and cur.stream is not None) or (
                is_stateful(self.dataset) and self.num_workers != "auto"
            )
            snapshot = dataclasses.replace(snapshot, resume="state" if stateful else "replay")
        return with_cache(snapshot, self.dataset)

    def _autotuner(self) -> Autotuner | None:
        """The loader's autotuner: when ``num_workers`` or ``prefetch_factor`` is "auto", or
        when a fixed worker count may load in process instead (see
        :func:`~stoker._placement.may_load_in_process`); made again when the settings it
        depends on change (the dataset and sampler cannot)."""
        key = (
            self.num_workers,
            self.prefetch_factor,
            self.worker_mode,
            self.worker_init_fn,
            self.timeout,
            self.collate_fn,
        )
        if key == self._tuner_key:
            return self._tuner
        self._tuner_key = key
        self._tuner = None
        if self.num_workers != 0 and self.worker_mode != "ray":  # nor one with Ray workers
            from stoker._autotune import Autotuner

            auto = "auto" in (self.num_workers, self.prefetch_factor, self.worker_mode)
            in_process = may_load_in_process(
                self.num_workers,
                self._iterable,
                self.worker_init_fn,
                self.timeout,
                self._fetcher_factory()().draws,
            )
            if auto or in_process:
                self._tuner = Autotuner.for_settings(
                    self.num_workers,
                    self.prefetch_factor,
                    self.worker_mode,
                    self._iterable,
                    in_process,
                    batched=self._auto_collation and hasattr(self.dataset, "__getitems__"),
                )
        return self._tuner

    def _engine_config(self, placement: Placement, tuner: Autotuner | None) -> EngineConfig:
        """This loader's settings, resolved, for one iterator (loading at ``placement``) and
        its pool."""
        return EngineConfig(
            make_fetcher=self._fetcher_factory(),
            dataset=self.dataset,
            collate_fn=self.collate_fn,
            num_workers=placement.workers,
            capacity=tuner.capacity if tuner is not None else int(self.num_workers),
            prefetch=tuner.prefetch if tuner is not None else prefetch_of(self.prefetch_factor),
            worker_mode=placement.where,
            context=self.multiprocessing_context,
            timeout=float(self.timeout),
            init_fn=_callable_or_unusable("worker_init_fn", self.worker_init_fn),
            in_order=bool(self.in_order),
            pin_device=self._resolved_pin_device(),
            persistent=bool(self.persistent_workers),
            iterable=self._iterable,
            auto_collation=self._auto_collation,
            skip_errors=bool(self.skip_errors),
            warn_workers=self.num_workers != "auto",
            tuner=tuner,
            probe=tuner is not None and tuner.wants_probe,
            restarts=self.worker_restarts,
            ray_options=self.ray_options,
        )

    def __iter__(self) -> Iterator[Any]:
        index_sampler = self._index_sampler
        if not _iterable(index_sampler):  # torch iterates it here, in iter()
            _Unusable("batch_sampler" if self._auto_collation else "sampler", index_sampler)()
        tuner = self._autotuner()
        epochs = _Epochs(self)
        placement = self._placement(tuner)
        it = self._iterator
        if it is not None and not placement.in_process and placement.where != it.mode:
            it.shutdown()  # worker_mode="auto" chose the other kind
            self._iterator = None
        if placement.in_process:
            from stoker._engine._single import SingleProcessIterator

            # Autotune moved to in process: persistent workers go once the trial is won.
            if self._iterator is not None and not (tuner and tuner.trying_in_process):
                self._iterator.shutdown()
                self._iterator = None
            self._draw_iterator_seed()
            config = self._engine_config(placement, tuner)
            return SingleProcessIterator(config, self._memory, epochs)
        from stoker._engine._multi import MultiWorkerIterator

        self._check_prefetch_factor()
        epoch = None
        if tuner is not None and tuner.first_look and self._iterator is None:
            from stoker._engine._single import SingleProcessIterator

            self._draw_iterator_seed()
            config = self._engine_config(placement, tuner)
            single = SingleProcessIterator(config, self._memory, epochs)
            if tuner.looked(single.first_load_s):
                return single  # its first batch loads faster here than a worker hands it over
            epoch = single.epoch  # the workers take the epoch over
        elif not self.persistent_workers or self._iterator is None or not self._iterator.alive:
            self._draw_iterator_seed()  # torch draws once for persistent workers
        if not self.persistent_workers:
            config = self._engine_config(placement, tuner)
            return MultiWorkerIterator(config, self._memory, epochs, epoch)
        if self._iterator is None or not self._iterator.alive:
            config = self._engine_config(placement, tuner)
            # The loader holds its persistent iterator, which reaches it only weakly: no
            # cycle, so `del loader` stops the workers at once, without the collector.
            self._iterator = MultiWorkerIterator(config, self._memory, _Epochs(self, True), epoch)
        else:
            self._iterator.restart()
        return _PersistentIterator(self._iterator, self)

    def _placement(self, tuner: Autotuner | None) -> Placement:
        """Where the next iterator loads: the tuner's placement (a move it chose takes
        effect here, at an epoch's start), else the fixed settings'."""
        if tuner is not None:
            return tuner.take_placement()
        return Placement.fixed(int(self.num_workers), self.worker_mode)

    def _check_prefetch_factor(self) -> None:
        """Refuse a ``prefetch_factor`` of 0 or a non-integer when workers start, where
        torch refuses them (construction accepts them, as torch's does)."""
        pf = self.prefetch_factor
        if pf == "auto" or isinstance(pf, (int, np.integer)):
            if pf != 0:
                return
            raise ArgumentError(
                "prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter: "
                "each worker must be given at least one batch ahead; pass prefetch_factor >= 1 "
                "(or None for the default, 2)."
            )
        raise TypeError(
            f"'{type(pf).__name__}' object cannot be interpreted as an integer: prefetch_factor "
            f"must be an int >= 1 (or 'auto'), got {pf!r}."
        )

    def __len__(self) -> int:
        if self._iterable:
            n = len(self.dataset)
            if self.batch_size is not None:
                n = n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
            self._iterable_len_reported = n
            return n
        return len(self._index_sampler)

    def _warn_if_iterable_overran(self, yielded: int) -> None:
        """torch's warning when an iterable dataset yields more than ``len()`` said."""
        reported = self._iterable_len_reported
        if reported is not None and yielded > reported:
            # torch's words: "samples" counts what the loader yielded (batches, if batched).
            why = (
                " For multiprocessing data-loading, this could be caused by not properly "
                "configuring the IterableDataset replica at each worker: shard the stream "
                "on get_worker_info() (or use ShardedIterable)."
                if self.num_workers != 0
                else ""
            )
            warnings.warn(
                f"Length of IterableDataset {self.dataset} was reported to be {reported} "
                f"(when accessing len(dataloader)), but {yielded} samples have been "
                f"fetched (the loader's items: batches when batched).{why}",
                UserWarning,
                stacklevel=3,
            )


def _tasks_of(batch_sampler: Any, index_sampler: Any, iterable: bool) -> Iterator[Any]:
    """An epoch's tasks (see ``DataLoader._tasks``); an elastic sampler's batches carry
    their samples' seeds (:class:`~stoker._fetch.PlacedTask`)."""
    if iterable:
        return itertools.repeat(None)
    arrays = batch_arrays(batch_sampler)
    tasks = arrays if arrays is not None else iter(index_sampler)
    elastic = _elastic_sampler(batch_sampler)
    return tasks if elastic is None else placed_tasks(tasks, elastic.sample_seeds)


def _saved_world(state: Any) -> int | None:
    """The world size an elastic sampler's state (within a loader's) was saved on, or None."""
    inner = state.get("sampler") if isinstance(state, dict) else None
    part = inner.get("elastic") if isinstance(inner, dict) else None
    world = part.get("num_replicas") if isinstance(part, dict) else None
    return world if isinstance(world, int) else None


def _elastic_sampler(batch_sampler: Any) -> DistributedSampler | None:
    """The elastic ``DistributedSampler`` that ``batch_sampler`` batches, or None."""
    inner = getattr(batch_sampler, "sampler", None)
    return inner if isinstance(inner, DistributedSampler) and inner.elastic else None


def _elastic_stream(dataset: Any) -> ShardedIterable[Any] | None:
    """``dataset`` if it is an elastic ``ShardedIterable``, else None."""
    return dataset if isinstance(dataset, ShardedIterable) and dataset.elastic else None


def _stream_state(dataset: Any) -> dict[str, Any] | None:
    """An elastic ``ShardedIterable``'s part of the loader's state (its seed and epoch, and
    what a resume must share), or None."""
    stream = _elastic_stream(dataset)
    if stream is None:
        return None
    return {**stream.elastic_part(), "seed": stream.seed, "epoch": stream.epoch}


def _bind_stream(dataset: Any, batch_size: int | None, workers: Any, mode: str) -> None:
    """Tell an elastic ``ShardedIterable`` dataset the batch size it deals items by.

    Raises:
        ValueError: no ``batch_size``, or thread workers (which share the RNGs its items
            are seeded in).
    """
    stream = _elastic_stream(dataset)
    if stream is None:
        return
    if batch_size is None or (workers != 0 and mode != "process"):
        raise ValueError(
            "an elastic ShardedIterable deals items by the loader's batch size and seeds the "
            "global RNGs for each, which thread workers share; got "
            f"batch_size={batch_size!r}, worker_mode={mode!r}: pass a batch_size, and "
            "worker_mode='process' (or num_workers=0)."
        )
    stream.bind_batch_size(batch_size)


def _bind_elastic(sampler: Any, batch_sampler: Any) -> None:
    """Tell an elastic ``DistributedSampler`` the batch size its samples are placed by.

    Raises:
        ValueError: its indices are not batched by stoker's ``BatchSampler`` (the places
            of a batch's samples are known only then).
    """
    inner = _elastic_sampler(batch_sampler)
    if inner is not None and type(batch_sampler).__iter__ is BatchSampler.__iter__:
        inner.bind_batch_size(batch_sampler.batch_size)
    elif inner is not None or (isinstance(sampler, DistributedSampler) and sampler.elastic):
        raise ValueError(
            "an elastic DistributedSampler places each sample of a global batch by the "
            "loader's batch size, but this loader does not batch its indices with stoker's "
            f"BatchSampler (batch_size={getattr(batch_sampler, 'batch_size', None)!r}, "
            f"batch_sampler {type(batch_sampler).__name__}): pass sampler= and a batch_size, "
            "or batch_sampler=stoker.BatchSampler(sampler, batch_size, drop_last)."
        )


def _state_of(index_sampler: Any, iterable: bool) -> dict[str, Any] | None:
    """The index sampler's ``state_dict()``, or None (none, or an iterable dataset)."""
    get = getattr(index_sampler, "state_dict", None)
    return get() if get is not None and not iterable else None


def _drawn_tasks(
    batch_sampler: Any, index_sampler: Any, iterable: bool, epoch: list[weakref.ref[Epoch]]
) -> Iterator[Any]:
    """An epoch's tasks, drawn from the sampler at the first ``next()``; the epoch
    (``epoch[0]``, weakly held: it holds these tasks, and nothing here holds the loader)
    then records the sampler state that draws it again."""
    # That state is read after the draw from stoker's samplers (its seed or torch stream is
    # known only then), unless the epoch is not drawn yet (a subclass's lazy __iter__), and
    # before it from others.
    state = _state_of(index_sampler, iterable)
    tasks = _tasks_of(batch_sampler, index_sampler, iterable)
    first = next(tasks, _NO_TASK)  # the draw (of its first part, on a torch stream)
    drawn = getattr(index_sampler, "_drawn_state", None)
    if callable(drawn) and state is not None and _state_of(index_sampler, iterable) != state:
        state = drawn()
    mine = epoch[0]() if epoch else None
    if mine is not None:
        mine.sampler_state, mine.drawn = state, True
    del mine  # this frame lives as long as the epoch: it must not hold it
    if first is not _NO_TASK:
        yield first
        yield from tasks


def _check_ray(worker_mode: str, num_workers: object, prefetch: object, options: object) -> None:
    """Validate what ``worker_mode="ray"`` needs: a fixed worker count and prefetch (no
    autotune: the tuner measures this machine's CPUs) and ``ray_options`` a dict."""
    if worker_mode == "ray" and ("auto" in (num_workers, prefetch) or num_workers == 0):
        raise ValueError(
            "worker_mode='ray' needs a fixed num_workers >= 1 (the actors to start) and a "
            f"fixed prefetch_factor, got num_workers={num_workers!r}, "
            f"prefetch_factor={prefetch!r}."
        )
    if options is not None and (worker_mode != "ray" or not isinstance(options, dict)):
        raise ValueError(
            "ray_options is a dict of Ray actor options for worker_mode='ray', got "
            f"ray_options={options!r} with worker_mode={worker_mode!r}."
        )


def _check_skip_errors(skip_errors: object) -> None:
    """Validate ``skip_errors``: an int >= 0 or a float in (0, 1)."""
    if isinstance(skip_errors, bool) or not isinstance(
        skip_errors, (int, float, np.integer, np.floating)
    ):
        raise TypeError(
            "skip_errors must be an int >= 0 (how many failing samples an epoch may skip) "
            f"or a float in (0, 1) (what fraction), got {skip_errors!r}."
        )
    if isinstance(skip_errors, (float, np.floating)):
        if not 0 < skip_errors < 1:
            raise ValueError(
                f"skip_errors as a float is a fraction of the epoch's samples and must be in "
                f"(0, 1), got {skip_errors}; pass an int for a count (0 to raise)."
            )
    elif skip_errors < 0:
        raise ValueError(
            f"skip_errors must be >= 0 (0 raises on a failing sample), got {skip_errors}."
        )


class StatefulDataLoader(DataLoader[T_co]):
    """torchdata's ``StatefulDataLoader`` name for :class:`DataLoader`, which is one already
    (``state_dict()`` mid-epoch, ``snapshot_every_n_steps``, the ``Stateful`` protocol); its
    state is stoker's, which torchdata's loader refuses, and the other way round.

    >>> loader = StatefulDataLoader(range(6), batch_size=2, snapshot_every_n_steps=1)
    >>> it = iter(loader); first = next(it); state = loader.state_dict()
    >>> resumed = StatefulDataLoader(range(6), batch_size=2)
    >>> resumed.load_state_dict(state)
    >>> [b.tolist() for b in resumed]
    [[2, 3], [4, 5]]
    """

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """:meth:`DataLoader.load_state_dict`; an empty dict, as in torchdata, changes
        nothing (the next ``iter`` starts where it would have)."""
        if isinstance(state_dict, dict) and not state_dict:
            return
        super().load_state_dict(state_dict)


def _check_worker_restarts(
    restarts: object, num_workers: object, worker_mode: str, iterable: bool
) -> None:
    """Validate ``worker_restarts``: an int >= 0, and where > 0, workers that can be
    replaced (processes of a map-style dataset; see :mod:`stoker._engine._restart`)."""
    if not isinstance(restarts, (int, np.integer)) or isinstance(restarts, bool):
        raise TypeError(
            "worker_restarts must be an int >= 0 (how many dead worker processes an epoch "
            f"may replace), got {restarts!r}."
        )
    if restarts < 0:
        raise ValueError(f"worker_restarts must be >= 0 (0: a dead worker raises), got {restarts}.")
    if not restarts:
        return
    why = None
    if num_workers == 0:
        why = "num_workers=0 loads in the main process: there is no worker to replace"
    elif worker_mode == "thread":
        why = (
            "worker_mode='thread': a thread cannot be killed alone (a crash in one ends the "
            "whole process), so there is nothing to restart"
        )
    elif iterable:
        why = (
            "an IterableDataset's worker holds its place in the stream, which a new worker "
            "cannot take up"
        )
    if why is not None:
        raise ValueError(
            f"worker_restarts={restarts} replaces dead worker processes of a map-style "
            f"dataset, but {why}; pass worker_restarts=0 (worker_mode='auto' may choose "
            "threads: restarts then apply only while processes load)."
        )


def _check_snapshot_every(every: object) -> None:
    """Validate ``snapshot_every_n_steps``: an int >= 0, or None (torchdata's meaning)."""
    if every is None:
        return
    if not isinstance(every, (int, np.integer)) or isinstance(every, bool):
        raise TypeError(
            "snapshot_every_n_steps must be an int >= 1 (keep the workers' states every that "
            f"many batches) or None (never), got {every!r}."
        )
    if every < 0:
        raise ValueError(
            f"snapshot_every_n_steps must be >= 0 (0 or None: never), got {every}; pass 1 to "
            "keep the workers' states with every batch."
        )


_TAKES = {
    "sampler": "an iterable of indices (a Sampler), or None",
    "batch_sampler": "an iterable of lists of indices (a BatchSampler), or None",
    "collate_fn": "a callable that makes a batch of a list of samples, or None",
    "worker_init_fn": "a callable that takes the worker's id, or None",
}


class _Unusable:
    """Stands for an argument of the wrong kind where it is used, so that the error comes
    where torch's does (the first batch, a worker's start), of torch's type, with torch's
    words and then the argument's name and what it takes; picklable for workers."""

    def __init__(self, name: str, value: Any) -> None:
        self.name, self.value = name, value

    def _error(self) -> TypeError:
        what = "iterable" if "sampler" in self.name else "callable"
        return TypeError(
            f"'{type(self.value).__name__}' object is not {what}: {self.name} must be "
            f"{_TAKES[self.name]}, got {self.value!r}."
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._error()

    def __iter__(self) -> Iterator[Any]:
        raise self._error()

    def __len__(self) -> int:
        raise self._error()

    def __bool__(self) -> bool:  # a test of truth is no use of it
        return True


def _callable_or_unusable(name: str, fn: Any) -> Any:
    """``fn`` if it is None or callable, else an :class:`_Unusable` that raises when called."""
    return fn if fn is None or callable(fn) else _Unusable(name, fn)


def _iterable(obj: object) -> bool:
    """Whether ``iter(obj)`` can work (``__iter__``, or the old ``__getitem__`` protocol)."""
    return hasattr(type(obj), "__iter__") or hasattr(type(obj), "__getitem__")


def _check_timeout(timeout: object) -> None:
    """``timeout`` must be a real number (torch's TypeError, naming it)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float, np.integer, np.floating)):
        raise TypeError(
            f"timeout must be a number of seconds >= 0 (0: wait as long as the workers "
            f"live), got {timeout!r} ({type(timeout).__name__})."
        )


def _check_num_workers(num_workers: object) -> None:
    if num_workers == "auto":
        return
    if not isinstance(num_workers, (int, np.integer)) or isinstance(num_workers, bool):
        raise TypeError(f"num_workers must be an int >= 0 or 'auto', got {num_workers!r}.")
    if num_workers < 0:
        raise ValueError(
            "num_workers option should be non-negative; use num_workers=0 to disable "
            f"multiprocessing (got num_workers={num_workers}), or 'auto' to let stoker choose."
        )


class _PersistentIterator:
    """What ``iter(loader)`` hands out with ``persistent_workers``: the loader's one
    iterator, and the loader held for as long as the user holds this.

    The loader keeps its persistent iterator between epochs, and that iterator reaches the
    loader only through a weak reference; the strong one is here, outside the loader. So
    no reference cycle holds the workers: they stop when the loader and every handle are
    gone, as torch's do, not when the cyclic collector runs."""

    __slots__ = ("_iterator", "_loader")

    def __init__(self, iterator: MultiWorkerIterator, loader: DataLoader[Any]) -> None:
        self._iterator, self._loader = iterator, loader

    def __iter__(self) -> _PersistentIterator:
        return self

    def __next__(self) -> Any:
        return self._iterator.__next__()

    def __len__(self) -> int:
        return len(self._iterator)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._iterator, name)


class _Epochs:
    """A loader's side of :class:`~stoker._engine._config.Epochs`: how its iterators begin
    its epochs and report what the user saw. ``weak``: for the iterator the loader keeps
    (persistent workers), which must not keep the loader alive."""

    def __init__(self, loader: DataLoader[Any], weak: bool = False) -> None:
        self._ref = weakref.ref(loader) if weak else None
        self._strong = None if weak else loader

    @property
    def _loader(self) -> DataLoader[Any]:
        loader = self._strong if self._ref is None else self._ref()
        if loader is None:
            raise ReferenceError("the DataLoader of this iterator was deleted")
        return loader

    def start(self) -> Epoch:
        return self._loader._start_epoch()

    def next_number(self) -> int:
        return self._loader._next_number()

    def base_seed(self) -> int:
        return self._loader._seed()

    def length(self) -> int:
        return len(self._loader)

    def delivered(self, yielded: int) -> None:
        self._loader._warn_if_iterable_overran(yielded)
