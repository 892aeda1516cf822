#!/usr/bin/env bash
# GPU (H100/H200): the two targets of learnable sinks and a V head dim of its own, in one command (docs/benchmarks.md):
#   1. the cost of sinks: FLASH2 and FLASH3, forward and backward (d_sinks asked for), at the protocol shapes, each
#      call timed without and with sinks interleaved in one group (`flashattn bench --sinks 0,1`), and KV-cache
#      decoding (`bench --mode kvcache --sinks 0,1`); the table gives ms with / ms without (target <= 1.03);
#   2. (dqk, dv) = (192, 128) against (128, 128) at 8k (batch 2, 16 heads both: the same grid), forward and
#      backward: TFLOP/s per FLOP (the FLOPs count dqk for QK^T and dv for PV), the ratio (target >= 0.95), with
#      PyTorch's flash and cuDNN SDPA backends on the same shapes as the anchor (cuDNN takes (192, 128)).
# Env: BUILD (default build-cuda), OUT_DIR (CSVs, default $BUILD/bench-sinks), SEQLENS, DIMS, REPS, ALGOS.
set -euo pipefail
cd "$(dirname "$0")/.."
export FA_CUDA_FLASH3_BWD_PAIRS=${FA_CUDA_FLASH3_BWD_PAIRS:-1} # the FLASH3 backward's (192, 128) row (off by default)
BUILD=${BUILD:-build-cuda}
OUT_DIR=${OUT_DIR:-$BUILD/bench-sinks}
SEQLENS=${SEQLENS:-512,1024,2048,4096,8192,16384}
DIMS=${DIMS:-64,128}
REPS=${REPS:-10}
ALGOS=${ALGOS:-flash2,flash3}
mkdir -p "$OUT_DIR"
if [ ! -x "$BUILD/flashattn" ]; then
  cmake -S . -B "$BUILD" -DFA_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD" -j "$(nproc)" --target flashattn >/dev/null
fi
FA="$BUILD/flashattn"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader || true

"$FA" bench --device cuda --dtype bf16 --algo "$ALGOS" --d "$DIMS" --seqlen "$SEQLENS" --causal 0,1 --pass fwd,bwd \
  --sinks 0,1 --reps "$REPS" --warmup 2 --csv >"$OUT_DIR/sinks.csv" 2>"$OUT_DIR/sinks.err" || true
"$FA" bench --mode kvcache --device cuda --dtype bf16 --d 128 --batch 1,16,64 --seqlen-k 1024,8192,65536 --page 0,256 \
  --sinks 0,1 --reps 20 --csv >"$OUT_DIR/sinks-kvcache.csv" 2>"$OUT_DIR/sinks-kvcache.err" || true
"$FA" bench --device cuda --dtype bf16 --algo "$ALGOS" --d 128,192 --dv 128 --seqlen 8192 --batch 2 --heads 16 \
  --causal 0,1 --pass fwd,bwd --reps "$REPS" --warmup 2 --csv >"$OUT_DIR/dv.csv" 2>"$OUT_DIR/dv.err" || true
# the anchor: PyTorch's SDPA backends on the same two shapes (cuDNN has (192, 128) in both passes)
for d in 128 192; do
  python3 scripts/bench_gpu_torch.py run --out "$OUT_DIR/dv-torch-$d.csv" --d "$d" --dv 128 --heads 16 --seqlen 8192 \
    --causal 0,1 --pass fwd,bwd --reps "$REPS" >"$OUT_DIR/dv-torch-$d.log" 2>&1 || true
done

python3 - "$OUT_DIR" <<'EOF' | tee "$OUT_DIR/table.md"
import csv, sys
out = sys.argv[1]
def rows(name):
    with open(f"{out}/{name}") as f:
        return list(csv.DictReader(f))
def ms(r):
    try: return float(r["ms"])
    except ValueError: return None
def ratios(title, name, cols):
    """rows with sinks 0 and 1 of the same cols: ms without, ms with and their ratio"""
    print(title + "\n")
    print("| " + " | ".join(cols) + " | ms without | ms with | ratio |")
    print("|" + "---|" * (len(cols) + 3))
    base = {}
    for r in rows(name):
        key = tuple(r[c] for c in cols)
        if r["sinks"] == "0": base[key] = ms(r)
        elif key in base:
            a, b = base[key], ms(r)
            ratio = f"{b / a:.3f}" if a and b else "-"
            print("| " + " | ".join(key) + f" | {a} | {b} | {ratio} |")
ratios("## Sinks: ms with / ms without (the same call, interleaved; target <= 1.03)", "sinks.csv",
       ["algo", "head_dim", "seqlen_q", "causal", "pass"])
ratios("\n## Sinks in KV-cache decoding: ms with / ms without (target <= 1.03)", "sinks-kvcache.csv",
       ["batch", "cache", "page"])
print("\n## (192, 128) against (128, 128) at 8k: TFLOP/s per FLOP (target >= 0.95)\n")
print("| algo | causal | pass | (128,128) TFLOP/s | (192,128) TFLOP/s | ratio |")
print("|---|---:|---|---:|---:|---:|")
rate = {}
for r in rows("dv.csv"):
    try: rate[(r["algo"], r["causal"], r["pass"], r["head_dim"])] = float(r["gflops"]) / 1e3
    except ValueError: pass
for d in ("128", "192"):  # PyTorch's backends beside ours (absent where torch is)
    try: torch_rows = rows(f"dv-torch-{d}.csv")
    except OSError: continue
    for r in torch_rows:
        try: rate[(r["algo"], r["causal"], r["pass"], r["d"])] = float(r["tflops"])
        except ValueError: pass
for (algo, causal, pss, d), t in sorted(rate.items()):
    if d != "192": continue
    b = rate.get((algo, causal, pss, "128"))
    print(f"| {algo} | {causal} | {pss} | {b:.1f} | {t:.1f} | {t / b:.3f} |" if b else
          f"| {algo} | {causal} | {pss} | - | {t:.1f} | - |")
print("\n(192, 128) TFLOP/s against cuDNN's: " + ", ".join(
    f"{algo} causal {c} {pss} {t / rate[('torch-cudnn', c, pss, '192')]:.2f}x"
    for (algo, c, pss, d), t in sorted(rate.items())
    if d == "192" and not algo.startswith("torch") and rate.get(("torch-cudnn", c, pss, "192"))))
EOF
echo "CSVs and stderr (skipped rows say why): $OUT_DIR"
