/* The float64 oracle: the definition, one row at a time (a query row; a key row in the backward's pass 2):
 *   S_ij = scale · qi·kj, softcap: S_ij = cap · tanh(S_ij / cap), masked keys dropped,
 *   P_ij = exp(S_ij − m_i) / l_i with m_i = max_j S_ij, l_i = Σ_j exp(S_ij − m_i), out_i = Σ_j P_ij vj,
 *   LSE_i = m_i + log l_i; a row that sees no key has out_i = 0, LSE_i = −inf and zero gradients.
 * Backward: D_i = dout_i·out_i, dP_ij = dout_i·vj, dS_ij = P_ij (dP_ij − D_i) (softcap: dS_ij *= 1 − tanh²),
 *   dq_i = scale Σ_j dS_ij kj (pass 1, over query rows, which also keeps m, l, D),
 *   dk_j = scale Σ_i dS_ij q_i, dv_j = Σ_i P_ij dout_i (pass 2, over key rows, recomputing S, P, dS from m, l, D;
 *   i runs over the query heads of the K/V head, then the rows).
 * The inputs are widened once into dense double rows and transposes (every layout, stride and varlen offset is
 * handled there); each dot product is vectorised across keys (or queries), never across its own terms. OpenMP
 * threads take rows; every output element is written by one thread with its sum in one fixed order, so the results
 * are the same bits with any number of threads. FP8 inputs are decoded exactly and multiplied by their descales
 * (exact in double). docs/testing.md. */
#include "oracle.h"

#include "dtype.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct ref_seq { int64_t q0, k0, sq, sk, b; } ref_seq; /* rows of one sequence */

/* One input widened: row[((b·H + h)·S + s)·d + x] and, if asked, its transpose col[((b·H + h)·d + x)·S + s]. */
typedef struct dense { double *row, *col; int64_t S, H, d; } dense;

static const double *drow(const dense *t, int64_t b, int64_t h, int64_t s) {
    return t->row + ((b * t->H + h) * t->S + s) * t->d;
}
static const double *dcol(const dense *t, int64_t b, int64_t h) { return t->col + (b * t->H + h) * t->d * t->S; }

static int dense_new(dense *w, const fa_tensor *t, int with_col) {
    const size_t n = (size_t)(t->batch * t->seqlen * t->heads * t->head_dim), bytes = sizeof(double) * (n ? n : 1);
    *w = (dense){malloc(bytes), with_col ? malloc(bytes) : NULL, t->seqlen, t->heads, t->head_dim};
    return w->row && (w->col || !with_col);
}
static void dense_free(dense *w) { free(w->row), free(w->col); }

/* Called inside the parallel region: threads share the (b, s, h) rows. */
static void widen(const fa_tensor *t, dense *w) {
    const int64_t S = t->seqlen, H = t->heads, d = t->head_dim;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < t->batch * S * H; n++) {
        const int64_t b = n / (S * H), s = n / H % S, h = n % H;
        const int64_t base = b * t->stride_batch + s * t->stride_seq + h * t->stride_head;
        double *r = w->row + ((b * H + h) * S + s) * d, *c = w->col ? w->col + (b * H + h) * d * S + s : NULL;
        for (int64_t x = 0; x < d; x++) {
            r[x] = t_load(t->data, t->dtype, base + x);
            if (c) c[x * S] = r[x];
        }
    }
}

static int64_t n_sequences(const fa_attn_opts *o, const fa_tensor *q) { return o->cu_seqlens_q ? o->n_seqs : q->batch; }

static ref_seq sequence(const fa_attn_opts *o, const fa_tensor *q, const fa_tensor *k, int64_t s) {
    ref_seq r;
    if (o->cu_seqlens_q) {
        r = (ref_seq){o->cu_seqlens_q[s], o->cu_seqlens_k[s], o->cu_seqlens_q[s + 1] - o->cu_seqlens_q[s],
                      o->cu_seqlens_k[s + 1] - o->cu_seqlens_k[s], 0};
        /* seqused: the sequence is its first used rows; the rest of its span is padding (the callers skip it) */
        if (o->seqused_q) r.sq = o->seqused_q[s];
        if (o->seqused_k) r.sk = o->seqused_k[s];
    } else {
        r = (ref_seq){0, 0, q->seqlen, k->seqlen, s};
    }
    return r;
}

