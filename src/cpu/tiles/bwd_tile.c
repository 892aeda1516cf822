/* The backward tile step of FLASH1 and FLASH2 and the K/V-block frame around it. FlashAttention-2 Algorithm 2's
 * inner step: the algorithms differ only in the loops around it and in where Di comes from. */
#include "cpu/tiles/tiles.h"

#include <string.h>

void fa_cpu_bwd_tiles_layout(fa_arena *a, int d, int dv, int br, int bc, int with_o, int bf16, size_t dq_floats,
                             fa_cpu_bwd_tiles *t) {
    const size_t q = (size_t)br * d, o = (size_t)br * dv, k = (size_t)bc * d, v = (size_t)bc * dv;
    const size_t wide = (size_t)br * (d > dv ? d : dv);
    t->ldt = fa_pad16(bc);
    t->ldr = (br + 1) & ~1;
    t->Qi = fa_take_f32(a, wide);
    t->dOi = fa_take_f32(a, wide);
    t->Oi = with_o ? fa_take_f32(a, o) : NULL;
    t->dQi = fa_take_f32(a, q);
    t->Kj = fa_take_f32(a, k);
    t->Vj = fa_take_f32(a, v);
    t->dKj = fa_take_f32(a, k);
    t->dVj = fa_take_f32(a, v);
    t->KjT = fa_take_f32(a, (size_t)d * t->ldt);
    t->VjT = fa_take_f32(a, (size_t)dv * t->ldt);
    t->S = fa_take_f32(a, (size_t)br * t->ldt);
    t->dP = fa_take_f32(a, (size_t)br * t->ldt);
    t->lse_i = fa_take_f32(a, (size_t)br);
    t->D_i = fa_take_f32(a, (size_t)br);
    t->Qw = t->dOw = t->Qp = t->dOp = t->KT2 = t->VT2 = t->Kp2 = t->Tw = t->dSw = NULL;
    t->T = NULL;
    if (bf16) {
        const size_t w = sizeof(uint32_t), hr = (size_t)t->ldr / 2, hc = (size_t)(bc + 1) / 2, hd = (size_t)d / 2;
        const size_t hv = (size_t)dv / 2;
        t->Qw = fa_arena_take(a, (size_t)br * hd * w, 64);
        t->dOw = fa_arena_take(a, (size_t)br * hv * w, 64);
        t->Qp = fa_arena_take(a, hr * d * w, 64);
        t->dOp = fa_arena_take(a, hr * dv * w, 64);
        t->KT2 = fa_arena_take(a, hd * t->ldt * w, 64);
        t->VT2 = fa_arena_take(a, hv * t->ldt * w, 64);
        t->Kp2 = fa_arena_take(a, hc * d * w, 64);
        t->T = fa_take_f32(a, (size_t)t->ldt * t->ldr);
        t->Tw = fa_arena_take(a, (size_t)t->ldt * hr * w, 64);
        t->dSw = fa_arena_take(a, (size_t)br * (t->ldt / 2) * w, 64);
    }
    t->dQacc = dq_floats ? fa_take_f32(a, dq_floats) : NULL;
}

void fa_cpu_bwd_kv_begin(const fa_problem *p, const fa_cpu_kernels *kr, const fa_head *hd, int64_t j0, int cols,
                         const fa_cpu_bwd_tiles *t, fa_io *io) {
    const int d = (int)p->d, dv = (int)p->d_v;
    const size_t es = fa_dtype_size(p->dtype);
    fa_tile_load(t->Kj, d, (const char *)hd->k + j0 * hd->ldk * es, p->dtype, hd->ldk, cols, d, io);
    fa_tile_load(t->Vj, dv, (const char *)hd->v + j0 * hd->ldv * es, p->dtype, hd->ldv, cols, dv, io);
    kr->pack_t(cols, d, t->Kj, d, t->KjT, t->ldt, 1.0f);
    kr->pack_t(cols, dv, t->Vj, dv, t->VjT, t->ldt, 1.0f);
    if (t->Qw) { /* bf16 tiles: Kjᵀ, Vjᵀ paired along d, dv; Kj paired along keys (exact: the values are bf16) */
        kr->pairs_f32_bf16(d, cols, t->KjT, t->ldt, t->KT2, t->ldt);
        kr->pairs_f32_bf16(dv, cols, t->VjT, t->ldt, t->VT2, t->ldt);
        kr->pairs_f32_bf16(cols, d, t->Kj, d, t->Kp2, d);
    }
    memset(t->dKj, 0, (size_t)cols * d * 4);
    memset(t->dVj, 0, (size_t)cols * dv * 4);
}

