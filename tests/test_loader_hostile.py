"""Hostile use of the loader, second pass: what a user, a container or an argument does to it.

A loader dropped with persistent workers in a script with the collector off; a dataset
that shards itself on torch's ``get_worker_info()`` in thread workers; a first batch that
fails once under ``worker_mode="auto"``; a small, a read-only ``/dev/shm`` and a cgroup
``cpu.max`` with a period of 0 (a private mount namespace, ``unshare -m``: needs root, else
skipped); arguments of the wrong kind; copies of a loader that has run. Where torch has the
behaviour, torch's loader is the control.
"""

from __future__ import annotations

import copy
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as torch_data

import stoker.torch as st
from stoker import DataLoader, _autotune
from stoker._policy import PROBE_SAMPLES
from stoker.errors import SharedMemoryError

_BOUND_S = 30.0
"""The longest a condition may take to hold before it counts as never."""
_SRC = str(Path(__file__).parents[1] / "src")


def _python(code: str, setup: str = "", timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with this checkout's stoker; with ``setup`` (a
    shell line mounting what the test needs) in a mount namespace of its own."""
    env = {**os.environ, "PYTHONPATH": _SRC}
    cmd = [sys.executable, "-c", textwrap.dedent(code)]
    if setup:
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            pytest.skip("needs root and unshare(1) to mount in a private namespace")
        shell = f'{setup} && exec "$0" "$@"; echo cannot-mount >&2; exit 97'
        cmd = ["unshare", "-m", "sh", "-c", shell, *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode == 97 or "unshare failed" in done.stderr:
        pytest.skip(f"cannot mount in a private namespace here: {done.stderr[-200:]}")
    return done


def _ok(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The lines a script printed, after checking it exited 0 and wrote nothing to stderr."""
    assert (done.returncode, done.stderr) == (0, ""), done.stdout
    return done.stdout.splitlines()


# -- persistent workers and the cyclic collector --------------------------------------------


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_del_loader_stops_persistent_workers_with_the_collector_off(mode: str) -> None:
    """``del loader, b`` after an epoch: nothing keeps the loader alive (no reference cycle
    through its persistent iterator), so its workers stop with the collector disabled, as
    torch's do; stoker's own handle to the iterator keeps it working until then."""
    lines = _ok(
        _python(
            f"""
            import gc, os, threading, time, weakref
            gc.disable()
            import numpy as np
            from stoker import DataLoader

            class Rows:
                def __len__(self):
                    return 8
                def __getitem__(self, i):
                    return np.full(4, i)

            loader = DataLoader(Rows(), batch_size=2, num_workers=2, persistent_workers=True,
                                worker_mode={mode!r})
            for epoch in range(2):
                for b in loader:
                    pass
            pids = loader._iterator._pool.gauges().pids
            ref = weakref.ref(loader)
            del loader, b
            print("loader freed:", ref() is None)
            def alive():
                out = [t.name for t in threading.enumerate() if t.name.startswith("stoker-")]
                for pid in pids:
                    try:
                        os.kill(pid, 0)
                        out.append(pid)
                    except ProcessLookupError:
                        pass
                return out
            deadline = time.monotonic() + {_BOUND_S}
            while alive() and time.monotonic() < deadline:
                time.sleep(0.01)
            print("left:", alive(), "collector on:", gc.isenabled())
            """
        )
    )
    assert lines == ["loader freed: True", "left: [] collector on: False"]


# -- get_worker_info in every kind of worker ------------------------------------------------


class _Shards(torch_data.IterableDataset[int]):
    """0..39, each worker yielding its share by ``torch.utils.data.get_worker_info()``, as
    torch's documentation shows; under stoker (``ours``), it checks that stoker's
    ``get_worker_info()`` says the same as torch's."""

    def __init__(self, ours: bool = True) -> None:
        self.ours = ours

    def __iter__(self) -> Any:
        from torch.utils.data import get_worker_info as bound_early  # a name bound once

        from stoker import get_worker_info

        info, ours, early = torch_data.get_worker_info(), get_worker_info(), bound_early()
        if info is None:
            assert ours is None and early is None, (ours, early)
            return iter(range(40))
        assert early is info and isinstance(info, torch_data._utils.worker.WorkerInfo)
        if self.ours:
            assert ours is not None, "stoker's get_worker_info() said None in a worker"
            assert (ours.id, ours.num_workers, ours.seed) == (info.id, info.num_workers, info.seed)
        return iter(range(info.id, 40, info.num_workers))


