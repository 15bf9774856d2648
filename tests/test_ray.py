"""worker_mode="ray": a real Ray cluster (a head and a second node) on this machine.

Ray binds the machine's external address unless it has none, so the cluster and the
driver run in a child process inside a private network namespace with only the loopback
interface (``unshare -n``, then ``ip link set lo up``): Ray binds 127.0.0.1 and nothing can
leave. The child is this file run as a script: it starts one cluster with
``ray.cluster_utils.Cluster`` (a head with one CPU, a second node with two CPUs and the
resource ``second``), runs every scenario on it with the workers placed on the second
node, stops the cluster, and writes what each scenario found; each test below asserts one
scenario's result. Skipped, with the reason, where ``unshare -n`` is not permitted or Ray
is not installed.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stoker
from stoker.errors import WorkerError

_CHILD_TIMEOUT_S = 900.0
"""The whole child run's bound: about 40 s on two quiet cores, about two minutes beside CPU
burners (``tests/under_load.sh``), where a cluster's dozen processes share what is left."""
_SCENARIO_STACKS_S = 200.0
"""A scenario running this long (some tens of seconds beside CPU burners) dumps its stacks."""
_GONE_WAIT_S = 60.0
"""How long killed actors' processes may take to disappear."""
_ON_SECOND = {"resources": {"second": 1}}
"""ray_options placing a worker on the second node (the head has no ``second``)."""


# -- the scenarios' datasets (pickled by value into the actors) ----------------------------


class Images:
    """W4 in miniature: a decoded image per index, randomly cropped and flipped with
    NumPy's global RNG (seeded per batch by the loader, so the same in every worker)."""

    def __init__(self, n: int = 48, fail: int | None = None, slow: int | None = None) -> None:
        self.n, self.fail, self.slow = n, fail, slow

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        if i == self.fail:
            raise ValueError(f"sample {i} is corrupt")
        if i == self.slow:
            time.sleep(30)  # a stuck read: timeout= must fire first
        img = np.random.default_rng(i).integers(0, 256, (40, 44, 3), dtype=np.uint8)
        y, x = np.random.randint(0, 9), np.random.randint(0, 13)
        crop = img[y : y + 32, x : x + 32]
        if np.random.rand() < 0.5:
            crop = crop[:, ::-1]
        return np.ascontiguousarray(crop), i


def _batches(loader: Any, limit: int | None = None) -> list[tuple[bytes, ...]]:
    """A loader's batches as bytes (copied out of the object store)."""
    out = []
    for batch in loader:
        out.append(tuple(np.asarray(part).tobytes() for part in batch))
        if limit is not None and len(out) == limit:
            break
    return out


def _loader(mode: str | None, dataset: Any = None, **kw: Any) -> Any:
    import stoker

    if mode == "ray":
        kw = {"num_workers": 2, "worker_mode": "ray", "ray_options": _ON_SECOND, **kw}
    elif mode == "process":
        kw = {"num_workers": 2, **kw}
    return stoker.DataLoader(dataset or Images(), batch_size=4, shuffle=True, generator=11, **kw)


def _second_node() -> str:
    import ray

    return next(n["NodeID"] for n in ray.nodes() if n["Resources"].get("second"))


def _alive_actors() -> list[Any]:
    import ray

    return list(ray._private.state.actors(actor_state_name="ALIVE").values())


def _nothing_left(pids: list[int]) -> None:
    """No actor of ours alive in the cluster, and none of their processes left."""
    deadline = time.monotonic() + _GONE_WAIT_S
    while True:
        gc.collect()  # an iterator in a reference cycle stops its actors when collected
        alive = _alive_actors()
        procs = [p for p in pids if Path(f"/proc/{p}").exists()]
        if not alive and not procs:
            return
        assert time.monotonic() < deadline, f"left: actors {alive}, processes {procs}"
        time.sleep(0.1)


def _pids(it: Any) -> list[int]:
    return [w.hello.pid for w in it._pool.workers if w.hello is not None]


def scenario_same_batches() -> None:
    """Shuffled, cropped and flipped: Ray workers on the second node give num_workers=0's
    batches byte for byte, in order and (as a set) with in_order=False; statistics count
    them, and the actors are gone after the epoch."""
    want = _batches(_loader(None))
    loader = _loader("ray")
    it = iter(loader)
    assert _batches(it) == want
    assert {w.hello.node_id for w in it._pool.workers} == {_second_node()}
    pids = _pids(it)
    stats = loader.statistics()
    assert (stats.batches, stats.num_workers) == (len(want), 2)
    assert len(stats.worker_busy_seconds) == 2 and min(stats.worker_busy_seconds) > 0
    _nothing_left(pids)
    unordered = _batches(_loader("ray", in_order=False, prefetch_factor=4))
    assert sorted(unordered) == sorted(want)


