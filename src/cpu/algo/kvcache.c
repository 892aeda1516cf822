/* KV-cache decoding on the CPU (FlashDecoding over a contiguous or paged cache): the plan (split count, workspace,
 * modelled traffic), the run — append the new K/V rows in place (rotary applied), then one work item per
 * (sequence, K/V head, split) computing all the query rows that read that K/V head, then the LSE merge of the
 * splits — and fa_merge_states. docs/kvcache.md. */
#include "cpu/cpu.h"
#include "cpu/simd/kvcache.h"

#include "core/half.h"
#include "core/kvcache.h"
#include "core/sink.h"

#include <string.h>

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453
#define MIN_SPLIT_KEYS 256 /* a split below this many keys costs more in merging than it gains (2 threads) */
#define MAX_SPLITS 64

/* Keys per split and the number of non-empty splits of a sequence with L keys. */
static void split_of(const fa_plan *pl, int64_t L, int64_t *chunk, int *ns) {
    const int nsplit = pl->aux[FA_KV_AUX_SPLITS];
    if (pl->aux[FA_KV_AUX_FIXED]) {
        *chunk = pl->aux[FA_KV_AUX_CHUNK];
    } else {
        int64_t c = (L + nsplit - 1) / nsplit;
        *chunk = c < 16 ? 16 : (c + 15) / 16 * 16;
    }
    int64_t n = (L + *chunk - 1) / *chunk;
    *ns = n < 1 ? 1 : (int)n;
}

typedef struct thread_parts {
    float *qs, *qbad, *S, *Lv, *O, *m, *l;
    uint16_t *qb; /* bf16 rows: q as bf16 in order, one or two parts (simd/kvcache.h) */
    int64_t *lo, *hi;
} thread_parts;

/* Shared: the splits' partial states, [batch, hq, sq, nsplit] x (dv | 1) (NULL without splits). */
typedef struct split_parts {
    float *part_o, *part_lse;
} split_parts;

/* Rows per K/V head of the longest query sequence (the scratch's; a sequence of S_b rows uses G·S_b of them). */
static int rows_of(const fa_kv_problem *p) { return (int)(p->hq / p->hk * p->sq); }
/* fa_plan.aux[AUX_HPI]: K/V heads per work item (all of them when a key's heads are adjacent in memory) */
#define AUX_HPI 3
/* heads per item at most: MHA's 32 heads in one item, so that each thread reads its own contiguous split of whole key
 * rows, which the kernel walks 16 keys at a time (FA_KV_SPAN: with 32-key chunks two of them filled a Zen 4's L2);
 * docs/kvcache.md */
#define MAX_HPI 32
static int padded(int64_t d) { return (int)((d + FA_KV_LANES - 1) / FA_KV_LANES * FA_KV_LANES); }

static void thread_layout(fa_arena *a, const void *problem, const fa_plan *pl, void *parts) {
    const fa_kv_problem *p = problem;
    thread_parts *t = parts;
    const size_t R = (size_t)rows_of(p) * (size_t)pl->aux[AUX_HPI], dp = (size_t)padded(p->d), f = sizeof(float);
    t->qs = fa_arena_take(a, R * dp * f, 64);
    t->qb = p->cdtype == FA_DTYPE_BF16 ? fa_arena_take(a, R * 2 * dp * sizeof(uint16_t), 64) : NULL;
    t->O = fa_arena_take(a, R * (size_t)padded(p->d_v) * f, 64);
    t->S = fa_arena_take(a, R * FA_KV_BC * f, 64);
    t->Lv = fa_arena_take(a, R * 16 * f, 64);
    t->qbad = fa_arena_take(a, R * f, 64);
    t->m = fa_arena_take(a, R * f, 64);
    t->l = fa_arena_take(a, R * f, 64);
    t->lo = fa_arena_take(a, R * sizeof(int64_t), 64);
    t->hi = fa_arena_take(a, R * sizeof(int64_t), 64);
}

