/* FA_ALGO_FLASH2 forward on bf16 storage with a tile matrix unit (AMX-BF16; a kernel table with bf16_tiles): the
 * loop of flash2.c in the row-major orientation the tiles want, so that neither product needs its A operand
 * transposed (docs/cpu-kernels.md, "AMX"):
 *   S = Qi Kjᵀ:  A = Qi as it is stored ([Br][d/2] words of two bf16), B = Kjᵀ as [d/2][Bc] words;
 *   m, ℓ, P:     softmax_rows_bf16 writes P as [Br][Bc/2] words (two keys each) straight from S;
 *   O += P Vj:   A = P, B = Vj as key pairs [Bc/2][d].
 * A work item is `group` Q blocks of one head (the plan's aux, as in flash2.c); the Kjᵀ and paired Vj of the keys
 * it visits are packed once, on first use, when they fit the pack buffer, else per visit. Softmax state, S and O
 * stay fp32. */
#include "cpu/cpu.h"

#include <string.h>

/* A thread's fast tiles: Qi (bf16 rows), the K/V staging rows, the packs (per Bc-key tile slot: Kjᵀ words
 * [d/2][Bc] and Vj pairs [Bc/2][d]) with a packed-yet flag per slot, fp32 S and O, P words, softmax state. */
typedef struct tiles {
    uint16_t *Qi, *Kr, *Vr;
    uint32_t *KT, *VP, *P;
    unsigned char *ready;
    float *S, *O, *m, *l, *alpha, *lse;
} tiles;

static void thread_layout(fa_arena *a, const void *problem, const fa_plan *pl, void *out) {
    const fa_problem *p = problem;
    tiles *t = out;
    const size_t d = (size_t)p->d, dv = (size_t)p->d_v, br = (size_t)pl->block_q, bc = (size_t)pl->block_k;
    const size_t bcw = (bc + 1) / 2, slots = (size_t)(pl->aux[FA_CPU_AUX_KVROWS] / pl->block_k);
    t->Qi = fa_arena_take(a, br * d * 2, 64);
    t->Kr = fa_arena_take(a, bc * d * 2, 64);
    t->Vr = fa_arena_take(a, bc * dv * 2, 64);
    t->KT = fa_arena_take(a, slots * (d / 2) * bc * 4, 64);
    t->VP = fa_arena_take(a, slots * bcw * dv * 4, 64);
    t->ready = fa_arena_take(a, slots, 64);
    t->P = fa_arena_take(a, br * bcw * 4, 64);
    t->S = fa_take_f32(a, br * bc);
    t->O = fa_take_f32(a, br * dv);
    t->m = fa_take_f32(a, br);
    t->l = fa_take_f32(a, br);
    t->alpha = fa_take_f32(a, br);
    t->lse = fa_take_f32(a, br);
}

/* Kjᵀ and Vj pairs of the cols keys from j0 into slot s of the packs (Kj, Vj staged as dense bf16 rows). */
static void pack_tile(const fa_problem *p, const fa_cpu_kernels *kr, const fa_head *hd, int64_t j0, int cols,
                      const tiles *t, int s, int bc, fa_io *io) {
    const int d = (int)p->d, dp = d / 2, dv = (int)p->d_v, bcw = (bc + 1) / 2;
    fa_tile_load_bf16(t->Kr, d, (const uint16_t *)hd->k + j0 * hd->ldk, hd->ldk, cols, d, io);
    fa_tile_load_bf16(t->Vr, dv, (const uint16_t *)hd->v + j0 * hd->ldv, hd->ldv, cols, dv, io);
    kr->pack_t32(cols, dp, (const uint32_t *)t->Kr, dp, t->KT + (size_t)s * dp * bc, bc); /* [d/2][Bc] */
    kr->pairs_bf16(cols, dv, t->Vr, dv, t->VP + (size_t)s * bcw * dv, dv);               /* [Bc/2][dv] */
}

