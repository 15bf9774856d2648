"""stoker's C extension built without libjpeg-turbo, as setup.py builds it where libjpeg-turbo's
headers are missing (here forced with ``STOKER_NO_JPEG=1``, since this machine has them): it
imports with its resample and normalise kernels and no decode, stoker decodes without it,
and ``stoker doctor`` reports just that."""

from __future__ import annotations

import json
import os
import shutil
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from _early import Job, finished, python_env, starts_early

ROOT = Path(__file__).resolve().parents[1]

# Run in a fresh interpreter: the extension at SO is the one `stoker.vision._native` imports.
CHILD = """
import importlib.util, json, sys
import numpy as np

class _ThisBuild:
    def find_spec(self, name, path=None, target=None):
        if name == "stoker.vision._native":
            return importlib.util.spec_from_file_location(name, SO)
        return None

sys.meta_path.insert(0, _ThisBuild())
from stoker._doctor import diagnose
from stoker.vision import _decode, _native

img = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
out = np.empty((3, 4, 5), np.float32)
scale, offset = [np.float32(1 / 255)] * 3, [np.float32(0.5)] * 3
_native.normalize(img, out, False, False, scale, offset)
want = img.transpose(2, 0, 1) * np.float32(1 / 255) - np.float32(0.5)
report = json.loads(diagnose().json())
print(json.dumps({
    "file": _native.__file__,
    "kernels": sorted(k for k in ("decode", "resample", "normalize") if hasattr(_native, k)),
    "regions": _decode.decodes_regions(),
    "normalised": bool(np.array_equal(out, want)),
    "fast paths": report["sections"]["Fast paths"],
    "advice": report["advice"],
}))
"""


def _compiler() -> str | None:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(os.environ.get("CC", cc).split()[0])


def _build(tmp: Path) -> Job | None:
    """Build the extension without libjpeg into ``tmp``, then run CHILD on it in a fresh
    interpreter, its report the last line of the output (as the session starts:
    tests/_early.py)."""
    if _compiler() is None:
        return None
    build = [sys.executable, "setup.py", "-q", "build_ext", "--force"]
    build += ["--build-lib", str(tmp / "lib"), "--build-temp", str(tmp / "tmp")]
    child = tmp / "child.py"
    lib = str(tmp / "lib")
    find = f"import pathlib\n(SO,) = map(str, pathlib.Path({lib!r}).rglob('_native*'))\n"
    child.write_text(find + textwrap.dedent(CHILD))
    return Job([build, [sys.executable, str(child)]], python_env(STOKER_NO_JPEG="1"), cwd=ROOT)


@pytest.mark.slow
@pytest.mark.skipif(_compiler() is None, reason="no C compiler")
@starts_early(_build)
def test_without_libjpeg_the_extension_has_resample_and_normalise_and_the_doctor_says_so(
    request: pytest.FixtureRequest,
) -> None:
    job = finished(request, timeout=110)
    assert job.returncode == 0, job.output
    assert "without libjpeg" in job.output
    (so,) = (job.tmp / "lib").rglob("_native*")
    got = json.loads(job.output.splitlines()[-1])
    assert got["file"] == str(so)
    assert got["kernels"] == ["normalize", "resample"]
    assert got["regions"] is False and got["normalised"] is True
    fast = got["fast paths"]
    assert fast["native kernels"].startswith("built")
    assert fast["native decode"].startswith("not in this build")
    assert fast["native resampler"] == "stoker's C resampler"
    assert fast["native normalise"] == "stoker's C kernel"
    assert any("crop-only JPEG decode is off" in a and "libjpeg-dev" in a for a in got["advice"])
