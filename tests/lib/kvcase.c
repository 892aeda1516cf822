/* KV-cache test cases and their checks (kvcase.h). The reference of one sequence is the float64 oracle over its
 * keys gathered from the cache into a plain [1, L, hk, d] tensor, with q rotated by a float64 rotary. */
#include "kvcase.h"

#include "check.h"
#include "dtype.h"
#include "oracle.h"
#include "tolerance.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define T_KV_MAX_D 576 /* decoding's longest head_dim (q/k) */

static int64_t es_of(fa_dtype dt) { return (int64_t)fa_dtype_size(dt); }
static int64_t len_after(const t_kv_case *c, int64_t b) { return c->seqlens[b] + (c->s.append ? c->s.sq : 0); }
static int64_t row_of(const t_kv_case *c, int64_t b) { return c->batch_idx ? c->batch_idx[b] : b; }
fa_dtype t_kv_cache_dtype(const t_kv_case *c) { return c->s.fp8 ? FA_DTYPE_F8_E4M3 : c->s.dt; }
/* The descale of sequence b, K/V head h of the k (is_v 0) or v cache: 1 without FP8. */
static double ds_of(const t_kv_case *c, int is_v, int64_t b, int64_t h) {
    const float *ds = is_v ? c->v_descale : c->k_descale;
    return ds ? ds[b * c->s.hk + h] : 1.0;
}

static int64_t key_off(const t_kv_case *c, const fa_tensor *k, int64_t b, int64_t h, int64_t t) {
    const int64_t row = row_of(c, b);
    if (c->s.page_size) {
        const int64_t pg = c->block_table[row * c->max_pages + t / c->s.page_size];
        return pg * k->stride_batch + (t % c->s.page_size) * k->stride_seq + h * k->stride_head;
    }
    return row * k->stride_batch + t * k->stride_seq + h * k->stride_head;
}
int64_t t_kv_key_off(const t_kv_case *c, int64_t b, int64_t h, int64_t t) { return key_off(c, &c->kct, b, h, t); }
int64_t t_kv_val_off(const t_kv_case *c, int64_t b, int64_t h, int64_t t) { return key_off(c, &c->vct, b, h, t); }

static void shuffle(t_rng *r, int32_t *x, int64_t n) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = t_rng_int(r, 0, (int)i);
        int32_t t = x[i];
        x[i] = x[j], x[j] = t;
    }
}

t_kv_spec t_kv_spec_of(fa_dtype dt, int batch, int sq, int hq, int hk, int d, int cap, int page) {
    t_kv_spec s;
    memset(&s, 0, sizeof s);
    s.dt = dt, s.batch = batch, s.sq = sq, s.hq = hq, s.hk = hk, s.d = d, s.capacity = cap, s.page_size = page;
    s.opts = fa_attn_opts_default();
    s.kv = fa_kv_opts_default();
    return s;
}

void t_kv_set_mask(t_kv_spec *s, int m) {
    switch (m) {
    case 1: s->opts.causal = 1; break;
    case 2: s->opts.window_left = 37, s->opts.window_right = 2; break;
    case 3: s->opts.causal = 1, s->opts.window_left = 50; break;
    case 4: s->opts.softcap = 3.5f, s->opts.causal = 1; break;
    default: break;
    }
}

t_kv_spec t_kv_spec_random(t_rng *r, const float *sinks) {
    static const int pages[] = {0, 1, 2, 3, 5, 16, 64, 256};
    const int hk = t_rng_int(r, 1, 3), g = (int[]){1, 2, 4, 8}[t_rng_int(r, 0, 3)];
    const fa_dtype dt = (fa_dtype)t_rng_int(r, 0, 2);
    const int batch = t_rng_int(r, 1, 5), sq = t_rng_int(r, 1, 9), d = t_rng_int(r, 1, 160);
    const int cap = t_rng_int(r, 9, 700), page = pages[t_rng_int(r, 0, 7)];
    t_kv_spec s = t_kv_spec_of(dt, batch, sq, hk * g, hk, d, cap, page);
    s.append = t_rng_int(r, 0, 1);
    s.rotary = s.append && s.d % 2 == 0 ? t_rng_int(r, 0, 2) : 0;
    s.batch_idx = t_rng_int(r, 0, 1);
    t_kv_set_mask(&s, t_rng_int(r, 0, 4));
    if (t_rng_int(r, 0, 2) == 0) s.kv.num_splits = t_rng_int(r, 1, 9);
    else if (t_rng_int(r, 0, 1)) s.kv.split_size = t_rng_int(r, 1, 300);
    if (sinks && t_rng_int(r, 0, 3) == 0) s.opts.sinks = sinks;
    if (s.sq > s.capacity) s.sq = s.capacity;
    return s;
}

