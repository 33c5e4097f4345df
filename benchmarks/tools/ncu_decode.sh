#!/usr/bin/env bash
# Kernel-only durations and DRAM traffic of ours and cuDNN on the decode rows,
# under ncu (L2 flushed and clean before every kernel: no flush write-back),
# last of 4 calls of each.  Prints one line per kernel of that call.
#   [NCU_EXTRA=metric,...] [WHO=ours] bash benchmarks/tools/ncu_decode.sh ["B HQ HKV SQ SK D" ...]
# WHO: whose kernels (default "ours cudnn")
set -uo pipefail
shapes=("$@")
[ ${#shapes[@]} -eq 0 ] && shapes=("1 16 16 1 65535 64" "1 32 8 1 131072 128" "16 32 8 1 8192 128" "64 32 8 1 4096 128")
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
# NCU_EXTRA="metric,metric": more metrics, printed as name=value after each kernel's line
[ -n "${NCU_EXTRA:-}" ] && metrics="$metrics,$NCU_EXTRA"
for s in "${shapes[@]}"; do
  for who in ${WHO:-ours cudnn}; do
    log=$(mktemp)
    PEER=$([ $who = cudnn ] && echo cudnn) ncu --clock-control none --print-units base --metrics $metrics --csv \
      python3 benchmarks/tools/profile_case.py $s 0 0 4 > "$log" 2>/dev/null
    # the kernels of the last call: the last launches after the warm-up ones
    python3 - "$log" "$s" "$who" <<'PY'
import csv, sys, collections
path, shape, who = sys.argv[1:]
rows = [r for r in csv.reader(l for l in open(path) if l.startswith('"'))]
head, body = rows[0], rows[1:]
ix = {k: head.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
k = collections.OrderedDict()
for r in body:
    key = (int(r[ix["ID"]]), r[ix["Kernel Name"]][:60])
    k.setdefault(key, {})[r[ix["Metric Name"]]] = float(r[ix["Metric Value"]].replace(",", ""))
kernels = [x for x in k.items() if "distribution" not in x[0][1] and "elementwise" not in x[0][1]]
per_call = len(kernels) // 4 or 1
tot = 0.0
for (i, name), m in kernels[-per_call:]:
    t = m["gpu__time_duration.sum"] / 1e3
    tot += t
    print(f"{shape:22s} {who:6s} {name:60s} {t:8.2f} us  read {m['dram__bytes_read.sum']/1e6:7.1f} MB  "
          f"write {m['dram__bytes_write.sum']/1e6:6.1f} MB  dram {m['dram__throughput.avg.pct_of_peak_sustained_elapsed']:5.1f}%")
    extra = [f"{n}={v:g}" for n, v in m.items() if not n.startswith(("gpu__time", "dram__"))]
    if extra:
        print("    " + "  ".join(extra))
print(f"{shape:22s} {who:6s} {'total':60s} {tot:8.2f} us")
PY
    cat "$log" >> "${OUT:-/tmp}/ncu_decode.csv"; rm -f "$log"
  done
done
