"""Ray workers (``worker_mode="ray"``): the loader's workers as actors on a Ray cluster.

:class:`RayPool` is a :class:`~stoker._engine._pool.WorkerPool` of Ray actors, one per
worker, placed by the loader's ``ray_options`` (Ray's actor options). Each actor runs the
process workers' loop (:func:`~stoker._engine._worker.serve`, seeded alike) on a thread,
through :class:`_ActorSink`: one actor call per task (a batch, or a group of tiny ones),
answered with the task's messages. Ray runs an actor's calls in order; ``prefetch_factor``
calls in flight per actor cover its latency.

Batches travel through Ray's object store: NumPy leaves arrive as views of it, torch
tensors as tensors over the same memory (:func:`_tensor_out`). An actor that dies is a
dead worker: with ``worker_restarts``, a new actor takes its worker id and unanswered
tasks (the same batches: each is seeded from (seed, epoch, index)); without, a
:class:`~stoker.errors.WorkerError` names the actor and its node. See ``docs/ray.md``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import pickle
import queue
import re
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any, NamedTuple

from stoker import _torch
from stoker._engine._arrivals import Arrivals
from stoker._engine._errors import RemoteError
from stoker._engine._messages import Bye, Shipped, Task, ToIterator
from stoker._engine._pool import PoolGauges
from stoker._engine._sinks import ObjectShipping, ProcessSink
from stoker._engine._worker import Ended, WorkerArgs, serve, start
from stoker._fetch import MapFetcher
from stoker._random import seed_globals
from stoker._ray_cluster import actor_options, check_resources, connect, import_ray, shown
from stoker.errors import WorkerError

if TYPE_CHECKING:
    from stoker._engine._config import EngineConfig, EngineMemory
    from stoker._engine._probe import SampleTimer

PLACE_TIMEOUT_S = 300.0
"""How long an actor may take to say hello, placed on a node and started, before the
loader fails: where others hold the resources (Ray alone would wait without end), or a
busy node starts it slowly (a fresh Ray worker imports the dataset's modules: over a
minute beside CPU-bound work). A cluster too small in all fails at ``iter()`` at once."""
_PLACE_AGAIN = 3
"""With restarts, how many times a worker's actor lost before its start is placed again."""
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_WAIT_SLICE_S = 1.0
"""Longest single ``ray.wait``: between two, the pool checks that its actors are placed."""


# -- in the actor ------------------------------------------------------------------------


class _Hello(NamedTuple):
    """An actor's first answer: who and where it is, and the messages of its start-up."""

    actor_id: str
    node_id: str
    node_ip: str
    pid: int
    messages: list[Any]


class _ActorSink(ProcessSink, ObjectShipping):
    """An actor's: one task at a time from its actor call, and the messages it produced
    handed back as that call's answer (batches as objects: Ray serialises them)."""

    def __init__(self, args: WorkerArgs) -> None:
        super().__init__(args)
        self.tasks: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self.answers: queue.SimpleQueue[list[Any]] = queue.SimpleQueue()
        self.out: list[Any] = []
        self.ended = False

    def send(self, msg: Any) -> None:
        self.out.append(msg)

    def hand(self) -> None:
        """Answer the call waiting: the messages since the last answer."""
        out, self.out = self.out, []
        self.answers.put(out)

    def next_task(self) -> Task | None:
        self.hand()  # asking for the next task: the last one is done
        return self.tasks.get()

    def fetch(self, indices: Any, seed: int | None, timer: SampleTimer | None = None) -> Any:
        if seed is not None:
            seed_globals(seed)
        if timer is not None and isinstance(self.fetcher, MapFetcher):
            return self.fetcher.fetch_skipping(indices, map_fn=timer.map_fn)
        return self.fetcher.fetch_skipping(indices)


def _actor_loop(args: WorkerArgs, sink: _ActorSink) -> None:
    """An actor's worker thread: start-up, then the worker loop; a worker that ends early
    (``sys.exit()`` in the dataset, stoker's own failure) says why in its last answer."""
    try:
        if start(args, sink, whole_process=True):
            serve(args, sink)
    except Ended as exc:
        sink.send(Bye(kept=None, why=(exc.remote.summary(), exc.code)))
    except BaseException as exc:
        remote = RemoteError(exc, f"worker {args.worker_id} (pid {os.getpid()})")
        sink.send(Bye(kept=None, why=(remote.summary(), 1)))
    finally:
        sink.ended = True
        sink.hand()


