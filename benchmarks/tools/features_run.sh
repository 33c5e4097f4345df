#!/usr/bin/env bash
# One device call for the model features (issue 21) on a 2-GPU machine, from the
# repository root: build; then side by side the Hopper kernel's feature tests and the
# torch-op / CUDA-graph tests on GPU 0 and benchmarks/bench_features.py (windows,
# softcap, sinks against the plain kernels) on GPU 1; then the NCCL worlds of
# tests/test_distributed.py on both.  Logs and JSON in $OUT; outcomes and the benchmark
# tables printed last.
#   bash benchmarks/tools/features_run.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export FMHA_NUM_THREADS=2 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/fmha_out}
mkdir -p "$OUT"
FMHA_CUDA_ARCHS=${FMHA_CUDA_ARCHS:-90a} bash benchmarks/tools/device_run.sh build || exit 1
xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
rc() { echo "$1 rc=$2" >> "$OUT/rc.txt"; }
(
  CUDA_VISIBLE_DEVICES=0 timeout "${SM90_TIMEOUT:-130}" python3 -m pytest -q -p no:cacheprovider $xdist \
    tests/test_gpu_sm90.py -k "windows or window or softcap or sinks or features" > "$OUT/sm90_features.log" 2>&1
  rc sm90_features $?
  CUDA_VISIBLE_DEVICES=0 timeout "${TORCH_TIMEOUT:-90}" python3 -m pytest -q -p no:cacheprovider $xdist \
    tests/test_torch_op.py tests/test_gpu_decode_graph.py > "$OUT/torch_graph.log" 2>&1
  rc torch_graph $?
) &
(
  CUDA_VISIBLE_DEVICES=1 timeout "${BENCH_TIMEOUT:-200}" python3 benchmarks/bench_features.py \
    ${FEATURES_ARGS:---only window --only cost} --json "$OUT/features.json" \
    > "$OUT/features.log" 2> "$OUT/features_rows.log"
  rc features_bench $?
) &
wait
timeout "${NCCL_TIMEOUT:-90}" python3 -m pytest -q -p no:cacheprovider $xdist tests/test_distributed.py -k nccl \
  > "$OUT/nccl.log" 2>&1
rc distributed_nccl $?
cat "$OUT/rc.txt"
for f in sm90_features torch_graph nccl; do
  echo "== $f"; grep -E "^FAILED|^ERROR" "$OUT/$f.log" | head -6; tail -1 "$OUT/$f.log"
done
tail -3 "$OUT/features_rows.log"
cat "$OUT/features.log"
