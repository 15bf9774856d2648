"""``stoker bench``: measure which ``num_workers`` (and ``worker_mode``, ``batch_size``) is fastest.

A sweep over worker counts, modes and batch sizes on a synthetic dataset (or the user's
own, ``--dataset module:factory``), then, where torch has an accelerator, ``pin_memory`` x
``non_blocking`` on the best configuration, stoker's loader beside torch's. Each
configuration is timed ``--repeats`` times in alternating order, so that drift on a noisy
machine hits all alike, and reported by its median: a table, a JSON file (with the
loader's statistics), a PNG plot (``plot`` extra) and one recommendation line. ``--auto``
adds a ``num_workers="auto"`` row per mode and one with ``worker_mode="auto"`` too.

Only argparse runs at import, so ``stoker --help`` stays instant; ``stoker._cli`` wires it
in with :func:`add_subcommand` and :func:`run`, and ``python -m stoker._bench`` runs it alone.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Generator, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from stoker import _command, _torch
from stoker._command import error, number

_PIN_NO_TORCH = "torch is not installed, so the pin_memory x non_blocking comparison is skipped."
_PIN_NO_ACCELERATOR = (
    "No accelerator (CUDA, MPS, XPU, ...) is available to torch, so the pin_memory x "
    "non_blocking comparison is skipped."
)
_PLOT_MISSING = (
    "matplotlib is not installed, so no plot was written; install the plot extra with "
    "`pip install 'stoker[plot]'` to get one."
)
_SYNTHETIC_DEFAULTS = {"samples": 1000, "sample_bytes": 1 << 20, "sleep_ms": 5.0}
"""The default dataset: 1000 samples of 1 MiB float32, each after a 5 ms wait (I/O-like)."""

Runs = list[dict[str, float]]


# -- the command line ---------------------------------------------------------------------


def _listed(item: Callable[[str], Any], example: str) -> Callable[[str], list[Any]]:
    """An argparse type: a comma-separated list of ``item`` values, duplicates dropped.

    >>> _listed(int, "0,2")("2,0,2")
    [2, 0]
    """

    def parse(text: str) -> list[Any]:
        try:
            values = [item(part.strip()) for part in text.split(",") if part.strip()]
        except (ValueError, argparse.ArgumentTypeError):
            values = []
        if not values:
            raise argparse.ArgumentTypeError(f"must be a list like {example!r}, got {text!r}.")
        return list(dict.fromkeys(values))

    return parse


def _mode(text: str) -> str:
    if text not in ("process", "thread"):
        raise ValueError(text)
    return text


def add_subcommand(subparsers: Any) -> None:
    """Add ``bench`` to the ``stoker`` command's ``subparsers``."""
    p = subparsers.add_parser(
        "bench",
        help="find the fastest num_workers / worker_mode / batch_size on this machine",
        description="Sweep num_workers x worker_mode x batch_size on a synthetic dataset "
        "(default: 1000 samples of 1 MiB, each after a 5 ms wait) or your own, "
        "print a table and a recommendation, and write JSON and a PNG plot. With an "
        "accelerator, also compare pin_memory x non_blocking.",
    )
    add = p.add_argument
    add("--workers", type=_listed(number(int, 0), "0,1,2,4"), default=None,
        help="num_workers values (default: 0 up to the usable CPU count)")  # fmt: skip
    add("--worker-mode", type=_listed(_mode, "process,thread"), default=["process", "thread"],
        help="worker modes to try (default: process,thread)")  # fmt: skip
    add("--batch-size", type=_listed(number(int, 1), "64,256"), default=[100],
        help="batch sizes (default: 100)")  # fmt: skip
    add("--auto", action="store_true",
        help="also run num_workers='auto' per worker mode (the autotuner's pick)")  # fmt: skip
    add("--dataset", metavar="MODULE:FACTORY",
        help="your dataset: a callable (or object) in an importable module")  # fmt: skip
    add("--samples", type=number(int, 1), help="synthetic samples (default: 1000)")
    add("--sample-bytes", type=number(int, 1), help="bytes per sample (default: 1048576)")
    add("--sleep-ms", type=number(float, 0), help="wait per sample, as I/O (default: 5)")
    add("--batches", type=number(int, 1), default=8, help="timed batches (default: 8)")
    add("--warmup", type=number(int, 0), default=2, help="untimed batches first (default: 2)")
    add("--repeats", type=number(int, 1), default=3, help="runs per configuration (default: 3)")
    add("--compute-ms", type=number(float, 0), default=0.0,
        help="emulated training step per batch, subtracted from the time (default: 0)")  # fmt: skip
    add("--json", default="stoker-bench.json", metavar="PATH", help="results file")
    add("--plot", default="stoker-bench.png", metavar="PATH", help="PNG (needs matplotlib)")
    add("--no-plot", action="store_true", help="write no PNG")
    add("--quiet", action="store_true", help="no progress bar")


