"""Issue 26's checks on a GPU, in one call: pinning, one-copy pinning, seed 004, W4 GPU decode.

Run from the repository root on a machine with CUDA and torchvision (nothing is fetched;
the C extension is optional)::

    PYTHONPATH=src python tests/gpu/run_gpu_checks.py [--out DIR] [--quick]

Every check runs in its own try/except, so one call reports them all; each prints one
compact block and the whole record goes to ``DIR/gpu_checks.json`` (``$OUT`` when set, else
the current directory). ``--quick`` shortens the measurements (a smoke run, about a minute).

The checks:

1. ``pinning``: with pin_memory=True, every tensor leaf of every batch is pinned for 0,
   thread and process workers (torch tensors from the dataset, and NumPy samples with
   ``tensor_type="torch"``; dicts and namedtuples), values as unpinned; a custom batch
   type's ``pin_memory()`` is called; ``pin_memory_device="cuda:0"`` pins and ``"xpu"`` is
   refused; process workers' slots are registered (no copy: leaves pinned in place).
2. ``pytest``: tests/test_pin.py, tests/test_vision_gpu.py and the bench's pin tests, which
   skip without CUDA elsewhere (needs pytest; reported as an error without it).
3. ``overlap``: ``.to("cuda", non_blocking=True)`` returns before its copy ends, and the
   copy (queued behind a training step's GPU time) overlaps the next batch's loading in
   process (asserted) and with 4 workers (reported).
4. ``w2_one_copy``: GB/s reaching the GPU on W2, stoker with registered slots (one copy),
   stoker copying into pinned memory, torch's pin thread; same run.
5. ``seed004``: the pin_memory x non_blocking table, stoker beside torch; and
   ``stoker_bench``: the ``stoker bench`` command printing that table on the GPU.
6. ``w4_agreement``: GPU-decoded W4 batches against the CPU path's, in 8-bit levels
   (tolerance: mean <= 2, 99th percentile <= 12).
7. ``w4_decode``: W4 images/s reaching the GPU: GPU decode, torchvision's CPU pipeline,
   stoker's CPU path.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parents[2]
MEAN_TOL, P99_TOL = 2.0, 12.0


class Pair(NamedTuple):
    first: Any
    second: Any


class DictSamples:
    """Torch samples: a dict of a tensor, a nested dict, and a namedtuple."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> Any:
        import torch

        x = torch.full((64, 64), float(i))
        return {"x": x, "nested": {"y": torch.tensor(i)}, "pair": Pair(x[0], torch.tensor([i]))}