@pytest.mark.parametrize(
    ("num_workers", "mode"),
    [(2, "thread"), ("auto", "thread"), (2, "process"), (0, "process"), (2, "auto")],
)
def test_torch_get_worker_info_shards_alike_in_every_kind_of_worker(
    num_workers: int | str, mode: str
) -> None:
    """A dataset that shards itself on torch's ``get_worker_info()`` yields each sample once
    with any worker kind, as with torch's workers; in the main process both say None."""
    got = [int(x) for x in st.DataLoader(_Shards(), batch_size=None, num_workers=num_workers,
                                          worker_mode=mode)]  # fmt: skip
    expected = sorted(int(x) for x in torch_data.DataLoader(_Shards(False), batch_size=None,
                                                             num_workers=2))  # fmt: skip
    assert sorted(got) == expected == list(range(40))
    assert torch_data.get_worker_info() is None


# -- worker_mode="auto" and a first batch that raises -----------------------------------


class _FailsOnce:
    """``np.full(2, i)``, each after 2 ms; sample ``bad`` raises the first time it is loaded
    in any process (a marker file says it did), as a flaky read would."""

    def __init__(self, bad: int, marker: Path) -> None:
        self.bad, self.marker = bad, marker

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> Any:
        time.sleep(0.002)
        if i == self.bad:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                raise KeyError(f"sample {i} could not be read")
        return np.full(2, i)


def _first_error(loader: DataLoader[Any]) -> tuple[int, type[BaseException], str]:
    """(the next() that raised, the type, the message) of the loader's first error."""
    it = iter(loader)
    for k in range(len(loader) + 1):
        try:
            next(it)
        except StopIteration:
            break
        except Exception as exc:
            return k, type(_untraced(exc)), str(exc)
    raise AssertionError("no error was raised")


def _untraced(exc: BaseException) -> BaseException:
    """``exc``, the tracebacks of its chain dropped: they hold the iterator's frames, in a
    cycle that keeps its workers until a garbage collection (torch's then waits 5 s for a
    live one), rather than stopping them as the error is caught."""
    link: BaseException | None = exc
    while link is not None:
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    return exc