# -- what is measured ---------------------------------------------------------------------


class SyntheticDataset:
    """``samples`` copies of one ``sample_bytes`` array (float32 when the size allows), each
    returned after ``sleep_s`` of waiting that releases the GIL, like I/O.

    >>> ds = SyntheticDataset(3, 8, 0.0)
    >>> len(ds), ds[2].dtype.name, ds[2].nbytes
    (3, 'float32', 8)
    """

    def __init__(self, samples: int, sample_bytes: int, sleep_s: float) -> None:
        import numpy as np

        self.samples, self.sleep_s = samples, sleep_s
        dtype = np.dtype(np.float32 if sample_bytes % 4 == 0 else np.uint8)
        self.sample = np.ones(sample_bytes // dtype.itemsize, dtype)

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> Any:
        if not -self.samples <= index < self.samples:
            raise IndexError(f"index must be in [0, {self.samples}), got {index}.")
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.sample


@dataclass(frozen=True)
class Config:
    """One configuration of the sweep.

    ``num_workers`` is an int or a string the loader accepts (reserved for ``"auto"``);
    ``worker_mode`` is None for in-process loading (``num_workers=0``).
    """

    num_workers: int | str
    worker_mode: str | None
    batch_size: int

    def loader_kwargs(self) -> dict[str, Any]:
        """The DataLoader arguments of this configuration."""
        kw: dict[str, Any] = {"batch_size": self.batch_size, "num_workers": self.num_workers}
        if self.worker_mode is not None:
            kw["worker_mode"] = self.worker_mode
        return kw

    def label(self) -> str:
        """A short name, e.g. ``"2 thread, batch 100"``."""
        mode = f" {self.worker_mode}" if self.worker_mode else ""
        return f"{self.num_workers}{mode}, batch {self.batch_size}"


def configurations(
    workers: Sequence[int], modes: Sequence[str], batch_sizes: Sequence[int], auto: bool = False
) -> list[Config]:
    """The sweep: per batch size, in-process once, then every mode with every count > 0
    (and with ``auto``, ``num_workers="auto"`` per mode and with ``worker_mode="auto"``).

    >>> [c.label() for c in configurations([0, 2], ["process", "thread"], [8])]
    ['0, batch 8', '2 process, batch 8', '2 thread, batch 8']
    >>> [c.label() for c in configurations([2], ["thread"], [8], auto=True)]
    ['2 thread, batch 8', 'auto thread, batch 8', 'auto auto, batch 8']
    """
    out: list[Config] = []
    for bs in batch_sizes:
        if 0 in workers:
            out.append(Config(0, None, bs))
        out.extend(Config(w, m, bs) for m in modes for w in workers if w > 0)
        if auto:
            out.extend(Config("auto", m, bs) for m in [*modes, "auto"])
    return out


def _leaves(batch: Any) -> list[Any]:
    """The arrays and tensors in ``batch``, through dicts, lists and tuples.

    >>> [x.shape for x in _leaves({"x": np.zeros((2, 3)), "y": [np.zeros(2)], "n": "a"})]
    [(2, 3), (2,)]
    """
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        return [leaf for item in batch for leaf in _leaves(item)]
    return [batch] if hasattr(batch, "shape") and hasattr(batch, "nbytes") else []


def _stream(loader: Any, epochs: list[int]) -> Generator[Any, None, None]:
    """Batches of ``loader`` without end, starting a new epoch when one ends."""
    while True:
        epochs[0] += 1
        it = iter(loader)
        got = False
        try:
            for batch in it:
                got = True
                yield batch
        finally:
            # Stop the workers now, not at garbage collection, so that they do not compete
            # with the next configuration for the CPUs.
            shutdown = getattr(it, "shutdown", None)  # a worker-backed iterator's
            if shutdown is not None:
                shutdown()
        if not got:
            raise RuntimeError(
                "the dataset gave no batch in a whole epoch: it must hold at least one "
                "sample; check the factory given to --dataset."
            )


def measure(
    dataset: Any,
    kwargs: dict[str, Any],
    *,
    batches: int,
    warmup: int,
    compute_s: float = 0.0,
    consume: Callable[[Any], Any] | None = None,
    finish: Callable[[], None] | None = None,
    loader_class: Callable[..., Any] | None = None,
) -> dict[str, float]:
    """One timed run: a fresh loader, ``warmup`` batches untimed, then ``batches`` timed.

    Args:
        dataset: what the loader reads.
        kwargs: the DataLoader arguments.
        batches: how many batches are timed; epochs restart when the dataset runs out.
        warmup: how many batches come first, untimed (worker start-up happens there).
        compute_s: a sleep per batch emulating a training step, subtracted from the time.
        consume: called on each timed batch (e.g. a copy to the device); its result counts.
        finish: called before the clock stops (e.g. waiting for the device).
        loader_class: the loader to time (default stoker's; e.g. torch's to compare).

    Returns:
        ``seconds``, ``samples``, ``bytes``, ``epochs`` (epochs started) and ``wait`` (the
        loop's seconds waiting for batches).
    """
    from stoker import DataLoader

    loader: Any = (loader_class or DataLoader)(dataset, **kwargs)
    epochs = [0]
    stream = _stream(loader, epochs)
    try:
        for _ in range(warmup):
            next(stream)
        t0 = time.perf_counter()
        samples, nbytes, wait = _draw(
            stream, batches, consume, compute_s, kwargs.get("batch_size") or 1
        )
        if finish is not None:
            finish()
        seconds = time.perf_counter() - t0 - compute_s * batches
        # of the iterator running now, before the stream closes (stoker's loader only)
        stats = loader.statistics() if hasattr(loader, "statistics") else None
    finally:
        stream.close()
    return {
        "seconds": max(seconds, 1e-9),
        "samples": samples,
        "bytes": nbytes,
        "epochs": epochs[0],
        "wait": wait,
        "input_bound": stats.input_bound if stats is not None else math.nan,
        "workers_used": stats.num_workers if stats is not None else kwargs["num_workers"],
    }


def _draw(
    stream: Generator[Any, None, None],
    batches: int,
    consume: Callable[[Any], Any] | None,
    compute_s: float,
    batch_size: int,
) -> tuple[int, int, float]:
    """The timed part of :func:`measure`: ``batches`` batches from ``stream``.

    Returns:
        Their samples (a batch's first leaf's length, else ``batch_size``), their bytes,
        and the seconds the loop waited for them.
    """
    samples = nbytes = 0
    wait = 0.0
    for _ in range(batches):
        asked = time.perf_counter()
        batch = next(stream)
        wait += time.perf_counter() - asked
        if consume is not None:
            batch = consume(batch)
        leaves = _leaves(batch)
        shape: tuple[int, ...] = leaves[0].shape if leaves else ()
        samples += int(shape[0]) if len(shape) else batch_size
        nbytes += sum(int(leaf.nbytes) for leaf in leaves)
        if compute_s:
            time.sleep(compute_s)
    return samples, nbytes, wait


def alternate(
    keys: Sequence[Hashable],
    repeats: int,
    one_run: Callable[[Any], dict[str, float]],
    progress: _Progress | None = None,
) -> dict[Any, Runs]:
    """``one_run(key)`` ``repeats`` times per key, in forward then reverse order.

    >>> calls = []
    >>> runs = alternate("ab", 2, lambda k: calls.append(k) or {"seconds": 1.0})
    >>> "".join(calls), len(runs["a"])
    ('abba', 2)
    """
    runs: dict[Any, Runs] = {k: [] for k in keys}
    for i in range(repeats):
        for key in keys if i % 2 == 0 else list(reversed(keys)):
            runs[key].append(one_run(key))
            if progress is not None:
                progress.update(key.label() if isinstance(key, Config) else str(key))
    return runs


def summarize(runs: Runs) -> dict[str, Any]:
    """Medians of one configuration's runs: seconds, samples/s and bytes/s.

    >>> s = summarize([{"seconds": 2.0, "samples": 10, "bytes": 40}, {"seconds": 1.0,
    ...     "samples": 10, "bytes": 40}, {"seconds": 4.0, "samples": 10, "bytes": 40}])
    >>> s["median_seconds"], s["samples_per_s"], s["bytes_per_s"]
    (2.0, 5.0, 20.0)
    """
    return {
        "median_seconds": statistics.median(r["seconds"] for r in runs),
        "samples_per_s": statistics.median(r["samples"] / r["seconds"] for r in runs),
        "bytes_per_s": statistics.median(r["bytes"] / r["seconds"] for r in runs),
        "runs": [r["seconds"] for r in runs],
    }


AUTO_WITHIN = 0.05
"""``num_workers="auto"`` with ``worker_mode="auto"`` is recommended when it is within this
fraction of the fastest row: it adapts to the next machine and dataset, a fixed row does not."""


def recommend(rows: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """The fastest row (by samples/s), or the auto x auto row within :data:`AUTO_WITHIN`
    of it at its batch size, and the recommendation line naming it.

    The gain is against ``num_workers=0`` at the same batch size, when that was measured.

    >>> rows = [
    ...     {"num_workers": 0, "worker_mode": None, "batch_size": 8, "samples_per_s": 100.0},
    ...     {"num_workers": 2, "worker_mode": "thread", "batch_size": 8, "samples_per_s": 250.0},
    ... ]
    >>> recommend(rows)[1]
    'use num_workers=2 (worker_mode=thread): 150% faster than num_workers=0'
    >>> auto = {"num_workers": "auto", "worker_mode": "auto", "batch_size": 8}
    >>> recommend([*rows, {**auto, "samples_per_s": 240.0}])[1]
    'use num_workers=auto (worker_mode=auto): 140% faster than num_workers=0'
    """
    best = max(rows, key=lambda r: r["samples_per_s"])
    floor = (1.0 - AUTO_WITHIN) * best["samples_per_s"]
    for r in rows:
        if r["num_workers"] == r["worker_mode"] == "auto" and r["batch_size"] == best["batch_size"]:
            best = r if r["samples_per_s"] >= floor else best
    several = len({r["batch_size"] for r in rows}) > 1
    size = f"batch_size={best['batch_size']}"
    if best["num_workers"] == 0:
        return best, "use num_workers=0" + (f" ({size})" if several else "") + (
            ": no worker setting beat loading in-process"
        )
    options = f"worker_mode={best['worker_mode']}" + (f", {size}" if several else "")
    line = f"use num_workers={best['num_workers']} ({options})"
    base = [r for r in rows if r["num_workers"] == 0 and r["batch_size"] == best["batch_size"]]
    if base:
        gain = (best["samples_per_s"] / base[0]["samples_per_s"] - 1.0) * 100.0
        line += f": {gain:.0f}% faster than num_workers=0"
    return best, line


# -- output ---------------------------------------------------------------------------------


def format_table(rows: Sequence[dict[str, Any]], best: dict[str, Any] | None = None) -> str:
    """The sweep as a text table, the best row marked with ``*``.

    >>> print(format_table([{"num_workers": 0, "worker_mode": None, "batch_size": 8,
    ...     "median_seconds": 0.5, "samples_per_s": 16.0, "bytes_per_s": 1.6e7,
    ...     "speedup": 1.0}]))
    num_workers  worker_mode  batch_size   median s    samples/s       MB/s  vs 0 workers
              0  -                     8     0.5000         16.0       16.0         1.00x
    """
    lines = [
        f"{'num_workers':>11}  {'worker_mode':<11}  {'batch_size':>10}  {'median s':>9}  "
        f"{'samples/s':>11}  {'MB/s':>9}  {'vs 0 workers':>12}"
    ]
    for r in rows:
        speedup = f"{r['speedup']:.2f}x" if r.get("speedup") is not None else "-"
        lines.append(
            f"{r['num_workers']!s:>11}  {r['worker_mode'] or '-':<11}  {r['batch_size']:>10}  "
            f"{r['median_seconds']:>9.4f}  {r['samples_per_s']:>11,.1f}  "
            f"{r['bytes_per_s'] / 1e6:>9,.1f}  {speedup:>12}" + ("  *" if r is best else "")
        )
    return "\n".join(lines)


def write_plot(path: str, rows: Sequence[dict[str, Any]], best: dict[str, Any], title: str) -> None:
    """A PNG of samples/s against num_workers: one line per worker mode and batch size, the
    in-process point starting each, the best row starred.

    Raises:
        ModuleNotFoundError: matplotlib is not installed.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5))  # no pyplot: no global state, no GUI backend
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    numeric = [r for r in rows if isinstance(r["num_workers"], int)]
    modes = sorted({r["worker_mode"] for r in numeric if r["worker_mode"]}) or [None]
    for bs in sorted({r["batch_size"] for r in numeric}):
        for mode in modes:
            line = [
                r for r in numeric if r["batch_size"] == bs and r["worker_mode"] in (mode, None)
            ]
            ax.plot(
                [r["num_workers"] for r in line], [r["samples_per_s"] for r in line],
                marker="o", label=f"{mode or 'in-process'}, batch {bs}",
            )  # fmt: skip
    if best in numeric:
        ax.plot(
            [best["num_workers"]], [best["samples_per_s"]], marker="*", markersize=16,
            linestyle="none", color="gold", markeredgecolor="black", label="best",
        )  # fmt: skip
    ax.set_xticks(sorted({r["num_workers"] for r in numeric}))
    ax.set_ylim(bottom=0)
    ax.set_xlabel("num_workers")
    ax.set_ylabel("samples / s (median)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)


class _Progress:
    """Progress on ``stream``: a tqdm bar when tqdm is installed, else a plain line.

    The main thread calls ``update`` after each run and ``close`` once at the end.
    """

    def __init__(self, total: int, stream: TextIO | None) -> None:
        self.total, self.stream, self.done = total, stream, 0
        self._bar: Any = None
        if stream is None:
            return
        try:
            tqdm = importlib.import_module("tqdm").tqdm
        except ImportError:
            return
        tqdm.monitor_interval = 0  # tqdm's monitor thread would outlive the command
        self._bar = tqdm(total=total, desc="stoker bench", unit="run", file=stream)

    def update(self, label: str) -> None:
        """One run done; ``label`` says which configuration ran."""
        self.done += 1
        if self.stream is None:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(label, refresh=False)
            self._bar.update(1)
            return
        tty = self.stream.isatty()  # a log file gets whole lines
        text = f"stoker bench: {self.done}/{self.total} runs ({label})"
        self.stream.write(f"\r{text}   " if tty else f"{text}\n")
        self.stream.flush()

    def close(self) -> None:
        """End the bar or the line."""
        if self._bar is not None:
            self._bar.close()
        elif self.stream is not None and self.stream.isatty():
            self.stream.write("\n")
            self.stream.flush()


# -- pin_memory x non_blocking ----------------------------------------------------------------


def accelerator() -> tuple[str | None, str]:
    """The accelerator device type torch sees, or None and the sentence saying why not.

    Imports torch when it is installed (the comparison needs it).
    """
    import importlib.util

    if _torch.loaded() is None and importlib.util.find_spec("torch") is None:
        return None, _PIN_NO_TORCH
    torch = _torch.require("the pin_memory x non_blocking comparison")
    acc = getattr(torch, "accelerator", None)
    if acc is not None:  # torch >= 2.6
        current = acc.current_accelerator() if acc.is_available() else None
        return (str(current.type), "") if current is not None else (None, _PIN_NO_ACCELERATOR)
    return ("cuda", "") if torch.cuda.is_available() else (None, _PIN_NO_ACCELERATOR)


def _to_device(batch: Any, device: str, non_blocking: bool) -> Any:
    """``batch`` with every tensor copied to ``device``, as a training loop does."""
    if _torch.is_tensor(batch):
        return batch.to(device=device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: _to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [_to_device(v, device, non_blocking) for v in batch]
    return batch


def _synchronizer(device: str) -> Callable[[], None]:
    """What waits until ``device`` has finished the copies queued so far."""
    torch = _torch.require("the pin_memory x non_blocking comparison")
    if device == "cpu":
        return lambda: None
    acc = getattr(torch, "accelerator", None)
    backend = acc if acc is not None and hasattr(acc, "synchronize") else getattr(torch, device)
    sync: Callable[[], None] = backend.synchronize
    return sync


def pin_sweep(
    dataset: Any,
    config: Config,
    device: str,
    *,
    repeats: int,
    progress: _Progress | None = None,
    **timing: Any,
) -> list[dict[str, Any]]:
    """The accelerator comparison: ``pin_memory`` x ``non_blocking`` copies to ``device``,
    on stoker's DataLoader and on torch's, with the same data and worker count.

    Every batch (torch tensors) is copied to ``device``; the clock stops once the device
    has finished. ``timing`` holds :func:`measure`'s ``batches``, ``warmup``, ``compute_s``.
    torch's loader runs process workers (it has no others) with the same count.

    Returns:
        One row per loader and combination, with the medians of :func:`summarize`, the
        bytes per second that reached the device (``bytes_per_s``) and the loop's median
        wait for batches (``wait_s``).
    """
    torch = _torch.require("the pin_memory x non_blocking comparison")
    finish = _synchronizer(device)

    def one_run(key: tuple[str, bool, bool]) -> dict[str, float]:
        which, pm, nb = key
        kwargs = {**config.loader_kwargs(), "pin_memory": pm}
        if which == "stoker":
            kwargs["tensor_type"] = "torch"
            loader_class = None
        else:
            kwargs.pop("worker_mode", None)
            loader_class = torch.utils.data.DataLoader

        def consume(batch: Any) -> Any:
            return _to_device(batch, device, nb)

        return measure(
            dataset, kwargs, consume=consume, finish=finish, loader_class=loader_class, **timing
        )

    keys = [(w, pm, nb) for pm in (True, False) for nb in (True, False) for w in _LOADERS]
    runs = alternate(keys, repeats, one_run, progress)
    return [
        {
            "loader": w,
            "pin_memory": pm,
            "non_blocking": nb,
            **summarize(runs[w, pm, nb]),
            "wait_s": statistics.median(r["wait"] for r in runs[w, pm, nb]),
        }
        for w, pm, nb in keys
    ]


_LOADERS = ("stoker", "torch")


def format_pin_table(rows: Sequence[dict[str, Any]]) -> str:
    """The pin_memory x non_blocking rows as text, in the seed script's words: per
    combination, each loader's GB/s reaching the device and the loop's wait."""
    by_combo: dict[tuple[bool, bool], list[dict[str, Any]]] = {}
    for r in rows:
        by_combo.setdefault((r["pin_memory"], r["non_blocking"]), []).append(r)
    return "\n".join(
        f"pin_memory={pm!s:>5}, non_blocking={nb!s:>5}: "
        + " | ".join(
            f"{r.get('loader', 'stoker')} median time {r['median_seconds']:.3f} s, "
            f"{r['bytes_per_s'] / 1e9:.2f} GB/s to the device, wait {r['wait_s']:.3f} s"
            for r in group
        )
        for (pm, nb), group in by_combo.items()
    )


# -- the command ------------------------------------------------------------------------------


def load_dataset(spec: str) -> Any:
    """The dataset named by ``"module:factory"``: the attribute, called if it is callable.

    The current directory is importable, as with ``python -m``.

    Raises:
        ValueError: ``spec`` is not ``module:attribute``, or the attribute is missing.
    """
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(
            f"--dataset must be 'module:factory', got {spec!r}; e.g. "
            "'mypkg.data:make_train_set' (a callable returning a dataset)."
        )
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(
                f"--dataset {spec!r}: module {module!r} has no attribute {attr!r}; name a "
                "callable defined in it."
            )
        obj = getattr(obj, part)
    dataset = obj() if callable(obj) else obj
    kind = type(dataset)
    if not hasattr(kind, "__iter__") and not hasattr(kind, "__getitem__"):
        raise ValueError(
            f"--dataset {spec!r} gave a {kind.__name__}, which is no dataset: name a callable "
            "that returns one (with __len__ and __getitem__, or __iter__), or a dataset."
        )
    return dataset


def _resolve(args: argparse.Namespace, cpus: int) -> None:
    """Fill in the defaults that depend on each other or on the machine, in ``args``.

    Raises:
        ValueError: synthetic-dataset options were given together with ``--dataset``, or
            the results could not be written where ``--json`` / ``--plot`` say (checked
            before the sweep, not after it).
    """
    given = [
        f"--{k.replace('_', '-')}" for k in _SYNTHETIC_DEFAULTS if getattr(args, k) is not None
    ]
    if args.dataset is not None and given:
        raise ValueError(
            f"{', '.join(given)} describe the synthetic dataset, but --dataset was given: "
            "drop one or the other."
        )
    for key, default in _SYNTHETIC_DEFAULTS.items():
        if args.dataset is None and getattr(args, key) is None:
            setattr(args, key, default)
    from stoker._osprobe import meminfo

    memory = meminfo().get("MemTotal")
    if args.dataset is None and memory is not None and args.sample_bytes > memory:
        raise ValueError(
            f"--sample-bytes {args.sample_bytes:,} is more than this machine's memory "
            f"({memory:,} bytes): a synthetic sample must fit in it; pass a smaller size."
        )
    for option, path in (("--json", args.json), ("--plot", None if args.no_plot else args.plot)):
        if path is not None:
            _check_writable(option, path)
    args.workers = sorted(args.workers if args.workers is not None else range(cpus + 1))
    args.batch_size = sorted(args.batch_size)


def _check_writable(option: str, path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        problem = "is a folder"
    elif not os.path.isdir(folder):
        problem = f"is in {folder!r}, which does not exist"
    elif not os.access(folder, os.W_OK):
        problem = f"is in {folder!r}, which is not writable"
    else:
        return
    raise ValueError(f"{option} {path!r} {problem}: name a file in a writable folder.")


def command_line(args: argparse.Namespace) -> str:
    """The ``stoker bench`` command that repeats this run, every option resolved."""
    import shlex

    parts = ["stoker", "bench"]
    for key in ("workers", "worker_mode", "batch_size", "dataset", *_SYNTHETIC_DEFAULTS,
                "batches", "warmup", "repeats", "compute_ms"):  # fmt: skip
        value = getattr(args, key)
        if value is not None:
            if isinstance(value, list):
                text = ",".join(map(str, value))
            else:
                text = value if isinstance(value, str) else f"{value:g}"
            parts += [f"--{key.replace('_', '-')}", text]
    return shlex.join(parts)


def _describe(args: argparse.Namespace, dataset: Any) -> tuple[dict[str, Any], str]:
    """The dataset as a JSON record, and as words for the headline."""
    if args.dataset is None:
        keys = list(_SYNTHETIC_DEFAULTS)
        words = (
            f"{args.samples:,} synthetic samples of {args.sample_bytes:,} bytes, "
            f"{args.sleep_ms:g} ms wait each"
        )
        return {"kind": "synthetic", **{k: getattr(args, k) for k in keys}}, words
    try:
        n: int | None = len(dataset)
    except TypeError:
        n = None
    words = f"{args.dataset} ({type(dataset).__name__}, {n if n is not None else '?'} samples)"
    return {"kind": "factory", "factory": args.dataset, "type": type(dataset).__name__}, words


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("stoker", "numpy", "torch"):
        if name in sys.modules:
            out[name] = str(getattr(sys.modules[name], "__version__", "?"))
    return out


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run the parsed ``bench`` command; returns the exit status.

    Args:
        args: the namespace of the ``bench`` parser.
        out: where the report goes (default: stdout); progress goes to stderr.
    """
    from stoker._osprobe import available_cpus

    out = out if out is not None else sys.stdout
    cpus = available_cpus()
    try:
        _resolve(args, cpus)
        dataset = (
            load_dataset(args.dataset)
            if args.dataset is not None
            else SyntheticDataset(args.samples, args.sample_bytes, args.sleep_ms / 1e3)
        )
    except (ValueError, TypeError, ImportError) as exc:
        error("bench", str(exc))
        return 2
    data, words = _describe(args, dataset)
    print(
        f"stoker bench: {words}; {args.batches} batches timed after {args.warmup} warm-up, "
        f"median of {args.repeats}; {cpus} usable CPUs",
        file=out,
        flush=True,
    )
    timing = {"batches": args.batches, "warmup": args.warmup, "compute_s": args.compute_ms / 1e3}
    rows = _sweep(args, dataset, timing)
    best, line = recommend(rows)
    print(format_table(rows, best), file=out)
    print(line, file=out, flush=True)
    record = {
        "tool": "stoker bench",
        "command": command_line(args),
        "cores": cpus,
        "cpu_count": os.cpu_count(),
        "versions": _versions(),
        "dataset": data,
        "settings": {k: getattr(args, k) for k in ("batches", "warmup", "repeats", "compute_ms")},
        "rows": rows,
        "best": best,
        "recommendation": line,
        "pin_memory_x_non_blocking": _pin_part(args, dataset, best, timing, out),
    }
    try:
        _write_results(args, record, f"stoker bench: {data['kind']} dataset, {cpus} CPUs", out)
    except OSError as exc:
        error("bench", f"cannot write the results: {exc}")
        return 1
    return 0


def _sweep(args: argparse.Namespace, dataset: Any, timing: dict[str, Any]) -> list[dict[str, Any]]:
    """The sweep's table: every configuration timed ``args.repeats`` times, alternating,
    with its speed-up over ``num_workers=0`` at the same batch size."""
    configs = configurations(args.workers, args.worker_mode, args.batch_size, args.auto)
    progress = _Progress(len(configs) * args.repeats, None if args.quiet else sys.stderr)
    try:
        runs = alternate(
            configs, args.repeats, lambda c: measure(dataset, c.loader_kwargs(), **timing), progress
        )
    finally:
        progress.close()
    rows = [
        {
            "num_workers": c.num_workers,
            "worker_mode": c.worker_mode,
            "batch_size": c.batch_size,
            **summarize(runs[c]),
            "epochs": max(int(r["epochs"]) for r in runs[c]),
        }
        for c in configs
    ]
    for row in rows:
        base = [r for r in rows if r["num_workers"] == 0 and r["batch_size"] == row["batch_size"]]
        row["speedup"] = row["samples_per_s"] / base[0]["samples_per_s"] if base else None
    return rows


def _pin_part(
    args: argparse.Namespace,
    dataset: Any,
    best: dict[str, Any],
    timing: dict[str, Any],
    out: TextIO,
) -> dict[str, Any]:
    """The pin_memory x non_blocking comparison on the best configuration, printed and as a
    JSON record; only why it was skipped where there is no accelerator."""
    device, reason = accelerator()
    if device is None:
        print(reason, file=out)
        return {"skipped": reason}
    chosen = Config(best["num_workers"], best["worker_mode"], best["batch_size"])
    print(f"pin_memory x non_blocking, copying to {device} ({chosen.label()}):", file=out)
    bar = _Progress(4 * len(_LOADERS) * args.repeats, None if args.quiet else sys.stderr)
    try:
        pin_rows = pin_sweep(dataset, chosen, device, repeats=args.repeats, progress=bar, **timing)
    finally:
        bar.close()
    print(format_pin_table(pin_rows), file=out)
    return {"device": device, "config": chosen.loader_kwargs(), "rows": pin_rows}


def _write_results(
    args: argparse.Namespace, record: dict[str, Any], title: str, out: TextIO
) -> None:
    """Writes the JSON record and, unless ``--no-plot``, the plot (where matplotlib is).

    Raises:
        OSError: a file could not be written.
    """
    with open(args.json, "w") as f:
        json.dump(record, f, indent=2)
    print(f"wrote {args.json}", file=out)
    if not args.no_plot:
        try:
            write_plot(args.plot, record["rows"], record["best"], title)
            print(f"wrote {args.plot}", file=out)
        except ModuleNotFoundError:
            print(_PLOT_MISSING, file=out)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``bench`` on its own, as ``stoker bench`` does: ``python -m stoker._bench [options]``."""
    args = _command.parser([add_subcommand]).parse_args(
        ["bench", *(sys.argv[1:] if argv is None else argv)]
    )
    return _command.run(args, run)


if __name__ == "__main__":
    sys.exit(main())
