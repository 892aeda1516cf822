#!/usr/bin/env bash
# Builds compile-time variants of the CUDA backend in parallel, one build directory each (build-v-<name>): VARIANTS
# ("name=nvcc flags;..."), targets flashattn_cli and test_gpu, the cores shared out. A failed build is reported and
# leaves the others; logs in build-v-<name>/{cmake,build}.log. Used by scripts/bwd-variants.sh and gpu-trial.sh.
# Env: VARIANTS (default "base="), BUILD_TIMEOUT (seconds per build, default 400).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
IFS=';' read -ra VS <<<"${VARIANTS:-base=}"
jobs_each=$(( $(nproc) / ${#VS[@]} )); [ "$jobs_each" -ge 1 ] || jobs_each=1
for nv in "${VS[@]}"; do
  n=${nv%%=*}; fl=${nv#*=}
  ( mkdir -p "build-v-$n" && cmake -S . -B "build-v-$n" -DFA_CUDA=ON -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_FLAGS=$fl" \
      >"build-v-$n/cmake.log" 2>&1 &&
    timeout "${BUILD_TIMEOUT:-400}" cmake --build "build-v-$n" -j "$jobs_each" --target flashattn_cli test_gpu \
      >"build-v-$n/build.log" 2>&1 ||
    echo "build of variant $n failed (see build-v-$n/build.log)" ) &
done
wait