class RayWorker:
    """The actor class of one worker (made a Ray actor by :func:`_actor_class`)."""

    def __init__(self, args: WorkerArgs, fetcher: Any) -> None:
        args.fetcher = fetcher  # put in the object store once, for every actor (RayPool)
        if args.import_torch:  # tensors cross as views of the object store, not pickles
            import ray

            torch = _torch.require("a Ray worker of a process that uses torch")
            ray.util.register_serializer(
                torch.Tensor, serializer=_tensor_out, deserializer=_tensor_in
            )
        self._sink = _ActorSink(args)
        self._thread = threading.Thread(
            target=_actor_loop, args=(args, self._sink), name="stoker-worker", daemon=True
        )
        self._thread.start()

    def hello(self) -> _Hello:
        """Where this actor runs, once its start-up (and ``worker_init_fn``) is done."""
        import ray

        ctx = ray.get_runtime_context()
        messages = self._sink.answers.get()
        ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        # fmt: off
        return _Hello(
            actor_id=ctx.get_actor_id() or "", node_id=ctx.get_node_id(), node_ip=ip,
            pid=os.getpid(), messages=messages,
        )
        # fmt: on

    def load(self, task: Task) -> list[Any]:
        """The messages of one task: its batch (or group), a failure, a snapshot..."""
        if self._sink.ended:
            return [Bye(kept=None, why=("the worker's loop, which had ended", 1))]
        self._sink.tasks.put(task)
        return self._sink.answers.get()


_ACTOR: Any = None


def _actor_class(ray: Any) -> Any:
    """:class:`RayWorker` as a Ray actor class (made once per process)."""
    global _ACTOR
    if _ACTOR is None:
        _ACTOR = ray.remote(RayWorker)
    return _ACTOR


def _tensor_out(tensor: Any) -> tuple[Any, str, tuple[int, ...]]:
    """A CPU tensor as (its bytes as a uint8 NumPy view, dtype, shape): NumPy buffers go
    into the object store out of band, so the driver gets a view, not a copy."""
    if tensor.layout is not _torch.loaded().strided or tensor.is_quantized:  # type: ignore[union-attr]
        return pickle.dumps(tensor), "", ()
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return flat.view(_torch.loaded().uint8).numpy(), str(tensor.dtype), tuple(tensor.shape)  # type: ignore[union-attr]


