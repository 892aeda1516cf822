#!/usr/bin/env bash
# CPU FLASH2 forward tile sizes against PyTorch's CPU SDPA on the same shapes, interleaved in rounds (one command;
# the device host's Xeon for the AMX path): every (Br, Bc) of BQ x BK through `flashattn bench --block-q/--block-k`
# (0 = the plan's default) of BUILD, the plan's default tiles of OLD_BUILD when given, then PyTorch; one table of the median GFLOP/s over
# the rounds, each row's range beside it.
# Usage: bench/lab/cpu-fwd-tiles.sh BUILD OUT_DIR
# Env: OLD_BUILD, DTYPE (bf16), D (64,128), CAUSAL (0,1), BATCH (4), SEQLEN (4096), BQ (0), BK (0), ROUNDS (2),
#      REPS (3), THREADS (all cores).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
BUILD=${1:?usage: $0 BUILD OUT_DIR}
OUT=${2:?usage: $0 BUILD OUT_DIR}
DTYPE=${DTYPE:-bf16}; D=${D:-64,128}; CAUSAL=${CAUSAL:-0,1}; BATCH=${BATCH:-4}; SEQLEN=${SEQLEN:-4096}
BQ=${BQ:-0}; BK=${BK:-0}; ROUNDS=${ROUNDS:-2}; REPS=${REPS:-3}; THREADS=${THREADS:-$(nproc)}
mkdir -p "$OUT"
: >"$OUT/rows.csv"
echo "== $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs, $THREADS threads"
ours() { # tag, build, Br list, Bc list: appends "tag Br/Bc,dtype,d,causal,gflops,kernel"
  "$2/flashattn" bench --algo flash2 --batch "$BATCH" --seqlen "$SEQLEN" --d "$D" --causal "$CAUSAL" --dtype "$DTYPE" \
    --block-q "$3" --block-k "$4" --threads "$THREADS" --reps "$REPS" --json 2>/dev/null | python3 -c '
import json, sys
for r in json.load(sys.stdin):
    if r.get("status") == "ok":
        print("%s %s/%s,%s,%d,%d,%.1f,%s" % (sys.argv[1], r["block_q"], r["block_k"], r["dtype"], r["head_dim"],
                                            r["causal"], r["gflops"], r["kernel"]))' "$1" >>"$OUT/rows.csv"
}
for r in $(seq 1 "$ROUNDS"); do
  ours new "$BUILD" "$BQ" "$BK"
  [ -n "${OLD_BUILD:-}" ] && ours old "$OLD_BUILD" 0 0
  if python3 -c "import torch" 2>/dev/null; then
    python3 scripts/bench_cpu_torch.py run --out "$OUT/torch-$r.csv" --batch "$BATCH" --seqlen "$SEQLEN" --d "$D" \
      --causal "$CAUSAL" --dtype "$DTYPE" --threads "$THREADS" --reps "$REPS" >"$OUT/torch-$r.log" 2>&1
    python3 - "$OUT/torch-$r.csv" "$BATCH" "$SEQLEN" >>"$OUT/rows.csv" <<'EOF'
import csv, sys
sys.path.insert(0, "scripts")
from bench_cpu_torch import flops  # the protocol's FLOP count, as the PyTorch script's own table uses
b, s = int(sys.argv[2]), int(sys.argv[3])
for r in csv.DictReader(open(sys.argv[1])):
    if r["pass"] == "fwd":
        d, c, h = int(r["d"]), int(r["causal"]), int(r["heads"])
        print("torch,%s,%d,%d,%.1f,sdpa" % (r["dtype"], d, c, flops(b, h, s, d, c) / float(r["ms"]) / 1e6))
EOF
  fi
done
python3 - "$OUT/rows.csv" <<'EOF' | tee "$OUT/table.md"
import csv, statistics, sys
rows = {}
for tag, dt, d, c, g, k in csv.reader(open(sys.argv[1])):
    rows.setdefault((dt, int(d), int(c)), {}).setdefault(tag, []).append((float(g), k))
print("| dtype | d | causal | who Br/Bc | GFLOP/s median | range | / torch | kernel |")
print("|---|---|---|---|---|---|---|---|")
for key in sorted(rows):
    t = rows[key].get("torch")
    tm = statistics.median(g for g, _ in t) if t else None
    for tag in sorted(rows[key], key=lambda x: (x == "torch", x)):
        v = [g for g, _ in rows[key][tag]]
        med = statistics.median(v)
        ratio = "%.2f" % (med / tm) if tm and tag != "torch" else "-"
        print("| %s | %d | %d | %s | %.0f | %.0f-%.0f | %s | %s |" % (key + (tag, med, min(v), max(v), ratio,
                                                                     rows[key][tag][0][1])))
EOF
