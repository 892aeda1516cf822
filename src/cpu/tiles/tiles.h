/* The tile steps the CPU algorithms are built from: score post-processing (scale, softcap, mask) on a tile in
 * fast memory, the backward tile step and the K/V-block frame around it (shared by FLASH1 and FLASH2, which differ
 * only in the loops around it). The counted transfers are in tiles/tile_io.h, the tile table in tiles/tile_table.c. */
#ifndef FA_CPU_TILES_H
#define FA_CPU_TILES_H

#include "core/arena.h"
#include "core/internal.h"
#include "core/sink.h"
#include "cpu/simd/kernels.h"
#include "cpu/tiles/tile_io.h"

#define FA_LOG2E 1.44269504088896340736f

/* One (sequence b, query head h): row-0 pointers and row strides (elements) of every tensor it touches. */
typedef struct fa_head {
    int64_t sq, sk;
    const void *q, *k, *v, *dout;
    void *o, *dq, *dk, *dv;          /* dk, dv: the K/V head h / (hq / hk) */
    int64_t ldq, ldk, ldv, ldo, lddo, lddq, lddk, lddv;
    float *lse;                      /* LSE[b, h, 0], or NULL */
    const float *sink;               /* the head's sink (opts.sinks[h]), or NULL: joined by fa_cpu_fwd_finish */
} fa_head;

void fa_cpu_head(const fa_problem *p, int64_t b, int64_t h, fa_head *hd);

/* Round up to a multiple of 16 floats (one zmm): the padded query count of a transposed tile. */
static inline int fa_pad16(int n) { return (n + 15) & ~15; }

/* n floats from the arena, 64-byte aligned (a tile or a vector of a workspace layout). */
static inline float *fa_take_f32(fa_arena *a, size_t n) { return (float *)fa_arena_take(a, n * sizeof(float), 64); }

/* Keys [lo, hi) as the columns [*c0, *c1) of the tile of `cols` keys starting at key j0 (clipped; c0 == c1 if none). */
static inline void fa_cpu_tile_cols(int64_t lo, int64_t hi, int64_t j0, int cols, int *c0, int *c1) {
    *c0 = lo - j0 < 0 ? 0 : lo - j0 > cols ? cols : (int)(lo - j0);
    *c1 = hi - j0 < *c0 ? *c0 : hi - j0 > cols ? cols : (int)(hi - j0);
}

/* Keys [*lo, *hi) visible to any of the query rows [i0, i1) of one sequence. */
static inline void fa_cpu_block_keys(const fa_problem *p, int64_t sq, int64_t sk, int64_t i0, int64_t i1, int64_t *lo,
                                     int64_t *hi) {
    fa_visible_block(i0, i1, sq, sk, p->wl, p->wr, p->chunk, lo, hi);
}

/* Does some query of rows [i0, i0+rows) see a key of [j0, j0+cols)? (else the tile pair is skipped) */
static inline int fa_cpu_block_sees(const fa_problem *p, int64_t sq, int64_t sk, int64_t i0, int rows, int64_t j0,
                                    int cols) {
    int64_t lo, hi;
    fa_cpu_block_keys(p, sq, sk, i0, i0 + rows, &lo, &hi);
    return hi > j0 && lo < j0 + cols;
}

/* The end of a forward Q block (O: rows x dv): O /= ℓ and LSE = unit·m + ln ℓ (m in the units of the softmax state;
 * a row with ℓ = 0 sees no key: O = 0, LSE = −∞); with a sink (NULL: none) ℓ gains exp(sink) first (core/sink.h).
 * alpha is scratch of rows floats. */
static inline void fa_cpu_fwd_finish(const fa_cpu_kernels *kr, int rows, int dv, float *O, const float *m,
                                     const float *l, float unit, const float *sink, float *alpha, float *lse) {
    for (int r = 0; r < rows; r++) {
        if (sink) {
            alpha[r] = fa_sink_join(l[r] > 0 ? (double)m[r] * unit : -INFINITY, l[r], *sink, &lse[r]);
            continue;
        }
        alpha[r] = l[r] > 0 ? 1.0f / l[r] : 0.0f;
        lse[r] = l[r] > 0 ? m[r] * unit + logf(l[r]) : -INFINITY;
    }
    kr->scale_rows(rows, dv, O, dv, alpha);
}

/* Does any (query, key) pair of rows [i0, i0+rows) x keys [j0, j0+cols) need a mask? */
int fa_cpu_tile_needs_mask(const fa_problem *p, int64_t sq, int64_t sk, int64_t i0, int rows, int64_t j0, int cols);

