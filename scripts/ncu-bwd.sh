#!/usr/bin/env bash
# Profile one FLASH2 backward kernel (and PyTorch's flash backward at the same shape) with Nsight Compute on the
# H200: speed of light, warp stall reasons, pipes, shared-memory conflicts. Env: OUT (logs), BUILD, D, SEQLEN.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-ncu-out}; BUILD=${BUILD:-build-ncu}; D=${D:-128}; S=${SEQLEN:-4096}
mkdir -p "$OUT"
[ -x "$BUILD/flashattn" ] || { cmake -S . -B "$BUILD" -DFA_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null &&
  cmake --build "$BUILD" -j "$(nproc)" --target flashattn_cli >/dev/null; } || exit 1
SECTIONS=(--section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section SchedulerStats
  --section MemoryWorkloadAnalysis_Tables --metrics smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,smsp__inst_executed_op_ldsm.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio)
B=$((16384 / S)); H=$((2048 / D))
ncu --clock-control none -k regex:flash2_bwd_kernel -c 1 "${SECTIONS[@]}" "$BUILD/flashattn" bench --device cuda \
  --dtype bf16 --algo flash2 --d "$D" --seqlen "$S" --pass bwd --reps 1 --warmup 0 ${BLOCK_Q:+--block-q $BLOCK_Q} \
  >"$OUT/ncu-ours-d$D.txt" 2>&1
cat >"$OUT/torch_bwd.py" <<PY
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
q, k, v = (torch.randn($B, $H, $S, $D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    o = F.scaled_dot_product_attention(q, k, v)
    o.backward(torch.randn_like(o))
torch.cuda.synchronize()
PY
ncu --clock-control none -k regex:dq_dk_dv -c 1 "${SECTIONS[@]}" python3 "$OUT/torch_bwd.py" >"$OUT/ncu-torch-d$D.txt" 2>&1
for f in "$OUT"/ncu-ours-d$D.txt "$OUT"/ncu-torch-d$D.txt; do
  echo "== $f"
  grep -E "^\s+[a-z_]+\s+\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Stall|stall|Warp Cycles Per Issued|bank_conflicts|ldsm|hmma|stalled|inst_executed.sum|L1/TEX Hit|Executed Ipc A|One or More Eligible|Eligible Warps|Active Warps Per" "$f" | grep -v "^    ---" | head -60
done
