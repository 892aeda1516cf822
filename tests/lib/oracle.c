/* The float64 oracle. Straight loops over the definition, one (sequence, head, query row) at a time:
 *   s_j = scale · q·k_j, softcap: s_j = cap · tanh(s_j / cap), masked keys dropped,
 *   p_j = exp(s_j − max) / Σ exp(s − max), out = Σ p_j v_j, lse = max + log Σ exp(s − max).
 * Backward: dv_j += p_j dout, dp_j = dout·v_j, ds_j = p_j (dp_j − dout·out), (softcap: ds_j *= 1 − tanh²),
 *   dq += scale Σ ds_j k_j, dk_j += scale ds_j q.
 * OpenMP threads take (sequence, head) pairs in the forward and (sequence, K/V head) pairs in the backward: each
 * writes only its own rows and takes every sum in the serial order, so the results are the same bits with any
 * number of threads (the GPU tests' many-head cases spent minutes here). */
#include "oracle.h"

#include "dtype.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct ref_seq { int64_t q0, k0, sq, sk, b; } ref_seq; /* rows of one sequence */

static double at(const fa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t i) {
    return t_load(t->data, t->dtype, b * t->stride_batch + s * t->stride_seq + h * t->stride_head + i);
}

static int64_t n_sequences(const fa_attn_opts *o, const fa_tensor *q) { return o->cu_seqlens_q ? o->n_seqs : q->batch; }

static ref_seq sequence(const fa_attn_opts *o, const fa_tensor *q, const fa_tensor *k, int64_t s) {
    ref_seq r;
    if (o->cu_seqlens_q) {
        r = (ref_seq){o->cu_seqlens_q[s], o->cu_seqlens_k[s], o->cu_seqlens_q[s + 1] - o->cu_seqlens_q[s],
                      o->cu_seqlens_k[s + 1] - o->cu_seqlens_k[s], 0};
    } else {
        r = (ref_seq){0, 0, q->seqlen, k->seqlen, s};
    }
    return r;
}

static int visible(const fa_attn_opts *o, const ref_seq *r, int64_t i, int64_t j) {
    int64_t diag = i + r->sk - r->sq;
    if (o->causal && j > diag) return 0;
    if (o->window_right >= 0 && j > diag + o->window_right) return 0;
    if (o->window_left >= 0 && j < diag - o->window_left) return 0;
    return 1;
}

/* Scores of query row i against every key of the sequence (−inf where masked). Returns the max. */
static double row_scores(const fa_attn_opts *o, const fa_tensor *q, const fa_tensor *k, const ref_seq *r, int64_t h,
                         int64_t hk, int64_t i, double scale, double *s) {
    double mx = -INFINITY;
    for (int64_t j = 0; j < r->sk; j++) {
        if (!visible(o, r, i, j)) { s[j] = -INFINITY; continue; }
        double acc = 0;
        for (int64_t x = 0; x < q->head_dim; x++)
            acc += at(q, r->b, r->q0 + i, h, x) * at(k, r->b, r->k0 + j, hk, x);
        acc *= scale;
        if (o->softcap > 0) acc = o->softcap * tanh(acc / o->softcap);
        s[j] = acc;
        if (acc > mx) mx = acc;
    }
    return mx;
}

/* Worth threads: about 10^8 multiply-adds or more (the small cases of the CPU tests stay serial and cheap). */
static int oracle_big(const fa_tensor *q, const fa_tensor *k) {
    return (double)q->batch * q->seqlen * k->seqlen * q->heads * q->head_dim > 1e8;
}

fa_status t_oracle_forward(const fa_attn_opts *opts, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                           double *out, double *lse) {
    if (!q || !k || !v || !out) return FA_ERR_INVALID_ARGUMENT;
    fa_attn_opts o = opts ? *opts : fa_attn_opts_default();
    const int64_t d = q->head_dim, H = q->heads, group = q->heads / k->heads;
    const double scale = o.scale != 0 ? o.scale : 1.0 / sqrt((double)d);
    const int64_t tasks = n_sequences(&o, q) * H;
    int oom = 0;
#pragma omp parallel if (oracle_big(q, k))
    {
        double *s = malloc(sizeof(double) * (size_t)(k->seqlen > 0 ? k->seqlen : 1));
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < tasks; task++) {
            if (!s) {
#pragma omp atomic write
                oom = 1;
                continue;
            }
            const int64_t h = task % H;
            const ref_seq r = sequence(&o, q, k, task / H);
            for (int64_t i = 0; i < r.sq; i++) {
                double mx = row_scores(&o, q, k, &r, h, h / group, i, scale, s), sum = 0;
                double *orow = out + ((r.b * q->seqlen + r.q0 + i) * H + h) * d;
                memset(orow, 0, sizeof(double) * (size_t)d);
                if (mx > -INFINITY) {
                    for (int64_t j = 0; j < r.sk; j++) sum += s[j] > -INFINITY ? exp(s[j] - mx) : 0;
                    for (int64_t j = 0; j < r.sk; j++) {
                        if (s[j] == -INFINITY) continue;
                        double pj = exp(s[j] - mx) / sum;
                        for (int64_t x = 0; x < d; x++) orow[x] += pj * at(v, r.b, r.k0 + j, h / group, x);
                    }
                }
                if (lse) lse[(r.b * H + h) * q->seqlen + r.q0 + i] = mx > -INFINITY ? mx + log(sum) : -INFINITY;
            }
        }
        free(s);
    }
    return oom ? FA_ERR_OUT_OF_MEMORY : FA_OK;
}