static void shared_layout(fa_arena *a, const void *problem, const fa_plan *pl, void *parts) {
    const fa_kv_problem *p = problem;
    split_parts *w = parts;
    const int ns = pl->aux[FA_KV_AUX_SPLITS];
    w->part_o = w->part_lse = NULL;
    if (ns > 1) {
        const size_t rows = (size_t)(p->batch * p->hq * p->sq) * (size_t)ns;
        w->part_o = fa_arena_take(a, rows * (size_t)p->d_v * sizeof(float), 64);
        w->part_lse = fa_arena_take(a, rows * sizeof(float), 64);
    }
}

static const fa_cpu_layout kv_layout = FA_CPU_LAYOUT(thread_layout, thread_parts, shared_layout, split_parts);

fa_status fa_cpu_kv_plan(const fa_context *ctx, const fa_kv_problem *p, fa_plan *plan, char *why, size_t why_len) {
    (void)why, (void)why_len;
    const fa_cpu_kernels *kr = ctx->kernels;
    plan->kernel = kr->kvcache->name; /* the level the kernel was built for (amx runs avx512bf16's) */
    plan->threads = ctx->threads;
    plan->block_q = rows_of(p);  /* rows per K/V head */
    plan->block_k = FA_KV_BC;
    /* a key's K/V heads adjacent in memory (stride_head < stride_seq, the [.., seq, heads, d] layouts): one item
     * reads them all, so the cache streams in order; else one head per item */
    int hpi = 1;
    if (p->kc.stride_head < p->kc.stride_seq && p->vc.stride_head < p->vc.stride_seq)
        for (int n = MAX_HPI; n > 1; n--)
            if (p->hk % n == 0) {
                hpi = n;
                break;
            }
    plan->aux[AUX_HPI] = hpi;
    int ns;
    if (p->split_size) {
        plan->aux[FA_KV_AUX_FIXED] = 1;
        plan->aux[FA_KV_AUX_CHUNK] = p->split_size;
        const int64_t n = (p->capacity + p->split_size - 1) / p->split_size;
        ns = n < 1 ? 1 : (int)n;
    } else if (p->num_splits) {
        const int64_t most = (p->capacity + 15) / 16;
        ns = p->num_splits < most ? p->num_splits : (int)most;
    } else {
        ns = fa_kv_split_heuristic(p->batch * (p->hk / hpi), ctx->threads, (p->capacity + MIN_SPLIT_KEYS - 1) / MIN_SPLIT_KEYS,
                                   MAX_SPLITS, 0.85);
    }
    plan->aux[FA_KV_AUX_SPLITS] = ns < 1 ? 1 : ns;
    plan->workspace_bytes = fa_cpu_frame_bytes(&kv_layout, p, plan);
    /* modelled at full capacity; the run counts the keys each sequence has */
    const double e = (double)fa_dtype_size(p->dtype), kb = (double)p->d * e, vb = (double)p->d_v * e;
    const double ce = (double)fa_dtype_size(p->cdtype); /* an FP8 cache reads 1 byte an element */
    plan->read_bytes = (double)p->batch * ((double)p->capacity * p->hk * (p->d + p->d_v) * ce + p->sq * p->hq * kb);
    plan->write_bytes = (double)p->batch * p->sq * p->hq * vb;
    return FA_OK;
}

/* Byte address of key t's row of K/V head h for sequence row `row` (cache row or block-table row). */
static char *key_addr(const fa_kv_problem *p, const fa_tensor *c, int64_t row, int64_t h, int64_t t) {
    const int64_t es = (int64_t)fa_dtype_size(p->cdtype);
    int64_t el;
    if (p->paged) {
        const int64_t pg = p->block_table[row * p->bt_stride + t / p->page_size];
        el = pg * c->stride_batch + (t % p->page_size) * c->stride_seq;
    } else {
        el = row * c->stride_batch + t * c->stride_seq;
    }
    return (char *)c->data + (el + h * c->stride_head) * es;
}

