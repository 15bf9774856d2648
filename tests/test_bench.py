"""``stoker bench``: the sweep, its table, JSON, plot and recommendation (stoker._bench)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from stoker import _bench

TINY = ["--batches", "5", "--samples", "200", "--sample-bytes", "1024", "--batch-size", "10"]


@pytest.fixture(scope="module", autouse=True)
def _fonts_loaded(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Draw one plot before the leak check's snapshot: matplotlib keeps its font files open
    for the life of the process (a cache), which is not a leak of the command."""
    if importlib.util.find_spec("matplotlib") is not None:
        rows = [{"num_workers": 0, "worker_mode": None, "batch_size": 1, "samples_per_s": 1.0}]
        _bench.write_plot(str(tmp_path_factory.mktemp("fonts") / "p.png"), rows, rows[0], "t")


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="stoker")
    _bench.add_subcommand(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["bench", *argv])


def _bench_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, dict[str, Any]]:
    """Run ``stoker bench`` in-process; returns the status, stdout and the JSON record."""
    out = tmp_path / "bench.json"
    args = _parse([*argv, "--json", str(out), "--plot", str(tmp_path / "bench.png")])
    status = _bench.run(args)
    text = capsys.readouterr().out
    return status, text, json.loads(out.read_text()) if out.exists() else {}


