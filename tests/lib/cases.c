/* Test cases by hand and at random. */
#include "cases.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

t_case t_case_make(int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hk, int64_t d, fa_dtype dt) {
    t_case c;
    memset(&c, 0, sizeof c);
    c.b = b, c.sq = sq, c.sk = sk, c.hq = hq, c.hk = hk, c.d = d, c.dt = dt;
    c.lay_q = c.lay_kv = c.lay_o = T_BSHD;
    c.opts = fa_attn_opts_default();
    c.sigma = 1;
    c.relax = 1;
    return c;
}

t_case t_case_laid(int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hk, int64_t d, fa_dtype dt, t_layout lq,
                   t_layout lkv, t_layout lo) {
    t_case c = t_case_make(b, sq, sk, hq, hk, d, dt);
    c.lay_q = lq, c.lay_kv = lkv, c.lay_o = lo;
    return c;
}

void t_case_describe(const t_case *c, char *buf, size_t n) {
    const fa_attn_opts *o = &c->opts;
    int w = snprintf(buf, n, "%s b%lld sq%lld sk%lld h%lld/%lld d%lld q:%s kv:%s o:%s", fa_dtype_name(c->dt),
                     (long long)c->b, (long long)c->sq, (long long)c->sk, (long long)c->hq, (long long)c->hk,
                     (long long)c->d, t_layout_name(c->lay_q), t_layout_name(c->lay_kv), t_layout_name(c->lay_o));
    if (w < 0 || (size_t)w >= n) return;
    if (t_case_dv(c) != c->d) w += snprintf(buf + w, n - (size_t)w, " dv%lld", (long long)t_case_dv(c));
    if (o->causal) w += snprintf(buf + w, n - (size_t)w, " causal");
    if (o->window_left >= 0 || o->window_right >= 0)
        w += snprintf(buf + w, n - (size_t)w, " win(%d,%d)", o->window_left, o->window_right);
    if (o->attention_chunk) w += snprintf(buf + w, n - (size_t)w, " chunk%d", o->attention_chunk);
    if (o->softcap != 0) w += snprintf(buf + w, n - (size_t)w, " cap%g", o->softcap);
    if (o->scale != 0) w += snprintf(buf + w, n - (size_t)w, " scale%g", o->scale);
    if (o->block_q || o->block_k) w += snprintf(buf + w, n - (size_t)w, " tiles%dx%d", o->block_q, o->block_k);
    if (o->cu_seqlens_q || o->n_seqs > 0) {
        const int32_t *cq = o->cu_seqlens_q ? o->cu_seqlens_q : c->cu_q, *ck = o->cu_seqlens_k ? o->cu_seqlens_k : c->cu_k;
        w += snprintf(buf + w, n - (size_t)w, " varlen(%lld) q=[", (long long)o->n_seqs);
        for (int64_t s = 0; s <= o->n_seqs && w > 0 && (size_t)w < n; s++)
            w += snprintf(buf + w, n - (size_t)w, "%s%d", s ? "," : "", cq[s]);
        w += snprintf(buf + w, (size_t)w < n ? n - (size_t)w : 0, "] k=[");
        for (int64_t s = 0; s <= o->n_seqs && w > 0 && (size_t)w < n; s++)
            w += snprintf(buf + w, n - (size_t)w, "%s%d", s ? "," : "", ck[s]);
        w += snprintf(buf + w, (size_t)w < n ? n - (size_t)w : 0, "]");
    }
    if (c->with_sinks && (size_t)w < n) w += snprintf(buf + w, n - (size_t)w, " sinks");
    if (c->nonfinite_padding && (size_t)w < n) w += snprintf(buf + w, n - (size_t)w, " padding:nan/inf");
    if (c->sigma != 1 && (size_t)w < n) snprintf(buf + w, n - (size_t)w, " sigma%g", c->sigma);
}

/* Padding values: NaN, +inf and -inf element by element, and on every third row one of them throughout (whole rows
 * of one infinity, not only NaN). */
