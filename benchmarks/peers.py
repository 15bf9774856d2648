"""Peer contenders for the benchmarks: grain, torchdata's StatefulDataLoader and SPDL, if
installed.

Each factory builds the peer's loader for the same workload as the benchmark's torch
contender (same samples, batch size, shuffle and worker count) and hands it to ``wrap``, the
benchmark's own "one epoch of this loader" function, so a peer's run returns the same counts
dict as every other contender of that benchmark. A peer that is not importable gives
``None``, and the benchmark leaves it out, so the benchmarks still run where only torch and
stoker are installed (the dev env). To measure the peers, use an env that has them, e.g.
``pip install grain torchdata`` next to torch.

grain runs its ``DataLoader`` over a data source (any sized, indexable object), an
``IndexSampler`` (one epoch, shuffled with a seed when the workload shuffles) and a ``Batch``
operation that stacks samples into NumPy arrays, with ``worker_count`` worker processes
that grain starts anew on each iteration of the loader, like torch without persistent
workers, reading records in the worker's own thread (``ReadOptions(num_threads=0)``: the
records are in memory, and grain's default read threads only slow it down here).
StatefulDataLoader takes the exact arguments torch's ``DataLoader`` takes. SPDL runs two
ways: with workers, ``spdl.dataloader.get_pytorch_dataloader`` (process workers behind torch's
``DataLoader`` arguments, in order as torch gives batches); in process, SPDL's own pipeline
(``spdl.dataloader.DataLoader``) with one thread, one stage loading a whole batch, so that
it does the work the in-process contenders do.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import os
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

Run = Callable[[], dict[str, float]]
Wrap = Callable[[Iterable[Any]], Run]


def available(module: str) -> bool:
    """Whether ``module`` (a dotted name) can be imported, without importing it.

    >>> available("json"), available("no_such_module_here")
    (True, False)
    """
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


class PairSource:
    """A grain data source over two aligned arrays: record ``i`` is ``(x[i], y[i])``.

    >>> import numpy as np
    >>> source = PairSource(np.zeros((3, 2)), np.arange(3))
    >>> len(source), source[2][1]
    (3, np.int64(2))
    """

    def __init__(self, x: Any, y: Any) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        return self.x[i], self.y[i]

    def __repr__(self) -> str:
        # grain records repr(source) in its iterator state; keep it short and stable.
        return f"PairSource(n={len(self)})"


def grain_loader(
    source: Any, *, batch_size: int, workers: int, shuffle: bool = False, seed: int = 0
) -> Iterable[Any] | None:
    """A grain ``DataLoader`` giving one epoch of ``source`` in batches, or None without grain.

    Args:
        source: the data source: ``len(source)`` records, ``source[i]`` gives record ``i``.
        batch_size: records per batch; the last batch may be smaller (as torch's default).
        workers: grain's ``worker_count``; 0 runs in the calling process.
        shuffle: shuffle the records (grain needs a seed for that).
        seed: the shuffle seed.

    Returns:
        The loader; each ``iter()`` of it is one epoch with fresh worker processes.
    """
    if not available("grain"):
        return None
    gp: Any = importlib.import_module("grain.python")
    sampler = gp.IndexSampler(
        num_records=len(source),
        shard_options=gp.NoSharding(),
        shuffle=shuffle,
        num_epochs=1,
        seed=seed if shuffle else None,
    )
    return gp.DataLoader(  # type: ignore[no-any-return]
        data_source=source,
        sampler=sampler,
        operations=[gp.Batch(batch_size=batch_size, drop_remainder=False)],
        worker_count=workers,
        # In-memory records need no read threads; grain's default (16 threads, a buffer of
        # 500) spends most of its time in its prefetch loop here (W3: 3k vs 24k samples/s).
        read_options=gp.ReadOptions(num_threads=0),
    )


def grain_loader_run(
    source: Any, *, batch_size: int, workers: int, wrap: Wrap, shuffle: bool = False
) -> Run | None:
    """:func:`grain_loader` of ``source`` as a run (seed 0 when shuffled); None without grain."""
    loader = grain_loader(source, batch_size=batch_size, workers=workers, shuffle=shuffle)
    return None if loader is None else wrap(loader)


def grain_w2(source: Any, *, batch_size: int, workers: int, wrap: Wrap) -> Run | None:
    """W2 on grain: ``source`` (same 1 MiB array per record), in order, batched; or None."""
    return grain_loader_run(source, batch_size=batch_size, workers=workers, wrap=wrap)


def grain_w3(x: Any, y: Any, *, batch_size: int, workers: int, wrap: Wrap) -> Run | None:
    """W3 on grain: the ``(x[i], y[i])`` pairs, shuffled, batched; or None without grain."""
    return grain_loader_run(
        PairSource(x, y), batch_size=batch_size, workers=workers, wrap=wrap, shuffle=True
    )


def statefuldl(dataset: Any, *, wrap: Wrap, **kw: Any) -> Run | None:
    """torchdata's ``StatefulDataLoader(dataset, **kw)`` as a run; None without torchdata.

    Args:
        dataset: the same (torch) dataset the torch contender loads.
        wrap: the benchmark's one-epoch function for a loader.
        **kw: the same ``DataLoader`` arguments the torch contender gets.
    """
    if not available("torchdata.stateful_dataloader"):
        return None
    module: Any = importlib.import_module("torchdata.stateful_dataloader")
    return wrap(module.StatefulDataLoader(dataset, **kw))


def spdl(dataset: Any, *, wrap: Wrap, **kw: Any) -> Run | None:
    """SPDL's process-backed ``get_pytorch_dataloader(dataset, **kw)`` as a run; None
    without SPDL, or with ``num_workers=0`` (SPDL then starts one worker process anyway:
    see :func:`spdl_in_process`)."""
    if not available("spdl.dataloader") or not kw.get("num_workers"):
        return None
    built: list[Run] = []

    def run() -> dict[str, float]:
        if not built:  # built on first use: a peer left out makes no segment
            module: Any = importlib.import_module("spdl.dataloader")
            loader = module.get_pytorch_dataloader(dataset, in_order=True, **kw)
            atexit.register(_unlink, loader._shmem)
            built.append(wrap(loader))
        return built[0]()

    return run


def _unlink(segment: Any) -> None:
    """Close and unlink the shared memory SPDL put its pickled dataset in: SPDL never does."""
    segment.close()
    segment.unlink()


def spdl_in_process(
    dataset: Any,
    *,
    batch_size: int,
    aggregate: Callable[[list[Any]], Any],
    wrap: Wrap,
    shuffle: bool = False,
) -> Run | None:
    """SPDL's own pipeline over ``dataset`` in this process, one thread, in order; None
    without SPDL. Its source is the batches of indices (in one fixed random order with
    ``shuffle``) and one stage loads a batch, ``aggregate([dataset[i] for i in batch])``:
    work per batch, as SPDL advises (a stage per sample costs ~1 ms a sample here). A
    fresh pipeline per epoch, as SPDL builds one on each ``iter()``."""
    if not available("spdl.dataloader"):
        return None
    module: Any = importlib.import_module("spdl.dataloader")
    n = len(dataset)
    order = np.random.default_rng(0).permutation(n) if shuffle else np.arange(n)
    batches = [order[i : i + batch_size].tolist() for i in range(0, n, batch_size)]

    def load(batch: list[int]) -> Any:
        return aggregate([dataset[i] for i in batch])

    loader = module.DataLoader(batches, preprocessor=load, num_threads=1, output_order="input")
    return wrap(loader)


def pairs(samples: list[tuple[Any, Any]]) -> tuple[Any, Any]:
    """An aggregator of ``(x, y)`` samples: the stacked x's and the y's as one array.

    >>> [a.shape for a in pairs([(np.zeros(2), 1), (np.ones(2), 2)])]
    [(2, 2), (2,)]
    """
    return np.stack([x for x, _ in samples]), np.asarray([y for _, y in samples])


def add(contenders: dict[str, Run], peers: dict[str, Run | None]) -> dict[str, Run]:
    """``contenders`` with the peers that are installed (not None) appended, in order;
    where ``BENCH_PEERS`` is set (e.g. ``grain,spdl``, or ``none``), only the peers whose
    names start with one of its words (grain is slow in process on W3: ~2 min an epoch).

    >>> run = lambda: {"samples": 1.0}
    >>> list(add({"torch": run}, {"grain": None, "torchdata": run}))
    ['torch', 'torchdata']
    """
    wanted = os.environ.get("BENCH_PEERS")
    words = tuple(w for w in (wanted or "").split(",") if w)
    return {
        **contenders,
        **{
            name: run
            for name, run in peers.items()
            if run is not None and (wanted is None or name.startswith(words))
        },
    }
