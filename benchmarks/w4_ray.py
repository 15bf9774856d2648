"""W4 on a Ray cluster: stoker's Ray workers against Ray Data and stoker's local workers.

The W4 folder (see ``w4_images.py``) through RandomResizedCrop(224) + flip + ToTensor +
Normalize, batch 64, torch tensors, one shuffled epoch per run, three ways on the same
CPUs: stoker with 2 local process workers (persistent), stoker with 2 Ray workers
(``worker_mode="ray"``, persistent actors on the cluster's second node), and Ray Data's own
pipeline, ``read_images`` + ``map_batches`` (the same transforms in NumPy and Pillow) +
``iter_torch_batches``, its tasks on the same node. The ratio column is each contender's
images/s over stoker's local workers': Ray's overhead for stoker, Ray Data's standing.
"stoker ray, loop's node" places the Ray workers on the head, beside the loop: the object
store without the transfer between nodes.

The cluster (a head without CPUs, where the loop runs, and a node with 2 CPUs) starts
inside a private network namespace with only loopback, as the tests run Ray: the script
re-runs itself under ``unshare -n`` (root, or a user namespace, needed)::

    PYTHON benchmarks/w4_ray.py [--images 256] [--repeats 5] [--quick]
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import harness
from w4_images import BATCH, MEAN, STD, _epoch, make_folder, stoker_contender

WORKERS = 2
STORE_BYTES = 1 << 30
"""Each node's object store: room for the batches in flight (2 workers x 2 prefetched x
38.5 MB, and as many arriving on the head) without spilling to disk, as on a real cluster."""


def _isolated() -> bool:
    """Whether this process's network namespace has only the loopback interface."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def _in_namespace() -> None:
    """Run this script again inside ``unshare -n`` (loopback up), with Ray's files in a
    short temporary directory removed afterwards; exit with its status."""
    tmp = tempfile.mkdtemp(prefix="stkr", dir="/tmp")
    env = {**os.environ, "RAY_TMPDIR": tmp, "RAY_USAGE_STATS_ENABLED": "0"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    args = " ".join(map(_quoted, sys.argv[1:]))
    script = f"ip link set lo up && exec {sys.executable} {__file__} {args}"
    try:
        code = subprocess.call(["unshare", "-n", "sh", "-c", script], env=env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(code)


def _quoted(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


def _crop(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """RandomResizedCrop(224) + flip + ToTensor + Normalize of one HWC uint8 image, as
    torchvision draws it (scale 0.08-1, ratio 3/4-4/3, ten tries, else the centre)."""
    from PIL import Image

    h, w = img.shape[:2]
    area = h * w
    box = (0, 0, w, h)
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        cw, ch = round(float(np.sqrt(target * ratio))), round(float(np.sqrt(target / ratio)))
        if 0 < cw <= w and 0 < ch <= h:
            x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            box = (x, y, x + cw, y + ch)
            break
    out = Image.fromarray(img).resize((224, 224), Image.Resampling.BILINEAR, box=box)
    arr = np.asarray(out, dtype=np.float32) / 255.0
    if rng.random() < 0.5:
        arr = arr[:, ::-1]
    arr = (arr - np.asarray(MEAN, np.float32)) / np.asarray(STD, np.float32)
    return np.ascontiguousarray(arr.transpose(2, 0, 1))


def _transform(batch: dict[str, Any]) -> dict[str, Any]:
    """Ray Data's ``map_batches`` function: W4's transforms on a batch of decoded images;
    the label is the class folder's number."""
    rng = np.random.default_rng()
    images = np.stack([_crop(img, rng) for img in batch["image"]])
    labels = np.array([int(Path(p).parent.name.removeprefix("class")) for p in batch["path"]])
    return {"image": images, "label": labels}


def ray_data_contender(root: Path) -> harness.Run:
    """Ray Data: read_images + map_batches + iter_torch_batches, one epoch per call (the
    dataset is read again each epoch, shuffled as Ray Data shuffles files)."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False

    def run() -> dict[str, float]:
        ds = ray.data.read_images(str(root), mode="RGB", include_paths=True, shuffle="files")
        ds = ds.map_batches(_transform, batch_size=BATCH, batch_format="numpy")
        batches = ds.iter_torch_batches(batch_size=BATCH)
        return _epoch((b["image"], b["label"]) for b in batches)

    return run


def _ray_workers(root: Path, resource: str) -> harness.Run:
    """stoker's 2 persistent Ray workers, on the node that has ``resource``. They reserve
    no CPU: they idle while Ray Data runs on the node's 2 CPUs (reserving them, they would
    leave its tasks unplaced), so both pipelines use the same CPUs in turn."""
    options = {"num_cpus": 0, "resources": {resource: 1}}
    return stoker_contender(root, WORKERS, True, worker_mode="ray", ray_options=options)


def _cluster() -> Any:
    """The benchmark's cluster, joined: a head without CPUs (the loop; resource ``head``)
    and a node with :data:`WORKERS` CPUs (resource ``second``)."""
    import ray
    from ray.cluster_utils import Cluster

    store = {"object_store_memory": STORE_BYTES, "include_dashboard": False}
    head = {"num_cpus": 0, "resources": {"head": WORKERS}, **store}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    cluster.add_node(num_cpus=WORKERS, resources={"second": WORKERS}, **store)
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster


def main() -> None:
    """Parse the command line, build the folder and the cluster, compare, stop the cluster."""
    import argparse

    import ray

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--images", type=int, default=256)
    extra.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "stoker_w4"))
    ours, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    args = harness.cli(__doc__.splitlines()[0], repeats=5)
    root = make_folder(Path(ours.data) / f"img{ours.images}", ours.images)
    started = time.perf_counter()
    cluster = _cluster()
    print(f"cluster up in {time.perf_counter() - started:.1f} s", flush=True)
    try:
        contenders = {
            "stoker process": stoker_contender(root, WORKERS, persistent=True),
            "stoker ray": _ray_workers(root, "second"),
            "stoker ray, loop's node": _ray_workers(root, "head"),
            "ray data": ray_data_contender(root),
        }
        config = {"images": ours.images, "batch_size": BATCH, "num_workers": WORKERS}
        config["cluster"] = "head (0 CPUs, the loop) + node (2 CPUs), one machine, loopback only"
        config["transform"] = "RandomResizedCrop(224)+flip+ToTensor+Normalize"
        harness.compare(
            "w4_ray",
            contenders,
            repeats=args.repeats,
            baseline="stoker process",
            config=config,
            warmup=args.warmup,
        )
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    if _isolated():
        main()
    else:
        _in_namespace()
