/* The FLASH3 forward's tile table: data, one row per built (head dims, key block). The plan takes the first row of
 * the call's (d, dv) whose masks include the call's; flash3_fwd.cu reaches the row's template instance through a
 * plain switch on the row index (and checks the numbers against fa3_tile), so the head dims FLASH3 supports are the
 * ones listed here.
 * Figures: H200, bf16, TFLOP/s at 16k tokens (README.md beside this file has the sweep). */
#ifndef FA_CUDA_WGMMA_TILES_H
#define FA_CUDA_WGMMA_TILES_H

/* masks: the calls a row takes: unmasked, masked (causal or a window), or both. */
enum { FA3_UNMASKED = 1, FA3_MASKED = 2, FA3_ANY_MASK = 3 };
/* bm x bn = Br x Bc (a call's block_k picks the row of that bn whatever its masks); wide: FA3's larger key block
 * (fa3_tile's WIDE); threads: one producer and two consumer warpgroups, one persistent CTA per SM; f8: e4m3 q, k, v
 * (out f16 or bf16), V transposed first (flash3_fp8.cuh); cl: 2 = also built for 2-CTA clusters sharing K and V
 * (README.md), taken by unmasked fixed-length calls with an even number of query blocks per head (kernel_cl). */
/* qb: the Q buffers its shared memory holds (fa3_tile::QB, checked): 2 on the 16-bit two-warpgroup rows where two
 * fit in 227 KB beside the K/V stages, so that the next tile's Q loads under this one's last GEMMs (README.md;
 * FA_CUDA_FLASH3_QBUF=0: the one-buffer timing), at most FA3_FWD_Q_BUFFERS (1 builds none: A/B builds). */
