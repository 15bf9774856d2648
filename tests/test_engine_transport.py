"""The transport's pure parts: framing, the pipe's reader and writer, messages on the wire,
tasks packed for the pipe, and batches encoded into (and decoded from) a slot.

Real pipes and real shared memory; no worker process.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from stoker._engine._errors import RemoteError
from stoker._engine._messages import (
    BatchSeed,
    Bye,
    Exhausted,
    Failed,
    GroupSeeds,
    Inited,
    Ready,
    Shipped,
    StartFailed,
    Task,
    Work,
    from_wire,
    to_wire,
)
from stoker._engine._pipe import Inbox, Outbox, dumps, frame, framed, pack_tasks, send, unpack_task
from stoker._engine._segments import SegmentMaps, unlink_prefix
from stoker._engine._shm import Arena
from stoker._engine._transport import decode, encode

_WAIT_S = 5.0
"""Bound of every wait for a pipe (a held result is written within a millisecond)."""


@pytest.fixture
def pipe() -> Iterator[tuple[Any, Any]]:
    """A real one-way pipe: (reader, writer) Connections."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    yield reader, writer
    reader.close()
    writer.close()


@pytest.fixture
def arena(request: pytest.FixtureRequest) -> Iterator[Arena]:
    prefix = f"stoker_{os.getpid()}_transport{abs(hash(request.node.name)) % 10**6}_"
    arena = Arena(prefix, keep_free=4)
    yield arena
    arena.close()
    unlink_prefix(prefix)


def _raw(reader: Any) -> bytes:
    """Everything the pipe holds now."""
    out = b""
    while reader.poll(0):
        out += os.read(reader.fileno(), 1 << 16)
    return out


@pytest.mark.parametrize("size", [0, 10, 20_000])
def test_frames_are_connections_frames(pipe: tuple[Any, Any], size: int) -> None:
    """Differential: ``framed`` writes what ``Connection.send_bytes`` writes (which splits
    a message over 16 KiB in two writes), and ``Connection.recv_bytes`` reads ours."""
    reader, writer = pipe
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    writer.send_bytes(data)
    assert _raw(reader) == b"".join(framed(data))
    os.write(writer.fileno(), b"".join(framed(data)))
    assert reader.recv_bytes() == data


def test_a_long_frame_has_connections_long_header() -> None:
    """A message of 2 GiB or more gets -1 and an 8-byte length, as ``Connection`` frames it
    (built here without 2 GiB: only the length is read), and ``frame`` parses it."""

    class Big(bytes):
        def __len__(self) -> int:
            return 1 << 31

    header = framed(Big())[0]
    assert header == struct.pack("!i", -1) + struct.pack("!Q", 1 << 31)
    long_header = struct.pack("!i", -1) + struct.pack("!Q", 3)
    assert frame(bytearray(long_header + b"abc!")) == (12, 15)
    assert frame(bytearray(long_header + b"ab")) is None
    assert frame(bytearray(long_header[:8])) is None


def test_frame_finds_only_whole_messages() -> None:
    buf = bytearray(b"".join(framed(b"hello")) + b"".join(framed(b"wo")))
    assert frame(buf) == (4, 9)
    assert frame(buf[:8]) is None and frame(buf[:3]) is None
    assert frame(bytearray()) is None


def test_inbox_hands_out_messages_that_came_together(pipe: tuple[Any, Any]) -> None:
    """Three messages written before the reader looks: one read takes them all, the others
    come from the buffer without a system call; nothing is left after them."""
    reader, writer = pipe
    inbox = Inbox(reader.fileno())
    for j in range(3):
        send(writer, Exhausted(1, j))
    assert inbox.readable() and inbox.wait(0.0)
    assert inbox.recv() == Exhausted(1, 0)
    assert not reader.poll(0)  # the one read took everything
    assert inbox.take() == Exhausted(1, 1)
    assert inbox.readable()
    assert inbox.take() == Exhausted(1, 2)
    assert inbox.take() is None and not inbox.readable() and not inbox.wait(0.0)


