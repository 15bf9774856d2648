"""``stoker doctor``: what this machine gives a stoker user, and what to do about each gap.

It reports the fast paths (stoker's C kernels and why they are missing, libjpeg-turbo, the
optional decoders and libraries), the CPUs and memory this process may use (affinity mask,
cgroup quota and limit), ``/dev/shm`` against a typical prefetch window, and the default
start method. It imports only what it reports on (never torch: its presence and version
come from the installed package's metadata), so it runs, and runs quickly, on a machine
without torch.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import multiprocessing
import os
import platform
from dataclasses import dataclass, field
from typing import Any

from stoker._osprobe import (
    available_cpus,
    cgroup_cpu_quota,
    cgroup_memory_limit,
    meminfo,
    shm_space,
    shm_unwritable,
)

WINDOW_WORKERS, WINDOW_PREFETCH = 2, 2
WINDOW_BATCH = (64, 3, 224, 224)
WINDOW_BYTES = WINDOW_WORKERS * WINDOW_PREFETCH * 64 * 3 * 224 * 224 * 4
"""A typical prefetch window: 2 workers x prefetch 2 x a 64x3x224x224 float32 batch."""

_NATIVE = "stoker.vision._native"
_REINSTALL = (
    "then reinstall stoker (pip install --force-reinstall --no-cache-dir stoker; in a "
    "checkout: python setup.py build_ext --inplace)"
)


@dataclass
class Report:
    """The doctor's findings: titled sections of (label, value) lines, and what to do.

    ``fast_path_off`` holds the advice for fast paths that are off (``stoker demo`` points
    to the doctor when it is not empty); ``advice`` holds every shortfall's advice.
    """

    sections: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)
    fast_path_off: list[str] = field(default_factory=list)

    def line(self, section: str, label: str, value: str) -> None:
        """Add one line to ``section`` (made on first use, kept in order)."""
        self.sections.setdefault(section, []).append((label, value))

    def text(self) -> str:
        """The plain-text report: a heading per section, then the advice."""
        width = max(len(label) for lines in self.sections.values() for label, _ in lines)
        out = ["stoker doctor: what this machine gives stoker"]
        for title, lines in self.sections.items():
            out += ["", title] + [f"  {label:<{width}}  {value}" for label, value in lines]
        out += ["", "What to do"]
        out += [f"  - {a}" for a in self.advice] or ["  nothing: every fast path is on"]
        return "\n".join(out)

    def json(self) -> str:
        """The same report as JSON: ``{"sections": {title: {label: value}}, "advice": []}``."""
        sections = {title: dict(lines) for title, lines in self.sections.items()}
        return json.dumps({"sections": sections, "advice": self.advice}, indent=2)


def diagnose() -> Report:
    """Everything the doctor checks, as a :class:`Report`."""
    report = Report()
    _system(report)
    _fast_paths(report)
    _libraries(report)
    _cpus(report)
    _memory(report)
    _shm(report)
    return report


def fast_paths_off() -> list[str]:
    """The advice for each fast path that is off on this machine (empty when all are on)."""
    report = Report()
    _fast_paths(report)
    return report.fast_path_off


def add_subcommand(sub: Any) -> None:
    """Register ``stoker doctor`` on the CLI's subparsers."""
    doctor = sub.add_parser("doctor", help="say which fast paths, CPUs, memory this machine gives")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    """Print the report (text, or JSON with ``--json``); returns 0: a shortfall is advice."""
    report = diagnose()
    print(report.json() if args.json else report.text())
    return 0


