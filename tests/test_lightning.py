"""Lightning trains from stoker.torch loaders under DDP: each rank gets its own half.

Lightning recognises torch's ``DataLoader`` and rebuilds it with a ``DistributedSampler``;
``strategy="ddp"`` starts rank 1 by running ``sys.argv`` again, so the training runs in a
script of its own (written to a temporary directory), and each rank writes the sample ids
it trained and validated on, per epoch, for the test to check.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from _early import Job, finished, python_env, starts_early

if importlib.util.find_spec("lightning") is None:  # not imported here: only its job uses it
    pytest.skip("lightning is not installed", allow_module_level=True)

N_TRAIN = 64
N_VAL = 32
SCRIPT = textwrap.dedent(
    f"""
    import json, os, sys
    import numpy as np
    import torch
    import lightning as L
    import stoker.torch as data

    OUT = sys.argv[1]

    class Numbers(data.Dataset):
        # NumPy samples, as many datasets give them: stoker.torch batches them as tensors
        def __init__(self, n):
            self.n = n
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            return np.float32(i) / self.n, np.int64(i)

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(1, 1)
            self.seen = {{"train": [], "val": []}}
        def _record(self, stage, batch):
            x, idx = batch
            assert isinstance(x, torch.Tensor) and x.dtype == torch.float32, type(x)
            self.seen[stage].extend(idx.tolist())
            return self.lin(x[:, None]).pow(2).mean()
        def training_step(self, batch, i):
            return self._record("train", batch)
        def validation_step(self, batch, i):
            self._record("val", batch)
        def on_train_epoch_end(self):
            loaders = {{"train": self.trainer.train_dataloader,
                       "val": self.trainer.val_dataloaders}}
            record = {{
                stage: {{
                    "ids": self.seen[stage],
                    "loader": f"{{type(dl).__module__}}.{{type(dl).__qualname__}}",
                    # the sampler that decides: Lightning wraps it in the batch sampler
                    "sampler": type(dl.batch_sampler.sampler).__qualname__,
                }}
                for stage, dl in loaders.items()
            }}
            path = os.path.join(OUT, f"rank{{self.global_rank}}_epoch{{self.current_epoch}}.json")
            with open(path, "w") as f:
                json.dump(record, f)
            self.seen = {{"train": [], "val": []}}
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)
        def train_dataloader(self):
            # made inside the hook: Lightning rebuilds it from the arguments it recorded
            return data.DataLoader(
                Numbers({N_TRAIN}), batch_size=8, shuffle=True, num_workers=1,
                persistent_workers=True,  # one worker start per rank, not one per epoch
            )

    if __name__ == "__main__":
        torch.set_num_threads(1)
        # passed to fit(): Lightning rebuilds it from its attributes
        val = data.DataLoader(Numbers({N_VAL}), batch_size=8)
        trainer = L.Trainer(
            accelerator="cpu", devices=2, strategy="ddp", max_epochs=2,
            logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, num_sanity_val_steps=0,
        )
        trainer.fit(Model(), val_dataloaders=val)
    """
)


def _session_members(sid: int) -> list[int]:
    """Pids of live processes in session ``sid`` (zombies are gone once reaped)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def _fit(tmp: Path) -> Job:
    """The training script, run as the session starts (see tests/_early.py)."""
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    (tmp / "out").mkdir()
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = python_env(src, PL_DISABLE_FORK="1", PYTHONWARNINGS="ignore")
    return Job([[sys.executable, str(script), str(tmp / "out")]], env)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)  # two ranks import Lightning and torch: slow on a loaded machine
@starts_early(_fit)
def test_ddp_ranks_share_each_epoch(request: pytest.FixtureRequest) -> None:
    """Two DDP ranks (gloo) train disjoint halves that cover the dataset once per epoch,
    in a new order each epoch, on the stoker.torch loaders Lightning rebuilt; the
    validation loader passed to fit() is split too; nothing is left running."""
    job = finished(request, timeout=280)
    assert job.returncode == 0, job.output[-4000:]
    out = job.tmp / "out"

    deadline = time.monotonic() + 30  # generous: on a busy machine exits take seconds
    while (left := _session_members(job.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)  # polls the kernel's asynchronous reaping, which nothing announces
    assert left == [], f"processes left behind: {left}"

    orders = {}
    for epoch in (0, 1):
        records = [json.loads((out / f"rank{r}_epoch{epoch}.json").read_text()) for r in (0, 1)]
        for rec in records:
            for stage in ("train", "val"):
                assert rec[stage]["loader"] == "stoker.torch.DataLoader", rec
                assert rec[stage]["sampler"] == "DistributedSampler", rec
        train = [rec["train"]["ids"] for rec in records]
        assert len(train[0]) == len(train[1]) == N_TRAIN // 2
        assert set(train[0]).isdisjoint(train[1])
        assert sorted(train[0] + train[1]) == list(range(N_TRAIN))
        val = [rec["val"]["ids"] for rec in records]
        assert set(val[0]).isdisjoint(val[1])
        assert sorted(val[0] + val[1]) == list(range(N_VAL))
        orders[epoch] = train
    assert orders[0][0] != orders[1][0] and orders[0][1] != orders[1][1]
