"""The public surface: the names of docs/contract.md, sorted __all__, public module path,
light import."""

from __future__ import annotations

import inspect
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import stoker
from _early import Job, finished, python_env, starts_early

API_NAMES = {
    "Dataset", "IterableDataset", "TensorDataset", "ConcatDataset", "ChainDataset", "Subset",
    "StackDataset", "random_split", "Sampler", "SequentialSampler", "RandomSampler",
    "SubsetRandomSampler", "WeightedRandomSampler", "BatchSampler", "DistributedSampler",
    "default_collate", "default_convert", "DataLoader", "get_worker_info",
}  # fmt: skip


def test_all_is_sorted_and_complete() -> None:
    """__all__ is sorted, names every name of docs/contract.md, and every entry exists."""
    assert stoker.__all__ == sorted(stoker.__all__)
    assert set(stoker.__all__) >= API_NAMES
    for name in stoker.__all__:
        assert hasattr(stoker, name), name


def test_public_objects_report_public_module() -> None:
    """Classes and functions say they live in `stoker`, not in a private module."""
    for name in stoker.__all__:
        assert getattr(stoker, name).__module__ == "stoker", name


def test_pickles_use_public_path() -> None:
    """Pickles of public objects name `stoker.X`, so they survive moving private modules."""
    objs = [
        stoker.TensorDataset(np.arange(4)),
        stoker.SequentialSampler(range(3)),
        stoker.BatchSampler(stoker.SequentialSampler(range(3)), 2, False),
    ]
    for obj in objs:
        data = pickle.dumps(obj)
        assert b"stoker._" not in data, type(obj)
        assert type(pickle.loads(data)) is type(obj)


def test_dataloader_signature_matches_torch() -> None:
    """DataLoader's parameters up to in_order have torch's names, order, kinds and defaults."""
    torch = pytest.importorskip("torch")
    ours = list(inspect.signature(stoker.DataLoader.__init__).parameters.values())
    theirs = list(inspect.signature(torch.utils.data.DataLoader.__init__).parameters.values())
    assert [(p.name, p.kind, p.default) for p in ours[: len(theirs)]] == [
        (p.name, p.kind, p.default) for p in theirs
    ]
    extra = ours[len(theirs) :]
    assert [p.name for p in extra] == [
        "tensor_type",
        "worker_mode",
        "skip_errors",
        "snapshot_every_n_steps",
        "ray_options",
        "worker_restarts",
    ]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in extra)


def _python(code: str) -> str:
    """What ``code`` prints, run in a fresh interpreter (nothing imported yet)."""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return out.stdout.strip()


def test_import_is_light() -> None:
    """`import stoker` imports neither torch nor Pillow, nor even NumPy until a name is used."""
    code = (
        "import sys, stoker, stoker.errors; "
        "heavy = [m for m in ('numpy', 'torch', 'PIL', 'simplejpeg', 'lmdb', 'fsspec', 'ray') "
        "if m in sys.modules]; print(heavy)"
    )
    assert _python(code) == "[]"
    code = "import sys; from stoker import DataLoader; print('torch' in sys.modules)"
    assert _python(code) == "False"


def _two_interpreters(tmp: Path) -> Job:
    """A NumPy user's loop, then ``import stoker.torch``, each in a fresh interpreter, each
    printing one line after its mark (run as the session starts: see tests/_early.py)."""
    numpy_loop = (
        "import sys, numpy as np, stoker; "
        "ds = stoker.TensorDataset(np.arange(8.0)); "
        "dl = stoker.DataLoader(ds, batch_size=4, shuffle=True, num_workers=1); "
        "print('numpy:', [type(b[0]).__module__ for b in dl], 'torch' in sys.modules)"
    )
    front_door = (
        "import sys, stoker.torch; print('torch:', 'torch' in sys.modules, stoker.torch.__all__[0])"
    )
    return Job([[sys.executable, "-c", code] for code in (numpy_loop, front_door)], python_env())


@starts_early(_two_interpreters)
def test_numpy_path_imports_no_torch(request: pytest.FixtureRequest) -> None:
    """A NumPy user's loop (shuffled, with a worker) never imports torch and gets NumPy
    batches; only `import stoker.torch`, the torch front door, imports torch."""
    job = finished(request, timeout=110)
    assert job.returncode == 0, job.output
    lines = job.output.splitlines()
    said = dict(ln.split(": ", 1) for ln in lines if ln.startswith(("numpy: ", "torch: ")))
    assert said == {"numpy": "['numpy', 'numpy'] False", "torch": "True BatchSampler"}, job.output


def test_ray_is_imported_only_by_ray_workers() -> None:
    """Neither front door imports Ray (a second's import, and a cluster's worth of
    threads), nor does a loader built with worker_mode="ray" until it iterates."""
    code = (
        "import sys, stoker, stoker.torch, stoker.vision; "
        "dl = stoker.torch.DataLoader(range(4), num_workers=2, worker_mode='ray'); "
        "print([m for m in sys.modules if m == 'ray' or m.startswith('ray.')])"
    )
    assert _python(code) == "[]"
