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
#   files     the GPU-touching test files listed in TEST_FILES (default: the serving, sm90,
#             KV-cache, torch-op and GPU files), one pytest each under its own timeout
#             (FILE_TIMEOUT, default 150 s), -v so a killed file still shows its results;
#             files spread over the visible GPUs, one lane each (GPU_LANES), then the
#             files of TEST_FILES_ALL_GPUS with every GPU visible; logs in
#             pytest_logs.tgz; CPU workers capped at 2 threads each
#   check     only the GPU parity sweep, tests/test_gpu_parity.py (parity.log): the fast first look
#   sanitize  compute-sanitizer memcheck on the parity subset `-k quick` (memcheck.log)
#   bench     benchmarks/bench.py --varlen (bench.json, bench.png, bench.log; RESULTS tables in results_tables.md)
#   oldkernel the GPU parity and API tests again with FMHA_GPU_PREFILL_KERNEL=mma (the
#             pre-Hopper tensor-core kernel for every prefill) (pytest_mma.log)
#   compare   bench.py in separate processes, COMPARE_ROUNDS rounds (default 2), on: the tree
#             at trees/old (made here before the call: `git archive <rev> | tar -x -C
#             trees/old`; built in place), this tree with FMHA_GPU_PREFILL_KERNEL=mma, and
#             this tree as installed; a table of median ours_ms per row and the ratios
#   sweep     benchmarks/sweep_splits.py (sweep.json, sweep.log)
#   cpubench  benchmarks/bench_cpu.py --threads 16 (bench_cpu.log)
#   serving   benchmarks/bench_serving.py: paged decode vs contiguous, varlen vs dense
#             (serving.json, serving.log)
#   hostcost  benchmarks/host_overhead.py (host_overhead.log)
#   features  benchmarks/bench_features.py: windows, softcap and sinks against the plain
#             kernels (features.json, features.log)
#   cp        benchmarks/bench_cp.py under torchrun, one process per visible GPU, NCCL
#             (cp.json, cp.log); nvidia-smi topo -m first (topo.log)
# BENCH_ARGS adds bench.py options (e.g. BENCH_ARGS="--set decode --reps 50").
set -uo pipefail
export PYTHONUNBUFFERED=1
# NVLink multicast stays off on shared multi-GPU hosts (KINDS.md), in every child too.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
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
  # test_build.py (marked slow) rebuilds the package several times: CI runs it, not the device.
  python3 -m pytest -q -rs -p no:cacheprovider $xdist -m "not slow" tests > "$OUT/pytest_all.log" 2>&1
  note tests $? "$OUT/pytest_all.log"
  grep -E "FAILED|ERROR|passed|failed|skipped in" "$OUT/pytest_all.log" | tail -30
fi
if has gputests; then
  python3 -m pytest -q -rs -p no:cacheprovider $xdist tests/test_gpu.py tests/test_gpu_parity.py \
    > "$OUT/pytest_gpu.log" 2>&1; note gputests $? "$OUT/pytest_gpu.log"
  grep -E "FAILED|ERROR|passed|failed|skipped in" "$OUT/pytest_gpu.log" | tail -15
fi
if has files; then
  files=${TEST_FILES:-"test_gpu_sm90 test_varlen test_paged test_gpu_decode_graph test_torch_op test_gpu test_kvcache"}
  # One lane per visible GPU (GPU_LANES to override): lane g runs every g-th file on GPU g.
  lanes=${GPU_LANES:-$(nvidia-smi -L | wc -l)}
  [ "$lanes" -ge 1 ] || lanes=1
  run_file() {  # run_file FILE GPU: one pytest under its timeout; "FILE rc seconds" to files.rc
    local start; start=$(date +%s)
    CUDA_VISIBLE_DEVICES=$2 FMHA_NUM_THREADS=2 timeout "${FILE_TIMEOUT:-150}" python3 -m pytest -v -rs \
      -p no:cacheprovider $xdist "tests/$1.py" > "$OUT/pytest_$1.log" 2>&1
    echo "$1 $? $(( $(date +%s) - start ))" >> "$OUT/files.rc"
  }
  rm -f "$OUT/files.rc"
  i=0; lane_files=()
  for f in $files; do lane_files[i % lanes]+=" $f"; i=$((i + 1)); done
  for g in $(seq 0 $((lanes - 1))); do
    (for f in ${lane_files[g]:-}; do run_file "$f" "$g"; done) &
  done
  wait
  # files that need every GPU (NCCL worlds): after the lanes, all GPUs visible
  for f in ${TEST_FILES_ALL_GPUS:-}; do run_file "$f" "$(seq -s, 0 $((lanes - 1)))"; done
  files="$files ${TEST_FILES_ALL_GPUS:-}"
  for f in $files; do
    read -r _ rc secs < <(grep "^$f " "$OUT/files.rc")
    note "$f" "${rc:-1}"
    echo "$f: rc=${rc:-?} ${secs:-?} s, $(grep -c ' PASSED' "$OUT/pytest_$f.log") passed," \
         "$(grep -c ' SKIPPED' "$OUT/pytest_$f.log") skipped, $(grep -cE ' FAILED| ERROR' "$OUT/pytest_$f.log") failed"
    grep -E "^FAILED|^ERROR|\] (FAILED|ERROR) " "$OUT/pytest_$f.log" | head -8
  done
  # the logs travel as one archive (the device tool returns a limited number of files)
  tar -czf "$OUT/pytest_logs.tgz" -C "$OUT" $(cd "$OUT" && ls pytest_*.log) && rm -f "$OUT"/pytest_*.log
