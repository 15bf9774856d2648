"""torch's exceptions from the pure parts and the DataLoader's arguments, differentially.

Each case runs on ``torch.utils.data`` and on stoker and asserts that stoker raises an
instance of torch's exception type, at the same moment (construction or iteration), with
torch's key phrase in its message (stoker's explanation and fix follow the phrase).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import stoker
from stoker.errors import ArgumentError, ArgumentTypeError, WeightsError

torch = pytest.importorskip("torch")
td = torch.utils.data

Build = Callable[[Any], Any]


def _stream(m: Any) -> Any:
    """An IterableDataset of module ``m``."""

    class Stream(m.IterableDataset):  # type: ignore[misc, name-defined]
        def __iter__(self) -> Iterator[int]:
            return iter(range(3))

    return Stream()


def _set_batch_size(m: Any) -> None:
    loader = m.DataLoader(list(range(4)))
    loader.batch_size = 3


DS = list(range(8))
INF, NAN = float("inf"), float("nan")

# (id, build, iterate, torch's phrase). ``build(m)`` makes the object with module ``m``;
# with ``iterate`` the object is then iterated (a list is made of it).
CASES: list[tuple[str, Build, bool, str]] = [
    # datasets
    ("tensor_size", lambda m: m.TensorDataset(torch.zeros(3), torch.zeros(4)), False,
     "Size mismatch between tensors"),
    ("concat_empty", lambda m: m.ConcatDataset([]), False,
     "datasets should not be an empty iterable"),
    ("concat_iterable", lambda m: m.ConcatDataset([_stream(m)]), False,
     "ConcatDataset does not support IterableDataset"),
    ("concat_negative_index", lambda m: m.ConcatDataset([[1, 2]])[-5], False,
     "absolute value of index should not exceed dataset length"),
    ("stack_none", lambda m: m.StackDataset(), False, "At least one dataset should be passed"),
    ("stack_sizes", lambda m: m.StackDataset([1, 2], [1]), False,
     "Size mismatch between datasets"),
    ("stack_kw_sizes", lambda m: m.StackDataset(a=[1], b=[1, 2]), False,
     "Size mismatch between datasets"),
    ("stack_both", lambda m: m.StackDataset([1], a=[1]), False, "Supported either"),
    ("chain_member", lambda m: m.ChainDataset([[1, 2]]), True,
     "ChainDataset only supports IterableDataset"),
    ("chain_len", lambda m: len(m.ChainDataset([[1, 2]])), False,
     "ChainDataset only supports IterableDataset"),
    ("split_fraction", lambda m: m.random_split(range(10), [1.2, -0.2]), False,
     "Fraction at index 0 is not between 0 and 1"),
    ("split_sum", lambda m: m.random_split(range(10), [3, 3]), False,
     "Sum of input lengths does not equal the length of the input dataset"),
    ("split_float_length", lambda m: m.random_split(range(10), [2.5, 7.5]), False, ""),
    # samplers
    ("random_replacement", lambda m: m.RandomSampler(range(3), replacement=1), False,
     "replacement should be a boolean value"),
    ("random_num_samples", lambda m: m.RandomSampler(range(3), num_samples=0), False,
     "num_samples should be a positive integer value"),
    ("random_float_num_samples", lambda m: m.RandomSampler(range(3), num_samples=2.0), False,
     "num_samples should be a positive integer value"),
    ("random_empty", lambda m: m.RandomSampler([]), False,
     "num_samples should be a positive integer value"),
    ("weighted_num_samples", lambda m: m.WeightedRandomSampler([1, 2], 0), False,
     "num_samples should be a positive integer value"),
    ("weighted_bool_num_samples", lambda m: m.WeightedRandomSampler([1, 2], True), False,
     "num_samples should be a positive integer value"),
    ("weighted_replacement", lambda m: m.WeightedRandomSampler([1, 2], 2, "x"), False,
     "replacement should be a boolean value"),
    ("weighted_2d", lambda m: m.WeightedRandomSampler([[1.0, 2.0]], 2), False,
     "weights should be a 1d sequence"),
    ("weighted_negative", lambda m: m.WeightedRandomSampler([-1.0, 2.0], 2), True,
     "invalid multinomial distribution (encountering probability entry < 0)"),
    ("weighted_nan", lambda m: m.WeightedRandomSampler([NAN, 2.0], 2), True,
     "invalid multinomial distribution (encountering probability entry < 0)"),
    ("weighted_inf", lambda m: m.WeightedRandomSampler([INF, 2.0], 2), True,
     "invalid multinomial distribution (encountering probability entry = infinity or NaN)"),
    ("weighted_negative_no_replacement",
     lambda m: m.WeightedRandomSampler([-1.0, 2.0], 1, replacement=False), True,
     "probability tensor contains either `inf`, `nan` or element < 0"),
    ("weighted_zero_sum", lambda m: m.WeightedRandomSampler([0.0, 0.0], 2), True,
     "invalid multinomial distribution (sum of probabilities <= 0)"),
    ("weighted_too_many",
     lambda m: m.WeightedRandomSampler([1.0, 2.0], 3, replacement=False), True,
     "cannot sample n_sample > prob_dist.size(-1) samples without replacement"),
    ("batch_size_zero", lambda m: m.BatchSampler(range(3), 0, False), False,
     "batch_size should be a positive integer value"),
    ("batch_size_bool", lambda m: m.BatchSampler(range(3), True, False), False,
     "batch_size should be a positive integer value"),
    ("batch_drop_last", lambda m: m.BatchSampler(range(3), 2, 1), False,
     "drop_last should be a boolean value"),
    ("distributed_rank", lambda m: m.DistributedSampler(range(4), num_replicas=2, rank=2),
     False, "Invalid rank 2, rank should be in the interval [0, 1]"),
    ("distributed_negative_rank",
     lambda m: m.DistributedSampler(range(4), num_replicas=2, rank=-1), False,
     "Invalid rank -1, rank should be in the interval [0, 1]"),
    # DataLoader arguments
    ("loader_num_workers", lambda m: m.DataLoader(DS, num_workers=-1), False,
     "num_workers option should be non-negative; use num_workers=0 to disable multiprocessing"),
    ("loader_timeout", lambda m: m.DataLoader(DS, timeout=-1), False,
     "timeout option should be non-negative"),
    ("loader_prefetch_without_workers", lambda m: m.DataLoader(DS, prefetch_factor=2), False,
     "prefetch_factor option could only be specified in multiprocessing"),
    ("loader_prefetch_negative", lambda m: m.DataLoader(DS, num_workers=1, prefetch_factor=-1),
     False, "prefetch_factor option should be non-negative"),
    ("loader_prefetch_string", lambda m: m.DataLoader(DS, num_workers=1, prefetch_factor="x"),
     False, ""),
    ("loader_prefetch_zero", lambda m: m.DataLoader(DS, num_workers=1, prefetch_factor=0), True,
     "prefetch_factor must be greater than 0"),
    ("loader_prefetch_float", lambda m: m.DataLoader(DS, num_workers=1, prefetch_factor=2.5),
     True, "'float' object cannot be interpreted as an integer"),
    ("loader_persistent", lambda m: m.DataLoader(DS, persistent_workers=True), False,
     "persistent_workers option needs num_workers > 0"),
    ("loader_start_method",
     lambda m: m.DataLoader(DS, num_workers=1, multiprocessing_context="bogus"), False,
     "multiprocessing_context option should specify a valid start method in"),
    ("loader_context_type", lambda m: m.DataLoader(DS, num_workers=1, multiprocessing_context=3),
     False, "multiprocessing_context option should be a valid context object or a string"),
    ("loader_context_without_workers",
     lambda m: m.DataLoader(DS, multiprocessing_context="spawn"), False,
     "multiprocessing_context can only be used with multi-process loading (num_workers > 0), "
     "but got num_workers=0"),
    ("loader_sampler_shuffle", lambda m: m.DataLoader(DS, sampler=[0], shuffle=True), False,
     "sampler option is mutually exclusive with shuffle"),
    ("loader_batch_sampler_batch_size",
     lambda m: m.DataLoader(DS, batch_sampler=[[0]], batch_size=2), False,
     "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and "
     "drop_last"),
    ("loader_batch_sampler_shuffle",
     lambda m: m.DataLoader(DS, batch_sampler=[[0]], shuffle=True), False,
     "batch_sampler option is mutually exclusive with batch_size"),
    ("loader_batch_sampler_sampler",
     lambda m: m.DataLoader(DS, batch_sampler=[[0]], sampler=[0]), False,
     "batch_sampler option is mutually exclusive with batch_size"),
    ("loader_batch_sampler_drop_last",
     lambda m: m.DataLoader(DS, batch_sampler=[[0]], drop_last=True), False,
     "batch_sampler option is mutually exclusive with batch_size"),
    ("loader_no_batching_drop_last", lambda m: m.DataLoader(DS, batch_size=None, drop_last=True),
     False, "batch_size=None option disables auto-batching and is mutually exclusive with "
     "drop_last"),
    ("loader_batch_size", lambda m: m.DataLoader(DS, batch_size=0), False,
     "batch_size should be a positive integer value"),
    ("loader_drop_last", lambda m: m.DataLoader(DS, drop_last="x"), False,
     "drop_last should be a boolean value"),
    ("loader_iterable_shuffle", lambda m: m.DataLoader(_stream(m), shuffle=True), False,
     "DataLoader with IterableDataset: expected unspecified shuffle option"),
    ("loader_iterable_sampler", lambda m: m.DataLoader(_stream(m), sampler=[0]), False,
     "DataLoader with IterableDataset: expected unspecified sampler option"),
    ("loader_iterable_batch_sampler", lambda m: m.DataLoader(_stream(m), batch_sampler=[[0]]),
     False, "DataLoader with IterableDataset: expected unspecified batch_sampler option"),
    ("loader_frozen_attribute", _set_batch_size, False,
     "batch_size attribute should not be set after DataLoader is initialized"),
]  # fmt: skip


def _outcome(build: Build, iterate: bool, module: Any) -> tuple[str, BaseException | None]:
    """("build" | "iterate", the exception) or ("ok", None)."""
    try:
        made = build(module)
    except Exception as exc:
        return "build", exc
    if iterate:
        try:
            list(made)
        except Exception as exc:
            return "iterate", exc
    return "ok", None


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize(("build", "iterate", "phrase"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_same_exception_as_torch(build: Build, iterate: bool, phrase: str) -> None:
    """stoker raises torch's type (or a subclass), at torch's moment, with torch's phrase."""
    theirs_when, theirs = _outcome(build, iterate, td)
    assert theirs is not None, "torch raises here"
    assert phrase in str(theirs)
    ours_when, ours = _outcome(build, iterate, stoker)
    assert ours_when == theirs_when, (ours_when, ours)
    assert isinstance(ours, type(theirs)), (type(ours), type(theirs), ours)
    assert phrase in str(ours)
    assert len(str(ours)) > len(phrase) + 20, "stoker explains and says how to fix it"