/* x[0..rot_dim) rotated by the angles of position pos. */
static void rotate(const fa_kv_problem *p, float *x, int64_t pos) {
    const int half = p->rot_dim / 2;
    const float *c = p->rot_cos + pos * half, *s = p->rot_sin + pos * half;
    for (int j = 0; j < half; j++) {
        const int i0 = p->rot_interleaved ? 2 * j : j, i1 = p->rot_interleaved ? 2 * j + 1 : j + half;
        const float x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * c[j] - x1 * s[j];
        x[i1] = x0 * s[j] + x1 * c[j];
    }
}

/* n elements of a new row (x, rotated or as loaded) into an FP8 cache row: x / descale, rounded as fa_quantize_fp8. */
static void quantise_row(uint8_t *dst, const float *x, int64_t n, float descale) {
    for (int64_t c = 0; c < n; c++) dst[c] = fa_f64_to_e4m3((double)x[c] / (double)descale);
}

static void append(const fa_kv_problem *p, int threads) {
    const int64_t n = p->batch * p->sn, d = p->d;
    const int fp8 = p->cdtype == FA_DTYPE_F8_E4M3;
    const size_t vrowb = (size_t)p->d_v * fa_dtype_size(p->dtype), rowb = (size_t)d * fa_dtype_size(p->dtype);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t bi = 0; bi < n; bi++) {
        const int64_t b = bi / p->sn, i = bi % p->sn, row = fa_kv_row(p, b), t = p->seqlens[b] + i;
        if (i >= fa_kv_sn(p, b)) continue; /* a packed sequence with fewer new rows than the longest */
        float x[FA_KV_MAX_D];
        for (int64_t h = 0; h < p->hk; h++) {
            const int64_t kin = fa_kv_nrow0(p, &p->kn, b, h) + i * p->kn.stride_seq;
            const int64_t vin = fa_kv_nrow0(p, &p->vn, b, h) + i * p->vn.stride_seq;
            char *kd = key_addr(p, &p->kc, row, h, t), *vd = key_addr(p, &p->vc, row, h, t);
            if (fp8) { /* rotated (in fp32, as a 16-bit cache's rows) before quantising */
                for (int64_t c = 0; c < d; c++) x[c] = fa_load_elem(p->kn.data, (int)p->dtype, kin + c);
                if (p->rot_cos) rotate(p, x, t);
                quantise_row((uint8_t *)kd, x, d, fa_kv_descale(p, p->k_descale, b, h));
                for (int64_t c = 0; c < p->d_v; c++) x[c] = fa_load_elem(p->vn.data, (int)p->dtype, vin + c);
                quantise_row((uint8_t *)vd, x, p->d_v, fa_kv_descale(p, p->v_descale, b, h));
                continue;
            }
            if (p->rot_cos) {
                for (int64_t c = 0; c < d; c++) x[c] = fa_load_elem(p->kn.data, (int)p->dtype, kin + c);
                rotate(p, x, t);
                for (int64_t c = 0; c < d; c++) fa_store_elem(kd, (int)p->dtype, c, x[c]);
            } else {
                memcpy(kd, (const char *)p->kn.data + kin * (int64_t)fa_dtype_size(p->dtype), rowb);
            }
            memcpy(vd, (const char *)p->vn.data + vin * (int64_t)fa_dtype_size(p->dtype), vrowb);
        }
    }
}

/* The numerics contract (docs/numerics.md): the fp32 state of a row stands where it is finite with |m| below
 * LOGIT_MAX; otherwise (a NaN/inf input, q·k or scale/softcap beyond the fp32 range) the row is recomputed in float64
 * from the definition with logits saturated at ±LOGIT_SAT. A check of the state, not of the inputs: decoding is
 * bound by reading the cache, and a second pass over it to bound max |k|, |v| would double that. */
#define LOGIT_SAT 0x1p126 /* |logit| saturates here */
#define LOGIT_MAX 0x1p16  /* fp32 exp2(S − m) loses no more than 2^-8 of a weight up to here (log2 units) */

