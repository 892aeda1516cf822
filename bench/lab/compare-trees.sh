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
python3 - "$OUT/old.csv" "$OUT/new.csv" <<'PY' | tee "$OUT/compare.md"
import csv, sys
cols = "device,algo,dtype,batch,heads,seqlen_q,seqlen_k,head_dim,causal,pass,ms,gflops".split(",")
def best(path):
    out = {}
    for row in csv.reader(open(path)):
        r = dict(zip(cols, row))
        try: g = float(r["gflops"])
        except (KeyError, ValueError): continue
        k = (r["algo"], r["head_dim"], r["causal"], r["pass"], int(r["seqlen_q"]))
        out[k] = max(out.get(k, 0.0), g)
    return out
old, new = best(sys.argv[1]), best(sys.argv[2])
print("| algo | d | causal | pass | seqlen | old TFLOP/s | new TFLOP/s | new/old |")
print("|---|---|---|---|---|---|---|---|")
ratios = []
for k in sorted(old):
    if k not in new: continue
    q = new[k] / old[k]
    ratios.append(q)
    print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {k[4]} | {old[k]/1e3:.1f} | {new[k]/1e3:.1f} | {q:.3f} |")
if ratios:
    print(f"\n{len(ratios)} shapes: new/old min {min(ratios):.3f}, max {max(ratios):.3f}")
PY
