#!/usr/bin/env bash
# Variants of a few source files measured against the tree as it is, in one build directory: each variant is a
# directory of replacement files at their repo paths (e.g. V/src/cuda/wgmma/flash3_bwd.cuh); the CLI is rebuilt
# incrementally with each variant laid over the tree (only what includes those files recompiles), its binary kept,
# the tree restored; then every binary runs the same bench command, interleaved, ROUNDS times, and one table gives
# each variant's best TFLOP/s per shape against the tree's ("base").
#   bench/lab/ab-variants.sh BUILD OUT VARIANT_DIR... -- BENCH_ARGS...
#   e.g. bench/lab/ab-variants.sh build-cuda ab /tmp/v/poly2 /tmp/v/poly4 -- --device cuda --algo flash3 --pass bwd \
#        --d 64 --seqlen 1024,4096,16384 --causal 0,1 --reps 5
# Env: ROUNDS (2), TARGET (flashattn_cli), PHASE (all; build = binaries only, e.g. while the GPU is busy; run = bench
# the binaries a build phase left in OUT). Run from the repository root; the tree is restored even on failure.
set -euo pipefail
BUILD=$1 OUT=$2
shift 2
VARIANTS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do VARIANTS+=("$1"); shift; done
[ "${1:-}" = "--" ] || { echo "usage: $0 BUILD OUT VARIANT_DIR... -- BENCH_ARGS..." >&2; exit 2; }
shift
ROUNDS=${ROUNDS:-2} TARGET=${TARGET:-flashattn_cli} PHASE=${PHASE:-all}
mkdir -p "$OUT/bin" "$OUT/orig"
if [ "$PHASE" != run ]; then
cmake --build "$BUILD" --target "$TARGET" -j "$(nproc)" >"$OUT/build-base.log" 2>&1
cp "$BUILD/flashattn" "$OUT/bin/base"

restore() { # put the tree's own files back, newer than any variant's object
    if [ -d "$OUT/orig/tree" ]; then
        (cd "$OUT/orig/tree" && find . -type f) | while read -r f; do cp "$OUT/orig/tree/$f" "$f"; touch "$f"; done
        rm -rf "$OUT/orig/tree"
    fi
}
trap restore EXIT
for v in "${VARIANTS[@]}"; do
    name=$(basename "$v")
    (cd "$v" && find . -type f) | while read -r f; do
        [ -f "$f" ] || { echo "$v: $f is not a file of the tree" >&2; exit 2; }
        mkdir -p "$OUT/orig/tree/$(dirname "$f")"
        [ -f "$OUT/orig/tree/$f" ] || cp "$f" "$OUT/orig/tree/$f"
        cp "$v/$f" "$f"
    done
    cmake --build "$BUILD" --target "$TARGET" -j "$(nproc)" >"$OUT/build-$name.log" 2>&1 ||
        { echo "$name: build failed (see $OUT/build-$name.log)" >&2; exit 1; }
    cp "$BUILD/flashattn" "$OUT/bin/$name"
    restore
done
cmake --build "$BUILD" --target "$TARGET" -j "$(nproc)" >"$OUT/build-restore.log" 2>&1
fi
[ "$PHASE" != build ] || exit 0

names=(base)
for v in "${VARIANTS[@]}"; do names+=("$(basename "$v")"); done
for n in "${names[@]}"; do : >"$OUT/$n.csv"; done
for r in $(seq "$ROUNDS"); do
    for n in "${names[@]}"; do
        "$OUT/bin/$n" bench "$@" --csv 2>>"$OUT/$n.err" | tail -n +2 >>"$OUT/$n.csv"
    done
done
python3 "$(dirname "$0")/best_table.py" "$OUT" "${names[@]}" | tee "$OUT/ab.md"
