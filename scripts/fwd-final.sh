#!/usr/bin/env bash
# FLASH2 forward on the H200 in one device run: build (ptxas registers/spills in build.log), PyTorch SDPA at the
# protocol shapes in the background during the build, our FLASH2 forward at the protocol shapes (d 64/128, seqlen
# 512..16k, causal and not; d 32/256 at 512 and 4k), the same forward of an older tree in ./old when present
# (A/B in one command), then the full GPU test. Files under $OUT (8 at most): run.log is the caller's tee.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-fwd-final-out}; B=build-fwd-final; mkdir -p "$OUT"
t0=$(date +%s)
el() { echo "$(( $(date +%s) - t0 )) s"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
( PYTHONUNBUFFERED=1 timeout 110 python3 scripts/bench_gpu_torch.py run --out "$OUT/torch.csv" --d 64,128 \
    --seqlen 512,1024,2048,4096,8192,16384 --causal 0,1 --pass fwd --reps 10 >"$OUT/torch.log" 2>&1
  PYTHONUNBUFFERED=1 timeout 40 python3 scripts/bench_gpu_torch.py run --out "$OUT/torch2.csv" --d 32,256 \
    --seqlen 512,4096 --causal 0,1 --pass fwd --reps 10 >>"$OUT/torch.log" 2>&1 ) &
TP=$!
build() {
  cmake -S "$1" -B "$2" -DFA_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_FLAGS=-Xptxas=-v >/dev/null &&
    timeout 170 cmake --build "$2" -j16 --target flashattn_cli $3
}
build . $B test_gpu >"$OUT/build.log" 2>&1 &
BP=$!
OP=
if [ -d old ]; then build old old/build "" >/tmp/build-old.log 2>&1 & OP=$!; fi
wait $BP; BRC=$?
[ -n "$OP" ] && wait $OP
echo "build rc=$BRC ($(el)); spill warnings: $(grep -c 'Registers are spilled' "$OUT/build.log")"
grep -E " error|error:" "$OUT/build.log" | head
wait $TP
echo "torch done ($(el))"
common=(--device cuda --dtype bf16 --algo flash2 --pass fwd --reps 10 --warmup 2 --csv)
timeout 60 $B/flashattn bench "${common[@]}" --d 64,128 --seqlen 512,1024,2048,4096,8192,16384 --causal 0,1 >"$OUT/ours.csv"
timeout 30 $B/flashattn bench "${common[@]}" --d 32,256 --seqlen 512,4096 --causal 0,1 | tail -n +2 >>"$OUT/ours.csv"
echo "ours done ($(el))"
if [ -x old/build/flashattn ]; then
  timeout 30 old/build/flashattn bench "${common[@]}" --d 64,128 --seqlen 512,4096 --causal 0,1 >"$OUT/old.csv"
  timeout 30 $B/flashattn bench "${common[@]}" --d 64,128 --seqlen 512,4096 --causal 0,1 | tail -n +2 >>"$OUT/ours.csv"
  echo "old tree + ours again done ($(el))"
fi
timeout ${TEST_S:-180} $B/tests/gpu/test_gpu >"$OUT/test_gpu.log" 2>&1
echo "test_gpu rc=$? ($(el)): $(tail -1 "$OUT/test_gpu.log")"
grep -m10 FAIL "$OUT/test_gpu.log"
