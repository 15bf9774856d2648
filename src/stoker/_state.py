"""Loader checkpoints: how far an epoch has come, and the small state that resumes it.

Batch ``k`` of epoch ``e`` is computed from (seed, e, k) alone, so a checkpoint is a
handful of counters, JSON-serialisable, with no data and no RNG dumps::

    {"version": 1, "seed": 123, "epoch": 4, "delivered": 17, "delivered_beyond": [],
     "skipped": 0, "sampler": {...}, "dataset": None, "in_epoch": True, "length": 1000,
     "batch_size": 8, "drop_last": False}

``delivered`` counts the batches of ``epoch`` handed to the loop (``delivered_beyond``:
those delivered ahead of that prefix with ``in_order=False``); they are skipped without
being fetched on resume. ``sampler`` is the batch sampler's state that draws the epoch
again (on a torch stream, the generator's state before its draw, as base64). ``length``,
``batch_size`` and ``drop_last`` describe the saving loader; one that differs refuses the
state. ``skipped`` counts samples left out by ``skip_errors``, so the cap holds across a
resume. ``stream``: stateful streams' worker states; ``world``: ranks.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from stoker._policy import INDICES_SHOWN
from stoker._stateful import STREAM_KEYS, StreamLog

_logger = logging.getLogger(__name__)

STATE_VERSION = 1
_KEYS = (
    "version",
    "seed",
    "epoch",
    "delivered",
    "delivered_beyond",
    "skipped",
    "sampler",
    "dataset",
)
_CHECKED_KEYS = (
    "in_epoch", "length", "batch_size", "drop_last", "stream", "world", "elastic", "poisoned"
)
"""Keys absent from older states: whether it was saved within an epoch (whose iterator
had made its draws), what describes the loader that saved it, a stateful stream's
workers' states, the world size its ``DistributedSampler`` or ``ShardedIterable`` shared
the data among (None: neither), an elastic ``ShardedIterable``'s seed, epoch, global
batch size and world size (None: none), and the samples that killed every worker that
loaded them (present only where some did: ``worker_restarts`` with ``skip_errors``)."""


_TORCHDATA_KEYS = ("_snapshot", "_num_yielded", "_sampler_iter_yielded", "_iterator_finished")
"""Keys of torchdata's ``StatefulDataLoader`` states (in process, and with workers)."""


class Epoch:
    """One epoch as an iterator runs it, and which of its batches reached the user.

    Made by ``DataLoader._start_epoch`` in the thread that iterates; the iterator takes
    ``(k, task)`` pairs from :attr:`tasks` (``k`` the batch index within the epoch, which
    with the seed and epoch number fixes the batch's augmentations), runs them, and asks
    :meth:`deliver` before handing each batch out.

    Resuming skips the batches delivered before the checkpoint: map-style tasks are not
    fetched; a replayed stream's are, and :meth:`deliver` drops them.

    Attributes:
        number: the epoch ``e``.
        seed: the loader's base seed.
        tasks: ``(k, task)`` pairs still to run.
        sampler_state: the batch sampler's state that draws this epoch again, or None
            (set when ``drawn``: at the first task).
        skipped: samples of this epoch's delivered batches skipped as failing to load.
        skip_cap: how many may be skipped (0: none, a failing sample raises).
        stream: a stateful stream's workers' states, or None.
    """

    stream: StreamLog | None = None
    make_stream: Callable[[Mapping[str, Any] | None], StreamLog] | None = None

    def __init__(
        self,
        number: int,
        seed: int,
        tasks: Iterator[Any],
        sampler_state: dict[str, Any] | None,
        *,
        delivered: int = 0,
        delivered_beyond: frozenset[int] = frozenset(),
        refetch: bool = False,
        skipped: int = 0,
        skip_cap: int = 0,
    ) -> None:
        self.number = number
        self.seed = seed
        self.sampler_state = sampler_state
        self.drawn = True  # whether the sampler drew the epoch (the loader draws lazily)
        self.prefix = delivered
        self.beyond = set(delivered_beyond)
        self.finished = False
        self.skipped = skipped
        self.skip_cap = skip_cap
        self._failed: list[Any] = []
        self._first_error = ""
        numbered: Iterator[tuple[int, Any]] = enumerate(tasks)
        if not refetch and (delivered or delivered_beyond):
            numbered = itertools.islice(numbered, delivered, None)
            if delivered_beyond:
                numbered = ((k, t) for k, t in numbered if k not in delivered_beyond)
        self.tasks: Iterator[tuple[int, Any]] = numbered

    def deliver(self, k: int) -> bool:
        """Record that batch ``k`` reaches the user; False if it did before a checkpoint."""
        if k < self.prefix or k in self.beyond:
            return False
        if k != self.prefix:
            self.beyond.add(k)
        else:
            self.prefix += 1
            while self.prefix in self.beyond:
                self.beyond.remove(self.prefix)
                self.prefix += 1
        if self.stream is not None:  # False while it replays the batches since a snapshot
            return self.stream.seen(k, self.prefix, self.beyond)
        return True

    def skip(self, k: int, record: tuple[list[Any], str, bool]) -> None:
        """Count the samples batch ``k`` skipped (a fetcher's ``take_skipped()`` record).

        Called when the batch's turn comes, so the count (and where the cap is exceeded)
        does not depend on which worker loaded what, or when.

        Raises:
            RuntimeError: more samples failed this epoch than ``skip_cap`` allows.
        """
        failed, error, dropped = record
        self.skipped += len(failed)
        if not self._first_error:
            self._first_error = error
        self._failed.extend(failed[: INDICES_SHOWN - len(self._failed)])
        _logger.warning(
            "DataLoader skipped %d sample(s) of batch %d of epoch %d that failed to load%s: "
            "indices %s; first error: %s (%d skipped this epoch, at most %d allowed).",
            len(failed),
            k,
            self.number,
            " (the whole batch is dropped)" if dropped else "",
            failed[:INDICES_SHOWN],
            error,
            self.skipped,
            self.skip_cap,
        )
        if self.skipped > self.skip_cap:
            raise RuntimeError(
                f"{self.skipped} samples of epoch {self.number} failed to load, more than the "
                f"{self.skip_cap} that skip_errors allows; first failing indices "
                f"{self._failed}, first error: {self._first_error}. Fix the data (or the "
                "dataset's __getitem__), or raise skip_errors."
            )

    def finish(self) -> None:
        """Record that every batch of the epoch was delivered."""
        self.finished = True