static void run(const fa_cpu_kernels *kr, const fa_problem *p, const fa_plan *pl, const fa_cpu_frame *f) {
    const int d = (int)p->d, dp = d / 2, dv = (int)p->d_v, br = pl->block_q, bc = pl->block_k, bcw = (bc + 1) / 2;
    const int group = pl->aux[FA_CPU_AUX_GROUP], kvrows = pl->aux[FA_CPU_AUX_KVROWS];
    const int64_t tr = (p->sq_max + br - 1) / br, tg = (tr + group - 1) / group, items = p->batch * p->hq * tg;
    const float unit = p->softcap > 0 ? 1.0f : fabsf(p->scale), c = unit * FA_LOG2E;
    const float cap_mul = p->softcap > 0 ? fabsf(p->scale) / p->softcap : 1.0f;
    const uint16_t sign = p->scale < 0 ? 0x8000u : 0; /* a negative scale flips the sign of Qi */

#pragma omp parallel for schedule(dynamic, 1) num_threads(f->threads)
    for (int64_t it = 0; it < items; it++) {
        tiles t;
        fa_io *io = fa_cpu_frame_thread(f, &t);
        float *S = t.S, *O = t.O, *m = t.m, *l = t.l, *alpha = t.alpha, *lse = t.lse;
        int64_t bh, g;
        fa_cpu_fwd_item(it, p->batch * p->hq, tg, &bh, &g);
        const int64_t b = bh / p->hq, h = bh % p->hq;
        fa_head hd;
        fa_cpu_head(p, b, h, &hd);
        const int64_t ib = g * group, nb = (hd.sq + br - 1) / br, ie = nb < ib + group ? nb : ib + group;
        if (ib >= ie) continue;
        int64_t klo, khi, lo, hi;
        fa_cpu_block_keys(p, hd.sq, hd.sk, ib * br, ib * br + 1, &klo, &hi);
        fa_cpu_block_keys(p, hd.sq, hd.sk, (ie - 1) * br, hd.sq < ie * br ? hd.sq : ie * br, &lo, &khi);
        klo = klo / bc * bc;
        const int packed = group > 1 && khi - klo <= kvrows; /* one pack for the whole item */
        if (packed) memset(t.ready, 0, (size_t)(kvrows / bc));
        for (int64_t i = ib; i < ie; i++) {
            const int64_t i0 = i * br;
            const int rows = (int)(hd.sq - i0 < br ? hd.sq - i0 : br);
            fa_tile_load_bf16(t.Qi, d, (const uint16_t *)hd.q + i0 * hd.ldq, hd.ldq, rows, d, io);
            if (sign)
                for (int64_t x = 0; x < (int64_t)rows * d; x++) t.Qi[x] ^= sign;
            for (int r = 0; r < rows; r++) { m[r] = -INFINITY; l[r] = 0; }
            memset(O, 0, (size_t)rows * dv * 4);
            fa_cpu_block_keys(p, hd.sq, hd.sk, i0, i0 + rows, &lo, &hi);
            for (int64_t j0 = lo / bc * bc; j0 < hi; j0 += bc) {
                const int cols = (int)(hd.sk - j0 < bc ? hd.sk - j0 : bc), cw = (cols + 1) / 2;
                const int s = packed ? (int)((j0 - klo) / bc) : 0;
                if (!packed || !t.ready[s]) {
                    pack_tile(p, kr, &hd, j0, cols, &t, s, bc, io);
                    if (packed) t.ready[s] = 1, io->written += (int64_t)cols * (d + dv) * 2;
                }
                if (packed) io->read += (int64_t)cols * (d + dv) * 2;          /* Kj, Vj from the pack */
                const uint32_t *KT = t.KT + (size_t)s * dp * bc, *VP = t.VP + (size_t)s * bcw * dv;
                kr->gemm_bf16(rows, cols, dp, (const uint32_t *)t.Qi, dp, 1, KT, bc, S, bc, 0); /* S = Qi Kjᵀ */
                if ((p->softcap > 0 || fa_cpu_tile_needs_mask(p, hd.sq, hd.sk, i0, rows, j0, cols)) &&
                    fa_cpu_scores(p, S, bc, 1, rows, cols, i0, j0, hd.sq, hd.sk, cap_mul, 1.0f) == 0)
                    continue;
                kr->softmax_rows_bf16(rows, cols, S, bc, c, m, l, alpha, t.P, bcw); /* m, ℓ, α; P as key pairs */
                kr->scale_rows(rows, dv, O, dv, alpha);                            /* O = diag(α) O */
                kr->gemm_bf16(rows, dv, cw, t.P, bcw, 1, VP, dv, O, dv, 1);        /* O += P Vj */
            }
            fa_cpu_fwd_finish(kr, rows, dv, O, m, l, unit, hd.sink, alpha, lse);
            fa_tile_store((char *)hd.o + i0 * hd.ldo * 2, p->dtype, hd.ldo, O, dv, rows, dv, io);
            if (hd.lse) fa_vec_store(hd.lse + i0, lse, rows, io);
        }
    }
}

const fa_cpu_algo fa_cpu_flash2_amx_fwd = {FA_CPU_LAYOUT(thread_layout, tiles, NULL, char), run, 0};
