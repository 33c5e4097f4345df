#!/usr/bin/env bash
# One device session in one call, from the repository root: build and install the
# library, check the SASS, run the test suite (GPU tests included), memcheck a parity
# subset, and benchmark against torch SDPA's cuDNN and FlashAttention-2 backends in
# the same process.  Logs and JSON go to $OUT; a stage summary and the compact
# benchmark table are printed last.
#   bash benchmarks/tools/device_run.sh [STAGE ...]
# Stages (default: build sass tests sanitize bench):
#   build     pip install --no-build-isolation --no-deps . (log: build.log)
#   sass      cuobjdump the extension; HGMMA/HMMA/local-memory counts; unwritten policy registers
#   tests     the whole pytest suite, GPU tests included (pytest_all.log; -n 8 when pytest-xdist is there)
#   gputests  only tests/test_gpu.py and tests/test_gpu_parity.py (pytest_gpu.log)
#   check     only the GPU parity sweep, tests/test_gpu_parity.py (parity.log): the fast first look
#   sanitize  compute-sanitizer memcheck on the parity subset `-k quick` (memcheck.log)
#   bench     benchmarks/bench.py --varlen (bench.json, bench.png, bench.log; RESULTS tables in results_tables.md)
#   sweep     benchmarks/sweep_splits.py (sweep.json, sweep.log)
#   cpubench  benchmarks/bench_cpu.py --threads 16 (bench_cpu.log)
# BENCH_ARGS adds bench.py options (e.g. BENCH_ARGS="--set decode --reps 50").
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/fmha_out}
mkdir -p "$OUT"
stages=${*:-build sass tests sanitize bench}
has() { [[ " $stages " == *" $1 "* ]]; }
status=0
summary=()
# note NAME RC [LOG]: record a stage's outcome for the summary line; a failed stage shows
# the end of its log
note() {
  summary+=("$1:$([ "$2" -eq 0 ] && echo ok || echo "FAIL($2)")")
  if [ "$2" -ne 0 ]; then status=1; [ -n "${3:-}" ] && tail -5 "$3"; fi
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
git log -1 --format='tree at %h %s' 2>/dev/null | cut -c1-100
if has build; then
  start=$(date +%s)
  if ! python3 -m pip install --no-build-isolation --no-deps -q . > "$OUT/build.log" 2>&1; then
    tail -60 "$OUT/build.log"; exit 1
  fi
  echo "build: $(( $(date +%s) - start )) s"
  (cd /tmp && python3 -c "import fmha_native as f; print(f.info())")
fi
if has sass; then
  so=$(cd /tmp && python3 -c "import _fmha_native as c; print(c.__file__)")
  cuobjdump --dump-sass "$so" > "$OUT/sass.txt" 2>&1
  echo "sass: $(grep -c HGMMA "$OUT/sass.txt") HGMMA, $(grep -c HMMA "$OUT/sass.txt") HMMA, $(grep -cE 'LDL|STL' "$OUT/sass.txt") LDL/STL"
  python3 benchmarks/tools/sass_policy_check.py "$OUT/sass.txt"; note sass $?
fi
if has check; then
  python3 -m pytest -q -rs -p no:cacheprovider tests/test_gpu_parity.py > "$OUT/parity.log" 2>&1; note check $? "$OUT/parity.log"
  grep -E "FAILED|passed|failed|skipped in" "$OUT/parity.log" | tail -25
fi
xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
if has tests; then
  python3 -m pytest -q -rs -p no:cacheprovider $xdist tests > "$OUT/pytest_all.log" 2>&1; note tests $? "$OUT/pytest_all.log"
  grep -E "FAILED|ERROR|passed|failed|skipped in" "$OUT/pytest_all.log" | tail -30
fi
if has gputests; then
  python3 -m pytest -q -rs -p no:cacheprovider $xdist tests/test_gpu.py tests/test_gpu_parity.py \
    > "$OUT/pytest_gpu.log" 2>&1; note gputests $? "$OUT/pytest_gpu.log"
  grep -E "FAILED|ERROR|passed|failed|skipped in" "$OUT/pytest_gpu.log" | tail -15
fi
if has sanitize; then
  # pytest exits 1 on a failed case; compute-sanitizer exits 3 when it found errors.
  compute-sanitizer --tool memcheck --error-exitcode 3 \
    python3 -m pytest -q -p no:cacheprovider tests/test_gpu_parity.py -k quick > "$OUT/memcheck.log" 2>&1
  note sanitize $? "$OUT/memcheck.log"
  grep -E "ERROR SUMMARY| in [0-9.]+s" "$OUT/memcheck.log" | tail -5
fi
if has cpubench; then
  python3 benchmarks/bench_cpu.py --threads 16 > "$OUT/bench_cpu.log" 2>&1; note cpubench $? "$OUT/bench_cpu.log"
  tail -15 "$OUT/bench_cpu.log"
fi
if has sweep; then
  python3 benchmarks/sweep_splits.py --json "$OUT/sweep.json" > "$OUT/sweep.log" 2>&1; note sweep $? "$OUT/sweep.log"
  tail -20 "$OUT/sweep.log"
fi
if has bench; then
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
  python3 benchmarks/bench.py --varlen ${BENCH_ARGS:-} --json "$OUT/bench.json" --plot "$OUT/bench.png" \
    > "$OUT/bench.log" 2> "$OUT/bench_rows.log"; note bench $? "$OUT/bench_rows.log"
  tail -3 "$OUT/bench_rows.log"
  [ -s "$OUT/bench.json" ] && python3 benchmarks/results_tables.py --bench "$OUT/bench.json" > "$OUT/results_tables.md"
fi
echo "stages: ${summary[*]:-none}"
has bench && cat "$OUT/bench.log"
exit $status
