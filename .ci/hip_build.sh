#!/bin/bash
# .ci/hip_build.sh: compile the AMD (HIP) path and check what the module embeds.
#
# There is no AMD GPU in CI: this proves the kernels compile for the AMD targets
# (warnings in our code are errors: setup.py passes -Wall -Werror), that the
# extension embeds one amdgcn code object per arch the compiler can target, that
# FMHA_HIP_ARCHS_BUILT (the runtime gate's list, csrc/plan.c) names exactly those,
# and that the HIP build imports and reports no device on a machine without one.
# Each build makes a wheel from a copy of the tree and installs it nowhere, so the
# environment the other CI steps test is left alone. pip builds it with build
# isolation (the setuptools that pyproject.toml asks for, not the machine's own).
#
# Two toolchains, both from Debian 12's own packages:
#   1. hipcc 5.2 (clang 15), what `FMHA_BACKENDS=hip pip install .` uses on Debian:
#      gfx90a. clang 15 cannot target gfx942; the build reports that and skips it.
#   2. clang-19 (bookworm) with Debian's HIP 5.2 headers and device libraries:
#      gfx942 (MI300, the split-K seeds' own target). gfx950 is asked for too and
#      reported: clang 19 does not know it (LLVM 20 added it).
#
# Usage: .ci/hip_build.sh [repo root]   (root user or sudo for apt-get)
# Env:   FMHA_CI_HIP_JOBS: parallel kernel compiles (default 2)
#        FMHA_CI_HIP_BUILDS: which builds, default "hipcc-5.2 clang-19"
set -euo pipefail

