#!/usr/bin/env bash
# Build a libFuzzer harness (tests/fuzz/HARNESS.c; HARNESS = fuzz_attn unless the first argument names one, e.g.
# fuzz_kvcache) with clang, ASan + UBSan, over the CPU backend: the library in $BUILD (default build-fuzz) with
# coverage instrumentation, the harness linked against it. The KV-cache kernels build at -O0 (clang's inliner takes
# minutes on them under ASan; sources.cmake). Further arguments go to CMake (e.g. -DFA_USE_BLAS=OFF,
# or the OpenBLAS paths). Prints the harness's path.
set -euo pipefail
cd "$(dirname "$0")/../.."
HARNESS=fuzz_attn
case "${1:-}" in fuzz_*) HARNESS=$1; shift ;; esac
[ -f "tests/fuzz/$HARNESS.c" ] || { echo "no harness tests/fuzz/$HARNESS.c" >&2; exit 1; }
BUILD=${BUILD:-build-fuzz}
CC=${CC:-clang}
mkdir -p "$BUILD"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
CC="$CC" cmake -S . -B "$BUILD" -DFA_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS="-O1 $SAN -fsanitize=fuzzer-no-link" -DFA_KVCACHE_KERNEL_FLAGS=-O0 "$@" >"$BUILD/fuzz-cmake.log" 2>&1 ||
    { cat "$BUILD/fuzz-cmake.log"; exit 1; }
cmake --build "$BUILD" -j "${JOBS:-2}" --target flashattn_static >"$BUILD/fuzz-build.log" 2>&1 || { tail -30 "$BUILD/fuzz-build.log"; exit 1; }
BLAS=$({ grep -E '^FA_OPENBLAS_LIBRARY:' "$BUILD/CMakeCache.txt" || true; } | sed 's/.*=//;/NOTFOUND/d')
"$CC" -O1 $SAN -fsanitize=fuzzer -fopenmp -Iinclude -Isrc "tests/fuzz/$HARNESS.c" "$BUILD/libflashattn.a" \
    ${BLAS:+"$BLAS"} -lm -o "$BUILD/$HARNESS"
echo "$BUILD/$HARNESS"
