#!/usr/bin/env bash
# One device call that decides between compiled-only kernel variants and measures the winner (H200):
#   1. scripts/bwd-variants.sh: every VARIANTS entry ("name=nvcc flags"; the first is the baseline) built in
#      parallel, the FLASH2 backward timed (ROUNDS, SEQLENS, DIMS), the small GPU test set on TEST_VARIANTS
#   2. the winner: the highest geometric mean of the backward TFLOP/s over the PICK shapes ("d:seqlen" list,
#      both causal settings) — a variant other than the baseline must beat it by MARGIN (default 1.005)
#   3. the protocol for FLASH2 and PyTorch SDPA with the winner's build (scripts/bench-gpu.sh, ALGOS=flash2,
#      STANDARD off), then the full tests/gpu/test_gpu on it if it is not the baseline (or FULL_TEST=always)
# Results under $OUT (pick.txt, the protocol table and logs); each step under timeout.
# Env: OUT (default gpu-pick-out), VARIANTS, TEST_VARIANTS, PICK (default "64:8192,64:16384"), MARGIN, SEQLENS
#      (default 2048,8192,16384), DIMS (64,128; the variants' head dims), PROTO_DIMS (the protocol's, default 64,128),
#      ROUNDS (1), PASSES (bwd; fwd,bwd times the forward too, the pick stays on the backward), VAR_TIMEOUT (300 s,
#      builds and timing), PROTO (1; 0 skips step 3's protocol), TORCH (0; 1 times PyTorch's flash beside the
#      variants), TEST_TIMEOUT (240 s, the full test_gpu).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-gpu-pick-out}
VARIANTS=${VARIANTS:-base=}
PICK=${PICK:-64:8192,64:16384}
MARGIN=${MARGIN:-1.005}
mkdir -p "$OUT/variants"
t0=$(date +%s)
VARIANTS="$VARIANTS" OUT="$OUT/variants" TORCH="${TORCH:-0}" SEQLENS="${SEQLENS:-2048,8192,16384}" DIMS="${DIMS:-64,128}" \
  ROUNDS="${ROUNDS:-1}" TEST_VARIANTS="${TEST_VARIANTS:-}" PASSES="${PASSES:-bwd}" timeout "${VAR_TIMEOUT:-300}" \
  bash scripts/bwd-variants.sh 2>&1 |
  tee "$OUT/pick.txt"
echo "== variants done in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/pick.txt"
WIN=$(python3 - "$OUT/variants/variants.csv" "$PICK" "$MARGIN" "${VARIANTS%%=*}" <<'PY'
import sys, math, collections
path, pick, margin, base = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
want = {(int(a), int(b)) for a, b in (x.split(":") for x in pick.split(","))}
vals = collections.defaultdict(dict)  # variant -> (d, seqlen, causal) -> best TFLOP/s
for row in open(path):
    f = row.strip().split(",")
    try:
        v, s, d, c, g = f[0], int(f[7]), int(f[9]), int(f[10]), float(f[13]) / 1000
    except (ValueError, IndexError):
        continue
    if f[11] == "bwd" and (d, s) in want:
        vals[v][(d, s, c)] = max(g, vals[v].get((d, s, c), 0))
gm = {v: math.exp(sum(math.log(x) for x in m.values()) / len(m)) for v, m in vals.items() if m}
for v, g in gm.items():
    sys.stderr.write("geomean %s %.2f\n" % (v, g))
best = max(gm, key=gm.get) if gm else base
if best != base and base in gm and gm[best] < margin * gm[base]:
    best = base
print(best)
PY
)
echo "== winner: $WIN" | tee -a "$OUT/pick.txt"
B=build-v-$WIN
[ -x "$B/flashattn" ] || { echo "no build for $WIN"; exit 1; }
[ "${PROTO:-1}" = 0 ] || timeout 150 env BUILD="$B" OUT_DIR="$OUT/protocol" ALGOS=flash2 STD_MAX_SEQLEN=0 DIMS="${PROTO_DIMS:-64,128}" \
  scripts/bench-gpu.sh >"$OUT/protocol.txt" 2>&1
echo "== protocol rc=$? ($(( $(date +%s) - t0 )) s)" | tee -a "$OUT/pick.txt"
grep -E "^\| (fwd|bwd) \| (64|128) " "$OUT/protocol.txt" | tee -a "$OUT/pick.txt"
if [ "$WIN" != "${VARIANTS%%=*}" ] || [ "${FULL_TEST:-}" = always ]; then
  timeout "${TEST_TIMEOUT:-240}" "$B/tests/gpu/test_gpu" >"$OUT/test_gpu.log" 2>&1
  echo "== test_gpu ($WIN) rc=$? ($(( $(date +%s) - t0 )) s)" | tee -a "$OUT/pick.txt"
  grep FAIL "$OUT/test_gpu.log" | head -10 | tee -a "$OUT/pick.txt"; tail -1 "$OUT/test_gpu.log" | tee -a "$OUT/pick.txt"
fi
