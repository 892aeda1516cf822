/* fa_forward_kvcache beyond one query-row count (flash-attn's speculative decoding and chunked prefill calls) on the
 * CPU: new keys of a count other than the query rows', kv_opts.cache_leftpad, packed (varlen) queries
 * (opts.cu_seqlens_q) and packed new keys (opts.cu_seqlens_k), contiguous and paged caches, with causal, windows and
 * attention_chunk — each sequence against the float64 oracle on its own keys [leftpad, seqlens + new), the appended
 * rows in the cache, out poisoned before the call; and the argument checks. */
#include "testlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { HQ = 4, HK = 2, D = 32, CAP = 64, PAGE = 8, MAXB = 4 };

typedef struct vcase {
    int batch, varlen_q, varlen_new, paged, append;
    int sq[MAXB], sn[MAXB], len[MAXB], lp[MAXB]; /* query rows, new rows, cache length, leftpad (-1: none at all) */
    int causal, wl, wr, chunk;
} vcase;

static float frand(void) { return (float)t_rng_randn(&t_default_rng); }

static void run(fa_context *ctx, const vcase *v, const char *what) {
    snprintf(t_case_label, sizeof t_case_label, "%s", what);
    const int B = v->batch;
    int32_t cuq[MAXB + 1] = {0}, cun[MAXB + 1] = {0}, seqlens[MAXB], leftpad[MAXB], table[MAXB * (CAP / PAGE)];
    int sq_max = 0, sn_max = 0;
    for (int b = 0; b < B; b++) {
        cuq[b + 1] = cuq[b] + v->sq[b], cun[b + 1] = cun[b] + v->sn[b];
        sq_max = v->sq[b] > sq_max ? v->sq[b] : sq_max, sn_max = v->sn[b] > sn_max ? v->sn[b] : sn_max;
        seqlens[b] = v->len[b], leftpad[b] = v->lp[0] < 0 ? 0 : v->lp[b];
    }
    /* the cache: contiguous [B, CAP, HK, D], or pages of PAGE keys in reversed order */
    const int pages = B * (CAP / PAGE);
    for (int i = 0; i < pages; i++) table[i] = pages - 1 - i;
    const size_t n_cache = (size_t)B * CAP * HK * D;
    float *kc = malloc(n_cache * sizeof(float)), *vc = malloc(n_cache * sizeof(float));
    for (size_t i = 0; i < n_cache; i++) kc[i] = frand(), vc[i] = frand();
    float *k0 = malloc(n_cache * sizeof(float)), *v0 = malloc(n_cache * sizeof(float));
    memcpy(k0, kc, n_cache * sizeof(float)), memcpy(v0, vc, n_cache * sizeof(float));
    /* element offset of key t of head h of sequence b in the cache */
#define KEY(b, t, h) (v->paged ? ((int64_t)table[(b) * (CAP / PAGE) + (t) / PAGE] * PAGE + (t) % PAGE) * HK * D + (h) * D \
                               : (((int64_t)(b) * CAP + (t)) * HK + (h)) * D)
    const int qb = v->varlen_q ? 1 : B, qs = v->varlen_q ? cuq[B] : sq_max;
    const int nb = v->varlen_new ? 1 : B, ns = v->varlen_new ? cun[B] : sn_max;
    t_buf q = t_buf_new(FA_DTYPE_F32, qb, qs, HQ, D, T_BSHD), o = t_buf_new(FA_DTYPE_F32, qb, qs, HQ, D, T_BSHD);
    t_buf kn = t_buf_new(FA_DTYPE_F32, nb, ns > 0 ? ns : 1, HK, D, T_BSHD);
    t_buf vn = t_buf_new(FA_DTYPE_F32, nb, ns > 0 ? ns : 1, HK, D, T_BSHD);
    t_buf_randn(&q, 1), t_buf_randn(&kn, 1), t_buf_randn(&vn, 1);
    kn.t.seqlen = vn.t.seqlen = ns;
    t_buf_poison(&o);
    float *lse = malloc(sizeof(float) * (size_t)(qb * HQ * qs + 1));
    fa_kvcache c = {0};
    c.k = v->paged ? fa_tensor_bshd(kc, FA_DTYPE_F32, pages, PAGE, HK, D) : fa_tensor_bshd(kc, FA_DTYPE_F32, B, CAP, HK, D);
    c.v = v->paged ? fa_tensor_bshd(vc, FA_DTYPE_F32, pages, PAGE, HK, D) : fa_tensor_bshd(vc, FA_DTYPE_F32, B, CAP, HK, D);
    c.seqlens = seqlens;
    if (v->paged) c.block_table = table, c.max_pages = CAP / PAGE;
    fa_attn_opts op = fa_attn_opts_default();
    op.causal = v->causal, op.window_left = v->wl, op.window_right = v->wr, op.attention_chunk = v->chunk;
    if (v->varlen_q || v->varlen_new) op.n_seqs = B;
    if (v->varlen_q) op.cu_seqlens_q = cuq;
    if (v->varlen_new) op.cu_seqlens_k = cun;
    fa_kv_opts ko = fa_kv_opts_default();
    if (v->lp[0] >= 0) ko.cache_leftpad = leftpad;
    ko.num_splits = v->batch % 2 ? 0 : 3;
    fa_status st = fa_forward_kvcache(ctx, &op, &ko, &q.t, &c, v->append ? &kn.t : NULL, v->append ? &vn.t : NULL,
                                      &o.t, lse);
    CHECK_MSG(st == FA_OK, "%s: %s: %s", what, fa_status_string(st), fa_context_last_error(ctx));
    if (st == FA_OK) {
        CHECK_MSG(t_buf_check_written(&o) == 0, "%s: out not written in full", what);
        double err = 0, lerr = 0;
        int bad_cache = 0;
        for (int b = 0; b < B; b++) {
            const int S = v->sq[b], N = v->append ? v->sn[b] : 0, lp = leftpad[b], L = seqlens[b] + N, n = L - lp;
            /* the appended rows, then the sequence's keys gathered */
            for (int i = 0; i < N; i++)
                for (int h = 0; h < HK; h++)
                    for (int e = 0; e < D; e++) {
                        const int64_t at = KEY(b, seqlens[b] + i, h) + e;
                        const int nb0 = v->varlen_new ? 0 : b, ni = v->varlen_new ? cun[b] + i : i;
                        bad_cache += kc[at] != (float)t_get(&kn.t, nb0, ni, h, e) ||
                                     vc[at] != (float)t_get(&vn.t, nb0, ni, h, e);
                        k0[at] = kc[at], v0[at] = vc[at];
                    }
            if (S == 0) continue;
            t_buf qs1 = t_buf_new(FA_DTYPE_F32, 1, S, HQ, D, T_BSHD);
            t_buf ks1 = t_buf_new(FA_DTYPE_F32, 1, n > 0 ? n : 1, HK, D, T_BSHD);
            t_buf vs1 = t_buf_new(FA_DTYPE_F32, 1, n > 0 ? n : 1, HK, D, T_BSHD);
            ks1.t.seqlen = vs1.t.seqlen = n;
            for (int i = 0; i < S; i++)
                for (int h = 0; h < HQ; h++)
                    for (int e = 0; e < D; e++)
                        t_set(&qs1.t, 0, i, h, e, t_get(&q.t, v->varlen_q ? 0 : b, v->varlen_q ? cuq[b] + i : i, h, e));
            for (int t = 0; t < n; t++)
                for (int h = 0; h < HK; h++)
                    for (int e = 0; e < D; e++) {
                        const int64_t at = KEY(b, lp + t, h) + e;
                        t_set(&ks1.t, 0, t, h, e, kc[at]), t_set(&vs1.t, 0, t, h, e, vc[at]);
                    }
            double *ro = malloc(sizeof(double) * (size_t)(S * HQ * D)), *rl = malloc(sizeof(double) * (size_t)(S * HQ));
            fa_attn_opts plain = op;
            plain.cu_seqlens_q = plain.cu_seqlens_k = NULL, plain.n_seqs = 0;
            CHECK_STATUS(t_oracle_forward(&plain, &qs1.t, &ks1.t, &vs1.t, ro, rl), FA_OK);
            for (int i = 0; i < S; i++)
                for (int h = 0; h < HQ; h++) {
                    const int oi = v->varlen_q ? cuq[b] + i : i, ob = v->varlen_q ? 0 : b;
                    for (int e = 0; e < D; e++)
                        err = fmax(err, fabs(t_get(&o.t, ob, oi, h, e) - ro[((int64_t)i * HQ + h) * D + e]));
                    const float got = lse[v->varlen_q ? (int64_t)h * qs + oi : ((int64_t)b * HQ + h) * qs + i];
                    const double want = rl[h * S + i];
                    if (isinf(want)) lerr = fmax(lerr, got == (float)want ? 0 : INFINITY);
                    else lerr = fmax(lerr, fabs(got - want));
                }
            free(ro), free(rl);
            t_buf_free(&qs1), t_buf_free(&ks1), t_buf_free(&vs1);
        }
        CHECK_MSG(err < 2e-5 && lerr < 2e-5, "%s: out err %.3g, lse err %.3g", what, err, lerr);
        CHECK_MSG(bad_cache == 0, "%s: %d appended elements differ", what, bad_cache);
        CHECK_MSG(memcmp(k0, kc, n_cache * sizeof(float)) == 0 && memcmp(v0, vc, n_cache * sizeof(float)) == 0,
                  "%s: the cache changed outside the appended rows", what);
    }
