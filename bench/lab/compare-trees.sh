#!/usr/bin/env bash
# Same-command speed comparison of two builds of flashattn (e.g. a change against its base): the protocol shapes
# (bf16, 16k tokens, model dim 2048) for the given algorithms, the two builds interleaved per group and repeated
# ROUNDS times; prints, per shape, each build's best TFLOP/s and new/old.
#   bench/lab/compare-trees.sh OLD_BUILD NEW_BUILD [out_dir]   (each a build directory holding the flashattn CLI)
# Env: DEVICE (cuda), ALGOS (flash2,flash1), DIMS (64,128), SEQLENS (512..16384), PASSES (fwd,bwd), ROUNDS (2), REPS (10)
set -euo pipefail
OLD=$1 NEW=$2 OUT=${3:-compare-out}
DEVICE=${DEVICE:-cuda} ALGOS=${ALGOS:-flash2,flash1} DIMS=${DIMS:-64,128}
SEQLENS=${SEQLENS:-512,1024,2048,4096,8192,16384} PASSES=${PASSES:-fwd,bwd} ROUNDS=${ROUNDS:-2} REPS=${REPS:-10}
mkdir -p "$OUT"
: >"$OUT/old.csv"; : >"$OUT/new.csv"
for r in $(seq "$ROUNDS"); do
  for d in ${DIMS//,/ }; do
    for pass in ${PASSES//,/ }; do
      for tree in old new; do
        b=$OLD; [ $tree = new ] && b=$NEW
        "$b/flashattn" bench --device "$DEVICE" --algo "$ALGOS" --d "$d" --seqlen "$SEQLENS" --causal 0,1 \
          --pass "$pass" --reps "$REPS" --warmup 2 --csv 2>>"$OUT/$tree.err" | tail -n +2 >>"$OUT/$tree.csv"
      done
    done
  done
done
python3 "$(dirname "$0")/best_table.py" "$OUT" old new | tee "$OUT/compare.md"
