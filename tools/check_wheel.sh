#!/usr/bin/env bash
# Check that stoker's wheel carries the fast path (run by .ci/run):
#
#   tools/check_wheel.sh        (PYTHON=python3.12 picks the Python, as for build_wheel.sh)
#
# builds the wheel (tools/build_wheel.sh), installs it (with its vision extra) into a fresh
# venv, and fails unless `stoker doctor --json` there reports every native kernel and
# libjpeg-turbo linked in statically, `ldd` of the extension lists no libjpeg, and the
# installed kernels pass tests/test_vision_native.py (against simplejpeg and Pillow).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$root/tools/build_wheel.sh" "$work/dist"
"$python" -m venv "$work/venv"
wheel=$(ls "$work"/dist/stoker-*.whl)
"$work/venv/bin/pip" install -q --disable-pip-version-check "$wheel[vision]"
cd "$work" # not the checkout: Python must import the installed stoker
"$work/venv/bin/stoker" doctor --json >doctor.json
so=$("$work/venv/bin/python" -c 'import stoker.vision._native as n; print(n.__file__)')
"$work/venv/bin/python" - doctor.json "$so" <<'EOF'
import json
import sys

fast = json.load(open(sys.argv[1]))["sections"]["Fast paths"]
want = {
    "native kernels": f"built ({sys.argv[2]})",
    "native decode": "built",
    "libjpeg-turbo": "2.1.5 (linked in statically)",
    "native resampler": "stoker's C resampler",
    "native normalise": "stoker's C kernel",
}
wrong = {k: fast.get(k) for k, v in want.items() if fast.get(k) != v}
if wrong or fast.get("instruction set") not in ("avx2", "c"):
    sys.exit(f"stoker doctor in the wheel's venv: want {want}, got {fast}")
print("stoker doctor:", json.dumps({k: fast[k] for k in (*want, "instruction set")}))
EOF
libs=$(ldd "$so")
echo "$libs"
if grep -qi jpeg <<<"$libs"; then
    echo "check_wheel: the installed extension loads a libjpeg of this machine" >&2
    exit 1
fi
# From the checkout's root, src/ is not on the path: the tests import the installed stoker.
"$work/venv/bin/pip" install -q --disable-pip-version-check pytest pytest-timeout
cd "$root"
STOKER_REQUIRE_NATIVE=1 "$work/venv/bin/python" -m pytest -q -p no:cacheprovider \
    tests/test_vision_native.py
echo "check_wheel: ok"
