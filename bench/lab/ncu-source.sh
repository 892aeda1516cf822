#!/usr/bin/env bash
# Nsight Compute on one of our kernels (FLASH2 or FLASH3) and on PyTorch's flash kernel for the same pass at one shape: speed of light,
# stall reasons, pipes, shared-memory bank conflicts, ldmatrix count, and per-instruction (SASS) warp-stall sampling
# (which instructions the warps wait on). Prints the top instructions and the samples
# per opcode (bench/lab/ncu-top.py) and writes $OUT/ncu-source.tar.gz (both source pages as CSV + summaries).
# Env: OUT, BUILD (default build-ncu), ALGO (flash2 | flash3), PASS (bwd | fwd), D (64), SEQLEN (4096), CAUSAL (0 | 1),
# BLOCK_Q (our tile), TORCH (1; 0 = our kernel only).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-ncu-out}; BUILD=${BUILD:-build-ncu}; D=${D:-64}; S=${SEQLEN:-4096}; PASS=${PASS:-bwd}; CAUSAL=${CAUSAL:-0}
ALGO=${ALGO:-flash2}; K=${ALGO/flash3/fa3}
if [ "$PASS" = fwd ]; then OURS_K=${K}_fwd_kernel; TORCH_K=flash_fwd; else OURS_K=${K}_bwd_kernel; TORCH_K=dq_dk_dv; fi
RUNS=ours; [ "${TORCH:-1}" = 1 ] && RUNS="ours torch"
W=$(mktemp -d); mkdir -p "$OUT"
[ -x "$BUILD/flashattn" ] || { cmake -S . -B "$BUILD" -DFA_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null &&
  cmake --build "$BUILD" -j "$(nproc)" --target flashattn_cli >/dev/null; } || exit 1
ncu --version | tail -1
SEC=(--section SourceCounters --section WarpStateStats --section SchedulerStats --section InstructionStats
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --import-source no
  --metrics smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,smsp__inst_executed_op_ldsm.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio)
B=$((16384 / S)); H=$((2048 / D))
ncu --clock-control none -k regex:"$OURS_K" -c 1 "${SEC[@]}" -f -o "$W/ours" "$BUILD/flashattn" bench --device cuda \
  --dtype bf16 --algo "$ALGO" --d "$D" --seqlen "$S" --causal "$CAUSAL" --pass "$PASS" --reps 1 --warmup 0 ${BLOCK_Q:+--block-q $BLOCK_Q} >"$W/ours.log" 2>&1
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
[ "${TORCH:-1}" = 1 ] && ncu --clock-control none -k regex:"$TORCH_K" -c 1 "${SEC[@]}" -f -o "$W/torch" python3 "$W/torch_pass.py" >"$W/torch.log" 2>&1
for r in $RUNS; do
  ncu -i "$W/$r.ncu-rep" --page source --print-source sass --csv >"$W/$r-sass.csv" 2>"$W/$r-sass.err"
  ncu -i "$W/$r.ncu-rep" --page details >"$W/$r-details.txt" 2>&1
  echo "== $r: $(wc -l <"$W/$r-sass.csv") SASS lines"
  grep -E "Duration|Warp Cycles Per Issued|Issued Ipc|Executed Ipc A|bank_conflicts|ldsm|hmma|stalled|inst_executed.sum" \
    "$W/$r-details.txt" | head -40
  python3 bench/lab/ncu-top.py "$W/$r-sass.csv" 30 2>&1 | tee "$W/$r-top.txt"
done
tar -C "$W" -czf "$OUT/ncu-source.tar.gz" $(cd "$W" && ls ./*-top.txt ./*-sass.csv ./*-details.txt ./*.log ./*-sass.err)
