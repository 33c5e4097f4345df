#!/bin/bash
# .ci/hip_build.sh: compile the AMD (HIP) path with Debian's hipcc and check what it embeds.
#
# There is no AMD GPU in CI: this proves the kernels compile for the AMD targets
# (warnings in our code are errors: setup.py passes -Wall -Werror to hipcc), that
# the extension embeds one amdgcn code object per arch the compiler can target,
# and that the HIP build imports and reports no device on a machine without one.
# It builds a wheel from a copy of the tree and installs it nowhere, so the
# environment the other CI steps test is left alone.
#
# Usage: .ci/hip_build.sh [repo root]   (root user or sudo for apt-get)
# Env:   FMHA_HIP_ARCHS (default gfx90a;gfx942, as setup.py)
#        FMHA_CI_REQUIRED_ARCHS: archs that must be embedded (default gfx90a;
#        Debian 12's clang 15 cannot target gfx942, so it is reported, not required)
set -euo pipefail

ROOT=$(cd "${1:-$(dirname "$0")/..}" && pwd)
REQUIRED_ARCHS=${FMHA_CI_REQUIRED_ARCHS:-gfx90a}
WORK=$(mktemp -d /tmp/fmha_hip_ci.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
SECONDS=0
phase() { echo "== [${SECONDS}s] $*"; }

phase "toolchain: Debian's hipcc (HIP 5.2, clang 15)"
if ! command -v hipcc >/dev/null || ! command -v roc-obj-ls >/dev/null; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    apt-cache policy hipcc | sed -n 1,3p
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends hipcc >/dev/null
fi
HIP_PLATFORM=amd hipcc --version 2>/dev/null | head -3  # (it probes for a GPU on stderr)

phase "copy the tree"
mkdir -p "$WORK/src"
(cd "$ROOT" && tar --exclude=.git --exclude=build --exclude='*.so' --exclude='*.egg-info' -cf - .) |
    tar -xf - -C "$WORK/src"

phase "build: FMHA_BACKENDS=hip pip wheel (no install)"
set +e
(cd "$WORK/src" && FMHA_BACKENDS=hip python3 -m pip wheel --no-build-isolation --no-deps -v \
     -w "$WORK/wheel" .) >"$WORK/build.log" 2>&1
rc=$?
set -e
grep -E "fmha_native build: hipcc cannot target|error|warning" "$WORK/build.log" | grep -v "^ *fmha_native build: /" || true
if [ $rc -ne 0 ]; then
    tail -60 "$WORK/build.log"
    echo "FAIL: the HIP build failed (rc=$rc)"
    exit 1
fi
# hipcc runs with -Werror; this also catches warnings the host C compiler gives our files.
if grep -E "^[[:space:]]*(\./)?(csrc|kernels)/[^ ]*: warning:" "$WORK/build.log"; then
    echo "FAIL: warnings in our code"
    exit 1
fi

phase "code objects embedded"
mkdir -p "$WORK/site"
python3 -m zipfile -e "$WORK"/wheel/fmha_native-*.whl "$WORK/site"
SO=$(ls "$WORK"/site/_fmha_native*.so)
roc-obj-ls "$SO" | awk '{print $2}' | sort | uniq -c
for arch in ${REQUIRED_ARCHS//;/ }; do
    if ! roc-obj-ls "$SO" | awk '{print $2}' | grep -qx "hipv4-amdgcn-amd-amdhsa--$arch"; then
        echo "FAIL: no $arch code object in $SO"
        exit 1
    fi
done
for arch in $(echo "${FMHA_HIP_ARCHS:-gfx90a;gfx942}" | tr ';' ' '); do
    if roc-obj-ls "$SO" | awk '{print $2}' | grep -qx "hipv4-amdgcn-amd-amdhsa--$arch"; then
        echo "$arch: embedded"
    elif grep -q "hipcc cannot target $arch" "$WORK/build.log"; then
        echo "$arch: not embedded (this hipcc cannot target it; the build said so)"
    else
        echo "FAIL: $arch neither embedded nor reported as skipped"
        exit 1
    fi
done

phase "import without an AMD GPU"
(cd "$WORK" && PYTHONPATH="$WORK/site" python3 -c '
import fmha_native
info = fmha_native.info()
print(info)
assert info["gpu_platform"] == "hip" and "hip" in info["backends"], info
assert info["devices"] == [], info
import numpy as np
q = np.zeros((1, 8, 2, 64), np.float16)
try:
    fmha_native.forward(q, q, q, device="gpu")
    raise SystemExit("FAIL: a GPU forward ran on a machine with no GPU")
except ValueError as err:
    print("GPU call refused cleanly:", err)
')
phase "done"
