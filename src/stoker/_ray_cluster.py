"""Ray as the loader meets it before any worker starts: Ray imported (or how to install
it), the cluster joined (never started: the workers run where the user put them), its
resources checked against what the actors ask, and each actor's options.

The checks raise at ``iter()`` what Ray would otherwise leave as a wait: an address that
does not answer (``ray.init`` retries one for minutes), or fewer CPUs (GPUs, custom
resources) in the whole cluster than the workers ask for (their actors would never be
placed). Used by :mod:`stoker._engine._ray`; imports Ray only when called.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from stoker.errors import WorkerError

_CONNECT_TIMEOUT_S = 5.0
"""How long the cluster's address may take to accept a connection before iter() fails."""
_DEFAULT_OPTIONS = {"num_cpus": 1}
"""Each actor's options unless ``ray_options`` says otherwise: one CPU, as a process worker."""


def import_ray() -> Any:
    """The ``ray`` module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "worker_mode='ray' needs Ray, which is not installed: install it with "
            "`pip install 'stoker[ray]'` (Ray's own `pip install 'ray[default]'` works too), "
            "or use worker_mode='process'."
        ) from exc
    return ray


def connect(ray: Any) -> None:
    """Join a Ray cluster unless this process has already (``ray.init(...)``): the one
    ``RAY_ADDRESS`` names, else the one running on this machine (``ray start --head``).
    Never starts a cluster of its own: the workers are meant to run where the user put it.

    Raises:
        WorkerError: no cluster could be reached.
    """
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS") or "auto"
    try:
        if not address.startswith("ray://"):
            _probe(ray, address)  # ray.init retries an unreachable address for minutes
        ray.init(address=address, log_to_driver=False)
    except Exception as exc:
        raise WorkerError(
            f"worker_mode='ray' found no Ray cluster to run its workers on: connecting to "
            f"address={address!r} failed ({type(exc).__name__}: {exc}). Start one "
            "(`ray start --head` on this machine, or see docs/ray.md), set RAY_ADDRESS, or "
            "call ray.init(address=...) before iterating the loader."
        ) from exc


def _probe(ray: Any, address: str) -> None:
    """Raise ``ConnectionError`` unless ``address`` (or, for "auto", the cluster that this
    machine last started) answers a TCP connection within :data:`_CONNECT_TIMEOUT_S`."""
    try:  # Ray's own reading of "auto" (a file in its temp directory), where it has one
        found = ray._private.services.canonicalize_bootstrap_address(address)
    except AttributeError:
        found = None if address == "auto" else address
    if found is None:
        raise ConnectionError("no running Ray instance was found on this machine")
    host, _, port = found.rpartition(":")
    with socket.create_connection((host.strip("[]"), int(port)), timeout=_CONNECT_TIMEOUT_S):
        pass


def actor_options(ray_options: dict[str, Any] | None) -> dict[str, Any]:
    """Each actor's Ray options: ``ray_options`` over one CPU; restarts are stoker's own
    (``worker_restarts``), so Ray never restarts an actor by itself."""
    options = {**_DEFAULT_OPTIONS, **(ray_options or {})}
    for key in ("max_restarts", "max_task_retries"):
        if options.pop(key, 0):
            raise ValueError(
                f"ray_options={{'{key}': ...}}: stoker restarts its Ray workers itself, "
                "re-sending their tasks so that the batches stay the same; pass "
                "worker_restarts=N to the DataLoader instead."
            )
    return options


def check_resources(ray: Any, count: int, options: dict[str, Any]) -> None:
    """Raise if the cluster has fewer CPUs (or GPUs, or custom resources) in all than
    ``count`` actors of ``options`` ask for: Ray would wait for them for ever."""
    per = dict(options.get("resources") or {})
    per["CPU"] = float(options.get("num_cpus", 1))
    per["GPU"] = float(options.get("num_gpus", 0))
    total = ray.cluster_resources()
    for name, amount in per.items():
        if amount and amount * count > total.get(name, 0.0) + 1e-9:
            raise WorkerError(
                f"worker_mode='ray' with num_workers={count} asks for {amount * count:g} "
                f"{name} ({amount:g} per worker, from ray_options), but the Ray cluster has "
                f"{total.get(name, 0.0):g} in all. Lower num_workers or the worker's "
                f"{'num_cpus' if name == 'CPU' else name} in ray_options, or add nodes."
            )


def shown(resources: dict[str, float]) -> str:
    """A cluster's resources as 'CPU 2, GPU 0, ...' (memory and node labels left out)."""
    keep = {k: v for k, v in resources.items() if "memory" not in k and not k.startswith("node:")}
    return ", ".join(f"{k} {v:g}" for k, v in sorted(keep.items())) or "nothing"
