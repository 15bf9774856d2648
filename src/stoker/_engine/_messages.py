"""The messages between the iterator, its pool and the workers, one type each.

Main process -> worker: :class:`Work` (tasks and freed slots, one message per worker per
refill), ``None`` (stop), and, between thread workers only, :class:`Help`. Worker -> pool:
:class:`Ready`, :class:`Inited`, :class:`StartFailed` and :class:`Bye` about the worker's
life; :class:`Shipped` (process workers: a batch, or a group, in shared memory),
:class:`Exhausted` and :class:`Failed` about tasks, :class:`Probe` about a first batch's
samples (autotune), :class:`Snapshot` (a stateful iterable dataset's state, before its
batch). The pool hands the iterator decoded values: :class:`Loaded` /
:class:`LoadedGroup` (a thread worker sends these itself),
:class:`Exhausted`, :class:`Failed`, :class:`Ready` and :class:`StartFailed`; the iterator
never sees a wire form. NamedTuples: they pickle almost as fast as plain tuples, and a
message is read by field name, never by position.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from stoker._engine._errors import RemoteError
    from stoker._fetch import Skipped
    from stoker._stateful import StreamTask


class BatchSeed(NamedTuple):
    """A map-style batch's task (or a part of one, split at an epoch's tail): the global
    RNGs are seeded from ``seed``, mixed from (the loader's seed, epoch, batch number),
    before it loads, so no worker count or mode changes it."""

    seed: int


class GroupSeeds(NamedTuple):
    """A group of tiny batches' task (task indices ``idx``, ``idx + 1``, ...): batch
    ``ks[j]`` is seeded from (``base``, ``epoch``, ``ks[j]``), as it would be alone."""

    base: int
    epoch: int
    ks: list[int]


class StreamSeed(NamedTuple):
    """An iterable dataset's task: its worker's seed for the epoch, from which the worker
    seeds itself once, at the epoch's first task (see ``worker_seed``), and, for a
    stateful stream, when to send its state and where to resume (``stream``; None: not
    stateful)."""

    seed: int
    stream: StreamTask | None = None


TaskSeed = BatchSeed | GroupSeeds | StreamSeed
"""How a task is seeded, one record a kind; the worker loads each kind its own way (one
table: ``stoker._engine._worker.KINDS``)."""


class Task(NamedTuple):
    """One task (a batch, or a group of tiny batches) for a worker, inside :class:`Work`.

    ``task``: sample indices (the sampler's), or for a group the list of each batch's;
    ``seed``: how it is seeded (:data:`TaskSeed`); ``packing``: how ``task`` crossed the
    pipe (see :func:`~stoker._engine._pipe.pack_tasks`), None once unpacked.
    """

    generation: int
    idx: int
    task: Any
    seed: TaskSeed
    packing: str | tuple[str, str | None] | None = None


class Work(NamedTuple):
    """Sent by the pool to one worker when the iterator refills its window (``tasks``), or
    when big slots' batches died (``freed``: their slot ids, free to write again). The one
    way freed slots go home; a worker not started yet gets its messages as it starts."""

    tasks: list[tuple[Any, ...]]  # Tasks packed as plain tuples for the pipe (pack_tasks)
    freed: list[int]


class SharedJob(Protocol):
    """What a helping thread does with a slow batch's job (``stoker._engine._split.Job``,
    whose module puts :class:`Help`: no import back)."""

    def work(self) -> None:
        """Load samples of the job until none is left to take."""


class Help(NamedTuple):
    """Put by a thread worker loading a slow batch into an idle thread's inbox: take
    samples of ``job`` (see :mod:`stoker._engine._split`)."""

    job: SharedJob


class Ready(NamedTuple):
    """Sent by a worker once it is up (imports, seeding done); ``timeout`` counts from it.
    Next it runs ``worker_init_fn``, if any."""


class Inited(NamedTuple):
    """Sent by a worker when its ``worker_init_fn`` returned (the pool notes it)."""


class StartFailed(NamedTuple):
    """Sent by a worker whose start-up or ``worker_init_fn`` raised an ``Exception``; the
    iterator raises ``error`` rebuilt."""

    error: RemoteError


class Bye(NamedTuple):
    """A worker's last message (the pool notes it): its slots are closed and it exits.

    ``kept``: (name, size) of slots for the main process to keep (those it never saw, or,
    from a worker ending early, those it may not have mapped yet); None from a thread.
    ``why``: None, or from a worker ending early (``sys.exit()`` in the dataset) what ended
    it and its exit code (None for a thread).
    """

    kept: list[tuple[str, int]] | None
    why: tuple[str, int | None] | None


class Shipped(NamedTuple):
    """Sent by a process worker for a loaded batch: its leaves in slot ``slot`` (id, name,
    size; None when it has no array), its structure in ``payload`` (see
    :func:`~stoker._engine._transport.encode`). ``retired``: segments the worker unlinked
    (unmap them); ``busy``: fetch + collate seconds; ``skipped``: None, or the samples left
    out with ``skip_errors``; ``untouched``: for a slow batch, whether the global RNGs were
    left alone, else None. With ``group``, a group of tiny batches (task indices ``idx``,
    ``idx + 1``, ...) in one slot: the payload the list of batches (a
    :class:`~stoker._engine._errors.RemoteError` in place of each that raised),
    ``skipped`` None or a list. The pool decodes it into :class:`Loaded` or
    :class:`LoadedGroup`."""

    generation: int
    idx: int
    slot: tuple[int, str, int] | None
    payload: Any  # the batch's structure (bytes), or in this process the batch itself
    retired: list[str]
    busy: float
    skipped: Skipped | list[Skipped | None] | None
    untouched: bool | None
    group: bool = False


class Loaded(NamedTuple):
    """A batch ready for the iterator: decoded by the pool, or put by a thread worker."""

    generation: int
    idx: int
    batch: Any
    busy: float
    skipped: Skipped | None
    untouched: bool | None


class LoadedGroup(NamedTuple):
    """The batches of a group, decoded by the pool (see :class:`Shipped`)."""

    generation: int
    idx: int
    batches: list[Any]
    busy: float
    skipped: list[Skipped | None] | None


class Probe(NamedTuple):
    """Sent by a worker asked to (autotune) after the first samples of its first batch of
    an epoch, before the batch is done (see :mod:`stoker._engine._probe`). ``wall`` and
    ``cpu``: the first sample's seconds on its thread (a whole batch's per sample, with
    ``samples`` its length, where samples load together); ``rest_wall``, ``rest_cpu``: the
    mean of the ``samples - 1`` after it, loaded on ``threads`` threads side by side;
    ``batch_len``: samples in the batch; ``nbytes``: the first sample's bytes (0: unknown)."""

    generation: int
    samples: int
    wall: float
    cpu: float
    rest_wall: float
    rest_cpu: float
    threads: int
    batch_len: int
    nbytes: int