static double pad_value(int64_t row, int64_t h, int64_t x) {
    static const double vals[3] = {NAN, INFINITY, -INFINITY};
    return vals[(row % 3 == 2 ? row / 3 + h : row + h + x) % 3];
}

/* Rows [cu[s] + used[s], cu[s + 1]) of every sequence s of t (batch 1: a packed batch) := pad_value. */
static void pad_rows(const t_case *c, const int32_t *cu, const int32_t *used, t_buf *t) {
    if (!t || !cu || !used) return;
    for (int64_t s = 0; s < c->opts.n_seqs; s++)
        for (int64_t row = cu[s] + used[s]; row < cu[s + 1]; row++)
            for (int64_t h = 0; h < t->t.heads; h++)
                for (int64_t x = 0; x < t->t.head_dim; x++) t_set(&t->t, 0, row, h, x, pad_value(row, h, x));
}

void t_case_pad(const t_case *c, t_buf *q, t_buf *k, t_buf *v, t_buf *dout) {
    if (!c->nonfinite_padding) return;
    const fa_attn_opts *o = &c->opts;
    pad_rows(c, o->cu_seqlens_q, o->seqused_q, q), pad_rows(c, o->cu_seqlens_q, o->seqused_q, dout);
    pad_rows(c, o->cu_seqlens_k, o->seqused_k, k), pad_rows(c, o->cu_seqlens_k, o->seqused_k, v);
}

/* One packed batch of 1-4 sequences of 0-48 rows each; the key side repeats the query lengths half the time. A
 * batch whose query or key total is empty gets a last sequence of one row, as K/V and Q need a row. */
static void draw_varlen(t_rng *r, t_case *c) {
    int n = t_rng_int(r, 1, 4);
    c->cu_q[0] = c->cu_k[0] = 0;
    for (int s = 0; s < n; s++) {
        c->cu_q[s + 1] = c->cu_q[s] + t_rng_int(r, 0, 48);
        c->cu_k[s + 1] = c->cu_k[s] + (t_rng_int(r, 0, 1) ? c->cu_q[s + 1] - c->cu_q[s] : t_rng_int(r, 0, 48));
    }
    if (c->cu_q[n] == 0 || c->cu_k[n] == 0) {
        c->cu_q[n + 1] = c->cu_q[n] + (c->cu_q[n] == 0);
        c->cu_k[n + 1] = c->cu_k[n] + (c->cu_k[n] == 0);
        n++;
    }
    c->b = 1, c->sq = c->cu_q[n], c->sk = c->cu_k[n];
    c->opts.n_seqs = n;
    if (c->lay_kv == T_BCAST) c->lay_kv = T_BSHD;
}

void t_case_bind(t_case *c) {
    if (c->opts.n_seqs > 0 && !c->opts.cu_seqlens_q) c->opts.cu_seqlens_q = c->cu_q, c->opts.cu_seqlens_k = c->cu_k;
    if (c->with_sinks) c->opts.sinks = c->sinks;
}

void t_case_sinks(t_case *c, t_rng *r, double lo, double hi) {
    c->with_sinks = c->hq <= T_MAX_SINK_HEADS;
    for (int64_t h = 0; h < c->hq && h < T_MAX_SINK_HEADS; h++) c->sinks[h] = (float)(lo + (hi - lo) * t_rng_uniform(r));
    c->opts.sinks = NULL; /* bound where the case is used */
}

