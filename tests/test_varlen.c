/* Variable-length packed batches (cu_seqlens): forward and backward of every algorithm against the oracle, with
 * empty query sequences, empty key sequences (every row of that sequence masked: O = 0, LSE = -inf, zero
 * gradients), causal/window masks aligned per sequence, GQA, strided layouts, all dtypes. The oracle's own varlen
 * indexing is checked against per-sequence calls on slices of the packed tensors. seqused_q/k (flash-attn's used
 * lengths inside the spans): every algorithm against the oracle, padding rows 0 / -inf, zero gradients of padding
 * rows and keys, with NaN and ±inf in the padding of the inputs, and the argument checks. */
#include "testlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


/* A packed case from per-sequence lengths. cu arrays must outlive the case. */
static t_case packed(int n, const int *lq, const int *lk, int32_t *cuq, int32_t *cuk, int64_t hq, int64_t hk, int64_t d,
                     fa_dtype dt) {
    cuq[0] = cuk[0] = 0;
    for (int s = 0; s < n; s++) cuq[s + 1] = cuq[s] + lq[s], cuk[s + 1] = cuk[s] + lk[s];
    t_case c = t_case_make(1, cuq[n], cuk[n], hq, hk, d, dt);
    c.opts.cu_seqlens_q = cuq, c.opts.cu_seqlens_k = cuk, c.opts.n_seqs = n;
    return c;
}

/* The oracle on the packed batch equals the oracle on each sequence's slice, as a plain batch of 1. And rows of a
 * sequence without keys are exactly 0 with LSE -inf. */
static void oracle_slices(const t_case *c) {
    snprintf(t_case_label, sizeof t_case_label, "oracle varlen vs slices");
    t_buf q = t_buf_new(c->dt, 1, c->sq, c->hq, c->d, T_BSHD), k = t_buf_new(c->dt, 1, c->sk, c->hk, c->d, T_BSHD);
    t_buf v = t_buf_new(c->dt, 1, c->sk, c->hk, c->d, T_BSHD);
    t_buf_randn(&q, 1), t_buf_randn(&k, 1), t_buf_randn(&v, 1);
    const int64_t H = c->hq, D = c->d, T = c->sq;
    double *out = malloc(sizeof(double) * (size_t)(T * H * D)), *lse = malloc(sizeof(double) * (size_t)(H * T));
    CHECK_STATUS(t_oracle_forward(&c->opts, &q.t, &k.t, &v.t, out, lse), FA_OK);
    fa_attn_opts plain = c->opts;
    plain.cu_seqlens_q = plain.cu_seqlens_k = NULL, plain.n_seqs = 0;
    double err = 0;
    for (int64_t s = 0; s < c->opts.n_seqs; s++) {
        int64_t q0 = c->opts.cu_seqlens_q[s], sq = c->opts.cu_seqlens_q[s + 1] - q0;
        int64_t k0 = c->opts.cu_seqlens_k[s], sk = c->opts.cu_seqlens_k[s + 1] - k0;
        if (sq == 0) continue;
        if (sk == 0) {
            for (int64_t i = 0; i < sq; i++)
                for (int64_t h = 0; h < H; h++) {
                    CHECK_MSG(isinf(lse[h * T + q0 + i]) && lse[h * T + q0 + i] < 0, "seq %lld: lse of a row without keys",
                              (long long)s);
                    for (int64_t x = 0; x < D; x++) err = fmax(err, fabs(out[((q0 + i) * H + h) * D + x]));
                }
            continue;
        }
        fa_tensor qs = q.t, ks = k.t, vs = v.t;
        size_t es = fa_dtype_size(c->dt);
        qs.data = (char *)q.t.data + q0 * q.t.stride_seq * (int64_t)es, qs.seqlen = sq;
        ks.data = (char *)k.t.data + k0 * k.t.stride_seq * (int64_t)es, ks.seqlen = sk;
        vs.data = (char *)v.t.data + k0 * v.t.stride_seq * (int64_t)es, vs.seqlen = sk;
        double *o1 = malloc(sizeof(double) * (size_t)(sq * H * D)), *l1 = malloc(sizeof(double) * (size_t)(H * sq));
        CHECK_STATUS(t_oracle_forward(&plain, &qs, &ks, &vs, o1, l1), FA_OK);
        for (int64_t i = 0; i < sq; i++)
            for (int64_t h = 0; h < H; h++) {
                double a = l1[h * sq + i], b = lse[h * T + q0 + i];
                if (!(isinf(a) && isinf(b))) err = fmax(err, fabs(a - b));
                for (int64_t x = 0; x < D; x++) err = fmax(err, fabs(o1[(i * H + h) * D + x] - out[((q0 + i) * H + h) * D + x]));
            }
        free(o1), free(l1);
    }
    CHECK_MSG(err <= 1e-12, "packed oracle differs from the per-sequence oracle by %.3e", err);
    free(out), free(lse);
    t_buf_free(&q), t_buf_free(&k), t_buf_free(&v);
    t_case_label[0] = 0;
}

