#!/usr/bin/env bash
# Tile-table experiments: build copies of the tree whose csrc/fmha_config.h has
# one row replaced, and benchmark each on the same shapes.
#   bash benchmarks/config_variants.sh "<bench args>" "<old row>" "<new row>" ["<new row>" ...]
# e.g. ... "--set gpu --only 2,3" "X(64, 128, 128, 8, 2, 1)" "X(64, 128, 64, 8, 2, 2)"
set -uo pipefail
export PYTHONUNBUFFERED=1
bench_args=$1 old=$2; shift 2
variants=("$old" "$@")
for i in "${!variants[@]}"; do
  dir=/tmp/cfg$i
  rm -rf "$dir"; mkdir -p "$dir"
  tar --exclude=.git --exclude=build -cf - . | tar -xf - -C "$dir"
  python3 - "$dir/csrc/fmha_config.h" "$old" "${variants[$i]}" <<'PY'
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
assert old in text, f"row {old!r} not in {path}"
open(path, "w").write(text.replace(old, new))
PY
  (cd "$dir" && FMHA_CUDA_ARCHS=90a python3 setup.py build_ext --inplace -q > build.log 2>&1 ||
     { echo "variant $i build failed"; grep -E "error|warning" build.log | head -5; }) &
done
wait
for i in "${!variants[@]}"; do
  echo "== ${variants[$i]}"
  (cd /tmp && PYTHONPATH=/tmp/cfg$i/src python3 /tmp/cfg$i/benchmarks/gpu_check.py --quick | tail -1)
  (cd /tmp && PYTHONPATH=/tmp/cfg$i/src python3 /tmp/cfg$i/benchmarks/bench.py $bench_args 2>/dev/null | tail -n +3)
done