void fa_cpu_bwd_kv_end(const fa_problem *p, const fa_head *hd, int64_t j0, int cols, const fa_cpu_bwd_tiles *t,
                       fa_io *io) {
    const int d = (int)p->d, dv = (int)p->d_v;
    const size_t es = fa_dtype_size(p->dtype);
    fa_tile_store((char *)hd->dk + j0 * hd->lddk * es, p->dtype, hd->lddk, t->dKj, d, cols, d, io);
    fa_tile_store((char *)hd->dv + j0 * hd->lddv * es, p->dtype, hd->lddv, t->dVj, dv, cols, dv, io);
}

void fa_cpu_bwd_load_q(const fa_problem *p, const fa_head *hq, int64_t i0, int rows, const fa_cpu_bwd_tiles *t,
                       fa_io *io) {
    const int d = (int)p->d, dv = (int)p->d_v;
    const size_t es = fa_dtype_size(p->dtype);
    fa_tile_load(t->Qi, d, (const char *)hq->q + i0 * hq->ldq * es, p->dtype, hq->ldq, rows, d, io);
    fa_tile_load(t->dOi, dv, (const char *)hq->dout + i0 * hq->lddo * es, p->dtype, hq->lddo, rows, dv, io);
    fa_vec_load(t->lse_i, hq->lse + i0, rows, io);
}

/* With a softcap: S = scale·Qi Kjᵀ capped in row-major order, P = exp(S − LSE) by expf, and the cap's derivative
 * dS ∘ (1 − (S/cap)²); the capped scores are needed, so the packed path below does not apply. */
static void tile_softcap(const fa_problem *p, const fa_cpu_kernels *kr, int64_t sq, int64_t sk, int64_t i0, int rows,
                         int64_t j0, int cols, const fa_cpu_bwd_tiles *t) {
    const int d = (int)p->d, dv = (int)p->d_v;
    float *S = t->S, *dP = t->dP;
    kr->gemm_abt(rows, cols, d, t->Qi, d, t->Kj, d, S, cols);               /* S = Qi Kjᵀ */
    if (fa_cpu_scores(p, S, cols, 1, rows, cols, i0, j0, sq, sk, p->scale, 1.0f / p->softcap) == 0) return;
    kr->gemm_abt(rows, cols, dv, t->dOi, dv, t->Vj, dv, dP, cols);          /* dP = dOi Vjᵀ */
    for (int r = 0; r < rows; r++) {
        float *s = S + (int64_t)r * cols, *dp = dP + (int64_t)r * cols;
        const float L = t->lse_i[r];
        for (int c = 0; c < cols; c++) {
            float pv = (L == -INFINITY || s[c] == -INFINITY) ? 0.0f : expf(s[c] - L); /* P = exp(S − LSE) */
            float ds = pv * (dp[c] - t->D_i[r]);                                      /* dS = P ∘ (dP − D) */
            if (pv != 0) { float th = s[c] / p->softcap; ds *= 1.0f - th * th; }
            dp[c] = ds * p->scale;
            s[c] = pv;
        }
    }
    kr->gemm_nn(cols, dv, rows, S, 1, cols, t->dOi, dv, t->dVj, dv, 1);    /* dVj += Pᵀ dOi */
    kr->gemm_nn(rows, d, cols, dP, cols, 1, t->Kj, d, t->dQi, d, 1);         /* dQi += scale·dS Kj */
    kr->gemm_nn(cols, d, rows, dP, 1, cols, t->Qi, d, t->dKj, d, 1);        /* dKj += scale·dSᵀ Qi */
}

