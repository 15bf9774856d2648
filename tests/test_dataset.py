"""Tests for stoker's datasets and random_split, with torch.utils.data as the oracle."""

from __future__ import annotations

import pickle
import warnings
from collections import deque
from typing import Any

import numpy as np
import pytest

from stoker import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
    random_split,
)
from stoker._batch import ColumnBatch
from stoker._dataset import is_iterable_dataset
from stoker._fetch import MapFetcher


class Squares(Dataset[int]):
    """Map-style dataset: sample i is i * i (records every __getitem__ call)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls: list[Any] = []

    def __getitem__(self, index: Any) -> int:
        self.calls.append(index)
        if not 0 <= index < self.n:
            raise IndexError(index)
        return int(index) * int(index)

    def __len__(self) -> int:
        return self.n


class BatchSpy(Dataset[int]):
    """Map-style dataset with __getitems__ that records what it was given."""

    _stoker_index_array = False

    def __init__(self, n: int) -> None:
        self.n = n
        self.received: list[Any] = []

    def __getitem__(self, index: int) -> int:
        return -index

    def __getitems__(self, indices: Any) -> list[int]:
        self.received.append(indices)
        return [-int(i) for i in indices]

    def __len__(self) -> int:
        return self.n


class ArraySpy(BatchSpy):
    """BatchSpy that declares it accepts an int64 index array."""

    _stoker_index_array = True


class ShortBatch(BatchSpy):
    """A dataset whose __getitems__ wrongly drops a sample."""

    def __getitems__(self, indices: Any) -> list[int]:
        return [-int(i) for i in indices][:-1]


class Count(IterableDataset[int]):
    """Iterable dataset yielding start .. stop - 1."""

    def __init__(self, start: int, stop: int) -> None:
        self.start, self.stop = start, stop

    def __iter__(self) -> Any:
        return iter(range(self.start, self.stop))

    def __len__(self) -> int:
        return self.stop - self.start


class PlusOneTensors(TensorDataset):
    """TensorDataset subclass that transforms samples in __getitem__ only."""

    def __getitem__(self, index: Any) -> tuple[Any, ...]:
        return tuple(t[index] + 1 for t in self.tensors)


def _same(a: Any, b: Any) -> bool:
    """Deep equality of samples made of tuples, dicts, arrays, tensors and numbers."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return np.array_equal(np.asarray(a), np.asarray(b))


def _arrays() -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    x = np.arange(24, dtype=np.float32).reshape(6, 2, 2)
    y = np.arange(6, dtype=np.int64) * 10
    return x, y


# --- Dataset / IterableDataset ---------------------------------------------------------------


def test_dataset_getitem_raises_not_implemented() -> None:
    """The base Dataset's __getitem__ raises NotImplementedError, as torch's does."""
    with pytest.raises(NotImplementedError, match="__getitem__"):
        Dataset()[0]


def test_dataset_add_concatenates() -> None:
    """a + b on map-style datasets is a ConcatDataset of a then b."""
    both = Squares(2) + Squares(3)
    assert isinstance(both, ConcatDataset)
    assert [both[i] for i in range(len(both))] == [0, 1, 0, 1, 4]


def test_iterable_dataset_is_abstract_like_torch() -> None:
    """IterableDataset without __iter__ cannot be instantiated (TypeError, as torch)."""
    with pytest.raises(TypeError, match="abstract"):
        IterableDataset()


def test_iterable_dataset_add_chains() -> None:
    """a + b on iterable datasets is a ChainDataset streaming a then b."""
    chained = Count(0, 2) + Count(5, 7)
    assert isinstance(chained, ChainDataset)
    assert list(chained) == [0, 1, 5, 6]


def test_is_iterable_dataset_without_and_with_torch() -> None:
    """is_iterable_dataset recognises stoker's and torch's iterable datasets only."""
    assert is_iterable_dataset(Count(0, 1))
    assert not is_iterable_dataset(Squares(3))
    assert not is_iterable_dataset([1, 2])
    torch = pytest.importorskip("torch")

    class TorchStream(torch.utils.data.IterableDataset):
        def __iter__(self) -> Any:
            return iter([1])

    assert is_iterable_dataset(TorchStream())
    assert not is_iterable_dataset(torch.utils.data.TensorDataset(torch.zeros(2)))


