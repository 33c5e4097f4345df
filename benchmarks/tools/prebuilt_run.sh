#!/usr/bin/env bash
# One device call over extensions built beforehand on the development machine and carried
# (no build on the device): tree_tests.sh's GPU test files side by side, the sanitizers
# on the Hopper kernel's new paths, then the benchmarks against the peers; logs and JSON
# in $OUT, the outcomes and tables printed last.
#   bash benchmarks/tools/prebuilt_run.sh [STAGE ...]      (default: tests bench)
# Stages:
#   tests     TEST_SPECS (tree_tests.sh arguments) under FILE_TIMEOUT, VARIANT_TEST_SPECS in
#             each tree of TREES, and beside them memcheck, racecheck and synccheck
#             (SANITIZE_TOOLS) of SANITIZE_FILE (test_gpu_sm90.py) -k SANITIZE_K in SANITIZE_TREE
#   bench     benchmarks/bench.py --varlen --reps 20 (bench.json, results_tables.md) and
#             bench_features.py FEATURES_ARGS (features.json)
#   trees     compare_trees.sh NO_BUILD=1 "$COMPARE_ARGS" 2 . $TREES (BENCH/FIELDS as there)
#   sweep     benchmarks/sweep_splits.py $SWEEP_ARGS (sweep.json)
#   features  bench_features.py FEATURES_ARGS alone (as in bench)
#   serving   issue 20's rows: host_overhead.py twice and ragged_check.py --reps RAGGED_REPS
#             in RAGGED_ROUNDS rounds (host.log, ragged<round>.json)
#   ncu       ncu_decode.sh over NCU_SHAPES (one "B HQ HKV SQ SK D" each, LENS as there) in
#             this tree (and cuDNN) and each of TREES: kernel-only durations
# The extensions are built on the development machine for the device's Python (3.12, as
# KINDS.md lists it): `FMHA_CUDA_ARCHS=90a python3.12 setup.py build_ext --inplace` in a
# copy of this tree, the module xz-compressed (about 12 of its 41 MB) to .pre/main.so.xz,
# and .pre (ignored through .git/info/exclude) named in the call's `carry`.  A tree of
# TREES that is not here, trees/NAME, is made from this tree's fmha_native/ and tests/ and
# .pre/NAME.so.xz: the same sources built with other kernel flags (a knob's -D).  A tree
# with no extension for this python3 stops the call before any GPU time is spent on it.
set -uo pipefail
export PYTHONUNBUFFERED=1 FMHA_NUM_THREADS=2
OUT=${OUT:-/tmp/fmha_out}
mkdir -p "$OUT"
here=$(pwd)
stages=${*:-tests bench}
has() { [[ " $stages " == *" $1 "* ]]; }
suffix=$(python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
unpack() {  # unpack NAME TREE: .pre/NAME.so.xz into TREE's extension
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
    ".pre/$1.so.xz" "$2/_fmha_native$suffix"
}
[ -f ".pre/main.so.xz" ] && unpack main .
for t in ${TREES:-}; do
  # (a warm machine keeps an earlier call's trees/NAME extension, ignored, but not its
  # package, untracked here: remade then)
  [ -d "$t/fmha_native" ] && [ -f "$t/_fmha_native$suffix" ] && continue
  mkdir -p "$t" && cp -r fmha_native tests "$t"/ && unpack "$(basename "$t")" "$t"
done
for t in . ${TREES:-}; do
  [ -f "$t/_fmha_native$suffix" ] || { echo "$t: no _fmha_native$suffix (build it first)"; exit 1; }
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
(cd /tmp && PYTHONPATH="$here" python3 -c "import fmha_native as f; i = f.info(); print({k: i[k] for k in ('version', 'backends') if k in i})")
if has tests; then
  start=$(date +%s)
  sanitize() {  # sanitize TOOL: SANITIZE_FILE's -k SANITIZE_K subset in SANITIZE_TREE under one tool
    (cd "$here/${SANITIZE_TREE:-.}" && PYTHONPATH=$(pwd) timeout "${SANITIZE_TIMEOUT:-240}" compute-sanitizer --tool "$1" --error-exitcode 3 \
      python3 -m pytest -q -p no:cacheprovider "${SANITIZE_FILE:-tests/test_gpu_sm90.py}" -k "${SANITIZE_K:-gqa_ratios or packed_qkv}" \
      > "$OUT/sm90_$1.log" 2>&1)
    local rc=$?
    echo "[$(( $(date +%s) - start )) s rc=$rc] ${SANITIZE_TREE:-.} ${SANITIZE_FILE:-sm90} $1 (-k ${SANITIZE_K:-gqa_ratios or packed_qkv}):" \
      "$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sm90_$1.log" | tail -1); $(grep -E "passed|failed" "$OUT/sm90_$1.log" | tail -1)"
  }
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do sanitize "$tool" & done
  # shellcheck disable=SC2086  # TEST_SPECS is a list of tree_tests.sh arguments
  eval "set -- ${TEST_SPECS:-tests/test_gpu.py}"
  FILE_TIMEOUT=${FILE_TIMEOUT:-240} bash benchmarks/tools/tree_tests.sh "$@" &
  # VARIANT_TEST_SPECS: the same in each tree of TREES, side by side
  if [ -n "${VARIANT_TEST_SPECS:-}" ]; then
    eval "set -- $VARIANT_TEST_SPECS"
    for t in ${TREES:-}; do TREE=$t FILE_TIMEOUT=${FILE_TIMEOUT:-240} bash benchmarks/tools/tree_tests.sh "$@" & done
  fi
  wait
  tar -czf "$OUT/test_logs.tgz" -C "$OUT" $(cd "$OUT" && ls tests_*.log sm90_*.log 2>/dev/null) &&
    (cd "$OUT" && rm -f tests_*.log sm90_*.log)
