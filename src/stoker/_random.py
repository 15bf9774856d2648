"""Seeds and random generators from the ``generator`` arguments that stoker accepts.

A ``generator`` may be None (draw from the global RNG: torch's when torch is imported, else
NumPy's, so ``torch.manual_seed`` or ``np.random.seed`` make a run repeatable), an ``int``
seed, a ``numpy.random.Generator`` or a ``torch.Generator``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stoker import _torch

_SEED_BOUND = 2**63 - 1

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


def rng(*seed_parts: int) -> np.random.Generator:
    """A NumPy generator seeded from a tuple of non-negative ints, e.g. (seed, epoch).

    >>> int(rng(1, 2).integers(100)) == int(rng(1, 2).integers(100))
    True
    """
    return np.random.default_rng([int(p) for p in seed_parts])
