"""Every threshold and rule by which stoker's loading decides, each once, with its reason.

Pure: nothing here starts a process, touches the OS or imports the engine; each rule has
unit tests (``tests/test_engine_policy.py``). The rules:

- **only stoker's code** (:func:`only_stoker_code`) and **who may see the assignment**
  (:func:`assigns_freely`): stoker's own assignment only where no user code runs.
- **lazy start** (:func:`starts_lazily`): fork workers after the first start late.
- **grouping** (:func:`group_size`): tiny, fast batches share a prefetch slot and a message.
- **tail split** (:func:`worth_splitting`) and **thread split**
  (:data:`THREAD_SPLIT_MIN_S`): slow batches shared among workers that would idle.
- **prefetch sizing** (:data:`DEFAULT_PREFETCH`, :func:`slots_kept_free`, ...).
- **first look** (:data:`THREADS_WAIT_SHARE`, ...): autotune's probe; **the autotuner's**
  budget, windows and trials (:data:`MIN_GAIN`, ...).
- Where batches load (in process, threads or processes) is decided by the rules of
  :mod:`stoker._placement`, on these thresholds.
- **the engine's** slot, hold and wait sizes (:data:`EAGER_FREE_BYTES`, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from stoker._collate import DefaultCollate
from stoker._dataset import draws_nothing

# -- who may see the assignment ----------------------------------------------------------


def is_default_collate(collate_fn: Any) -> bool:
    """Whether ``collate_fn`` is stoker's own default collate, not a subclass (which may
    run code of the user's, and whose batches may not join)."""
    return type(collate_fn) is DefaultCollate


def only_stoker_code(dataset: Any, collate_fn: Any) -> bool:
    """Whether loading a batch runs only stoker's code: a dataset that surely draws
    nothing (:func:`~stoker._dataset.draws_nothing`) batched by stoker's default collate.
    Nothing of the user's runs then, so nothing draws from the global RNGs or sees which
    worker loads what: the one test of it (fetchers, assignment, the in-process trial)."""
    return is_default_collate(collate_fn) and draws_nothing(dataset)


def assigns_freely(
    dataset: Any, collate_fn: Any, iterable: bool, init_fn: Callable[[int], None] | None
) -> bool:
    """Whether stoker may assign batches to workers its own way (fewest in flight, lazy
    start, groups, tail splits) instead of torch's round robin: where none of the user's
    code runs in the workers, so none can see which worker loads what, or when.

    That is: a map-style dataset that surely draws nothing (only stoker's code loads it,
    see :func:`~stoker._dataset.draws_nothing`), or whose class sets
    ``_stoker_worker_agnostic = True`` (its samples depend neither on the worker nor on
    the timing), with stoker's default collate and no ``worker_init_fn``.
    """
    if iterable or init_fn is not None:
        return False
    agnostic = getattr(type(dataset), "_stoker_worker_agnostic", 0) is True
    return only_stoker_code(dataset, collate_fn) or (is_default_collate(collate_fn) and agnostic)


def balances_load(free: bool, tuned: bool, iterable: bool) -> bool:
    """Whether a task goes to the worker with the fewest in flight rather than the next in
    torch's cycle: where stoker assigns ``free``ly, and where ``num_workers="auto"`` is
    ``tuned`` for a map-style dataset. torch has no "auto" whose assignment could be
    matched, and workers added within an epoch must take the tasks left, not queue them
    behind the first worker's (which batch a worker loads never changes the batch). An
    iterable dataset's data is its worker's: it keeps the cycle."""
    return free or (tuned and not iterable)


# -- lazy start --------------------------------------------------------------------------

LAZY_START_S = 0.02
"""Fork workers beyond the first start after the first batch, or after this long without
one: a fast first batch does not wait for the other forks, a slow one barely delays them."""
EAGER_AFTER_S = 0.01
"""A first batch slower than this (a fork or two) in a loader's last epoch: start all its
workers at once in the next one."""


def starts_lazily(free: bool, fork: bool, last_first_batch_s: float) -> bool:
    """Whether an iterator starts one worker first and the others after its first batch.

    Only where stoker assigns freely (workers running the user's code may wait for each
    other), under fork (each fork costs the main process a copy of its page
    table, while spawned workers start so slowly that all start at once), and unless the
    loader's last epoch waited longer than :data:`EAGER_AFTER_S` for its first batch.

    >>> starts_lazily(True, True, 0.0), starts_lazily(True, True, 0.5)
    (True, False)
    """
    return free and fork and last_first_batch_s < EAGER_AFTER_S


# -- grouping ----------------------------------------------------------------------------