/* Does row r's fp32 state stand? A row that sees no key stands as O = 0, LSE = −inf. */
static int row_stands(const thread_parts *t, int64_t r, int dp, int64_t d) { /* O's row: d = dv, padded to dp */
    if (t->hi[r] <= t->lo[r]) return 1;
    const float m = t->m[r], l = t->l[r];
    if (t->qbad[r] != 0 || !(fabsf(m) <= LOGIT_MAX) || !(l > 0 && l < INFINITY)) return 0;
    const float *o = t->O + r * dp;
    float z = 0;
    for (int64_t c = 0; c < d; c++) z += o[c] * 0.0f; /* NaN iff some o[c] is NaN or inf */
    return z == 0;
}

/* Query row i of head hq over keys [lo, hi) from the definition, in float64: o (dv) and the natural-log LSE. A row
 * whose q or a visible key has a NaN/inf is NaN; a row that sees no key is O = 0, LSE = −∞. */
static double exact_row(const fa_kv_problem *p, int64_t b, int64_t i, int64_t hq, int64_t lo, int64_t hi, double *o) {
    const int64_t d = p->d, dv = p->d_v, hk = hq / (p->hq / p->hk), row = fa_kv_row(p, b);
    const int64_t qo = fa_kv_qrow0(p, &p->q, b, hq) + i * p->q.stride_seq;
    double q[FA_KV_MAX_D];
    for (int64_t c = 0; c < dv; c++) o[c] = 0;
    if (hi <= lo) return -INFINITY;
    int nan_row = 0;
    for (int64_t c = 0; c < d; c++) q[c] = fa_load_elem(p->q.data, (int)p->dtype, qo + c), nan_row |= !isfinite(q[c]);
    for (int64_t t = lo; t < hi && !nan_row; t++) {
        const char *kr = key_addr(p, &p->kc, row, hk, t);
        for (int64_t c = 0; c < d; c++) nan_row |= !isfinite((double)fa_load_elem(kr, (int)p->cdtype, c));
    }
    const double kds = fa_kv_descale(p, p->k_descale, b, hk), vds = fa_kv_descale(p, p->v_descale, b, hk);
    if (nan_row) {
        for (int64_t c = 0; c < dv; c++) o[c] = NAN;
        return NAN;
    }
    if (p->rot_cos) {
        const int half = p->rot_dim / 2;
        const int64_t pos = fa_kv_rotary_q_pos(p, p->seqlens[b], i);
        const float *cs = p->rot_cos + pos * half, *sn = p->rot_sin + pos * half;
        for (int j = 0; j < half; j++) {
            const int i0 = p->rot_interleaved ? 2 * j : j, i1 = p->rot_interleaved ? 2 * j + 1 : j + half;
            const double x0 = q[i0], x1 = q[i1];
            q[i0] = x0 * cs[j] - x1 * sn[j];
            q[i1] = x0 * sn[j] + x1 * cs[j];
        }
    }
    /* online softmax in float64: m, l, O rescaled when the max grows */
    double m = -INFINITY, l = 0;
    for (int64_t t = lo; t < hi; t++) {
        const char *kr = key_addr(p, &p->kc, row, hk, t), *vr = key_addr(p, &p->vc, row, hk, t);
        double s = 0;
        for (int64_t c = 0; c < d; c++) s += q[c] * (fa_load_elem(kr, (int)p->cdtype, c) * kds);
        s *= (double)p->scale;
        if (p->softcap > 0) s = (double)p->softcap * tanh(s / (double)p->softcap);
        s = s > LOGIT_SAT ? LOGIT_SAT : s < -LOGIT_SAT ? -LOGIT_SAT : s;
        if (s > m) {
            const double f = exp(m - s);
            l *= f;
            for (int64_t c = 0; c < dv; c++) o[c] *= f;
            m = s;
        }
        const double pj = exp(s - m);
        l += pj;
        for (int64_t c = 0; c < dv; c++) o[c] += pj * (fa_load_elem(vr, (int)p->cdtype, c) * vds);
    }
    for (int64_t c = 0; c < dv; c++) o[c] /= l;
    return m + log(l);
}

