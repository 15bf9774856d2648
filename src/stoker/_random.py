"""Seeds and random generators from the ``generator`` arguments that stoker accepts.

A ``generator`` may be None (draw from the global RNG: torch's when torch is imported, else
NumPy's, so ``torch.manual_seed`` or ``np.random.seed`` make a run repeatable), an ``int``
seed, a ``numpy.random.Generator`` or a ``torch.Generator``.
"""

from __future__ import annotations

import base64
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from stoker import _torch

_SEED_BOUND = 2**63 - 1

T = TypeVar("T")

GeneratorLike = Any
"""None, an int seed, a ``numpy.random.Generator`` or a ``torch.Generator``."""


def check_generator(generator: object, name: str = "generator") -> None:
    """Raise ``TypeError`` unless ``generator`` is one of the accepted kinds."""
    if generator is None or isinstance(generator, np.random.Generator):
        return
    if isinstance(generator, (int, np.integer)) and not isinstance(generator, bool):
        if generator < 0:
            raise ValueError(f"{name} as an int seed must be >= 0, got {generator}.")
        return
    torch = _torch.loaded()
    if torch is not None and isinstance(generator, torch.Generator):
        return
    raise TypeError(
        f"{name} must be None, an int seed, a numpy.random.Generator or a torch.Generator, "
        f"got {type(generator).__name__}."
    )


def draw_seed(generator: GeneratorLike = None) -> int:
    """A seed in [0, 2**63 - 1) drawn from ``generator``, advancing it as torch does.

    An int generator is returned as the seed itself.

    >>> draw_seed(7)
    7
    >>> import numpy as np
    >>> draw_seed(np.random.default_rng(0)) == draw_seed(np.random.default_rng(0))
    True
    """
    if isinstance(generator, (int, np.integer)) and not isinstance(generator, bool):
        return int(generator)
    if isinstance(generator, np.random.Generator):
        return int(generator.integers(0, _SEED_BOUND))
    torch = _torch.loaded()
    if generator is None:
        if torch is None:
            return int(np.random.randint(0, 2**62, dtype=np.int64)) * 2 + int(
                np.random.randint(0, 2)
            )
        return int(torch.empty((), dtype=torch.int64).random_().item())
    assert torch is not None, "check_generator admits no other kind"
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def torch_stream(generator: GeneratorLike) -> Any:
    """The ``torch.Generator`` that torch's samplers would draw from, or None.

    That is ``generator`` itself when it is a ``torch.Generator``, torch's default (global)
    generator when ``generator`` is None and torch is imported, and None otherwise (an int
    seed, a NumPy generator, or None without torch: stoker's own ``(seed, epoch)`` draws).
    """
    torch = _torch.loaded()
    if torch is None:
        return None
    if generator is None:
        return torch.default_generator
    return generator if isinstance(generator, torch.Generator) else None


def peek_seed(generator: GeneratorLike) -> int:
    """The seed :func:`draw_seed` would draw now, without advancing ``generator``.

    For a torch stream the draw is made on a copy of the generator's state; other kinds
    are drawn as :func:`draw_seed` draws them (an int seed does not advance anyway).
    """
    stream = torch_stream(generator)
    if stream is None:
        return draw_seed(generator)
    copy = new_torch_generator(encode_state(stream))
    return draw_seed(copy)


def encode_state(stream: Any) -> str:
    """A torch generator's state as ASCII text (base64 of its 5056 bytes on the CPU), to
    keep in a JSON-serialisable ``state_dict``."""
    raw = stream.get_state().numpy().tobytes()
    return base64.b64encode(raw).decode("ascii")


def new_torch_generator(state: str) -> Any:
    """A new CPU ``torch.Generator`` in the state :func:`encode_state` wrote."""
    torch = _torch.require("a torch RNG state in a state_dict")
    gen = torch.Generator()
    set_state(gen, state)
    return gen