# --- TensorDataset ---------------------------------------------------------------------------


def test_tensor_dataset_samples_match_torch() -> None:
    """TensorDataset over arrays or tensors gives torch's samples, one by one and batched."""
    torch = pytest.importorskip("torch")
    x, y = _arrays()
    oracle = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    for ds in (TensorDataset(x, y), TensorDataset(torch.from_numpy(x), torch.from_numpy(y))):
        assert len(ds) == len(oracle) == 6
        for i in [*range(6), -1, -6]:
            assert _same(ds[i], oracle[i])
        batch = ds.__getitems__([4, 0, -2, 3])
        assert _same(list(batch), [oracle[i] for i in [4, 0, -2, 3]])


def test_tensor_dataset_keeps_tensors_attribute() -> None:
    """TensorDataset.tensors is the tuple of the given arrays, unchanged."""
    x, y = _arrays()
    ds = TensorDataset(x, y)
    assert isinstance(ds.tensors, tuple)
    assert ds.tensors[0] is x and ds.tensors[1] is y


def test_tensor_dataset_getitems_is_a_column_batch() -> None:
    """__getitems__ returns a ColumnBatch over the tensors with int64 indices, negatives wrapped."""
    x, y = _arrays()
    ds = TensorDataset(x, y)
    batch = ds.__getitems__(np.array([5, -1, 0]))
    assert isinstance(batch, ColumnBatch)
    assert batch.sources == (x, y)
    assert batch.indices.dtype == np.int64
    assert batch.indices.tolist() == [5, 5, 0]
    gx, gy = batch.gather()
    assert np.array_equal(gx, x[[5, 5, 0]]) and gy.tolist() == [50, 50, 0]


def test_tensor_columns_gather_as_torch_indexes_them() -> None:
    """Tensor columns gather to new tensors equal to torch's indexing, whatever the dtype,
    strides or grad: through NumPy where it can, by torch where it cannot (bfloat16, grad)."""
    torch = pytest.importorskip("torch")
    base = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    cols = [
        base,
        base.t().contiguous().t(),  # column-major strides
        base.to(torch.bool),
        base.to(torch.bfloat16),
        base.clone().requires_grad_(),
    ]
    idx = np.array([5, 0, 3, 3])
    for col, got in zip(cols, ColumnBatch(cols, idx).gather(), strict=True):
        want = col[torch.from_numpy(idx)]
        assert type(got) is torch.Tensor and got.dtype == col.dtype
        assert torch.equal(got, want) and got.requires_grad == col.requires_grad
        assert got.data_ptr() != col.data_ptr()


def test_tensor_dataset_getitems_out_of_range_raises_index_error() -> None:
    """A batch index outside [-len, len) raises IndexError naming it."""
    ds = TensorDataset(*_arrays())
    with pytest.raises(IndexError, match="index 6 is out of range"):
        ds.__getitems__([0, 6])
    with pytest.raises(IndexError, match="index -7"):
        ds.__getitems__([-7])


def test_tensor_dataset_subclass_getitem_is_not_bypassed() -> None:
    """A subclass overriding only __getitem__ gets its override in batched fetch too."""
    x, y = _arrays()
    ds = PlusOneTensors(x, y)
    batch = ds.__getitems__(np.array([1, 2]))
    assert _same(list(batch), [ds[1], ds[2]])
    assert int(batch[0][1]) == 11


def test_subclass_with_own_getitems_gets_a_list() -> None:
    """A subclass defining __getitems__ (torch-style) is given Python ints, not an array."""

    class ListOnly(TensorDataset):
        def __getitems__(self, indices: Any) -> list[Any]:
            assert isinstance(indices, list)
            return [self[i] for i in indices]

    ds = ListOnly(np.arange(5))
    assert ListOnly._stoker_index_array is False and TensorDataset._stoker_index_array
    got = MapFetcher(ds, auto_collation=True, collate_fn=list).fetch(np.array([3, 1]))
    assert _same(got, [(3,), (1,)])
    assert Subset(ds, [4, 0]).__getitems__(np.array([0])) == [ds[4]]