/* One (sequence b, K/V heads [h0, h0 + nh), split s): head h's R rows (query row i, group member g) are rows
 * (h − h0)·R + i·G + g of the thread's state. */
static void item(const fa_kv_problem *p, const fa_plan *pl, const fa_kv_kernel *kern, const thread_parts *t,
                 const split_parts *w, int64_t b, int64_t h0, int nh, int s, fa_io *io) {
    const int64_t G = p->hq / p->hk, L = p->seqlens[b] + fa_kv_sn(p, b), d = p->d, dv = p->d_v, S = fa_kv_sq(p, b);
    const int dp = padded(d), dvp = padded(dv), R = (int)(G * S); /* this sequence's rows per K/V head */
    int64_t chunk;
    int ns;
    split_of(pl, L, &chunk, &ns);
    if (s >= ns || S == 0) return;
    const int64_t s0 = s * chunk, s1 = s0 + chunk < L ? s0 + chunk : L;
    const float qmul = p->softcap > 0 ? p->scale / p->softcap : p->scale * LOG2E;
    const float f8 = p->cdtype == FA_DTYPE_F8_E4M3 ? FA_KV_F8_SCALE : 1; /* the kernel reads E4M3 as value · 2^-8 */
    int64_t k0 = s1, k1 = s0;
    for (int64_t i = 0; i < S; i++) {
        int64_t lo, hi;
        fa_kv_visible(p, b, i, L, &lo, &hi);
        lo = lo > s0 ? lo : s0;
        hi = hi < s1 ? hi : s1;
        if (hi < lo) hi = lo;
        if (hi > lo && lo < k0) k0 = lo;
        if (hi > lo && hi > k1) k1 = hi;
        for (int hh = 0; hh < nh; hh++)
            for (int64_t g = 0; g < G; g++) {
                const int64_t r = hh * R + i * G + g, hq = (h0 + hh) * G + g;
                /* an FP8 cache's k descale folded into q: q·(k·kds) = (q·kds)·k, with the kernel's 2^-8 */
                const float qmk = qmul * fa_kv_descale(p, p->k_descale, b, h0 + hh) * f8;
                t->lo[r] = lo;
                t->hi[r] = hi;
                float *q = t->qs + r * dp, x[FA_KV_MAX_D];
                const int64_t qo = fa_kv_qrow0(p, &p->q, b, hq) + i * p->q.stride_seq;
                float bad = 0;
                for (int64_t c = 0; c < d; c++) {
                    x[c] = fa_load_elem(p->q.data, (int)p->dtype, qo + c);
                    bad += x[c] * 0.0f;
                }
                if (p->rot_cos) rotate(p, x, fa_kv_rotary_q_pos(p, p->seqlens[b], i));
                for (int64_t c = 0; c < d; c++) q[fa_kv_lane(kern, p->cdtype, d, dv, c)] = x[c] * qmk;
                for (int64_t c = d; c < dp; c++) q[c] = 0;
                if (t->qb) { /* the raw bf16 q (exact; qmul applied to the sums), or with rotary qmul·q as hi + lo */
                    uint16_t *qb = t->qb + r * 2 * dp;
                    for (int64_t c = 0; c < dp; c++) {
                        const float y = c < d ? (p->rot_cos ? x[c] * qmul : x[c]) : 0.f;
                        qb[c] = p->rot_cos ? fa_f32_to_bf16(y) : (uint16_t)(fa_f32_to_bits(y) >> 16);
                        qb[dp + c] = p->rot_cos ? fa_f32_to_bf16(y - fa_bf16_to_f32(qb[c])) : 0;
                    }
                }
                t->qbad[r] = bad;
                t->m[r] = -INFINITY;
                t->l[r] = 0;
                memset(t->O + r * dvp, 0, (size_t)dvp * sizeof(float));
            }
    }
    if (k1 > k0) {
        const int64_t es = (int64_t)fa_dtype_size(p->cdtype), row = fa_kv_row(p, b);
        fa_kv_args a = {.R = R, .nh = nh, .d = (int)d, .dp = dp, .dv = (int)dv, .dvp = dvp, .dtype = p->cdtype,
                         .qs = t->qs, .qb = t->qb,
                         .qb_parts = p->rot_cos ? 2 : 1, .qb_mul = p->rot_cos ? 1.f : qmul, .qbad = t->qbad,
                         .lo = t->lo, .hi = t->hi, .k0 = k0, .k1 = k1,
                         .softcap_mul = p->softcap > 0 ? p->softcap * LOG2E : 0, .S = t->S, .Lv = t->Lv,
                         .O = t->O, .m = t->m, .l = t->l};
        if (p->paged) {
            a.kbase = (const char *)p->kc.data + h0 * p->kc.stride_head * es;
            a.vbase = (const char *)p->vc.data + h0 * p->vc.stride_head * es;
            a.k_sp = p->kc.stride_batch * es, a.v_sp = p->vc.stride_batch * es;
            a.bt = p->block_table + row * p->bt_stride;
            a.page_size = p->page_size;
        } else {
            a.kbase = (const char *)p->kc.data + (row * p->kc.stride_batch + h0 * p->kc.stride_head) * es;
            a.vbase = (const char *)p->vc.data + (row * p->vc.stride_batch + h0 * p->vc.stride_head) * es;
            a.page_size = 1;
        }
        a.k_ss = p->kc.stride_seq * es, a.v_ss = p->vc.stride_seq * es;
        a.k_sh = p->kc.stride_head * es, a.v_sh = p->vc.stride_head * es;
        kern->attend(&a);
        io->read += (k1 - k0) * (d + dv) * es * nh;
    }
    /* finish: O / l and LSE = (m + log2 l)·ln 2, into out (one split) or the split's partial; the sink joins a row
     * once: here without splits, else after their merge (merge_splits) */
    for (int hh = 0; hh < nh; hh++)
        for (int64_t i = 0; i < S; i++)
            for (int64_t g = 0; g < G; g++) {
                const int64_t r = hh * R + i * G + g, hq = (h0 + hh) * G + g;
                const float l = t->l[r], *sink = p->sinks && ns == 1 ? p->sinks + hq : NULL;
                float inv = l == 0 ? 0 : 1 / l;
                float lse = l == 0 ? -INFINITY : (float)((t->m[r] + log2f(l)) * LN2), o[FA_KV_MAX_D];
                const float *so = t->O + r * dvp;
                if (row_stands(t, r, dvp, dv)) {
                    if (sink) inv = fa_sink_join(l == 0 ? -INFINITY : t->m[r] * LN2, l, *sink, &lse);
                    inv *= fa_kv_descale(p, p->v_descale, b, h0 + hh) * f8; /* an FP8 cache's v descale: P (v·vds) */
                    for (int64_t c = 0; c < dv; c++) o[c] = so[fa_kv_lane(kern, p->cdtype, d, dv, c)] * inv;
                } else {
                    double x[FA_KV_MAX_D];
                    lse = (float)exact_row(p, b, i, hq, t->lo[r], t->hi[r], x);
                    const float f = sink ? fa_sink_join_lse(lse, *sink, &lse) : 1.0f;
                    for (int64_t c = 0; c < dv; c++) o[c] = (float)x[c] * f;
                }
                if (ns == 1) {
                    const int64_t oo = fa_kv_qrow0(p, &p->o, b, hq) + i * p->o.stride_seq;
                    for (int64_t c = 0; c < dv; c++) fa_store_elem(p->o.data, (int)p->dtype, oo + c, o[c]);
                    if (p->lse) p->lse[fa_kv_lse0(p, b, hq) + i] = lse;
                } else {
                    const int64_t pr = ((b * p->hq + hq) * p->sq + i) * pl->aux[FA_KV_AUX_SPLITS] + s;
                    for (int64_t c = 0; c < dv; c++) w->part_o[pr * dv + c] = o[c];
                    w->part_lse[pr] = lse;
                }
            }
}