def set_state(stream: Any, state: str) -> None:
    """Put a torch generator in the state :func:`encode_state` wrote.

    Raises:
        ValueError: ``state`` is not such a text.
    """
    torch = _torch.require("a torch RNG state in a state_dict")
    try:
        raw = base64.b64decode(state.encode("ascii"), validate=True)
        stream.set_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    except (ValueError, RuntimeError, AttributeError) as exc:
        raise ValueError(
            f"a saved torch generator state must be the text state_dict() wrote, got "
            f"{str(state)[:40]!r}...: {exc}; load the state_dict unchanged."
        ) from exc


def rng(*seed_parts: int) -> np.random.Generator:
    """A NumPy generator seeded from a tuple of non-negative ints, e.g. (seed, epoch).

    >>> int(rng(1, 2).integers(100)) == int(rng(1, 2).integers(100))
    True
    """
    return np.random.default_rng([int(p) for p in seed_parts])


_MASK64 = 2**64 - 1
_GAMMA, _M1, _M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def mix_seed(*parts: int) -> int:
    """A 63-bit seed mixed from non-negative ints (splitmix64 steps), e.g. (seed, epoch, batch).

    >>> mix_seed(1, 2, 3) == mix_seed(1, 2, 3), mix_seed(1, 2, 3) == mix_seed(1, 2, 4)
    (True, False)
    """
    return _mix(parts) >> 1


def _mix(parts: tuple[int, ...]) -> int:
    h = _GAMMA
    for p in parts:
        h = (h ^ (int(p) & _MASK64)) + _GAMMA & _MASK64
        h = (h ^ (h >> 30)) * _M1 & _MASK64
        h = (h ^ (h >> 27)) * _M2 & _MASK64
        h ^= h >> 31
    return h


def batch_seeds(seed: int, epoch: int, batches: Any) -> list[int]:
    """``[mix_seed(seed, epoch, k) for k in batches]``, computed at once (NumPy's uint64
    arithmetic wraps as the masks do): the seeds of many batches for the cost of a few.

    >>> batch_seeds(1, 2, [3, 4]) == [mix_seed(1, 2, 3), mix_seed(1, 2, 4)]
    True
    """
    u = np.uint64
    h = (u(_mix((seed, epoch))) ^ np.asarray(batches, dtype=u)) + u(_GAMMA)
    h = (h ^ (h >> u(30))) * u(_M1)
    h = (h ^ (h >> u(27))) * u(_M2)
    h ^= h >> u(31)
    return (h >> u(1)).tolist()  # type: ignore[no-any-return]


@dataclass(frozen=True)
class SampleSeeds:
    """Per-sample seeds, the seed kind of an elastic ``DistributedSampler``'s batches: the
    sample at place ``p`` of the epoch's global order draws from ``mix_seed(seed, epoch, p)``
    (today's batch seed with the batch number replaced by the place), so its draws do not
    depend on the rank, worker or batch it lands in. ``start`` is the place of a batch's
    first sample; its ``i``-th sample is at ``start + i``.

    >>> SampleSeeds(seed=1, epoch=2, start=3).of(2) == [mix_seed(1, 2, 3), mix_seed(1, 2, 4)]
    True
    """

    seed: int
    epoch: int
    start: int

    def of(self, count: int) -> list[int]:
        """The seeds of the ``count`` samples from :attr:`start` on."""
        return batch_seeds(self.seed, self.epoch, np.arange(self.start, self.start + count))

    def after(self, offset: int) -> SampleSeeds:
        """The seeds of the samples from ``offset`` places further on (a part of a batch)."""
        return SampleSeeds(seed=self.seed, epoch=self.epoch, start=self.start + offset)


def seed_globals(seed: int, every_device: bool = False) -> None:
    """Seed Python's ``random``, NumPy's global RNG and torch's (when imported) from ``seed``.

    Args:
        seed: the seed.
        every_device: seed torch's accelerator generators too (``torch.manual_seed``),
            when this torch build has any; otherwise only its CPU generator (cheap
            enough per batch).
    """
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    torch = _torch.loaded()
    if torch is not None:
        if every_device and _has_accelerators(torch):
            _seed_every_device(torch, seed)
        else:
            torch.default_generator.manual_seed(seed)


