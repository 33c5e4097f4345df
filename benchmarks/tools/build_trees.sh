#!/usr/bin/env bash
# Build the extension in place in each of the given source trees, in parallel
# (FMHA_CUDA_ARCHS defaults to 90a); a failed build prints its first errors.
# build_ext --inplace puts the extension where the tree imports it from: _fmha_native
# at the root (current layout), src/fmha_native/_C (trees before the redesign).
# Used by config_variants.sh and compare_trees.sh.
#   bash benchmarks/tools/build_trees.sh TREE...
for t in "$@"; do
  (cd "$t" && FMHA_CUDA_ARCHS=${FMHA_CUDA_ARCHS:-90a} python3 setup.py build_ext --inplace -q > build.log 2>&1 ||
     { echo "$t: build failed"; grep -E "error|warning" build.log | grep -v "^fmha_native build:" | head -5; }) &
done
wait