def scenario_persistent_epochs() -> None:
    """Persistent Ray workers serve three epochs with num_workers=0's batches (each epoch
    its own order and draws), on the same actors."""
    want, ray_loader = _loader(None), _loader("ray", persistent_workers=True)
    epochs = [_batches(want) for _ in range(3)]
    assert epochs[0] != epochs[1]
    first = iter(ray_loader)
    actors = {w.actor._actor_id for w in first._pool.workers}
    assert [_batches(first), _batches(ray_loader), _batches(ray_loader)] == epochs
    assert {w.actor._actor_id for w in ray_loader._iterator._pool.workers} == actors
    pids = _pids(ray_loader._iterator)
    del first, ray_loader
    _nothing_left(pids)


def scenario_resume() -> None:
    """A mid-epoch state_dict resumes exactly: process workers' state into Ray workers,
    and Ray workers' back into process workers (and into the main process)."""
    want = _batches(_loader(None))
    first = _loader("process")
    it = iter(first)
    head = _batches(it, 3)
    state = first.state_dict()
    del it
    on_ray = _loader("ray")
    on_ray.load_state_dict(state)
    it = iter(on_ray)
    middle = _batches(it, 4)
    state = on_ray.state_dict()
    del it
    for mode in ("process", None):
        back = _loader(mode)
        back.load_state_dict(state)
        assert head + middle + _batches(back) == want, mode


def scenario_killed_actor_raises() -> None:
    """A SIGKILLed actor mid-epoch: a WorkerError naming the actor and its node, every
    actor of the loader gone."""

    it = iter(_loader("ray", Images(n=200)))
    _batches(it, 2)
    pids = _pids(it)
    os.kill(pids[0], signal.SIGKILL)
    with pytest.raises(WorkerError) as caught:
        _batches(it)
    text = str(caught.value)
    assert "Ray actor" in text and "on node 127.0.0.1" in text and str(pids[0]) in text, text
    _nothing_left(pids)


def scenario_killed_actor_restarts() -> None:
    """With worker_restarts=1, a SIGKILLed actor is replaced and its tasks sent again: the
    epoch's batches are unchanged, a RuntimeWarning says so, nothing is left after."""
    want = _batches(_loader(None, Images(n=120)))
    it = iter(_loader("ray", Images(n=120), worker_restarts=1))
    got = _batches(it, 3)
    pids = _pids(it)
    os.kill(pids[1], signal.SIGKILL)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got += _batches(it)
    assert got == want
    assert any("restarted it on a new actor" in str(w.message) for w in seen), seen
    _nothing_left([*pids, *_pids(it)])


def scenario_errors_and_skips() -> None:
    """skip_errors skips the same sample as in process; a dataset's error keeps its type
    and names the worker; a stuck sample hits timeout= with the actor named."""

    want = _batches(_loader(None, Images(fail=5), skip_errors=1))
    assert _batches(_loader("ray", Images(fail=5), skip_errors=1)) == want
    with pytest.raises(ValueError, match="sample 5 is corrupt") as failed:
        _batches(_loader("ray", Images(fail=5), num_workers=1))
    assert "worker" in "".join(failed.value.__notes__)
    del failed  # its traceback holds the iterator, and so its actor
    with pytest.raises(WorkerError, match=r"timed out after 2 seconds.*Ray actor"):
        _batches(_loader("ray", Images(slow=0), timeout=2, num_workers=1))
    _nothing_left([])


def scenario_torch_front_door() -> None:
    """stoker.torch with Ray workers: torch's collate, tensors equal to in-process ones."""
    import torch

    import stoker.torch

    def run(**kw: Any) -> list[Any]:
        loader = stoker.torch.DataLoader(
            Images(n=24),
            batch_size=4,
            shuffle=True,
            generator=torch.Generator().manual_seed(3),
            **kw,
        )
        return list(loader)

    want = run()
    got = run(num_workers=1, worker_mode="ray", ray_options=_ON_SECOND)
    assert all(type(g[0]) is torch.Tensor and type(g[1]) is torch.Tensor for g in got)
    for (gx, gy), (wx, wy) in zip(got, want, strict=True):
        assert torch.equal(gx, wx) and torch.equal(gy, wy)
    got[0][0].add_(1)  # a batch is the user's to change in place


class Stream(stoker.IterableDataset):
    """An iterable dataset that shards itself by ``get_worker_info()``, drawing noise."""

    def __iter__(self) -> Any:
        from stoker import get_worker_info

        info = get_worker_info()
        me, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(me, 24, step):
            yield np.random.randint(0, 1000, 3), i


