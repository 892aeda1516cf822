#!/usr/bin/env bash
# The GPU binaries of a CUDA build in one archive, for a GPU host that should not spend its time building: the CLI,
# tests/gpu/*, bench/bench_bwd_det, stripped, at their build-directory paths, in one xz stream whose large dictionary
# stores the static library they all contain once (10 binaries: ~13 MB, against 5-12 MB each compressed alone).
#   scripts/pack-gpu.sh ARCHIVE [BUILD (default build-cuda)] [FILE...]   (FILE: more binaries, e.g. A/B variants'
#   CLIs, packed at the top level under their own names)
# On the GPU host: mkdir B && tar -xJf ARCHIVE -C B, then SKIP_BUILD=1 BUILD=B scripts/test-gpu.sh, or
# BUILD=B scripts/bench-gpu.sh (both run from this repository's root).
set -euo pipefail
cd "$(dirname "$0")/.."
ARCHIVE=$(realpath -m "$1")
BUILD=${2:-build-cuda}
shift $(($# < 2 ? $# : 2))
cmake --build "$BUILD" -j "$(nproc)" --target flashattn_cli bench_bwd_det test_gpu test_gpu_nonfinite test_gpu_empty \
  test_gpu_sinks test_gpu_kvcache test_gpu_ring test_gpu_merge test_gpu_fp8 >/dev/null
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tests/gpu" "$stage/bench"
strip -o "$stage/flashattn" "$BUILD/flashattn"
strip -o "$stage/bench/bench_bwd_det" "$BUILD/bench/bench_bwd_det"
for t in "$BUILD"/tests/gpu/test_gpu*; do
  if [ -f "$t" ] && [ -x "$t" ]; then strip -o "$stage/tests/gpu/$(basename "$t")" "$t"; fi
done
for f in "$@"; do strip -o "$stage/$(basename "$f")" "$f"; done
tar -cf - -C "$stage" . | xz -T1 -9 --lzma2=preset=9,dict=768MiB >"$ARCHIVE"
ls -la "$ARCHIVE"
