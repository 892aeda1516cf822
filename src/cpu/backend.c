/* CPU backend: kernel table selection, per-head views, score post-processing, dispatch to one algorithm. */
#include "cpu/fast.h"

#include <string.h>

fa_status fa_cpu_init(fa_context *ctx) {
    ctx->kernels = fa_cpu_kernels_select();
    return FA_OK;
}

void fa_cpu_head(const fa_problem *p, int64_t b, int64_t h, fa_head *hd) {
    size_t es = fa_dtype_size(p->dtype);
    int64_t hk = h / (p->hq / p->hk);
    memset(hd, 0, sizeof *hd);
    hd->sq = fa_seqlen_q(p, b);
    hd->sk = fa_seqlen_k(p, b);
    hd->q = (const char *)p->q.data + fa_row0(p, &p->q, 0, b, h) * es;
    hd->k = (const char *)p->k.data + fa_row0(p, &p->k, 1, b, hk) * es;
    hd->v = (const char *)p->v.data + fa_row0(p, &p->v, 1, b, hk) * es;
    hd->o = (char *)p->o.data + fa_row0(p, &p->o, 0, b, h) * es;
    hd->ldq = p->q.stride_seq;
    hd->ldk = p->k.stride_seq;
    hd->ldv = p->v.stride_seq;
    hd->ldo = p->o.stride_seq;
    hd->lse = p->lse ? p->lse + fa_lse0(p, b, h) : NULL;
    if (p->is_backward) {
        hd->dout = (const char *)p->dout.data + fa_row0(p, &p->dout, 0, b, h) * es;
        hd->dq = (char *)p->dq.data + fa_row0(p, &p->dq, 0, b, h) * es;
        hd->dk = (char *)p->dk.data + fa_row0(p, &p->dk, 1, b, hk) * es;
        hd->dv = (char *)p->dv.data + fa_row0(p, &p->dv, 1, b, hk) * es;
        hd->lddo = p->dout.stride_seq;
        hd->lddq = p->dq.stride_seq;
        hd->lddk = p->dk.stride_seq;
        hd->lddv = p->dv.stride_seq;
    }
}

void fa_cpu_blocks(const fa_problem *p, int *br, int *bc) {
    /* Default 64 x 64: Qi, Kj, Vj, Oi fp32 tiles of d = 128 are 32 KiB each and S/P is 16 KiB: the working set
     * sits in the 1 MiB L2 with S in the 48 KiB L1 (CPU_NOTES §2). */
    int q = p->block_q ? p->block_q : 64, k = p->block_k ? p->block_k : 64;
    if (q > p->sq_max && p->sq_max > 0) q = (int)p->sq_max;
    if (k > p->sk_max && p->sk_max > 0) k = (int)p->sk_max;
    *br = q < 1 ? 1 : q;
    *bc = k < 1 ? 1 : k;
}

void fa_cpu_block_keys(const fa_problem *p, int64_t sq, int64_t sk, int64_t i0, int64_t i1, int64_t *lo, int64_t *hi) {
    /* both ends of a row's key range are non-decreasing in the row index */
    int64_t l0, h0, l1, h1;
    fa_key_range(p, sq, sk, i0, &l0, &h0);
    fa_key_range(p, sq, sk, i1 - 1, &l1, &h1);
    *lo = l0;
    *hi = h1 > l0 ? h1 : l0;
}

int64_t fa_cpu_scores(const fa_problem *p, float *S, int ld, int rows, int cols, int64_t i0, int64_t j0, int64_t sq,
                      int64_t sk) {
    const float scale = p->scale, cap = p->softcap, inv_cap = cap > 0 ? 1.0f / cap : 0;
    int64_t visible = 0;
    for (int r = 0; r < rows; r++) {
        float *s = S + (int64_t)r * ld;
        int64_t lo, hi;
        int c0, c1;
        fa_key_range(p, sq, sk, i0 + r, &lo, &hi);
        fa_cpu_tile_cols(lo, hi, j0, cols, &c0, &c1);
        for (int c = 0; c < c0; c++) s[c] = -INFINITY;
        if (cap > 0)
            for (int c = c0; c < c1; c++) s[c] = cap * tanhf(s[c] * scale * inv_cap);
        else
            for (int c = c0; c < c1; c++) s[c] *= scale;
        for (int c = c1; c < cols; c++) s[c] = -INFINITY;
        visible += c1 - c0;
    }
    return visible;
}

void fa_cpu_softcap_grad(const fa_problem *p, float *dS, const float *S, int ld, int rows, int cols) {
    if (!(p->softcap > 0)) return;
    const float inv = 1.0f / p->softcap;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            float t = S[(int64_t)r * ld + c] * inv;
            if (isfinite(t)) dS[(int64_t)r * ld + c] *= 1.0f - t * t;
        }
}

