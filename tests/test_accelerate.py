"""Accelerate keeps stoker: ``accelerator.prepare(stoker.torch.DataLoader(...))``.

The acceptance test launches 2 CPU processes with ``accelerate launch`` (gloo, 127.0.0.1):
each epoch the processes' samples are disjoint and cover the dataset once, the batches come
from stoker's worker processes (their pids ride in the samples), and a ``save_state()`` in
mid-epoch followed by ``load_state()`` in a new launch yields exactly the remaining
batches. The same script prepares torch's loader too, as the control: stoker's shards
have the sizes Accelerate's have. In-process tests cover one process, padding
(``even_batches``), the gradient state and the warning where stoker cannot stay.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from _early import Job, finished, python_env, starts_early

torch = pytest.importorskip("torch")
accelerate = pytest.importorskip("accelerate")

import stoker.torch as st  # noqa: E402

_SRC = str(Path(__file__).resolve().parents[1] / "src")

_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import torch
    from accelerate import Accelerator
    import stoker.torch as st

    mode, out, ckpt, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

    class Rows:
        def __len__(self):
            return n

        def __getitem__(self, i):
            return np.array([i, os.getpid()])

    acc = Accelerator(cpu=True)
    rank = acc.process_index

    def batches(loader):
        return [b.tolist() for b in loader]

    def make(module, rows=None):
        return module.DataLoader(rows or Rows(), batch_size=3, shuffle=True, num_workers=2)

    class Odd(Rows):  # padded by even_batches: 23 = 2 processes x 4 batches x 3 - 1
        def __len__(self):
            return 23

    report = {"rank": rank, "main_pid": os.getpid()}
    if mode == "run":
        loader = acc.prepare(make(st))
        report["stoker_class"] = isinstance(loader, st.DataLoader)
        report["len"] = len(loader)
        report["epoch0"] = batches(loader)
        report["batches_counted"] = loader.statistics().batches
        it = iter(loader)
        report["head"] = [next(it).tolist() for _ in range(2)]
        acc.save_state(ckpt)
        report["rest"] = batches(it)
        report["torch_sizes"] = [len(b) for b in batches(acc.prepare(make(torch.utils.data)))]
        report["odd"] = batches(acc.prepare(make(st, Odd())))
        report["odd_torch"] = batches(acc.prepare(make(torch.utils.data, Odd())))
    else:
        loader = acc.prepare(make(st))
        acc.load_state(ckpt)
        report["resumed"] = batches(loader)
    with open(os.path.join(out, f"{mode}_{rank}.json"), "w") as f:
        json.dump(report, f)
    acc.wait_for_everyone()
    acc.end_training()
    """
)


_ON_A_FREE_PORT = """
import os, socket, sys
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = str(s.getsockname()[1])
at = sys.argv.index("--main_process_port") + 1
os.execv(sys.executable, [sys.executable, "-m", *sys.argv[1:at], port, *sys.argv[at:]])
"""
"""Runs ``python -m ARGS`` with a free port of 127.0.0.1 after ``--main_process_port``."""


_N = 24
"""Samples per epoch in the launched runs: 4 batches of 3 per process, no padding."""


def _launches(tmp: Path) -> Job:
    """Two launches of the script, one after the other: the run, and the resume from its
    checkpoint in new processes (started as the session starts: see tests/_early.py)."""
    script = tmp / "train.py"
    script.write_text(_SCRIPT)
    env = python_env(_SRC, HF_HOME=str(tmp / "hf"), OMP_NUM_THREADS="1")  # no user config

    # The launcher that starts N processes (--cpu starts one); Accelerator(cpu=True) in the
    # script makes them CPU processes over gloo. The port is picked as it starts.
    def launch(mode: str) -> list[str]:
        return [
            sys.executable, "-c", _ON_A_FREE_PORT, "accelerate.commands.launch", "--multi_gpu",
            "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
            "--dynamo_backend", "no", "--main_process_ip", "127.0.0.1", "--main_process_port",
            str(script), mode, str(tmp), str(tmp / "ckpt"), str(_N),
        ]  # fmt: skip

    return Job([launch("run"), launch("resume")], env)


