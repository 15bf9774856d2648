"""get_worker_info(): which worker the calling code runs in, as torch.utils.data reports it.

Process workers set it once for the whole process; thread workers set it for their own
thread, so datasets can shard themselves in either mode. torch's own
``torch.utils.data.get_worker_info()`` answers in both too: a process worker sets torch's
module global (``_engine._worker``); for threads, torch's function is given a body that
reads this thread's answer first (see :func:`_answer_torch_in_thread`).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any

from stoker import _torch


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
        _answer_torch_in_thread(info)


def in_worker_thread() -> bool:
    """Whether the calling thread is a worker thread (its info is the thread's own).

    >>> in_worker_thread()
    False
    """
    return getattr(_thread_local, "info", None) is not None


_torch_lock = threading.Lock()


def _torch_get_worker_info() -> Any:  # pragma: no cover - runs as torch's function
    """The body torch's ``get_worker_info`` is given: its names resolve in torch's worker
    module, where :func:`_answer_torch_in_thread` puts ``_stoker_threads``."""
    info = getattr(_stoker_threads, "info", None)  # type: ignore[name-defined]  # noqa: F821
    return info if info is not None else _worker_info  # type: ignore[name-defined]  # noqa: F821


def _answer_torch_in_thread(info: WorkerInfo | None) -> None:
    """Make ``torch.utils.data.get_worker_info()`` give ``info`` (as torch's ``WorkerInfo``)
    in the calling thread. torch's function returns one module global, the same in every
    thread, so its code is replaced, once, by :func:`_torch_get_worker_info`: every
    reference to it (``from torch.utils.data import get_worker_info`` too) then answers
    per thread, and as before in the main thread and in torch's own workers."""
    torch = _torch.loaded()
    if torch is None:
        return
    with contextlib.suppress(Exception):  # torch's private layout may change
        module = torch.utils.data._utils.worker
        with _torch_lock:
            if not hasattr(module, "_stoker_threads"):
                if info is None or not hasattr(module, "_worker_info"):
                    return
                module._stoker_threads = threading.local()
                module.get_worker_info.__code__ = _torch_get_worker_info.__code__
        module._stoker_threads.info = None if info is None else module.WorkerInfo(
            id=info.id, num_workers=info.num_workers, seed=info.seed, dataset=info.dataset
        )