/* The sequence owning packed row `row` (of q if cu = cu_seqlens_q, of k if cu_seqlens_k): the last s with
 * cu[s] <= row, which skips empty sequences. Without varlen, batch b is the sequence. */
static ref_seq owner(const fa_attn_opts *o, const fa_tensor *q, const fa_tensor *k, const int32_t *cu, int64_t b,
                     int64_t row) {
    if (!cu) return sequence(o, q, k, b);
    int64_t lo = 0, hi = n_sequences(o, q) - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (cu[mid] <= row) lo = mid;
        else hi = mid - 1;
    }
    return sequence(o, q, k, lo);
}

static int visible(const fa_attn_opts *o, const ref_seq *r, int64_t i, int64_t j) {
    int64_t diag = i + r->sk - r->sq;
    if (o->causal && j > diag) return 0;
    if (o->window_right >= 0 && j > diag + o->window_right) return 0;
    if (o->window_left >= 0 && j < diag - o->window_left) return 0;
    if (o->attention_chunk > 0) { /* the same chunk: floor division of key and diagonal (j >= 0, diag any sign) */
        const int64_t c = o->attention_chunk, dc = diag >= 0 ? diag / c : -((-diag + c - 1) / c);
        if (j / c != dc) return 0;
    }
    return 1;
}

/* out[n] = Σ_x a[x] · bt[x·ld + n] for n < len, each sum over x in order; four x per sweep of out. */
static void dots(const double *restrict a, const double *restrict bt, int64_t ld, int64_t d, int64_t len,
                 double *restrict out) {
    for (int64_t n = 0; n < len; n++) out[n] = 0;
    int64_t x = 0;
    for (; x + 4 <= d; x += 4) {
        const double a0 = a[x], a1 = a[x + 1], a2 = a[x + 2], a3 = a[x + 3];
        const double *b0 = bt + x * ld, *b1 = b0 + ld, *b2 = b1 + ld, *b3 = b2 + ld;
        for (int64_t n = 0; n < len; n++) {
            double acc = out[n];
            acc += a0 * b0[n];
            acc += a1 * b1[n];
            acc += a2 * b2[n];
            acc += a3 * b3[n];
            out[n] = acc;
        }
    }
    for (; x < d; x++)
        for (int64_t n = 0; n < len; n++) out[n] += a[x] * bt[x * ld + n];
}

/* y[x] += Σ_n c[n] · base[idx[n]·d + x] in order of n; four rows per sweep of y. */
static void axpys(int64_t cnt, const double *c, const int64_t *idx, const double *base, int64_t d,
                  double *restrict y) {
    int64_t n = 0;
    for (; n + 4 <= cnt; n += 4) {
        const double c0 = c[n], c1 = c[n + 1], c2 = c[n + 2], c3 = c[n + 3];
        const double *r0 = base + idx[n] * d, *r1 = base + idx[n + 1] * d, *r2 = base + idx[n + 2] * d,
                     *r3 = base + idx[n + 3] * d;
        for (int64_t x = 0; x < d; x++) {
            double acc = y[x];
            acc += c0 * r0[x];
            acc += c1 * r1[x];
            acc += c2 * r2[x];
            acc += c3 * r3[x];
            y[x] = acc;
        }
    }
    for (; n < cnt; n++)
        for (int64_t x = 0; x < d; x++) y[x] += c[n] * base[idx[n] * d + x];
}

static double capped(const fa_attn_opts *o, double s, double scale) {
    s *= scale;
    return o->softcap > 0 ? o->softcap * tanh(s / o->softcap) : s;
}

