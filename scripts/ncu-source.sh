#!/usr/bin/env bash
# Per-instruction (SASS) warp-stall sampling of the FLASH2 backward kernel and of PyTorch's flash backward at one
# shape, with Nsight Compute: which instructions the warps wait on. Writes $OUT/ncu-source.tar.gz (the two reports'
# source pages as CSV + the summaries). Env: OUT, BUILD (default build-ncu), D (64), SEQLEN (4096), KREGEX.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-ncu-out}; BUILD=${BUILD:-build-ncu}; D=${D:-64}; S=${SEQLEN:-4096}
W=$(mktemp -d); mkdir -p "$OUT"
[ -x "$BUILD/flashattn" ] || { cmake -S . -B "$BUILD" -DFA_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null &&
  cmake --build "$BUILD" -j "$(nproc)" --target flashattn_cli >/dev/null; } || exit 1
ncu --version | tail -1
SEC=(--section SourceCounters --section WarpStateStats --section SchedulerStats --section InstructionStats
  --section SpeedOfLight --import-source no)
B=$((16384 / S)); H=$((2048 / D))
ncu --clock-control none -k regex:"${KREGEX:-flash2_bwd_kernel}" -c 1 "${SEC[@]}" -f -o "$W/ours" "$BUILD/flashattn" bench \
  --device cuda --dtype bf16 --algo flash2 --d "$D" --seqlen "$S" --pass bwd --reps 1 --warmup 0 >"$W/ours.log" 2>&1
cat >"$W/torch_bwd.py" <<PY
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
q, k, v = (torch.randn($B, $H, $S, $D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    o = F.scaled_dot_product_attention(q, k, v)
    o.backward(torch.randn_like(o))
torch.cuda.synchronize()
PY
ncu --clock-control none -k regex:dq_dk_dv -c 1 "${SEC[@]}" -f -o "$W/torch" python3 "$W/torch_bwd.py" >"$W/torch.log" 2>&1
for r in ours torch; do
  ncu -i "$W/$r.ncu-rep" --page source --print-source sass --csv >"$W/$r-sass.csv" 2>"$W/$r-sass.err"
  ncu -i "$W/$r.ncu-rep" --page details >"$W/$r-details.txt" 2>&1
  echo "== $r: $(wc -l <"$W/$r-sass.csv") SASS lines"; grep -E "Duration|Warp Cycles Per Issued|Issued Ipc|Executed Ipc A" "$W/$r-details.txt"
  python3 scripts/ncu-top.py "$W/$r-sass.csv" 30 2>&1 | tee "$W/$r-top.txt"
done
tar -C "$W" -czf "$OUT/ncu-source.tar.gz" ours-top.txt torch-top.txt ours-sass.csv torch-sass.csv ours-details.txt torch-details.txt ours.log torch.log ours-sass.err torch-sass.err
