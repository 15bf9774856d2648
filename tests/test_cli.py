"""The ``stoker`` command run for real (a subprocess): bad input gives one line, never a
traceback; ``--debug`` shows it.

Usage errors (a bad value on the command line) exit with status 2, as argparse does; a
failure while the command runs exits with 1. Read-only folders and full disks are real:
a tmpfs mounted in a private mount namespace (``unshare -m``, needs root; skipped without).
"""

from __future__ import annotations

import io
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stoker._cli import main

_CLI_TIMEOUT_S = 120.0
_STATUS_MARK = "exit status: "


def stoker(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``stoker ARGS`` (as ``python -m stoker._cli``, same PYTHONPATH); bounded."""
    return subprocess.run(
        [sys.executable, "-m", "stoker._cli", *args],
        capture_output=True,
        text=True,
        timeout=_CLI_TIMEOUT_S,
        cwd=cwd,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], command: str, status: int) -> str:
    """The command failed with ``status`` and said why in a ``stoker CMD: error:`` line and
    no traceback; returns that line."""
    assert proc.returncode == status, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith(f"stoker {command}: error: ")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def make_images(root: Path, count: int = 6, size: int = 8) -> Path:
    """A folder of JPEGs in two class folders."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, "JPEG")
        (folder / f"{i}.jpg").write_bytes(buf.getvalue())
    return root


# -- usage errors: exit status 2 ----------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [["demo", "--batch-size", "0"], ["demo", "--samples", "0"], ["demo", "--samples", "-5"]],
    ids=lambda a: " ".join(a),
)
def test_bad_demo_values_are_usage_errors(args: list[str]) -> None:
    """A bad number is refused before anything runs: usage, one error line naming the
    option and the rule, exit status 2."""
    line = assert_one_line_error(stoker(*args), args[0], 2)
    assert "must be an integer >= 1" in line and args[-2] in line


