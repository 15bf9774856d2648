"""``tests/under_load.sh``: the README's test command beside CPU burners, leaving nothing.

The script is run here with short commands in a session of its own; whatever of that
session is still running after it ends (a burner, the command) is a leak.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "under_load.sh"
_WAIT_S = 30.0
"""Longest wait for the script (a few burners and a short command)."""

pytestmark = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("timeout") is None or not Path("/proc").is_dir(),
    reason="needs bash, coreutils' timeout and /proc",
)


def _session(sid: int) -> list[int]:
    """The processes of session ``sid`` still there (zombies included)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = (Path("/proc") / entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[4]) == sid:
                found.append(int(entry))
    return found


def _start(*command: str) -> subprocess.Popen[str]:
    env = {**os.environ, "STOKER_BURNERS": "2", "STOKER_LOAD_TIMEOUT": "20"}
    return subprocess.Popen(
        ["bash", str(SCRIPT), *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )


def test_it_picks_the_readmes_test_command_as_ci_does() -> None:
    """The script and `.ci/run` take the same command from the README (one awk line)."""
    pick = re.compile(r"^\s*cmd=\$\((awk .*)\)$", flags=re.M)
    ci = pick.findall((ROOT / ".ci" / "run").read_text(encoding="utf-8"))
    ours = pick.findall(SCRIPT.read_text(encoding="utf-8"))
    assert ci and ours == ci, (ours, ci)


def test_it_runs_the_command_beside_burners_and_leaves_nothing() -> None:
    """A command's exit status is the script's; the burners were running beside it (it
    sees them in its session) and are gone when the script ends."""
    proc = _start("bash", "-c", "ps -o comm= -s $(ps -o sid= -p $$) | grep -c bash; exit 3")
    out, _ = proc.communicate(timeout=_WAIT_S)
    assert proc.returncode == 3, out
    assert "beside 2 CPU burners" in out and "exit status 3" in out, out
    seen = int(out.splitlines()[1])  # bash: the script, 2 burners, the command's shells
    assert seen >= 4, out
    assert _session(proc.pid) == []


def test_a_terminated_run_leaves_nothing() -> None:
    """SIGTERM to the script while its command runs: the command and the burners go."""
    proc = _start("sleep", "300")
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("+ sleep 300")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=_WAIT_S) != 0
    proc.stdout.close()
    left = _session(proc.pid)
    assert left == [], left