#undef KEY
    t_buf_free(&q), t_buf_free(&o), t_buf_free(&kn), t_buf_free(&vn);
    free(kc), free(vc), free(k0), free(v0), free(lse);
}

static void cases(fa_context *ctx) {
    /* {batch, varlen_q, varlen_new, paged, append, sq[], sn[], len[], lp[], causal, wl, wr, chunk} */
    const vcase all[] = {
        {3, 0, 0, 0, 1, {4, 4, 4}, {1, 1, 1}, {10, 0, 40}, {-1}, 1, -1, -1, 0},      /* spec. decoding: S > N */
        {3, 0, 0, 1, 1, {1, 1, 1}, {5, 5, 5}, {10, 3, 50}, {-1}, 1, -1, -1, 0},      /* S < N */
        {2, 0, 0, 0, 1, {6, 6}, {3, 3}, {20, 30}, {4, 30}, 1, -1, -1, 0},            /* leftpad (to the length) */
        {2, 0, 0, 1, 0, {3, 3}, {0, 0}, {20, 33}, {7, 0}, 0, 5, 2, 0},               /* leftpad, window */
        {4, 1, 0, 0, 1, {5, 0, 9, 1}, {2, 2, 2, 2}, {3, 40, 0, 61}, {-1}, 1, -1, -1, 0}, /* varlen q */
        {4, 1, 1, 1, 1, {5, 1, 9, 2}, {5, 0, 3, 7}, {3, 40, 0, 50}, {1, 2, 0, 9}, 1, -1, -1, 0},
        {3, 0, 1, 0, 1, {2, 2, 2}, {0, 6, 2}, {30, 10, 5}, {-1}, 1, 4, -1, 0},       /* packed new rows */
        {4, 1, 1, 0, 1, {7, 3, 0, 16}, {7, 3, 0, 16}, {0, 20, 12, 40}, {0, 5, 1, 8}, 1, -1, -1, 6}, /* prefill + chunk */
        {2, 1, 0, 1, 0, {12, 20}, {0, 0}, {30, 64}, {-1}, 1, -1, -1, 0},             /* paged prefill (no append) */
        {2, 1, 0, 1, 0, {12, 20}, {0, 0}, {30, 64}, {3, 0}, 1, 10, -1, 16},
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        char what[64];
        snprintf(what, sizeof what, "kvcache varlen case %zu", i);
        run(ctx, &all[i], what);
    }
}

