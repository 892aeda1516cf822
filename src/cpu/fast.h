/* Shared pieces of the fast CPU tile loops (issue 3): tile sizes from the cache sizes, score post-processing on
 * transposed tiles, the backward tile step on the extended kernel table. Used by flash1.c, flash2.c, standard.c. */
#ifndef FA_CPU_FAST_H
#define FA_CPU_FAST_H

#include "cpu/cpu.h"

#define FA_LOG2E 1.44269504088896340736f
#define FA_LN2 0.69314718055994530942f

/* Br x Bc for an algorithm: --block-q/--block-k (opts) override, else the tuned table in tiles.c (which reads the
 * L1/L2 sizes at run time); clipped to the sequence. */
void fa_cpu_tiles(const fa_problem *p, int *br, int *bc);

/* FLASH2 forward K/V packing for tr Q blocks of Bc-key tiles: *group = Q blocks per work item (they share one
 * packed copy of the K/V rows they visit), *seg = most keys packed at once (a multiple of bc; 0 with group = 1: no packing). */
void fa_cpu_kv_pack(const fa_problem *p, int64_t tr, int bc, int *group, int *seg);

/* Round up to a multiple of 16 floats (one zmm): the padded query count of a transposed tile. */
static inline int fa_pad16(int n) { return (n + 15) & ~15; }

/* Does any (query, key) pair of rows [i0, i0+rows) x keys [j0, j0+cols) need a mask? */
int fa_cpu_tile_needs_mask(const fa_problem *p, int64_t sq, int64_t sk, int64_t i0, int rows, int64_t j0, int cols);

/* Post-process a transposed raw score tile ST[cols keys][ld] (queries along the row): softcap (s <- cap·tanh(|scale|·s/cap):
 * the caller's softmax constant becomes log2 e; a negative scale is folded into the packed Q), then −∞ where key
 * j0+c is masked for query i0+r.
 * Returns the number of visible entries. */
int64_t fa_cpu_scores_t(const fa_problem *p, float *ST, int ld, int rows, int cols, int64_t i0, int64_t j0, int64_t sq,
                        int64_t sk);

/* Σ_x a[x]·b[x] as one FMA chain in x order: the rounding of the tile products' dot products (so that
 * D = rowsum(dO ∘ O) equals dP = dO·Vᵀ bit for bit where O = V). */
static inline float fa_cpu_rowdot(int n, const float *a, const float *b) {
    float acc = 0;
    for (int x = 0; x < n; x++) acc = fmaf(a[x], b[x], acc);
    return acc;
}

/* The backward tile step on packed Kjᵀ, Vjᵀ ([d][ldt], built once per K/V block):
 *   S = Qi Kjᵀ; mask; P = e^(scale·S − LSE); dVj += Pᵀ dOi; dP = dOi Vjᵀ; dS = scale·P ∘ (dP − Di);
 *   dQacc += dS Kj; dKj += dSᵀ Qi.  S and dP are rows x ldt scratch tiles. Softcap goes through fa_cpu_bwd_tile. */
void fa_cpu_bwd_tile_fast(const fa_problem *p, const fa_cpu_kernels *kr, int rows, int cols, int64_t i0, int64_t j0,
                          int64_t sq, int64_t sk, const float *Qi, const float *dOi, const float *lse_i,
                          const float *D_i, const float *Kj, const float *KjT, const float *VjT,
                          int ldt, float *S, float *dP, float *dQacc, int ld_dq, float *dKj, float *dVj);

#endif