def test_assertion_classes_are_stokers_precise_types_too() -> None:
    """Where torch asserts, stoker's error is an AssertionError and the precise builtin."""
    with pytest.raises(ValueError, match="Size mismatch between tensors"):
        stoker.TensorDataset(np.zeros(3), np.zeros(4))
    with pytest.raises(ArgumentError):
        stoker.ConcatDataset([])
    with pytest.raises(TypeError, match="does not support IterableDataset"):
        stoker.ConcatDataset([_stream(stoker)])
    assert issubclass(ArgumentTypeError, AssertionError)
    assert issubclass(WeightsError, RuntimeError) and issubclass(WeightsError, ValueError)


@pytest.mark.parametrize("generator", [None, 3])
def test_weights_are_checked_when_drawn_for_every_generator(generator: Any) -> None:
    """Bad weights build and raise WeightsError when an epoch is drawn, on torch's stream
    and on stoker's own draws alike."""
    s = stoker.WeightedRandomSampler([1.0, -2.0], 4, generator=generator)
    with pytest.raises(WeightsError, match="encountering probability entry < 0"):
        next(iter(s))


def test_split_zero_length_warning_as_torch() -> None:
    """A fraction that rounds to an empty split warns as torch warns."""
    caught = []
    for module in (td, stoker):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            module.random_split(range(3), [0.1, 0.1, 0.8])
        caught.append([(w.category, str(w.message)) for w in seen])
    assert caught[0] == caught[1]
    assert caught[0] and "Length of split at index 1 is 0" in caught[0][0][1]


def _overrunning(m: Any) -> Any:
    """An IterableDataset of module ``m`` whose len() says 2 but which yields 4 samples."""

    class Overrun(m.IterableDataset):  # type: ignore[misc, name-defined]
        def __iter__(self) -> Iterator[int]:
            return iter(range(4))

        def __len__(self) -> int:
            return 2

    return Overrun()


def test_iterable_length_warning_as_torch() -> None:
    """An IterableDataset yielding more than len(loader) said warns as torch warns, at the
    same batch."""
    seen: list[list[tuple[int, type[Warning]]]] = []
    for module in (td, stoker):
        loader = module.DataLoader(_overrunning(module), batch_size=None)
        assert len(loader) == 2
        at = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for k, _ in enumerate(loader):
                at.extend(
                    (k, w.category) for w in caught if "Length of IterableDataset" in str(w.message)
                )
                caught.clear()
        seen.append(at)
    assert seen[0] == seen[1] and seen[0]
