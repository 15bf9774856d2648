"""Hostile input to the formats: damaged LMDB files, shards and indexes, failing writers.

Every file here is a real file damaged by the test (cut, overwritten, bit-flipped). Cases
that could kill the interpreter (LMDB maps files, and a bad map is SIGBUS, not an
exception) run in a subprocess, so a regression shows as a failed test, not a dead pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from stoker.formats import (
    CorruptRecordError,
    ShardDataset,
    ShardIterable,
    ShardWriter,
    TruncatedShardError,
)

_SUBPROCESS_TIMEOUT_S = 60.0


def run_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (same PYTHONPATH); bounded."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=_SUBPROCESS_TIMEOUT_S,
    )


def write_lmdb(path: Path, n: int = 200) -> None:
    """An LMDB file of ``n`` samples of 4 KB each: about 100 pages of data."""
    from stoker.formats import LMDBWriter

    with LMDBWriter(path) as w:
        for i in range(n):
            w.write((np.full(1000, i, dtype=np.int32), i))


def write_numbers(pattern: str, n: int, maxcount: int = 100) -> list[str]:
    """Shards of samples ``{"cls": i, "bin": 64 bytes of i}``."""
    with ShardWriter(pattern, maxcount=maxcount) as w:
        for i in range(n):
            w.write({"cls": i, "bin": bytes([i % 256]) * 64})
    return w.shards


# -- LMDB ---------------------------------------------------------------------------------

READ_ALL = """
import json, sys
from stoker.formats import LMDBDataset
from stoker._cli import main
out = {}
for path in sys.argv[1:]:
    try:
        ds = LMDBDataset(path)
        out[path] = ["read", sum(ds[i][1] for i in range(len(ds)))]
    except Exception as exc:
        out[path] = [type(exc).__name__, str(exc), isinstance(exc, ValueError)]
    out[path].append(main(["inspect", path]))
print(json.dumps(out))
"""


def test_truncated_lmdb_raises_naming_the_file_not_sigbus(tmp_path: Path) -> None:
    """An LMDB file cut to 50%, 90% or 99% raises an error naming it (reader and inspect),
    where LMDB alone kills the process with SIGBUS."""
    pytest.importorskip("lmdb")
    good = tmp_path / "good.lmdb"
    write_lmdb(good)
    data = good.read_bytes()
    paths = []
    for pct in (50, 90, 99):
        cut = tmp_path / f"cut{pct}.lmdb"
        cut.write_bytes(data[: len(data) * pct // 100])
        paths.append(str(cut))
    proc = run_python(READ_ALL, str(good), *paths)
    assert proc.returncode == 0, (
        f"exit {proc.returncode} (negative: killed by a signal)\n{proc.stderr}"
    )
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out[str(good)] == ["read", sum(range(200)), 0]
    for path in paths:
        kind, message, is_value_error, inspect_status = out[path]
        assert kind == "CorruptRecordError" and is_value_error
        assert path in message and "truncated" in message and "copy it again" in message
        assert inspect_status == 1
    assert proc.stderr.count("stoker inspect: error: truncated LMDB file") == 3


@pytest.mark.parametrize(
    "content", [b"", b"hello, world\n" * 100, os.urandom(20000)], ids=["empty", "text", "random"]
)
def test_non_lmdb_file_raises_value_error_naming_it(tmp_path: Path, content: bytes) -> None:
    """An empty, text or random file given as an LMDB file raises ValueError naming it,
    as the docstring says (LMDB itself raises lmdb.Error)."""
    pytest.importorskip("lmdb")
    from stoker.formats import LMDBDataset

    path = tmp_path / "not.lmdb"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="not an LMDB file") as err:
        LMDBDataset(path)
    assert str(path) in str(err.value)


def test_lmdb_writer_failing_at_close_leaves_no_temporary_or_lock_file(tmp_path: Path) -> None:
    """When the final rename fails (a folder took the file's name), close raises and the
    temporary file and its lock file are gone; what stands under the name is untouched."""
    pytest.importorskip("lmdb")
    from stoker.formats import LMDBWriter

    path = tmp_path / "out.lmdb"
    writer = LMDBWriter(path)
    with pytest.raises(OSError):
        with writer:
            writer.write((b"abc", 1))
            path.mkdir()
            (path / "keep").write_bytes(b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.lmdb"]
    assert [p.name for p in path.iterdir()] == ["keep"]
