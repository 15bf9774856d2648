"""torchdata's ``Stateful`` protocol for iterable datasets: resume a stream without replay.

An object is *stateful* when it has ``state_dict()`` and ``load_state_dict()``. Where an
iterable dataset (each worker's copy) or the iterator its ``__iter__`` returns is, each
worker's state travels with the batches it sends; the loader keeps the states as of the
last delivered batch (a :class:`StreamLog`), and a resumed epoch hands each worker its
own back, so no sample before the checkpoint is produced again. Without the protocol the
loader replays the stream (:mod:`stoker._state`).

A worker's state is ``{"dataset": ..., "iterator": ...}``, each part the object's own
``state_dict()`` or None. ``snapshot_every_n_steps=N`` keeps the states at the last multiple
of ``N`` delivered batches, and the batches since are fetched again on resume, as in
torchdata's ``StatefulDataLoader``. Pure bookkeeping: no processes, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

STREAM_KEYS = (
    "num_workers",
    "every",
    "step",
    "replay",
    "next_worker",
    "delivered",
    "delivered_beyond",
    "workers",
)


def is_stateful(obj: object) -> bool:
    """Whether ``obj`` follows the protocol: it has ``state_dict`` and ``load_state_dict``."""
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def take_state(dataset: Any, iterator: Any) -> dict[str, Any]:
    """A worker's state: its dataset copy's and its iterator's (see the module docstring)."""
    own = iterator is dataset
    return {
        "dataset": dataset.state_dict() if not own and is_stateful(dataset) else None,
        "iterator": iterator.state_dict() if is_stateful(iterator) else None,
    }


def resumed_iterator(dataset: Any, state: Mapping[str, Any] | None) -> Iterator[Any]:
    """``iter(dataset)`` where ``state`` (a :func:`take_state`, or None) left off: the
    dataset's part loaded before ``iter``, the iterator's into what ``iter`` returns."""
    if state is not None and state.get("dataset") is not None:
        dataset.load_state_dict(state["dataset"])
    it: Iterator[Any] = iter(dataset)
    if state is not None and state.get("iterator") is not None:
        load = getattr(it, "load_state_dict", None)
        if not callable(load):
            raise ValueError(
                "DataLoader state holds a state for the iterator of "
                f"{type(dataset).__name__}.__iter__, but the iterator it returned "
                f"({type(it).__name__}) has no load_state_dict: resume with the dataset "
                "the state was saved with."
            )
        load(state["iterator"])
    return it


class StreamTask(NamedTuple):
    """What a stateful stream's task tells its worker: whether to send its state after
    this batch (``snapshot``; not when ``snapshot_every_n_steps`` is far), and, on a
    resumed worker's first task of the epoch, to start from ``state`` (``resumes``; a
    None state: start afresh)."""

    snapshot: bool
    resumes: bool = False
    state: dict[str, Any] | None = None


SNAPSHOT = StreamTask(snapshot=True)
"""A task after which the worker sends its state."""
NO_SNAPSHOT = StreamTask(snapshot=False)
"""A task after which no state is needed."""


class _Snapshot(NamedTuple):
    """The stream as of delivered batch ``step``: worker ``last`` delivered it."""

    step: int
    last: int
    states: list[Any]
    delivered: int
    beyond: list[int]


_NO_STATE = object()