/* Post-process the raw scores S(r, c) = S[r·rs + c·cs] of query rows i0.. and keys j0.. in place: visible entries
 * become cap·tanh(S·mul·inv_cap) with a softcap, else S·mul (skipped when mul = 1); masked entries become −∞.
 * Row-major STANDARD tiles pass (ld, 1) and mul = scale, inv_cap = 1/cap; transposed FLASH tiles pass (1, ld),
 * mul = 1 without softcap (the scale is in the softmax constant) and mul = |scale|/cap, inv_cap = 1 with it.
 * Returns the number of visible entries (0: the tile can be skipped). */
int64_t fa_cpu_scores(const fa_problem *p, float *S, ptrdiff_t rs, ptrdiff_t cs, int rows, int cols, int64_t i0,
                      int64_t j0, int64_t sq, int64_t sk, float mul, float inv_cap);

/* ---- backward (FLASH1 and FLASH2) ---- */

/* A thread's fast tiles for the backward: Br rows of Qi, dQi (d = dqk wide) and dOi, Oi (dv wide), Bc rows of Kj,
 * dKj (d) and Vj, dVj (dv), packed Kjᵀ (d x pad16(Bc)) and Vjᵀ (dv x pad16(Bc)), Br x pad16(Bc) S and dP,
 * Br-vectors; Qi and dOi hold max(d, dv) floats a row, so that either serves as a row buffer of any operand. Oi only
 * where D is recomputed per tile (FLASH1). With bf16 tiles (bf16 = 1) also the operands of the five products as
 * words of two bf16: A operands row-major (pairs along the row), B operands as pairs of rows; NULL otherwise. */
typedef struct fa_cpu_bwd_tiles {
    int ldt;                          /* pad16(Bc): row stride of KjT, VjT, S, dP */
    int ldr;                          /* Br rounded up to even: row stride of the transposed P and dS */
    float *Qi, *dOi, *dQi, *Oi;
    float *Kj, *Vj, *dKj, *dVj, *KjT, *VjT;
    float *S, *dP, *lse_i, *D_i;
    uint32_t *Qw, *dOw;               /* [Br][d/2]: Qi, dOi rows */
    uint32_t *Qp, *dOp;               /* [Br/2][d]: Qi, dOi row pairs */
    uint32_t *KT2, *VT2;              /* [d/2][ldt]: Kjᵀ, Vjᵀ row pairs (pairs along d) */
    uint32_t *Kp2;                    /* [Bc/2][d]: Kj row pairs */
    float *T;                         /* [ldt][ldr]: Pᵀ or dSᵀ in fp32 */
    uint32_t *Tw, *dSw;               /* [ldt][ldr/2]: Pᵀ or dSᵀ rows; [Br][ldt/2]: dS rows */
    float *dQacc;                     /* the thread's fp32 dQ accumulator in slow memory (dq_floats), or NULL */
} fa_cpu_bwd_tiles;

void fa_cpu_bwd_tiles_layout(fa_arena *a, int d, int dv, int br, int bc, int with_o, int bf16, size_t dq_floats,
                             fa_cpu_bwd_tiles *t);

/* Start K/V block j: load Kj, Vj (cols keys from j0), pack Kjᵀ, Vjᵀ once, zero dKj, dVj. */
void fa_cpu_bwd_kv_begin(const fa_problem *p, const fa_cpu_kernels *kr, const fa_head *hd, int64_t j0, int cols,
                         const fa_cpu_bwd_tiles *t, fa_io *io);
/* End K/V block j: store dKj, dVj into the gradients. */
void fa_cpu_bwd_kv_end(const fa_problem *p, const fa_head *hd, int64_t j0, int cols, const fa_cpu_bwd_tiles *t,
                       fa_io *io);
/* Load Qi, dOi and LSEi of query head hq, rows i0.. */
void fa_cpu_bwd_load_q(const fa_problem *p, const fa_head *hq, int64_t i0, int rows, const fa_cpu_bwd_tiles *t,
                       fa_io *io);
/* One (Qi, Kj) step once Qi, dOi, LSEi and Di are in the tiles: load the fp32 dQi accumulator (dq, row stride
 * ld_dq, slow memory; from 0 instead when dq_fresh: the only step of these rows), the tile step, store dQi back. */
void fa_cpu_bwd_step(const fa_problem *p, const fa_cpu_kernels *kr, int64_t sq, int64_t sk, int64_t i0, int rows,
                     int64_t j0, int cols, float *dq, int64_t ld_dq, int dq_fresh, const fa_cpu_bwd_tiles *t,
                     fa_io *io);

#endif