fi
if has oldkernel; then
  FMHA_GPU_PREFILL_KERNEL=mma python3 -m pytest -q -rs -p no:cacheprovider $xdist tests/test_gpu.py \
    tests/test_gpu_parity.py tests/test_kvcache.py tests/test_splits.py > "$OUT/pytest_mma.log" 2>&1
  note oldkernel $? "$OUT/pytest_mma.log"
  grep -E "FAILED|ERROR|passed|failed|skipped in" "$OUT/pytest_mma.log" | tail -10
fi
if has sanitize; then
  # pytest exits 1 on a failed case; compute-sanitizer exits 3 when it found errors.
  compute-sanitizer --tool memcheck --error-exitcode 3 \
    python3 -m pytest -q -p no:cacheprovider tests/test_gpu_parity.py -k quick > "$OUT/memcheck.log" 2>&1
  note sanitize $? "$OUT/memcheck.log"
  grep -E "ERROR SUMMARY| in [0-9.]+s" "$OUT/memcheck.log" | tail -5
  # the Hopper kernel's pipeline (mbarriers, named barriers) under all three tools, and the
  # decode path's invalid device lengths under memcheck
  for tool in memcheck racecheck synccheck; do
    timeout 200 compute-sanitizer --tool $tool --error-exitcode 3 python3 -m pytest -q -p no:cacheprovider \
      tests/test_gpu_sm90.py -k "gqa_ratios or packed_qkv" > "$OUT/sm90_$tool.log" 2>&1
    note "sm90_$tool" $? "$OUT/sm90_$tool.log"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY| in [0-9.]+s" "$OUT/sm90_$tool.log" | tail -2
  done
  compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m pytest -q -p no:cacheprovider \
    tests/test_gpu_decode_graph.py > "$OUT/decode_memcheck.log" 2>&1
  note decode_memcheck $? "$OUT/decode_memcheck.log"
  grep -E "ERROR SUMMARY| in [0-9.]+s" "$OUT/decode_memcheck.log" | tail -2
fi
if has cpubench; then
  python3 benchmarks/bench_cpu.py --threads 16 > "$OUT/bench_cpu.log" 2>&1; note cpubench $? "$OUT/bench_cpu.log"
  tail -15 "$OUT/bench_cpu.log"
fi
if has sweep; then
  python3 benchmarks/sweep_splits.py --json "$OUT/sweep.json" > "$OUT/sweep.log" 2>&1; note sweep $? "$OUT/sweep.log"
  tail -20 "$OUT/sweep.log"
fi
if has compare; then
  here=$(pwd)
  if [ -d trees/old ]; then
    (cd trees/old && FMHA_CUDA_ARCHS=90a python3 setup.py build_ext --inplace -q > "$OUT/build_old.log" 2>&1)
    note build_old $? "$OUT/build_old.log"
  fi
  cfgs="mma auto"; [ -d trees/old ] && cfgs="old $cfgs"
  for r in $(seq "${COMPARE_ROUNDS:-2}"); do
    for cfg in $cfgs; do
      pp=""; kern=auto
      [ "$cfg" = old ] && pp="$here/trees/old/src"
      [ "$cfg" = mma ] && kern=mma
      # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
      (cd /tmp && FMHA_GPU_PREFILL_KERNEL=$kern PYTHONPATH="$pp" python3 "$here/benchmarks/bench.py" \
         --no-check ${BENCH_ARGS:-} --json "$OUT/cmp_${cfg}_$r.json" > /dev/null 2>> "$OUT/compare.log")
      note "compare_${cfg}_$r" $? "$OUT/compare.log"
    done
  done
  python3 - "$OUT" $cfgs > "$OUT/compare.md" <<'PY'
