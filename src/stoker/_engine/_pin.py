"""Pinned (page-locked) memory: whether batches can be pinned, pinning them, pinned slots.

Pinning needs torch and an accelerator; without them ``pin_memory=True`` warns once per
loader and batches go on unpinned, as torch does. With process workers and CUDA, the main
process registers each shared-memory slot's mapping as page-locked once
(``cudaHostRegister``, :class:`SlotPins`), so a batch's leaves are pinned already and
:func:`pin` copies nothing (torch copies each batch again into pinned buffers). A slot is
unregistered before it is unmapped, and goes back to its worker only once the copies
queued on the current stream before the batch died have finished, so a
``.to("cuda", non_blocking=True)`` still reading it is never overwritten. Where
registration fails, torch copies the leaves into pinned memory.
"""

from __future__ import annotations

import collections.abc
import contextlib
import copy
import ctypes
import mmap
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from stoker import _torch

_HOST_REGISTER_PORTABLE = 1
"""``cudaHostRegisterPortable``: pinned for every CUDA context, as torch's pinned memory."""
REGISTER_SLOTS = True
"""Whether process workers' slots are registered (False: every batch is copied into pinned
memory, as torch does, so that the two can be compared)."""


def pin_device(pin_memory_device: str) -> str | None:
    """The device to pin for, or None (after one warning) when pinning is impossible.

    Args:
        pin_memory_device: the loader's ``pin_memory_device``; "" means the current
            accelerator.

    Raises:
        ValueError: when ``pin_memory_device`` names another device type than the current
            accelerator's, or a device index that does not exist.
    """
    try:
        torch = _torch.require("pin_memory=True")
    except ModuleNotFoundError as exc:
        warnings.warn(f"{exc} Batches are not pinned.", UserWarning, stacklevel=4)
        return None
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        available = accelerator.is_available()
        current = accelerator.current_accelerator() if available else None
        device = current.type if current is not None else ""
    else:  # torch < 2.6
        available = torch.cuda.is_available()
        device = "cuda"
    if not available:
        warnings.warn(
            "pin_memory=True but no accelerator is available, so batches are not pinned; "
            "set pin_memory=False to silence this warning.",
            UserWarning,
            stacklevel=4,
        )
        return None
    if not pin_memory_device:
        return str(device)
    return _checked_device(torch, pin_memory_device, str(device))


def _checked_device(torch: Any, name: str, current: str) -> str:
    """``name`` when it names the current accelerator (type, and an index that exists)."""
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"pin_memory_device must be a device name such as {current!r}, got {name!r} "
            f"({exc}); leave it '' to pin for the current accelerator."
        ) from None
    if dev.type != current:
        raise ValueError(
            f"pin_memory_device must name the accelerator batches are pinned for (here "
            f"{current!r}), got {name!r}; leave it '' to pin for the current accelerator."
        )
    count = torch.accelerator.device_count() if hasattr(torch, "accelerator") else 1
    if dev.index is not None and not 0 <= dev.index < count:
        raise ValueError(
            f"pin_memory_device must name an existing device ({count} {current} device(s): "
            f"indices 0 to {count - 1}), got {name!r}."
        )
    return name


def pin(data: Any, device: str) -> Any:
    """``data`` with every tensor (and every object with a ``pin_memory()``) pinned.

    torch's rule: tensors and objects with a ``pin_memory()`` method are pinned by it
    (a tensor pinned already, e.g. a view of a registered slot, is returned as it is);
    strings and bytes stay; mappings and sequences are rebuilt with their own type (a
    shallow copy updated in place where the type is mutable, so subclasses keep their
    extra attributes), falling back to dict or list; namedtuples stay namedtuples; NumPy
    arrays and other leaves are returned unchanged.
    """
    if _torch.is_tensor(data):
        if data.device.type != "cpu" or data.is_pinned():
            return data  # on the device already (decode="gpu"), or a registered slot's view
        return data.pin_memory()
    if hasattr(data, "pin_memory") and not isinstance(data, type):
        return data.pin_memory()
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, collections.abc.Mapping):
        pinned = {k: pin(v, device) for k, v in data.items()}
        try:
            if isinstance(data, collections.abc.MutableMapping):
                clone = copy.copy(data)
                clone.update(pinned)
                return clone
            return type(data)(pinned)  # type: ignore[call-arg]
        except TypeError:
            return pinned
    if isinstance(data, tuple):
        items = [pin(v, device) for v in data]
        if hasattr(data, "_fields"):  # namedtuple
            return type(data)(*items)
        return type(data)(items)
    if isinstance(data, collections.abc.Sequence):
        items = [pin(v, device) for v in data]
        try:
            if isinstance(data, collections.abc.MutableSequence):
                seq = copy.copy(data)
                for i, item in enumerate(items):
                    seq[i] = item
                return seq
            return type(data)(items)  # type: ignore[call-arg]
        except TypeError:
            return items
    return data