def test_tensor_dataset_length_mismatch_names_each_length() -> None:
    """Arrays whose first dimensions differ raise ValueError listing every size."""
    with pytest.raises(ValueError, match=r"\[3, 4, 3\]"):
        TensorDataset(np.zeros(3), np.zeros((4, 2)), np.zeros(3))


def test_tensor_dataset_rejects_bad_arguments() -> None:
    """No arrays -> ValueError; a list -> TypeError; a 0-d array -> IndexError (as torch)."""
    with pytest.raises(ValueError, match="at least one"):
        TensorDataset()
    with pytest.raises(TypeError, match="argument 1 is a list"):
        TensorDataset(np.zeros(2), [1, 2])
    with pytest.raises(IndexError, match="0-d"):
        TensorDataset(np.float32(1.0))


# --- ConcatDataset ---------------------------------------------------------------------------


def test_concat_dataset_matches_torch() -> None:
    """ConcatDataset gives torch's samples, lengths and cumulative_sizes, incl. negatives."""
    torch = pytest.importorskip("torch")
    parts = [TensorDataset(np.arange(n) + 100 * n) for n in (3, 0, 4, 2)]
    torch_parts = [torch.utils.data.TensorDataset(torch.arange(n) + 100 * n) for n in (3, 0, 4, 2)]
    ours, oracle = ConcatDataset(parts), torch.utils.data.ConcatDataset(torch_parts)
    assert len(ours) == len(oracle) == 9
    assert ours.cumulative_sizes == oracle.cumulative_sizes == [3, 3, 7, 9]
    assert ours.datasets == parts
    for i in range(-9, 9):
        assert _same(ours[i], oracle[i])
    order = [8, 0, 4, -1, 3, 2, -9, 6]
    assert _same(list(ours.__getitems__(order)), [oracle[i] for i in order])


def test_concat_dataset_getitems_keeps_order_across_members() -> None:
    """A batch spanning members comes back in the order asked, each member asked once."""
    a, b = ArraySpy(3), BatchSpy(4)
    ds = ConcatDataset([a, b])
    assert ds.__getitems__(np.array([4, 0, 6, 2, 3])) == [-1, 0, -3, -2, 0]
    assert len(a.received) == len(b.received) == 1
    assert isinstance(a.received[0], np.ndarray) and a.received[0].tolist() == [0, 2]
    assert b.received[0] == [1, 3, 0] and all(type(i) is int for i in b.received[0])


def test_concat_dataset_single_member_batch_passes_through() -> None:
    """A batch from one member only returns that member's __getitems__ result (a ColumnBatch)."""
    ds = ConcatDataset([TensorDataset(np.arange(3)), TensorDataset(np.arange(5) + 10)])
    batch = ds.__getitems__([3, 7, 4])
    assert isinstance(batch, ColumnBatch)
    assert [int(s[0]) for s in batch] == [10, 14, 11]


def test_concat_dataset_merges_column_batches_across_members() -> None:
    """A batch over several TensorDatasets is one ColumnBatch in batch order; else a list."""
    parts = [TensorDataset(np.arange(3) * 1.0), TensorDataset(np.arange(4) + 10.0)]
    ds = ConcatDataset(parts)
    order = [6, 0, 3, 2, 4, 0]
    batch = ds.__getitems__(order)
    assert isinstance(batch, ColumnBatch)
    assert _same(list(batch), [ds[i] for i in order])
    (column,) = batch.gather()
    assert column.tolist() == [13.0, 0.0, 10.0, 2.0, 11.0, 0.0]
    mixed = ConcatDataset([TensorDataset(np.arange(3)), TensorDataset(np.arange(4) * 1.0)])
    fallback = mixed.__getitems__([4, 1])
    assert isinstance(fallback, list) and _same(fallback, [(1.0,), (1,)])
    assert fallback[0][0].dtype == np.float64 and fallback[1][0].dtype == np.int64