import glob, json, os, statistics, sys
out, cfgs = sys.argv[1], sys.argv[2:]
rows = {}
for cfg in cfgs:
    for path in sorted(glob.glob(os.path.join(out, f"cmp_{cfg}_*.json"))):
        for row in json.load(open(path))["rows"]:
            r = rows.setdefault(tuple(row["shape"]), {})
            r.setdefault(cfg, []).append(row["ours_ms"])
            if cfg == cfgs[-1]:
                r["kernel"] = row.get("kernel", "")
                for peer in ("cudnn", "flash"):
                    if row.get(peer + "_ms"):
                        r.setdefault(peer, []).append(row[peer + "_ms"])
med = lambda xs: statistics.median(xs) if xs else None
head = "| shape | " + " | ".join(f"{c} ms" for c in cfgs) + " | cuDNN ms | FA2 ms | " + \
       " | ".join(f"{c}/{cfgs[0]}" for c in cfgs[1:]) + f" | {cfgs[-1]} vs cuDNN | kernel ({cfgs[-1]}) |"
print(head); print("|" + "---|" * (head.count("|") - 1))
for shape, r in rows.items():
    m = {c: med(r.get(c, [])) for c in cfgs}
    cu, fa = med(r.get("cudnn", [])), med(r.get("flash", []))
    f = lambda x, s=".4f": format(x, s) if x else "-"
    ratios = " | ".join(f(m[c] / m[cfgs[0]], ".3f") if m[c] and m[cfgs[0]] else "-" for c in cfgs[1:])
    vs = f(cu / m[cfgs[-1]], ".3f") + "x" if cu and m[cfgs[-1]] else "-"
    print(f"| {shape} | " + " | ".join(f(m[c]) for c in cfgs) + f" | {f(cu)} | {f(fa)} | {ratios} | {vs} | {r.get('kernel', '')} |")
PY
fi
if has bench; then
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
  python3 benchmarks/bench.py --varlen ${BENCH_ARGS:-} --json "$OUT/bench.json" --plot "$OUT/bench.png" \
    > "$OUT/bench.log" 2> "$OUT/bench_rows.log"; note bench $? "$OUT/bench_rows.log"
  tail -3 "$OUT/bench_rows.log"
  [ -s "$OUT/bench.json" ] && python3 benchmarks/results_tables.py --bench "$OUT/bench.json" > "$OUT/results_tables.md"
fi
if has serving; then
  python3 benchmarks/bench_serving.py --json "$OUT/serving.json" > "$OUT/serving.log" 2> "$OUT/serving_rows.log"
  note serving $? "$OUT/serving_rows.log"
fi
if has hostcost; then
  python3 benchmarks/host_overhead.py > "$OUT/host_overhead.log" 2>&1; note hostcost $? "$OUT/host_overhead.log"
fi
if has features; then
  python3 benchmarks/bench_features.py ${FEATURES_ARGS:-} --json "$OUT/features.json" > "$OUT/features.log" 2> "$OUT/features_rows.log"
  note features $? "$OUT/features_rows.log"
fi
if has cp; then
  gpus=$(nvidia-smi -L | wc -l)
  nvidia-smi topo -m > "$OUT/topo.log" 2>&1
  timeout "${CP_TIMEOUT:-300}" python3 -m torch.distributed.run --nproc_per_node="$gpus" \
    benchmarks/bench_cp.py ${CP_ARGS:-} --json "$OUT/cp.json" > "$OUT/cp.log" 2>&1
  note cp $? "$OUT/cp.log"
fi
echo "stages: ${summary[*]:-none}"
has features && cat "$OUT/features.log"
has cp && { head -8 "$OUT/topo.log"; tail -30 "$OUT/cp.log"; }
has hostcost && tail -25 "$OUT/host_overhead.log"
has serving && cat "$OUT/serving.log"
has bench && cat "$OUT/bench.log"
has compare && cat "$OUT/compare.md"
exit $status