@pytest.mark.parametrize("to", ["process", "thread"])
@pytest.mark.parametrize("num_workers", [1, 2, 3, "auto"])
@pytest.mark.parametrize("bad", [1, 5, PROBE_SAMPLES])
def test_auto_raises_the_first_batchs_error_at_the_same_next(
    to: str, num_workers: int | str, bad: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first batch that raises while worker_mode="auto" measures it, with the measure
    choosing either mode: the error reaches the user at the next() where num_workers=0
    raises it, of its type and with its message, not dropped by a restart of the epoch
    on the other side (where the sample, read again, would load). Sample ``PROBE_SAMPLES``
    is the one a worker loads while the probe sent before it is decided on: a restart at
    once would stop the pool after it raised; with 2 or 3 fixed thread workers, idle ones
    help with the first batch's later samples."""
    monkeypatch.setattr(_autotune, "threads_suffice", lambda *a: (to == "thread", "forced"))
    kw: dict[str, Any] = {"batch_size": 16}
    k0, type0, text0 = _first_error(DataLoader(_FailsOnce(bad, tmp_path / "0"), **kw))
    auto = DataLoader(
        _FailsOnce(bad, tmp_path / "auto"), num_workers=num_workers, worker_mode="auto", **kw
    )
    k, kind, text = _first_error(auto)
    assert (k, kind) == (k0, type0) == (0, KeyError)
    assert text0 in text and "worker" in text, text


# -- /dev/shm and cgroups as containers make them ----------------------------------------

_SMALL_SHM_AUTO = """
import time, numpy as np
from stoker import DataLoader

class Rows:
    def __len__(self):
        return 48
    def __getitem__(self, i):
        time.sleep(0.01)
        return np.full(1 << 20, i, np.uint8)

for kw in ({"num_workers": 2, "prefetch_factor": 2}, {"num_workers": "auto"}):
    loader = DataLoader(Rows(), batch_size=4, **kw)
    try:
        print(sum(1 for _ in loader), "|".join(loader.statistics().autotune), flush=True)
    except Exception as exc:
        print(type(exc).__name__, exc, flush=True)
"""


def test_auto_stays_within_a_small_dev_shm_and_says_so() -> None:
    """4 MiB batches, a 32 MiB /dev/shm: where 2 workers x prefetch 2 fit, num_workers="auto"
    grows no further than /dev/shm has room for (it grew to 8 and failed), and its
    decisions name /dev/shm."""
    lines = _ok(_python(_SMALL_SHM_AUTO, "mount -t tmpfs -o size=32m tmpfs /dev/shm"))
    assert lines[0] == "12 ", lines
    count, decisions = lines[1].split(" ", 1)
    assert count == "12", lines
    assert "/dev/shm" in decisions, decisions


_READ_ONLY_SHM = """
import sys, numpy as np
from stoker import DataLoader
from stoker._cli import main

class Rows:
    def __len__(self):
        return 8
    def __getitem__(self, i):
        return np.full(4, i)

for kw in ({"worker_mode": "process"}, {"worker_mode": "auto"}):
    loader = DataLoader(Rows(), batch_size=2, num_workers=2, **kw)
    try:
        print(sum(1 for _ in loader), "|".join(loader.statistics().autotune), flush=True)
    except Exception as exc:
        print(type(exc).__name__, exc, flush=True)
print("doctor exit", main(["doctor"]), flush=True)
"""


def test_a_read_only_dev_shm_is_named_auto_takes_threads_and_the_doctor_says_so() -> None:
    """A read-only /dev/shm: process workers fail once, in the main process, with a
    SharedMemoryError naming /dev/shm, what is wrong and the fix (no worker tracebacks on
    stderr); worker_mode="auto" loads with threads and says why; the doctor advises on it."""
    lines = _ok(_python(_READ_ONLY_SHM, "mount -t tmpfs -o size=8m,ro tmpfs /dev/shm"))
    kind, text = lines[0].split(" ", 1)
    assert kind == SharedMemoryError.__name__, lines
    assert "/dev/shm" in text and "read-only" in text and "worker_mode='thread'" in text
    assert lines[1] == "4 thread workers: /dev/shm is read-only, process workers need it"
    advice = "\n".join(lines).split("\nWhat to do\n", 1)[1]
    assert "/dev/shm is read-only" in advice and "every fast path is on" not in advice
    assert lines[-1] == "doctor exit 0"


_PERIOD_ZERO = """
import numpy as np
from stoker import DataLoader
from stoker._cli import main
from stoker._osprobe import cgroup_cpu_quota

print("quota", cgroup_cpu_quota(), flush=True)
print(len(list(DataLoader(np.arange(8), batch_size=2, num_workers=2))), flush=True)
print("doctor exit", main(["doctor"]), flush=True)
"""


def test_a_cpu_max_period_of_zero_is_no_quota() -> None:
    """A cgroup cpu.max of "100000 0" (its period 0) is no quota: loaders with workers run
    (they raised ZeroDivisionError) and the doctor exits 0 (it exited 1)."""
    setup = 'mount -t tmpfs tmpfs /sys/fs/cgroup && echo "100000 0" > /sys/fs/cgroup/cpu.max'
    lines = _ok(_python(_PERIOD_ZERO, setup))
    assert lines[:2] == ["quota None", "4"], lines
    assert any(line.split() == ["cgroup", "quota", "none"] for line in lines), lines
    assert lines[-1] == "doctor exit 0"


# -- arguments of the wrong kind, against torch ----------------------------------------------


class _Rows(torch_data.Dataset[Any]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        return np.full(3, i)


def _moment(make: Callable[[], Any]) -> tuple[str, type[BaseException] | None, str]:
    """Where (``"init"``, ``"iter"``, ``"next"``) a loader made by ``make`` first raises, the
    exception's type and message; ``("none", None, "")`` if it never does."""
    stage = "init"
    try:
        loader = make()
        stage = "iter"
        it = iter(loader)
        stage = "next"
        for _ in it:
            pass
    except Exception as exc:
        return stage, type(_untraced(exc)), str(exc)
    return "none", None, ""


@pytest.mark.parametrize(
    ("kw", "name", "takes"),
    [
        ({"timeout": "5"}, "timeout", "a number of seconds"),
        ({"timeout": None, "num_workers": 1}, "timeout", "a number of seconds"),
        ({"collate_fn": "str"}, "collate_fn", "a callable"),
        ({"collate_fn": 5, "num_workers": 1}, "collate_fn", "a callable"),
        ({"worker_init_fn": 5, "num_workers": 1}, "worker_init_fn", "a callable"),
        ({"batch_sampler": 5}, "batch_sampler", "an iterable"),
        ({"sampler": 5, "batch_size": None}, "sampler", "an iterable"),
    ],
    ids=lambda v: repr(v) if isinstance(v, dict) else "",
)
def test_an_argument_of_the_wrong_kind_is_named_where_torch_raises(
    kw: dict[str, Any], name: str, takes: str
) -> None:
    """torch's exception type at torch's moment; stoker's message names the argument and
    what it takes (torch's is a bare "'str' object is not callable" or a failed ``<``)."""
    where, kind, _ = _moment(lambda: torch_data.DataLoader(_Rows(), **kw))
    ours = _moment(lambda: st.DataLoader(_Rows(), **kw))
    assert ours[:2] == (where, kind) and kind is TypeError, ours
    assert f"{name} must be {takes}" in ours[2], ours


def test_a_sampler_of_the_wrong_kind_under_a_batch_sampler_is_named() -> None:
    """``sampler=5`` with batching: torch's TypeError when its batch sampler iterates it,
    naming the argument (the moment is the sampler's draw: see docs/reliability.md)."""
    _, kind, text = _moment(lambda: st.DataLoader(_Rows(), sampler=5, batch_size=2))
    assert kind is _moment(lambda: torch_data.DataLoader(_Rows(), sampler=5, batch_size=2))[1]
    assert kind is TypeError and "'int' object is not iterable: sampler must be" in text


# -- copies, and loader.sampler, against torch ------------------------------------------------


def _ints(batches: Any) -> list[list[int]]:
    return [b.reshape(len(b), -1)[:, 0].tolist() for b in batches]


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("midway", [True, False], ids=["mid-epoch", "after"])
def test_a_loader_that_has_run_can_be_copied_as_torchs(
    how: str, num_workers: int, midway: bool
) -> None:
    """Pickled or deep-copied after (or during) an epoch, as torch's can be: the copy loads
    the next epoch as the original's next epoch does, with its own workers."""
    clone: Callable[[Any], Any] = (
        (lambda x: pickle.loads(pickle.dumps(x))) if how == "pickle" else copy.deepcopy
    )
    copies = []
    for make in (torch_data.DataLoader, st.DataLoader):
        generator = torch.Generator().manual_seed(7)
        loader = make(_Rows(), batch_size=3, shuffle=True, generator=generator,
                      num_workers=num_workers)  # fmt: skip
        it = iter(loader)
        next(it)
        if not midway:
            list(it)
        twin = clone(loader)
        copies.append((_ints(twin), _ints(loader)))
        del it
    (torch_copy, torch_next), (ours_copy, ours_next) = copies
    assert ours_copy == ours_next and torch_copy == torch_next
    assert sorted(i for batch in ours_copy for i in batch) == list(range(8))


def test_a_loader_with_persistent_workers_copies_without_them() -> None:
    """A copy of a loader whose persistent workers run has none (torch's refuses to copy):
    it starts its own, and the original's keep serving it."""
    loader = st.DataLoader(_Rows(), batch_size=4, num_workers=2, persistent_workers=True)
    first = _ints(loader)
    twin = copy.deepcopy(loader)
    assert twin._iterator is None and loader._iterator is not None
    assert _ints(twin) == first == _ints(loader)


@pytest.mark.parametrize("kind", ["batch_sampler", "iterable"])
def test_loader_sampler_is_a_torch_sampler_where_torchs_is(kind: str) -> None:
    """``loader.sampler`` beside a given batch_sampler (torch's SequentialSampler) and over
    an IterableDataset (torch's _InfiniteConstantSampler): of torch's class, as torch's."""

    def make(cls: Any) -> Any:
        if kind == "iterable":
            return cls(_Shards(cls is st.DataLoader), batch_size=2)
        return cls(_Rows(), batch_sampler=torch_data.BatchSampler(range(8), 3, False))

    theirs, ours = make(torch_data.DataLoader).sampler, make(st.DataLoader).sampler
    assert isinstance(ours, type(theirs)) and isinstance(ours, torch_data.Sampler)
    assert len(list(make(st.DataLoader))) == (20 if kind == "iterable" else 3)
