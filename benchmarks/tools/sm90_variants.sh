#!/usr/bin/env bash
# Compare compile-time variants of the sm_90a prefill kernel in one run: each variant is a set
# of nvcc flags (usually -D of a knob in kernels/fwd_sm90.h); all are built in parallel, then
# each times the same shapes (sm90_check --time, correctness checked on sampled rows) in
# ROUNDS (default 3) interleaved rounds, and its SASS is counted (MUFU.EX2 / FFMA per
# kernel); the table (median per cell, ratio to the first variant) is printed last.
#   VARIANTS="-DFMHA_SM90_D64_CONSUMERS=2|-DFMHA_SM90_D64_CONSUMERS=3" \
#   SHAPES="8 16 16 8192 8192 64 0 bf16 0|8 16 16 8192 8192 64 1 bf16 0" \
#   bash benchmarks/tools/sm90_variants.sh
# ('|' separates variants and shapes.)  NCU=1 also runs ncu_prefill.sh's metrics on the first
# shape for every variant.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp}/variants
mkdir -p "$out"
IFS='|' read -r -a variants <<< "${VARIANTS:?set VARIANTS}"
IFS='|' read -r -a shapes <<< "${SHAPES:?set SHAPES}"
pids=()
for i in "${!variants[@]}"; do
  mkdir -p "$out/v$i"
  OUT="$out/v$i" SM90_FLAGS="${variants[$i]}" bash benchmarks/tools/sm90_check.sh --build-only > "$out/v$i/build.log" 2>&1 &
  pids+=($!)
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "variant $i (${variants[$i]}) failed to build:"; tail -20 "$out/v$i/build.log"; }
done
CUOBJDUMP=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
args=()
for s in "${shapes[@]}"; do args+=(--time "$s"); done
summary="$out/summary.txt"
: > "$summary"
for i in "${!variants[@]}"; do
  bin="$out/v$i/sm90_check"
  [ -x "$bin" ] || continue
  echo "=== variant $i: ${variants[$i]}" | tee -a "$summary"
  grep -E "registers|spill" "$out/v$i/build.log" | sort | uniq -c | tee -a "$summary"
  if [ -x "$CUOBJDUMP" ]; then
    "$CUOBJDUMP" -sass "$bin" 2>/dev/null | awk '
      /Function : .*fwd_sm90_kernel/ { name = $3; next }
      /Function : / { name = "" }
      name != "" && /MUFU.EX2/ { ex[name]++ }
      name != "" && /FFMA/ { fm[name]++ }
      END { for (n in ex) printf "  %-70.70s MUFU.EX2 %4d  FFMA %5d\n", n, ex[n], fm[n] }' | sort | tee -a "$summary"
  fi
done
# Rounds: every variant times every shape once per round, in a rotated order, so clock and
# thermal drift over the run hit all variants alike; the table gives the median per cell.
rounds=${ROUNDS:-3}
n=${#variants[@]}
for r in $(seq 0 $((rounds - 1))); do
  for j in $(seq 0 $((n - 1))); do
    i=$(( (r + j) % n ))
    bin="$out/v$i/sm90_check"
    [ -x "$bin" ] || continue
    timeout 300 "$bin" "${args[@]}" > "$out/v$i/time_$r.log" 2>&1 || echo "variant $i round $r: exit $?" | tee -a "$summary"
  done
done
python3 - "$out" "$n" "$rounds" "${variants[@]}" <<'PY' | tee -a "$summary"
import re, statistics, sys
out, n, rounds, names = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
row = re.compile(r"^(\S+ \S+ d\d+ \([\d,]+\)(?: causal)?)\s+\S+\s+\S+\s+(PASS|FAIL)\s+([\d.]+)\s+([\d.]+)")
ms, status = {}, {}
for i in range(n):
    for r in range(rounds):
        try:
            lines = open(f"{out}/v{i}/time_{r}.log").read().splitlines()
        except OSError:
            continue
        seen = set()
        for line in lines:
            m = row.match(line)
            if m and m.group(1) not in seen:  # rows print as they finish and again in the table
                seen.add(m.group(1))
                ms.setdefault(m.group(1), {}).setdefault(i, []).append(float(m.group(3)))
                if m.group(2) != "PASS":
                    status[(m.group(1), i)] = "FAIL"
print(f"median ms of {rounds} interleaved rounds (ratio to variant 0):")
for i, name in enumerate(names):
    print(f"  v{i}: {name or '(default build)'}")
print(f"{'case':44s}" + "".join(f"{'v%d' % i:>16s}" for i in range(n)))
for case, per in ms.items():
    base = statistics.median(per[0]) if 0 in per else None
    cells = []
    for i in range(n):
        if i not in per:
            cells.append(f"{'-':>16s}")
            continue
        med = statistics.median(per[i])
        ratio = f" ({med / base:.3f})" if base else ""
        cells.append(f"{med:8.3f}{ratio}{'!' if (case, i) in status else ''}".rjust(16))
    print(f"{case:44s}" + "".join(cells))
PY
if [ "${NCU:-0}" = 1 ]; then
  for i in "${!variants[@]}"; do
    [ -x "$out/v$i/sm90_check" ] || continue
    cp "$out/v$i/sm90_check" "${OUT:-/tmp}/sm90_check"
    echo "ncu v$i:" | tee -a "$summary"
    OUT=${OUT:-/tmp} NCU_SKIP_BUILD=1 bash benchmarks/tools/ncu_prefill.sh "${shapes[0]}" 2>&1 | tail -2 | tee -a "$summary"
  done
fi
echo
echo "===== variants summary"
cat "$summary"
