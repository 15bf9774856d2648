"""W4: a JPEG image folder through RandomResizedCrop(224) + flip + ToTensor + Normalize, batch 64.

torchvision's ImageFolder and transforms with torch's DataLoader against stoker.vision with
stoker's DataLoader, in one process, alternating (see ``harness.py``). Run it where both
torch and torchvision are installed (they need not be in stoker's dev env)::

    PYTHON benchmarks/w4_images.py [--workers 0 2] [--images 512] [--quick]

The images (500 x 375, about 80 KB, JPEG quality 90, smooth content plus grain so they
compress like photos) are written once under ``--data`` (default: a temp folder). One
timed run is one epoch over the folder, shuffled; stoker returns torch tensors
(``tensor_type="torch"``) so both sides hand the training loop the same thing. With
workers, both also run with persistent workers (no process start-up per epoch). CPU per
image counts the workers too. grain, torchdata's StatefulDataLoader and SPDL run torchvision's
dataset and transforms (they have no image pipeline of their own) where installed
(``benchmarks/peers.py``); ``--front torch`` builds stoker's contenders from ``stoker.torch``.
``--numpy`` adds "stoker numpy" contenders: stoker in a child process that never imports torch
and hands the loop NumPy batches, as a JAX or NumPy user runs it (``_serve_numpy``).
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import harness
import peers

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
BATCH = 64


def make_folder(root: Path, count: int, classes: int = 4, seed: int = 0) -> Path:
    """Write ``count`` 500 x 375 JPEGs (about 80 KB each) into ``classes`` folders, once."""
    from PIL import Image

    done = root / f".done-{count}"
    if done.exists():
        return root
    rng = np.random.default_rng(seed)
    for i in range(count):
        small = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize((500, 375), Image.Resampling.BICUBIC)
        grain = rng.integers(-14, 15, (375, 500, 3))
        arr = np.clip(np.asarray(img).astype(np.int16) + grain, 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, "JPEG", quality=90)
        folder = root / f"class{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:05d}.jpg").write_bytes(buf.getvalue())
    done.touch()
    return root


def _cpu_seconds() -> float:
    """CPU time of this process and of its children: those that ended (reaped here first)
    and those still running or not yet reaped (read from /proc)."""
    multiprocessing.active_children()  # reaps the workers that have exited
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    tick, me = os.sysconf("SC_CLK_TCK"), os.getpid()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[1]) == me:  # fields after the name: state, ppid, ... utime, stime
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _epoch(loader: Any) -> dict[str, float]:
    """One epoch: the images seen, its wall time from ``iter()`` to the end of the loop
    (worker start-up and shutdown included; reading the CPU times, ~3 ms for each side,
    left out), and the CPU seconds spent (``cpu_s / images`` is the CPU cost per image,
    steadier than the wall time when other programs share the cores)."""
    n = 0
    cpu = _cpu_seconds()
    start = time.perf_counter()
    for images, _ in loader:
        n += len(images)
    seconds = time.perf_counter() - start
    return {"images": float(n), "seconds": seconds, "cpu_s": _cpu_seconds() - cpu}


def torch_contender(root: Path, workers: int, persistent: bool = False) -> harness.Run:
    """torchvision ImageFolder + transforms + torch DataLoader, one epoch per call."""
    import torch.utils.data

    ds = torchvision_folder(root)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=BATCH, shuffle=True, num_workers=workers, persistent_workers=persistent
    )
    return lambda: _epoch(loader)


def torchvision_folder(root: Path) -> Any:
    """torchvision's ImageFolder of ``root`` with W4's transforms."""
    from torchvision import datasets
    from torchvision import transforms as T

    tf = T.Compose(
        [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
    )
    return datasets.ImageFolder(str(root), transform=tf)


def peer_contenders(root: Path, workers: int) -> dict[str, harness.Run | None]:
    """grain, StatefulDataLoader and SPDL over torchvision's folder and transforms, one
    shuffled epoch per call; None for a peer that is not installed."""

    def wrap(loader: Any) -> harness.Run:
        return lambda: _epoch(loader)

    ds = torchvision_folder(root)
    kw: dict[str, Any] = {"batch_size": BATCH, "shuffle": True, "num_workers": workers}
    return {
        "grain": peers.grain_loader_run(
            ds, batch_size=BATCH, workers=workers, wrap=wrap, shuffle=True
        ),
        "torchdata StatefulDataLoader": peers.statefuldl(ds, wrap=wrap, **kw),
        "spdl": peers.spdl(ds, wrap=wrap, **kw)
        or peers.spdl_in_process(
            ds, batch_size=BATCH, aggregate=peers.pairs, wrap=wrap, shuffle=True
        ),
    }


def stoker_contender(
    root: Path, workers: int, persistent: bool = False, stoker: Any = None, **kw: Any
) -> harness.Run:
    """stoker.vision ImageFolder + transforms (fused fast path) + the DataLoader of
    ``stoker`` (the front module: ``stoker`` by default, or ``stoker.torch``), with the
    loader arguments ``kw`` too (``w4_ray.py``: ``worker_mode="ray"``)."""
    if stoker is None:
        import stoker
    from stoker.vision import ImageFolder
    from stoker.vision import transforms as T

    tf = T.Compose(
        [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
    )
    ds = ImageFolder(str(root), transform=tf)
    loader = stoker.DataLoader(
        ds,
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        tensor_type="torch",
        persistent_workers=persistent,
        **kw,
    )
    return lambda: _epoch(loader)


def _serve_numpy(root: str, workers: int, persistent: bool) -> None:
    """The "stoker numpy" child: one epoch per line read on stdin, its counts as one JSON line
    on stdout; torch is never imported (checked after every epoch)."""
    import stoker
    from stoker.vision import ImageFolder
    from stoker.vision import transforms as T

    tf = T.Compose(
        [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
    )
    loader = stoker.DataLoader(
        ImageFolder(root, transform=tf),
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        persistent_workers=persistent,
    )
    for _ in sys.stdin:
        counts = _epoch(loader)
        assert "torch" not in sys.modules, "the NumPy-only stoker process imported torch"
        print(json.dumps(counts), flush=True)


def numpy_contender(root: Path, workers: int, persistent: bool = False) -> harness.Run:
    """stoker in a child process without torch (NumPy batches), one epoch per call."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve-numpy", str(root), str(workers), str(persistent)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdin is not None and child.stdout is not None
    stdin, stdout = child.stdin, child.stdout

    def run() -> dict[str, float]:
        stdin.write("run\n")
        stdin.flush()
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"the stoker numpy child exited with {child.wait()}")
        counts: dict[str, float] = json.loads(line)
        return counts

    return run


