"""The worker's timing of its first samples (stoker._engine._probe), in this process."""

from __future__ import annotations

import hashlib
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from stoker._engine._messages import Probe
from stoker._engine._probe import SampleTimer
from stoker._policy import GIL_FREE_SPEEDUP, PROBE_SAMPLES


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


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_threads_side_by_side_on_one_cpu_count_the_cpu_they_got() -> None:
    """Seven threads hashing (the GIL released) on one CPU never block, each preempted by
    the others: together they use one CPU, not seven, so the GIL-free speed-up they show
    must be about 1x (up to 7x when a span that never blocked counted as all CPU)."""
    cpu = min(os.sched_getaffinity(0))
    blob = bytes(32 << 20)  # 20-30 ms a hash: far longer than a time slice
    sent: list[Probe] = []
    timer = SampleTimer(sent.append, 1, PROBE_SAMPLES)
    timed = timer.wrap(lambda i: hashlib.sha256(blob).digest())
    timed(0)  # the first sample, alone
    start = threading.Barrier(PROBE_SAMPLES - 1, timeout=30)

    def helper(i: int) -> None:
        os.sched_setaffinity(0, {cpu})  # this thread only
        start.wait()
        timed(i)

    threads = [threading.Thread(target=helper, args=(i,)) for i in range(1, PROBE_SAMPLES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads) and len(sent) == 1
    p = sent[0]
    assert p.threads == PROBE_SAMPLES - 1
    assert p.threads * p.rest_cpu / p.rest_wall < GIL_FREE_SPEEDUP, p
