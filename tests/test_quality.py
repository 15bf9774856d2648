"""The code stays lint-clean (ruff) and type-clean (mypy strict on src/)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _early import Job, finished, python_env, starts_early

ROOT = Path(__file__).resolve().parent.parent


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_clean() -> None:
    """`ruff check` finds nothing in src, tests and benchmarks."""
    beside = Path(sys.executable).with_name("ruff")
    ruff = str(beside) if beside.exists() else shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    out = _run(ruff, "check", "src", "tests", "benchmarks")
    assert out.returncode == 0, out.stdout + out.stderr


def _mypy(tmp: Path) -> Job | None:
    """mypy over src/ (run as the session starts: see tests/_early.py)."""
    if importlib.util.find_spec("mypy") is None:
        return None
    return Job([[sys.executable, "-m", "mypy"]], python_env(), cwd=ROOT)


@pytest.mark.slow
@starts_early(_mypy)
def test_mypy_strict_clean(request: pytest.FixtureRequest) -> None:
    """`mypy --strict` (configured in pyproject.toml) finds nothing in src/."""
    pytest.importorskip("mypy")
    out = finished(request, timeout=300)
    assert out.returncode == 0, out.output