/* The LSE merge of n states (lse[i·step]): M = max lse_i and 1 / Σ e^(lse_i − M), in double, so that state i
 * weighs e^(lse_i − M) · *inv. Returns the merged LSE: NaN if any lse_i is NaN, −inf if all are (then *inv = 0). */
static double merge_lse(const float *lse, int64_t step, int64_t n, double *M_out, double *inv) {
    double M = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        const double x = lse[i * step];
        if (isnan(x)) {
            *M_out = NAN, *inv = NAN;
            return NAN;
        }
        if (x > M) M = x;
    }
    *M_out = M;
    if (M == -INFINITY) {
        *inv = 0;
        return -INFINITY;
    }
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += exp((double)lse[i * step] - M);
    *inv = 1 / sum;
    return M + log(sum);
}
/* The weight of a state under merge_lse's M and inv; a state with lse −inf weighs 0 exactly. */
static double merge_weight(float lse, double M, double inv) {
    if (isnan(inv)) return NAN;
    return lse == -INFINITY ? 0 : exp((double)lse - M) * inv;
}

static void merge_splits(const fa_kv_problem *p, const fa_plan *pl, const split_parts *w, int threads) {
    const int64_t rows = p->batch * p->hq * p->sq, d = p->d_v; /* out's head_dim */
    const int nsplit = pl->aux[FA_KV_AUX_SPLITS];
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t b = r / (p->hq * p->sq), hq = r / p->sq % p->hq, i = r % p->sq;
        int64_t chunk;
        int ns;
        split_of(pl, p->seqlens[b] + fa_kv_sn(p, b), &chunk, &ns);
        if (ns == 1 || i >= fa_kv_sq(p, b)) continue; /* written by its item; or a packed sequence's padding */
        const float *pl_lse = w->part_lse + r * nsplit;
        double M, inv;
        float lse = (float)merge_lse(pl_lse, 1, ns, &M, &inv);
        const float f = p->sinks ? fa_sink_join_lse(lse, p->sinks[hq], &lse) : 1.0f; /* the sink, once per row */
        const int64_t oo = fa_kv_qrow0(p, &p->o, b, hq) + i * p->o.stride_seq;
        for (int64_t c = 0; c < d; c++) {
            double acc = 0;
            for (int s = 0; s < ns; s++) {
                const double wt = merge_weight(pl_lse[s], M, inv);
                if (wt != 0 || isnan(wt)) acc += wt * w->part_o[(r * nsplit + s) * d + c];
            }
            fa_store_elem(p->o.data, (int)p->dtype, oo + c, (float)(acc * f));
        }
        if (p->lse) p->lse[fa_kv_lse0(p, b, hq) + i] = lse;
    }
}