GROUP_AFTER = 8
"""Batches delivered before the group is sized (the first ones pay for warm-up)."""
SMALL_BATCH_BYTES = 256 << 10
"""Batches under this size may share a prefetch slot (a group fills at most this much)."""
FAST_BATCH_S = 0.0005
"""Batches that load faster than this cost more to send and receive than to make: they
are grouped, and a worker holds their results briefly to write several at once."""
MAX_GROUP = 16
"""Most batches in one group."""


def group_size(nbytes: float, seconds: float) -> int:
    """How many batches of ``nbytes`` that a worker loads in ``seconds`` each count as one
    prefetch slot: several when they are small and fast, since sending a task and receiving
    its batch then costs more than loading it, and a worker with a shallow queue would wait
    for the main process most of the time. Process workers get that many as one task and
    answer with one slot and one message.

    >>> group_size(10_000, 0.00005), group_size(10_000, 0.01), group_size(1 << 20, 0.00005)
    (16, 1, 1)
    """
    if nbytes >= SMALL_BATCH_BYTES or seconds >= FAST_BATCH_S:
        return 1
    return int(min(MAX_GROUP, SMALL_BATCH_BYTES // max(1.0, nbytes)))


def typical_load_s(loads: Sequence[float]) -> float:
    """A batch's load time from the first ones measured: their median, since each worker's
    first batch pays for its start-up and a mean would count that.

    >>> typical_load_s([0.02, 0.02, 1e-5, 2e-5, 1e-5, 1e-5]), typical_load_s([])
    (2e-05, 0.0)
    """
    ordered = sorted(loads) or [0.0]
    return ordered[len(ordered) // 2]


# -- splitting slow batches --------------------------------------------------------------

TAIL_SPLIT_MIN_S = 0.02
"""Process workers' batches that load faster than this are never split at an epoch's tail
(a part costs a message and a join); a worker reports whether those that are slower drew
from the global random generators (a split needs them untouched)."""
JOIN_BYTES_PER_S = 4e9
"""About how fast the main process copies split parts into one batch."""
SPLIT_GAIN = 5
"""A batch is split only if loading it takes this many times longer than joining its
parts: a batch whose loading is mostly copying, as with samples already in memory, is left
whole."""
THREAD_SPLIT_MIN_S = 0.0005
"""A thread worker's first sample slower than this is worth handing the batch's other
samples to idle threads (a sample taken costs a lock and a list append)."""


def worth_splitting(load_s: float, nbytes: float) -> bool:
    """Whether batches of ``nbytes`` that take ``load_s`` to load gain from a tail split.

    >>> worth_splitting(0.5, 100 << 20), worth_splitting(0.03, 100 << 20)
    (True, False)
    """
    return load_s >= TAIL_SPLIT_MIN_S and load_s >= SPLIT_GAIN * nbytes / JOIN_BYTES_PER_S


# -- prefetch sizing ---------------------------------------------------------------------

DEFAULT_PREFETCH = 2
"""Batches loaded ahead per worker when ``prefetch_factor`` is not given (torch's)."""
JOIN_BUFFERS = 2
"""Memory for joined split batches a loader keeps: the one the loop holds and the next."""
IN_PROCESS_NOW_S = 100e-6
"""With ``num_workers="auto"``, a batch whose first load takes less than this is loaded in
the main process from the next one on (where loading in process may stand in for workers,
see :func:`stoker._placement.may_load_in_process`): handing a batch over from a worker
costs about as much, so workers cannot deliver it sooner, and waiting for an epoch's end
to try would leave a short epoch with workers that only cost."""
IN_PROCESS_BUFFERS = 2
"""Free buffers in-process loading keeps: a loop holds one batch while the next is made, so
the one it dropped before is free again, with one to spare."""


def prefetch_of(prefetch_factor: int | str | None) -> int:
    """The prefetch window per worker that a fixed (or absent) ``prefetch_factor`` gives;
    ``"auto"`` starts at :data:`DEFAULT_PREFETCH`.

    >>> prefetch_of(None), prefetch_of("auto"), prefetch_of(5)
    (2, 2, 5)
    """
    if isinstance(prefetch_factor, str):
        return DEFAULT_PREFETCH
    return max(1, int(prefetch_factor or DEFAULT_PREFETCH))


def slots_kept_free(prefetch: int) -> int:
    """Free shared-memory slots a process worker keeps: its batches in flight, the one the
    user holds, and frees still on their way back.

    >>> slots_kept_free(2)
    6
    """
    return 2 * prefetch + 2


def steady_slots(prefetch: int) -> int:
    """Slots a process worker uses in steady state: prefetched, held by the user, and the
    one being written.

    >>> steady_slots(2)
    4
    """
    return prefetch + 2


def thread_buffers(workers: int, prefetch: int) -> int:
    """Free buffers thread workers share: every batch in flight, the one held, and the one
    returning.

    >>> thread_buffers(4, 2)
    10
    """
    return workers * prefetch + 2


# -- the autotuner's first look -----------------------------------------------------------

PROBE_SAMPLES = 8
"""Samples of its first batch a worker times before it reports them to the autotuner (see
:mod:`stoker._engine._probe`): the first alone, the others with any helping threads; few,
since an epoch may have only a handful of batches and the count must be right from the
first."""
THREADS_WAIT_SHARE = 0.5
"""``worker_mode="auto"``: a fetch that waits (I/O, sleep: the GIL released) at least this
share of its wall time runs in threads, which start at once and pass batches without a copy."""
GIL_FREE_SPEEDUP = 1.25
"""``worker_mode="auto"``: threads loading samples side by side must use this many times
the CPU one uses alone for the fetch to count as releasing the GIL. Held, they share one
CPU (about 1x); released, they use what the machine gives, which on two cores busy with
other work can be as little as 1.3x."""


# -- the autotuner: its memory budget, windows, jumps and in-process trials ---------------

MEMORY_BUDGET_BYTES = 2 << 30
"""The memory the autotuner always lets batches in flight take (see :func:`memory_budget`)."""
MEMORY_BUDGET_SHARE = 0.25
"""The share of the memory available to this process that batches in flight may take."""

INPUT_BOUND = 0.20
"""The consumer must wait at least this fraction of a window for more workers to help."""
MIN_GAIN = 0.05
"""An addition must raise batches/s by this fraction to be followed by another."""
MIN_WINDOW_S = 0.05
"""Shortest window: shorter ones measure noise."""
MIN_WINDOW_BATCHES = 2
"""Fewest batches in a window (a window also spans one batch per worker)."""
MAX_PREFETCH = 8
"""The deepest prefetch window ``prefetch_factor="auto"`` goes to."""
MAX_GROWTH = 4
"""At most this factor more workers in one decision."""
CPU_SLACK = 0.25
"""How far (in CPUs) the predicted use may exceed the CPUs available."""
WORKERS_PER_CPU = 4
"""Capacity: process workers per CPU (waiting workers use little CPU; measuring decides)."""
MAX_CAPACITY = 32
"""At most this many workers, whatever the CPU count."""
MEASURE_BELOW_S = 0.002
"""A first batch (cold: a worker's first) faster than this is timed in the main process
too, to see whether it loads under :data:`~stoker._policy.IN_PROCESS_NOW_S` there; a
slower one surely does not, and timing it would cost more than it could save."""
JUMP_BATCH_S = 0.02
"""A batch the probe says loads slower than this sends the count straight to the model's:
an epoch may be over before windows of such batches reach it. Faster batches are tuned by
windows, which then take milliseconds and also see how fast the consumer takes batches."""
MIN_EPOCH_BATCHES = 8
"""Fewest batches an epoch needs to count in the in-process comparison."""
BUSY_SHARE = 0.8
"""Workers busier than this share of an epoch are the bottleneck: more, not none, help."""
RETRY_AFTER = 2
"""Epochs with workers after a lost in-process trial before another (twice as many after
each loss): one trial epoch slowed by something else on the machine does not decide for
good, and a dataset that really loads slower in process costs a trial epoch ever more rarely."""


# -- the engine: slots, held results, waits ------------------------------------------

EAGER_FREE_BYTES = 1 << 20
"""Slots from this size up are returned to their worker as soon as their batch dies."""

HOLD_S = 0.001
"""How long a worker may hold the results of fast batches to write several at once."""

SPARE_MIN_BYTES = 1 << 20
"""Slots from this size up are made ahead in a helper thread; smaller ones cost less to
make than the thread."""

KEEP_FREE_BYTES = 16 << 20
"""Free slots are kept up to ``keep_free`` of them, or more while they total at most this
many bytes: small slots then stop being made and retired as batches come back in bursts."""

DECIDE_WAIT_S = 0.5
"""How long a thread waits for the probe's first sample to tell whether the dataset draws:
far longer than a sample usually takes; past it (a sample that waits for other workers'
samples, as torch lets every worker load its first batch at once) it fetches beside it."""

HEALTH_CHECK_S = 5.0
"""Longest single wait for a result; deaths are seen at once, this only bounds the call."""

START_TIMEOUT_S = 120.0
"""``timeout`` counts from a worker's start-up; before it, start-up (spawn imports) may take
this long."""


# -- messages ----------------------------------------------------------------------------

INDICES_SHOWN = 16
"""Sample indices an error or warning lists before it says "...": enough to see a pattern,
few enough to read."""
