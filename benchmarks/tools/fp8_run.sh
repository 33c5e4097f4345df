#!/usr/bin/env bash
# One device call for the fp8 KV cache (issue 22) and the model features' head dims
# (issue 21), from the repository root: build (sm_90a); the GPU test files of
# TEST_FILES in one pytest (-n 8 with xdist); compute-sanitizer memcheck on a few fp8
# cases; then bench_features.py with ONLY (default: --only fp8) and the quick fp8 look
# (fp8_check.py).  Logs and JSON in $OUT; outcomes and tables printed last.
#   bash benchmarks/tools/fp8_run.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/fmha_out}
mkdir -p "$OUT"
FMHA_CUDA_ARCHS=${FMHA_CUDA_ARCHS:-90a} bash benchmarks/tools/device_run.sh build > "$OUT/build_stage.log" 2>&1 ||
  { tail -30 "$OUT/build_stage.log"; exit 1; }
xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
files=${TEST_FILES:-"tests/test_gpu_fp8.py tests/test_fp8.py tests/test_kvcache.py tests/test_paged.py"}
# shellcheck disable=SC2086  # lists of words
timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -rs -p no:cacheprovider $xdist $files > "$OUT/pytest_fp8.log" 2>&1
echo "tests rc=$?: $(tail -1 "$OUT/pytest_fp8.log")"
grep -E "^FAILED|^ERROR" "$OUT/pytest_fp8.log" | head -12
if [ "${MEMCHECK:-1}" = 1 ]; then
  timeout "${MEMCHECK_TIMEOUT:-150}" compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q \
    -p no:cacheprovider tests/test_gpu_fp8.py -k "${MEMCHECK_K:-paged or append or splits}" > "$OUT/memcheck_fp8.log" 2>&1
  echo "memcheck rc=$?: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_fp8.log" | tail -1) $(tail -1 "$OUT/memcheck_fp8.log")"
fi
# shellcheck disable=SC2086
timeout "${BENCH_TIMEOUT:-200}" python3 benchmarks/bench_features.py ${ONLY:---only fp8} --json "$OUT/features.json" \
  > "$OUT/features.log" 2> "$OUT/features_rows.log"
echo "bench rc=$?"; tail -2 "$OUT/features_rows.log"
timeout "${CHECK_TIMEOUT:-120}" python3 benchmarks/tools/fp8_check.py 2>&1 | grep -v "^ok " | tail -8
cat "$OUT/features.log"