#define ALL (T_ALL_ALGOS | T_ALGO_BIT(FA_ALGO_AUTO))

/* seqused_q / seqused_k: used lengths of 0, the whole span and in between, with causal and windows (aligned to the
 * used lengths), every dtype, NaN and ±inf in the padding rows of q, k, v and dout; then the checks, each naming its
 * argument. */
static void seqused(fa_context *ctx) {
    int32_t cuq[8], cuk[8];
    static const int lq[] = {9, 0, 17, 30, 4, 64}, lk[] = {12, 3, 20, 5, 0, 100};
    static const int32_t uq[] = {9, 0, 3, 0, 2, 40}, uk[] = {5, 3, 20, 0, 0, 77};
    static const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int i = 0; i < 3; i++)
        for (int m = 0; m < 3; m++) {
            t_case c = packed(6, lq, lk, cuq, cuk, 4, 2, 32, dts[i]);
            c.opts.seqused_q = m == 1 ? NULL : uq, c.opts.seqused_k = m == 2 ? NULL : uk;
            c.nonfinite_padding = 1;
            c.opts.causal = i == 1, c.opts.window_left = i == 2 ? 6 : -1;
            c.lay_q = (t_layout)m, c.lay_kv = (t_layout)((m + 1) % 3), c.lay_o = (t_layout)((m + 2) % 3);
            t_run_forward(ctx, &c, ALL);
            t_run_backward(ctx, &c, ALL);
        }
    snprintf(t_case_label, sizeof t_case_label, "seqused checks");
    t_case c = packed(6, lq, lk, cuq, cuk, 4, 2, 32, FA_DTYPE_F32);
    t_buf q = t_buf_new(c.dt, 1, c.sq, 4, 32, T_BSHD), k = t_buf_new(c.dt, 1, c.sk, 2, 32, T_BSHD);
    t_buf v = t_buf_new(c.dt, 1, c.sk, 2, 32, T_BSHD), o = t_buf_new(c.dt, 1, c.sq, 4, 32, T_BSHD);
    t_buf_randn(&q, 1), t_buf_randn(&k, 1), t_buf_randn(&v, 1);
    int32_t bad[6] = {9, 0, 3, 0, 2, 40};
    fa_attn_opts op = c.opts;
    op.seqused_q = bad, bad[2] = 18; /* past the span of 17 */
    CHECK_STATUS(fa_forward(ctx, &op, &q.t, &k.t, &v.t, &o.t, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "opts.seqused_q[2] = 18");
    bad[2] = 3, bad[4] = -1;
    op.seqused_q = NULL, op.seqused_k = bad;
    CHECK_STATUS(fa_forward(ctx, &op, &q.t, &k.t, &v.t, &o.t, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "opts.seqused_k[4] = -1");
    CHECK_EQ_INT(t_buf_check_written(&o) == (int64_t)(c.sq * 4 * 32), 1); /* nothing written */
    fa_attn_opts plain = fa_attn_opts_default();
    plain.seqused_k = uk;
    CHECK_STATUS(fa_forward(ctx, &plain, &q.t, &k.t, &v.t, &o.t, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "opts.seqused_k: set without cu_seqlens");
    t_buf_free(&q), t_buf_free(&k), t_buf_free(&v), t_buf_free(&o);
}

int main(void) {
    t_init("test_varlen");
    fa_context *ctx = t_cpu_ctx();
    int32_t cuq[16], cuk[16];
    t_case c;

    /* empty query sequences (1, 4), an empty key sequence (2: its 17 rows see nothing), singletons, and sq != sk
     * both ways so the bottom-right causal alignment differs per sequence */
    static const int lq[] = {5, 0, 17, 1, 0, 64, 30}, lk[] = {7, 3, 0, 1, 0, 100, 20};
    static const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int i = 0; i < 3; i++) {
        c = packed(7, lq, lk, cuq, cuk, 4, 2, 32, dts[i]);
        oracle_slices(&c);
        c.lay_q = (t_layout)i, c.lay_kv = (t_layout)((i + 1) % 3), c.lay_o = (t_layout)((i + 2) % 3);
        t_run_forward(ctx, &c, ALL);
        t_run_backward(ctx, &c, ALL);
        c.opts.causal = 1;
        oracle_slices(&c);
        t_run_forward(ctx, &c, ALL);
        t_run_backward(ctx, &c, ALL);
        c.opts.causal = 0, c.opts.window_left = 8, c.opts.window_right = 2, c.opts.block_q = 16, c.opts.block_k = 8;
        t_run_forward(ctx, &c, ALL);
        t_run_backward(ctx, &c, ALL);
    }
    /* one sequence; key sides empty but for the last sequence's one key (K/V must have a row); MQA, d 128, softcap */
    static const int one_q[] = {113}, one_k[] = {239};
    c = packed(1, one_q, one_k, cuq, cuk, 2, 2, 64, FA_DTYPE_F32);
    c.opts.causal = 1;
    t_run_forward(ctx, &c, ALL);
    static const int nk_q[] = {3, 9, 1}, nk_k[] = {0, 0, 0};
    c = packed(3, nk_q, nk_k, cuq, cuk, 2, 1, 16, FA_DTYPE_F16);
    c.sk = 1;
    cuk[3] = 1;
    t_run_forward(ctx, &c, ALL);
    t_run_backward(ctx, &c, ALL);
    static const int mq_q[] = {40, 77, 2}, mq_k[] = {90, 77, 33};
    c = packed(3, mq_q, mq_k, cuq, cuk, 8, 1, 128, FA_DTYPE_BF16);
    c.opts.softcap = 20, c.sigma = 2;
    t_run_forward(ctx, &c, ALL);
    t_run_backward(ctx, &c, ALL);

    /* random packed batches */
    int n = 12;
    const char *env = getenv("FA_TEST_RANDOM");
    if (env) n = atoi(env);
    for (int r = 0; r < n; r++) {
        int ns = t_randint(1, 6), rq[6], rk[6];
        for (int s = 0; s < ns; s++) {
            rq[s] = t_randint(0, 3) ? t_randint(1, 70) : 0;
            rk[s] = t_randint(0, 3) ? t_randint(1, 70) : 0;
        }
        rk[0] = rk[0] ? rk[0] : 1; /* at least one key row overall */
        rq[ns - 1] = rq[ns - 1] ? rq[ns - 1] : 1;
        t_case rc = t_case_random(8, 128, 0);
        c = packed(ns, rq, rk, cuq, cuk, rc.hq, rc.hk, rc.d, rc.dt);
        c.lay_q = rc.lay_q, c.lay_kv = rc.lay_kv, c.lay_o = rc.lay_o;
        c.opts.causal = rc.opts.causal, c.opts.window_left = rc.opts.window_left;
        c.opts.window_right = rc.opts.window_right, c.opts.softcap = rc.opts.softcap;
        c.opts.block_q = rc.opts.block_q, c.opts.block_k = rc.opts.block_k, c.opts.scale = rc.opts.scale;
        if (r % 2) oracle_slices(&c);
        t_run_forward(ctx, &c, ALL);
        t_run_backward(ctx, &c, ALL);
    }
    seqused(ctx);
    fa_context_destroy(ctx);
    return t_finish();
}