fa_status t_oracle_backward(const fa_attn_opts *opts, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                            const fa_tensor *dout, double *dq, double *dk, double *dv) {
    if (!q || !k || !v || !dout || !dq || !dk || !dv) return FA_ERR_INVALID_ARGUMENT;
    fa_attn_opts o = opts ? *opts : fa_attn_opts_default();
    const int64_t d = q->head_dim, H = q->heads, Hk = k->heads, group = H / Hk;
    const double scale = o.scale != 0 ? o.scale : 1.0 / sqrt((double)d);
    const size_t nk = (size_t)(k->seqlen > 0 ? k->seqlen : 1);
    memset(dq, 0, sizeof(double) * (size_t)(q->batch * q->seqlen * H * d));
    memset(dk, 0, sizeof(double) * (size_t)(k->batch * k->seqlen * Hk * d));
    memset(dv, 0, sizeof(double) * (size_t)(k->batch * k->seqlen * Hk * d));
    const int64_t tasks = n_sequences(&o, q) * Hk;
    int oom = 0;
#pragma omp parallel if (oracle_big(q, k))
    {
        double *s = malloc(sizeof(double) * nk * 2), *orow = malloc(sizeof(double) * (size_t)d);
        double *p = s ? s + nk : NULL;
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < tasks; task++) {
            if (!s || !orow) {
#pragma omp atomic write
                oom = 1;
                continue;
            }
            const int64_t hk = task % Hk;
            const ref_seq r = sequence(&o, q, k, task / Hk);
            for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
                for (int64_t i = 0; i < r.sq; i++) {
                    double mx = row_scores(&o, q, k, &r, h, hk, i, scale, s), sum = 0;
                    if (mx == -INFINITY) continue; /* a row that sees no key has zero gradients */
                    for (int64_t j = 0; j < r.sk; j++) sum += s[j] > -INFINITY ? exp(s[j] - mx) : 0;
                    memset(orow, 0, sizeof(double) * (size_t)d);
                    for (int64_t j = 0; j < r.sk; j++) {
                        p[j] = s[j] > -INFINITY ? exp(s[j] - mx) / sum : 0;
                        for (int64_t x = 0; x < d; x++) orow[x] += p[j] * at(v, r.b, r.k0 + j, hk, x);
                    }
                    double D = 0; /* dout · out */
                    for (int64_t x = 0; x < d; x++) D += at(dout, r.b, r.q0 + i, h, x) * orow[x];
                    double *dqrow = dq + ((r.b * q->seqlen + r.q0 + i) * H + h) * d;
                    for (int64_t j = 0; j < r.sk; j++) {
                        if (p[j] == 0) continue;
                        double dp = 0;
                        for (int64_t x = 0; x < d; x++)
                            dp += at(dout, r.b, r.q0 + i, h, x) * at(v, r.b, r.k0 + j, hk, x);
                        double ds = p[j] * (dp - D);
                        if (o.softcap > 0) { double t = s[j] / o.softcap; ds *= 1 - t * t; }
                        double *dkrow = dk + ((r.b * k->seqlen + r.k0 + j) * Hk + hk) * d;
                        double *dvrow = dv + ((r.b * k->seqlen + r.k0 + j) * Hk + hk) * d;
                        for (int64_t x = 0; x < d; x++) {
                            dvrow[x] += p[j] * at(dout, r.b, r.q0 + i, h, x);
                            dqrow[x] += scale * ds * at(k, r.b, r.k0 + j, hk, x);
                            dkrow[x] += scale * ds * at(q, r.b, r.q0 + i, h, x);
                        }
                    }
                }
            }
        }
        free(s);
        free(orow);
    }
    return oom ? FA_ERR_OUT_OF_MEMORY : FA_OK;
}
