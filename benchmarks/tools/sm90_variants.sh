#!/usr/bin/env bash
# Compare compile-time variants of the sm_90a prefill kernel in one run: each variant is a set
# of nvcc flags (usually -D of a knob in kernels/fwd_sm90.h); all are built in parallel, then
# each times the same shapes (sm90_check --time, correctness checked on sampled rows) and its
# SASS is counted (MUFU.EX2 / FFMA per kernel); the table is printed last.
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
  timeout 300 "$bin" "${args[@]}" > "$out/v$i/time.log" 2>&1
  echo "  exit $?" | tee -a "$summary"
  # the harness prints its table last
  tail -n 40 "$out/v$i/time.log" | tee -a "$summary"
  if [ "${NCU:-0}" = 1 ]; then
    cp "$bin" "${OUT:-/tmp}/sm90_check"
    OUT=${OUT:-/tmp} NCU_SKIP_BUILD=1 bash benchmarks/tools/ncu_prefill.sh "${shapes[0]}" 2>&1 | tail -3 | tee -a "$summary"
  fi
done
echo
echo "===== variants summary"
cat "$summary"
