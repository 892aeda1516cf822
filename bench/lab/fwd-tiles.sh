#!/usr/bin/env bash
# Forward tile rows (FLASH2 by default) against PyTorch's flash backend, interleaved in rounds (one device call): the
# small GPU test set first (every tile row against the float64 oracle), then ROUNDS x (each TILES entry through
# `flashattn bench --block-q/--block-k`, then PyTorch SDPA), and one table of the best TFLOP/s over the rounds.
# Env: BUILD (default build-cuda), OUT_DIR (default $BUILD/fwd-tiles), TILES ("d:bq:bk;..." rows of the forward
#      table, 0:0 = the default; default: the d=96 and d=256 rows), SEQLENS (default 1024,4096,16384), ROUNDS (2),
#      REPS (10), ALGO (flash2; flash3 for its rows, tiles.h in src/cuda/wgmma), DTYPE (bf16; f8_e4m3 for FLASH3's
#      FP8 rows, against the same torch-flash bf16 line), NO_TORCH (1 = skip PyTorch).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build-cuda}
OUT_DIR=${OUT_DIR:-$BUILD/fwd-tiles}
TILES=${TILES:-"96:0:0;256:0:0;256:128:64"}
ALGO=${ALGO:-flash2}
DTYPE=${DTYPE:-bf16}
SEQLENS=${SEQLENS:-1024,4096,16384}
ROUNDS=${ROUNDS:-2}
REPS=${REPS:-10}
mkdir -p "$OUT_DIR"
if [ ! -x "$BUILD/flashattn" ] || [ ! -x "$BUILD/tests/gpu/test_gpu" ]; then
  cmake -S . -B "$BUILD" -DFA_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD" -j "$(nproc)" 2>&1 | grep -E "error|warning|spill"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | head -1
FA_GPU_TEST_SMALL=1 timeout 300 "$BUILD/tests/gpu/test_gpu" >"$OUT_DIR/test_small.log" 2>&1
echo "test_gpu (small set) rc=$?: $(tail -1 "$OUT_DIR/test_small.log")"
grep FAIL "$OUT_DIR/test_small.log" | head -10
dims=$(echo "$TILES" | tr ';' '\n' | cut -d: -f1 | sort -un | paste -sd, -)
IFS=';' read -ra TS <<<"$TILES"
: >"$OUT_DIR/ours.csv"
for r in $(seq 1 "$ROUNDS"); do
  for t in "${TS[@]}"; do
    IFS=: read -r d bq bk <<<"$t"
    "$BUILD/flashattn" bench --device cuda --dtype "$DTYPE" --algo "$ALGO" --d "$d" --seqlen "$SEQLENS" --causal 0,1 \
      --pass fwd --reps "$REPS" --warmup 2 --block-q "$bq" --block-k "$bk" --csv 2>>"$OUT_DIR/ours.err" |
      tail -n +2 | sed "s/^/$d:$bq:$bk,/" >>"$OUT_DIR/ours.csv"
  done
  [ "${NO_TORCH:-0}" = 1 ] || python3 scripts/bench_gpu_torch.py run --out "$OUT_DIR/torch-$r.csv" --d "$dims" --seqlen "$SEQLENS" --causal 0,1 \
    --pass fwd --reps "$REPS" >"$OUT_DIR/torch-$r.log" 2>&1
done
python3 - "$OUT_DIR" "$ROUNDS" "$ALGO $DTYPE" <<'PY'
import csv, sys, collections
out, rounds = sys.argv[1], int(sys.argv[2])
best = collections.defaultdict(float)  # (tile, d, causal, seqlen) -> TFLOP/s
for row in csv.reader(open(out + "/ours.csv")):
    try:
        tile, d, s, c, gf = row[0], int(row[8]), int(row[6]), int(row[9]), float(row[12]) / 1000
    except (ValueError, IndexError):
        continue
    best[(tile, d, c, s)] = max(best[(tile, d, c, s)], gf)
for r in range(1, rounds + 1):
    try:
        rows = list(csv.DictReader(open("%s/torch-%d.csv" % (out, r))))
    except OSError:
        continue
    for row in rows:
        if row["pass"] == "fwd" and row["algo"] == "torch-flash" and row["ms"] != "error":
            k = ("torch-flash", int(row["d"]), int(row["causal"]), int(row["seqlen"]))
            best[k] = max(best[k], float(row["tflops"]))
print("forward TFLOP/s, %s, best of %d rounds; tile d:block_q:block_k (0:0 = default); ratio to torch-flash"
      % (sys.argv[3], rounds))
for dd in sorted({k[1] for k in best}):
    tiles = sorted({k[0] for k in best if k[0] != "torch-flash" and k[1] == dd}, key=lambda t: [int(x) for x in t.split(":")])
    print("\n| d | causal | seqlen | torch-flash | " + " | ".join(tiles) + " |")
    print("|---" * (4 + len(tiles)) + "|")
    for d, c, s in sorted({k[1:] for k in best if k[1] == dd}):
        tf = best.get(("torch-flash", d, c, s), 0)
        cells = []
        for t in tiles:
            v = best.get((t, d, c, s))
            cells.append(("%.1f (%.2f)" % (v, v / tf) if tf else "%.1f" % v) if v else "-")
        print("| %d | %d | %d | %.1f | %s |" % (d, c, s, tf, " | ".join(cells)))
PY
