#!/usr/bin/env bash
# First device run of kernel work that has only been compiled (H200, one call, < 10 minutes): it tests it and
# measures it against the variants it would replace, so one call decides what lands.
#   1. builds in parallel (build-v-<name>): every VARIANTS entry ("name=nvcc flags"; the first is the candidate),
#      while PyTorch SDPA times the shapes below on the idle GPU (torch.csv)
#   2. tests/gpu/test_gpu (full) on the candidate
#   3. scripts/bwd-variants.sh: the FLASH2 backward of every variant, interleaved, beside torch-flash
#   4. the forward at d=128 through FWD_ARGS tile choices on every variant (text tables)
#   5. the extra head dims (HDIMS) forward and backward on the candidate, FLASH2 and FLASH1
#   6. compute-sanitizer memcheck and racecheck on the small test set (candidate)
# Everything goes to $OUT/trial.tar.gz (+ summary.txt); each step runs under timeout.
# Env: OUT (default gpu-trial-out), VARIANTS, SEQLENS (default 2048,4096,16384), HDIMS (default 32,96,256; empty skips step 5),
#      FWD_ARGS (default "--block-q 0,256 --block-k 64"), BUDGET_S (the sanitizers run only within it, default 540).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-gpu-trial-out}
VARIANTS=${VARIANTS:-"cand="}
SEQLENS=${SEQLENS:-2048,4096,16384}
HDIMS=${HDIMS-32,96,256}  # empty: skip step 5
FWD_ARGS=${FWD_ARGS:-"--block-q 0,256 --block-k 64"}
W=trial-work
mkdir -p "$OUT" "$W"
SUM="$W/summary.txt"
: >"$SUM"
say() { echo "$*" | tee -a "$SUM"; }
IFS=';' read -ra VS <<<"$VARIANTS"
CAND=${VS[0]%%=*}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | head -1 | tee -a "$SUM"

t0=$(date +%s)
( timeout 240 python3 scripts/bench_gpu_torch.py run --out "$W/torch.csv" --d "64,128${HDIMS:+,$HDIMS}" --seqlen "$SEQLENS" \
    --causal 0,1 --pass fwd,bwd --reps 10 >"$W/torch.log" 2>&1 ) &
TP=$!
VARIANTS="$VARIANTS" bash scripts/build-variants.sh 2>&1 | tee -a "$SUM"
for nv in "${VS[@]}"; do cp "build-v-${nv%%=*}/build.log" "$W/build-${nv%%=*}.log" 2>/dev/null; done
say "== builds done in $(( $(date +%s) - t0 )) s"
wait $TP; say "== torch done in $(( $(date +%s) - t0 )) s"
B=build-v-$CAND

say "== test_gpu ($CAND)"
timeout 200 "$B/tests/gpu/test_gpu" >"$W/test_gpu.log" 2>&1; say "rc=$?"
grep -E "FAIL" "$W/test_gpu.log" | head -20 | tee -a "$SUM"; tail -2 "$W/test_gpu.log" | tee -a "$SUM"

say "== FLASH2 backward per variant (TFLOP/s)"
mkdir -p "$W/bwd"; cp "$W/torch.csv" "$W/bwd/torch.csv"
VARIANTS="$VARIANTS" OUT="$W/bwd" TORCH=0 SEQLENS="$SEQLENS" timeout 320 bash scripts/bwd-variants.sh 2>&1 | tee -a "$SUM"

say "== forward d=128, $FWD_ARGS"
for nv in "${VS[@]}"; do
  n=${nv%%=*}
  say "-- variant $n"
  timeout 60 "build-v-$n/flashattn" bench --device cuda --dtype bf16 --algo flash2 --d 128 --seqlen "$SEQLENS" \
    --causal 0,1 --pass fwd --reps 10 --warmup 2 $FWD_ARGS 2>&1 | tee -a "$SUM" | tail -n 20
done

if [ -n "$HDIMS" ]; then
  say "== head dims $HDIMS ($CAND): flash2 fwd+bwd, flash1 fwd+bwd at 4096"
  timeout 120 "$B/flashattn" bench --device cuda --dtype bf16 --algo flash2 --d "$HDIMS" --seqlen "$SEQLENS" \
    --causal 0,1 --pass fwd,bwd --reps 10 --warmup 2 --csv >"$W/hdims.csv" 2>"$W/hdims.err"
  timeout 60 "$B/flashattn" bench --device cuda --dtype bf16 --algo flash1 --d "$HDIMS" --seqlen 4096 \
    --causal 0,1 --pass fwd,bwd --reps 5 --warmup 1 --csv 2>>"$W/hdims.err" | tail -n +2 >>"$W/hdims.csv"
  python3 - "$W/hdims.csv" "$W/torch.csv" <<'PY' | tee -a "$SUM"
import csv, sys
t = {}
for r in csv.DictReader(open(sys.argv[2])):
    if r["algo"] == "torch-flash" and r["tflops"][:1].isdigit():
        t[(r["pass"], r["d"], r["seqlen"], r["causal"])] = float(r["tflops"])
print("algo pass d seqlen causal TFLOP/s torch-flash ratio")
for r in csv.DictReader(open(sys.argv[1])):
    k = (r["pass"], r["head_dim"], r["seqlen_q"], r["causal"])
    g = float(r["gflops"]) / 1000 if r["gflops"] else 0.0
    print(r["algo"], *k, "%.1f" % g, t.get(k, "-"), "%.2f" % (g / t[k]) if k in t and g else "-")
PY
fi

for tool in memcheck racecheck; do
  left=$(( t0 + ${BUDGET_S:-540} - $(date +%s) )); [ "$left" -gt 150 ] && left=150
  [ "$left" -ge 20 ] || { say "== compute-sanitizer $tool: skipped (no time left)"; continue; }
  say "== compute-sanitizer $tool (small, $CAND, timeout $left s)"
  FA_GPU_TEST_SMALL=1 timeout "$left" compute-sanitizer --tool $tool --error-exitcode 3 "$B/tests/gpu/test_gpu" \
    >"$W/san-$tool.log" 2>&1; say "rc=$?"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$W/san-$tool.log" | tail -2 | tee -a "$SUM"
done
say "== total $(( $(date +%s) - t0 )) s"
cp "$SUM" "$OUT/summary.txt"
tar czf "$OUT/trial.tar.gz" "$W"
