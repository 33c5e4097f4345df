#!/usr/bin/env bash
# Issue 20's device-sized chunks in one device call, from the repository root: build
# (FMHA_CUDA_ARCHS, default 90a), the GPU tests of device lengths (decode graph,
# KV cache, paged, varlen, fp8), compute-sanitizer memcheck on the device-chunk test,
# then benchmarks/tools/ragged_check.py (device vs host lengths) and the host cost.
# Logs go to $OUT; a summary and the ragged table are printed last.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/fmha_out}
mkdir -p "$OUT"
export FMHA_CUDA_ARCHS=${FMHA_CUDA_ARCHS:-90a}
summary=()
note() { summary+=("$1:$([ "$2" -eq 0 ] && echo ok || echo "FAIL($2)")"); }
if ! python3 -m pip install --no-build-isolation --no-deps -q . > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi
timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -x -p no:cacheprovider ${TESTS:-tests/test_gpu_decode_graph.py \
  tests/test_kvcache.py tests/test_paged.py tests/test_varlen.py tests/test_gpu_fp8.py} > "$OUT/tests.log" 2>&1
note tests $?
tail -3 "$OUT/tests.log"
python3 benchmarks/tools/ragged_check.py --reps "${REPS:-15}" > "$OUT/ragged.log" 2>&1; note ragged $?
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider \
  tests/test_gpu_decode_graph.py -k "device_sized or bad_device" > "$OUT/memcheck.log" 2>&1
note memcheck $?
grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck.log" | tail -3
python3 benchmarks/host_overhead.py > "$OUT/host_overhead.log" 2>&1; note hostcost $?
grep -E "forward\(out=, lse=\)|graph replay|SDPA" "$OUT/host_overhead.log"
echo "${summary[*]}"
cat "$OUT/ragged.log"
