#!/usr/bin/env bash
# Tile-table experiments: build copies of the tree whose csrc/fmha_config.h has
# one line replaced (a tile row, a heuristic constant), and run the same
# benchmark on each (default script: benchmarks/bench.py), after the quick GPU parity
# subset of each copy (tests/test_gpu_parity.py -k quick).
#   bash benchmarks/tools/config_variants.sh "<bench args>" "<old line>" "<new line>" ["<new line>" ...]
#   BENCH=benchmarks/sweep_splits.py bash benchmarks/tools/config_variants.sh "<sweep args>" ...
# "{i}" in the arguments becomes the variant's index (0 = the unchanged tree).
# e.g. ... "--set gpu --only 2,3" "X(64, 64, 128, 4, 2, 2)" "X(64, 64, 64, 4, 3, 3)"
set -uo pipefail
export PYTHONUNBUFFERED=1
bench_args=$1 old=$2; shift 2
bench=${BENCH:-benchmarks/bench.py}
variants=("$old" "$@")
dirs=()
for i in "${!variants[@]}"; do
  dir=/tmp/cfg$i
  dirs+=("$dir")
  rm -rf "$dir"; mkdir -p "$dir"
  tar --exclude=.git --exclude=build --exclude=trees -cf - . | tar -xf - -C "$dir"
  python3 - "$dir/csrc/fmha_config.h" "$old" "${variants[$i]}" <<'PY'
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
assert old in text, f"row {old!r} not in {path}"
open(path, "w").write(text.replace(old, new))
PY
done
bash benchmarks/tools/build_trees.sh "${dirs[@]}"
for i in "${!variants[@]}"; do
  echo "== ${variants[$i]}"
  # the copy's root holds fmha_native/ and the in-place _fmha_native
  (cd /tmp/cfg$i && python3 -m pytest -q -p no:cacheprovider tests/test_gpu_parity.py -k quick | tail -1)
  (cd /tmp && PYTHONPATH=/tmp/cfg$i python3 /tmp/cfg$i/$bench ${bench_args//\{i\}/$i} 2>/dev/null | tail -n +3)
done