fi
if has bench; then
  (cd /tmp && PYTHONPATH="$here" timeout "${BENCH_TIMEOUT:-170}" python3 "$here/benchmarks/bench.py" --varlen --reps 20 --json "$OUT/bench.json" \
     > "$OUT/bench.log" 2> "$OUT/bench_rows.log") || tail -5 "$OUT/bench_rows.log"
  [ -s "$OUT/bench.json" ] && python3 benchmarks/results_tables.py --bench "$OUT/bench.json" > "$OUT/results_tables.md"
fi
if has bench || has features; then
  # shellcheck disable=SC2086  # FEATURES_ARGS is a list of options
  (cd /tmp && PYTHONPATH="$here" timeout "${FEATURES_TIMEOUT:-150}" python3 "$here/benchmarks/bench_features.py" ${FEATURES_ARGS:---only cost --only head_dim} \
     --json "$OUT/features.json" > "$OUT/features.log" 2> "$OUT/features_rows.log") || tail -5 "$OUT/features_rows.log"
fi
if has trees; then
  # shellcheck disable=SC2086  # TREES is a list of directories
  NO_BUILD=1 COMPARE_DIR=${COMPARE_DIR:-compare} bash benchmarks/tools/compare_trees.sh "${COMPARE_ARGS:---set all}" \
    "${COMPARE_ROUNDS:-2}" . $TREES > "$OUT/${COMPARE_DIR:-compare}.log" 2>&1
fi
if has sweep; then
  # shellcheck disable=SC2086  # SWEEP_ARGS is a list of options
  (cd /tmp && PYTHONPATH="$here" timeout "${SWEEP_TIMEOUT:-300}" python3 "$here/benchmarks/sweep_splits.py" ${SWEEP_ARGS:-} \
     --json "$OUT/sweep.json" > "$OUT/sweep.log" 2>&1) || echo "sweep: rc=$?"
fi
if has serving; then
  for r in 1 2; do
    (cd /tmp && PYTHONPATH="$here" timeout 100 python3 "$here/benchmarks/host_overhead.py" >> "$OUT/host.log" 2>&1)
  done
  for r in $(seq "${RAGGED_ROUNDS:-2}"); do
    (cd /tmp && PYTHONPATH="$here" timeout "${RAGGED_TIMEOUT:-150}" python3 "$here/benchmarks/tools/ragged_check.py" \
       --reps "${RAGGED_REPS:-21}" --json "$OUT/ragged$r.json" > "$OUT/ragged$r.log" 2>&1) || echo "ragged round $r: rc=$?"
  done
fi
if has ncu; then
  eval "set -- ${NCU_SHAPES:-\"1 32 8 1 4097 128\"}"
  for t in . ${TREES:-}; do
    echo "== ncu_decode: $t" >> "$OUT/ncu.log"
    # cuDNN's kernels once, beside this tree's
    WHO=$([ "$t" = . ] && echo "ours cudnn" || echo ours) PYTHONPATH="$here/$t" timeout "${NCU_TIMEOUT:-200}" \
      bash benchmarks/tools/ncu_decode.sh "$@" >> "$OUT/ncu.log" 2>&1
  done
fi
(has bench || has features) && cat "$OUT/features.log"
has bench && cat "$OUT/bench.log"
has sweep && tail -25 "$OUT/sweep.log"
has trees && sed -n '/^median/,$p' "$OUT/${COMPARE_DIR:-compare}.log"
has serving && { grep -E "forward\(out=, lse=\)|graph replay|SDPA" "$OUT/host.log"; for r in $(seq "${RAGGED_ROUNDS:-2}"); do tail -20 "$OUT/ragged$r.log"; done; }
has ncu && cat "$OUT/ncu.log"
# Everything in $OUT goes into one archive (the device tool returns at most 8 files), so
# calls of this script in one device command keep their files apart with OUT_TAG.
(cd "$OUT" && tar -czf "out_${OUT_TAG:-$$}.tgz" --exclude='out_*.tgz' --remove-files -- * 2>/dev/null)
exit 0