def version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, or None when it is not installed.

    >>> version("no-such-distribution-here") is None
    True
    """
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def present(module: str) -> bool:
    """Whether ``module`` can be found on the path (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def turbo_version(number: int) -> str:
    """libjpeg-turbo's ``LIBJPEG_TURBO_VERSION_NUMBER`` (MMMmmmppp) as text.

    >>> turbo_version(2001005), turbo_version(3000090)
    ('2.1.5', '3.0.90')
    """
    return f"{number // 1_000_000}.{number // 1000 % 1000}.{number % 1000}"


def _system(report: Report) -> None:
    from stoker import __version__

    s = "System"
    report.line(s, "stoker", __version__)
    report.line(s, "python", f"{platform.python_version()} ({platform.python_implementation()})")
    report.line(s, "platform", f"{platform.system()} {platform.machine()}")
    report.line(s, "start method", multiprocessing.get_context().get_start_method())


def _fast_paths(report: Report) -> None:
    s = "Fast paths"
    native, why = _native()
    if native is None:
        report.line(s, "native kernels", f"not available: {why}")
        _off(
            report,
            "stoker's C kernels (crop-only JPEG decode, resample, one-pass normalise) are "
            "off: install a C compiler and libjpeg-turbo's headers (Debian/Ubuntu: apt-get "
            "install gcc libjpeg-dev; Fedora: dnf install gcc libjpeg-turbo-devel), "
            f"{_REINSTALL}",
        )
    else:
        report.line(s, "native kernels", f"built ({getattr(native, '__file__', _NATIVE)})")
        _native_decode(report, native)
        isa = _instruction_set(native)
        report.line(s, "instruction set", isa or "not reported by this build")
        resample = "stoker's C resampler" if hasattr(native, "resample") else "not in this build"
        report.line(s, "native resampler", resample)
        normalize = "stoker's C kernel" if hasattr(native, "normalize") else "not in this build"
        report.line(s, "native normalise", normalize)
    simplejpeg = version("simplejpeg")
    report.line(s, "simplejpeg", simplejpeg or "not installed")
    if simplejpeg is None:
        _off(
            report, "simplejpeg is missing (faster whole-image JPEG decode): pip install simplejpeg"
        )
    pillow = version("Pillow")
    report.line(s, "Pillow", pillow or "not installed")
    if pillow is not None:
        report.line(s, "Pillow's libjpeg-turbo", _pillow_turbo())
    else:
        _off(report, "Pillow is missing, so stoker.vision cannot load images: pip install Pillow")


def _libraries(report: Report) -> None:
    s = "Libraries"
    report.line(s, "numpy", version("numpy") or "not installed")
    torch = version("torch") if present("torch") else None
    report.line(s, "torch", torch or "not installed (NumPy batches; stoker needs no torch)")
    for dist, what in (("lmdb", "LMDBDataset"), ("fsspec", "remote shards (fsspec URLs)")):
        found = version(dist) if present(dist) else None
        report.line(s, dist, found or f"not installed ({what}: pip install {dist})")


def _cpus(report: Report) -> None:
    s = "CPUs"
    report.line(s, "cpu_count", str(os.cpu_count()))
    try:
        report.line(s, "affinity mask", f"{len(os.sched_getaffinity(0))} CPUs")
    except (AttributeError, OSError):
        report.line(s, "affinity mask", "not reported on this platform")
    quota = cgroup_cpu_quota()
    report.line(s, "cgroup quota", "none" if quota is None else f"{quota:g} CPUs")
    usable = available_cpus()
    report.line(s, "usable", f"{usable} (what num_workers='auto' and the warnings count)")
    if usable < 2:
        report.advice.append(
            f"only {usable} usable CPU: worker processes compete with the training loop; "
            "load in process (num_workers=0) or let num_workers='auto' decide"
        )


def _memory(report: Report) -> None:
    s = "Memory"
    info = meminfo()
    for key, label in (("MemTotal", "total"), ("MemAvailable", "available")):
        report.line(s, label, _size(info[key]) if key in info else "not reported")
    limit = cgroup_memory_limit()
    report.line(s, "cgroup limit", "none" if limit is None else _size(limit))


def _shm(report: Report) -> None:
    s = "Shared memory"
    window = (
        f"{WINDOW_WORKERS} workers x prefetch {WINDOW_PREFETCH} x "
        f"{'x'.join(map(str, WINDOW_BATCH))} float32 = {_size(WINDOW_BYTES)}"
    )
    report.line(s, "typical window", window)
    space = shm_space()
    if isinstance(space, OSError):
        report.line(s, "/dev/shm", f"not available ({space.strerror})")
        report.advice.append(
            "no /dev/shm: worker processes cannot share batches; use worker_mode='thread' "
            "or num_workers=0"
        )
        return
    size, free = space
    report.line(s, "/dev/shm size", _size(size))
    unwritable = shm_unwritable()
    if unwritable is not None:
        report.line(s, "/dev/shm", unwritable)
        report.advice.append(
            f"/dev/shm is {unwritable}: worker processes cannot share batches; mount it "
            "read-write (docker run --shm-size=2g; Kubernetes: an emptyDir with medium Memory "
            "at /dev/shm), or use worker_mode='thread' (or 'auto') or num_workers=0"
        )
        return
    report.line(s, "/dev/shm free", f"{_size(free)} ({free / WINDOW_BYTES:.1f} windows)")
    if free < WINDOW_BYTES:
        report.advice.append(
            f"/dev/shm has {_size(free)} free, less than a typical prefetch window "
            f"({_size(WINDOW_BYTES)}): enlarge it (docker run --shm-size=2g; Kubernetes: an "
            "emptyDir with medium Memory at /dev/shm), or use worker_mode='thread'"
        )


def _off(report: Report, advice: str) -> None:
    report.advice.append(advice)
    report.fast_path_off.append(advice)


def _native() -> tuple[Any, str]:
    """(stoker's extension module, "") or (None, why it does not import)."""
    try:
        return importlib.import_module(_NATIVE), ""
    except ModuleNotFoundError as exc:
        if exc.name == _NATIVE:
            return None, "not built (no C compiler at install)"
        return None, f"{type(exc).__name__}: {exc}"
    except ImportError as exc:
        return None, f"{type(exc).__name__}: {exc}"


def _native_decode(report: Report, native: Any) -> None:
    """The extension's crop-only decode: built with libjpeg-turbo (linked in, or the
    system's), or left out of a build without libjpeg-turbo's headers."""
    s = "Fast paths"
    if not hasattr(native, "decode"):
        report.line(s, "native decode", "not in this build (built without libjpeg-turbo)")
        report.line(s, "libjpeg-turbo", "not linked")
        _off(
            report,
            "stoker's crop-only JPEG decode is off (its resample and normalise kernels are "
            "on): install libjpeg-turbo's headers (Debian/Ubuntu: apt-get install "
            f"libjpeg-dev; Fedora: dnf install libjpeg-turbo-devel), {_REINSTALL}",
        )
        return
    report.line(s, "native decode", "built")
    number = getattr(native, "LIBJPEG_TURBO_VERSION", None)
    linkage = {"static": "linked in statically", "shared": "the system's shared libjpeg"}
    how = linkage.get(getattr(native, "JPEG_LINKAGE", ""), "linkage not reported")
    report.line(s, "libjpeg-turbo", f"{turbo_version(number) if number else 'unknown'} ({how})")


def _pillow_turbo() -> str:
    """The libjpeg-turbo version Pillow was built with, or why it is not known."""
    try:
        from PIL import features

        found = features.version("libjpeg_turbo")
    except Exception as exc:  # a broken Pillow must not stop the report
        return f"unknown ({type(exc).__name__}: {exc})"
    return found or "none (Pillow decodes with plain libjpeg)"


def _instruction_set(native: Any) -> str | None:
    """The resampler kernel the extension chose at run time (``"avx2"`` or ``"c"``)."""
    kernel = getattr(native, "RESAMPLE_KERNEL", None)
    return str(kernel) if kernel else None


def _size(nbytes: float) -> str:
    """A byte count for people.

    >>> _size(154140672), _size(3 << 30)
    ('147.0 MiB', '3.0 GiB')
    """
    value, unit = float(nbytes), "B"
    for bigger in ("KiB", "MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