t_kv_case *t_kv_new(const t_kv_spec *spec, t_rng *r) {
    t_kv_case *c = calloc(1, sizeof *c);
    c->s = *spec;
    if (!c->s.dv) c->s.dv = c->s.d;
    const t_kv_spec *s = &c->s;
    const fa_dtype cdt = s->fp8 ? FA_DTYPE_F8_E4M3 : s->dt;
    const int64_t B = s->batch, cap = s->capacity, es = es_of(cdt), add = s->append ? s->sq : 0, dv = s->dv;
    if (s->fp8) { /* N(0, 1) values / [0.02, 0.05) stay well inside ±448 */
        c->k_descale = malloc(sizeof(float) * (size_t)(B * s->hk));
        c->v_descale = malloc(sizeof(float) * (size_t)(B * s->hk));
        for (int64_t i = 0; i < B * s->hk; i++) {
            c->k_descale[i] = (float)(0.02 + 0.03 * t_rng_uniform(r));
            c->v_descale[i] = (float)(0.02 + 0.03 * t_rng_uniform(r));
        }
    }
    c->seqlens = malloc(sizeof(int32_t) * (size_t)B);
    for (int64_t b = 0; b < B; b++) {
        int len = s->lens ? s->lens[b] : t_rng_int(r, 0, (int)(cap - add));
        if (!s->lens && B > 2 && b == 0) len = 0;                 /* both ends of the range */
        if (!s->lens && B > 2 && b == 1) len = (int)(cap - add);
        c->seqlens[b] = len;
    }
    c->rows = s->batch_idx ? B + 2 : B;
    if (s->batch_idx) {
        int32_t *perm = malloc(sizeof(int32_t) * (size_t)c->rows);
        for (int64_t i = 0; i < c->rows; i++) perm[i] = (int32_t)i;
        shuffle(r, perm, c->rows);
        c->batch_idx = malloc(sizeof(int32_t) * (size_t)B);
        memcpy(c->batch_idx, perm, sizeof(int32_t) * (size_t)B);
        free(perm);
    }
    int64_t n_keys;
    if (s->page_size) {
        c->max_pages = (cap + s->page_size - 1) / s->page_size;
        c->num_pages = c->rows * c->max_pages + 3;
        int32_t *perm = malloc(sizeof(int32_t) * (size_t)c->num_pages);
        for (int64_t i = 0; i < c->num_pages; i++) perm[i] = (int32_t)i;
        shuffle(r, perm, c->num_pages);
        c->block_table = malloc(sizeof(int32_t) * (size_t)c->rows * (size_t)c->max_pages);
        for (int64_t i = 0; i < c->rows * c->max_pages; i++) c->block_table[i] = perm[i];
        free(perm);
        /* entries past each sequence's last used page are never read: make them invalid */
        for (int64_t b = 0; b < B; b++) {
            const int64_t used = (len_after(c, b) + s->page_size - 1) / s->page_size;
            for (int64_t j = used; j < c->max_pages; j++) c->block_table[row_of(c, b) * c->max_pages + j] = -1;
        }
        c->kct = fa_tensor_bshd(NULL, cdt, c->num_pages, s->page_size, s->hk, s->d);
        c->vct = fa_tensor_bshd(NULL, cdt, c->num_pages, s->page_size, s->hk, dv);
        n_keys = c->num_pages * s->page_size;
    } else {
        c->kct = fa_tensor_bshd(NULL, cdt, c->rows, cap, s->hk, s->d);
        c->vct = fa_tensor_bshd(NULL, cdt, c->rows, cap, s->hk, dv);
        n_keys = c->rows * cap;
    }
    c->cache_bytes = (size_t)(n_keys * s->hk * s->d * es);
    c->v_bytes = (size_t)(n_keys * s->hk * dv * es);
    c->kc = malloc(c->cache_bytes);
    c->vc = malloc(c->v_bytes);
    c->kct.data = c->kc;
    c->vct.data = c->vc;
    /* everything NaN, then random values at the keys each sequence has */
    for (int64_t i = 0; i < n_keys * s->hk * s->d; i++) t_store_nan((char *)c->kc + i * es, cdt);
    for (int64_t i = 0; i < n_keys * s->hk * dv; i++) t_store_nan((char *)c->vc + i * es, cdt);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < c->seqlens[b]; t++)
            for (int64_t h = 0; h < s->hk; h++) {
                const int64_t o = t_kv_key_off(c, b, h, t), ov = t_kv_val_off(c, b, h, t);
                for (int64_t x = 0; x < (s->d > dv ? s->d : dv); x++) { /* k, v interleaved, as with one d */
                    if (x < s->d) t_store(c->kc, cdt, o + x, t_rng_randn(r) / ds_of(c, 0, b, h));
                    if (x < dv) t_store(c->vc, cdt, ov + x, t_rng_randn(r) / ds_of(c, 1, b, h));
                }
            }
    c->q = t_buf_new_r(r, s->dt, B, s->sq, s->hq, s->d, T_BSHD);
    c->out = t_buf_new_r(r, s->dt, B, s->sq, s->hq, dv, T_BSHD);
    t_buf_randn_r(r, &c->q, 1);
    if (s->append) {
        c->kn = t_buf_new_r(r, s->dt, B, s->sq, s->hk, s->d, T_BSHD);
        c->vn = t_buf_new_r(r, s->dt, B, s->sq, s->hk, dv, T_BSHD);
        t_buf_randn_r(r, &c->kn, 1);
        t_buf_randn_r(r, &c->vn, 1);
    }
    if (s->rotary) {
        const int rd = s->rot_dim ? s->rot_dim : s->d;
        c->s.rot_dim = rd;
        c->rot_len = cap + 8;
        c->cos = malloc(sizeof(float) * (size_t)(c->rot_len * rd / 2));
        c->sin = malloc(sizeof(float) * (size_t)(c->rot_len * rd / 2));
        for (int64_t p = 0; p < c->rot_len; p++)
            for (int j = 0; j < rd / 2; j++) {
                const double th = (double)p * pow(10000.0, -2.0 * j / rd);
                c->cos[p * (rd / 2) + j] = (float)cos(th);
                c->sin[p * (rd / 2) + j] = (float)sin(th);
            }
    }
    c->lse = malloc(sizeof(float) * (size_t)(B * s->hq * s->sq));
    for (int64_t i = 0; i < B * s->hq * s->sq; i++) c->lse[i] = t_nanf();
    return c;
}