fa_status fa_cpu_plan(const fa_context *ctx, const fa_problem *p, fa_plan *plan, char *why, size_t why_len) {
    (void)why, (void)why_len; /* every validated problem runs on the CPU (f32/f16/bf16, head_dim 1..256) */
    plan->threads = ctx->threads;
    fa_cpu_tiles(p, &plan->block_q, &plan->block_k);
    return FA_OK;
}

static fa_status fa_cpu_forward(fa_context *ctx, const fa_problem *p, fa_stats *st) {
    switch (p->algo) {
    case FA_ALGO_STANDARD: return fa_cpu_standard_forward(ctx, p, st);
    case FA_ALGO_FLASH1: return fa_cpu_flash1_forward(ctx, p, st);
    default: return fa_cpu_flash2_forward(ctx, p, st);
    }
}

static fa_status fa_cpu_backward(fa_context *ctx, const fa_problem *p, fa_stats *st) {
    switch (p->algo) {
    case FA_ALGO_STANDARD: return fa_cpu_standard_backward(ctx, p, st);
    case FA_ALGO_FLASH1: return fa_cpu_flash1_backward(ctx, p, st);
    default: return fa_cpu_flash2_backward(ctx, p, st);
    }
}

fa_status fa_cpu_run(fa_context *ctx, const fa_problem *p, const fa_plan *plan, fa_stats *st) {
    (void)plan;
    const fa_status s = p->is_backward ? fa_cpu_backward(ctx, p, st) : fa_cpu_forward(ctx, p, st);
    return s == FA_OK ? fa_cpu_contract(ctx, p) : s;
}

fa_status fa_cpu_ws_get(fa_context *ctx, size_t per, size_t shared, fa_cpu_ws *w) {
    w->threads = ctx->threads;
    w->per = fa_align64(per);
    size_t io_off = w->per * (size_t)w->threads + fa_align64(shared);
    char *base = fa_workspace(ctx, io_off + sizeof(fa_io) * (size_t)w->threads);
    if (!base) return FA_ERR_OUT_OF_MEMORY;
    w->base = base;
    w->io = (fa_io *)(base + io_off);
    memset(w->io, 0, sizeof(fa_io) * (size_t)w->threads);
    return FA_OK;
}

char *fa_cpu_ws_shared(const fa_cpu_ws *w) { return w->base + w->per * (size_t)w->threads; }

void fa_cpu_ws_finish(const fa_cpu_ws *w, fa_stats *st, const char *kernel, int br, int bc, size_t extra) {
    for (int t = 0; t < w->threads; t++) {
        st->slow_read_bytes += w->io[t].read;
        st->slow_write_bytes += w->io[t].written;
    }
    st->kernel = kernel;
    st->block_q = br;
    st->block_k = bc;
    st->threads = w->threads;
    st->extra_bytes = (int64_t)extra;
}

void fa_cpu_bwd_tile(const fa_problem *p, const fa_cpu_kernels *kr, int rows, int cols, int64_t i0, int64_t j0,
                     int64_t sq, int64_t sk, const float *Qi, const float *dOi, const float *lse_i, const float *D_i,
                     const float *Kj, const float *Vj, float *S, float *dP, float *dQacc, int ld_dq, float *dKj,
                     float *dVj) {
    const int d = (int)p->d;
    kr->gemm_abt(rows, cols, d, Qi, d, Kj, d, S, cols);                 /* S = Qi Kjᵀ */
    if (fa_cpu_scores(p, S, cols, rows, cols, i0, j0, sq, sk) == 0) return;
    kr->gemm_abt(rows, cols, d, dOi, d, Vj, d, dP, cols);               /* dP = dOi Vjᵀ */
    for (int r = 0; r < rows; r++) {
        float *s = S + (int64_t)r * cols, *dp = dP + (int64_t)r * cols;
        const float L = lse_i[r];
        for (int c = 0; c < cols; c++) {
            float pv = (L == -INFINITY || s[c] == -INFINITY) ? 0.0f : expf(s[c] - L); /* P = exp(S − LSE) */
            float ds = pv * (dp[c] - D_i[r]);                                         /* dS = P ∘ (dP − D) */
            if (p->softcap > 0 && pv != 0) { float t = s[c] / p->softcap; ds *= 1.0f - t * t; }
            dp[c] = ds * p->scale;
            s[c] = pv;
        }
    }
    kr->gemm_atb_acc(cols, d, rows, S, cols, dOi, d, dVj, d);            /* dVj += Pᵀ dOi */
    kr->gemm_ab_acc(rows, d, cols, dP, cols, Kj, d, dQacc, ld_dq);       /* dQi += scale·dS Kj */
    kr->gemm_atb_acc(cols, d, rows, dP, cols, Qi, d, dKj, d);            /* dKj += scale·dSᵀ Qi */
}