ROOT=$(cd "${1:-$(dirname "$0")/..}" && pwd)
WORK=$(mktemp -d /tmp/fmha_hip_ci.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
SECONDS=0
phase() { echo "== [${SECONDS}s] $*"; }

phase "toolchains: Debian's hipcc (HIP 5.2, clang 15) and clang-19"
need=()
command -v hipcc >/dev/null && command -v roc-obj-ls >/dev/null || need+=(hipcc)
command -v clang++-19 >/dev/null || need+=(clang-19)
command -v ld.lld-19 >/dev/null || need+=(lld-19)               # clang's amdgcn linker
command -v clang-offload-bundler-19 >/dev/null || need+=(clang-tools-19)  # the fat object
if [ ${#need[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    apt-cache policy "${need[@]}" | grep -E '^[^ ]|Candidate'
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        "${need[@]}" >/dev/null
fi
HIP_PLATFORM=amd hipcc --version 2>/dev/null | head -3  # (it probes for a GPU on stderr)
clang++-19 --version | head -1

phase "copy the tree"
mkdir -p "$WORK/src"
(cd "$ROOT" && tar --exclude=.git --exclude=build --exclude='*.so' --exclude='*.egg-info' \
     -cf - .) | tar -xf - -C "$WORK/src"

# Debian's device libraries (ROCm 5.2) predate gfx942: they lack the one-constant
# module oclc_isa_version_942.bc that clang links to tell the libraries the ISA
# version (9.4.2). A private copy of the library folder gets it, made by clang-19.
phase "device libraries for clang-19 (Debian's, plus the gfx942 ISA version)"
DEVLIBS="$WORK/devlibs"
mkdir -p "$DEVLIBS"
DEBIAN_BITCODE=/usr/lib/x86_64-linux-gnu/amdgcn/bitcode
ln -s "$DEBIAN_BITCODE"/*.bc "$DEVLIBS"/
if [ ! -e "$DEVLIBS/oclc_isa_version_942.bc" ]; then
    echo 'const __constant int __oclc_ISA_version = 9402;' >"$WORK/isa942.cl"
    clang-19 -x cl -cl-std=CL2.0 -target amdgcn-amd-amdhsa -mcpu=gfx942 -nogpulib \
        -fvisibility=protected -c -emit-llvm "$WORK/isa942.cl" -o "$DEVLIBS/oclc_isa_version_942.bc"
fi

# build NAME COMPILER ARCHS REQUIRED [KERNEL FLAGS]: build a wheel, check it.
build() {
    local name=$1 compiler=$2 archs=$3 required=$4 flags=${5:-}
    local dir="$WORK/$name" log="$WORK/$name/build.log" rc
    mkdir -p "$dir"
    rm -rf "$WORK/src/build"
    phase "$name: FMHA_BACKENDS=hip FMHA_HIPCC=$compiler FMHA_HIP_ARCHS=$archs pip wheel"
    set +e
    (cd "$WORK/src" && FMHA_BACKENDS=hip FMHA_HIPCC="$compiler" FMHA_HIP_ARCHS="$archs" \
        FMHA_KERNEL_FLAGS="$flags" FMHA_NVCC_THREADS="${FMHA_CI_HIP_JOBS:-2}" \
        python3 -m pip wheel --no-deps -v -w "$dir/wheel" .) >"$log" 2>&1
    rc=$?
    set -e
    grep -E "fmha_native build: .*cannot target|error|warning" "$log" |
        grep -vE "^ *fmha_native build: /|^ *(WARNING|warning): (Location|build_py|install_lib|no previously-included)" || true
    if [ $rc -ne 0 ]; then
        tail -60 "$log"
        echo "FAIL: the $name HIP build failed (rc=$rc)"
        exit 1
    fi
    # The compilers run with -Werror; this also catches warnings the host C
    # compiler gives our files.
    if grep -E "^[[:space:]]*(\./)?(csrc|kernels)/[^ ]*: warning:" "$log"; then
        echo "FAIL: warnings in our code ($name)"
        exit 1
    fi

    phase "$name: code objects embedded"
    mkdir -p "$dir/site"
    python3 -m zipfile -e "$dir"/wheel/fmha_native-*.whl "$dir/site"
    local so
    so=$(ls "$dir"/site/_fmha_native*.so)
    # Listed once into a variable: `producer | grep -q` under pipefail fails when
    # grep stops reading early and the producer gets SIGPIPE.
    local objs strs
    objs=$(roc-obj-ls "$so" | awk '{print $2}')
    strs=$(strings -a "$so")
    sort <<<"$objs" | uniq -c
    local arch embedded=()
    for arch in ${required//;/ }; do
        if ! grep -qx "hipv4-amdgcn-amd-amdhsa--$arch" <<<"$objs"; then
            echo "FAIL: no $arch code object in $so ($name)"
            exit 1
        fi
    done
    for arch in ${archs//;/ }; do
        if grep -qx "hipv4-amdgcn-amd-amdhsa--$arch" <<<"$objs"; then
            echo "$arch: embedded"
            embedded+=("$arch")
        elif grep -q "cannot target $arch" "$log"; then
            echo "$arch: not embedded (this compiler cannot target it; the build said so above)"
        else
            echo "FAIL: $arch neither embedded nor reported as skipped ($name)"
            exit 1
        fi
    done
    # The runtime gate compares the device's gcnArchName with FMHA_HIP_ARCHS_BUILT:
    # the list compiled into the module must be the archs embedded, in order.
    local want
    want=$(IFS=';'; echo "${embedded[*]}")
    # (The compiler may keep it only inside the gate's message "AMD <list>".)
    if ! grep -qxE "(AMD )?$want" <<<"$strs"; then
        echo "FAIL: FMHA_HIP_ARCHS_BUILT in $so is not \"$want\" ($name):"
        grep -E '^(AMD )?gfx[0-9a-z;]+$' <<<"$strs" || true
        exit 1
    fi
    echo "FMHA_HIP_ARCHS_BUILT: \"$want\""

    phase "$name: import without an AMD GPU"
    (cd "$WORK" && PYTHONPATH="$dir/site" python3 -c '
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
}

for which in ${FMHA_CI_HIP_BUILDS:-hipcc-5.2 clang-19}; do
    case $which in
    hipcc-5.2) build hipcc-5.2 hipcc "gfx90a;gfx942" gfx90a ;;
    # hipcc's own defaults for the kernels' code generation, given to clang directly.
    clang-19) build clang-19 clang++-19 "gfx942;gfx950" gfx942 \
        "--rocm-path=/usr --hip-device-lib-path=$DEVLIBS -mllvm -amdgpu-early-inline-all=true -mllvm -amdgpu-function-calls=false" ;;
    *) echo "FAIL: unknown build $which (FMHA_CI_HIP_BUILDS: hipcc-5.2, clang-19)"; exit 1 ;;
    esac
done
phase "done"