void t_kv_free(t_kv_case *c) {
    if (!c) return;
    free(c->seqlens), free(c->block_table), free(c->batch_idx), free(c->kc), free(c->vc);
    t_buf_free(&c->q), t_buf_free(&c->out);
    if (c->s.append) t_buf_free(&c->kn), t_buf_free(&c->vn);
    free(c->cos), free(c->sin), free(c->lse), free(c->k_descale), free(c->v_descale);
    free(c);
}

fa_kvcache t_kv_cache(const t_kv_case *c, void *k, void *v, const int32_t *seqlens, const int32_t *block_table,
                      const int32_t *batch_idx) {
    fa_kvcache kc;
    memset(&kc, 0, sizeof kc);
    kc.k = c->kct, kc.v = c->vct;
    kc.k.data = k, kc.v.data = v;
    kc.seqlens = seqlens;
    kc.block_table = c->s.page_size ? block_table : NULL;
    kc.max_pages = c->s.page_size ? c->max_pages : 0;
    kc.batch_idx = c->batch_idx ? batch_idx : NULL;
    kc.cache_rows = c->s.page_size ? c->rows : 0;
    return kc;
}

fa_kv_opts t_kv_opts(const t_kv_case *c, const float *cos, const float *sin) {
    fa_kv_opts o = c->s.kv;
    if (c->s.rotary) {
        o.rotary_cos = cos, o.rotary_sin = sin;
        o.rotary_seqlen = c->rot_len;
        o.rotary_dim = c->s.rot_dim;
        o.rotary_interleaved = c->s.rotary == 2;
    }
    if (c->s.fp8) o.k_descale = c->k_descale, o.v_descale = c->v_descale;
    return o;
}

