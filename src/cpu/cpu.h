/* Shared pieces of the three CPU algorithms: per-head views, score post-processing (scale, softcap, mask),
 * block sizes, the per-call workspace split. One algorithm per file: standard.c, flash1.c, flash2.c. */
#ifndef FA_CPU_H
#define FA_CPU_H

#include "core/internal.h"
#include "cpu/kernels.h"
#include "cpu/tile_io.h"

/* One (sequence b, query head h): row-0 pointers and row strides (elements) of every tensor it touches. */
typedef struct fa_head {
    int64_t sq, sk;
    const void *q, *k, *v, *dout;
    void *o, *dq, *dk, *dv;          /* dk, dv: the K/V head h / (hq / hk) */
    int64_t ldq, ldk, ldv, ldo, lddo, lddq, lddk, lddv;
    float *lse;                      /* LSE[b, h, 0], or NULL */
} fa_head;

void fa_cpu_head(const fa_problem *p, int64_t b, int64_t h, fa_head *hd);

/* Tile sizes Br x Bc: opts override, else the tuned default for this head_dim, clipped to the sequence. */
void fa_cpu_blocks(const fa_problem *p, int *br, int *bc);

/* S[r][c] (raw Qi Kjᵀ, rows i0.., keys j0..) <- scale·S, softcap, then -inf where key j0+c is masked for query
 * i0+r. Returns the number of visible entries (0: the tile can be skipped). */
int64_t fa_cpu_scores(const fa_problem *p, float *S, int ld, int rows, int cols, int64_t i0, int64_t j0, int64_t sq,
                      int64_t sk);

/* Keys [*lo, *hi) visible to any of the query rows [i0, i1). */
void fa_cpu_block_keys(const fa_problem *p, int64_t sq, int64_t sk, int64_t i0, int64_t i1, int64_t *lo, int64_t *hi);

/* Keys [lo, hi) as the columns [*c0, *c1) of the tile of `cols` keys starting at key j0 (clipped; c0 == c1 if none). */
static inline void fa_cpu_tile_cols(int64_t lo, int64_t hi, int64_t j0, int cols, int *c0, int *c1) {
    *c0 = lo - j0 < 0 ? 0 : lo - j0 > cols ? cols : (int)(lo - j0);
    *c1 = hi - j0 < *c0 ? *c0 : hi - j0 > cols ? cols : (int)(hi - j0);
}

/* dS of the capped scores -> dS of the raw scaled scores: dS ∘ (1 − (S/softcap)²), where S holds capped scores. */
void fa_cpu_softcap_grad(const fa_problem *p, float *dS, const float *S, int ld, int rows, int cols);

/* Round up to 64 bytes (workspace slices). */
static inline size_t fa_align64(size_t n) { return (n + 63) & ~(size_t)63; }

fa_status fa_cpu_standard_forward(fa_context *ctx, const fa_problem *p, fa_stats *st);
fa_status fa_cpu_standard_backward(fa_context *ctx, const fa_problem *p, fa_stats *st);
fa_status fa_cpu_flash1_forward(fa_context *ctx, const fa_problem *p, fa_stats *st);
fa_status fa_cpu_flash1_backward(fa_context *ctx, const fa_problem *p, fa_stats *st);
fa_status fa_cpu_flash2_forward(fa_context *ctx, const fa_problem *p, fa_stats *st);
fa_status fa_cpu_flash2_backward(fa_context *ctx, const fa_problem *p, fa_stats *st);
/* The numerics contract after any algorithm: recompute in float64 the heads whose fp32 result the input scan does
 * not certify (a NaN/inf input, huge scale or values; docs/numerics.md). src/cpu/contract.c. */
fa_status fa_cpu_contract(fa_context *ctx, const fa_problem *p);

#endif

#ifdef _OPENMP
#include <omp.h>
static inline int fa_thread_id(void) { return omp_get_thread_num(); }
#else
static inline int fa_thread_id(void) { return 0; }
#endif

/* Per-thread workspace slices: thread t owns [base + t·per, base + (t+1)·per); the io counters follow them. */
typedef struct fa_cpu_ws {
    char *base;
    size_t per;
    fa_io *io;
    int threads;
} fa_cpu_ws;
/* Allocate nt slices of per bytes (+ shared bytes at fa_cpu_ws_shared) in the context workspace. */
fa_status fa_cpu_ws_get(fa_context *ctx, size_t per, size_t shared, fa_cpu_ws *w);
static inline char *fa_cpu_ws_thread(const fa_cpu_ws *w, int t) { return w->base + (size_t)t * w->per; }
char *fa_cpu_ws_shared(const fa_cpu_ws *w);
/* Sum the counters into st and fill the common stats fields. */
void fa_cpu_ws_finish(const fa_cpu_ws *w, fa_stats *st, const char *kernel, int br, int bc, size_t extra);

/* One backward tile step shared by FLASH1 and FLASH2 (they differ in where D comes from and the loop around it):
 *   S = scale·Qi Kjᵀ (+softcap, mask), P = exp(S − LSEi), dVj += Pᵀ dOi, dP = dOi Vjᵀ, dS = P ∘ (dP − Di),
 *   dQacc += scale·dS Kj, dKj += scale·dSᵀ Qi. S and dP are br x bc scratch tiles. */
void fa_cpu_bwd_tile(const fa_problem *p, const fa_cpu_kernels *kr, int rows, int cols, int64_t i0, int64_t j0,
                     int64_t sq, int64_t sk, const float *Qi, const float *dOi, const float *lse_i, const float *D_i,
                     const float *Kj, const float *Vj, float *S, float *dP, float *dQacc, int ld_dq, float *dKj,
                     float *dVj);
