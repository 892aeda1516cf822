#!/usr/bin/env bash
# The FLASH3 variants that wait for a GPU, as replacement-file directories for bench/lab/ab-variants.sh:
#   ud          FA3_UNIFORM_DESC 1 (src/cuda/wgmma/ptx.cuh: descriptors in uniform registers; the SASS of every 16-bit
#               kernel 4-15 % shorter, the same HGMMAs);
#   ud-d64-128  ud, and the d = 64 three-warpgroup row at 192 x 128 (FA3's causal d = 64 tile; P still in registers:
#               with ud it no longer spills, without it 48 bytes did).
#   bench/lab/flash3/variants.sh DIR     (then, e.g., PHASE=build bench/lab/ab-variants.sh build-cuda OUT DIR/ud
#   DIR/ud-d64-128 -- --device cuda --algo flash3 --pass fwd,bwd --d 64,128,256 --seqlen 1024,4096,16384 --causal 0,1)
# Each variant is checked to differ from the tree where it should; a pattern that moved fails the script.
set -euo pipefail
cd "$(dirname "$0")/../../.."
DIR=${1:?usage: $0 DIR}
W=src/cuda/wgmma
rm -rf "$DIR/ud" "$DIR/ud-d64-128"
mkdir -p "$DIR/ud/$W" "$DIR/ud-d64-128/$W"
sed 's/^#define FA3_UNIFORM_DESC 0$/#define FA3_UNIFORM_DESC 1/' $W/ptx.cuh >"$DIR/ud/$W/ptx.cuh"
cp "$DIR/ud/$W/ptx.cuh" "$DIR/ud-d64-128/$W/ptx.cuh"
sed 's/WIDE ? (D == 64 ? 112 : /WIDE ? (D == 64 ? 128 : /' $W/flash3_fwd.cuh >"$DIR/ud-d64-128/$W/flash3_fwd.cuh"
sed 's/FA3_FWD_ROW3(64, 112, /FA3_FWD_ROW3(64, 128, /' $W/tiles.h >"$DIR/ud-d64-128/$W/tiles.h"
for f in ud/$W/ptx.cuh ud-d64-128/$W/flash3_fwd.cuh ud-d64-128/$W/tiles.h; do
  if cmp -s "$DIR/$f" "${f#*/}"; then echo "variants.sh: $f is the tree's (a pattern moved)" >&2; exit 1; fi
done
echo "variants in $DIR: ud ud-d64-128"
