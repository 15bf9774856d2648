"""Resume cost: time from ``load_state_dict`` to the first batch, deep in an epoch vs at 0.

A 1M-sample shuffled ``TensorDataset``, batch 64 (15,625 batches an epoch), in process,
at batch 10,000: stoker skips delivered batches without fetching them, so resuming deep
into an epoch should cost about what resuming at its start does (target: < 50 ms more).

A 1M-sample iterable stream, batch 64, at 90% of the epoch (batch 14,062): with
``state_dict`` / ``load_state_dict`` (torchdata's ``Stateful`` protocol) it resumes from its
state (target: < 50 ms more than at 0); the same stream without them is replayed (every
sample before the checkpoint produced again), its cost reported beside it.

    python benchmarks/resume_cost.py [--repeats R] [--quick]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import harness
import stoker

N, BATCH, DEEP = 1_000_000, 64, 10_000
STREAM_DEEP = N // BATCH * 9 // 10  # batch 14,062: 90% of the stream's epoch


class ReplayedStream(stoker.IterableDataset):  # type: ignore[type-arg]
    """N samples (a small array each, a little work per sample), without the protocol."""

    def __init__(self) -> None:
        self.pos, self._start = 0, 0

    def __iter__(self) -> Any:
        self.pos, self._start = self._start, 0
        while self.pos < N:
            self.pos += 1
            yield np.full(4, self.pos, np.int64)


class StatefulStream(ReplayedStream):
    """The same stream with torchdata's protocol: its state is its position."""

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._start = state["pos"]


def stream_state(cls: type, batches: int) -> dict[str, Any]:
    """The state a loader of ``cls`` saves after ``batches`` batches (made by editing the
    one after the first batch, so that making it costs no epoch)."""
    saver = stoker.DataLoader(cls(), batch_size=BATCH)
    it = iter(saver)
    next(it)
    state = saver.state_dict()
    state["delivered"] = batches
    if state["stream"] is not None:
        state["stream"] = {**state["stream"], "delivered": batches, "step": batches}
        state["stream"]["workers"] = [{"dataset": {"pos": batches * BATCH}, "iterator": None}]
    return state


def stream_first_batch(cls: type, state: dict[str, Any]) -> float:
    """Seconds from a fresh stream loader's ``load_state_dict(state)`` to its first batch,
    checked to be the batch after the checkpoint."""
    loader = stoker.DataLoader(cls(), batch_size=BATCH)
    t0 = time.perf_counter()
    loader.load_state_dict(state)
    batch = next(iter(loader))
    seconds = time.perf_counter() - t0
    assert int(batch[0, 0]) == state["delivered"] * BATCH + 1, "resumed at the wrong sample"
    return seconds


def stream_rows(repeats: int) -> dict[str, float]:
    """Median seconds to the first batch: the stateful stream at 0 and at 90%, and the
    replayed one at 90% (fewer repeats: each replays 900k samples)."""
    times: dict[str, list[float]] = {"stateful at 0": [], "stateful at 90%": []}
    at0, deep = stream_state(StatefulStream, 0), stream_state(StatefulStream, STREAM_DEEP)
    for _ in range(repeats):
        times["stateful at 0"].append(stream_first_batch(StatefulStream, at0))
        times["stateful at 90%"].append(stream_first_batch(StatefulStream, deep))
    replayed = stream_state(ReplayedStream, STREAM_DEEP)
    times["replayed at 90%"] = [
        stream_first_batch(ReplayedStream, replayed) for _ in range(max(1, repeats // 4))
    ]
    return {k: statistics.median(v) for k, v in times.items()}


def time_to_first_batch(dataset: Any, state: dict[str, Any]) -> float:
    """Seconds from a fresh loader's ``load_state_dict(state)`` to its first batch."""
    loader = stoker.DataLoader(dataset, batch_size=BATCH, shuffle=True, generator=0)
    t0 = time.perf_counter()
    loader.load_state_dict(state)
    next(iter(loader))
    return time.perf_counter() - t0


def main() -> None:
    args = harness.cli(__doc__ or "", repeats=11)
    x = np.arange(N, dtype=np.float32)
    dataset = stoker.TensorDataset(x)
    state = stoker.DataLoader(dataset, batch_size=BATCH, shuffle=True, generator=0).state_dict()
    deep = {**state, "delivered": DEEP}
    times: dict[str, list[float]] = {"batch 0": [], f"batch {DEEP:,}": []}
    for _ in range(args.repeats):
        times["batch 0"].append(time_to_first_batch(dataset, state))
        times[f"batch {DEEP:,}"].append(time_to_first_batch(dataset, deep))
    med = {k: statistics.median(v) for k, v in times.items()}
    extra_ms = (med[f"batch {DEEP:,}"] - med["batch 0"]) * 1e3
    print(f"resume, 1M samples shuffled, batch {BATCH}, median of {args.repeats}:")
    for k, v in med.items():
        print(f"  resume at {k:<13} {v * 1e3:8.2f} ms to the first batch")
    print(f"  extra cost of resuming deep: {extra_ms:.2f} ms (target < 50 ms)")
    streams = stream_rows(args.repeats)
    stream_extra_ms = (streams["stateful at 90%"] - streams["stateful at 0"]) * 1e3
    print(f"resume, 1M-sample stream, batch {BATCH}, at batch {STREAM_DEEP:,} (90%):")
    for k, v in streams.items():
        print(f"  {k:<16} {v * 1e3:10.2f} ms to the first batch")
    print(f"  extra cost of resuming the stateful stream deep: {stream_extra_ms:.2f} ms "
          "(target < 50 ms)")
    record = {
        "workload": "resume_cost",
        "command": harness.command(),
        "config": {"samples": N, "batch_size": BATCH, "deep": DEEP},
        "repeats": args.repeats,
        "cores": harness.os.cpu_count(),
        "versions": harness.versions(),
        "median_ms": {k: v * 1e3 for k, v in med.items()},
        "extra_ms": extra_ms,
        "stream_median_ms": {k: v * 1e3 for k, v in streams.items()},
        "stream_extra_ms": stream_extra_ms,
    }
    harness.RESULTS.mkdir(exist_ok=True)
    (harness.RESULTS / "resume_cost.json").write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
