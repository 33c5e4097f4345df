#!/usr/bin/env bash
# One device call for the fp8 KV cache (issue 22), from the repository root: build
# (sm_90a), the quick fp8 look (fp8_check.py: GPU against the reference, fp8 against
# bf16 decode times), the GPU test files of TEST_FILES one by one (device_run.sh files),
# and with FP8_BENCH=1 the benchmark rows of bench_features.py --only fp8.  Logs in
# $OUT; the check's table printed last.
#   bash benchmarks/tools/fp8_run.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/fmha_out}
mkdir -p "$OUT"
FMHA_CUDA_ARCHS=${FMHA_CUDA_ARCHS:-90a} bash benchmarks/tools/device_run.sh build || exit 1
timeout "${CHECK_TIMEOUT:-240}" python3 benchmarks/tools/fp8_check.py > "$OUT/fp8_check.log" 2>&1
echo "fp8_check rc=$?"
TEST_FILES=${TEST_FILES:-"test_fp8 test_gpu_fp8 test_kvcache test_paged"} \
  bash benchmarks/tools/device_run.sh files
if [ "${FP8_BENCH:-0}" = 1 ]; then
  timeout "${BENCH_TIMEOUT:-200}" python3 benchmarks/bench_features.py --only fp8 \
    --json "$OUT/fp8.json" > "$OUT/fp8_bench.log" 2> "$OUT/fp8_bench_rows.log"
  echo "fp8 bench rc=$?"; tail -3 "$OUT/fp8_bench_rows.log"; cat "$OUT/fp8_bench.log"
fi
cat "$OUT/fp8_check.log"