class NumpySamples:
    """NumPy samples (batched as torch tensors with tensor_type="torch")."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> Any:
        import numpy as np

        return np.full((256, 256), i, np.float32), i


class CustomBatch:
    """A batch type with its own pin_memory(), made by :func:`custom_collate`."""

    def __init__(self, x: Any) -> None:
        self.x = x
        self.pinned_by_method = False

    def pin_memory(self) -> CustomBatch:
        out = CustomBatch(self.x.pin_memory())
        out.pinned_by_method = True
        return out


def custom_collate(samples: list[Any]) -> CustomBatch:
    import torch

    return CustomBatch(torch.stack([torch.as_tensor(s[0]) for s in samples]))


def tensor_leaves(x: Any) -> list[Any]:
    """The torch tensors in ``x``, through dicts, lists and tuples."""
    import torch

    if isinstance(x, dict):
        return [leaf for v in x.values() for leaf in tensor_leaves(v)]
    if isinstance(x, (list, tuple)):
        return [leaf for v in x for leaf in tensor_leaves(v)]
    return [x] if isinstance(x, torch.Tensor) else []


def copies_read_their_own_batch(batches: int = 16) -> int:
    """Process workers, pinned slots: each batch is dropped right after its
    ``.to("cuda", non_blocking=True)``, queued behind ~20 ms of GPU work, so its slot would
    be refilled before the copy reads it if slots came back at once. Raises AssertionError
    unless every copy holds its own batch; returns the batches checked."""
    import torch

    import stoker

    values = torch.arange(4 * batches, dtype=torch.float32)
    ds = stoker.TensorDataset(values[:, None].expand(-1, 1 << 18).contiguous())
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=2, pin_memory=True)
    copies = []
    for (x,) in loader:
        assert x.is_pinned()
        torch.cuda._sleep(20_000_000)  # GPU cycles queued before the copy
        copies.append(x.to("cuda", non_blocking=True))
        del x
    torch.cuda.synchronize()
    for k, y in enumerate(copies):
        want = values[4 * k : 4 * k + 4, None].expand(-1, 1 << 18)
        assert torch.equal(y.cpu(), want), f"batch {k} was overwritten before its copy"
    return len(copies)


def check_pinning(quick: bool) -> dict[str, Any]:
    """Check 1 (see the module docstring); raises AssertionError on the first failure."""
    import torch

    import stoker
    from stoker._engine import _pin

    out: dict[str, Any] = {}
    modes: list[tuple[int, str | None]] = [(0, None), (2, "thread"), (2, "process")]
    for ds, extra in ((DictSamples(), {}), (NumpySamples(), {"tensor_type": "torch"})):
        for workers, mode in modes:
            kw: dict[str, Any] = {"batch_size": 8, "num_workers": workers, **extra}
            if mode:
                kw["worker_mode"] = mode
            key = f"{type(ds).__name__} {workers} {mode or 'in process'}"
            pinned = stoker.DataLoader(ds, pin_memory=True, **kw)
            it = iter(pinned)
            got = list(it)
            want = list(stoker.DataLoader(ds, **kw))
            leaves = [leaf for b in got for leaf in tensor_leaves(b)]
            assert leaves and all(leaf.is_pinned() for leaf in leaves), f"{key}: not all pinned"
            for a, b in zip(got, want, strict=True):
                pairs = zip(tensor_leaves(a), tensor_leaves(b), strict=True)
                assert all(torch.equal(x, y) for x, y in pairs), f"{key}: values differ"
            entry: dict[str, Any] = {"batches": len(got), "leaves_pinned": len(leaves)}
            if mode == "process":
                pins = it._pool.workers[0].slots.maps.pins
                assert pins is not None and pins.failure is None, f"{key}: {pins and pins.failure}"
                assert pins.registered > 0, f"{key}: no slot registered"
                first = tensor_leaves(got[-1])[0]
                assert _pin.in_registered_slot(first.data_ptr()), f"{key}: a copy, not the slot"
                entry["slots_registered"] = pins.registered
                entry["register_s"] = round(pins.seconds, 4)
            out[key] = entry
    for workers, mode in modes:
        kw = {"batch_size": 8, "num_workers": workers, "collate_fn": custom_collate}
        if mode:
            kw["worker_mode"] = mode
        batch = next(iter(stoker.DataLoader(NumpySamples(), pin_memory=True, **kw)))
        assert isinstance(batch, CustomBatch) and batch.pinned_by_method, "custom pin_memory()"
        assert batch.x.is_pinned()
    out["custom pin_memory() called"] = True
    out["copies read their own batch"] = copies_read_their_own_batch()
    dev = stoker.DataLoader(
        DictSamples(), batch_size=8, pin_memory=True, pin_memory_device="cuda:0"
    )
    assert all(leaf.is_pinned() for leaf in tensor_leaves(next(iter(dev))))
    try:
        next(iter(stoker.DataLoader(DictSamples(), pin_memory=True, pin_memory_device="xpu")))
    except ValueError as exc:
        out["pin_memory_device='xpu'"] = f"ValueError: {exc}"
    else:
        raise AssertionError("pin_memory_device='xpu' was accepted")
    out["pin_memory_device='cuda:0'"] = "pinned"
    theirs = next(iter(torch.utils.data.DataLoader(DictSamples(), batch_size=8, pin_memory=True)))
    out["torch's leaves pinned (reference)"] = all(t.is_pinned() for t in tensor_leaves(theirs))
    return out


def check_pytest(quick: bool) -> dict[str, Any]:
    """Check 2: the CUDA tests of the suite (they skip without CUDA elsewhere)."""
    tests = ["tests/test_pin.py", "tests/test_vision_gpu.py", "tests/test_bench.py"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *tests]
    cmd += ["-k", "not test_bench or pin"]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO / 'tests'}"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-25:]
    if proc.returncode != 0:
        raise AssertionError("pytest failed:\n" + "\n".join(tail))
    return {"returncode": proc.returncode, "tail": tail}


def check_overlap(quick: bool) -> dict[str, Any]:
    """Check 3."""
    import gpu_pin

    # In process the loop loads the next batch itself, so the overlap shows in the epoch
    # time; with workers loading ahead it already overlaps (reported, not asserted).
    out = {"0 workers": gpu_pin.overlap(0, 1 if quick else 3)}
    out["4 workers (informational)"] = gpu_pin.overlap(4, 1 if quick else 3)
    r = out["0 workers"]
    assert r["call_returns_early"], "the non_blocking call waited for its copy"
    assert r["overlaps"], f"only {r['hidden']:.0%} of the GPU time overlapped the loading"
    return out


def check_w2(quick: bool) -> dict[str, Any]:
    """Check 4."""
    import gpu_pin

    r = gpu_pin.w2_to_gpu(4, 1 if quick else 3)
    assert r["stoker one-copy"]["pinned_fraction"] == 1.0, "one-copy batches not pinned"
    return r


def check_seed004(quick: bool) -> dict[str, Any]:
    """Check 5."""
    import gpu_pin

    return gpu_pin.seed004(batches=4 if quick else 10)


def check_stoker_bench(quick: bool) -> dict[str, Any]:
    """Check 5b: the ``stoker bench`` command itself prints the sweep's table on a GPU."""
    out = Path(tempfile.mkdtemp(prefix="stoker-bench-"))
    argv = ["bench", "--workers", "0,4", "--worker-mode", "process", "--samples", "400",
            "--sleep-ms", "0", "--batches", "4" if quick else "8", "--repeats", "1",
            "--json", str(out / "bench.json"), "--no-plot", "--quiet"]  # fmt: skip
    code = "import sys; from stoker._cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=240
    )
    lines = proc.stdout.splitlines()
    table = [line for line in lines if line.startswith("pin_memory=")]
    if proc.returncode != 0 or len(table) != 4:
        raise AssertionError(f"stoker bench: status {proc.returncode}\n{proc.stdout}{proc.stderr}")
    record = json.loads((out / "bench.json").read_text())["pin_memory_x_non_blocking"]
    return {"tail": lines[-6:], "device": record["device"], "config": record["config"]}