def slot_pins(device: str | None) -> SlotPins | None:
    """What registers a worker's slots for ``device``, or None where slots are not
    registered (no pinning, or an accelerator other than CUDA)."""
    if device is None or not device.startswith("cuda") or not REGISTER_SLOTS:
        return None
    torch = _torch.require("pin_memory=True")
    return SlotPins(torch)


class _Registration:
    """One mapping registered as page-locked memory; unregistered when this dies.

    It holds the mapping, so the mapping is unmapped only after it is unregistered. A
    forked worker's copy of it does nothing (CUDA is not for forked children).
    """

    def __init__(self, cudart: Any, address: int, mm: mmap.mmap) -> None:
        self._cudart, self._address, self.mm = cudart, address, mm
        self._pid = os.getpid()

    def __del__(self) -> None:
        if os.getpid() != self._pid:
            return
        with contextlib.suppress(Exception):  # interpreter exit may have torn CUDA down
            self._cudart.cudaHostUnregister(self._address)


_LIVE: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
"""Registered buffers alive, by the id of their mapping: a mapping adopted by a later pool
while a batch of it lives is not registered twice (CUDA refuses that)."""
_PENDING: list[tuple[Any, Callable[[int], None], int, Any]] = []
"""(event, on_free, slot id, buffer) of registered slots whose batches died, waiting for
their copies; shared by every loader, so an epoch's last slots are returned by a later
poll."""
_PENDING_LOCK = threading.Lock()


class SlotPins:
    """Registers the main process's maps of a pool's slots as page-locked memory.

    :meth:`register` gives the buffer to view a mapping through: a ctypes array over it
    that holds its registration, so every view of a batch keeps the slot registered.
    :meth:`guard` delays the return of a registered slot to its worker until the copies
    queued before its batch died have finished.
    """

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._cudart = torch.cuda.cudart()
        self.registered = 0  # mappings registered so far
        self.seconds = 0.0  # spent registering them
        self.failure: str | None = None  # why registration stopped, if it did

    def register(self, mm: mmap.mmap) -> Any:
        """The buffer to view ``mm`` through: registered, or ``mm`` itself when that fails
        (its leaves are then copied into pinned memory by :func:`pin`)."""
        live = _LIVE.get(id(mm))
        if live is not None and live.registration.mm is mm:
            return live
        if self.failure is not None:
            return mm
        began = time.perf_counter()
        buf = (ctypes.c_uint8 * len(mm)).from_buffer(mm)
        address = ctypes.addressof(buf)
        err = int(self._cudart.cudaHostRegister(address, len(mm), _HOST_REGISTER_PORTABLE))
        self.seconds += time.perf_counter() - began
        if err != 0:
            self.failure = f"cudaHostRegister of {len(mm):,} bytes failed with cudaError {err}"
            clear = getattr(self._cudart, "cudaGetLastError", None)
            if clear is not None:  # a failed call leaves its error for the next check
                clear()
            warnings.warn(
                f"pin_memory=True: {self.failure}, so batches are copied into pinned memory "
                "instead (one more copy per batch).",
                UserWarning,
                stacklevel=2,
            )
            del buf
            return mm
        buf.registration = _Registration(self._cudart, address, mm)  # type: ignore[attr-defined]
        _LIVE[id(mm)] = buf
        self.registered += 1
        return buf

    def guard(self, on_free: Callable[[int], None], buf: Any) -> Callable[[int], None]:
        """``on_free`` for the registered slot ``buf``: it runs once the current stream has
        finished what was queued when the batch died (checked whenever a batch dies or is
        viewed). Until then ``buf`` is held, so the slot stays registered and mapped while a
        copy may still read it."""

        def deferred(sid: int) -> None:
            event = self._torch.cuda.Event()
            event.record()
            with _PENDING_LOCK:
                _PENDING.append((event, on_free, sid, buf))
            _poll()

        return deferred

    @staticmethod
    def poll() -> None:
        """Return the registered slots whose copies have finished (any loader's)."""
        _poll()


def _poll() -> None:
    """Return the registered slots whose copies have finished to their workers."""
    with _PENDING_LOCK:
        if not _PENDING:
            return
        done = [p for p in _PENDING if p[0].query()]
        _PENDING[:] = [p for p in _PENDING if not any(p is d for d in done)]
    for _, on_free, sid, _ in done:
        on_free(sid)


def in_registered_slot(address: int) -> bool:
    """Whether ``address`` lies in a slot registered now (a batch leaf pinned in place)."""
    for buf in list(_LIVE.values()):
        start = ctypes.addressof(buf)
        if start <= address < start + ctypes.sizeof(buf):
            return True
    return False
