"""stoker's exceptions. Each subclasses the builtin a user would already catch::

    RuntimeError
    ├── WorkerError          a worker process or thread failed (died, timed out, crashed)
    │   └── SharedMemoryError   /dev/shm cannot hold what the loader needs
    ├── CollateError         samples whose shapes or lengths differ (names the field path)
    └── WeightsError         (also a ValueError) sampling weights that cannot be drawn from
    AssertionError           arguments that torch checks with an assertion:
    ├── ArgumentError        (also a ValueError) a bad value
    └── ArgumentTypeError    (also a TypeError) a dataset of the wrong kind

Collate raises plain ``TypeError`` for a type it cannot batch, as torch does.

Exceptions raised by user code inside a worker keep their own type in the main process; the
worker's traceback, id and sample indices are attached as a note.
"""

from __future__ import annotations

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "CollateError",
    "SharedMemoryError",
    "WeightsError",
    "WorkerError",
]


class WorkerError(RuntimeError):
    """A worker failed: it died, stopped answering within ``timeout``, or could not start."""


class SharedMemoryError(WorkerError):
    """Shared memory (``/dev/shm``) is too small for the batches in flight."""


class CollateError(RuntimeError):
    """Samples of a batch differ in shape or length; the message names the field path.

    A ``RuntimeError``, as torch raises for the same batches.
    """


class WeightsError(RuntimeError, ValueError):
    """``WeightedRandomSampler`` weights that cannot be drawn from (negative, not finite,
    all zero, too few): raised when an epoch is drawn.

    A ``RuntimeError``, as torch's ``multinomial`` raises then, and a ``ValueError``, which
    it is.
    """


class ArgumentError(ValueError, AssertionError):
    """A bad argument that torch rejects with an ``AssertionError`` (e.g. ``TensorDataset``
    over tensors of different lengths): a ``ValueError`` too, which it is.
    """


class ArgumentTypeError(TypeError, AssertionError):
    """An argument of the wrong kind that torch rejects with an ``AssertionError`` (e.g. an
    ``IterableDataset`` inside ``ConcatDataset``): a ``TypeError`` too, which it is.
    """