/* Query row i (qi) against the keys of its sequence (kt: Kᵀ at the sequence's first key, leading dimension ld):
 * S[j] for j in [*lo, *hi), the hull of the visible keys, −inf where masked. Returns m = max_j S[j]. */
static double row_scores(const fa_attn_opts *o, const ref_seq *r, int64_t i, const double *qi, const double *kt,
                         int64_t ld, int64_t d, double scale, double *S, int64_t *lo, int64_t *hi) {
    int64_t a = 0, e = r->sk;
    while (a < e && !visible(o, r, i, a)) a++;
    while (e > a && !visible(o, r, i, e - 1)) e--;
    *lo = a, *hi = e;
    dots(qi, kt + a, ld, d, e - a, S + a);
    double m = -INFINITY;
    for (int64_t j = a; j < e; j++) {
        S[j] = visible(o, r, i, j) ? capped(o, S[j], scale) : -INFINITY;
        if (S[j] > m) m = S[j];
    }
    return m;
}

static double row_sum(const double *S, int64_t lo, int64_t hi, double m) {
    double l = 0;
    for (int64_t j = lo; j < hi; j++) l += S[j] > -INFINITY ? exp(S[j] - m) : 0;
    return l;
}

/* Worth threads: about 10^8 multiply-adds or more (the small cases of the CPU tests stay serial and cheap). */
static int oracle_big(const fa_tensor *q, const fa_tensor *k) {
    return (double)q->batch * q->seqlen * k->seqlen * q->heads * q->head_dim > 1e8;
}

/* The sequence of row `row` of batch b: b, or with varlen the last s with cu[s] <= row. */
static int64_t seq_index(const fa_attn_opts *o, const int32_t *cu, int64_t b, int64_t row) {
    if (!cu) return b;
    int64_t lo = 0, hi = o->n_seqs - 1;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (cu[mid] <= row) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* FP8 inputs: every row times its (sequence, K/V head)'s descale (ds [sequences][hk]; head h of t belongs to K/V
 * head h / group), exactly: an E4M3 value has 4 significant bits, a descale 24. Inside the parallel region. */
static void descale(const fa_attn_opts *o, const fa_tensor *t, dense *w, const float *ds, const int32_t *cu,
                    int64_t group, int64_t hk) {
    if (!ds) return;
    const int64_t S = t->seqlen, H = t->heads, d = t->head_dim;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < t->batch * S * H; n++) {
        const int64_t b = n / (S * H), s = n / H % S, h = n % H;
        const double f = ds[seq_index(o, cu, b, s) * hk + h / group];
        double *r = w->row + ((b * H + h) * S + s) * d, *c = w->col ? w->col + (b * H + h) * d * S + s : NULL;
        for (int64_t x = 0; x < d; x++) {
            r[x] *= f;
            if (c) c[x * S] = r[x];
        }
    }
}

