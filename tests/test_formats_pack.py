"""`stoker pack` / `stoker inspect`: sources, atomic output under SIGKILL, the CLI."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from stoker.formats import LMDBDataset, ShardDataset, inspect, pack
from stoker.formats._cli import main as cli_main

_KILL_WAIT_S = 30.0

SLOW_MODULE = """
import time
import numpy as np

class Slow:
    def __len__(self):
        return {n}
    def __getitem__(self, i):
        time.sleep({delay})
        return np.full(4, i, dtype=np.int32), i

def make():
    return Slow()
"""


def write_module(root: Path, n: int, delay: float, name: str = "slowmod") -> None:
    """Write ``NAME.py`` (a dataset factory) into ``root``; one name per test, as a module
    stays imported for the rest of the session."""
    (root / f"{name}.py").write_text(textwrap.dedent(SLOW_MODULE.format(n=n, delay=delay)))


def test_pack_factory_dataset_to_both_formats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 'module:factory' dataset packs and reads back equal, in LMDB and in shards."""
    write_module(tmp_path, n=7, delay=0)
    monkeypatch.syspath_prepend(str(tmp_path))
    s1 = pack("slowmod:make", tmp_path / "o.lmdb", "lmdb", progress=False)
    s2 = pack("slowmod:make", tmp_path / "o", "shards", maxcount=3, progress=False)
    assert (s1.samples, s2.samples, len(s2.files)) == (7, 7, 6)
    for ds in (LMDBDataset(tmp_path / "o.lmdb"), ShardDataset(tmp_path / "o")):
        x, y = ds[5]
        np.testing.assert_array_equal(x, np.full(4, 5, dtype=np.int32))
        assert y == 5
    with pytest.raises(FileExistsError, match="overwrite"):
        pack("slowmod:make", tmp_path / "o.lmdb", progress=False)
    with pytest.raises(ValueError, match="module:factory"):
        pack("no-colon-here", tmp_path / "x.lmdb", progress=False)


def test_overwrite_replaces_only_when_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """overwrite=True swaps in the new shard folder; the old stays until then."""
    write_module(tmp_path, n=4, delay=0, name="overmod")
    monkeypatch.syspath_prepend(str(tmp_path))
    pack("overmod:make", tmp_path / "o", "shards", maxcount=1, progress=False)
    pack("overmod:make", tmp_path / "o", "shards", maxcount=2, overwrite=True, progress=False)
    assert len(ShardDataset(tmp_path / "o").urls) == 2
    assert not [n for n in os.listdir(tmp_path) if "stoker-tmp" in n]


def _read_until(proc: subprocess.Popen[bytes], needle: bytes) -> bytes:
    """Read the child's stderr until the regular expression ``needle`` matches (bounded by
    _KILL_WAIT_S)."""
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    seen = b""
    deadline = time.monotonic() + _KILL_WAIT_S
    while re.search(needle, seen) is None:
        left = deadline - time.monotonic()
        assert left > 0, f"pack never reported progress: {seen!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096)
            assert chunk, f"pack ended early: {seen!r}"
            seen += chunk
    return seen


@pytest.mark.parametrize("fmt", ["lmdb", "shards"])
def test_sigkill_halfway_leaves_nothing_and_rerun_succeeds(tmp_path: Path, fmt: str) -> None:
    """A pack killed with SIGKILL mid-way leaves no DST; a rerun writes it completely."""
    write_module(tmp_path, n=60, delay=0.01)
    dst = tmp_path / "out"
    code = f"from stoker.formats import pack; pack('slowmod:make', {str(dst)!r}, {fmt!r})"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env
    )
    try:
        _read_until(proc, rb"[1-9][0-9]*/60")  # at least one sample written (tqdm or not)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=_KILL_WAIT_S) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=_KILL_WAIT_S)
        assert proc.stderr is not None
        proc.stderr.close()
    assert not dst.exists()
    assert any("stoker-tmp" in n for n in os.listdir(tmp_path))  # it was killed mid-write
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, timeout=_KILL_WAIT_S
    )
    assert result.returncode == 0, result.stderr.decode()
    ds = LMDBDataset(dst) if fmt == "lmdb" else ShardDataset(dst)
    assert len(ds) == 60 and ds[59][1] == 59
    assert not [n for n in os.listdir(tmp_path) if "stoker-tmp" in n]  # stale temps swept


def test_cli_pack_and_inspect(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stoker pack` prints a summary and `stoker inspect` the count, fields and keys."""
    write_module(tmp_path, n=5, delay=0, name="climod")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli_main(["pack", "climod:make", str(tmp_path / "c.lmdb"), "--quiet"]) == 0
    assert "packed 5 samples" in capsys.readouterr().out
    assert cli_main(["inspect", str(tmp_path / "c.lmdb")]) == 0
    out = capsys.readouterr().out
    assert "samples: 5" in out and "0.npy" in out and "1.cls" in out and "000000000" in out
    args = ["pack", "climod:make", str(tmp_path / "s"), "--format", "shards", "--maxcount", "2"]
    assert cli_main([*args, "--quiet"]) == 0
    capsys.readouterr()
    assert cli_main(["inspect", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "3 tar shard(s)" in out and "samples: 5" in out
    assert cli_main(["inspect", str(tmp_path / "missing")]) == 1
    assert "error" in capsys.readouterr().err


def test_inspect_text_of_image_folder_pack(tmp_path: Path) -> None:
    """inspect names the classes and the image field of a packed folder."""
    from PIL import Image

    for c in ("cat", "dog"):
        (tmp_path / "img" / c).mkdir(parents=True)
        Image.new("RGB", (8, 8), (1, 2, 3)).save(tmp_path / "img" / c / "a.png")
    pack(tmp_path / "img", tmp_path / "p.lmdb", progress=False)
    text = inspect(tmp_path / "p.lmdb")
    assert "classes (2): cat, dog" in text and "png" in text and "samples: 2" in text