@pytest.mark.parametrize(
    "args",
    [
        ["demo", "--epochs", "x"],
        ["bench", "--batch-size", "0"],
        ["bench", "--workers", "-1"],
        ["bench", "--sleep-ms", "nan"],
        ["bench", "--compute-ms", "inf"],
        ["pack", "src", "dst", "--maxcount", "0"],
        ["pack", "src", "dst", "--maxsize", "-1"],
        ["inspect", "x", "--keys", "-1"],
    ],
    ids=lambda a: " ".join(a),
)
def test_bad_values_of_every_command_are_usage_errors(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The same rule for every subcommand's numbers (in process: the same ``main``)."""
    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert f"stoker {args[0]}: error: argument {args[-2]}: must be" in err


def test_bench_checks_its_output_paths_before_the_sweep(tmp_path: Path) -> None:
    """--json in a folder that does not exist fails at once (not after a sweep), status 2."""
    missing = tmp_path / "no" / "such" / "r.json"
    line = assert_one_line_error(stoker("bench", "--json", str(missing)), "bench", 2)
    assert str(missing) in line and "does not exist" in line


# -- failures at run time: exit status 1 --------------------------------------------------


@pytest.mark.parametrize(
    "content", [b"", b"just some text\n", os.urandom(10_000)], ids=["empty", "text", "random"]
)
def test_inspect_of_a_file_that_is_no_dataset_says_so(tmp_path: Path, content: bytes) -> None:
    """inspect on an empty, text or random file: one line naming the file, status 1."""
    path = tmp_path / "thing"
    path.write_bytes(content)
    line = assert_one_line_error(stoker("inspect", str(path)), "inspect", 1)
    assert str(path) in line and "not an LMDB file" in line


def test_inspect_of_a_truncated_lmdb_file_says_so(tmp_path: Path) -> None:
    """inspect on an LMDB file cut in half: one line naming it, status 1 (not SIGBUS)."""
    pytest.importorskip("lmdb")
    from stoker.formats import LMDBWriter

    path = tmp_path / "d.lmdb"
    with LMDBWriter(path) as w:
        for i in range(100):
            w.write((np.zeros(1000, np.int32), i))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    line = assert_one_line_error(stoker("inspect", str(path)), "inspect", 1)
    assert str(path) in line and "truncated" in line


def test_pack_of_a_missing_factory_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pack json:nonexistent (a module without that attribute) and a missing module: one
    line naming the source, status 1."""
    line = assert_one_line_error(stoker("pack", "json:nonexistent", str(tmp_path / "o")), "pack", 1)
    assert "'json:nonexistent'" in line and "no attribute" in line
    assert main(["pack", "nosuchmod:make", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "stoker pack: error: dataset source 'nosuchmod:make'" in err and "importable" in err
    assert not list(tmp_path.iterdir())


def test_pack_of_an_unreadable_file_names_it(tmp_path: Path) -> None:
    """A source file whose read fails with EIO (a link to /proc/self/mem, whose page 0 is
    unmapped): the error names the file, and no output is left."""
    src = make_images(tmp_path / "img")
    bad = src / "c0" / "zz.jpg"
    bad.symlink_to("/proc/self/mem")
    line = assert_one_line_error(stoker("pack", str(src), str(tmp_path / "o.lmdb")), "pack", 1)
    assert str(bad) in line and "Errno 5" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["img"]


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    """With --debug the same failure shows its traceback (and still exits 1)."""
    path = tmp_path / "thing"
    path.write_bytes(b"text")
    proc = stoker("inspect", str(path), "--debug")
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "ValueError" in proc.stderr
    proc = stoker("--debug", "inspect", str(path))
    assert proc.returncode == 1 and "Traceback" in proc.stderr


def test_pack_and_inspect_a_path_with_glob_characters(tmp_path: Path) -> None:
    """stoker pack SRC 'run[1]/out' then stoker inspect 'run[1]/out' reads it back."""
    src = make_images(tmp_path / "img")
    dst = tmp_path / "run[1]" / "out"
    packed = stoker("pack", str(src), str(dst), "--format", "shards", "--quiet")
    assert packed.returncode == 0, packed.stderr
    shown = stoker("inspect", str(dst))
    assert shown.returncode == 0, shown.stderr
    assert "samples: 6" in shown.stdout and "classes (2): c0, c1" in shown.stdout


# -- read-only folders and full disks (a tmpfs in a private mount namespace) --------------


@pytest.fixture(scope="module")
def private_mounts() -> None:
    """Skip unless this process may mount a tmpfs in a private mount namespace."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs unshare(1)")
    probe = subprocess.run(
        [unshare, "-m", "--propagation", "private", "mount", "-t", "tmpfs", "tmpfs", "/mnt"],
        capture_output=True,
        timeout=_CLI_TIMEOUT_S,
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a private tmpfs: {probe.stderr.decode().strip()}")


def on_tmpfs(mount: Path, options: str, *steps: str) -> tuple[list[int], str, list[str]]:
    """Run the shell ``steps`` with a tmpfs mounted at ``mount`` (mount ``options``, e.g.
    ``size=64k,ro``) in a private mount namespace; returns each step's exit status, their
    stderr, and what was left in the tmpfs (which disappears with the namespace)."""
    mount.mkdir(exist_ok=True)
    where = shlex.quote(str(mount))
    script = f"mount -t tmpfs -o {shlex.quote(options)} tmpfs {where} || exit 99\n"
    script += "".join(f"{step}\necho '{_STATUS_MARK}'$? >&2\n" for step in steps)
    script += f"ls -A {where}\n"
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=_CLI_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr
    parts = proc.stderr.split(_STATUS_MARK)
    statuses = [int(part.split("\n", 1)[0]) for part in parts[1:]]
    return statuses, proc.stderr, proc.stdout.split()


def cli(*args: str) -> str:
    """The shell line that runs ``stoker ARGS``."""
    return shlex.join([sys.executable, "-m", "stoker._cli", *args])


def stoker_on_tmpfs(
    mount: Path, options: str, *args: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run ``stoker ARGS`` on a fresh tmpfs (see :func:`on_tmpfs`); returns the run and what
    it left in the tmpfs."""
    (status,), err, left = on_tmpfs(mount, options, cli(*args))
    err = err.rpartition(_STATUS_MARK)[0]
    return subprocess.CompletedProcess(args, status, "", err), left


@pytest.mark.parametrize("fmt", ["lmdb", "shards"])
def test_pack_into_a_read_only_folder_says_so(
    tmp_path: Path, private_mounts: None, fmt: str
) -> None:
    """pack into a read-only folder: one line naming the output and the fix, status 1."""
    src = make_images(tmp_path / "img")
    dst = tmp_path / "ro" / "out"
    args = ["pack", str(src), str(dst), "--format", fmt, "--quiet"]
    run, left = stoker_on_tmpfs(tmp_path / "ro", "size=64k,ro", *args)
    line = assert_one_line_error(run, "pack", 1)
    assert str(dst) in line and "Read-only file system" in line and "writable" in line
    assert left == []


@pytest.mark.parametrize("fmt", ["lmdb", "shards"])
def test_pack_onto_a_full_disk_fails_cleanly(
    tmp_path: Path, private_mounts: None, fmt: str
) -> None:
    """pack of 1 MB onto a 256 KiB tmpfs: one line naming the output, status 1, and no
    temporary file or half output left on the disk."""
    src = tmp_path / "img" / "c0"
    src.mkdir(parents=True)
    for i in range(32):
        (src / f"{i}.jpg").write_bytes(os.urandom(32_000))  # bytes are packed, not decoded
    dst = tmp_path / "full" / "out"
    args = ["pack", str(src.parent), str(dst), "--format", fmt, "--maxcount", "4", "--quiet"]
    run, left = stoker_on_tmpfs(tmp_path / "full", "size=256k", *args)
    line = assert_one_line_error(run, "pack", 1)
    assert "cannot write" in line and "free space" in line
    assert left == []


def test_shards_without_index_in_a_read_only_folder_are_read(
    tmp_path: Path, private_mounts: None
) -> None:
    """Shards whose indexes are gone, in a folder that became read-only: inspect scans them
    and keeps the rebuilt index in memory (status 0, every sample counted)."""
    src = make_images(tmp_path / "img")
    mount = tmp_path / "m"
    out = shlex.quote(str(mount / "out"))
    pack = cli("pack", str(src), str(mount / "out"), "--format", "shards", "--maxcount", "4")
    statuses, err, _ = on_tmpfs(
        mount,
        "size=1m",
        pack + " --quiet",
        f"rm {out}/*.index.json && mount -o remount,ro {shlex.quote(str(mount))}",
        cli("inspect", str(mount / "out")) + " 1>&2",
        f"ls {out}/*.index.json",
    )
    assert statuses[:3] == [0, 0, 0], err
    assert "2 tar shard(s)" in err and "samples: 6" in err
    assert statuses[3] != 0  # no index could be written


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--sample-bytes", "99999999999999999999"], "--sample-bytes"),
        (["--samples", "99999999999999999999"], "--samples"),
        (["--sample-bytes", str(1 << 60)], "--sample-bytes"),
        (["--dataset", "math:pi"], "--dataset"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else "",
)
def test_bench_values_that_cannot_make_a_dataset_are_usage_errors(
    args: list[str], option: str, tmp_path: Path
) -> None:
    """A size past what an index or this machine's memory holds, a factory that gives no
    dataset: a usage error naming the option (exit 2) before any header or sweep (they
    were NumPy's "Maximum allowed dimension exceeded" and "object of type 'float' has no
    len()" after the header, exit 1)."""
    proc = stoker("bench", *args, "--json", str(tmp_path / "b.json"), "--no-plot", "--quiet")
    line = assert_one_line_error(proc, "bench", 2)
    assert option in line and proc.stdout == "", (line, proc.stdout)