fa_status t_oracle_forward(const fa_attn_opts *opts, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                           double *out, double *lse) {
    if (!q || !k || !v || !out) return FA_ERR_INVALID_ARGUMENT;
    fa_attn_opts o = opts ? *opts : fa_attn_opts_default();
    const int64_t d = q->head_dim, dv = v->head_dim, H = q->heads, group = q->heads / k->heads, Sq = q->seqlen;
    const int64_t Sk = k->seqlen;
    const double scale = o.scale != 0 ? o.scale : 1.0 / sqrt((double)d);
    dense Q, K, V;
    int ok = dense_new(&Q, q, 0) & dense_new(&K, k, 1) & dense_new(&V, v, 0), oom = !ok;
#pragma omp parallel if (ok && oracle_big(q, k))
    {
        const size_t ns = (size_t)(Sk > 0 ? Sk : 1);
        double *S = malloc(sizeof(double) * 2 * ns), *P = S ? S + ns : NULL;
        int64_t *idx = malloc(sizeof(int64_t) * ns);
        if (ok) widen(q, &Q), widen(k, &K), widen(v, &V);
        if (ok) {
            descale(&o, q, &Q, o.q_descale, o.cu_seqlens_q, group, k->heads);
            descale(&o, k, &K, o.k_descale, o.cu_seqlens_k, 1, k->heads);
            descale(&o, v, &V, o.v_descale, o.cu_seqlens_k, 1, k->heads);
        }
#pragma omp for schedule(dynamic, 4)
        for (int64_t n = 0; n < (ok ? q->batch * H * Sq : 0); n++) {
            if (!S || !idx) {
#pragma omp atomic write
                oom = 1;
                continue;
            }
            const int64_t b = n / (H * Sq), h = n / Sq % H, row = n % Sq, hk = h / group;
            const ref_seq r = owner(&o, q, k, o.cu_seqlens_q, b, row);
            const int64_t i = row - r.q0;
            if (i >= r.sq) { /* a padding row past seqused_q: O = 0, LSE = -inf */
                memset(out + ((r.b * Sq + row) * H + h) * dv, 0, sizeof(double) * (size_t)dv);
                if (lse) lse[(r.b * H + h) * Sq + row] = -INFINITY;
                continue;
            }
            int64_t lo, hi;
            double m = row_scores(&o, &r, i, drow(&Q, r.b, h, row), dcol(&K, r.b, hk) + r.k0, Sk, d, scale, S, &lo,
                                  &hi);
            double *O = out + ((r.b * Sq + row) * H + h) * dv, l = 0;
            const double sink = o.sinks ? o.sinks[h] : -INFINITY, mk = m; /* the sink: a logit with v = 0 */
            if (sink > m) m = sink;
            memset(O, 0, sizeof(double) * (size_t)dv);
            if (mk > -INFINITY) { /* O = Σ_j P_ij vj over the unmasked keys, in order of j */
                l = row_sum(S, lo, hi, m) + (sink > -INFINITY ? exp(sink - m) : 0);
                int64_t cnt = 0;
                for (int64_t j = lo; j < hi; j++)
                    if (S[j] != -INFINITY) P[cnt] = exp(S[j] - m) / l, idx[cnt++] = j;
                axpys(cnt, P, idx, drow(&V, r.b, hk, r.k0), dv, O);
            }
            if (lse) lse[(r.b * H + h) * Sq + row] = mk > -INFINITY ? m + log(l) : sink;
        }
        free(S);
        free(idx);
    }
    dense_free(&Q), dense_free(&K), dense_free(&V);
    return oom ? FA_ERR_OUT_OF_MEMORY : FA_OK;
}

/* P_ij and dS_ij from a recomputed score s (capped) and the row's m, l, D; 0 when P_ij is 0. */
static double p_of(double s, double m, double l) { return s > -INFINITY ? exp(s - m) / l : 0; }
static double ds_of(const fa_attn_opts *o, double p, double s, double dp, double D) {
    double ds = p * (dp - D);
    if (o->softcap > 0) { double t = s / o->softcap; ds *= 1 - t * t; }
    return ds;
}

fa_status t_oracle_backward(const fa_attn_opts *opts, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                            const fa_tensor *dout, double *dq, double *dk, double *dv) {
    return t_oracle_backward_mag(opts, q, k, v, dout, dq, dk, dv, NULL);
}

fa_status t_oracle_backward_mag(const fa_attn_opts *opts, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                                const fa_tensor *dout, double *dq, double *dk, double *dv, double *dv_mag) {
    return t_oracle_backward_sinks(opts, q, k, v, dout, dq, dk, dv, dv_mag, NULL, NULL);
}