def check_state(sd: object) -> dict[str, Any]:
    """Validate a loader state on its own (not against a loader); returns it as a dict.

    Raises:
        TypeError: ``sd`` is not a mapping, or a field has the wrong type.
        ValueError: keys are missing or unknown, the version differs, or a count is
            negative.
    """
    if not isinstance(sd, Mapping):
        raise TypeError(
            f"load_state_dict expects the dict returned by DataLoader.state_dict(), got "
            f"{type(sd).__name__}."
        )
    _refuse_torchdata(sd)
    missing = [k for k in _KEYS if k not in sd]
    unknown = sorted(set(sd) - set(_KEYS) - set(_CHECKED_KEYS))
    if missing or unknown:
        raise ValueError(
            f"DataLoader state must have exactly the keys {[*_KEYS, *_CHECKED_KEYS]}; "
            f"missing {missing}, unknown {unknown}. Pass the dict that DataLoader.state_dict() "
            "returned."
        )
    if sd["version"] != STATE_VERSION:
        raise ValueError(
            f"DataLoader state has version {sd['version']!r}, this stoker reads version "
            f"{STATE_VERSION}: resume with the stoker release that saved it."
        )
    for key in ("seed", "epoch", "delivered", "skipped"):
        value = sd[key]
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"DataLoader state field {key!r} must be an int, got {value!r}.")
        if value < 0:
            raise ValueError(f"DataLoader state field {key!r} must be >= 0, got {value}.")
    beyond = sd["delivered_beyond"]
    if not isinstance(beyond, (list, tuple)) or not all(
        isinstance(k, int) and k > sd["delivered"] for k in beyond
    ):
        raise ValueError(
            "DataLoader state field 'delivered_beyond' must be a list of batch indices "
            f"greater than delivered={sd['delivered']}, got {beyond!r}."
        )
    for key in ("length", "batch_size", "world"):
        value = sd.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise TypeError(
                f"DataLoader state field {key!r} must be an int or None, got {value!r}."
            )
    for key in ("in_epoch", "drop_last"):
        if not isinstance(sd.get(key, False), bool):
            raise TypeError(f"DataLoader state field {key!r} must be a bool, got {sd[key]!r}.")
    for key in ("sampler", "elastic"):
        if sd.get(key) is not None and not isinstance(sd[key], Mapping):
            raise TypeError(
                f"DataLoader state field {key!r} must be a dict or None, got "
                f"{type(sd[key]).__name__}."
            )
    _check_stream(sd.get("stream"))
    _check_poisoned(sd.get("poisoned", []))
    return dict(sd)


def _refuse_torchdata(sd: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` for a state of torchdata's ``StatefulDataLoader``."""
    if any(k in sd for k in _TORCHDATA_KEYS):
        raise ValueError(
            "DataLoader state is torchdata's (a StatefulDataLoader's, with keys "
            f"{sorted(k for k in sd if k in _TORCHDATA_KEYS)}), not stoker's: stoker cannot "
            "resume from it. Resume with the loader that saved it, or save the state with "
            "stoker's DataLoader (stoker.torch.StatefulDataLoader is one)."
        )


def _check_poisoned(poisoned: object) -> None:
    """Validate a state's ``"poisoned"`` part: sample indices (see ``_CHECKED_KEYS``)."""
    if not isinstance(poisoned, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in poisoned
    ):
        raise ValueError(
            "DataLoader state field 'poisoned' must be a list of sample indices (ints >= 0), "
            f"got {poisoned!r}: pass the dict DataLoader.state_dict() returned."
        )


def _check_stream(stream: object) -> None:
    """Validate a state's ``"stream"`` part (None: no stateful stream)."""
    if stream is None:
        return
    if not isinstance(stream, Mapping) or set(stream) != set(STREAM_KEYS):
        found = sorted(stream) if isinstance(stream, Mapping) else type(stream).__name__
        raise ValueError(
            f"DataLoader state field 'stream' must be None or a dict with exactly the keys "
            f"{list(STREAM_KEYS)}, got {found}: pass the dict DataLoader.state_dict() returned."
        )
    for key in ("num_workers", "every", "step", "replay", "next_worker", "delivered"):
        value = stream[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(
                f"DataLoader state field stream[{key!r}] must be an int >= 0, got {value!r}."
            )
    workers = stream["workers"]
    if not isinstance(workers, (list, tuple)) or len(workers) != max(1, stream["num_workers"]):
        raise ValueError(
            "DataLoader state field stream['workers'] must hold one state per worker "
            f"({max(1, stream['num_workers'])}), got {workers!r}."
        )
    if not all(w is None or isinstance(w, Mapping) for w in workers):
        raise TypeError("DataLoader state field stream['workers'] must hold dicts or None.")
