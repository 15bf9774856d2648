"""get_worker_info(): which worker the calling code runs in, as torch.utils.data reports it.

Process workers set it once for the whole process; thread workers set it for their own
thread, so datasets can shard themselves in either mode.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker knows about itself.

    Attributes:
        id: the worker's index in ``range(num_workers)``.
        num_workers: how many workers the loader runs.
        seed: the worker's base seed (the loader's base seed + ``id``).
        dataset: the worker's copy of the dataset (the same object in thread mode).

    >>> class Which(Dataset):
    ...     def __len__(self):
    ...         return 4
    ...     def __getitem__(self, i):
    ...         info = get_worker_info()
    ...         return f"worker {info.id} of {info.num_workers}"
    >>> loader = DataLoader(Which(), batch_size=None, num_workers=2, worker_mode="thread")
    >>> sorted(set(loader))
    ['worker 0 of 2', 'worker 1 of 2']
    >>> get_worker_info() is None  # in the main process
    True
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any


_thread_local = threading.local()
_process_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """The calling worker's :class:`WorkerInfo`, or None in the main process.

    >>> get_worker_info() is None
    True
    """
    info: WorkerInfo | None = getattr(_thread_local, "info", None)
    return info if info is not None else _process_info


def set_worker_info(info: WorkerInfo | None, *, whole_process: bool) -> None:
    """Record ``info`` for the calling thread, or for the whole (worker) process."""
    global _process_info
    if whole_process:
        _process_info = info
    else:
        _thread_local.info = info
