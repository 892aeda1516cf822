/* Ring-attention shards for the tests (shard.h). */
#include "shard.h"

#include "oracle.h"
#include "tensor.h"

#include <math.h>
#include <stdlib.h>

int64_t t_shard_row(int r, int W, int64_t S_l, int causal, int64_t i) {
    if (!causal) return r * S_l + i;
    const int64_t c = S_l / 2;
    return i < c ? r * c + i : (2 * W - 1 - r) * c + i - c;
}

void t_shard_scatter(const fa_tensor *src, const fa_tensor *dst, int r, int W, int causal) {
    for (int64_t b = 0; b < dst->batch; b++)
        for (int64_t i = 0; i < dst->seqlen; i++)
            for (int64_t h = 0; h < dst->heads; h++)
                for (int64_t e = 0; e < dst->head_dim; e++)
                    t_set(dst, b, i, h, e, t_get(src, b, t_shard_row(r, W, dst->seqlen, causal, i), h, e));
}

double t_shard_err(const fa_tensor *t, const double *ref, int64_t S, int r, int W, int causal) {
    double m = 0;
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t i = 0; i < t->seqlen; i++) {
            const int64_t g = t_shard_row(r, W, t->seqlen, causal, i);
            for (int64_t h = 0; h < t->heads; h++)
                for (int64_t e = 0; e < t->head_dim; e++) {
                    const double d = fabs(t_get(t, b, i, h, e) - ref[((b * S + g) * t->heads + h) * t->head_dim + e]);
                    m = isnan(d) ? INFINITY : fmax(m, d);
                }
        }
    return m;
}

double t_shard_lse_err(const float *lse, const double *ref, int64_t BH, int64_t S, int64_t S_l, int r, int W,
                       int causal) {
    double m = 0;
    for (int64_t bh = 0; bh < BH; bh++)
        for (int64_t i = 0; i < S_l; i++) {
            const double x = lse[bh * S_l + i], y = ref[bh * S + t_shard_row(r, W, S_l, causal, i)];
            const double d = x == y ? 0 : fabs(x - y);
            m = isnan(d) ? INFINITY : fmax(m, d);
        }
    return m;
}

fa_status t_whole_new(t_whole *w, const fa_attn_opts *opts, fa_dtype dt, int64_t B, int64_t S, int64_t Hq, int64_t Hk,
                      int64_t D) {
    w->q = t_buf_new(dt, B, S, Hq, D, T_BSHD), w->k = t_buf_new(dt, B, S, Hk, D, T_BSHD);
    w->v = t_buf_new(dt, B, S, Hk, D, T_BSHD), w->dout = t_buf_new(dt, B, S, Hq, D, T_BSHD);
    t_buf_randn(&w->q, 1), t_buf_randn(&w->k, 1), t_buf_randn(&w->v, 1), t_buf_randn(&w->dout, 1);
    const size_t nq = (size_t)(B * S * Hq * D), nk = (size_t)(B * S * Hk * D), nl = (size_t)(B * Hq * S);
    w->out = malloc(sizeof(double) * nq), w->lse = malloc(sizeof(double) * nl);
    w->dq = malloc(sizeof(double) * nq), w->dk = malloc(sizeof(double) * nk), w->dv = malloc(sizeof(double) * nk);
    w->dsinks = opts->sinks ? malloc(sizeof(double) * (size_t)Hq) : NULL;
    w->dsinks_mag = opts->sinks ? malloc(sizeof(double) * (size_t)Hq) : NULL;
    fa_status st = t_oracle_forward(opts, &w->q.t, &w->k.t, &w->v.t, w->out, w->lse);
    if (st == FA_OK)
        st = t_oracle_backward_sinks(opts, &w->q.t, &w->k.t, &w->v.t, &w->dout.t, w->dq, w->dk, w->dv, NULL,
                                     w->dsinks, w->dsinks_mag);
    return st;
}

void t_whole_free(t_whole *w) {
    free(w->out), free(w->lse), free(w->dq), free(w->dk), free(w->dv), free(w->dsinks), free(w->dsinks_mag);
    t_buf_free(&w->q), t_buf_free(&w->k), t_buf_free(&w->v), t_buf_free(&w->dout);
}