fa_status t_oracle_backward_sinks(const fa_attn_opts *opts, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                                  const fa_tensor *dout, double *dq, double *dk, double *dvo, double *dv_mag,
                                  double *dsinks, double *dsinks_mag) {
    if (!q || !k || !v || !dout || !dq || !dk || !dvo) return FA_ERR_INVALID_ARGUMENT;
    fa_attn_opts o = opts ? *opts : fa_attn_opts_default();
    const int64_t d = q->head_dim, dv = v->head_dim, H = q->heads, Hk = k->heads, group = H / Hk, Sq = q->seqlen;
    const int64_t Sk = k->seqlen;
    const double scale = o.scale != 0 ? o.scale : 1.0 / sqrt((double)d);
    const size_t n_rows = (size_t)(q->batch * H * Sq), ns = (size_t)(Sk > Sq ? Sk : Sq) + 1;
    dense Q, K, V, dO;
    double *ml = malloc(sizeof(double) * 4 * (n_rows ? n_rows : 1)); /* per query row: m, l, D, its d sink term */
    int ok = dense_new(&Q, q, 1) & dense_new(&K, k, 1) & dense_new(&V, v, 1) & dense_new(&dO, dout, 1) && ml;
    int oom = !ok;
#pragma omp parallel if (ok && oracle_big(q, k))
    {
        double *S = malloc(sizeof(double) * 4 * ns), *O = malloc(sizeof(double) * (size_t)(dv > 0 ? dv : 1));
        double *dP = S ? S + ns : NULL, *P = S ? S + 2 * ns : NULL, *C = S ? S + 3 * ns : NULL; /* C = scale·dS */
        int64_t *idx = malloc(sizeof(int64_t) * ns), *idx2 = malloc(sizeof(int64_t) * ns);
        const int scratch = S && O && idx && idx2;
        if (ok) widen(q, &Q), widen(k, &K), widen(v, &V), widen(dout, &dO);
        /* pass 1: one query row each — m, l, D and dq_i */
#pragma omp for schedule(dynamic, 4)
        for (int64_t n = 0; n < (ok ? (int64_t)n_rows : 0); n++) {
            if (!scratch) {
#pragma omp atomic write
                oom = 1;
                continue;
            }
            const int64_t b = n / (H * Sq), h = n / Sq % H, row = n % Sq, hk = h / group;
            const ref_seq r = owner(&o, q, k, o.cu_seqlens_q, b, row);
            const int64_t i = row - r.q0;
            double *dqi = dq + ((r.b * Sq + row) * H + h) * d, *st = ml + 4 * ((r.b * H + h) * Sq + row);
            memset(dqi, 0, sizeof(double) * (size_t)d);
            if (i >= r.sq) { /* a padding row past seqused_q: dq = 0, and no term in dk, dv or d sinks */
                st[0] = -INFINITY, st[3] = 0;
                continue;
            }
            int64_t lo, hi;
            double m = row_scores(&o, &r, i, drow(&Q, r.b, h, row), dcol(&K, r.b, hk) + r.k0, Sk, d, scale, S,
                                  &lo, &hi);
            st[0] = m;
            st[3] = 0;
            if (m == -INFINITY) continue; /* a row that sees no key has zero gradients (O = 0: no d sink term) */
            const double sink = o.sinks ? o.sinks[h] : -INFINITY; /* in the denominator only */
            if (sink > m) st[0] = m = sink;
            const double l = st[1] = row_sum(S, lo, hi, m) + (sink > -INFINITY ? exp(sink - m) : 0);
            for (int64_t j = lo; j < hi; j++) P[j - lo] = p_of(S[j], m, l), idx[j - lo] = j;
            memset(O, 0, sizeof(double) * (size_t)dv); /* out_i again, every key of the hull with P_ij as dq_i uses it */
            axpys(hi - lo, P, idx, drow(&V, r.b, hk, r.k0), dv, O);
            const double *doi = drow(&dO, r.b, h, row);
            double D = 0;
            for (int64_t x = 0; x < dv; x++) D += doi[x] * O[x];
            st[2] = D;
            st[3] = sink > -INFINITY ? -exp(sink - m) / l * D : 0; /* d sink = −exp(sink − LSE_i) · D_i */
            dots(doi, dcol(&V, r.b, hk) + r.k0 + lo, Sk, dv, hi - lo, dP + lo);
            int64_t cnt = 0;
            for (int64_t j = lo; j < hi; j++) {
                const double p = P[j - lo];
                if (p != 0) C[cnt] = scale * ds_of(&o, p, S[j], dP[j], D), idx2[cnt++] = j;
            }
            axpys(cnt, C, idx2, drow(&K, r.b, hk, r.k0), d, dqi);
        }
        /* pass 2: one key row each — dk_j, dv_j over the query heads of its K/V head, then their rows, in order */
#pragma omp for schedule(dynamic, 4)
        for (int64_t n = 0; n < (ok ? k->batch * Hk * Sk : 0); n++) {
            if (!scratch) {
#pragma omp atomic write
                oom = 1;
                continue;
            }
            const int64_t b = n / (Hk * Sk), hk = n / Sk % Hk, row = n % Sk;
            const ref_seq r = owner(&o, q, k, o.cu_seqlens_k, b, row);
            const int64_t j = row - r.k0;
            double *dkj = dk + ((r.b * Sk + row) * Hk + hk) * d, *dvj = dvo + ((r.b * Sk + row) * Hk + hk) * dv;
            memset(dkj, 0, sizeof(double) * (size_t)d);
            memset(dvj, 0, sizeof(double) * (size_t)dv);
            if (j >= r.sk) { /* a padding key past seqused_k: dk = dv = 0 */
                if (dv_mag) memset(dv_mag + ((r.b * Sk + row) * Hk + hk) * dv, 0, sizeof(double) * (size_t)dv);
                continue;
            }
            int64_t lo = 0, hi = r.sq;
            while (lo < hi && !visible(&o, &r, lo, j)) lo++;
            while (hi > lo && !visible(&o, &r, hi - 1, j)) hi--;
            const double *kj = drow(&K, r.b, hk, row), *vj = drow(&V, r.b, hk, row);
            for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
                dots(kj, dcol(&Q, r.b, h) + r.q0 + lo, Sq, d, hi - lo, S + lo);
                dots(vj, dcol(&dO, r.b, h) + r.q0 + lo, Sq, dv, hi - lo, dP + lo);
                int64_t cnt = 0;
                for (int64_t i = lo; i < hi; i++) {
                    const double *st = ml + 4 * ((r.b * H + h) * Sq + r.q0 + i);
                    if (!visible(&o, &r, i, j) || st[0] == -INFINITY) continue;
                    const double s = capped(&o, S[i], scale), p = p_of(s, st[0], st[1]);
                    if (p != 0) P[cnt] = p, C[cnt] = scale * ds_of(&o, p, s, dP[i], st[2]), idx[cnt++] = i;
                }
                axpys(cnt, P, idx, drow(&dO, r.b, h, r.q0), dv, dvj);
                axpys(cnt, C, idx, drow(&Q, r.b, h, r.q0), d, dkj);
                if (dv_mag) {
                    double *mj = dv_mag + ((r.b * Sk + row) * Hk + hk) * dv;
                    if (h == hk * group) memset(mj, 0, sizeof(double) * (size_t)dv);
                    const double *dob = drow(&dO, r.b, h, r.q0);
                    for (int64_t c = 0; c < cnt; c++)
                        for (int64_t x = 0; x < dv; x++) mj[x] += P[c] * fabs(dob[idx[c] * dv + x]);
                }
            }
        }
        free(S);
        free(O);
        free(idx);
        free(idx2);
    }
    dense_free(&Q), dense_free(&K), dense_free(&V), dense_free(&dO);
    for (int64_t h = 0; h < H; h++) { /* summed over batch and rows, in order */
        double g = 0, mag = 0;
        for (int64_t b = 0; ok && b < q->batch; b++)
            for (int64_t s = 0; s < Sq; s++) {
                const double t = ml[4 * ((b * H + h) * Sq + s) + 3];
                g += t, mag += fabs(t);
            }
        if (dsinks) dsinks[h] = g;
        if (dsinks_mag) dsinks_mag[h] = mag;
    }
    free(ml);
    return oom ? FA_ERR_OUT_OF_MEMORY : FA_OK;
}
