"""Pinned batches on a GPU: one-copy pinning against torch's pin thread, overlap, seed 004.

Needs CUDA. Three measurements, each a function that returns a JSON-ready dict (used by
``tests/gpu/run_gpu_checks.py`` too)::

    PYTHONPATH=src python benchmarks/gpu_pin.py [--workers 4] [--epochs 3] [--json out.json]

- :func:`w2_to_gpu`: W2's samples (1 MiB float32 each, batch 100, no work) through each
  loader with ``pin_memory=True`` and ``.to("cuda", non_blocking=True)`` per batch: GB/s
  reaching the GPU for stoker with its slots registered (one CPU copy: worker -> pinned
  slot -> GPU), stoker with registration off (a copy into pinned memory per batch, as
  torch), and torch's DataLoader (its pin thread), alternating, persistent workers.
- :func:`overlap`: whether ``.to("cuda", non_blocking=True)`` of a pinned batch returns
  before its copy ends, and how much of the GPU's time (a step as long as loading a batch,
  then the copy) the loop stops waiting for: the copy overlaps the next batch's loading.
- :func:`seed004`: seed 004's pin_memory x non_blocking script (``stoker bench``'s sweep),
  stoker beside torch, on the same data.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from w2_transport import BATCH, FLOATS, N, NumpySamples, TorchSamples  # W2's samples


def _loader(which: str, workers: int) -> Any:
    """A persistent, pinning loader over W2's samples: stoker (slots registered or not) or
    torch."""
    import torch

    import stoker
    from stoker._engine import _pin

    kw: dict[str, Any] = {"batch_size": BATCH, "num_workers": workers, "pin_memory": True}
    kw["persistent_workers"] = workers > 0
    if which == "torch":
        return torch.utils.data.DataLoader(TorchSamples(), **kw)
    _pin.REGISTER_SLOTS = which == "stoker one-copy"
    try:
        loader = stoker.DataLoader(NumpySamples(), tensor_type="torch", **kw)
        if workers:
            iter(loader)  # the pool (and its slot registration choice) is made now
    finally:
        _pin.REGISTER_SLOTS = True
    return loader


def _epoch_to_gpu(loader: Any, non_blocking: bool = True, gpu_cycles: int = 0) -> dict[str, float]:
    """One epoch, each batch copied to the GPU (behind ``gpu_cycles`` of queued GPU work,
    a training step, when given); seconds until the GPU has the last one."""
    import torch

    nbytes, wait, pinned, leaves = 0, 0.0, 0, 0
    keep = []
    start = time.perf_counter()
    it = iter(loader)
    while True:
        asked = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        wait += time.perf_counter() - asked
        leaves += 1
        pinned += int(batch.is_pinned())
        if gpu_cycles:
            torch.cuda._sleep(gpu_cycles)
        keep.append(batch.to("cuda", non_blocking=non_blocking))
        nbytes += batch.numel() * batch.element_size()
        del batch
        if len(keep) > 2:
            keep.pop(0)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {
        "GB_per_s": nbytes / seconds / 1e9,
        "seconds": seconds,
        "wait_s": wait,
        "pinned_fraction": pinned / max(1, leaves),
    }


LOADERS = ("stoker one-copy", "stoker copy", "torch")


def w2_to_gpu(workers: int = 4, epochs: int = 3) -> dict[str, Any]:
    """GB/s reaching the GPU for each of :data:`LOADERS` (median of ``epochs``, after one
    warm-up epoch each), in the same run, alternating."""
    loaders = {name: _loader(name, workers) for name in LOADERS}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in LOADERS}
    for name in LOADERS:
        _epoch_to_gpu(loaders[name])  # warm-up: workers start, slots are registered
    for i in range(epochs):
        for name in LOADERS if i % 2 == 0 else LOADERS[::-1]:
            runs[name].append(_epoch_to_gpu(loaders[name]))
    out: dict[str, Any] = {"workers": workers, "batch": BATCH, "sample_bytes": FLOATS * 4}
    for name in LOADERS:
        out[name] = {
            "GB_per_s": statistics.median(r["GB_per_s"] for r in runs[name]),
            "wait_s": statistics.median(r["wait_s"] for r in runs[name]),
            "pinned_fraction": min(r["pinned_fraction"] for r in runs[name]),
            "runs_GB_per_s": [round(r["GB_per_s"], 3) for r in runs[name]],
        }
    it = iter(loaders["stoker one-copy"])
    pins = it._pool.workers[0].maps.pins
    out["slots_registered"] = pins.registered if pins is not None else 0
    out["register_s"] = pins.seconds if pins is not None else 0.0
    out["one_copy_vs_torch"] = out["stoker one-copy"]["GB_per_s"] / out["torch"]["GB_per_s"]
    del it, loaders
    return out


def overlap(workers: int = 0, epochs: int = 3) -> dict[str, Any]:
    """Whether ``.to("cuda", non_blocking=True)`` overlaps with loading the next batch.

    The call is timed against its copy for one pinned batch. Then each batch's copy is
    queued behind GPU work as long as loading a batch takes (a training step), with
    blocking and with non-blocking copies: ``hidden`` is the share of that GPU time the
    loop no longer waits for (1: all of it, the copy and the step overlap the next batch's
    loading; 0: none).
    """
    import torch

    x = torch.ones(BATCH * FLOATS, dtype=torch.float32).pin_memory()  # one batch, 100 MiB
    copies = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        x.to("cuda")
        torch.cuda.synchronize()
        copies.append(time.perf_counter() - t0)
    copy_s = statistics.median(copies)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    y = x.to("cuda", non_blocking=True)
    call_s = time.perf_counter() - t0
    torch.cuda.synchronize()
    del y
    loader = _loader("stoker one-copy", workers)
    _epoch_to_gpu(loader)  # warm-up
    batches = N // BATCH
    load_s = _time_loading(loader) / batches
    cycles = _cycles(load_s)
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(epochs):
        for nb in (True, False) if i % 2 == 0 else (False, True):
            run = _epoch_to_gpu(loader, non_blocking=nb, gpu_cycles=cycles)
            times[nb].append(run["seconds"])
    blocking, non_blocking = statistics.median(times[False]), statistics.median(times[True])
    hidden = (blocking - non_blocking) / (load_s * batches)
    return {
        "workers": workers,
        "copy_s": copy_s,
        "call_s": call_s,
        "call_returns_early": call_s < 0.25 * copy_s,
        "load_s_per_batch": load_s,
        "epoch_blocking_s": blocking,
        "epoch_non_blocking_s": non_blocking,
        "hidden": hidden,
        "overlaps": hidden >= 0.5,
    }


def _time_loading(loader: Any) -> float:
    """Seconds of one epoch without any copy."""
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def _cycles(seconds: float) -> int:
    """GPU clock cycles that ``torch.cuda._sleep`` spins for about ``seconds``."""
    import torch

    probe = 50_000_000
    torch.cuda._sleep(probe)  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(probe)
    torch.cuda.synchronize()
    return max(1, int(probe * seconds / (time.perf_counter() - t0)))


def seed004(workers: int = 5, batches: int = 10, compute_s: float = 0.02) -> dict[str, Any]:
    """Seed 004's pin_memory x non_blocking sweep, stoker beside torch (one run each)."""
    from stoker import _bench

    ds = _bench.SyntheticDataset(N, FLOATS * 4, 0.0)
    config = _bench.Config(workers, "process", BATCH)
    rows = _bench.pin_sweep(
        ds, config, "cuda", repeats=1, batches=batches, warmup=2, compute_s=compute_s
    )
    return {"config": config.loader_kwargs(), "rows": rows, "table": _bench.format_pin_table(rows)}


def main() -> None:
    """Run the three measurements and print them (and write JSON with --json)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    record = {
        "w2_to_gpu": w2_to_gpu(args.workers, args.epochs),
        "overlap": overlap(0),
        "overlap_workers": overlap(args.workers),
        "seed004": seed004(),
    }
    print(json.dumps({k: v for k, v in record.items() if k != "seed004"}, indent=1))
    print(record["seed004"]["table"])
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1, default=str))


if __name__ == "__main__":
    main()
