"""Shared-memory slots (``stoker._engine._shm``): a worker's arena, the main side's maps,
and the clean-up of segments whose owner is gone. Real segments in /dev/shm; no worker.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest

from stoker._engine._segments import SegmentMaps, sweep_dead_owners, unlink_prefix
from stoker._engine._shm import Arena
from stoker._engine._transport import encode


def _names(prefix: str) -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> Iterator[str]:
    prefix = f"stoker_{os.getpid()}_arena{abs(hash(request.node.name)) % 10**6}_"
    yield prefix
    unlink_prefix(prefix)


def _fill(arena: Arena, nbytes: int) -> tuple[int, str, int]:
    """Write one batch of ``nbytes`` into the arena's next slot; its (id, name, size)."""
    arena.begin(ahead=False)
    slot, _ = encode([np.ones(nbytes // 8)], arena)
    assert slot is not None
    return slot


def test_a_released_slot_is_reused_not_remade(prefix: str) -> None:
    """A slot given back by the main process holds the next batch: same id, same segment,
    no new one in /dev/shm."""
    arena = Arena(prefix, keep_free=2)
    try:
        first = _fill(arena, 1 << 16)
        made = _names(prefix)
        arena.release([first[0]])
        again = _fill(arena, 1 << 16)
        assert again == first
        assert _names(prefix) == made
    finally:
        arena.close()
    assert not _names(prefix)  # close unlinks every name the main side did not


def test_a_slot_still_out_is_not_reused(prefix: str) -> None:
    arena = Arena(prefix, keep_free=2)
    try:
        first = _fill(arena, 1 << 16)
        second = _fill(arena, 1 << 16)  # the first is still the main process's
        assert second[0] != first[0] and second[1] != first[1]
    finally:
        arena.close()


def test_a_slot_smaller_than_batches_now_is_retired(prefix: str) -> None:
    """Once batches grew, a small slot that comes back is unlinked, not kept, and named in
    ``take_retired`` (for the main side to drop its map)."""
    arena = Arena(prefix, keep_free=4)
    try:
        small = _fill(arena, 1 << 12)
        big = _fill(arena, 1 << 20)
        assert big[2] > small[2]
        arena.take_retired()  # the slot it began in was too small: retired as it regrew
        arena.release([small[0]])
        assert arena.take_retired() == [small[1]]
        assert small[1] not in _names(prefix)
        assert arena.take_retired() == []
    finally:
        arena.close()


def test_the_main_side_maps_a_slot_once_and_unlinks_its_name(prefix: str) -> None:
    """The main process's first view of a segment maps it and unlinks the name (nothing left
    to leak in /dev/shm); the worker's writes are what it reads; drop forgets the map."""
    arena = Arena(prefix, keep_free=2)
    maps = SegmentMaps()
    try:
        _, name, size = _fill(arena, 1 << 16)
        view = maps.view(name, size)
        assert name not in _names(prefix)
        assert maps.mapped_bytes() == size
        assert view[: 1 << 16].view(np.float64)[:3].tolist() == [1.0, 1.0, 1.0]
        again = maps.view(name, size)  # mapped already: a fresh array, the same memory
        assert again.base is not view.base and again.ctypes.data == view.ctypes.data
        maps.drop([name])
        assert maps.mapped_bytes() == 0
        del view, again
    finally:
        arena.close()
        maps.clear()


def test_slots_made_ahead_are_handed_to_the_main_process(prefix: str) -> None:
    """A slot a worker made ahead and never filled is not unlinked when the worker stops:
    it is handed over, and the main process maps and unlinks it to keep it for the next
    workers. Slots the main process saw are never handed over twice."""
    arena = Arena(prefix, keep_free=4, steady=4)
    maps = SegmentMaps()
    try:
        arena.begin()
        slot, _ = encode([np.zeros(1 << 19)], arena)  # 4 MiB: slots made ahead
        assert slot is not None
        arena.release([slot[0]])
        arena.begin(ahead=True)  # takes the free slot, and makes the next one ahead
        assert arena._spare is not None
        arena._spare.result()  # no public wait: the helper thread must be done
        arena.abort()
        handed = arena.hand_off()
        assert len(handed) == 1
        assert handed[0][0] != slot[1]  # the slot the main process saw stays out
        arena.close()
        assert os.path.exists(f"/dev/shm/{handed[0][0]}")  # left for the main process
        maps.keep(*handed[0])
        assert not _names(prefix)
        assert maps.mapped_bytes() == handed[0][1]
    finally:
        arena.close()
        maps.clear()


def test_segments_of_a_dead_owner_are_swept() -> None:
    """Segments named for a main process that no longer exists (killed with its workers)
    are unlinked by the next loader's sweep; a live owner's are left alone."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead = f"stoker_{int(done.stdout)}_sweep_0_"
    live = f"stoker_{os.getpid()}_sweep_0_"
    arenas = [Arena(dead, keep_free=1), Arena(live, keep_free=1)]
    try:
        for arena in arenas:
            _fill(arena, 1 << 12)
        assert _names(dead) and _names(live)
        assert sweep_dead_owners() >= 1
        assert not _names(dead) and _names(live)
    finally:
        for arena in arenas:
            arena.close()
        unlink_prefix(dead)
        unlink_prefix(live)
