/* The tile tables of the mma.sync kernels: data, one table per kernel family. plan.cu picks a row (the first row
 * of a head dim is its default); each kernel file reaches the row's template instance through a plain switch on
 * the row index, so a row's numbers are written once, here. The head dims a family supports are the ones its
 * table lists. Figures: H200, bf16, TFLOP/s "non-causal | causal" at the sequence lengths named, registers from
 * -Xptxas -v (nvcc 13.0); docs/cuda-kernels.md has the sweeps. */
#ifndef FA_CUDA_MMA_SYNC_TILES_H
#define FA_CUDA_MMA_SYNC_TILES_H

/* FLASH1 forward: one CTA per (batch, head); Br = 16 query rows per step, NW warps split the Bc keys.
 * minb: CTAs per SM for the launch bounds (0 = none). */
struct fa_f1_fwd_row {
    int d, bm, bn, nw, minb;
    const char *kernel, *why;
};
#define FA_F1_FWD_ROW(D, BM, BN, NW, MINB, WHY) {D, BM, BN, NW, MINB, "cuda.flash1.fwd.mma_sync.d" #D, WHY}
static constexpr fa_f1_fwd_row fa_f1_fwd_rows[] = {
    FA_F1_FWD_ROW(32, 16, 256, 4, 4, "d=64's shape; with no CTA bound ptxas held 80 registers and spilled 12 B"),
    FA_F1_FWD_ROW(64, 16, 256, 4, 0, "V1's shape for d <= 64 at long sequences: 16 rows, 256 keys over 4 warps"),
    FA_F1_FWD_ROW(96, 16, 128, 4, 0, "d=128's shape (V1 has no d=96)"),
    FA_F1_FWD_ROW(128, 16, 128, 4, 0, "V1's shape at d=128: 16 rows, 128 keys over 4 warps"),
};
#undef FA_F1_FWD_ROW

/* FLASH2 forward: one CTA per query block, NW warps split its Br rows. ctas: CTAs per SM for the launch bounds;
 * nst: K/V stages (2 = double-buffered, 1 = FA2's single-buffered order). dv: v's and out's head_dim (d but for the
 * rows of a pair, dv != d). Rows past a head dim's first are reachable through opts.block_q/block_k, and rows that
 * differ only in warps through FA_CUDA_FLASH2_FWD_WARPS. */
