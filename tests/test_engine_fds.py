"""File descriptors: a batch kept alive holds none, and running out says what to do.

Each scenario runs in a child process under ``RLIMIT_NOFILE=100`` (set with
``resource.setrlimit``), on torch's loader and on stoker's: keeping 200 batches of one
worker alive fails in torch (a descriptor per batch) and works in stoker, whose mapped
slots keep no descriptor in the worker or in the main process; where the process runs out
all the same (its descriptors held elsewhere), stoker raises torch's ``RuntimeError`` with
torch's advice and its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess

_SRC = str(Path(__file__).resolve().parents[1] / "src")

_CHILD = textwrap.dedent(
    """
    import os, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))
    import numpy as np
    if sys.argv[1] == "torch":
        import torch.utils.data as m
    else:
        import stoker.torch as m

    class Big:
        def __len__(self):
            return 200

        def __getitem__(self, i):
            return np.full(1 << 16, i, np.uint8)

    print("PID", os.getpid())
    it = iter(m.DataLoader(Big(), batch_size=1, num_workers=1))
    kept = [next(it)]
    files = []
    if sys.argv[2] == "exhaust":  # the user's own files take every descriptor left
        try:
            while True:
                files.append(open(os.devnull))
        except OSError:
            pass
    try:
        kept.extend(it)
    except Exception as exc:
        for f in files:
            f.close()
        print("RAISED", type(exc).__name__, str(exc).replace(chr(10), " "))
        sys.exit(0)
    right = sum(int(b[0, 0] == i) for i, b in enumerate(kept))
    print("OK", len(kept), len(os.listdir("/proc/self/fd")), right)
    """
)


def _run(module: str, mode: str) -> tuple[str, int]:
    """The child's last line, and its pid (the name of its shared-memory segments)."""
    env = {**os.environ, "PYTHONPATH": _SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, module, mode],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    return lines[-1], int(lines[0].split()[1])


def _segments_of(pid: int) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"stoker_{pid}_")]


def test_two_hundred_live_batches_need_no_descriptors() -> None:
    """200 batches of one worker kept alive under a limit of 100 descriptors: torch runs
    out (its RuntimeError, "ulimit -n"); stoker delivers them all, right, holding a
    handful of descriptors, and leaves no segment behind."""
    torch_line, _ = _run("torch", "hold")
    assert torch_line.startswith("RAISED RuntimeError") and "ulimit -n" in torch_line
    line, pid = _run("stoker", "hold")
    ok, kept, fds, right = line.split()
    assert (ok, kept, right) == ("OK", "200", "200"), line
    assert int(fds) < 30, f"{fds} descriptors open with 200 batches alive"
    assert _segments_of(pid) == []


def test_running_out_of_descriptors_raises_torchs_error_with_advice() -> None:
    """When the process has no descriptor left for the next batch's segment, stoker raises
    torch's RuntimeError with torch's phrases ("ulimit -n", "set_sharing_strategy"), then
    says its batches hold none and where they are held. torch fails there too (2.13: that
    RuntimeError; 2.14: a bare OSError from where it runs out first)."""
    torch_line, _ = _run("torch", "exhaust")
    assert torch_line.startswith("RAISED") and "Too many open files" in torch_line, torch_line
    line, pid = _run("stoker", "exhaust")
    assert line.startswith("RAISED RuntimeError Too many open files."), line
    for phrase in ("ulimit -n", "set_sharing_strategy('file_system')", "limit is 100",
                   "batches hold no descriptor"):  # fmt: skip
        assert phrase in line, phrase
    assert _segments_of(pid) == []