def main() -> None:
    """Parse the command line, build the folder, and compare per worker count."""
    import argparse

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    extra.add_argument("--images", type=int, default=512)
    extra.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "stoker_w4"))
    extra.add_argument("--numpy", action="store_true", help="add the NumPy-only stoker process")
    ours, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    args = harness.cli(__doc__.splitlines()[0], repeats=5, front=True)
    front = harness.stoker_front(args.front)
    root = make_folder(Path(ours.data) / f"img{ours.images}", ours.images)
    for workers in ours.workers:
        contenders = {"torch": torch_contender(root, workers)}
        try:
            stoker_run = stoker_contender(root, workers, stoker=front)
            stoker_run()  # fails here, before timing, when the mode is missing
            contenders["stoker"] = stoker_run
        except NotImplementedError as exc:
            print(f"\nstoker with num_workers={workers} is not available yet: {exc}")
            continue
        if ours.numpy:
            contenders["stoker numpy"] = numpy_contender(root, workers)
        if workers:  # workers kept from one epoch to the next: no start-up per run
            contenders["torch persistent"] = torch_contender(root, workers, persistent=True)
            contenders["stoker persistent"] = stoker_contender(
                root, workers, persistent=True, stoker=front
            )
            if ours.numpy:
                contenders["stoker numpy persistent"] = numpy_contender(
                    root, workers, persistent=True
                )
        contenders = peers.add(contenders, peer_contenders(root, workers))
        record = harness.compare(
            f"w4_images_{workers}w{harness.front_suffix(args.front)}",
            contenders,
            repeats=args.repeats,
            config={
                "images": ours.images,
                "batch_size": BATCH,
                "num_workers": workers,
                "size": "500x375",
                "transform": "RandomResizedCrop(224)+flip+ToTensor+Normalize",
            },
            warmup=args.warmup,
        )
        for name, result in record["results"].items():
            ms = statistics.median(1000 * r["cpu_s"] / r["images"] for r in result["runs"])
            print(f"{name:<28} CPU per image (median): {ms:.2f} ms")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-numpy"]:
        _serve_numpy(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "True")
    else:
        main()