def _seed_every_device(torch: Any, seed: int) -> None:
    """``torch.manual_seed(seed)``, without the stack it records for CUDA.

    Before CUDA starts, torch queues the seeding of its generators with the formatted stack
    of the call, for an error message should that seeding fail later; formatting it reads
    the source file of every frame, slow in a new worker. ``sys.tracebacklimit = 0``
    makes that stack empty. Called at a worker process's start only, before it runs any
    code of the user's.
    """
    had = hasattr(sys, "tracebacklimit")
    limit = getattr(sys, "tracebacklimit", None)
    sys.tracebacklimit = 0
    try:
        torch.manual_seed(seed)
    finally:
        if had:
            sys.tracebacklimit = limit
        else:
            del sys.tracebacklimit


def _has_accelerators(torch: Any) -> bool:
    """Whether this process may use a device besides the CPU that ``torch.manual_seed``
    seeds; where it cannot, that call only costs (see :func:`_seed_every_device`). A CPU
    build has no such device; nor has CUDA a child forked after its parent started CUDA
    (torch's "bad fork": CUDA cannot start there), which is every worker of a training
    script that moved its model to the GPU first."""
    c = torch._C
    custom = getattr(c, "_get_privateuse1_backend_name", lambda: "")()
    bad_fork = getattr(getattr(torch, "cuda", None), "_is_in_bad_fork", lambda: False)
    return bool(
        (getattr(c, "_has_cuda", True) and not bad_fork())
        or getattr(c, "_has_mps", True)
        or getattr(c, "_has_xpu", True)
        or getattr(c, "_mtia_isBuilt", lambda: True)()
        or (custom and hasattr(torch, custom))
    )


def call_seeded(seed: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` with the global RNGs seeded from ``seed`` (:func:`seed_globals`), in
    the main process: the caller's own streams go on afterwards, so a training loop's
    randomness follows the seeds its user set (``torch.manual_seed``...), not the
    loader's batch seeds.

    Python's and NumPy's streams are reseeded from one draw of their own (cheaper than
    saving their whole states); torch's CPU state is kept whole.

    >>> random.seed(3); batch = call_seeded(9, random.random); after = random.random()
    >>> batch == call_seeded(9, random.random)  # the batch's draws follow its seed
    True
    >>> random.seed(3); _ = call_seeded(5, random.random); after == random.random()
    True
    """
    torch = _torch.loaded()
    py, np_seed = random.getrandbits(64), int(np.random.random_sample() * 2**32)
    torch_state = torch.default_generator.get_state() if torch is not None else None
    try:
        seed_globals(seed)
        return fn(*args)
    finally:
        random.seed(py)
        np.random.seed(np_seed)
        if torch is not None:
            torch.default_generator.set_state(torch_state)


def globals_untouched(seed: int) -> bool:
    """Whether the global RNGs are still as :func:`seed_globals` (``seed``) left them, i.e.
    nothing drew from them since (not free: for slow batches only).

    >>> seed_globals(7); globals_untouched(7), (random.random(), globals_untouched(7))[1]
    (True, False)
    """
    if random.getstate() != random.Random(seed).getstate():
        return False
    now = np.random.get_state(legacy=False)
    fresh = np.random.RandomState(seed & 0xFFFFFFFF).get_state(legacy=False)
    key, fresh_key = now["state"].pop("key"), fresh["state"].pop("key")
    if not np.array_equal(key, fresh_key) or now != fresh:  # then position, gauss
        return False
    torch = _torch.loaded()
    if torch is None:
        return True
    g = torch.Generator()
    g.manual_seed(seed)
    return bool(torch.equal(g.get_state(), torch.default_generator.get_state()))