def _reports(tmp: Path, mode: str) -> list[dict[str, Any]]:
    return [json.loads((tmp / f"{mode}_{r}.json").read_text()) for r in range(2)]


def _samples(batches: list[list[list[int]]]) -> list[int]:
    return [row[0] for b in batches for row in b]


def _indices(batches: list[list[list[int]]]) -> list[list[int]]:
    """Each batch's sample indices (a row is [index, pid of the worker that loaded it])."""
    return [[row[0] for row in b] for b in batches]


@pytest.mark.slow
@pytest.mark.multiprocess
@starts_early(_launches)
def test_accelerate_launch_two_processes_keeps_stoker_and_resumes(
    request: pytest.FixtureRequest,
) -> None:
    """2 processes under accelerate launch: disjoint shards covering the epoch, batches
    from stoker's workers, even_batches padding as Accelerate pads torch's loader, and
    save_state() mid-epoch + load_state() in a new launch giving exactly the remaining
    batches."""
    job = finished(request, timeout=110)  # within the suite's 120 s per test
    assert job.returncode == 0, job.output[-3000:]
    n, runs = _N, _reports(job.tmp, "run")
    for r in runs:
        assert r["stoker_class"] and r["len"] == 4
        pids = {row[1] for b in r["epoch0"] for row in b}
        assert len(pids) == 2 and r["main_pid"] not in pids, "loaded by stoker's 2 workers"
        assert r["batches_counted"] == 4
        assert [len(b) for b in r["epoch0"]] == r["torch_sizes"] == [3] * 4
    first, second = (set(_samples(r["epoch0"])) for r in runs)
    assert not first & second and first | second == set(range(n))
    epoch1 = [_samples(r["head"] + r["rest"]) for r in runs]
    assert not set(epoch1[0]) & set(epoch1[1]) and set(epoch1[0] + epoch1[1]) == set(range(n))
    # even_batches: as Accelerate pads torch's loader, every process gets 4 full batches,
    # the epoch's 23 samples all there and one of them twice
    odd = [_samples(r["odd"]) for r in runs]
    assert [[len(b) for b in r["odd"]] for r in runs] == [[3] * 4] * 2
    assert [[len(b) for b in r["odd_torch"]] for r in runs] == [[3] * 4] * 2
    assert set(odd[0] + odd[1]) == set(range(23)) and len(odd[0] + odd[1]) == 24
    resumed = _reports(job.tmp, "resume")
    for r, again in zip(runs, resumed, strict=True):
        assert _indices(again["resumed"]) == _indices(r["rest"]) and len(r["rest"]) == 2


# -- one process ------------------------------------------------------------------------


class _Rows:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return np.array([i, os.getpid()])


@pytest.fixture
def accelerator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    yield Accelerator(cpu=True)
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.mark.multiprocess
def test_prepare_keeps_the_stoker_loader_and_its_workers(accelerator: Any) -> None:
    """prepare() returns the same stoker loader (still a torch DataLoader), iterated by
    its workers, with Accelerate's gradient state told where the loader ends."""
    loader = st.DataLoader(_Rows(10), batch_size=4, shuffle=True, num_workers=2)
    prepared = accelerator.prepare(loader)
    assert prepared is loader and isinstance(prepared, torch.utils.data.DataLoader)
    assert type(prepared).__qualname__ == "DataLoader" and prepared in accelerator._dataloaders
    ends = []
    for b in prepared:
        ends.append(accelerator.gradient_state.end_of_dataloader)
        assert isinstance(b, torch.Tensor) and os.getpid() not in b[:, 1].tolist()
    assert ends == [False, False, True] and prepared.remainder == 10 % 4
    assert sorted(i for b in prepared for i in b[:, 0].tolist()) == list(range(10))