/* x[0..rd) of one row rotated at position pos, in double */
static void rotate(const t_kv_case *c, double *x, int64_t pos) {
    const int half = c->s.rot_dim / 2;
    for (int j = 0; j < half; j++) {
        const int i0 = c->s.rotary == 2 ? 2 * j : j, i1 = c->s.rotary == 2 ? 2 * j + 1 : j + half;
        const double cs = c->cos[pos * half + j], sn = c->sin[pos * half + j], x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * cs - x1 * sn;
        x[i1] = x0 * sn + x1 * cs;
    }
}

/* flash-attn's rotary position of query row i: its own (len + i) in a causal or local call, where a window of the
 * cache's capacity or more is none, as in mha_fwd_kvcache; else every row at len. */
static int64_t q_pos(const t_kv_case *c, int64_t len, int64_t i) {
    const fa_attn_opts *o = &c->s.opts;
    const int64_t cap = c->s.page_size ? c->max_pages * c->s.page_size : c->s.capacity; /* the cache's, as the call sees it */
    const int local = (o->window_left >= 0 && o->window_left < cap) || (o->window_right >= 0 && o->window_right < cap) ||
                      (o->attention_chunk > 0 && o->attention_chunk < cap);
    return o->causal || local ? len + i : len;
}

/* The cache after the call, compared with the one before: the appended rows hold k_new (rotated: within one unit
 * of the dtype's last place of the float64 rotation) and v_new; every other byte is unchanged. */
static int check_cache(const t_kv_case *c, const void *k_after, const void *v_after) {
    const t_kv_spec *s = &c->s;
    const fa_dtype cdt = t_kv_cache_dtype(c);
    const int64_t es = es_of(cdt), d = s->d;
    int fails = 0;
    unsigned char *expect_k = malloc(c->cache_bytes), *expect_v = malloc(c->v_bytes), *fuzzy = calloc(c->cache_bytes, 1);
    memcpy(expect_k, c->kc, c->cache_bytes);
    memcpy(expect_v, c->vc, c->v_bytes);
    double x[T_KV_MAX_D], worst = 0;
    if (s->append)
        for (int64_t b = 0; b < s->batch; b++)
            for (int64_t i = 0; i < s->sq; i++)
                for (int64_t h = 0; h < s->hk; h++) {
                    const int64_t t = c->seqlens[b] + i, o = t_kv_key_off(c, b, h, t);
                    const double kds = ds_of(c, 0, b, h), vds = ds_of(c, 1, b, h);
                    for (int64_t e = 0; e < d; e++) x[e] = t_get(&c->kn.t, b, i, h, e);
                    if (s->rotary) {
                        rotate(c, x, t);
                        /* an FP8 cache: one unit of E4M3's spacing at x (3 mantissa bits; subnormals 2^-9) */
                        const double rel = s->fp8 ? 0x1p-3 : s->dt == FA_DTYPE_F32 ? 0x1p-23 : s->dt == FA_DTYPE_F16 ? 0x1p-10 : 0x1p-7;
                        for (int64_t e = 0; e < d; e++) {
                            const double got = t_load(k_after, cdt, o + e) * kds;
                            const double ulp = fabs(x[e]) * rel + (s->fp8 ? kds * 0x1p-9 : 0);
                            const double err = fabs(got - x[e]) / (ulp + 1e-30);
                            if (!(err <= 1.0 + 1e-9) && fabs(got - x[e]) > 1e-6) worst = fmax(worst, isnan(err) ? INFINITY : err);
                            memset(fuzzy + (o + e) * es, 1, (size_t)es);
                        }
                    } else {
                        for (int64_t e = 0; e < d; e++) t_store(expect_k, cdt, o + e, x[e] / kds);
                    }
                    const int64_t ov = t_kv_val_off(c, b, h, t);
                    for (int64_t e = 0; e < s->dv; e++) t_store(expect_v, cdt, ov + e, t_get(&c->vn.t, b, i, h, e) / vds);
                }
    CHECK_MSG(worst == 0, "%s: appended rotated k off the float64 rotary by %.3g units in the last place", t_case_label,
              worst);
    fails += worst != 0;
    size_t bad_k = 0, bad_v = 0;
    for (size_t i = 0; i < c->cache_bytes; i++)
        if (!fuzzy[i] && ((const unsigned char *)k_after)[i] != expect_k[i]) bad_k++;
    for (size_t i = 0; i < c->v_bytes; i++)
        if (((const unsigned char *)v_after)[i] != expect_v[i]) bad_v++;
    CHECK_MSG(bad_k == 0 && bad_v == 0, "%s: cache bytes differ from the expected (k %zu, v %zu of %zu)", t_case_label,
              bad_k, bad_v, c->cache_bytes);
    fails += bad_k || bad_v;
    free(expect_k), free(expect_v), free(fuzzy);
    return fails;
}

