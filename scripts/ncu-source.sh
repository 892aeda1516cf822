#!/usr/bin/env bash
# Per-instruction (SASS) warp-stall sampling of a FLASH2 kernel and of PyTorch's flash kernel for the same pass at
# one shape, with Nsight Compute: which instructions the warps wait on. Prints the top instructions and the samples
# per opcode (scripts/ncu-top.py) and writes $OUT/ncu-source.tar.gz (both source pages as CSV + summaries).
# Env: OUT, BUILD (default build-ncu), PASS (bwd | fwd), D (64), SEQLEN (4096), CAUSAL (0 | 1).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-ncu-out}; BUILD=${BUILD:-build-ncu}; D=${D:-64}; S=${SEQLEN:-4096}; PASS=${PASS:-bwd}; CAUSAL=${CAUSAL:-0}
if [ "$PASS" = fwd ]; then OURS_K=flash2_fwd_kernel; TORCH_K=flash_fwd; else OURS_K=flash2_bwd_kernel; TORCH_K=dq_dk_dv; fi
W=$(mktemp -d); mkdir -p "$OUT"
[ -x "$BUILD/flashattn" ] || { cmake -S . -B "$BUILD" -DFA_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null &&
  cmake --build "$BUILD" -j "$(nproc)" --target flashattn_cli >/dev/null; } || exit 1
ncu --version | tail -1
SEC=(--section SourceCounters --section WarpStateStats --section SchedulerStats --section InstructionStats
  --section SpeedOfLight --import-source no)
B=$((16384 / S)); H=$((2048 / D))
ncu --clock-control none -k regex:"$OURS_K" -c 1 "${SEC[@]}" -f -o "$W/ours" "$BUILD/flashattn" bench --device cuda \
  --dtype bf16 --algo flash2 --d "$D" --seqlen "$S" --causal "$CAUSAL" --pass "$PASS" --reps 1 --warmup 0 >"$W/ours.log" 2>&1
cat >"$W/torch_pass.py" <<PY
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
q, k, v = (torch.randn($B, $H, $S, $D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    o = F.scaled_dot_product_attention(q, k, v, is_causal=bool($CAUSAL))
    if "$PASS" == "bwd":
        o.backward(torch.randn_like(o))
torch.cuda.synchronize()
PY
ncu --clock-control none -k regex:"$TORCH_K" -c 1 "${SEC[@]}" -f -o "$W/torch" python3 "$W/torch_pass.py" >"$W/torch.log" 2>&1
for r in ours torch; do
  ncu -i "$W/$r.ncu-rep" --page source --print-source sass --csv >"$W/$r-sass.csv" 2>"$W/$r-sass.err"
  ncu -i "$W/$r.ncu-rep" --page details >"$W/$r-details.txt" 2>&1
  echo "== $r: $(wc -l <"$W/$r-sass.csv") SASS lines"; grep -E "Duration|Warp Cycles Per Issued|Issued Ipc|Executed Ipc A" "$W/$r-details.txt"
  python3 scripts/ncu-top.py "$W/$r-sass.csv" 30 2>&1 | tee "$W/$r-top.txt"
done
tar -C "$W" -czf "$OUT/ncu-source.tar.gz" ours-top.txt torch-top.txt ours-sass.csv torch-sass.csv ours-details.txt torch-details.txt ours.log torch.log ours-sass.err torch-sass.err
