#!/usr/bin/env bash
# Compare source trees' speed in one device call: build each tree in place (in
# parallel), then run the same benchmark (this tree's benchmarks/bench.py, or $BENCH) on each,
# round-robin, so drift shows up as a difference between rounds of one tree; last, a
# table of every row's ours_ms per tree (median over rounds) and new/old ratios.
#   bash benchmarks/tools/compare_trees.sh "<bench.py args>" ROUNDS TREE...
# Trees are copies of the repository made here before the call (untracked, so they
# travel with the working tree; delete them before committing), e.g. the tree before
# the layout redesign next to this one:
#   mkdir -p trees/old && git archive 19aff45 | tar -x -C trees/old
#   bash benchmarks/tools/compare_trees.sh "--set all" 3 trees/old .
# Every tree's package is imported as `fmha_native`, so the trees cannot share a
# process: each round runs one process per tree, one after the other.  A tree is
# put first on PYTHONPATH at its src/ when it has one (trees before the redesign:
# src/fmha_native with the extension fmha_native._C), else at its root (fmha_native/
# and the top-level extension _fmha_native); the processes start in /tmp, so the
# repository root of the calling tree does not shadow them.
# JSON of every run goes to $OUT/compare/<tree>_<round>.json.
set -uo pipefail
export PYTHONUNBUFFERED=1
bench_args=$1 rounds=$2; shift 2
# BENCH: another script that takes --json and writes rows with "shape" and "ours_ms"
# (benchmarks/tools/ragged_check.py); BENCH_FIXED_ARGS: options it always gets; FIELDS:
# the comma-separated row fields to compare instead of ours_ms (rows without one are
# left out), e.g. BENCH=benchmarks/bench_features.py BENCH_FIXED_ARGS= \
# FIELDS=plain_ms,softcap_ms compare_trees.sh "--only cost" 2 trees/main .
bench=${BENCH:-benchmarks/bench.py} fixed_args=${BENCH_FIXED_ARGS---no-check}
here=$(pwd)
out=${OUT:-/tmp/fmha_out}/${COMPARE_DIR:-compare}
mkdir -p "$out"
tree_path() { if [ -d "$here/$1/src/fmha_native" ]; then echo "$here/$1/src"; else echo "$here/$1"; fi; }
tag() { echo "$1" | tr -c 'A-Za-z0-9_\n' '_'; }
# NO_BUILD=1: the trees were built earlier in this call (build_trees.sh)
[ -n "${NO_BUILD:-}" ] || bash "$here/benchmarks/tools/build_trees.sh" "$@"
for r in $(seq "$rounds"); do
  for t in "$@"; do
    echo "== $t (round $r)"
    # shellcheck disable=SC2086  # bench_args is a list of options
    (cd /tmp && PYTHONPATH="$(tree_path "$t")" python3 "$here/$bench" $fixed_args $bench_args \
       --json "$out/$(tag "$t")_$r.json" 2>/dev/null | tail -n +3)
  done
done
FIELDS=${FIELDS:-ours_ms} python3 - "$out" "$@" <<'PY'
import glob, json, os, statistics, sys
out, trees = sys.argv[1], sys.argv[2:]
fields = os.environ["FIELDS"].split(",")
tag = lambda t: "".join(c if c.isalnum() or c == "_" else "_" for c in t)
ms, peer = {}, {}
for t in trees:
    for path in glob.glob(os.path.join(out, tag(t) + "_*.json")):
        for row in json.load(open(path))["rows"]:
            for f in fields:
                if f in row:
                    key = tuple(row["shape"]) + ((f,) if len(fields) > 1 else ())
                    ms.setdefault(key, {}).setdefault(t, []).append(row[f])
                    if f == "ours_ms" and row.get("cudnn_ms"):
                        peer.setdefault(key, {}).setdefault(t, []).append(row["cudnn_ms"] / row[f])
print(f"median {'/'.join(fields)} over rounds; ratio = tree / " + trees[0])
# vs cuDNN: each tree's median of cuDNN's time over ours, both from the same process
print(f"{'shape':40s}" + "".join(f"{t[-14:]:>16s}" for t in trees) + "".join(f"{'ratio ' + t[-8:]:>16s}" for t in trees[1:])
      + ("".join(f"{'cuDNN/' + t[-9:]:>16s}" for t in trees) if peer else ""))
for shape, per in ms.items():
    med = [statistics.median(per[t]) if t in per else None for t in trees]
    cells = "".join(f"{m:16.4f}" if m is not None else f"{'-':>16s}" for m in med)
    ratios = "".join(f"{m / med[0]:16.3f}" if m is not None and med[0] else f"{'-':>16s}" for m in med[1:])
    vs = "".join(f"{statistics.median(peer[shape][t]):16.3f}" if t in peer.get(shape, {}) else f"{'-':>16s}"
                 for t in trees) if peer else ""
    print(f"{str(shape):40s}{cells}{ratios}{vs}")
PY