def test_inbox_waits_for_the_rest_of_a_message(pipe: tuple[Any, Any]) -> None:
    """A frame that comes in two writes is one message; a pipe that closes inside a frame
    is end-of-file."""
    reader, writer = pipe
    inbox = Inbox(reader.fileno())
    data = b"".join(framed(dumps(Ready())))
    os.write(writer.fileno(), data[:5])
    assert inbox.take() is None
    os.write(writer.fileno(), data[5:] + data[:5])
    assert inbox.recv() == Ready()
    writer.close()
    with pytest.raises(EOFError):
        inbox.recv()


def test_outbox_holds_fast_results_and_writes_them_together(pipe: tuple[Any, Any]) -> None:
    """A result sent with ``hold`` is written by the helper within its hold time (the reader
    waits, bounded); one sent without ``hold`` writes what is held first, in order."""
    reader, writer = pipe
    inbox = Inbox(reader.fileno())
    outbox = Outbox(writer)
    try:
        outbox.send(Exhausted(1, 0), hold=True)
        outbox.send(Exhausted(1, 1), hold=True)
        assert inbox.wait(_WAIT_S)
        assert [inbox.recv(), inbox.recv()] == [Exhausted(1, 0), Exhausted(1, 1)]
        outbox.send(Exhausted(1, 2), hold=True)
        outbox.send(Exhausted(1, 3))  # written now, after the held one
        assert inbox.readable()
        assert [inbox.recv(), inbox.recv()] == [Exhausted(1, 2), Exhausted(1, 3)]
        outbox.send(Exhausted(1, 4), hold=True)
    finally:
        outbox.close()  # writes what is held
    assert inbox.recv() == Exhausted(1, 4)


def _every_message() -> list[Any]:
    err = RemoteError(ValueError("bad sample"), "worker 0 (pid 1) on sample indices [3]")
    slot = (5, "stoker_1_ab_0_5", 65536)
    refs = (0, [("n", 0, 8192, "<f4", (256, 8))])
    return [
        Shipped(3, 7, slot, refs, ["stoker_1_ab_0_2"], 0.001, None, True),
        Shipped(3, 8, slot, b"pickled", [], 0.002, [None, ([1], [], False)], None, True),
        Work(pack_tasks([Task(1, 0, np.arange(4), BatchSeed(9))]), [2, 3]),
        Exhausted(3, 9),
        Failed(3, 10, err),
        Ready(),
        Inited(),
        StartFailed(err),
        Bye([("stoker_1_ab_0_6", 4096)], ("SystemExit(3) in worker 0", 3)),
    ]


@pytest.mark.parametrize("msg", _every_message(), ids=lambda m: type(m).__name__)
def test_messages_cross_the_wire_as_themselves(msg: Any) -> None:
    """Every message a worker or the pool writes comes out of the pipe's bytes as the same
    type with the same fields, and its wire form (a plain tuple) is smaller than the
    NamedTuple's own pickle, which names its class in every message."""
    data = dumps(msg)
    back = from_wire(pickle.loads(data))
    assert type(back) is type(msg)
    assert back._fields == msg._fields
    for mine, theirs in zip(back, msg, strict=True):
        if isinstance(mine, RemoteError):
            assert (mine.where, mine.text) == (theirs.where, theirs.text)
        else:
            assert mine == theirs
    assert len(data) < len(pickle.dumps(msg, pickle.HIGHEST_PROTOCOL))
    assert from_wire(pickle.loads(dumps(None))) is None and to_wire(None) is None


@pytest.mark.parametrize(
    "task",
    [
        np.arange(5, dtype=np.int64),
        np.array([7, 1, 3], dtype=np.int32),
        np.array([65535], dtype=np.uint16),
        [4, 2, 9],
        np.array([0.5, 1.5]),  # not indices: crosses as it is
    ],
    ids=["int64", "int32", "uint16", "list", "float"],
)
def test_packed_tasks_unpack_to_the_same_indices(task: Any) -> None:
    (packed,) = pack_tasks([Task(2, 5, task, BatchSeed(11))])
    out = unpack_task(pickle.loads(pickle.dumps(packed)))
    assert (out.generation, out.idx, out.seed, out.packing) == (2, 5, BatchSeed(11), None)
    assert type(out.task) is type(task)
    if isinstance(task, np.ndarray):
        assert out.task.dtype == task.dtype and out.task.flags.writeable
    assert np.array_equal(out.task, task)


