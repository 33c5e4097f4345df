#!/usr/bin/env bash
# fp8 decode variants in one device call: build each tree in place (build_trees.sh),
# then fp8_check.py's timing table for each, one process per tree, twice round-robin.
#   bash benchmarks/tools/fp8_variants.sh TREE...
set -uo pipefail
here=$(pwd)
bash "$here/benchmarks/tools/build_trees.sh" "$@"
for r in 1 2; do
  for t in "$@"; do
    echo "== $t (round $r)"
    (cd /tmp && PYTHONPATH="$here/$t" FP8_CHECK_ONLY_TIMING=1 python3 "$here/$t/benchmarks/tools/fp8_check.py" 2>&1 | tail -6)
  done
done