static void errors(fa_context *ctx) {
    snprintf(t_case_label, sizeof t_case_label, "errors");
    float kc[CAP * HK * D] = {0}, vc[CAP * HK * D] = {0}, q[2 * HQ * D] = {0}, o[2 * HQ * D];
    int32_t seqlens[1] = {10}, leftpad[1] = {11}, cuq[2] = {0, 3};
    fa_kvcache c = {0};
    c.k = fa_tensor_bshd(kc, FA_DTYPE_F32, 1, CAP, HK, D), c.v = fa_tensor_bshd(vc, FA_DTYPE_F32, 1, CAP, HK, D);
    c.seqlens = seqlens;
    fa_tensor tq = fa_tensor_bshd(q, FA_DTYPE_F32, 1, 2, HQ, D), to = fa_tensor_bshd(o, FA_DTYPE_F32, 1, 2, HQ, D);
    fa_kv_opts ko = fa_kv_opts_default();
    ko.cache_leftpad = leftpad;
    CHECK_STATUS(fa_forward_kvcache(ctx, NULL, &ko, &tq, &c, NULL, NULL, &to, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fa_context_last_error(ctx), "cache_leftpad[0] = 11") != NULL);
    fa_attn_opts op = fa_attn_opts_default();
    op.cu_seqlens_q = cuq, op.n_seqs = 1; /* ends at 3, q has 2 rows */
    CHECK_STATUS(fa_forward_kvcache(ctx, &op, NULL, &tq, &c, NULL, NULL, &to, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fa_context_last_error(ctx), "cu_seqlens_q") != NULL);
    op.cu_seqlens_q = NULL, op.cu_seqlens_k = cuq; /* packs new keys, but no k_new */
    CHECK_STATUS(fa_forward_kvcache(ctx, &op, NULL, &tq, &c, NULL, NULL, &to, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fa_context_last_error(ctx), "cu_seqlens_k") != NULL);
}

int main(void) {
    t_init("test_kvcache_varlen");
    fa_context *ctx = t_cpu_ctx();
    cases(ctx);
    errors(ctx);
    fa_context_destroy(ctx);
    return t_finish();
}