class StreamLog:
    """One epoch's stateful stream, in the main process (module docstring).

    The dispatcher asks :meth:`task` for each task it sends (the resume states go out
    with each worker's first), books each worker's answer with :meth:`answered` and its
    state with :meth:`arrived`; ``Epoch.deliver`` calls :meth:`seen` as each batch reaches
    the user (or is dropped as replayed). In the main process (``num_workers=0``),
    ``live`` reads the one state when a checkpoint is taken.

    Args:
        workers: the loader's worker count (0: in process).
        every: ``snapshot_every_n_steps`` (None or 0: only the epoch's start).
        resume: the ``"stream"`` part of a checkpoint this epoch resumes, or None.
    """

    def __init__(self, workers: int, every: int | None, resume: Mapping[str, Any] | None) -> None:
        self.workers = workers
        self.every = every or 0
        n = max(1, workers)
        self.live: Any = None
        if resume is None:
            self._snap = _Snapshot(0, -1, [None] * n, 0, [])
            self.replay = 0
        else:
            last = (int(resume["next_worker"]) - 1) % n
            self._snap = _Snapshot(
                int(resume["step"]),
                last,
                list(resume["workers"]),
                int(resume["delivered"]),
                sorted(resume["delivered_beyond"]),
            )
            self.replay = int(resume["replay"])
        self.step, self.last = self._snap.step, self._snap.last
        self.states = list(self._snap.states)
        self._handover: list[Any] = list(self._snap.states) if resume is not None else []
        self._owner: dict[int, int] = {}  # batch k -> its worker, answered, not yet seen
        self._pending: dict[int, Any] = {}  # batch k -> its worker's state after it
        self._stale: set[int] = set()  # workers whose last seen batch came without state

    @property
    def next_worker(self) -> int:
        """The worker whose batch comes after the last one delivered (round robin)."""
        return (self.last + 1) % max(1, self.workers)

    @property
    def handover(self) -> list[Any]:
        """Each worker's state to resume from, if this epoch resumes (else empty)."""
        return self._handover

    def task(self, wid: int, k: int) -> StreamTask:
        """What batch ``k``'s task tells worker ``wid``."""
        wants = self._wants(k)
        if wid < len(self._handover) and self._handover[wid] is not _NO_STATE:
            state, self._handover[wid] = self._handover[wid], _NO_STATE
            return StreamTask(snapshot=wants, resumes=True, state=state)
        return SNAPSHOT if wants else NO_SNAPSHOT

    def _wants(self, k: int) -> bool:
        """Whether batch ``k`` may be a worker's last before a snapshot step (exact where
        no worker ran out of data; else a snapshot may lack a state and is not taken,
        and the one before it stands: more to replay, never a wrong resume)."""
        every = self.every
        if every <= max(1, self.workers):
            return every > 0
        return (k + 1) % every == 0 or every - (k % every) <= self.workers

    def answered(self, k: int, wid: int) -> None:
        """Worker ``wid`` sent batch ``k``."""
        self._owner[k] = wid

    def arrived(self, k: int, state: Any) -> None:
        """The state of batch ``k``'s worker after it (sent before the batch)."""
        self._pending[k] = state

    def seen(self, k: int, delivered: int, beyond: set[int]) -> bool:
        """Batch ``k`` reaches the user (``delivered``, ``beyond``: the epoch's record after
        it); False while it is one the resume fetches again to drop (replay)."""
        wid = self._owner.pop(k, -1)
        state = self._pending.pop(k, _NO_STATE)
        if wid < 0:  # a batch that raised: its worker's state is unknown from here
            self._stale.add(-1)
        elif state is _NO_STATE:
            self._stale.add(wid)
        else:
            self.states[wid] = state
            self._stale.discard(wid)
        self.last = max(wid, 0)
        self.step += 1
        if self.every and self.step % self.every == 0 and not self._stale:
            states = list(self.states)
            self._snap = _Snapshot(self.step, self.last, states, delivered, sorted(beyond))
        if self.replay:
            self.replay -= 1
            return False
        return True

    def checkpoint(self, delivered: int, beyond: set[int]) -> dict[str, Any]:
        """The ``"stream"`` part of ``state_dict()``: the last snapshot and the batches
        delivered since it (``replay``); in process, the state now (the epoch's record:
        ``delivered``, ``beyond``)."""
        snap = self._snap
        if self.live is not None:
            snap = _Snapshot(self.step, 0, [self.live()], delivered, sorted(beyond))
        return {
            "num_workers": self.workers,
            "every": self.every,
            "step": snap.step,
            "replay": self.step - snap.step + self.replay,
            "next_worker": (snap.last + 1) % max(1, self.workers),
            "delivered": snap.delivered,
            "delivered_beyond": snap.beyond,
            "workers": snap.states,
        }