struct fa_f2_fwd_row {
    int d, dv, bm, bn, nw, ctas, nst;
    const char *kernel, *why;
};
#define FA_F2_FWD_ROW(D, BM, BN, NW, CTAS, NST, SUFFIX, WHY)                                                      \
    {D, D, BM, BN, NW, CTAS, NST, "cuda.flash2.fwd.mma_sync.d" #D "." #BM "x" #BN "w" #NW SUFFIX, WHY}
#define FA_F2_FWD_PAIR(D, DV, BM, BN, NW, CTAS, NST, WHY)                                                        \
    {D, DV, BM, BN, NW, CTAS, NST, "cuda.flash2.fwd.mma_sync.d" #D "v" #DV "." #BM "x" #BN "w" #NW, WHY}
static constexpr fa_f2_fwd_row fa_f2_fwd_rows[] = {
    FA_F2_FWD_ROW(64, 128, 64, 4, 3, 2, "", "512 / 4k 267.7 / 305.3 | 143.2 / 265.7; 168 regs: 3 CTAs (12 warps) per SM"),
    FA_F2_FWD_ROW(64, 256, 64, 8, 1, 2, "", "210 regs: 1.98 ms at 4k against 1.88 for 128 x 64 at 2 CTAs/SM"),
    FA_F2_FWD_ROW(64, 128, 128, 8, 1, 2, "", "186 regs: 2.43 ms at 4k against 1.88 for 128 x 64 at 2 CTAs/SM"),
    FA_F2_FWD_ROW(64, 64, 64, 4, 4, 2, "", "119 regs, 4 CTAs/SM: 227.9 / 256.2 | 158.5 / 234.9, ahead causal at 512 only"),
    FA_F2_FWD_ROW(128, 128, 64, 4, 2, 2, "", "FA2's H100 tile: 282.6 / 331.5 | 158.9 / 277.9 at 512 / 4k; 253 regs"),
    FA_F2_FWD_ROW(128, 128, 64, 8, 1, 2, "", "153 regs: 0.609 / 2.245 / 8.803 ms at 1k / 4k / 16k (the 4-warp row: 1.611 at 4k)"),
    FA_F2_FWD_ROW(128, 128, 32, 4, 2, 2, "", "234 regs: 256.4 / 294.1 | 149.0 / 250.0 at 512 / 4k"),
    FA_F2_FWD_ROW(128, 64, 64, 4, 2, 2, "", "153 regs: 0.633 / 2.372 / 9.325 ms at 1k / 4k / 16k"),
    FA_F2_FWD_ROW(32, 128, 64, 4, 2, 2, "", "144 regs (3 CTAs/SM by registers): 194.9 / 225.2 | 93.7 / 193.9 at 512 / 4k"),
    FA_F2_FWD_ROW(32, 128, 128, 4, 2, 2, "", "FA2's tile, 254 regs: 174.8 / 214.4 | 72.5 / 180.2 at 512 / 4k"),
    FA_F2_FWD_ROW(256, 64, 64, 4, 2, 1, ".1stage", "FA2's H100 tile and order, 102 KB: 265.1 / 287.3 / 290.7 at 1k / 4k / 16k"),
    FA_F2_FWD_ROW(256, 128, 64, 8, 1, 2, "", "203 KB, 1 CTA/SM: 254.3 / 277.6 / 282.8 at 1k / 4k / 16k"),
    FA_F2_FWD_ROW(96, 128, 64, 4, 2, 2, "", "FA2's d=96 tile: 274.2 / 294.6 / 303.4 at 1k / 4k / 16k"),
    FA_F2_FWD_ROW(128, 256, 64, 8, 1, 2, "", "319.2 / 326.4 at 4k / 16k against 336.0 / 340.9 for the default"),
    FA_F2_FWD_PAIR(192, 128, 128, 64, 8, 1, 2, "MLA's pair; d = 128's 8-warp shape (Q, K rows of 192 fill 142 KB: "
                                               "1 CTA/SM), not yet measured"),
};
#undef FA_F2_FWD_ROW
#undef FA_F2_FWD_PAIR

/* The backward's per-K/V-block body (bwd_block.cuh), shared by FLASH2 (one CTA per K/V block) and FLASH1 (one CTA
 * per (batch, head) looping over the blocks); 8 warps, 1 CTA per SM. wk_s, wk_kv, wq_dq: the warp grid of the Sᵀ,
 * dK/dV and dQ GEMMs (bwd_block.cuh); p_split: P computed between the dPᵀ GEMM's k-steps on hot blocks; qstages:
 * Qi/dOi buffers; q_late: Qi+1, dOi+1 issued after the step's second barrier (not for FLASH1); algos: which
 * algorithms build the row (the first row of a head dim for an algorithm is its default); dq_bn: Bc of FLASH2's
 * deterministic dQ kernel (64 x dq_bn, 4 warps; d=256 takes 32 keys: 64 spilled 8 B, dQ alone is 128 registers).
 * dv: v's, out's, dout's and dv's head_dim (d but for the rows of a pair, dv != d: q, k, dq, dk rows are d wide). */
enum { FA_BWD_F2 = 1, FA_BWD_F1 = 2 };
struct fa_bwd_row {
    int d, dv, bm, bn, wk_s, wk_kv, wq_dq, p_split, qstages, q_late, algos, dq_bn;
    const char *why;
};
static constexpr fa_bwd_row fa_bwd_rows[] = {
    {64, 64, 128, 128, 2, 4, 4, 0, 2, 0, FA_BWD_F2, 64, "FA2's sm90 tile; P_SPLIT -1.2 % (an fp32 P spills), Q_LATE -3 %"},
    {64, 64, 64, 128, 4, 4, 2, 0, 2, 0, FA_BWD_F2 | FA_BWD_F1, 64,
     "FLASH2: 0.93x the 128 x 128 row at 4k; FLASH1: 128 x 128 spills 28 B in its outer loop"},
    {128, 128, 64, 128, 4, 4, 2, 1, 2, 1, FA_BWD_F2 | FA_BWD_F1, 64,
     "FA2's sm90 tile; P_SPLIT +1.3-2.7 %, Q_LATE +3 % at 2k-16k (FLASH1 spilled 12-16 B with Q_LATE)"},
    {32, 32, 128, 128, 2, 4, 4, 0, 2, 0, FA_BWD_F2, 64, "FA2's sm90 shape and layout, not swept: 0.88 / 0.94x torch at 4k"},
    {32, 32, 64, 128, 4, 4, 4, 0, 2, 0, FA_BWD_F2 | FA_BWD_F1, 64, "FA2's 64-row layout; FLASH1's d=32 tile"},
    {96, 96, 64, 128, 4, 4, 4, 0, 2, 0, FA_BWD_F2, 64, "FA2's sm90 shape, not swept: 0.94 / 1.00x torch at 4k"},
    {96, 96, 64, 64, 4, 4, 4, 0, 2, 0, FA_BWD_F1, 64, "half the dK/dV registers: 64 x 128 spilled 12 B in FLASH1's outer loop"},
    {256, 256, 64, 64, 4, 2, 2, 0, 1, 0, FA_BWD_F2, 32, "FA2's 4/2/2 layout, one Q/dO buffer: 217 of the 227 KB of shared memory"},
    {192, 128, 64, 64, 4, 2, 2, 0, 2, 0, FA_BWD_F2, 64,
     "MLA's pair: FA2's d=192 tile and 4/2/2 layout; dQ, dK 192 wide, dV, dO 128: 200 KB, not yet measured"},
};

/* plan->aux of a FLASH1/FLASH2 backward. */
enum {
    FA_CUDA_AUX_DET = 0,    /* 1: FLASH2's deterministic path (dQ by a second kernel) */
    FA_CUDA_AUX_SPLIT = 1,  /* K/V blocks of FLASH2's split last wave (0: no split) */
    FA_CUDA_AUX_PIECES = 2, /* CTAs of the split launch */
};

#endif
