#!/usr/bin/env bash
# Where a kernel's warps wait: ncu on the last producer launch of profile_case.py
# (4 calls), per-issue stall ratios, issue activity, instructions, DRAM throughput.
# KV=fp8 in the environment profiles an fp8 KV cache; profile_case.py's other options
# (SOFTCAP=, WINDOW=, LENS=) pass through.  KERNEL=regex picks the kernel (default the
# mma.sync/decode producer; KERNEL=fwd_sm90_kernel for the Hopper prefill kernel).
# SASS=file also writes the per-instruction stall samples (ncu's source page, CSV) there.
#   [KV=fp8] [KERNEL=..] [SASS=..] bash benchmarks/tools/ncu_stalls.sh B HQ HKV SQ SK D CAUSAL
set -uo pipefail
stalls="long_scoreboard short_scoreboard barrier wait mio_throttle lg_throttle math_pipe_throttle no_instruction dispatch_stall not_selected selected membar branch_resolving tex_throttle drain sleeping misc"
metrics="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,smsp__warps_active.avg.per_cycle_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__cycles_active.avg,launch__grid_size,launch__occupancy_limit_shared_mem,sm__warps_active.avg.pct_of_peak_sustained_active"
for s in $stalls; do metrics="$metrics,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio"; done
log=$(mktemp)
kernel=${KERNEL:-fwd_mma_kernel}
ncu --clock-control none --print-units base --kernel-name regex:$kernel --launch-skip 3 --launch-count 1 \
  --metrics "$metrics" --csv python3 benchmarks/tools/profile_case.py "$@" 0 4 > "$log" 2>/dev/null
if [ -n "${SASS:-}" ]; then
  rep=$(mktemp -u).ncu-rep
  ncu --clock-control none --kernel-name regex:$kernel --launch-skip 3 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --import-source no -o "${rep%.ncu-rep}" \
    python3 benchmarks/tools/profile_case.py "$@" 0 4 > /dev/null 2>&1
  ncu --import "$rep" --page source --print-source sass --csv > "$SASS" 2>&1
  rm -f "$rep"
fi
python3 - "$log" <<'PY'
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, body = rows[0], rows[1:]
i = {k: head.index(k) for k in ("Kernel Name", "Metric Name", "Metric Value")}
if body:
    print(body[0][i["Kernel Name"]][:150])
for r in body:
    n = r[i["Metric Name"]].replace("smsp__average_warps_issue_stalled_", "stall:")
    n = n.replace("_per_issue_active.ratio", "")
    print(f"  {n:60s} {r[i['Metric Value']]}")
PY
rm -f "$log"