def test_concat_dataset_merges_tensor_columns() -> None:
    """Tensor-backed members merge into one tensor column per field, torch-equal."""
    torch = pytest.importorskip("torch")
    parts = [TensorDataset(torch.arange(3), torch.ones(3, 2)) for _ in range(2)]
    ds = ConcatDataset(parts)
    batch = ds.__getitems__([5, 1, 3])
    assert isinstance(batch, ColumnBatch)
    ids, ones = batch.gather()
    assert torch.equal(ids, torch.tensor([2, 1, 0])) and ones.shape == (3, 2)


def test_concat_dataset_without_getitems_uses_getitem() -> None:
    """Members without __getitems__ are read with __getitem__ and Python int indices."""
    sq = Squares(4)
    ds = ConcatDataset([sq, Squares(2)])
    assert ds.__getitems__(np.array([5, 3])) == [1, 9]
    assert sq.calls == [3] and type(sq.calls[0]) is int


def test_concat_dataset_index_errors_match_torch_types() -> None:
    """Too-negative indices raise ValueError and too-large ones IndexError, as torch."""
    ds = ConcatDataset([Squares(2), Squares(3)])
    with pytest.raises(ValueError, match="index -6 is out of range for length 5"):
        ds[-6]
    with pytest.raises(IndexError, match="index 5 is out of range"):
        ds[5]
    with pytest.raises(ValueError, match="should not exceed"):
        ds.__getitems__([0, -6])
    with pytest.raises(IndexError, match="index 9"):
        ds.__getitems__([9, 1])


def test_concat_dataset_rejects_empty_and_iterable_members() -> None:
    """An empty list raises ValueError; an IterableDataset member raises TypeError."""
    with pytest.raises(ValueError, match="at least one dataset"):
        ConcatDataset([])
    with pytest.raises(TypeError, match="member 1 is one"):
        ConcatDataset([Squares(2), Count(0, 2)])


def test_concat_dataset_rejects_torch_iterable_member() -> None:
    """A torch IterableDataset member is rejected like a stoker one."""
    torch = pytest.importorskip("torch")

    class TorchStream(torch.utils.data.IterableDataset):
        def __iter__(self) -> Any:
            return iter([1])

    with pytest.raises(TypeError, match="ChainDataset"):
        ConcatDataset([TorchStream()])


def test_concat_dataset_misspelt_attribute_warns() -> None:
    """cummulative_sizes still answers, with a FutureWarning, as in torch."""
    ds = ConcatDataset([Squares(2), Squares(3)])
    with pytest.warns(FutureWarning, match="cumulative_sizes"):
        assert ds.cummulative_sizes == [2, 5]


# --- ChainDataset ----------------------------------------------------------------------------


def test_chain_dataset_iterates_and_sums_lengths() -> None:
    """ChainDataset yields each member in turn and its len is the sum of theirs."""
    ds = ChainDataset([Count(0, 3), Count(10, 12)])
    assert list(ds) == [0, 1, 2, 10, 11]
    assert len(ds) == 5
    assert list(ds) == [0, 1, 2, 10, 11]  # re-iterable


def test_chain_dataset_rejects_map_style_members() -> None:
    """A map-style member raises TypeError (and AssertionError, as torch) when reached."""
    eager = ChainDataset([Count(0, 1), Squares(2)])  # built, as torch builds it
    with pytest.raises(AssertionError, match="member 1 is a Squares"):
        list(eager)
    with pytest.raises(TypeError, match="member 1 is a Squares"):
        len(eager)
    lazy = ChainDataset(deque([Count(0, 1), Squares(2)]))
    with pytest.raises(TypeError, match="IterableDataset"):
        list(lazy)


def test_chain_dataset_accepts_torch_iterable() -> None:
    """A torch IterableDataset can be chained with a stoker one."""
    torch = pytest.importorskip("torch")

    class TorchStream(torch.utils.data.IterableDataset):
        def __iter__(self) -> Any:
            return iter(["t"])

    assert list(ChainDataset([TorchStream(), Count(0, 2)])) == ["t", 0, 1]


# --- Subset ----------------------------------------------------------------------------------