@pytest.mark.parametrize(
    "tasks",
    [
        [np.arange(3), np.arange(3, 4), np.arange(4, 9)],  # one dtype: joined in one bytes
        [np.arange(2, dtype=np.int32), np.arange(2)],  # mixed: as they are
        [np.arange(6)],
    ],
    ids=["joined", "mixed", "one"],
)
def test_a_packed_group_unpacks_to_its_tasks(tasks: list[Any]) -> None:
    (packed,) = pack_tasks([Task(1, 0, tasks, GroupSeeds(9, 1, list(range(len(tasks)))))])
    out = unpack_task(packed)
    assert out.seed == GroupSeeds(9, 1, list(range(len(tasks))))
    assert len(out.task) == len(tasks)
    for got, want in zip(out.task, tasks, strict=True):
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_encode_decode_round_trip_and_slot_return(arena: Arena) -> None:
    """The transport rebuilds arrays as views of the slot, and frees it with the last view."""
    maps = SegmentMaps()
    freed: list[int] = []
    try:
        arena.begin()
        batch = {"a": np.arange(10.0), "b": [np.ones((2, 2), np.int8), "text", 3]}
        slot, payload = encode(batch, arena)
        out = decode(slot, payload, maps, freed.append)
        assert np.array_equal(out["a"], batch["a"]) and out["b"][1:] == ["text", 3]
        assert out["b"][0].dtype == np.int8 and not out["a"].flags.owndata
        assert slot is not None and freed == []
        keep = out["a"][2:]
        del out
        assert freed == []
        del keep
        assert freed == [slot[0]]
    finally:
        maps.clear()


def _spy_regrow(arena: Arena) -> list[int]:
    """The sizes ``arena.regrow`` is called with (the real method still runs)."""
    calls: list[int] = []
    real = arena.regrow

    def regrow(needed: int) -> None:
        calls.append(needed)
        real(needed)

    arena.regrow = regrow  # type: ignore[method-assign]
    return calls


def _first(batch: Any) -> Any:
    return batch[0] if isinstance(batch, tuple) else batch["x"]


@pytest.mark.parametrize(
    "make",
    [
        lambda n: (np.arange(n, dtype=np.float32), np.arange(n // 4)),  # the fast path
        lambda n: {"x": np.arange(n, dtype=np.float32), "meta": [n, "m"]},  # the pickler
    ],
    ids=["fast", "pickled"],
)
def test_a_slot_too_small_regrows_once_and_then_fits(arena: Arena, make: Any) -> None:
    """The first batch (no slot yet) and a bigger one regrow the slot once each, copying
    every leaf in; a batch of a size seen before fits the slot made for it."""
    calls = _spy_regrow(arena)
    maps = SegmentMaps()
    try:
        for n, regrows in [(1 << 14, 1), (1 << 14, 1), (1 << 16, 2)]:
            batch = make(n)
            arena.begin()
            slot, payload = encode(batch, arena)
            assert len(calls) == regrows
            assert slot is not None and slot[2] >= 4 * n
            out = decode(slot, payload, maps, lambda sid: arena.release([sid]))
            assert np.array_equal(_first(out), _first(batch))
            del out
    finally:
        maps.clear()


def test_a_group_crosses_as_one_slot(arena: Arena) -> None:
    """A group of tiny batches is one slot and one payload; each batch comes back in order,
    a RemoteError in place of one that failed."""
    maps = SegmentMaps()
    err = RemoteError(KeyError(3), "worker 0 (pid 1) on sample indices [3]")
    batches = [(np.full(4, j), np.arange(j, j + 2)) for j in range(3)]
    try:
        arena.begin()
        slot, payload = encode([*batches, err], arena, group=True)
        out = decode(slot, payload, maps, lambda sid: None)
        assert len(out) == 4 and isinstance(out[3], RemoteError)
        for got, want in zip(out[:3], batches, strict=True):
            assert type(got) is tuple
            assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
        del out
    finally:
        maps.clear()


def test_a_batch_without_arrays_takes_no_slot(arena: Arena) -> None:
    arena.begin()
    slot, payload = encode({"text": ["a", "b"], "n": 2}, arena)
    assert slot is None
    assert decode(slot, payload, SegmentMaps(), lambda sid: None) == {"text": ["a", "b"], "n": 2}
