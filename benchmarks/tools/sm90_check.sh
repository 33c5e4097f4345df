#!/usr/bin/env bash
# Build and run the sm_90a prefill check (benchmarks/tools/sm90_check.cu): correctness
# against an fp32 reference, then speed; the result table is printed last.
#   bash benchmarks/tools/sm90_check.sh              build, check every case, time the speed shapes
#   bash benchmarks/tools/sm90_check.sh --sanitize   also compute-sanitizer memcheck, racecheck and
#                                                    synccheck on the small cases (sm90_check --small)
#   bash benchmarks/tools/sm90_check.sh --build-only just the binary (ncu_prefill.sh uses it)
#   bash benchmarks/tools/sm90_check.sh --features   the window / softcap / sinks timings of issue 21
#                                                    (sm90_check --feature-speed), time ratios last
# Needs nvcc 12.8+ and a cc 9.x GPU.  The binary goes to ${OUT:-/tmp}/sm90_check; ptxas's
# report (registers, spills) to ${OUT:-/tmp}/sm90_check.ptxas.txt.  SM90_FLAGS adds nvcc flags
# (e.g. -DFMHA_SM90_D64_CONSUMERS=2 to build a variant; sm90_variants.sh does that).  The
# kernel instances are compiled from kernels/fwd_sm90_d*.hip (fwd_sm90.h declares them extern).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp}
NVCC=${NVCC:-nvcc}
command -v "$NVCC" >/dev/null || NVCC=/usr/local/cuda/bin/nvcc
"$NVCC" -std=c++17 -O3 -I csrc -I kernels -DFMHA_WITH_CUDA=1 \
  -gencode=arch=compute_90a,code=sm_90a -Werror=all-warnings -Xptxas -v,-warn-spills ${SM90_FLAGS:-} \
  -x cu benchmarks/tools/sm90_check.cu kernels/fwd_sm90_d*.hip -o "$out/sm90_check" 2> "$out/sm90_check.ptxas.txt" || {
  cat "$out/sm90_check.ptxas.txt"; exit 1; }
# the prefill kernels' lines of the report: registers, stack, spills
{ grep -A3 "Compiling entry function '_ZN4fmha4sm90" "$out/sm90_check.ptxas.txt" | grep -E "stack frame|registers" | sort | uniq -c; } || true
[ "${1:-}" = "--build-only" ] && exit 0
status=0
if [ "${1:-}" = "--sanitize" ]; then
  CS=${COMPUTE_SANITIZER:-compute-sanitizer}
  command -v "$CS" >/dev/null || CS=/usr/local/cuda/bin/compute-sanitizer
  for tool in memcheck racecheck synccheck; do
    echo "== compute-sanitizer --tool $tool"
    timeout 240 "$CS" --tool $tool --error-exitcode 3 "$out/sm90_check" --small 2>&1 | tail -4 || status=1
  done
fi
# A pipeline that hangs is stopped here; the rows finished before it are on stdout.
if [ "${1:-}" = "--features" ]; then
  timeout "${SM90_CHECK_TIMEOUT:-420}" "$out/sm90_check" --feature-speed || status=1
  exit $status
fi
timeout "${SM90_CHECK_TIMEOUT:-420}" "$out/sm90_check" || status=1
exit $status