fa_status fa_cpu_kv_run(fa_context *ctx, const fa_kv_problem *p, const fa_plan *plan, fa_stats *st) {
    void *ws = p->workspace ? p->workspace : fa_workspace(ctx, plan->workspace_bytes);
    if (!ws) return FA_ERR_OUT_OF_MEMORY;
    fa_cpu_frame f;
    fa_cpu_frame_open(&f, &kv_layout, p, plan, ws);
    split_parts w;
    fa_cpu_frame_shared(&f, &w);
    const fa_cpu_kernels *kr = ctx->kernels;
    const fa_kv_kernel *kern = kr->kvcache;
    if (p->append) append(p, plan->threads);
    const int ns = plan->aux[FA_KV_AUX_SPLITS], hpi = plan->aux[AUX_HPI];
    const int64_t groups = p->hk / hpi, items = p->batch * groups * ns;
#pragma omp parallel for schedule(dynamic, 1) num_threads(f.threads)
    for (int64_t it = 0; it < items; it++) {
        thread_parts t;
        fa_io *io = fa_cpu_frame_thread(&f, &t);
        item(p, plan, kern, &t, &w, it / (groups * ns), it / ns % groups * hpi, hpi, (int)(it % ns), io);
    }
    if (ns > 1) merge_splits(p, plan, &w, plan->threads);
    fa_io io;
    memset(&io, 0, sizeof io);
    fa_cpu_frame_total(&f, &io);
    const int64_t e = (int64_t)fa_dtype_size(p->dtype), kb = p->d * e, vb = p->d_v * e;
    const int64_t ce = (int64_t)fa_dtype_size(p->cdtype); /* the cache's element (the appended rows written) */
    int64_t q_rows = 0, new_rows = 0;
    double pairs = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        const int64_t L = p->seqlens[b] + fa_kv_sn(p, b);
        q_rows += fa_kv_sq(p, b), new_rows += fa_kv_sn(p, b);
        for (int64_t i = 0; i < fa_kv_sq(p, b); i++) {
            int64_t lo, hi;
            fa_kv_visible(p, b, i, L, &lo, &hi);
            pairs += (double)(hi - lo);
        }
    }
    st->slow_read_bytes = io.read + q_rows * p->hq * kb + new_rows * p->hk * (kb + vb);
    st->slow_write_bytes = q_rows * p->hq * vb + (p->lse ? q_rows * p->hq * 4 : 0) + new_rows * p->hk * (p->d + p->d_v) * ce;
    st->flops = 2.0 * (double)(p->d + p->d_v) * (double)p->hq * pairs;
    return FA_OK;
}