int t_kv_verify(const t_kv_case *c, const t_buf *out, const float *lse, const void *k_after, const void *v_after,
                fa_context *std_ctx, double relax) {
    const t_kv_spec *s = &c->s;
    const int64_t B = s->batch, S = s->sq, Hq = s->hq, Hk = s->hk, D = s->d, DV = s->dv;
    int fails = check_cache(c, k_after, v_after);
    const int64_t unwritten = t_buf_check_written(out);
    CHECK_MSG(unwritten == 0, "%s: %lld out elements not written (or padding touched)", t_case_label, (long long)unwritten);
    fails += unwritten != 0;
    double err = 0, err_std = 0, refmax = 0, lerr = 0, lerr_std = 0, lscale = 1;
    /* an FP8 cache: no same-dtype baseline (fa_forward's FP8 takes FP8 queries too), the ceiling alone */
    int have_std = std_ctx && !s->rotary && !s->fp8 && D <= 256 && DV <= 256; /* fa_forward's head dims */
    const fa_dtype cdt = t_kv_cache_dtype(c), kdt = s->fp8 ? cdt : FA_DTYPE_F32;
    for (int64_t b = 0; b < B; b++) {
        const int64_t L = len_after(c, b);
        double *ref = malloc(sizeof(double) * (size_t)(S * Hq * DV)), *rl = malloc(sizeof(double) * (size_t)(Hq * S));
        if (L == 0) {
            for (int64_t i = 0; i < S * Hq * DV; i++) ref[i] = 0;
            for (int64_t i = 0; i < Hq * S; i++) rl[i] = s->opts.sinks ? s->opts.sinks[i / S] : -INFINITY;
        } else {
            /* the keys gathered as they are (E4M3 for an FP8 cache: the oracle decodes them with the descales) */
            t_buf q32 = t_buf_new(FA_DTYPE_F32, 1, S, Hq, D, T_BSHD), k32 = t_buf_new(kdt, 1, L, Hk, D, T_BSHD);
            t_buf v32 = t_buf_new(kdt, 1, L, Hk, DV, T_BSHD);
            double x[T_KV_MAX_D];
            for (int64_t i = 0; i < S; i++)
                for (int64_t h = 0; h < Hq; h++) {
                    for (int64_t e = 0; e < D; e++) x[e] = t_get(&c->q.t, b, i, h, e);
                    if (s->rotary) rotate(c, x, q_pos(c, c->seqlens[b], i));
                    for (int64_t e = 0; e < D; e++) t_set(&q32.t, 0, i, h, e, x[e]);
                }
            for (int64_t t = 0; t < L; t++)
                for (int64_t h = 0; h < Hk; h++) {
                    const int64_t o = t_kv_key_off(c, b, h, t), ov = t_kv_val_off(c, b, h, t);
                    for (int64_t e = 0; e < D; e++) t_set(&k32.t, 0, t, h, e, t_load(k_after, cdt, o + e));
                    for (int64_t e = 0; e < DV; e++) t_set(&v32.t, 0, t, h, e, t_load(v_after, cdt, ov + e));
                }
            fa_attn_opts oo = s->opts;
            if (s->fp8) oo.k_descale = c->k_descale + b * Hk, oo.v_descale = c->v_descale + b * Hk;
            CHECK_STATUS(t_oracle_forward(&oo, &q32.t, &k32.t, &v32.t, ref, rl), FA_OK);
            if (have_std) { /* STANDARD in the case's dtype on the same keys: the baseline of the pass rule */
                t_buf qd = t_buf_new(s->dt, 1, S, Hq, D, T_BSHD), kd = t_buf_new(s->dt, 1, L, Hk, D, T_BSHD);
                t_buf vd = t_buf_new(s->dt, 1, L, Hk, DV, T_BSHD), od = t_buf_new(s->dt, 1, S, Hq, DV, T_BSHD);
                for (int64_t i = 0; i < S; i++)
                    for (int64_t h = 0; h < Hq; h++)
                        for (int64_t e = 0; e < D; e++) t_set(&qd.t, 0, i, h, e, t_get(&q32.t, 0, i, h, e));
                for (int64_t t = 0; t < L; t++)
                    for (int64_t h = 0; h < Hk; h++) {
                        for (int64_t e = 0; e < D; e++) t_set(&kd.t, 0, t, h, e, t_get(&k32.t, 0, t, h, e));
                        for (int64_t e = 0; e < DV; e++) t_set(&vd.t, 0, t, h, e, t_get(&v32.t, 0, t, h, e));
                    }
                fa_attn_opts so = s->opts;
                so.algo = FA_ALGO_STANDARD;
                float *sl = malloc(sizeof(float) * (size_t)(Hq * S));
                CHECK_STATUS(fa_forward(std_ctx, &so, &qd.t, &kd.t, &vd.t, &od.t, sl), FA_OK);
                err_std = fmax(err_std, t_max_diff(&od.t, ref));
                lerr_std = fmax(lerr_std, t_max_diff_f(sl, rl, Hq * S));
                free(sl);
                t_buf_free(&qd), t_buf_free(&kd), t_buf_free(&vd), t_buf_free(&od);
            }
            t_buf_free(&q32), t_buf_free(&k32), t_buf_free(&v32);
        }
        refmax = fmax(refmax, t_max_abs(ref, S * Hq * DV));
        lscale = fmax(lscale, t_lse_scale(rl, Hq * S));
        for (int64_t i = 0; i < S; i++)
            for (int64_t h = 0; h < Hq; h++) {
                for (int64_t e = 0; e < DV; e++) {
                    const double got = t_get(&out->t, b, i, h, e), want = ref[(i * Hq + h) * DV + e];
                    const double dd = fabs(got - want);
                    err = isnan(dd) ? INFINITY : fmax(err, dd);
                }
                if (lse) {
                    const double got = lse[(b * Hq + h) * S + i], want = rl[h * S + i];
                    if (isinf(want) && want < 0) {
                        if (!(isinf(got) && got < 0)) lerr = INFINITY;
                    } else {
                        const double dd = fabs(got - want);
                        lerr = isnan(dd) ? INFINITY : fmax(lerr, dd);
                    }
                }
            }
        free(ref), free(rl);
    }
    const t_verdict v = t_judge(s->dt, !have_std, 0, err, err_std, refmax, relax);
    CHECK_MSG(v.ok, "%s: out max err %.3e, allowed %.3e (max|ref| %.3e, standard's err %.3e)", t_case_label, err,
              v.allowed, refmax, err_std);
    fails += !v.ok;
    if (lse) {
        const t_verdict lv = t_judge_lse(!have_std, lerr, lerr_std, lscale);
        CHECK_MSG(lv.ok, "%s: lse max err %.3e, allowed %.3e", t_case_label, lerr, lv.allowed);
        fails += !lv.ok;
    }
    return fails;
}

