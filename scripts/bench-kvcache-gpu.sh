#!/usr/bin/env bash
# GPU KV-cache decoding benchmark (H200; `make bench-kvcache-gpu`): our `flashattn bench --mode kvcache` (contiguous
# cache and pages of 16 and 256) and PyTorch's SDPA cuDNN and flash backends on the same shapes, in one command,
# printed as one table of TB/s of K+V read with the ratios (scripts/bench_kvcache_torch.py); then Nsight Compute's
# DRAM bytes of our attention kernel against the cache's size (GQA reads each K/V head once), when ncu is present.
# Env: BUILD (default build-cuda), OUT_DIR (CSV + logs, default $BUILD/bench-kvcache), BATCH, CACHE, HEADS_Q, HEADS_K
#      (lists), PAGES (default 0,16,256), REPS (default 20), APPEND (default 1: our call appends the new row; 0: the
#      cache already holds every key, as PyTorch's calls are timed), FLUSH (read, the default, or write: how the L2 is
#      evicted between calls on both sides; a write leaves dirty lines that the timed call then writes back), LAYOUT
#      (bshd, the default: our cache as [.., seq, heads, d], flash-attn's layout; bhsd: [.., heads, seq, d], the
#      layout PyTorch's calls read).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-cuda}
OUT_DIR=${OUT_DIR:-$BUILD/bench-kvcache}
BATCH=${BATCH:-1,16,64}
CACHE=${CACHE:-1024,8192,65536}
HEADS_Q=${HEADS_Q:-8,32}
HEADS_K=${HEADS_K:-8}
PAGES=${PAGES:-0,16,256}
REPS=${REPS:-20}
APPEND=${APPEND:-1}
FLUSH=${FLUSH:-read}
LAYOUT=${LAYOUT:-bshd}
mkdir -p "$OUT_DIR"
if [ ! -x "$BUILD/flashattn" ]; then
  cmake -S . -B "$BUILD" -DFA_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD" -j "$(nproc)" >/dev/null
fi
FA=$BUILD/flashattn
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader || true
"$FA" bench --mode kvcache --device cuda --dtype bf16 --d 128 --batch "$BATCH" --seqlen-k "$CACHE" --page "$PAGES" \
  --heads "$HEADS_Q" --heads-k "$HEADS_K" --reps "$REPS" --warmup 3 --append "$APPEND" --flush "$FLUSH" --layout "$LAYOUT" --csv >"$OUT_DIR/ours.csv" 2>"$OUT_DIR/ours.err" || true
heads=$(for q in ${HEADS_Q//,/ }; do for k in ${HEADS_K//,/ }; do echo "$q/$k"; done; done | paste -sd, -)
PYTHONUNBUFFERED=1 python3 scripts/bench_kvcache_torch.py run --out "$OUT_DIR/torch.csv" --batch "$BATCH" \
  --cache "$CACHE" --heads "$heads" --d 128 --reps "$REPS" --flush "$FLUSH" >"$OUT_DIR/torch.log" 2>&1 || true
python3 scripts/bench_kvcache_torch.py merge "$OUT_DIR/ours.csv" "$OUT_DIR/torch.csv" | tee "$OUT_DIR/table.md"
if command -v ncu >/dev/null; then
  echo
  echo "DRAM bytes of the attention kernel (ncu), batch 16, 8k cache, bf16, d 128, against the K+V bytes of the cache"
  for hq in ${HEADS_Q//,/ }; do
    hk=${HEADS_K%%,*}
    ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum -k regex:splitkv --launch-count 1 --csv \
      "$FA" bench --mode kvcache --device cuda --dtype bf16 --d 128 --batch 16 --seqlen-k 8192 --heads "$hq" \
      --heads-k "$hk" --reps 1 --warmup 0 >"$OUT_DIR/ncu-$hq-$hk.csv" 2>&1 || true
    read_b=$(grep -E '"dram__bytes_read.sum"' "$OUT_DIR/ncu-$hq-$hk.csv" | awk -F'","' '{u=$(NF-1); v=$NF; gsub(/[",]/,"",v); print v, u}' | head -1 || true)
    echo "hq/hk $hq/$hk: DRAM read $read_b; the cache's K+V: $(( 2 * 16 * 8192 * hk * 128 * 2 / 1000000 )) MB"
  done | tee -a "$OUT_DIR/table.md"
fi