t_case t_case_draw(t_rng *r, const t_space *sp) {
    static const int seqlens[] = {1, 2, 3, 5, 8, 17, 31, 64, 65, 113, 128, 239};
    static const int dims[] = {1, 2, 8, 16, 31, 32, 63, 64, 80, 96, 128, 256};
    static const fa_dtype all_dts[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    fa_dtype dts[3];
    int ndt = 0;
    for (int i = 0; i < 3; i++)
        if (!sp->dtypes || (sp->dtypes & (1u << all_dts[i]))) dts[ndt++] = all_dts[i];
    int ns = 0, nd = 0;
    while (ns < (int)(sizeof seqlens / sizeof seqlens[0]) && seqlens[ns] <= sp->max_seqlen) ns++;
    while (nd < (int)(sizeof dims / sizeof dims[0]) && dims[nd] <= sp->max_d) nd++;
    int64_t hk = t_rng_int(r, 1, 2), group = 1 << t_rng_int(r, 0, 2);
    int64_t b = t_rng_int(r, 1, 3), sq = seqlens[t_rng_int(r, 0, ns - 1)], sk = seqlens[t_rng_int(r, 0, ns - 1)];
    int64_t d = dims[t_rng_int(r, 0, nd - 1)];
    t_case c = t_case_make(b, sq, sk, hk * group, hk, d, dts[t_rng_int(r, 0, ndt - 1)]);
    /* v/out's own head_dim from the same list (MLA's 192/128 among the pairs when 256 is allowed) */
    if (sp->dv_pct > 0 && t_rng_int(r, 0, 99) < sp->dv_pct) {
        if (sp->max_d >= 192 && t_rng_int(r, 0, 3) == 0) c.d = 192, c.dv = 128;
        else c.dv = dims[t_rng_int(r, 0, nd - 1)];
    }
    c.lay_q = (t_layout)t_rng_int(r, 0, 2);
    c.lay_kv = (t_layout)t_rng_int(r, 0, sp->bcast ? 3 : 2);
    c.lay_o = (t_layout)t_rng_int(r, 0, 2);
    c.opts.causal = t_rng_int(r, 0, 2) == 0;
    if (t_rng_int(r, 0, 3) == 0) c.opts.window_left = t_rng_int(r, 0, 20);
    if (t_rng_int(r, 0, 3) == 0) c.opts.window_right = t_rng_int(r, 0, 20);
    if (t_rng_int(r, 0, 3) == 0) c.opts.softcap = (float)t_rng_int(r, 5, 50);
    if (sp->chunk_pct > 0 && t_rng_int(r, 0, 99) < sp->chunk_pct) c.opts.attention_chunk = t_rng_int(r, 1, 40);
    if (sp->tiles && t_rng_int(r, 0, 1)) c.opts.block_q = t_rng_int(r, 1, 70), c.opts.block_k = t_rng_int(r, 1, 70);
    /* an explicit scale around the default 1/sqrt(d), sometimes negative (logits stay O(1..10): the f32 bound of
     * 1e-5 assumes scores that fp32 represents to ~1e-6) */
    if (t_rng_int(r, 0, 4) == 0)
        c.opts.scale = (float)((t_rng_int(r, 0, 3) ? 1 : -1) * (0.3 + t_rng_uniform(r)) / sqrt((double)c.d));
    c.sigma = t_rng_int(r, 0, 2) ? 1 : 2;
    if (sp->varlen_pct > 0 && t_rng_int(r, 0, 99) < sp->varlen_pct) draw_varlen(r, &c);
    /* sinks around the logits' range: from a small share of the weight to most of it */
    if (sp->sinks_pct > 0 && t_rng_int(r, 0, 99) < sp->sinks_pct) t_case_sinks(&c, r, -2, 4);
    if (sp->max_work > 0) {
        const double w = (double)(c.d + t_case_dv(&c)) / 2; /* the oracle's work per (query, key) pair */
        while ((double)c.b * c.hq * c.sq * c.sk * w > sp->max_work && (c.hq > c.hk || c.b > 1)) {
            if (c.hq > c.hk) c.hq = c.hk;
            else c.b--;
        }
        while ((double)c.b * c.hq * c.sq * c.sk * w > sp->max_work && c.hk > 1) c.hq = --c.hk;
    }
    return c;
}

t_case t_case_random(int max_seqlen, int max_d, int allow_bcast) {
    t_space sp = {max_seqlen, max_d, allow_bcast, 1, 0, 0, 0, 0, 0, 0};
    return t_case_draw(&t_default_rng, &sp);
}
