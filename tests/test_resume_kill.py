"""A training script killed with SIGKILL resumes from its last checkpoint, exactly.

The script (run as a real subprocess) saves ``loader.state_dict()`` and the hashes of the
batches it has seen, atomically, after every batch, and prints the batch number. The test
kills it after a chosen batch (reading its output, never sleeping), restarts it with a
different ``num_workers``, and compares all hashes with an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import hashlib, json, os, random, sys
    import numpy as np
    from stoker import DataLoader, Dataset

    class Augmented(Dataset):
        def __len__(self):
            return 96
        def __getitem__(self, i):
            return np.full(3, i, dtype=np.float64) + np.random.rand(3) + random.random()

    ckpt, workers, epochs = sys.argv[1], int(sys.argv[2]), 2
    loader = DataLoader(Augmented(), batch_size=8, shuffle=True, generator=1234,
                        num_workers=workers)
    hashes = []
    if os.path.exists(ckpt):
        saved = json.load(open(ckpt))
        loader.load_state_dict(saved["loader"])
        hashes = saved["hashes"]
    while len(hashes) < epochs * len(loader):
        for batch in loader:
            hashes.append(hashlib.sha256(batch.tobytes()).hexdigest())
            tmp = ckpt + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"loader": loader.state_dict(), "hashes": hashes}, f)
            os.replace(tmp, ckpt)
            print(len(hashes), flush=True)
    print("done", flush=True)
    """
)
_RUN_TIMEOUT_S = 120.0


def _run(script: Path, ckpt: Path, workers: int, kill_after: int | None = None) -> None:
    """Run the script; with ``kill_after``, SIGKILL it once it reports that many batches."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(ckpt), str(workers)],
        stdout=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + _RUN_TIMEOUT_S
    try:
        for line in iter(proc.stdout.readline, b""):
            if kill_after is not None and line.strip() == str(kill_after).encode():
                os.killpg(proc.pid, signal.SIGKILL)  # the script and its workers, at once
                break
            if time.monotonic() > deadline:
                raise AssertionError("the training script did not finish in time")
        assert proc.wait(timeout=_RUN_TIMEOUT_S) == (-signal.SIGKILL if kill_after else 0)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=_RUN_TIMEOUT_S)
        proc.stdout.close()


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize(("before", "after", "kill_at"), [(2, 0, 5), (0, 3, 17)])
def test_sigkilled_script_resumes_exactly(
    tmp_path: Path, before: int, after: int, kill_at: int
) -> None:
    """Killed after batch `kill_at` with `before` workers, resumed with `after`: same hashes."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    reference = tmp_path / "reference.json"
    _run(script, reference, workers=0)
    ckpt = tmp_path / "ckpt.json"
    _run(script, ckpt, workers=before, kill_after=kill_at)
    saved = len(json.loads(ckpt.read_text())["hashes"])
    assert kill_at <= saved < 24  # killed mid-run (it may save a batch or two after printing)
    _run(script, ckpt, workers=after)
    assert json.loads(ckpt.read_text())["hashes"] == json.loads(reference.read_text())["hashes"]