#define FA3_FWD_Q_BUFFERS 2
#define FA3_QB(N) ((N) < FA3_FWD_Q_BUFFERS ? (N) : FA3_FWD_Q_BUFFERS)
struct fa3_fwd_row {
    int d, dv, bm, bn, wide, masks, threads, f8; /* dv: v's and out's head dim (MLA's 192 / 128), else d */
    int sk_min; /* taken only from this many keys on (seqlen_k; varlen: max_seqlen_k) */
    int cl, qb;
    const char *kernel, *kernel_cl, *why;
};
#define FA3_FWD_ROW(D, BN, WIDE, MASKS, SK_MIN, CL, QB, WHY)                                                         \
    {D, D, 128, BN, WIDE, MASKS, 384, 0, SK_MIN, CL, FA3_QB(QB), "cuda.flash3.fwd.wgmma.d" #D ".128x" #BN,        \
     "cuda.flash3.fwd.wgmma.d" #D ".128x" #BN ".cl2", WHY}
#define FA3_FWD_ROW8(D, BN, WIDE, SK_MIN, WHY)                                                                       \
    {D, D, 128, BN, WIDE, FA3_ANY_MASK, 384, 1, SK_MIN, 1, 1, "cuda.flash3.fwd.wgmma.e4m3.d" #D ".128x" #BN,      \
     nullptr, WHY}
#define FA3_FWD_ROW3(D, BN, SK_MIN, WHY)                                                                             \
    {D, D, 192, BN, 1, FA3_ANY_MASK, 512, 0, SK_MIN, 1, 1, "cuda.flash3.fwd.wgmma.d" #D ".192x" #BN,              \
     nullptr, WHY}
/* v's head dim of its own (dv < d): Q and K tiles of d columns, V and O of dv (MLA's 192 / 128: Q 48 KB and two
 * stages of K 48 KB + V 32 KB, one Q buffer) */
#define FA3_FWD_ROWV(D, DV, BN, WHY)                                                                                 \
    {D, DV, 128, BN, 0, FA3_ANY_MASK, 384, 0, 0, 1, 1, "cuda.flash3.fwd.wgmma.d" #D "v" #DV ".128x" #BN, nullptr, WHY}
static constexpr fa3_fwd_row fa3_fwd_rows[] = {
    /* three consumer warpgroups at 160 registers: P stays in registers up to 128 keys (ptx.cuh keeps the descriptors
     * in uniform registers; without that 128 keys spilled 48 bytes) */
    FA3_FWD_ROW3(64, 128, 4096, "H100, 16k: 561 vs 546, causal 520 vs 510 against 192 x 112 (which beat 128 x 128)"),
    FA3_FWD_ROW(64, 128, 0, FA3_ANY_MASK, 0, 1, 2, "the wide 192 was slower below 8k (271 vs 320 at 512), equal above"),
    /* cl 2 at d = 128 and 256 (FA3's choice: 16-bit, head_dim >= 128): at peak the K/V blocks the CTAs read are
     * ~7.7 TB/s of L2-to-SM traffic over 132 SMs (1 byte per Br FLOPs), a large share of the L2's bandwidth; the
     * multicast halves it */
    FA3_FWD_ROW(128, 176, 1, FA3_ANY_MASK, 4096, 2, 1, "H100, 16k: 676 vs 648, causal 642 vs 617 against 128 keys"),
    FA3_FWD_ROW(128, 128, 0, FA3_ANY_MASK, 0, 2, 2,
                "H100, 1k: even unmasked (457 vs 456), causal 302 vs 281 against 176"),
    FA3_FWD_ROW(256, 80, 1, FA3_ANY_MASK, 0, 2, 1, "671 vs 619 at 16k, 623 vs 582 at 4k against 64 keys"),
    /* e4m3: Vᵀ in 128-key panels (192 keys: the second panel half used). 224 keys (FA3's) spill 16 bytes. Not
     * built: d = 64 (64-byte rows: another swizzle) */
    FA3_FWD_ROW8(128, 192, 1, 4096, "H100, 16k: 827 vs 790, causal 807 vs 780 against 128 keys; even at 4k"),
    FA3_FWD_ROW8(128, 128, 0, 0, "H100, 1k: 483 vs 445, causal 310 vs 294 against 192 keys"),
    FA3_FWD_ROW8(256, 96, 0, 0, "128 keys spill 28 bytes (S, O and P: 208 registers); Vᵀ's panel three quarters used"),
    /* S (64) + O (64) + P (32) registers; 176 keys leave no room for a second K/V stage */
    FA3_FWD_ROWV(192, 128, 128, "MLA's pair: the (128, 128) row's loop with 192-column Q and K tiles"),
};
#undef FA3_FWD_ROW
#undef FA3_FWD_ROW8
#undef FA3_FWD_ROW3
#undef FA3_FWD_ROWV

/* The FLASH3 backward's rows: one CTA per Bc = bn keys of one K/V head, walking Br = bm query rows per step;
 * Br = 128 at d = 64 (FA3's tile), 64 at d = 128 (dK, dV, Sᵀ and dPᵀ in 240 registers), 64 x 64 at d = 256 with the
 * warpgroups splitting D (flash3_bwd_steps.cuh). auto_pick: FA_ALGO_AUTO takes the row only where it beats FLASH2's backward (else AUTO moves on to
 * FLASH2); figures: H100, bf16, 16k tokens, TFLOP/s FLASH3 / FLASH2. */
struct fa3_bwd_row {
    int d, dv, bm, bn, threads, auto_pick;
    const char *kernel, *kernel_det, *why;
};
#define FA3_BWD_ROW(D, BM, BN, AUTO, WHY)                                                                            \
    {D, D, BM, BN, 384, AUTO, "cuda.flash3.bwd.wgmma.d" #D "." #BM "x" #BN,                                         \
     "cuda.flash3.bwd.wgmma.deterministic.d" #D "." #BM "x" #BN, WHY}
/* v with a head dim of its own: the d = 256 kernel's tile, its columns split at panels (flash3_bwd_wide.cuh) */
#define FA3_BWD_ROWV(D, DV, WHY)                                                                                     \
    {D, DV, 64, 64, 384, 1, "cuda.flash3.bwd.wgmma.d" #D "v" #DV ".64x64",                                           \
     "cuda.flash3.bwd.wgmma.deterministic.d" #D "v" #DV ".64x64", WHY}
static constexpr fa3_bwd_row fa3_bwd_rows[] = {
    FA3_BWD_ROW(64, 128, 128, 1, "FA3's d = 64 tile; 294 / 269 at 4k, 330 / 296 at 16k, causal 1k 139 / 140 (a tie)"),
    FA3_BWD_ROW(128, 64, 128, 1, "FA3's d = 128 tile; 421 / 309 at 4k, 480 / 336 at 16k, causal 16k 461 / 322"),
    FA3_BWD_ROW(256, 64, 64, 1, "FA3's d = 256 tile; 382 / 253 at 4k, 437 / 259 at 16k, causal 1k 191 / 156"),
    FA3_BWD_ROWV(192, 128, "MLA's pair: 64 x 128 of dK + dQ and 64 x 64 of dK + dQ with 64 x 128 of dV a warpgroup"),
};
#undef FA3_BWD_ROW
#undef FA3_BWD_ROWV
/* The backward rows whose main kernel can convert dQ (flash3_bwd_dq.cuh): d = 64, 128, where its staging buffer fits
 * beside the tiles (not beside d = 256's or the pair's). The plan and the kernel's tile (fa3b_tile::FUSE) both ask. */
constexpr bool fa3_bwd_fuses_dq(int d, int dv) { return d <= 128 && dv == d; }
/* plan->aux[FA3_BWD_AUX_DET]: 1 = the deterministic instance (key blocks add dQ in descending order);
 * [FA3_BWD_AUX_FUSED]: 1 = the main kernel converts dQ (flash3_bwd_dq.cuh), no separate pass */
enum { FA3_BWD_AUX_DET = 0, FA3_BWD_AUX_FUSED = 1 };
/* plan->aux[FA3_FWD_AUX_CL]: 2 = the forward row's 2-CTA cluster instance (cl), in a grid of whole clusters;
 * [FA3_FWD_AUX_QBUF]: the Q buffers the kernel uses (1, or the row's qb); [FA3_FWD_AUX_EARLY]: 1 = the producer takes
 * the next tile's index a tile ahead (README.md) */
enum { FA3_FWD_AUX_CL = 0, FA3_FWD_AUX_QBUF = 1, FA3_FWD_AUX_EARLY = 2 };

/* The masked forward's longest-first order runs in sections of (batch, head)s whose K and V take at most about half
 * of the H100's and H200's 50 MB L2, so that the tiles in flight share them there: the heads a section takes,
 * 1 .. heads. (The backward keeps the grid's order: the same sections there measured even at 4k-16k and 2-3 %
 * slower at 1k on an H100.) */
#define FA3_L2_SECTION_BYTES (24u << 20)
static inline int fa3_l2_section(double head_bytes, long long heads) {
    const double sec = (double)FA3_L2_SECTION_BYTES / (head_bytes > 1 ? head_bytes : 1);
    return sec >= (double)heads ? (int)heads : sec < 1 ? 1 : (int)sec;
}

#endif
