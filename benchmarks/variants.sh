#!/usr/bin/env bash
# Build kernel variants side by side (FMHA_KERNEL_FLAGS per variant) in copies
# of the tree and benchmark each on the same shapes, for tuning experiments.
#   bash benchmarks/variants.sh "<bench args>" "<flags A>" "<flags B>" ...
set -uo pipefail
export PYTHONUNBUFFERED=1
bench_args=$1; shift
i=0
for flags in "$@"; do
  dir=/tmp/variant$i
  rm -rf "$dir"; mkdir -p "$dir"
  tar --exclude=.git --exclude=build -cf - . | tar -xf - -C "$dir"
  (cd "$dir" && FMHA_KERNEL_FLAGS="$flags" FMHA_CUDA_ARCHS=90a python3 setup.py build_ext --inplace -q > build.log 2>&1 || { echo "variant $i build failed"; grep -E "error|warning" build.log | head -5; }) &
  i=$((i + 1))
done
wait
i=0
for flags in "$@"; do
  echo "== variant $i: ${flags:-(default)}"
  (cd /tmp && PYTHONPATH=/tmp/variant$i python3 /tmp/variant$i/benchmarks/gpu_check.py --quick | tail -1)
  (cd /tmp && PYTHONPATH=/tmp/variant$i python3 /tmp/variant$i/benchmarks/bench.py $bench_args 2>/dev/null | tail -n +2)
  i=$((i + 1))
done