int t_kv_run_cpu(fa_context *ctx, const t_kv_case *c) {
    void *k = malloc(c->cache_bytes), *v = malloc(c->v_bytes);
    memcpy(k, c->kc, c->cache_bytes);
    memcpy(v, c->vc, c->v_bytes);
    t_buf_poison((t_buf *)&c->out);
    for (int64_t i = 0; i < c->s.batch * c->s.hq * c->s.sq; i++) c->lse[i] = t_nanf();
    fa_kvcache kc = t_kv_cache(c, k, v, c->seqlens, c->block_table, c->batch_idx);
    fa_kv_opts ko = t_kv_opts(c, c->cos, c->sin);
    fa_status st = fa_forward_kvcache(ctx, &c->s.opts, &ko, &c->q.t, &kc, c->s.append ? &c->kn.t : NULL,
                                      c->s.append ? &c->vn.t : NULL, &c->out.t, c->lse);
    int fails = 0;
    CHECK_MSG(st == FA_OK, "%s: fa_forward_kvcache: %s: %s", t_case_label, fa_status_string(st), fa_context_last_error(ctx));
    if (st == FA_OK) {
        fa_stats stats;
        CHECK_STATUS(fa_last_stats(ctx, &stats), FA_OK);
        t_check_cpu_level(stats.kernel);
        fails += t_kv_verify(c, &c->out, c->lse, k, v, ctx, 0);
    } else {
        fails++;
    }
    free(k), free(v);
    return fails;
}