def _fastest(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return max(rows, key=lambda r: r["samples_per_s"])


def test_sweep_writes_json_with_every_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The JSON holds one row per configuration, the medians, versions and the command."""
    argv = ["--workers", "0,2", "--worker-mode", "process,thread", "--sleep-ms", "0.5"]
    status, _, record = _bench_run(tmp_path, capsys, *argv, *TINY, "--repeats", "2", "--quiet")
    assert status == 0
    configs = [(r["num_workers"], r["worker_mode"]) for r in record["rows"]]
    assert configs == [(0, None), (2, "process"), (2, "thread")]
    for row in record["rows"]:
        assert row["batch_size"] == 10 and len(row["runs"]) == 2
        assert row["median_seconds"] > 0 and row["samples_per_s"] > 0
        assert row["bytes_per_s"] == pytest.approx(row["samples_per_s"] * 1024, rel=1e-6)
    assert record["rows"][0]["speedup"] == 1.0
    assert record["cores"] >= 1 and "numpy" in record["versions"]
    assert record["command"].startswith("stoker bench --workers 0,2 --worker-mode process,thread")
    assert record["dataset"] == {
        "kind": "synthetic",
        "samples": 200,
        "sample_bytes": 1024,
        "sleep_ms": 0.5,
    }


def test_recommendation_names_the_fastest_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The recommendation line (terminal and JSON) names the row with the highest rate."""
    argv = ["--workers", "0,1", "--worker-mode", "thread", "--sleep-ms", "0.5", *TINY]
    _, text, record = _bench_run(tmp_path, capsys, *argv, "--repeats", "1", "--quiet")
    best = _fastest(record["rows"])
    assert record["best"] == best
    line = record["recommendation"]
    assert line in text.splitlines()
    assert line.startswith(f"use num_workers={best['num_workers']}")
    if best["num_workers"]:
        gain = (best["speedup"] - 1) * 100
        assert (
            line == f"use num_workers=1 (worker_mode=thread): {gain:.0f}% faster than num_workers=0"
        )


def test_table_lists_each_row_and_marks_the_best(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The terminal table has a header, one line per configuration, and a star on the best."""
    argv = ["--workers", "0,1", "--worker-mode", "thread,process", "--sleep-ms", "0", *TINY]
    _, text, record = _bench_run(tmp_path, capsys, *argv, "--repeats", "1", "--quiet")
    lines = text.splitlines()
    head = next(
        i for i, line in enumerate(lines) if line.split()[:2] == ["num_workers", "worker_mode"]
    )
    table = lines[head + 1 : head + 1 + len(record["rows"])]
    assert [line.split()[:2] for line in table] == [["0", "-"], ["1", "thread"], ["1", "process"]]
    starred = [i for i, line in enumerate(table) if line.endswith("*")]
    assert starred == [record["rows"].index(record["best"])]


def test_pin_comparison_skipped_plainly_without_accelerator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without an accelerator one plain sentence says the pin_memory comparison is skipped."""
    device, reason = _bench.accelerator()
    if device is not None:
        pytest.skip(f"this machine has an accelerator ({device})")
    _, text, record = _bench_run(
        tmp_path, capsys, "--workers", "0", *TINY, "--repeats", "1", "--quiet"
    )
    assert reason in text.splitlines()
    assert "skipped" in reason and "pin_memory x non_blocking" in reason
    assert record["pin_memory_x_non_blocking"] == {"skipped": reason}


def test_pin_sweep_times_every_combination() -> None:
    """pin_sweep (run here against the CPU) gives the four pin_memory x non_blocking rows
    for stoker's loader and torch's, side by side, with GB/s and the loop's wait."""
    pytest.importorskip("torch")
    ds = _bench.SyntheticDataset(40, 64, 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pin_memory=True without an accelerator warns
        rows = _bench.pin_sweep(
            ds, _bench.Config(0, None, 10), "cpu", repeats=1, batches=2, warmup=1
        )
    combos = [(True, True), (True, False), (False, True), (False, False)]
    assert [(r["loader"], r["pin_memory"], r["non_blocking"]) for r in rows] == [
        (w, pm, nb) for pm, nb in combos for w in ("stoker", "torch")
    ]
    assert all(r["bytes_per_s"] == pytest.approx(r["samples_per_s"] * 64) for r in rows)
    assert all(0 <= r["wait_s"] <= r["median_seconds"] + 1e-3 for r in rows)
    lines = _bench.format_pin_table(rows).splitlines()
    assert len(lines) == 4 and lines[1].startswith("pin_memory= True, non_blocking=False: ")
    assert " GB/s to the device, wait " in lines[1] and "| torch median time" in lines[1]


def test_plot_written_when_matplotlib_is_installed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With matplotlib importable, --plot writes a PNG and says so."""
    pytest.importorskip("matplotlib")
    _, text, _ = _bench_run(
        tmp_path,
        capsys,
        "--workers",
        "0,1",
        "--worker-mode",
        "thread",
        *TINY,
        "--repeats",
        "1",
        "--quiet",
    )
    png = tmp_path / "bench.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {png}" in text


def test_plot_missing_matplotlib_says_how_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without matplotlib no PNG is written and the output names the plot extra."""
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    status, text, record = _bench_run(
        tmp_path, capsys, "--workers", "0", *TINY, "--repeats", "1", "--quiet"
    )
    assert status == 0 and record["rows"]
    assert not (tmp_path / "bench.png").exists()
    assert "pip install 'stoker[plot]'" in text


def test_no_plot_writes_no_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--no-plot skips the PNG even when matplotlib is there."""
    _bench_run(tmp_path, capsys, "--workers", "0", *TINY, "--repeats", "1", "--quiet", "--no-plot")
    assert not (tmp_path / "bench.png").exists()


def test_progress_goes_to_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --quiet, progress is reported on stderr, one update per run."""
    args = _parse(
        ["--workers", "0", *TINY, "--repeats", "2", "--no-plot", "--json", str(tmp_path / "b.json")]
    )
    _bench.run(args)
    err = capsys.readouterr().err
    if importlib.util.find_spec("tqdm") is None:
        assert err.splitlines() == [f"stoker bench: {i}/2 runs (0, batch 10)" for i in (1, 2)]
    else:
        assert "2/2" in err


FACTORY = """
import numpy as np
import stoker

def make():
    x = np.arange(300 * 4, dtype=np.float32).reshape(300, 4)
    return stoker.TensorDataset(x, np.arange(300))
"""


def test_dataset_factory_in_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--dataset module:factory benchmarks the dataset the factory returns."""
    (tmp_path / "bench_factory_a.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        argv = ["--dataset", "bench_factory_a:make", "--workers", "0,1", "--worker-mode", "thread"]
        status, text, record = _bench_run(
            tmp_path,
            capsys,
            *argv,
            "--batches",
            "3",
            "--batch-size",
            "50",
            "--repeats",
            "1",
            "--quiet",
        )
    finally:
        sys.modules.pop("bench_factory_a", None)
    assert status == 0
    assert record["dataset"] == {
        "kind": "factory",
        "factory": "bench_factory_a:make",
        "type": "TensorDataset",
    }
    assert "--dataset bench_factory_a:make" in record["command"]
    # A sample is 4 float32 + one int64: 24 bytes.
    assert all(r["bytes_per_s"] == pytest.approx(r["samples_per_s"] * 24) for r in record["rows"])
    assert "bench_factory_a:make (TensorDataset, 300 samples)" in text


def test_dataset_factory_in_a_subprocess(tmp_path: Path) -> None:
    """`python -m stoker._bench --dataset mod:factory` with process workers, via PYTHONPATH."""
    (tmp_path / "bench_factory_b.py").write_text(FACTORY)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [
        sys.executable,
        "-m",
        "stoker._bench",
        "--dataset",
        "bench_factory_b:make",
        "--workers",
        "0,2",
        "--worker-mode",
        "process",
        "--batches",
        "5",
        "--batch-size",
        "20",
        "--repeats",
        "1",
        "--no-plot",
    ]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "stoker-bench.json").read_text())
    assert [(r["num_workers"], r["worker_mode"]) for r in record["rows"]] == [
        (0, None),
        (2, "process"),
    ]
    assert record["recommendation"] in done.stdout
    assert f"num_workers={_fastest(record['rows'])['num_workers']}" in record["recommendation"]


def test_synthetic_options_clash_with_dataset(capsys: pytest.CaptureFixture[str]) -> None:
    """--samples with --dataset is an error saying to drop one of them (exit status 2)."""
    status = _bench.run(_parse(["--dataset", "x:y", "--samples", "5"]))
    err = capsys.readouterr().err
    assert status == 2 and "--samples" in err and "drop one or the other" in err


def test_bad_dataset_spec_is_explained(capsys: pytest.CaptureFixture[str]) -> None:
    """A --dataset without 'module:factory' form fails with an example of the right form."""
    assert _bench.run(_parse(["--dataset", "nocolon"])) == 2
    assert "--dataset must be 'module:factory'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "option",
    [
        ["--workers", "-1"],
        ["--workers", "a,b"],
        ["--worker-mode", "fork"],
        ["--batch-size", "0"],
        ["--repeats", "0"],
    ],
)
def test_bad_options_are_usage_errors(
    option: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Invalid lists and numbers are rejected by argparse with the expected form."""
    with pytest.raises(SystemExit) as exc:
        _parse(option)
    assert exc.value.code == 2
    assert "must be" in capsys.readouterr().err


def test_default_workers_run_up_to_the_cpu_count() -> None:
    """Without --workers the sweep covers 0 up to the usable CPU count, sorted."""
    from stoker._osprobe import available_cpus

    args = _parse([])
    _bench._resolve(args, available_cpus())
    assert args.workers == list(range(available_cpus() + 1))
    assert (args.samples, args.sample_bytes, args.sleep_ms) == (1000, 1 << 20, 5.0)
    args = _parse(["--workers", "4,0,2", "--batch-size", "64,8"])
    _bench._resolve(args, 2)
    assert args.workers == [0, 2, 4] and args.batch_size == [8, 64]


def test_recommend_across_batch_sizes_compares_at_the_same_size() -> None:
    """With several batch sizes the line names the size, and the gain is vs 0 at that size."""
    rows: list[dict[str, Any]] = [
        {"num_workers": 0, "worker_mode": None, "batch_size": 8, "samples_per_s": 100.0},
        {"num_workers": 0, "worker_mode": None, "batch_size": 64, "samples_per_s": 200.0},
        {"num_workers": 4, "worker_mode": "process", "batch_size": 64, "samples_per_s": 300.0},
    ]
    best, line = _bench.recommend(rows)
    assert best is rows[2]
    assert (
        line
        == "use num_workers=4 (worker_mode=process, batch_size=64): 50% faster than num_workers=0"
    )
    best, line = _bench.recommend(rows[:2])
    assert line == "use num_workers=0 (batch_size=64): no worker setting beat loading in-process"


def test_measure_restarts_epochs_when_the_dataset_runs_out() -> None:
    """A dataset shorter than warm-up + timed batches is read again; every batch is counted."""
    ds = _bench.SyntheticDataset(25, 8, 0.0)
    run = _bench.measure(ds, {"batch_size": 10}, batches=4, warmup=1)
    # batches: [10, 10, 5] per epoch; warm-up takes one, then 10, 5, 10, 10 are timed.
    assert run["samples"] == 35 and run["bytes"] == 35 * 8 and run["epochs"] == 2


def test_import_stays_light() -> None:
    """Importing the command (for --help) loads neither torch nor matplotlib."""
    code = "import sys, stoker._bench; print('torch' in sys.modules, 'matplotlib' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "False"], done.stderr