def test_subset_matches_torch() -> None:
    """Subset gives torch's samples and length, one by one and batched."""
    torch = pytest.importorskip("torch")
    x, y = _arrays()
    idx = [5, 1, 1, 3]
    ours = Subset(TensorDataset(x, y), idx)
    oracle = torch.utils.data.Subset(
        torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), idx
    )
    assert len(ours) == len(oracle) == 4
    assert ours.indices is idx
    for i in range(-4, 4):
        assert _same(ours[i], oracle[i])
    assert _same(list(ours.__getitems__([3, 0, -1])), oracle.__getitems__([3, 0, -1]))


def test_subset_getitems_maps_into_a_column_batch() -> None:
    """Subset of Subset of TensorDataset fetches one ColumnBatch at the composed indices."""
    x, y = _arrays()
    inner = Subset(TensorDataset(x, y), np.array([5, 4, 3, 2]))
    outer = Subset(inner, [3, 0])
    batch = outer.__getitems__(np.array([1, 0]))
    assert isinstance(batch, ColumnBatch)
    assert batch.indices.tolist() == [5, 2]


def test_subset_passes_array_or_list_as_the_inner_class_declares() -> None:
    """The inner __getitems__ gets an int64 array only if its class sets _stoker_index_array."""
    listy, arrayish = BatchSpy(10), ArraySpy(10)
    assert Subset(listy, [7, 8, 9]).__getitems__(np.array([2, 0])) == [-9, -7]
    assert Subset(arrayish, [7, 8, 9]).__getitems__([2, 0]) == [-9, -7]
    assert listy.received == [[9, 7]] and all(type(i) is int for i in listy.received[0])
    got = arrayish.received[0]
    assert isinstance(got, np.ndarray) and got.dtype == np.int64 and got.tolist() == [9, 7]


def test_subset_without_inner_getitems_reads_items() -> None:
    """An inner dataset without __getitems__ is read with __getitem__ and Python ints."""
    sq = Squares(10)
    assert Subset(sq, range(5, 10)).__getitems__([4, 0]) == [81, 25]
    assert sq.calls == [9, 5] and all(type(i) is int for i in sq.calls)


def test_subset_follows_reassigned_indices() -> None:
    """Replacing or growing .indices is seen by the next batched fetch (cache refreshed)."""
    sub = Subset(Squares(10), [1, 2])
    assert sub.__getitems__([0, 1]) == [1, 4]
    sub.indices = [3, 4]
    assert sub.__getitems__([0, 1]) == [9, 16]
    sub.indices.append(5)
    assert sub.__getitems__([2]) == [25]


def test_subset_out_of_range_raises_index_error() -> None:
    """A batch index past the subset's length raises IndexError, as torch's list does."""
    with pytest.raises(IndexError):
        Subset(Squares(10), [1, 2]).__getitems__([0, 2])


def test_subset_non_integer_keys() -> None:
    """Indices that are not integers (dict keys) are passed through unchanged."""
    table = {"a": 1, "b": 2}
    sub = Subset(table, ["b", "a"])
    assert sub[0] == 2 and sub.__getitems__([1, 0]) == [1, 2]


def test_subset_list_index_fetches_from_the_dataset() -> None:
    """Indexing a Subset with a list indexes the dataset with the mapped list, as torch."""
    sub = Subset(np.arange(10) * 3, [9, 2, 4])
    assert sub[[0, 2]].tolist() == [27, 12]


def test_subset_subclass_getitem_is_not_bypassed() -> None:
    """A Subset subclass overriding only __getitem__ gets it called for batches."""

    class Doubled(Subset[int]):
        def __getitem__(self, idx: Any) -> int:
            return 2 * self.dataset[self.indices[idx]]

    assert Doubled(Squares(5), [2, 3]).__getitems__([1, 0]) == [18, 8]


# --- StackDataset ----------------------------------------------------------------------------


