"""Subprocess checks started as the run begins, beside the rest of the suite.

A few tests spend seconds in subprocesses that need nothing from the tests before them
(mypy, ``accelerate launch``, Lightning's DDP ranks), while the suite's own process keeps
about one core busy. :func:`starts_early` gives such a test its commands; when collection
ends, ``conftest.py`` starts those of the selected tests (a test not selected starts
nothing) and moves the tests to the end of the run, where each waits for its job
(:func:`finished`), done by then, and asserts on its output as before.

Each job runs in a session of its own (a test's Ctrl-C or ``killpg`` does not reach it),
its output in a file: the suite's process holds no descriptor of it, so the leak check,
which compares what exists after each test with what existed before it, sees the job's
one child process there from the first test on, and nothing come. What a job leaves
running is killed, and its directory removed, when the session ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import pytest

_F = TypeVar("_F", bound=Callable[..., Any])

_SEQUENCE = """
import fcntl, json, subprocess, sys
if sys.argv[2]:
    with open(sys.argv[2]) as before:
        fcntl.flock(before, fcntl.LOCK_EX)  # the job started before this one has ended
for argv in json.loads(sys.argv[3]):
    code = subprocess.call(argv)
    if code:
        sys.exit(code)
"""
"""A job's driver: once the job started before it has ended, runs the commands one after
another; the first that fails ends it. Each driver holds a lock (``argv[1]``, its
descriptor, locked before it began) until it exits, the next one waits for it: the jobs
take turns on one core, the one the suite leaves idle, in the order their tests run,
rather than all of them at once beside the first tests."""


class Job(NamedTuple):
    """What a test runs early: ``commands``, one after another, with ``env`` (the whole
    environment) in ``cwd`` (None: the job's directory)."""

    commands: list[list[str]]
    env: dict[str, str]
    cwd: Path | None = None


class Finished(NamedTuple):
    """A job that ended: its exit status, its output (stdout and stderr, interleaved), its
    directory (removed at the session's end) and its process's id, the session's."""

    returncode: int
    output: str
    tmp: Path
    pid: int


class _Running(NamedTuple):
    proc: subprocess.Popen[bytes]
    tmp: Path
    log: Path


_RUNNING: dict[str, _Running] = {}
_LAST: list[Path] = []  # the directory of the job started last, whose lock the next waits on


def starts_early(job: Callable[[Path], Job | None]) -> Callable[[_F], _F]:
    """Decorator: the test's :class:`Job`, made from a fresh directory by ``job`` (None:
    nothing to start, e.g. a tool is not installed; the test says why itself)."""

    def mark(test: _F) -> _F:
        test.early_job = job  # type: ignore[attr-defined]
        return test

    return mark


def is_early(item: pytest.Item) -> bool:
    """Whether ``item`` is a test with a job (such tests run last: their jobs are done)."""
    return getattr(getattr(item, "function", None), "early_job", None) is not None


def start(items: Iterable[pytest.Item]) -> None:
    """Start the jobs of the selected ``items``, to run in their order (see _SEQUENCE)."""
    for item in items:
        if not is_early(item) or item.nodeid in _RUNNING:
            continue
        make = item.function.early_job  # type: ignore[attr-defined]
        tmp = Path(tempfile.mkdtemp(prefix="stoker-early-"))
        job = make(tmp)
        if job is None:
            shutil.rmtree(tmp, ignore_errors=True)
            continue
        log, lock = tmp / "output.log", tmp / "running.lock"
        before = str(_LAST[0] / "running.lock") if _LAST else ""
        with open(log, "wb") as out, open(lock, "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # passed on: the driver holds it until it exits
            argv = [sys.executable, "-c", _SEQUENCE, str(held.fileno()), before]
            proc = subprocess.Popen(
                [*argv, json.dumps(job.commands)], cwd=job.cwd or tmp, env=job.env,
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, pass_fds=(held.fileno(),),
            )  # fmt: skip
        _RUNNING[item.nodeid] = _Running(proc, tmp, log)
        _LAST[:] = [tmp]


def finished(request: pytest.FixtureRequest, timeout: float) -> Finished:
    """Wait (up to ``timeout`` seconds) for the job of the test that asks; started now if
    it was not (the test was not among the items collected, e.g. a rerun)."""
    nodeid = request.node.nodeid
    if nodeid not in _RUNNING:
        start([request.node])
    run = _RUNNING[nodeid]
    try:
        run.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _kill(run.proc)
        pytest.fail(f"{nodeid}: its job ran past {timeout:g} s:\n{_tail(run.log)}")
    return Finished(run.proc.returncode, _tail(run.log, 20000), run.tmp, run.proc.pid)


def stop_all() -> None:
    """Kill what is still running (an interrupted session) and remove the directories."""
    for run in _RUNNING.values():
        if run.proc.poll() is None:
            _kill(run.proc)
        shutil.rmtree(run.tmp, ignore_errors=True)
    _RUNNING.clear()
    _LAST.clear()


def python_env(*paths: str, **extra: str) -> dict[str, str]:
    """This environment with ``paths`` first on ``PYTHONPATH``, and ``extra``; the entries
    made absolute (``PYTHONPATH=src`` from the checkout), as a job runs in a folder of its
    own."""
    env = {**os.environ, **extra}
    entries = [*paths, *env.get("PYTHONPATH", "").split(os.pathsep)]
    env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in entries if p)
    return env


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)  # the job and everything it started
    proc.wait()


def _tail(log: Path, chars: int = 4000) -> str:
    return log.read_bytes().decode(errors="replace")[-chars:]
