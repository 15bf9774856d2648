"""W6, memory: a dataset of 2M file names read by 2 fork workers for one epoch; the workers'
summed PSS and private memory (USS) near the end of the epoch. torch with a Python list of
str vs stoker with its refcount-free StringArray.

Each run happens in a fresh child process that builds only its own dataset, so the
workers' PSS shares are not inflated by the other contender's data.

    python benchmarks/w6_memory.py [--workers N] [--repeats R] [--quick]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import harness

N, BATCH = 2_000_000, 1000


def names() -> list[str]:
    """2M file names like ImageNet's."""
    return [f"/data/train/n{i % 1000:08d}/n{i % 1000:08d}_{i:08d}.JPEG" for i in range(N)]


class Names:
    """A map-style dataset whose samples are file names (a list or a StringArray)."""

    def __init__(self, items: Any) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


def memory_mb(pid: int) -> tuple[float, float]:
    """(PSS, USS) of ``pid`` in MB, from /proc/<pid>/smaps_rollup."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                fields[parts[0].rstrip(":")] = int(parts[1])
    uss = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
    return fields.get("Pss", 0) / 1024, uss / 1024


def child(which: str, workers: int) -> None:
    """One epoch in this process; prints JSON with the workers' summed PSS and USS."""
    if which == "torch":
        import torch.utils.data as tud

        loader: Any = tud.DataLoader(Names(names()), batch_size=BATCH, num_workers=workers)
        pids = lambda it: [p.pid for p in it._workers]  # noqa: E731
    else:
        import stoker

        packed = stoker.StringArray(
            f"/data/train/n{i % 1000:08d}/n{i % 1000:08d}_{i:08d}.JPEG" for i in range(N)
        )  # streamed: the 2M str objects never exist at once
        loader = stoker.DataLoader(Names(packed), batch_size=BATCH, num_workers=workers)
        pids = lambda it: [w.pid for w in it._pool.workers]  # noqa: E731
    it = iter(loader)
    total, n, mem = len(loader), 0, (0.0, 0.0)
    for k, batch in enumerate(it):
        n += len(batch)
        if k == total - 3:
            per = [memory_mb(p) for p in pids(it)]
            mem = (sum(p for p, _ in per), sum(u for _, u in per))
    print(json.dumps({"samples": n, "pss_mb": mem[0], "uss_mb": mem[1]}))


def main() -> None:
    """Run both contenders in fresh processes, alternating; print medians and ratios."""
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
        return
    args = harness.cli(__doc__ or "", repeats=3, workers=2)
    mem: dict[str, list[dict[str, float]]] = {"torch": [], "stoker": []}

    def run(which: str) -> Any:
        def go() -> dict[str, float]:
            out = subprocess.run(
                [sys.executable, __file__, "--child", which, str(args.workers)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            rec = json.loads(out.strip().splitlines()[-1])
            mem[which].append(rec)
            return {"samples": rec["samples"]}

        return go

    med: dict[str, dict[str, float]] = {}

    def memory() -> dict[str, Any]:
        """The median memory per contender, with the raw runs, for the JSON record."""
        for k, v in mem.items():
            med[k] = {m: statistics.median(r[m] for r in v) for m in ("pss_mb", "uss_mb")}
        ratios = {m: med["stoker"][m] / med["torch"][m] for m in ("pss_mb", "uss_mb")}
        return {"memory": {**med, "ratio_stoker_torch": ratios, "runs": mem}}

    harness.compare(
        f"w6_memory_{args.workers}w",
        {"torch": run("torch"), "stoker": run("stoker")},
        repeats=args.repeats,
        config={"samples": N, "batch": BATCH, "workers": args.workers},
        warmup=False,
        extra=memory,
    )
    for k, v in med.items():
        print(f"{k}: workers' summed PSS {v['pss_mb']:,.1f} MB, USS {v['uss_mb']:,.1f} MB")
    for m in ("pss_mb", "uss_mb"):
        print(f"{m} ratio stoker/torch: {med['stoker'][m] / med['torch'][m]:.3f}")


if __name__ == "__main__":
    main()
