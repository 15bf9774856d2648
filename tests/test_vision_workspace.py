"""Per-thread reusable memory: file reads into reused buffers, workspaces lent to threads."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stoker.vision import _workspace


@pytest.mark.parametrize("sizes", [[0, 1, 5000, 3], [70_000, 10, 70_001]])
def test_read_gives_each_file_whole_through_one_reused_slot(
    tmp_path: Path, sizes: list[int]
) -> None:
    for i, size in enumerate(sizes):
        path = tmp_path / f"f{i}"
        data = bytes((i * 7 + j) % 251 for j in range(size))
        path.write_bytes(data)
        assert bytes(_workspace.read(str(path), 0)) == data


def test_a_slot_holds_its_file_while_other_slots_are_read(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"a" * 300)
    (tmp_path / "b").write_bytes(b"b" * 900)
    a = _workspace.read(str(tmp_path / "a"), 0)
    b = _workspace.read(str(tmp_path / "b"), 1)
    assert bytes(a) == b"a" * 300 and bytes(b) == b"b" * 900


def test_a_thread_keeps_file_buffers_up_to_its_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_workspace, "KEEP_FILE_BYTES", 10_000)
    _workspace.workspace().pop("files", None)
    for i in range(4):
        (tmp_path / f"f{i}").write_bytes(bytes([i]) * 3000)
    views = [_workspace.read(str(tmp_path / f"f{i}"), i) for i in range(4)]
    assert [bytes(v) for v in views] == [bytes([i]) * 3000 for i in range(4)]
    kept = _workspace.workspace()["files"]
    assert sum(map(len, kept)) <= 10_000 and len([b for b in kept if b]) == 2


def test_a_missing_file_raises_as_open_does(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope"):
        _workspace.read(str(tmp_path / "nope"), 0)


def _run_batch() -> list[int]:
    """ids of the workspaces two pool threads used."""
    barrier = threading.Barrier(2, timeout=10)

    def use(_: int) -> int:
        barrier.wait()  # both threads run: each takes its own workspace
        ws = _workspace.workspace()
        ws.setdefault("buffer", bytearray(10))
        return id(ws["buffer"])

    with (
        _workspace.lend(2) as spaces,
        ThreadPoolExecutor(2, "test", spaces.initializer) as pool,
    ):
        return list(pool.map(use, range(2)))


def test_the_next_batchs_threads_get_the_workspaces_of_the_last() -> None:
    first = _run_batch()
    assert len(set(first)) == 2  # one workspace each
    assert sorted(_run_batch()) == sorted(first)  # new threads, the same buffers
