/* FA_ALGO_FLASH2 forward on bf16 storage with the bf16 dot-product kernel (AVX512_BF16): the loop of flash2.c with
 * the two tile products on bf16 pairs. Sᵀ = Kj Qiᵀ reduces over d pairs (Qiᵀ packed once per Q block as [d/2][Br]
 * words of two bf16, Kj rows broadcast as words); O += P Vj reduces over key pairs (Pᵀ rounded to bf16 and
 * interleaved by key pairs, Vj interleaved as [Bc/2][d] words). Softmax state, S and O stay fp32. */
#include "cpu/cpu.h"

#include <string.h>

/* A thread's fast tiles: bf16 Qi and its pair-packed transpose, bf16 Kj, Vj, Vj as key pairs, fp32 Sᵀ, Pᵀ as key
 * pairs, fp32 O, and the softmax state. */
typedef struct tiles {
    uint16_t *Qi, *Kj, *Vj;
    uint32_t *QiT, *Vp, *Pp;
    float *ST, *O, *m, *l, *alpha, *lse;
} tiles;

static void thread_layout(fa_arena *a, const void *problem, const fa_plan *pl, void *out) {
    const fa_problem *p = problem;
    tiles *t = out;
    const size_t d = (size_t)p->d, dv = (size_t)p->d_v, brp = (size_t)fa_pad16(pl->block_q);
    const size_t bc = (size_t)pl->block_k, bcw = (bc + 1) / 2;
    t->Qi = fa_arena_take(a, brp * d * 2, 64);
    t->QiT = fa_arena_take(a, brp * d * 2, 64);
    t->Kj = fa_arena_take(a, bc * d * 2, 64);
    t->Vj = fa_arena_take(a, bc * dv * 2, 64);
    t->Vp = fa_arena_take(a, bcw * dv * 4, 64);
    t->ST = fa_take_f32(a, brp * bc);
    t->Pp = fa_arena_take(a, bcw * brp * 4, 64);
    t->O = fa_take_f32(a, brp * dv);
    t->m = fa_take_f32(a, brp);
    t->l = fa_take_f32(a, brp);
    t->alpha = fa_take_f32(a, brp);
    t->lse = fa_take_f32(a, brp);
}

static void run(const fa_cpu_kernels *kr, const fa_problem *p, const fa_plan *pl, const fa_cpu_frame *f) {
    const int d = (int)p->d, dp = d / 2, dv = (int)p->d_v, br = pl->block_q, bc = pl->block_k;
    const int64_t tr = (p->sq_max + br - 1) / br, items = p->batch * p->hq * tr;
    const float unit = p->softcap > 0 ? 1.0f : fabsf(p->scale), c = unit * FA_LOG2E;
    const float cap_mul = p->softcap > 0 ? fabsf(p->scale) / p->softcap : 1.0f;
    const uint16_t sign = p->scale < 0 ? 0x8000u : 0; /* a negative scale flips the sign of Qi */

#pragma omp parallel for schedule(dynamic, 1) num_threads(f->threads)
    for (int64_t it = 0; it < items; it++) {
        tiles t;
        fa_io *io = fa_cpu_frame_thread(f, &t);
        uint16_t *Qi = t.Qi, *Kj = t.Kj, *Vj = t.Vj;
        uint32_t *QiT = t.QiT, *Vp = t.Vp, *Pp = t.Pp;
        float *ST = t.ST, *O = t.O, *m = t.m, *l = t.l, *alpha = t.alpha, *lse = t.lse;
        int64_t bh, i;
        fa_cpu_fwd_item(it, p->batch * p->hq, tr, &bh, &i);
        const int64_t b = bh / p->hq, h = bh % p->hq;
        fa_head hd;
        fa_cpu_head(p, b, h, &hd);
        const int64_t i0 = i * br;
        if (i0 >= hd.sq) continue;
        const int rows = (int)(hd.sq - i0 < br ? hd.sq - i0 : br), rp = fa_pad16(rows);

        fa_tile_load_bf16(Qi, d, (const uint16_t *)hd.q + i0 * hd.ldq, hd.ldq, rows, d, io);
        memset(Qi + (int64_t)rows * d, 0, (size_t)(rp - rows) * d * 2);
        if (sign)
            for (int64_t x = 0; x < (int64_t)rows * d; x++) Qi[x] ^= sign;
        kr->pack_t32(rp, dp, (const uint32_t *)Qi, dp, QiT, rp);          /* Qiᵀ as [d/2][rp] bf16 pairs */
        for (int r = 0; r < rp; r++) { m[r] = -INFINITY; l[r] = 0; }
        memset(O, 0, (size_t)rows * dv * 4);
        int64_t lo, hi;
        fa_cpu_block_keys(p, hd.sq, hd.sk, i0, i0 + rows, &lo, &hi);
        for (int64_t j0 = lo / bc * bc; j0 < hi; j0 += bc) {
            const int cols = (int)(hd.sk - j0 < bc ? hd.sk - j0 : bc), cw = (cols + 1) / 2;
            fa_tile_load_bf16(Kj, d, (const uint16_t *)hd.k + j0 * hd.ldk, hd.ldk, cols, d, io);
            fa_tile_load_bf16(Vj, dv, (const uint16_t *)hd.v + j0 * hd.ldv, hd.ldv, cols, dv, io);
            kr->gemm_bf16(cols, rp, dp, (const uint32_t *)Kj, dp, 1, QiT, rp, ST, rp, 0); /* Sᵀ = Kj Qiᵀ */
            if ((p->softcap > 0 || fa_cpu_tile_needs_mask(p, hd.sq, hd.sk, i0, rows, j0, cols)) &&
                fa_cpu_scores(p, ST, 1, rp, rows, cols, i0, j0, hd.sq, hd.sk, cap_mul, 1.0f) == 0)
                continue;
            kr->softmax_step_t(cols, rp, ST, rp, c, m, l, alpha);            /* Pᵀ, m, ℓ, α (fp32) */
            kr->pairs_f32_bf16(cols, rp, ST, rp, Pp, rp);                    /* Pᵀ -> bf16 key pairs */
            kr->pairs_bf16(cols, dv, Vj, dv, Vp, dv);                        /* Vj -> bf16 key pairs */
            kr->scale_rows(rows, dv, O, dv, alpha);                          /* O = diag(α) O */
            kr->gemm_bf16(rows, dv, cw, Pp, 1, rp, Vp, dv, O, dv, 1);        /* O += P Vj */
        }
        fa_cpu_fwd_finish(kr, rows, dv, O, m, l, unit, hd.sink, alpha, lse);
        fa_tile_store((char *)hd.o + i0 * hd.ldo * 2, p->dtype, hd.ldo, O, dv, rows, dv, io);
        if (hd.lse) fa_vec_store(hd.lse + i0, lse, rows, io);
    }
}

const fa_cpu_algo fa_cpu_flash2_bf16_fwd = {FA_CPU_LAYOUT(thread_layout, tiles, NULL, char), run, 0};