def test_state_dict_counts_the_batches_the_loop_saw(accelerator: Any) -> None:
    """Mid-epoch, state_dict() counts the batches handed to the loop (not the one read
    ahead), and a loader prepared again resumes with exactly the rest."""
    prepared = accelerator.prepare(st.DataLoader(_Rows(17), batch_size=3, shuffle=True))
    it = iter(prepared)
    head = [next(it) for _ in range(2)]
    state = prepared.state_dict()
    assert state["delivered"] == len(head) == 2
    rest = [b[:, 0].tolist() for b in it]
    again = accelerator.prepare(st.DataLoader(_Rows(17), batch_size=3, shuffle=True))
    again.load_state_dict(state)
    assert [b[:, 0].tolist() for b in again] == rest


def test_where_stoker_cannot_stay_it_warns_once(accelerator: Any) -> None:
    """With dispatch_batches=True Accelerate rebuilds the loader as torch's: a warning,
    once, says what is lost and how to keep stoker."""
    from stoker.torch import _accelerate

    _accelerate._WARNED.clear()
    accelerator.dataloader_config.dispatch_batches = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            out = accelerator.prepare(st.DataLoader(_Rows(8), batch_size=4))
    mine = [w for w in caught if "stoker" in str(w.message)]
    said = [str(w.message) for w in mine]
    assert len(said) == 1 and "dispatch_batches=True" in said[0]
    assert mine[0].filename == __file__, "it points at the prepare() line"
    assert "workers" in said[0] and "Fix:" in said[0]
    assert not isinstance(out, st.DataLoader)


def test_other_readers_of_the_flag_change_nothing() -> None:
    """Reading _is_accelerate_prepared outside Accelerate prepares nothing, warns nothing."""
    loader = st.DataLoader(_Rows(4), batch_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert loader._is_accelerate_prepared is False
    assert type(loader) is st.DataLoader


def _seed_worker(worker_id: int) -> None:
    """What transformers' ``seed_worker`` does: seed from torch's worker seed."""
    np.random.seed(torch.initial_seed() % 2**32)


@pytest.mark.multiprocess
def test_trainer_style_loaders_keep_stoker(accelerator: Any) -> None:
    """The loaders HF Trainer builds and prepares (with ``transformers.trainer.DataLoader``
    set to stoker.torch's, docs/guide.md): a torch RandomSampler for training, a
    SequentialSampler for evaluation, its worker_init_fn; both stay stoker's and cover
    the data once."""
    td = torch.utils.data
    ds = _Rows(14)
    common: dict[str, Any] = {"batch_size": 4, "num_workers": 2, "worker_init_fn": _seed_worker}
    train = accelerator.prepare(st.DataLoader(ds, sampler=td.RandomSampler(ds), **common))
    evaluate = accelerator.prepare(st.DataLoader(ds, sampler=td.SequentialSampler(ds), **common))
    for loader in (train, evaluate):
        assert isinstance(loader, st.DataLoader)
        got = list(loader)
        assert sorted(i for b in got for i in b[:, 0].tolist()) == list(range(14))
        assert os.getpid() not in {int(p) for b in got for p in b[:, 1]}
    assert [b[:, 0].tolist() for b in evaluate][:1] == [[0, 1, 2, 3]]


def test_one_process_prepares_streams_and_unbatched_loaders(accelerator: Any) -> None:
    """In one process an IterableDataset and batch_size=None stay stoker's too, with the
    batches a plain stoker loader gives."""

    class Stream(st.IterableDataset):  # type: ignore[misc]
        def __iter__(self) -> Any:
            return iter(np.arange(5))

    stream = accelerator.prepare(st.DataLoader(Stream(), batch_size=2))
    single = accelerator.prepare(st.DataLoader(list(range(5)), batch_size=None))
    assert isinstance(stream, st.DataLoader) and isinstance(single, st.DataLoader)
    assert [b.tolist() for b in stream] == [[0, 1], [2, 3], [4]]
    assert [int(x) for x in single] == [0, 1, 2, 3, 4]
