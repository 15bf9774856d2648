"""What shared memory's failures say: a full or unwritable ``/dev/shm``, too many open
files; each error says what must hold, what was found and how to fix it."""

from __future__ import annotations

import errno
import os

from stoker._cache import shm_room_bytes
from stoker._osprobe import SHM_DIR, shm_unwritable
from stoker.errors import SharedMemoryError


def shm_error(needed: int, workers: int, window: int) -> SharedMemoryError:
    """The error for a slot of ``needed`` bytes that does not fit, stating what the whole
    prefetch window of ``window`` slots over ``workers`` workers needs."""
    free = shm_room_bytes()
    free_text = f"{free:,} bytes are free" if free is not None else "free space unknown"
    workers = max(1, workers)
    prefetch = max(1, window // workers)
    return SharedMemoryError(
        f"shared memory ({SHM_DIR}) must hold the batches in flight, but a slot of "
        f"{needed:,} bytes does not fit ({free_text}); the prefetch window needs about "
        f"{workers} workers x {prefetch} prefetch_factor x {needed:,} bytes = "
        f"{workers * prefetch * needed:,} bytes. Fix: give the container more shared memory "
        "(docker run --shm-size=8g, or a larger /dev/shm), or use fewer workers, a smaller "
        "prefetch_factor or batch_size, or worker_mode='thread'."
    )


def unwritable_error() -> SharedMemoryError | None:
    """The error for a ``/dev/shm`` where no segment can be made (read-only, not ours),
    raised in the main process before any worker starts; None where segments can be made."""
    why = shm_unwritable()
    if why is None:
        return None
    return SharedMemoryError(
        f"process workers hand batches over in shared memory ({SHM_DIR}), which must be "
        f"writable, but it is {why}. Fix: mount {SHM_DIR} read-write (docker run --shm-size=2g; "
        "Kubernetes: an emptyDir with medium Memory at /dev/shm), or use "
        "worker_mode='thread' (or 'auto', which then picks threads) or num_workers=0."
    )


def descriptor_error(exc: OSError, doing: str) -> OSError | RuntimeError:
    """``exc``, or for too many open files torch's ``RuntimeError`` with its advice and
    stoker's (a mapped batch holds no descriptor: the rest of the process holds them)."""
    if exc.errno not in (errno.EMFILE, errno.ENFILE):
        return exc
    soft, _ = _nofile_limit()
    return RuntimeError(
        "Too many open files. Communication with the workers is no longer possible. "
        "Please increase the limit using `ulimit -n` in the shell or change the sharing "
        "strategy by calling `torch.multiprocessing.set_sharing_strategy('file_system')` at "
        f"the beginning of your code. (stoker, {doing} in process {os.getpid()}: "
        f"{exc.strerror}, the limit is {soft} descriptors. stoker's batches hold no "
        "descriptor while alive, so torch's sharing strategy does not apply to them: the "
        "descriptors are held elsewhere in the process (open files, sockets, pipes); "
        "raise the limit with `ulimit -n` or resource.setrlimit(RLIMIT_NOFILE), or close "
        "them.)"
    )


def _nofile_limit() -> tuple[int, int]:
    """This process's (soft, hard) limit on open descriptors, or (-1, -1) if unknown."""
    try:
        import resource

        return resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        return -1, -1