def scenario_iterable_dataset() -> None:
    """An iterable dataset in Ray workers: each actor its shard, the same batches (noise
    included) as process workers give."""
    import stoker

    def run(**kw: Any) -> list[tuple[bytes, ...]]:
        return _batches(stoker.DataLoader(Stream(), batch_size=4, generator=5, **kw))

    assert run(num_workers=2, worker_mode="ray", ray_options=_ON_SECOND) == run(num_workers=2)


def scenario_unimportable_dataset() -> None:
    """A dataset whose module the nodes cannot import: a clear error at the first batch
    naming what must be installed there; not restarted, nothing left."""
    folder = Path(tempfile.mkdtemp(prefix="stkr-mod"))
    (folder / "driver_only.py").write_text("class Data:\n    def __len__(self): return 4\n")
    sys.path.insert(0, str(folder))
    try:
        import driver_only

        with pytest.raises(WorkerError, match=r"No module named 'driver_only'.*importable there"):
            _batches(_loader("ray", driver_only.Data(), worker_restarts=2))
    finally:
        sys.path.remove(str(folder))
        shutil.rmtree(folder)
    _nothing_left([])


def scenario_too_few_cpus() -> None:
    """More CPUs asked than the cluster has: a clear error at iter(), no actor made."""

    loader = _loader("ray", num_workers=4, ray_options={"num_cpus": 1})
    with pytest.raises(WorkerError, match=r"asks for 4 CPU .* has 3 in all"):
        iter(loader)
    _nothing_left([])


def _lose(cluster: Any, node: Any, it: Any) -> None:
    """Node ``node`` dies: its raylet and the processes of ``it``'s actors on it, at once (as
    when a machine is lost: its objects go with it)."""
    cluster.remove_node(node, allow_graceful=False)
    for w in it._pool.workers:
        if w.hello is not None and w.hello.node_id == node.node_id:
            os.kill(w.hello.pid, signal.SIGKILL)


def _seen_dead(node: Any) -> None:
    """Wait (bounded) until the cluster has seen ``node`` die: until then Ray may still
    place a new actor there, and that actor dies unborn."""
    import ray

    deadline = time.monotonic() + _GONE_WAIT_S
    while any(n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes()):
        assert time.monotonic() < deadline, f"node {node.node_id} still alive in ray.nodes()"
        time.sleep(0.1)


def scenario_node_lost(cluster: Any) -> None:
    """The workers run where the resource ``doomed`` is: a third node, which dies mid-epoch.
    With worker_restarts=2 (one an actor) their new actors wait for a node, a fourth joins,
    and the batches are unchanged. Then the fourth dies under workers without restarts: a
    WorkerError names the lost node's address."""
    doomed = {"num_cpus": 0, "resources": {"doomed": 1}}
    third = cluster.add_node(num_cpus=1, resources={"doomed": 2})
    cluster.wait_for_nodes()
    want = _batches(_loader(None, Images(n=120)))
    it = iter(_loader("ray", Images(n=120), worker_restarts=2, ray_options=doomed))
    got = _batches(it, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the restarts say so
        _lose(cluster, third, it)
        fourth = cluster.add_node(num_cpus=1, resources={"doomed": 2})
        got += _batches(it)
    assert got == want
    assert {w.hello.node_id for w in it._pool.workers} == {fourth.node_id}
    _seen_dead(third)  # the next workers have no restarts: none may land on the dead node
    it = iter(_loader("ray", Images(n=120), ray_options=doomed))
    _batches(it, 2)
    _lose(cluster, fourth, it)
    with pytest.raises(WorkerError, match=r"on node 127.0.0.1 .* died"):
        _batches(it)
    _nothing_left([])


def _no_cluster() -> dict[str, str]:
    """Before any cluster runs: an unreachable address, and none at all, fail at iter()."""
    import ray  # noqa: F401  (imported before the clock starts: the probe is timed)

    import stoker

    found = {}
    for address in ("127.0.0.1:1", ""):
        os.environ["RAY_ADDRESS"] = address
        start = time.monotonic()
        try:
            iter(stoker.DataLoader(range(4), num_workers=1, worker_mode="ray"))
            found[address] = "no error"
        except WorkerError as exc:
            ok = "found no Ray cluster" in str(exc) and time.monotonic() - start < 30
            found[address] = "ok" if ok else f"slow or unclear: {exc}"
    del os.environ["RAY_ADDRESS"]
    return found


SCENARIOS: dict[str, Callable[..., None]] = {
    name.removeprefix("scenario_"): fn
    for name, fn in globals().items()
    if name.startswith("scenario_")
}


def _child(out: str) -> None:
    """Run in the namespace: the cluster, every scenario, the cluster stopped."""
    import ray
    from ray.cluster_utils import Cluster

    results: dict[str, str] = {}
    found = _no_cluster()
    results["no_cluster"] = "ok" if set(found.values()) == {"ok"} else json.dumps(found)
    # A node that dies is seen within seconds, not Ray's default 15 s; five missed checks,
    # so that a raylet slowed by a busy machine is not taken for dead.
    health = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5}
    head = {"num_cpus": 1, "include_dashboard": False, "_system_config": health}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        cluster.add_node(num_cpus=2, resources={"second": 2})
        ray.init(address=cluster.address, log_to_driver=False)
        for name, fn in SCENARIOS.items():
            start = time.monotonic()
            # A scenario still running after this long dumps every thread's stack (to
            # stderr, which the fixture shows if the child runs past its bound).
            faulthandler.dump_traceback_later(_SCENARIO_STACKS_S)
            try:
                fn(cluster) if name == "node_lost" else fn()
                results[name] = "ok"
            except BaseException:
                results[name] = traceback.format_exc()
            faulthandler.cancel_dump_traceback_later()
            print(f"{name}: {time.monotonic() - start:.1f} s", file=sys.stderr, flush=True)
            Path(out).write_text(json.dumps(results))  # so far: kept if the child is killed
    finally:
        ray.shutdown()
        cluster.shutdown()
    Path(out).write_text(json.dumps(results))


