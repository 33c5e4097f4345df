#!/usr/bin/env bash
# Run pytest files concurrently on the one GPU, in a tree built in place (build_trees.sh),
# each file under its own timeout; each file's last line prints as soon as it ends, so a
# device call that runs out of time still shows what finished.  Logs: $OUT/tests_<tag>.log.
#   TREE=trees/main FILE_TIMEOUT=300 bash benchmarks/tools/tree_tests.sh FILE[::-k EXPR] ...
# A FILE::-k EXPR argument runs only the tests of FILE that EXPR selects.
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/fmha_out}; mkdir -p "$out"
tree=$(cd "${TREE:-.}" && pwd)
for spec in "$@"; do
  file=${spec%%::*} expr=""
  [[ $spec == *::-k\ * ]] && expr=${spec#*::-k }
  tag=$(echo "${TREE:+$(basename "$TREE")_}$spec" | tr -c 'A-Za-z0-9_\n' '_' | cut -c1-60)
  (cd "$tree" && start=$(date +%s) &&
   PYTHONPATH="$tree" OMP_NUM_THREADS=2 timeout "${FILE_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider \
     "$file" ${expr:+-k "$expr"} > "$out/tests_$tag.log" 2>&1
   rc=$?
   echo "[$(( $(date +%s) - start )) s rc=$rc] ${TREE:+$TREE: }$spec: $(grep -E "passed|failed|error|skipped" "$out/tests_$tag.log" | tail -1)"
   [ $rc -ne 0 ] && grep -E "^(FAILED|ERROR)" "$out/tests_$tag.log" | head -5) &
done
wait