def _w4_root(quick: bool) -> Path:
    import w4_images

    count = 256 if quick else 1024
    return w4_images.make_folder(Path(tempfile.gettempdir()) / f"stoker-w4-{count}", count)


def check_w4_agreement(quick: bool) -> dict[str, Any]:
    """Check 6."""
    import gpu_decode

    r = gpu_decode.agreement(_w4_root(quick))
    assert r["mean_levels"] <= MEAN_TOL and r["p99_levels"] <= P99_TOL, f"beyond tolerance: {r}"
    return {**r, "tolerance": {"mean_levels": MEAN_TOL, "p99_levels": P99_TOL}}


def check_w4_decode(quick: bool) -> dict[str, Any]:
    """Check 7."""
    import gpu_decode

    return gpu_decode.w4(_w4_root(quick), 8, 1 if quick else 3)


def environment(quick: bool) -> dict[str, Any]:
    """Versions and the device."""
    import torch

    info: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__}
    info["cuda"] = torch.version.cuda
    info["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    info["cpus"] = os.cpu_count()
    try:
        import torchvision

        info["torchvision"] = torchvision.__version__
    except ImportError as exc:
        info["torchvision"] = f"missing: {exc}"
    try:
        from stoker.vision import _native  # noqa: F401

        info["stoker C kernels"] = "built"
    except ImportError:
        info["stoker C kernels"] = "not built (the CPU path uses simplejpeg / Pillow)"
    info["cuda_available"] = torch.cuda.is_available()
    if not info["cuda_available"]:
        print("CUDA is not available: every other check fails.", flush=True)
    return info


CHECKS: list[tuple[str, Callable[[bool], dict[str, Any]]]] = [
    ("environment", environment),
    ("pinning", check_pinning),
    ("pytest", check_pytest),
    ("overlap", check_overlap),
    ("w2_one_copy", check_w2),
    ("seed004", check_seed004),
    ("stoker_bench", check_stoker_bench),
    ("w4_agreement", check_w4_agreement),
    ("w4_decode", check_w4_decode),
]


def main() -> int:
    """Run every check, print a compact report, write the JSON; 1 if any check failed."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", nargs="*", default=None, help="run only these checks")
    args = p.parse_args()
    sys.path.insert(0, str(REPO / "benchmarks"))
    record: dict[str, Any] = {"command": " ".join(sys.argv), "quick": args.quick}
    failed = []
    for name, check in CHECKS:
        if args.only and name not in args.only:
            continue
        began = time.perf_counter()
        try:
            result = check(args.quick)
            status = "PASS"
        except Exception as exc:
            result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            status = "FAIL"
            failed.append(name)
        seconds = time.perf_counter() - began
        record[name] = {"status": status, "seconds": round(seconds, 1), **result}
        print(f"== {name}: {status} ({seconds:.1f} s)", flush=True)
        shown = {k: v for k, v in result.items() if k not in ("traceback", "rows", "tail")}
        print(json.dumps(shown, indent=1, default=str)[:3000], flush=True)
        if "tail" in result:
            print("\n".join(result["tail"]))
        if status == "FAIL":
            print(result["traceback"][-2000:], flush=True)
    out = Path(args.out) / "gpu_checks.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, default=str))
    print(f"wrote {out}; failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
