"""What the operating system gives this process: CPUs, memory, ``/dev/shm``, CPU time.

Every probe of the machine lives here, read from the affinity mask, cgroups (v2, else
v1), ``/proc`` and ``statvfs``, so that the autotuner, the engine's warnings, ``stoker
doctor`` and ``stoker bench`` count the same CPUs and the same memory. Each probe returns
None (or a fallback it names) where the platform does not report it; none raises.
"""

from __future__ import annotations

import math
import os
import time

try:
    import resource
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]

SHM_DIR = "/dev/shm"
"""Where process workers' shared-memory segments live (POSIX shared memory on Linux)."""

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def available_cpus() -> int:
    """CPUs this process may use: the affinity mask, capped by the cgroup CPU quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return cpus


def cgroup_cpu_quota() -> float | None:
    """The cgroup's CPU quota in CPUs (v2, else v1), or None without one. A quota or period
    that is not a positive count (``"max"``, a period of 0, garbage) is no quota: the
    kernel enforces none it could divide."""
    try:  # cgroup v2
        with open("/sys/fs/cgroup/cpu.max") as f:
            fields = [*f.read().split(), "", ""]
        return _quota(fields[0], fields[1])
    except OSError:
        pass
    try:  # cgroup v1
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
            q = f.read()
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
            return _quota(q, f.read())
    except OSError:
        return None


def _quota(quota: str, period: str) -> float | None:
    """``quota / period`` in CPUs, or None unless both are positive integers.

    >>> _quota("150000", "100000"), _quota("100000", "0"), _quota("max", "100000")
    (1.5, None, None)
    """
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def meminfo() -> dict[str, int]:
    """``/proc/meminfo`` in bytes (empty where there is none)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for row in f:
                key, _, rest = row.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except OSError:
        pass
    return out


def memory_available() -> int | None:
    """The kernel's ``MemAvailable`` in bytes, or None where it is not reported."""
    return meminfo().get("MemAvailable")


def cgroup_memory_limit() -> int | None:
    """The cgroup's memory limit in bytes (v2, else v1), or None when unlimited or unknown."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # v1 writes a huge number for "none"
            return int(text)
        return None
    return None


def cgroup_memory_room() -> int | None:
    """Bytes this cgroup (v2) may still take below its ``memory.max``, or None without one."""
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit == "max":
            return None
        with open("/sys/fs/cgroup/memory.current") as f:
            return max(0, int(limit) - int(f.read()))
    except (OSError, ValueError):
        return None


def shm_space() -> tuple[int, int] | OSError:
    """(size, free bytes) of ``/dev/shm``, or the error that says why it cannot be read."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError as exc:
        return exc
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def shm_unwritable() -> str | None:
    """Why process workers cannot make segments in ``/dev/shm`` (``"read-only"``, ``"not
    writable by this user"``, or the error reading it), or None where they can."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError as exc:
        return f"not available ({exc.strerror})"
    if st.f_flag & os.ST_RDONLY:
        return "read-only"
    if not os.access(SHM_DIR, os.W_OK):
        return "not writable by this user"
    return None


def shm_free_bytes() -> int | None:
    """Bytes free in ``/dev/shm`` (None where there is no such directory)."""
    space = shm_space()
    return None if isinstance(space, OSError) else space[1]


def idle_ticks() -> tuple[int, int] | None:
    """(idle, total) clock ticks of all CPUs from /proc/stat, or None where it is missing."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields[:8])


def idle_cpus(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """CPUs the whole machine left idle between two :func:`idle_ticks` readings.

    >>> idle_cpus((0, 0), (50, 100)) == 0.5 * (os.cpu_count() or 1)
    True
    """
    if before is None or after is None or after[1] <= before[1]:
        return None
    share = (after[0] - before[0]) / (after[1] - before[1])
    return share * (os.cpu_count() or 1)


def tree_cpu_seconds(pids: list[int]) -> float:
    """CPU seconds used so far by this process (all its threads) and by ``pids``."""
    total = time.process_time()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return total


def thread_blocks() -> int | None:
    """Times the calling thread has blocked so far (voluntary context switches: I/O, sleep,
    a lock), or None where the platform does not count them. A span with none in it never
    waited: any wall time beyond its CPU time was other threads' or programs' turn."""
    try:
        return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
    except (AttributeError, OSError):
        return None


_OOM_COUNTERS = (
    ("/sys/fs/cgroup/memory.events", "oom_kill"),  # cgroup v2: this container's
    ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill"),  # cgroup v1
    ("/proc/vmstat", "oom_kill"),  # the whole machine's (Linux 4.13+)
)


def oom_kills() -> int | None:
    """How many processes the kernel's out-of-memory killer has killed so far, as the
    cgroup (v2, else v1) or, failing both, ``/proc/vmstat`` counts them; None where none
    says. A worker killed by SIGKILL while this count rose was most likely its victim."""
    for path, key in _OOM_COUNTERS:
        try:
            with open(path) as f:
                for line in f:
                    name, _, value = line.partition(" ")
                    if name == key and value.strip().isdigit():
                        return int(value)
        except OSError:
            continue
    return None
