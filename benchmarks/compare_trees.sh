#!/usr/bin/env bash
# Bisect performance across source trees in one device call: build each tree
# in place (in parallel), then run the same benchmark on each, round-robin, so
# drift shows up as a difference between rounds of one tree.
#   bash benchmarks/compare_trees.sh "<bench.py args>" ROUNDS TREE...
# Trees are copies of the repository made before the call, e.g.
#   mkdir -p trees/old && git archive <rev> | tar -x -C trees/old
# (untracked, so they travel with the working tree; delete them before committing).
# The benchmark script is this tree's benchmarks/bench.py; only the module differs.
set -uo pipefail
export PYTHONUNBUFFERED=1
bench_args=$1 rounds=$2; shift 2
here=$(pwd)
bash "$here/benchmarks/build_trees.sh" "$@"
for r in $(seq "$rounds"); do
  for t in "$@"; do
    echo "== $t (round $r)"
    (cd /tmp && PYTHONPATH="$here/$t/src" python3 "$here/benchmarks/bench.py" --no-check $bench_args 2>/dev/null | tail -n +3)
  done
done
