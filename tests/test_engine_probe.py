"""The worker's timing of its first samples (stoker._engine._probe), in this process."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from typing import Any

import pytest

from stoker._engine._messages import Probe
from stoker._engine._probe import SampleTimer


def _probe_of(fn: Any, batch_len: int = 1) -> Probe:
    sent: list[Probe] = []
    timer = SampleTimer(sent.append, 1, batch_len)
    timer.map_fn(fn, list(range(batch_len)))
    assert len(sent) == 1
    return sent[0]


def test_a_fetch_that_waits_shows_little_cpu() -> None:
    p = _probe_of(lambda i: time.sleep(0.02))
    assert p.wall >= 0.02 and p.cpu < 0.5 * p.wall


def test_a_whole_batch_is_timed_at_its_end() -> None:
    """A ``__getitems__`` dataset: one probe for the batch, per sample, when it is done."""
    sent: list[Probe] = []
    timer = SampleTimer(sent.append, 3, 4)
    time.sleep(0.02)  # the batch's load, which waits
    timer.finish()
    timer.finish()  # sent once
    assert [(p.generation, p.samples, p.batch_len) for p in sent] == [(3, 4, 4)]
    assert sent[0].wall >= 0.005 and sent[0].cpu < 0.5 * sent[0].wall


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_a_fetch_that_only_lost_its_cpu_to_another_program_counts_as_all_cpu() -> None:
    """A CPU-bound fetch sharing its CPU with a busy program runs half the time: it must
    not look like a fetch that waits (the tuner would add workers to a full machine)."""
    cpu = min(os.sched_getaffinity(0))
    busy = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nprint('x', flush=True)\nwhile 1: pass"
    hog = subprocess.Popen([sys.executable, "-c", busy], stdout=subprocess.PIPE)
    mask = os.sched_getaffinity(0)
    raw: list[float] = []

    def spin(i: int) -> None:
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        while time.thread_time() - cpu0 < 0.03:
            pass
        raw.extend([time.perf_counter() - wall0, time.thread_time() - cpu0])

    try:
        assert hog.stdout is not None
        assert select.select([hog.stdout], [], [], 30)[0], "the busy program did not start"
        assert hog.stdout.read(1) == b"x"
        os.sched_setaffinity(0, {cpu})
        p = _probe_of(spin)
    finally:
        os.sched_setaffinity(0, mask)
        hog.kill()
        hog.wait(timeout=30)
        assert hog.stdout is not None
        hog.stdout.close()
    assert raw[1] < 0.8 * raw[0], f"no contention seen: {raw}"  # the premise
    assert p.cpu == p.wall >= raw[0]