class Snapshot(NamedTuple):
    """Sent by a worker of a stateful iterable dataset before task ``idx``'s batch: the
    state of its dataset copy and iterator after it (see :mod:`stoker._stateful`)."""

    generation: int
    idx: int
    state: Any


class Restarted(NamedTuple):
    """Handed by a process pool to its iterator once a dead worker was replaced
    (``worker_restarts``): its start counts again (``timeout``). ``cause``: as in
    ``statistics().worker_restarts``."""

    cause: str


class Exhausted(NamedTuple):
    """Sent by a worker of an iterable dataset that has no more data this epoch."""

    generation: int
    idx: int


class Failed(NamedTuple):
    """Sent by a worker whose task raised; the iterator raises ``error`` at its turn."""

    generation: int
    idx: int
    error: RemoteError


FromWorker = Ready | Inited | StartFailed | Bye | Shipped | Exhausted | Failed | Probe | Snapshot
"""What a process worker sends (a thread worker sends :class:`Loaded` for Shipped)."""
# fmt: off
ToIterator = (
    Ready | StartFailed | Loaded | LoadedGroup | Exhausted | Failed | Probe | Snapshot | Restarted
)
# fmt: on
"""What a pool hands the iterator."""
LIFE = (Ready, Inited, Bye)
"""Messages about a worker's life, noted by its pool (only Ready is passed on)."""

_WIRE: tuple[type[tuple[Any, ...]], ...] = (
    Shipped, Work, Exhausted, Failed, Ready, Inited, StartFailed, Bye, Probe, Snapshot,
)  # fmt: skip
_CODE = {kind: code for code, kind in enumerate(_WIRE)}
_new = tuple.__new__


def to_wire(msg: Any) -> Any:
    """A message as it is pickled for a pipe: a plain tuple of its type's code and its
    fields (a NamedTuple costs more to pickle and unpickle); None as it is.

    >>> from_wire(to_wire(Exhausted(3, 7))), from_wire(to_wire(None))
    (Exhausted(generation=3, idx=7), None)
    """
    return None if msg is None else (_CODE[type(msg)], *msg)


def from_wire(raw: Any) -> Any:
    """The message of a :func:`to_wire` tuple."""
    return None if raw is None else _new(_WIRE[raw[0]], raw[1:])


_SEEDS: tuple[type[tuple[Any, ...]], ...] = (BatchSeed, GroupSeeds, StreamSeed)
_SEED_CODE = {kind: code for code, kind in enumerate(_SEEDS)}


def seed_to_wire(seed: TaskSeed) -> tuple[Any, ...]:
    """A task's seed as a plain tuple of its kind's code and its fields (a NamedTuple
    costs twice as much to pickle, per task).

    >>> seed_from_wire(seed_to_wire(GroupSeeds(1, 2, [3])))
    GroupSeeds(base=1, epoch=2, ks=[3])
    """
    return (_SEED_CODE[type(seed)], *seed)


def seed_from_wire(raw: tuple[Any, ...]) -> TaskSeed:
    """The seed of a :func:`seed_to_wire` tuple."""
    return _new(_SEEDS[raw[0]], raw[1:])  # type: ignore[no-any-return]
