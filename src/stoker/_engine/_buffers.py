"""Reusable batch memory for thread workers, kept per loader across epochs.

Process workers collate into shared-memory slots that return when a batch's last view dies
(:mod:`stoker._engine._shm`). Thread workers hand over ordinary arrays, and faulting in a
fresh large array for every batch costs more than the copy into it. :class:`BufferPool`
gives them the same reuse: stoker's collate writes each large leaf into a buffer of the
pool, handed out through a one-off exporter whose finalizer puts the buffer back when the
leaf's last view dies. A pool belongs to a loader (its
:class:`~stoker._engine._config.EngineMemory`), so each epoch's new threads start with
memory already mapped; split batches of worker processes are joined into it too
(:mod:`stoker._engine._tail`). In-process loading (:mod:`stoker._engine._single`) keeps a
pool of private memory of its own: nothing is forked while it loads, and private pages may
be huge pages.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import threading
import weakref
from typing import Any

import numpy as np

from stoker._engine._interrupts import deferred

MIN_BYTES = 1 << 20
"""Smaller leaves are allocated as usual: they cost less to make than to track."""


class BufferPool:
    """Free buffers for large collated leaves; safe to use from many threads.

    Args:
        keep: how many free buffers to keep at most (the loader's prefetch window).
        shared: make new buffers in shared memory (for loaders whose workers fork while
            the pool holds them), else in private memory.
    """

    def __init__(self, keep: int, shared: bool = True) -> None:
        self.keep = keep
        self.shared = shared
        self._free: list[np.ndarray[Any, Any]] = []
        self._lock = threading.Lock()
        self._warming: threading.Thread | None = None

    def alloc(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        """An uninitialised array of ``shape`` and ``dtype``, in a reused buffer if large."""
        dtype = np.dtype(dtype)
        count = math.prod(shape)
        nbytes = count * dtype.itemsize
        if nbytes < MIN_BYTES:
            return np.empty(shape, dtype)
        buf = self._take(nbytes)
        exporter: Any = (ctypes.c_char * nbytes).from_buffer(buf.data)
        weakref.finalize(exporter, deferred(self._give_back), buf)
        out: np.ndarray[Any, Any] = np.frombuffer(exporter, dtype, count)
        return out.reshape(shape)

    def warm(self) -> None:
        """Write the free buffers once more, in a helper thread, ahead of their use.

        On a busy VM, memory that lay idle while other programs ran can fault back in page
        by page when next written, at a cost well above the copy's: a caller that knows it
        will soon need the buffers, and is still waiting for the data, pays for that now.
        ``alloc`` waits for the helper before it takes a buffer.
        """
        with self._lock:
            if self._warming is not None or not self._free:
                return
            bufs, self._free = self._free, []
            self._warming = threading.Thread(
                target=self._warm, args=(bufs,), name="stoker-warm", daemon=True
            )
        try:
            self._warming.start()
        except RuntimeError:  # the interpreter is shutting down: no new threads
            self._warm(bufs)

    def _warm(self, bufs: list[np.ndarray[Any, Any]]) -> None:
        for buf in bufs:
            buf.fill(0)  # releases the GIL
        with self._lock:
            self._free += bufs
            self._warming = None

    def _take(self, nbytes: int) -> np.ndarray[Any, Any]:
        warming = self._warming
        if warming is not None and warming is not threading.current_thread():
            warming.join()
        with self._lock:
            fits = [b for b in self._free if nbytes <= b.nbytes <= 2 * nbytes]
            if fits:
                best = min(fits, key=lambda b: b.nbytes)
                self._free.remove(best)
                return best
        if not self.shared:  # NumPy asks for huge pages for large arrays: fewer faults
            return np.empty(nbytes, np.uint8)
        # Shared, not private, memory: a worker forked while the pool holds it inherits the
        # mapping without copying its page table, and the next write here is a plain write,
        # not a copy-on-write fault per page.
        return np.frombuffer(mmap.mmap(-1, nbytes), np.uint8)

    def _give_back(self, buf: np.ndarray[Any, Any]) -> None:
        with self._lock:
            self._free.append(buf)
            if len(self._free) > self.keep:
                self._free.remove(min(self._free, key=lambda b: b.nbytes))
