#!/usr/bin/env bash
# One device session in one call: build, SASS check, GPU parity sweep, the GPU
# part of the pytest suite, benchmarks. Stages are chosen by arguments
# (default: all): build sass check tests bench sweep sanitize.
# Logs and JSON go to $OUT; a compact table is printed last.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/fmha_out}
mkdir -p "$OUT"
stages=${*:-build sass check tests bench}
has() { [[ " $stages " == *" $1 "* ]]; }
status=0

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
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
  python3 benchmarks/sass_policy_check.py "$OUT/sass.txt" || status=1
fi
if has check; then
  python3 benchmarks/gpu_check.py > "$OUT/gpu_check.log" 2>&1 || status=1
  grep -E "FAIL|gpu_check:" "$OUT/gpu_check.log" | tail -25
fi
if has tests; then
  python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu.py > "$OUT/pytest_gpu.log" 2>&1 || status=1
  tail -15 "$OUT/pytest_gpu.log"
fi
if has fulltests; then
  python3 -m pytest -q -rs -p no:cacheprovider -n 8 tests > "$OUT/pytest_all.log" 2>&1 || status=1
  grep -E "FAILED|ERROR|passed|failed" "$OUT/pytest_all.log" | tail -30
fi
if has sanitize; then
  compute-sanitizer --tool memcheck --error-exitcode 3 python3 benchmarks/gpu_check.py --quick > "$OUT/memcheck.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|gpu_check:" "$OUT/memcheck.log" | tail -5
fi
if has cpubench; then
  python3 benchmarks/bench_cpu.py --threads 16 > "$OUT/bench_cpu.log" 2>&1 || status=1
  tail -15 "$OUT/bench_cpu.log"
fi
if has sweep; then
  python3 benchmarks/sweep_splits.py --json "$OUT/sweep.json" > "$OUT/sweep.log" 2>&1 || status=1
  tail -20 "$OUT/sweep.log"
fi
if has bench; then
  python3 benchmarks/bench.py --varlen --json "$OUT/bench.json" --plot "$OUT/bench.png" > "$OUT/bench.log" 2> "$OUT/bench_rows.log" || status=1
  cat "$OUT/bench.log"; tail -3 "$OUT/bench_rows.log"
fi
exit $status