/* The raw scores S = Qi Kjᵀ in t->S become P: masked entries −∞ (after the scale), then P = e^(scale·S − LSE).
 * Returns 0 when no entry of the tile is visible (S left as it is: the caller skips the tile). */
static int scores_to_p(const fa_problem *p, const fa_cpu_kernels *kr, int64_t sq, int64_t sk, int64_t i0, int rows,
                       int64_t j0, int cols, const fa_cpu_bwd_tiles *t) {
    const int ldt = t->ldt;
    float *S = t->S;
    float sub[512];
    if (fa_cpu_tile_needs_mask(p, sq, sk, i0, rows, j0, cols)) {
        const float masked = p->scale < 0 ? INFINITY : -INFINITY; /* scale·masked = −∞ */
        int64_t vis = 0;
        for (int r = 0; r < rows; r++) {
            int64_t lo, hi;
            int c0, c1;
            fa_key_range(p, sq, sk, i0 + r, &lo, &hi);
            fa_cpu_tile_cols(lo, hi, j0, cols, &c0, &c1);
            float *s = S + (int64_t)r * ldt;
            for (int c = 0; c < c0; c++) s[c] = masked;
            for (int c = c1; c < cols; c++) s[c] = masked;
            vis += c1 - c0;
        }
        if (vis == 0) return 0;
    }
    for (int r0 = 0; r0 < rows; r0 += 512) {                                   /* P = exp(scale·S − LSE) */
        const int n = rows - r0 < 512 ? rows - r0 : 512;
        for (int r = 0; r < n; r++) /* a row that sees no key has LSE = −∞: P = 0 there */
            sub[r] = t->lse_i[r0 + r] == -INFINITY ? INFINITY : t->lse_i[r0 + r];
        kr->exp_rows(n, cols, S + (int64_t)r0 * ldt, ldt, p->scale, sub);
    }
    return 1;
}

/* S = Qi Kjᵀ on the packed Kjᵀ; mask; P = e^(scale·S − LSE); dVj += Pᵀ dOi; dP = dOi Vjᵀ; dS = scale·P ∘ (dP − Di);
 * dQi += dS Kj; dKj += dSᵀ Qi. */
static void tile(const fa_problem *p, const fa_cpu_kernels *kr, int64_t sq, int64_t sk, int64_t i0, int rows,
                 int64_t j0, int cols, const fa_cpu_bwd_tiles *t) {
    const int d = (int)p->d, dv = (int)p->d_v, ldt = t->ldt;
    float *S = t->S, *dP = t->dP;
    kr->gemm_nn(rows, cols, d, t->Qi, d, 1, t->KjT, ldt, S, ldt, 0);             /* S = Qi Kjᵀ (raw) */
    if (!scores_to_p(p, kr, sq, sk, i0, rows, j0, cols, t)) return;
    kr->gemm_nn(cols, dv, rows, S, 1, ldt, t->dOi, dv, t->dVj, dv, 1);          /* dVj += Pᵀ dOi */
    kr->gemm_nn(rows, cols, dv, t->dOi, dv, 1, t->VjT, ldt, dP, ldt, 0);        /* dP = dOi Vjᵀ */
    kr->ds_rows(rows, cols, S, ldt, dP, ldt, t->D_i, p->scale);                 /* dS = scale·P ∘ (dP − Di) */
    kr->gemm_nn(rows, d, cols, dP, ldt, 1, t->Kj, d, t->dQi, d, 1);             /* dQi += dS Kj */
    kr->gemm_nn(cols, d, rows, dP, 1, ldt, t->Qi, d, t->dKj, d, 1);             /* dKj += dSᵀ Qi */
}