def test_stack_dataset_matches_torch() -> None:
    """StackDataset tuple and dict samples equal torch's, one by one and batched."""
    torch = pytest.importorskip("torch")
    x, y = _arrays()
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    cases = [
        (
            StackDataset(TensorDataset(x), Squares(6)),
            torch.utils.data.StackDataset(torch.utils.data.TensorDataset(tx), Squares(6)),
        ),
        (
            StackDataset(img=TensorDataset(x, y), n=BatchSpy(6)),
            torch.utils.data.StackDataset(
                img=torch.utils.data.TensorDataset(tx, ty), n=BatchSpy(6)
            ),
        ),
    ]
    for ours, oracle in cases:
        assert len(ours) == len(oracle) == 6
        for i in range(6):
            assert _same(ours[i], oracle[i])
        assert _same(ours.__getitems__([5, 0, 2]), oracle.__getitems__([5, 0, 2]))
        assert _same(ours.__getitems__(np.array([3])), oracle.__getitems__([3]))


def test_stack_dataset_keeps_datasets_attribute() -> None:
    """datasets is the tuple of positional datasets or the dict of keyword ones."""
    a, b = Squares(2), Squares(2)
    assert StackDataset(a, b).datasets == (a, b)
    assert StackDataset(p=a, q=b).datasets == {"p": a, "q": b}


def test_stack_dataset_errors() -> None:
    """Both forms, no dataset, or unequal lengths raise ValueError (as torch)."""
    with pytest.raises(ValueError, match="both"):
        StackDataset(Squares(2), b=Squares(2))
    with pytest.raises(ValueError, match="At least one"):
        StackDataset()
    with pytest.raises(ValueError, match="a: 2, b: 3"):
        StackDataset(a=Squares(2), b=Squares(3))
    with pytest.raises(ValueError, match="argument 0: 2, argument 1: 3"):
        StackDataset(Squares(2), Squares(3))


def test_stack_dataset_checks_inner_batch_size() -> None:
    """An inner __getitems__ returning the wrong number of samples raises ValueError."""
    ds = StackDataset(Squares(4), ShortBatch(4))
    with pytest.raises(ValueError, match="output size mismatch\\. Expected 2, got 1"):
        ds.__getitems__([0, 1])


# --- random_split ----------------------------------------------------------------------------


INT_LENGTHS = [(10, [3, 7]), (10, [10]), (7, [0, 7]), (100, [33, 33, 34]), (1, [1, 0])]
FRACTIONS = [
    (10, [0.3, 0.7]),
    (10, [0.5, 0.5]),
    (7, [0.5, 0.5]),
    (11, [0.1, 0.2, 0.3, 0.4]),
    (3, [0.25, 0.25, 0.25, 0.25]),
    (30, [1 / 3, 1 / 3, 1 / 3]),
    (101, [0.8, 0.1, 0.1]),
    (5, [1.0]),
]


