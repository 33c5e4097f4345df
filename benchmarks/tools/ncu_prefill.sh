#!/usr/bin/env bash
# Kernel-only metrics of the sm_90a prefill kernel (kernels/fwd_sm90.h) under ncu, one launch
# per shape through the check harness (sm90_check --profile), clocks left to the GPU:
# duration and TFLOP/s, tensor pipe active %, instructions executed, L2 -> SM read bytes,
# DRAM bytes.
#   bash benchmarks/tools/ncu_prefill.sh ["B HQ HKV SQ SK D CAUSAL bf16|fp16 SCHED" ...]
# SCHED: 0 interleaved, 1 ping-pong.  NCU_EXTRA="metric,..." adds metrics (printed as name=value).
# The raw CSV is appended to ${OUT:-/tmp}/ncu_prefill.csv.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp}
shapes=("$@")
[ ${#shapes[@]} -eq 0 ] && shapes=("2 64 64 8192 8192 128 0 bf16 0" "2 64 64 8192 8192 128 0 bf16 1"
                                   "8 16 16 8192 8192 64 0 bf16 0" "8 16 16 8192 8192 64 0 bf16 1")
# NCU_SKIP_BUILD=1: use the binary already in $OUT (sm90_variants.sh puts each variant there).
[ "${NCU_SKIP_BUILD:-0}" = 1 ] || OUT=$out bash benchmarks/tools/sm90_check.sh --build-only >/dev/null || { echo "build failed" >&2; exit 1; }
NCU=${NCU:-ncu}
command -v "$NCU" >/dev/null || NCU=/usr/local/cuda/bin/ncu
# The tensor-pipe counter's name differs between ncu versions: take those this one knows.
known=$("$NCU" --query-metrics --chip gh100 2>/dev/null | awk '{print $1}')
metrics=gpu__time_duration.sum,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum
for m in sm__pipe_tensor_op_gmma_cycles_active sm__pipe_tensor_op_hmma_cycles_active sm__pipe_tensor_cycles_active \
         lts__t_sectors_srcunit_tex_op_read lts__t_sectors_op_read; do
  if grep -qx "$m" <<< "$known"; then
    case $m in
      sm__pipe*) metrics="$metrics,$m.avg.pct_of_peak_sustained_active" ;;
      *) metrics="$metrics,$m.sum" ;;
    esac
  fi
done
[ -n "${NCU_EXTRA:-}" ] && metrics="$metrics,$NCU_EXTRA"
for s in "${shapes[@]}"; do
  log=$(mktemp)
  # application replay: each metric pass reruns the harness, no save/restore of GBs of device memory
  "$NCU" --clock-control none --replay-mode application --print-units base --csv \
    --kernel-name regex:fwd_sm90_kernel --launch-count 1 \
    --metrics "$metrics" "$out/sm90_check" --profile "$s" > "$log" 2>&1
  python3 - "$log" "$s" <<'PY'
import csv, sys
path, shape = sys.argv[1:]
rows = [r for r in csv.reader(l for l in open(path) if l.startswith('"'))]
if len(rows) < 2:
    print(f"{shape}: no ncu rows (see {path})"); print(open(path).read()[-2000:]); sys.exit(0)
head, body = rows[0], rows[1:]
ix = {k: head.index(k) for k in ("Metric Name", "Metric Value")}
m = {r[ix["Metric Name"]]: float(r[ix["Metric Value"]].replace(",", "")) for r in body}
b, hq, hkv, sq, sk, d, causal = (int(x) for x in shape.split()[:7])
pairs = sum(max(0, min(sk, i + sk - sq + 1)) for i in range(sq)) if causal else sq * sk
t = m["gpu__time_duration.sum"] * 1e-9
tensor = next((v for k, v in m.items() if k.startswith("sm__pipe_tensor")), float("nan"))
tex = m.get("lts__t_sectors_srcunit_tex_op_read.sum", float("nan")) * 32
l2r = m.get("lts__t_sectors_op_read.sum", float("nan")) * 32
print(f"{shape:34s} {t*1e3:8.3f} ms {4*b*hq*pairs*d/t/1e12:7.1f} TF  tensor {tensor:5.1f}%  "
      f"inst {m['smsp__inst_executed.sum']/1e9:6.3f} G  L2 read (tex) {tex/1e9:6.2f} GB  L2 read (all) {l2r/1e9:6.2f} GB  "
      f"dram r/w {m['dram__bytes_read.sum']/1e9:6.2f}/{m['dram__bytes_write.sum']/1e9:5.2f} GB")
extra = [f"{k}={v:g}" for k, v in m.items() if k not in ("gpu__time_duration.sum", "smsp__inst_executed.sum",
         "dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_sectors_srcunit_tex_op_read.sum",
         "lts__t_sectors_op_read.sum") and not k.startswith("sm__pipe_tensor")]
if extra:
    print("    " + "  ".join(extra))
PY
  cat "$log" >> "$out/ncu_prefill.csv"; rm -f "$log"
done