/* The tile step on bf16 tiles (AMX): the five products of tile() with bf16 operands and fp32 accumulation. Qi, dOi,
 * Kj, Vj are exact in bf16 (bf16 storage); P and dS are rounded to bf16 for the products that take them, as in the
 * forward's P Vj. Pᵀ and dSᵀ are transposed in fp32, then paired along their rows. */
static void tile_bf16(const fa_problem *p, const fa_cpu_kernels *kr, int64_t sq, int64_t sk, int64_t i0, int rows,
                      int64_t j0, int cols, const fa_cpu_bwd_tiles *t) {
    const int d = (int)p->d, dp = d / 2, dv = (int)p->d_v, dvp = dv / 2, ldt = t->ldt, ldr = t->ldr;
    const int hr = (rows + 1) / 2, hc = (cols + 1) / 2;
    float *S = t->S, *dP = t->dP;
    kr->rows_f32_bf16(rows, d, t->Qi, d, t->Qw, dp);
    kr->gemm_bf16(rows, cols, dp, t->Qw, dp, 1, t->KT2, ldt, S, ldt, 0);        /* S = Qi Kjᵀ (raw) */
    if (!scores_to_p(p, kr, sq, sk, i0, rows, j0, cols, t)) return;
    kr->pack_t(rows, cols, S, ldt, t->T, ldr, 1.0f);                            /* Pᵀ */
    kr->rows_f32_bf16(cols, rows, t->T, ldr, t->Tw, ldr / 2);
    kr->pairs_f32_bf16(rows, dv, t->dOi, dv, t->dOp, dv);
    kr->gemm_bf16(cols, dv, hr, t->Tw, ldr / 2, 1, t->dOp, dv, t->dVj, dv, 1);  /* dVj += Pᵀ dOi */
    kr->rows_f32_bf16(rows, dv, t->dOi, dv, t->dOw, dvp);
    kr->gemm_bf16(rows, cols, dvp, t->dOw, dvp, 1, t->VT2, ldt, dP, ldt, 0);    /* dP = dOi Vjᵀ */
    kr->ds_rows(rows, cols, S, ldt, dP, ldt, t->D_i, p->scale);                 /* dS = scale·P ∘ (dP − Di) */
    kr->rows_f32_bf16(rows, cols, dP, ldt, t->dSw, ldt / 2);
    kr->gemm_bf16(rows, d, hc, t->dSw, ldt / 2, 1, t->Kp2, d, t->dQi, d, 1);    /* dQi += dS Kj */
    kr->pack_t(rows, cols, dP, ldt, t->T, ldr, 1.0f);                           /* dSᵀ */
    kr->rows_f32_bf16(cols, rows, t->T, ldr, t->Tw, ldr / 2);
    kr->pairs_f32_bf16(rows, d, t->Qi, d, t->Qp, d);
    kr->gemm_bf16(cols, d, hr, t->Tw, ldr / 2, 1, t->Qp, d, t->dKj, d, 1);      /* dKj += dSᵀ Qi */
}

void fa_cpu_bwd_step(const fa_problem *p, const fa_cpu_kernels *kr, int64_t sq, int64_t sk, int64_t i0, int rows,
                     int64_t j0, int cols, float *dq, int64_t ld_dq, int dq_fresh, const fa_cpu_bwd_tiles *t,
                     fa_io *io) {
    const int d = (int)p->d;
    if (dq_fresh) memset(t->dQi, 0, (size_t)rows * d * 4);
    else fa_tile_load(t->dQi, d, dq, FA_DTYPE_F32, ld_dq, rows, d, io);
    if (p->softcap > 0) tile_softcap(p, kr, sq, sk, i0, rows, j0, cols, t);
    else if (t->Qw) tile_bf16(p, kr, sq, sk, i0, rows, j0, cols, t);
    else tile(p, kr, sq, sk, i0, rows, j0, cols, t);
    fa_tile_store(dq, FA_DTYPE_F32, ld_dq, t->dQi, d, rows, d, io);
}
