"""stoker's C extension built without libjpeg-turbo, as setup.py builds it where libjpeg-turbo's
headers are missing (here forced with ``STOKER_NO_JPEG=1``, since this machine has them): it
imports with its resample and normalise kernels and no decode, stoker decodes without it,
and ``stoker doctor`` reports just that."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

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


@pytest.mark.slow
@pytest.mark.skipif(_compiler() is None, reason="no C compiler")
def test_without_libjpeg_the_extension_has_resample_and_normalise_and_the_doctor_says_so(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "STOKER_NO_JPEG": "1"}
    build = [sys.executable, "setup.py", "-q", "build_ext", "--force"]
    build += ["--build-lib", str(tmp_path / "lib"), "--build-temp", str(tmp_path / "tmp")]
    done = subprocess.run(build, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "without libjpeg" in done.stderr
    (so,) = (tmp_path / "lib").rglob("_native*")
    code = f"SO = {str(so)!r}\n" + textwrap.dedent(CHILD)
    child = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert child.returncode == 0, child.stderr
    got = json.loads(child.stdout)
    assert got["file"] == str(so)
    assert got["kernels"] == ["normalize", "resample"]
    assert got["regions"] is False and got["normalised"] is True
    fast = got["fast paths"]
    assert fast["native kernels"].startswith("built")
    assert fast["native decode"].startswith("not in this build")
    assert fast["native resampler"] == "stoker's C resampler"
    assert fast["native normalise"] == "stoker's C kernel"
    assert any("crop-only JPEG decode is off" in a and "libjpeg-dev" in a for a in got["advice"])