# -- in pytest ------------------------------------------------------------------------------


def _why_not() -> str | None:
    if importlib.util.find_spec("ray") is None:
        return "Ray is not installed (pip install 'stoker[ray]')"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip is missing: no private network namespace for the cluster"
    probe = subprocess.run(
        ["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True, timeout=30
    )
    if probe.returncode:
        return f"unshare -n is not permitted here ({probe.stderr.decode().strip()})"
    return None


def _ours(tmp: str) -> list[str]:
    """Processes whose command line names the cluster's temporary directory."""
    left = []
    for pid in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if pid.isdigit() and tmp in cmd:
            left.append(f"{pid}: {cmd.replace(chr(0), ' ')[:120]}")
    return left


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    """Each scenario's result ("ok", or its traceback) from one child run."""
    why = _why_not()
    if why is not None:
        pytest.skip(why)
    tmp = tempfile.mkdtemp(prefix="stkr", dir="/tmp")  # short: Ray's socket paths live here
    out = os.path.join(tmp, "results.json")
    env = {**os.environ, "RAY_TMPDIR": tmp, "RAY_USAGE_STATS_ENABLED": "0"}
    # Ray starts its workers at nice 15: beside CPU burners at nice 0 (tests/under_load.sh)
    # an actor gets about 2% of a core and takes minutes to import its modules. At nice 0,
    # like the rest of the suite, the actors share the busy machine fairly.
    env["RAY_worker_niceness"] = "0"
    src = str(Path(__file__).resolve().parent.parent / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    script = f"ip link set lo up && exec {sys.executable} {__file__} {out}"
    try:
        try:
            run = subprocess.run(
                ["unshare", "-n", "sh", "-c", script],
                env=env,
                capture_output=True,
                text=True,
                timeout=_CHILD_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as exc:
            # The scenarios that finished keep their results; the rest fail with the
            # child's stderr (each scenario's time, and the stacks of one that hung).
            err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
            for left in _ours(tmp):  # the cluster's processes outlive the killed child
                with contextlib.suppress(OSError):
                    os.kill(int(left.split(":")[0]), signal.SIGKILL)
            done = json.loads(Path(out).read_text()) if Path(out).exists() else {}
            why = f"the child ran past {_CHILD_TIMEOUT_S:g} s; its stderr ends:\n{err[-6000:]}"
            return {name: done.get(name, why) for name in ["no_cluster", *SCENARIOS]}
        assert run.returncode == 0, run.stderr[-4000:]
        print("".join(ln for ln in run.stderr.splitlines(True) if ln.endswith(" s\n")))  # -rP
        assert not _ours(tmp), _ours(tmp)
        return dict(json.loads(Path(out).read_text()))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(_CHILD_TIMEOUT_S + 60)  # the first test's setup runs the whole child
@pytest.mark.parametrize("name", ["no_cluster", *SCENARIOS])
def test_ray_workers(results: dict[str, str], name: str) -> None:
    """One scenario of the child's run (see each ``scenario_*`` function)."""
    assert results[name] == "ok", results[name]


if __name__ == "__main__":
    _child(sys.argv[1])
