"""Hugging Face ``datasets`` streams resume from their own ``state_dict`` (torchdata's
protocol) in stoker.torch's loader: exactly, with 2 workers each reading its shards, and
nothing before the checkpoint read again. Local files and generators only (no network)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only: never the Hub
os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")
datasets = pytest.importorskip("datasets")

import stoker.torch as S  # noqa: E402

tqdm = pytest.importorskip("tqdm")  # datasets' progress bars: their monitor thread would
tqdm.tqdm.monitor_interval = 0  # outlive the test (conftest checks that none is left)


def _shard(shards: list[int]) -> Any:
    for s in shards:
        for i in range(13):
            yield {"x": s * 100 + i}


def _from_generator(tmp_path: Path) -> Any:
    return datasets.IterableDataset.from_generator(_shard, gen_kwargs={"shards": [0, 1, 2, 3]})


def _from_files(tmp_path: Path) -> Any:
    files = []
    for s in range(2):
        path = tmp_path / f"part-{s}.jsonl"
        path.write_text("".join(json.dumps({"x": s * 1000 + i}) + "\n" for i in range(30)))
        files.append(str(path))
    return datasets.load_dataset(
        "json", data_files=files, streaming=True, split="train", cache_dir=str(tmp_path / "c")
    )


@pytest.mark.parametrize("source", [_from_generator, _from_files], ids=["generator", "files"])
@pytest.mark.parametrize(
    "kw",
    [{}, {"persistent_workers": True}, {"worker_mode": "thread"}],
    ids=["processes", "persistent", "threads"],
)
def test_hf_stream_resumes_exactly_with_two_workers(
    source: Any, kw: dict[str, Any], tmp_path: Path
) -> None:
    """A streaming HF dataset sharded over 2 workers, checkpointed mid-epoch (the state
    through JSON), resumes with exactly the batches an uninterrupted run gives after it,
    from each worker's own HF state (statistics say so); persistent workers resume in
    place."""
    ds = source(tmp_path)
    assert ds.num_shards >= 2

    def make() -> Any:
        return S.DataLoader(ds, batch_size=4, num_workers=2, **kw)

    full = [b["x"].tolist() for b in make()]
    cut = len(full) // 2
    saver = make()
    it = iter(saver)
    head = [next(it)["x"].tolist() for _ in range(cut)]
    state = json.loads(json.dumps(saver.state_dict()))
    del it
    assert all(w["dataset"] is not None for w in state["stream"]["workers"])
    fresh = saver if kw.get("persistent_workers") else make()  # persistent: in place
    fresh.load_state_dict(state)
    assert head + [b["x"].tolist() for b in fresh] == full
    assert fresh.statistics().resume == "state"