fa_status fa_cpu_merge(fa_context *ctx, const fa_merge_problem *m) {
    const fa_tensor *o = &m->o;
    const int64_t rows = o->batch * o->heads * o->seqlen, d = o->head_dim;
    const int threads = ctx->threads < 1 ? 1 : ctx->threads;
    /* per thread: the weights (double) and LSEs (float) of the n states of its row; any n, so not on the stack */
    const size_t per = ((size_t)m->n * (sizeof(double) + sizeof(float)) + 7) / 8 * 8;
    char *ws = rows ? fa_workspace(ctx, (size_t)threads * per) : NULL;
    if (rows && !ws) return FA_ERR_OUT_OF_MEMORY;
#pragma omp parallel num_threads(threads)
    {
        double *wt = (double *)(void *)(ws + (size_t)fa_thread_id() * per);
        float *lsef = (float *)(void *)(wt + m->n);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const int64_t b = r / (o->heads * o->seqlen), h = r / o->seqlen % o->heads, i = r % o->seqlen;
            double M, inv;
            for (int k = 0; k < m->n; k++) lsef[k] = m->lses[k][r];
            const double lse = merge_lse(lsef, 1, m->n, &M, &inv);
            for (int k = 0; k < m->n; k++) wt[k] = merge_weight(lsef[k], M, inv);
            /* column c of out reads column c of every state before it is written, and out may only be outs[0]
             * exactly (same strides): so a column at a time needs no row buffer, at any head_dim */
            const int64_t oo = b * o->stride_batch + i * o->stride_seq + h * o->stride_head;
            for (int64_t c = 0; c < d; c++) {
                double x = 0;
                for (int k = 0; k < m->n; k++) {
                    const fa_tensor *t = &m->outs[k];
                    if (wt[k] != 0 || isnan(wt[k]))
                        x += wt[k] * fa_load_elem(t->data, (int)t->dtype,
                                                  b * t->stride_batch + i * t->stride_seq + h * t->stride_head + c);
                }
                fa_store_elem(o->data, (int)o->dtype, oo + c, (float)x);
            }
            if (m->lse) m->lse[r] = (float)lse;
        }
    }
    return FA_OK;
}