@pytest.mark.parametrize(("n", "lengths"), INT_LENGTHS + FRACTIONS)
def test_random_split_sizes_match_torch(n: int, lengths: list[Any]) -> None:
    """Split sizes equal torch's for integer and fractional lengths; splits partition the data."""
    torch = pytest.importorskip("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = random_split(range(n), lengths, generator=0)
        theirs = torch.utils.data.random_split(range(n), lengths)
    assert [len(s) for s in ours] == [len(s) for s in theirs]
    assert all(isinstance(s, Subset) for s in ours)
    flat = [i for s in ours for i in s.indices]
    assert sorted(flat) == list(range(n))


def test_random_split_is_seeded_by_every_generator_kind() -> None:
    """An int, NumPy or torch generator gives a repeatable split; another seed another split."""
    torch = pytest.importorskip("torch")

    def split(gen: Any) -> list[list[int]]:
        return [list(s.indices) for s in random_split(range(50), [20, 30], generator=gen)]

    assert split(3) == split(3) != split(4)
    assert split(np.random.default_rng(3)) == split(np.random.default_rng(3))
    assert split(torch.Generator().manual_seed(3)) == split(torch.Generator().manual_seed(3))
    torch.manual_seed(5)
    first = split(None)
    torch.manual_seed(5)
    assert split(None) == first


def test_random_split_warns_for_empty_split() -> None:
    """A fraction that yields an empty split warns naming its index."""
    with pytest.warns(UserWarning, match="index 2 is 0"):
        parts = random_split(range(2), [0.5, 0.5, 0.0], generator=1)
    assert [len(p) for p in parts] == [1, 1, 0]


def test_random_split_errors() -> None:
    """Bad lengths raise ValueError (or TypeError for non-ints), a bad generator TypeError."""
    with pytest.raises(ValueError, match="add up to 9"):
        random_split(range(10), [4, 5], generator=0)
    with pytest.raises(ValueError, match=r"index 0 is not between 0 and 1: it is -0\.5"):
        random_split(range(10), [-0.5, 1.5], generator=0)
    with pytest.raises(ValueError, match=r"must be >= 0"):
        random_split(range(10), [-2, 12], generator=0)
    with pytest.raises(TypeError, match=r"index 0 is 4\.0"):
        random_split(range(10), [4.0, 6.0], generator=0)
    with pytest.raises(TypeError, match="generator"):
        random_split(range(10), [4, 6], generator="seed")


# --- torch datasets inside stoker combinators --------------------------------------------------


def test_torch_map_dataset_inside_stoker_combinators() -> None:
    """A torch Dataset subclass instance works in stoker's Subset, ConcatDataset, random_split."""
    torch = pytest.importorskip("torch")

    class Cubes(torch.utils.data.Dataset):
        def __getitem__(self, i: int) -> int:
            return i**3

        def __len__(self) -> int:
            return 5

    cubes = Cubes()
    sub = Subset(cubes, [4, 2])
    assert [sub[0], sub[1]] == [64, 8] and sub.__getitems__([1, 0]) == [8, 64]
    cat = ConcatDataset([cubes, Squares(3)])
    assert len(cat) == 8 and cat.__getitems__([7, 1, 5]) == [4, 1, 0]
    parts = random_split(cubes, [0.4, 0.6], generator=2)
    assert sorted(p for s in parts for p in s.__getitems__(list(range(len(s))))) == [
        0,
        1,
        8,
        27,
        64,
    ]


def test_torch_tensor_dataset_inside_stoker_subset() -> None:
    """torch's TensorDataset (no __getitems__) is read per item by stoker's Subset."""
    torch = pytest.importorskip("torch")
    inner = torch.utils.data.TensorDataset(torch.arange(6) * 2)
    assert _same(Subset(inner, [5, 0]).__getitems__([0, 1]), [(10,), (0,)])


# --- pickling and the fetcher contract ---------------------------------------------------------


def _all_kinds() -> list[Any]:
    x, y = _arrays()
    return [
        TensorDataset(x, y),
        ConcatDataset([TensorDataset(x), Squares(3)]),
        Subset(TensorDataset(x, y), [4, 2, 0]),
        StackDataset(TensorDataset(x), Squares(6)),
        StackDataset(a=Squares(6), b=BatchSpy(6)),
        *random_split(TensorDataset(y), [0.5, 0.5], generator=0),
    ]


def test_every_dataset_survives_pickling() -> None:
    """Each dataset, after a batched fetch, pickles and gives the same samples back."""
    for ds in _all_kinds():
        before = ds.__getitems__([0, 1, 2])
        clone = pickle.loads(pickle.dumps(ds))
        assert type(clone) is type(ds) and len(clone) == len(ds)
        assert _same(list(clone.__getitems__([0, 1, 2])), list(before))
        assert _same(clone[len(ds) - 1], ds[len(ds) - 1])
    chain = pickle.loads(pickle.dumps(ChainDataset([Count(0, 2), Count(7, 8)])))
    assert list(chain) == [0, 1, 7]


def test_subset_pickle_drops_its_index_cache() -> None:
    """A Subset's cached index array is not shipped to workers (rebuilt on use)."""
    sub = Subset(Squares(100), list(range(100)))
    sub.__getitems__([0])
    small = len(pickle.dumps(sub))
    assert b"numpy" not in pickle.dumps(sub)
    assert small < len(pickle.dumps(sub.__dict__))


def test_map_fetcher_drives_every_dataset() -> None:
    """The loader's MapFetcher, given an int64 index array, gets the per-item samples."""
    for ds in _all_kinds():
        fetcher = MapFetcher(ds, auto_collation=True, collate_fn=list)
        got = fetcher.fetch(np.array([2, 0, 1], dtype=np.int64))
        assert _same(got, [ds[2], ds[0], ds[1]])