def _tensor_in(parts: tuple[Any, str, tuple[int, ...]]) -> Any:
    """The tensor of :func:`_tensor_out`, over the object store's memory (torch warns that
    the buffer is read-only; the object is this loader's alone, so writing is safe)."""
    data, dtype, shape = parts
    if not dtype:
        return pickle.loads(data)
    torch = _torch.require("a batch of torch tensors from Ray workers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.from_numpy(data)
    return flat.view(getattr(torch, dtype.removeprefix("torch."))).reshape(shape)


def _reason(exc: BaseException) -> str:
    """What Ray says of a dead actor, in one line: its first (and, for a failed start, the
    exception the start raised, its last), without the terminal's colour codes."""
    lines = [line.strip() for line in _COLOUR.sub("", str(exc)).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    if getattr(exc, "actor_init_failed", False) and len(lines) > 1:
        return lines[-1].rstrip(".")  # the exception its start raised
    return f"{type(exc).__name__}: {lines[0].rstrip('.')}"


# -- in the driver -----------------------------------------------------------------------


class _Actor:
    """The driver's handle of one worker: its actor, where it runs, its calls in flight."""

    def __init__(self, wid: int, args: WorkerArgs) -> None:
        self.wid = wid
        self.args = args
        self.actor: Any = None
        self.hello: _Hello | None = None
        self.since = 0.0  # when its actor was made (placement wait)
        self.calls: collections.deque[tuple[Any, Task | None]] = collections.deque()
        self.unsent: list[Task] | None = []  # tasks sent before its actor was made
        self.replaced = 0  # actors lost before they started (see RayPool._died)

    def where(self) -> str:
        """'Ray actor 1a2b... (pid 42) on node 127.0.0.1 (node id 9f8e...)'."""
        if self.hello is None:
            made = "placed" if self.actor is not None else "made"
            return f"Ray actor (not {made} yet: its node is not known)"
        h, actor = self.hello, self.hello.actor_id[:12]
        return f"Ray actor {actor} (pid {h.pid}) on node {h.node_ip} (node id {h.node_id[:12]})"


class RayPool:
    """Workers as Ray actors (see the module docstring)."""

    def __init__(self, config: EngineConfig, memory: EngineMemory, seeds: list[int]) -> None:
        self._ray = ray = import_ray()
        self._closed = False
        self._options = actor_options(config.ray_options)
        self._iterable = config.iterable
        self._restarts = config.restarts if not config.iterable else 0
        self._restarted = 0  # this epoch's restarts (worker_restarts is an epoch's budget)
        n = config.capacity
        connect(ray)
        check_resources(ray, n, self._options)
        # The dataset and collate go into the object store once; each actor's own
        # arguments (worker id, seed) carry none of them, and Ray hands each the fetcher.
        self._fetcher = ray.put(config.make_fetcher())
        import_torch = _torch.loaded() is not None
        self.workers = [
            _Actor(
                wid,
                WorkerArgs(
                    worker_id=wid,
                    num_workers=n,
                    seed=seeds[wid],
                    fetcher=None,  # type: ignore[arg-type]  # the store's copy, in the actor
                    worker_init_fn=config.init_fn,
                    import_torch=import_torch,
                ),
            )
            for wid in range(n)
        ]
        self._next_start = 0
        self._start_limit = n
        self._ready: collections.deque[tuple[int, ToIterator]] = collections.deque()
        self._arrivals = Arrivals(config.init_fn)
        self._generation: int | None = None

    # -- starts -------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """Whether the pool can still serve tasks."""
        return not self._closed

    @property
    def pending_start(self) -> bool:
        """Whether some workers (within the start limit) have no actor yet."""
        return self._next_start < self._start_limit and not self._closed

    def start(self, count: int | None = None) -> None:
        """Make the next ``count`` actors (default: all); Ray places them meanwhile."""
        todo = self.workers[self._next_start : self._start_limit]
        for w in todo[:count] if count is not None else todo:
            self._make_actor(w)
            self._next_start += 1
            unsent, w.unsent = w.unsent, None
            self.send(w.wid, unsent or [])

    def _make_actor(self, w: _Actor) -> None:
        try:
            actor = _actor_class(self._ray).options(**self._options)
            w.actor = actor.remote(w.args, self._fetcher)
        except BaseException:
            self.shutdown()
            raise
        w.hello, w.since = None, time.monotonic()
        w.calls.appendleft((w.actor.hello.remote(), None))

    def limit_start(self, count: int) -> None:
        """Let :meth:`start` make only the first ``count`` actors."""
        self._start_limit = count

    def is_started(self, wid: int) -> bool:
        """Whether worker ``wid``'s actor was made."""
        return self.workers[wid].actor is not None

    def gauges(self) -> PoolGauges:
        """No pids (the actors' processes may be on other machines; autotune is off), no
        shared memory of stoker's (batches live in Ray's object store)."""
        return PoolGauges(pids=[], shared_bytes=0)

    def handles(self) -> list[Any]:
        """The Ray actor handle of each worker made."""
        return [w.actor for w in self.workers[: self._start_limit] if w.actor is not None]

    def describe(self, wid: int) -> str:
        """'worker 1 (Ray actor 1a2b... (pid 42) on node 10.0.0.2 (node id ...))'."""
        return f"worker {wid} ({self.workers[wid].where()})"

    # -- tasks and answers --------------------------------------------------------------

    def send(self, wid: int, tasks: list[Task]) -> None:
        """One actor call per task (a group of tiny batches is one task); an epoch's first
        task renews the restart budget (``worker_restarts`` is an epoch's)."""
        if tasks and tasks[0].generation != self._generation:
            self._generation, self._restarted = tasks[0].generation, 0
        w = self.workers[wid]
        if w.unsent is not None:
            w.unsent.extend(tasks)
            return
        for task in tasks:
            w.calls.append((w.actor.load.remote(task), task))

    def buffered(self) -> tuple[int, ToIterator] | None:
        """A (worker id, message) already answered, or None; never waits."""
        return self._ready.popleft() if self._ready else None

    def get(self, timeout_s: float) -> tuple[int, ToIterator] | None:
        """The next (worker id, message), or None after ``timeout_s``.

        Raises:
            WorkerError: an actor died (and may not restart), or could not be placed.
        """
        deadline = time.monotonic() + timeout_s
        while not self._ready:
            heads = {w.calls[0][0]: w for w in self.workers if w.calls}
            left = deadline - time.monotonic()
            if not heads or left <= 0:
                if heads or left <= 0:
                    return None
                time.sleep(min(left, _WAIT_SLICE_S))  # nothing in flight: nothing to wait on
                continue
            done, _ = self._ray.wait(list(heads), num_returns=1, timeout=min(left, _WAIT_SLICE_S))
            if not done:
                self._check_placed()
                continue
            more, _ = self._ray.wait(list(heads), num_returns=len(heads), timeout=0)
            for ref in dict.fromkeys([*done, *more]):
                self._collect(heads[ref])
        return self._ready.popleft()

    def _collect(self, w: _Actor) -> None:
        """Take worker ``w``'s oldest answer (ready) into the queue of messages."""
        ref, task = w.calls.popleft()
        try:
            answer = self._ray.get(ref)
        except self._ray.exceptions.RayError as exc:
            w.calls.appendleft((ref, task))
            return self._died(w, exc)
        if task is None:  # its hello
            w.hello, answer = answer, answer.messages
        for msg in answer:
            got = self._arrivals.take(self, w.wid, msg)
            if got is not None:
                self._ready.append((w.wid, got))
        return None

    def _check_placed(self) -> None:
        """Raise for an actor that Ray could not place within :data:`PLACE_TIMEOUT_S`."""
        now = time.monotonic()
        for w in self.workers:
            if w.actor is not None and w.hello is None and now - w.since > PLACE_TIMEOUT_S:
                free = self._ray.available_resources()
                self.shutdown()
                raise WorkerError(
                    f"DataLoader worker {w.wid} ({w.where()}) waited {PLACE_TIMEOUT_S:g} s for "
                    f"Ray to place and start its actor: it asks for {self._options}, and the "
                    f"cluster has {shown(free)} free now. Free those resources (other actors "
                    "or jobs hold them), lower num_workers or ray_options, or add nodes; if "
                    "they are free, its node is too busy to start it."
                )

    def _died(self, w: _Actor, exc: BaseException) -> None:
        """Worker ``w``'s actor is gone: restart it with its tasks, or raise."""
        where, failed_start = w.where(), bool(getattr(exc, "actor_init_failed", False))
        if not failed_start and self._may_restart(w):  # a start that failed would again
            warnings.warn(
                f"DataLoader worker {w.wid} ({where}) died ({_reason(exc)}); restarted it "
                f"on a new actor, its {len(w.calls)} unanswered tasks sent again (restart "
                f"{self._restarted} of worker_restarts={self._restarts} this epoch).",
                RuntimeWarning,
                stacklevel=2,
            )
            with contextlib.suppress(Exception):
                self._ray.kill(w.actor, no_restart=True)
            tasks = [task for _, task in w.calls if task is not None]
            w.calls.clear()
            self._make_actor(w)
            for task in tasks:
                w.calls.append((w.actor.load.remote(task), task))
            return
        self.shutdown()
        if failed_start:
            raise WorkerError(
                f"DataLoader worker {w.wid} ({where}) could not start: {_reason(exc)}. The "
                "dataset, collate_fn and worker_init_fn are unpickled on the worker's node, so "
                "their modules (and stoker) must be importable there: install them on every "
                "node, or pass a runtime_env in ray_options."
            ) from None
        hint = (
            "an iterable dataset's worker cannot be restarted (its stream would repeat)"
            if self._iterable
            else "pass worker_restarts=N to restart it with its tasks (the batches stay the same)"
        )
        pid = w.hello.pid if w.hello is not None else None
        raise WorkerError(
            f"DataLoader worker (pid {pid}) exited unexpectedly. Worker {w.wid}, {where}, "
            f"died: {_reason(exc)}. Its node may have run out of memory or been lost (see "
            f"`ray status` and the node's logs); {hint}."
        ) from None

    def _may_restart(self, w: _Actor) -> bool:
        """Whether worker ``w`` may have a new actor, counting it. An actor lost before it
        started was placed on a node that was dying (Ray had not seen it die yet): placing
        it again, up to :data:`_PLACE_AGAIN` times, is no restart of the worker."""
        if not self._restarts:
            return False
        if w.hello is None and w.replaced < _PLACE_AGAIN:
            w.replaced += 1
            return True
        if self._restarted < self._restarts:
            self._restarted += 1
            return True
        return False

    def unpack(self, wid: int, msg: Shipped) -> Any:
        """A Ray worker's shipped batch is the object itself (views of the object store)."""
        return msg.payload

    def bye(self, wid: int, bye: Bye) -> None:
        """An actor's worker loop ended early (``sys.exit()`` in the dataset...): raise."""
        w = self.workers[wid]
        why, code = bye.why if bye.why is not None else ("an unknown cause", None)
        where = w.where()
        self.shutdown()
        raise WorkerError(
            f"DataLoader worker (pid {w.hello.pid if w.hello else None}) exited unexpectedly "
            f"with exit code {code}. Worker {w.wid}, {where}, was ended by {why}."
        )

    def shutdown(self, grace_s: float = 0.0) -> None:
        """Kill every actor (their batches in flight are dropped); idempotent."""
        if self._closed:
            return
        self._closed = True
        self._fetcher = None  # the dataset's copy in the object store goes with the actors
        ray = self._ray
        if not ray.is_initialized():
            return  # Ray was shut down first: its actors went with it
        for w in self.workers:
            w.calls.clear()
            if w.actor is not None:
                with contextlib.suppress(Exception):
                    ray.kill(w.actor, no_restart=True)
        self._ready.clear()
