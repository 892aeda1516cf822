#!/usr/bin/env bash
# GPU benchmark (H100/H200): the protocol of docs/benchmarks.md for STANDARD, FLASH1, FLASH2, FLASH3 (our CLI),
# PyTorch's SDPA flash and cuDNN backends and the real FlashAttention-3 forward (when its wheel is installed or in
# FA3_WHEELS), in one command, printed as one table with TFLOP/s and ratios.
# Env: BUILD (default build-cuda), OUT_DIR (CSV + logs, default $BUILD/bench-gpu), SEQLENS, DIMS, PASSES, REPS,
#      STD_MAX_SEQLEN (STANDARD materialises Hq·S² fp32 per sequence: skipped above this, default 8192; 0 = skip
#      STANDARD), ALGOS (our flash algorithms, default flash3,flash2,flash1), FP8_DIMS (head dims of the e4m3
#      forward, ours beside FA3's, default 128,256; empty = none; one outside DIMS adds both bf16 forwards there).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-cuda}
OUT_DIR=${OUT_DIR:-$BUILD/bench-gpu}
SEQLENS=${SEQLENS:-512,1024,2048,4096,8192,16384}
DIMS=${DIMS:-64,128}
PASSES=${PASSES:-fwd,bwd}
REPS=${REPS:-10}
STD_MAX=${STD_MAX_SEQLEN:-8192}
ALGOS=${ALGOS:-flash3,flash2,flash1}
FP8_DIMS=${FP8_DIMS-128,256}
mkdir -p "$OUT_DIR"
if [ ! -x "$BUILD/flashattn" ]; then
  cmake -S . -B "$BUILD" -DFA_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD" -j "$(nproc)" >/dev/null
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader || true
# The real FlashAttention-3 forward as the FLASH3 forward's anchor: installed from the wheels in FA3_WHEELS (default
# .whl: `pip download --no-deps fa3-fwd==0.0.3 einops -d .whl` on a machine with PyPI); reported absent otherwise.
FA3_WHEELS=${FA3_WHEELS:-.whl}
if [ -d "$FA3_WHEELS" ] && ! python3 -c "import fa3_fwd_interface" 2>/dev/null; then
  python3 -m pip install -q --no-index --find-links "$FA3_WHEELS" fa3-fwd einops >"$OUT_DIR/fa3-install.log" 2>&1 || true
fi
std_seqlens=$(echo "$SEQLENS" | tr ',' '\n' | awk -v m="$STD_MAX" '$1 <= m' | paste -sd, -)
ours="$OUT_DIR/ours.csv"
"$BUILD/flashattn" bench --device cuda --dtype bf16 --algo "$ALGOS" --d "$DIMS" --seqlen "$SEQLENS" \
  --causal 0,1 --pass "$PASSES" --reps "$REPS" --warmup 2 --csv >"$ours" 2>"$OUT_DIR/ours.err" || true
[ -n "$std_seqlens" ] && { "$BUILD/flashattn" bench --device cuda --dtype bf16 --algo standard --d "$DIMS" \
  --seqlen "$std_seqlens" --causal 0,1 --pass "$PASSES" --reps "$REPS" --warmup 2 --csv 2>>"$OUT_DIR/ours.err" |
  tail -n +2 >>"$ours" || true; }
[ -n "$FP8_DIMS" ] && case ",$PASSES," in *,fwd,*) "$BUILD/flashattn" bench --device cuda --dtype f8_e4m3 --algo flash3 \
  --d "$FP8_DIMS" --seqlen "$SEQLENS" --causal 0,1 --pass fwd --reps "$REPS" --warmup 2 --csv 2>>"$OUT_DIR/ours.err" |
  tail -n +2 >>"$ours" || true ;; esac
# FP8 head dims outside DIMS: our bf16 FLASH3 forward there too, for the FP8 table's e4m3/bf16 column
fp8_only=$(echo "$FP8_DIMS" | tr ',' '\n' | grep -vxF -f <(echo "$DIMS" | tr ',' '\n') | paste -sd, - || true)
[ -n "$fp8_only" ] && case ",$PASSES," in *,fwd,*) "$BUILD/flashattn" bench --device cuda --dtype bf16 --algo flash3 \
  --d "$fp8_only" --seqlen "$SEQLENS" --causal 0,1 --pass fwd --reps "$REPS" --warmup 2 --csv 2>>"$OUT_DIR/ours.err" |
  tail -n +2 >>"$ours" || true ;; esac
PYTHONUNBUFFERED=1 python3 scripts/bench_gpu_torch.py run --out "$OUT_DIR/torch.csv" --d "$DIMS" --seqlen "$SEQLENS" \
  --causal 0,1 --pass "$PASSES" --reps "$REPS" --fp8 "$FP8_DIMS" >"$OUT_DIR/torch.log" 2>&1 || true
python3 scripts/bench_gpu_torch.py merge "$ours" "$OUT_DIR/torch.csv" | tee "$OUT_DIR/table.md"
[ -x "$BUILD/bench/bench_bwd_det" ] || cmake --build "$BUILD" -j "$(nproc)" --target bench_bwd_det >/dev/null
echo
echo "Deterministic backward vs default (FLASH2: dQ by a second kernel; FLASH3: dQ added in key-block order), bf16"
"$BUILD/bench/bench_bwd_det" | tee -a "$OUT_DIR/table.md"
