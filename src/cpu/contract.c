/* The numerics contract on the CPU (docs/numerics.md), the same for STANDARD, FLASH1 and FLASH2. Before the
 * algorithm runs, one scan per (sequence, head) — forward — or (sequence, K/V head) — backward — reads its inputs
 * once and bounds what the fp32 tile loops will compute; if some head is not certified, the recompute's workspace
 * is reserved then, so that nothing can fail once outputs are written. Where the bound certifies them (finite
 * inputs, |logits| within 2^24 so that exp(S − LSE) cannot overflow on rounding, sums far from the fp32 range)
 * their result stands. Otherwise (a NaN/±inf input, a huge scale, a denormal softcap, values near FLT_MAX) the head
 * is recomputed after the algorithm in float64 from the definition, over the visible keys only, with the
 * contract's rules: logits saturate at ±FA_LOGIT_SAT, rows whose q or any visible key is not finite are NaN, fully
 * masked rows are O = 0 / LSE = −∞. The scan is not counted in fa_stats' traffic. */
#include "cpu/cpu.h"

#include "core/half.h"

#include <string.h>

#define FA_LOGIT_SAT 0x1p126  /* |logit| saturates here: LSE = max + log ℓ stays finite in fp32 */
#define FAST_LOGIT_MAX 0x1p24 /* the fp32 loops' exp(S − LSE) keeps an exponent error below 2 up to here */
#define FAST_SUM_MAX 0x1p100  /* fp32 sums of fewer than 2^28 terms bounded by this cannot overflow */

typedef struct rows_view { const void *base; int64_t ld, rows, d; } rows_view; /* d: the row's head_dim */

/* max |x| over rows (meaningful only where all are finite); *bad |= 1 if any element is NaN or ±inf. On the bit
 * patterns, as fa_absmax_bits (tile_io.h): signed integer maxima over independent lanes, which the compiler
 * vectorises on the baseline ISA (the scan runs on every call); 16-bit types the same way over 32 lanes. The rows
 * are prefetched FA_PF_ROWS ahead, as the tile loads do (AVX2 backward at N 128, d 128, Zen 5: 8-10 % faster for
 * every algorithm). */
static double scan(const fa_problem *p, rows_view r, int *bad) {
    /* in unsigned arithmetic, as the tile loads: a one-row view may have any stride */
    const int64_t d = r.d, ld_bytes = (int64_t)((uint64_t)r.ld * fa_dtype_size(p->dtype));
    const size_t row_bytes = (size_t)d * fa_dtype_size(p->dtype);
    fa_prefetch_rows(r.base, ld_bytes, 0, r.rows < FA_PF_ROWS ? r.rows : FA_PF_ROWS, row_bytes, 0);
    if (p->dtype == FA_DTYPE_F32) {
        int32_t acc[16] = {0}, mx = 0;
        for (int64_t i = 0; i < r.rows; i++) {
            if (i + FA_PF_ROWS < r.rows)
                fa_prefetch_rows(r.base, ld_bytes, i + FA_PF_ROWS, i + FA_PF_ROWS + 1, row_bytes, 0);
            fa_absmax_bits((const int32_t *)r.base + i * r.ld, d, acc, &mx);
        }
        mx = fa_absmax_fold(acc, mx);
        if (mx >= 0x7f800000) *bad = 1;
        float f;
        memcpy(&f, &mx, 4);
        return f;
    }
    int16_t acc[32] = {0}, mx = 0;
    for (int64_t i = 0; i < r.rows; i++) {
        const int16_t *row = (const int16_t *)r.base + i * r.ld;
        if (i + FA_PF_ROWS < r.rows)
            fa_prefetch_rows(r.base, ld_bytes, i + FA_PF_ROWS, i + FA_PF_ROWS + 1, row_bytes, 0);
        int64_t x = 0;
        for (; x + 32 <= d; x += 32)
            for (int k = 0; k < 32; k++) {
                const int16_t a = (int16_t)(row[x + k] & 0x7fff);
                acc[k] = a > acc[k] ? a : acc[k];
            }
        for (; x < d; x++) {
            const int16_t a = (int16_t)(row[x] & 0x7fff);
            mx = a > mx ? a : mx;
        }
    }
    for (int k = 0; k < 32; k++) mx = acc[k] > mx ? acc[k] : mx;
    const int f16 = p->dtype == FA_DTYPE_F16;
    if (mx >= (f16 ? 0x7c00 : 0x7f80)) *bad = 1;
    return f16 ? fa_f16_to_f32((uint16_t)mx) : fa_bf16_to_f32((uint16_t)mx);
}

static double at(const fa_problem *p, rows_view r, int64_t i, int64_t x) {
    return fa_load_elem(r.base, p->dtype, i * r.ld + x);
}

static int row_bad(const fa_problem *p, rows_view r, int64_t i) {
    for (int64_t x = 0; x < r.d; x++)
        if (!isfinite(at(p, r, i, x))) return 1;
    return 0;
}

/* Is the fp32 result of the tile loops certified for this head? (maxima over the finite elements) */
static int certified(const fa_problem *p, int bad, double mq, double mk, double mv, int64_t sk) {
    const double d = (double)p->d, dot = d * mq * mk, scale = fabs((double)p->scale);
    if (bad || dot > FAST_SUM_MAX || (double)sk * mv > FAST_SUM_MAX) return 0;
    if (p->softcap > 0) return p->softcap >= 0x1p-60 && p->softcap <= FAST_LOGIT_MAX;
    return scale * dot <= FAST_LOGIT_MAX;
}

int fa_cpu_certified_bits(const fa_problem *p, uint32_t mq, uint32_t mk, uint32_t mv, int64_t sk) {
    const uint32_t inf = 0x7f800000u;
    if (mq >= inf || mk >= inf || mv >= inf) return 0;
    float q, k, v;
    memcpy(&q, &mq, 4);
    memcpy(&k, &mk, 4);
    memcpy(&v, &mv, 4);
    return certified(p, 0, q, k, v, sk);
}

/* s = scale·q_i·k_j (softcap), saturated: the contract's logit, in float64. */
static double logit(const fa_problem *p, rows_view q, int64_t i, rows_view k, int64_t j) {
    double s = 0;
    for (int64_t x = 0; x < p->d; x++) s += at(p, q, i, x) * at(p, k, j, x);
    s *= (double)p->scale;
    if (p->softcap > 0) s = (double)p->softcap * tanh(s / (double)p->softcap);
    return s > FA_LOGIT_SAT ? FA_LOGIT_SAT : s < -FA_LOGIT_SAT ? -FA_LOGIT_SAT : s;
}

/* One (sequence b, query head h) forward from the definition. kbad: sk flags; s: sk doubles; o: dv doubles. */
static void forward_head(const fa_problem *p, const fa_head *hd, rows_view q, rows_view k, rows_view v,
                         const char *kbad, double *s, double *o) {
    const int64_t d = p->d_v; /* out's */
    for (int64_t i = 0; i < hd->sq; i++) {
        int64_t lo, hi;
        fa_key_range(p, hd->sq, hd->sk, i, &lo, &hi);
        double lse = -INFINITY;
        memset(o, 0, sizeof(double) * (size_t)d);
        int nan_row = hi > lo && row_bad(p, q, i); /* a fully masked row stays O = 0, LSE = −∞ */
        for (int64_t j = lo; j < hi && !nan_row; j++) nan_row = kbad[j];
        if (nan_row) {
            lse = NAN;
            for (int64_t x = 0; x < d; x++) o[x] = NAN;
        } else if (hi > lo) {
            double m = -INFINITY, l = 0;
            for (int64_t j = lo; j < hi; j++) s[j] = logit(p, q, i, k, j), m = s[j] > m ? s[j] : m;
            for (int64_t j = lo; j < hi; j++) {
                const double pj = exp(s[j] - m);
                l += pj;
                for (int64_t x = 0; x < d; x++) o[x] += pj * at(p, v, j, x);
            }
            for (int64_t x = 0; x < d; x++) o[x] /= l;
            lse = m + log(l);
        }
        if (hd->sink) { /* the sink joins the row's denominator (core/sink.h); a NaN row stays NaN */
            const double with = fa_sink_lse(lse, *hd->sink);
            for (int64_t x = 0; x < d; x++) o[x] *= lse == -INFINITY ? 0.0 : exp(lse - with);
            lse = with;
        }
        for (int64_t x = 0; x < d; x++) fa_store_elem(hd->o, p->dtype, i * hd->ldo + x, (float)o[x]);
        if (hd->lse) hd->lse[i] = (float)lse;
    }
}

/* One (sequence b, K/V head) backward from the definition, D = rowsum(dO ∘ O). P = exp(S − LSE) with the row's
 * LSE recomputed in float64 (at |logits| > 2^24 the fp32 LSE's rounding alone moves P by more than its size); a
 * NaN or −∞ LSE from the forward stands (an affected or a fully masked row). s: sk doubles; dq: d doubles; dk:
 * sk·d doubles, dv: sk·dv. */
static void backward_group(const fa_problem *p, int64_t b, int64_t hk, double *s, double *dq, double *dk, double *dv) {
    const int64_t d = p->d, e = p->d_v, group = p->hq / p->hk;
    fa_head hd;
    fa_cpu_head(p, b, hk * group, &hd);
    const rows_view k = {hd.k, hd.ldk, hd.sk, d}, v = {hd.v, hd.ldv, hd.sk, e};
    memset(dk, 0, sizeof(double) * (size_t)(hd.sk * d));
    memset(dv, 0, sizeof(double) * (size_t)(hd.sk * e));
    for (int64_t g = 0; g < group; g++) {
        fa_head h;
        fa_cpu_head(p, b, hk * group + g, &h);
        const rows_view q = {h.q, h.ldq, h.sq, d}, o = {h.o, h.ldo, h.sq, e}, dout = {h.dout, h.lddo, h.sq, e};
        for (int64_t i = 0; i < h.sq; i++) {
            int64_t lo, hi;
            fa_key_range(p, h.sq, h.sk, i, &lo, &hi);
            memset(dq, 0, sizeof(double) * (size_t)d);
            double L = h.lse[i], D = 0;
            if (!isnan(L) && L != -INFINITY && hi > lo) {
                double m = -INFINITY, l = 0;
                for (int64_t j = lo; j < hi; j++) s[j] = logit(p, q, i, k, j), m = s[j] > m ? s[j] : m;
                for (int64_t j = lo; j < hi; j++) l += exp(s[j] - m);
                L = m + log(l);
                if (h.sink) L = fa_sink_lse(L, *h.sink);
            }
            for (int64_t x = 0; x < e; x++) D += at(p, dout, i, x) * at(p, o, i, x);
            for (int64_t j = lo; j < hi; j++) {
                const double sj = logit(p, q, i, k, j), pj = L == -INFINITY ? 0.0 : exp(sj - L);
                double dp = 0;
                for (int64_t x = 0; x < e; x++) dp += at(p, dout, i, x) * at(p, v, j, x);
                double ds = pj * (dp - D);
                if (p->softcap > 0) {
                    const double th = sj / (double)p->softcap;
                    ds *= 1.0 - th * th;
                }
                ds *= (double)p->scale;
                for (int64_t x = 0; x < d; x++) {
                    dq[x] += ds * at(p, k, j, x);
                    dk[j * d + x] += ds * at(p, q, i, x);
                }
                for (int64_t x = 0; x < e; x++) dv[j * e + x] += pj * at(p, dout, i, x);
            }
            for (int64_t x = 0; x < d; x++) fa_store_elem(h.dq, p->dtype, i * h.lddq + x, (float)dq[x]);
        }
    }
    for (int64_t j = 0; j < hd.sk; j++) {
        for (int64_t x = 0; x < d; x++) fa_store_elem(hd.dk, p->dtype, j * hd.lddk + x, (float)dk[j * d + x]);
        for (int64_t x = 0; x < e; x++) fa_store_elem(hd.dv, p->dtype, j * hd.lddv + x, (float)dv[j * e + x]);
    }
}

/* Scan the inputs of item it (forward: (sequence, query head); backward: (sequence, K/V head)): 1 if the fp32
 * result of the tile loops is certified for it. */
static int item_certified(const fa_problem *p, int64_t it) {
    const int64_t heads = p->is_backward ? p->hk : p->hq, b = it / heads, h = it % heads, group = p->hq / p->hk;
    fa_head hd;
    fa_cpu_head(p, b, p->is_backward ? h * group : h, &hd);
    /* any non-finite input: the tile loops would spread it through 0·inf to rows that do not see it */
    int bad = 0;
    const double mk = scan(p, (rows_view){hd.k, hd.ldk, hd.sk, p->d}, &bad);
    const double mv = scan(p, (rows_view){hd.v, hd.ldv, hd.sk, p->d_v}, &bad);
    if (!p->is_backward) {
        const double mq = scan(p, (rows_view){hd.q, hd.ldq, hd.sq, p->d}, &bad);
        return certified(p, bad, mq, mk, mv, hd.sk);
    }
    double mq = 0, mo = 0, mdo = 0;
    for (int64_t g = 0; g < group; g++) {
        fa_head hq;
        fa_cpu_head(p, b, h * group + g, &hq);
        const double a = scan(p, (rows_view){hq.q, hq.ldq, hq.sq, p->d}, &bad);
        const double c = scan(p, (rows_view){hq.o, hq.ldo, hq.sq, p->d_v}, &bad);
        const double e = scan(p, (rows_view){hq.dout, hq.lddo, hq.sq, p->d_v}, &bad);
        mq = a > mq ? a : mq, mo = c > mo ? c : mo, mdo = e > mdo ? e : mdo;
    }
    /* |dS| <= 2·dv·max|dO|·(max|V| + max|O|); dQ, dK sum at most n terms of |scale·dS|·max|q, k|, dV n of 2·|dO| */
    const double n = (double)(hd.sq > hd.sk ? hd.sq : hd.sk) * (double)group, mqk = mq > mk ? mq : mk;
    const double grad = fabs((double)p->scale) * 2.0 * (double)p->d_v * mdo * (mv + mo) * n * (mqk > 1 ? mqk : 1);
    return certified(p, bad, mq, mk, mv, hd.sk) && grad <= FAST_SUM_MAX && 2 * n * mdo <= FAST_SUM_MAX;
}

/* Per thread: s (sk doubles), o (dv, forward) or dq (d, backward), and sk flags (forward) or dK (sk·d doubles), dV
 * (sk·dv, backward), in 64-byte aligned slices (no false sharing). */
static size_t fix_slice(const fa_problem *p) {
    const int64_t d = p->d, dv = p->d_v, sk = p->sk_max;
    const size_t bytes = p->is_backward ? sizeof(double) * (size_t)(sk + d + sk * (d + dv))
                                        : sizeof(double) * (size_t)(sk + dv) + (size_t)sk;
    return (bytes + 63) & ~(size_t)63;
}

size_t fa_cpu_contract_fix_bytes(const fa_context *ctx, const fa_problem *p) {
    return fix_slice(p) * (size_t)ctx->threads;
}

fa_status fa_cpu_contract_prepare(fa_context *ctx, const fa_problem *p, int *fix) {
    const int64_t items = p->batch * (p->is_backward ? p->hk : p->hq);
    int any = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->threads) reduction(| : any)
    for (int64_t it = 0; it < items; it++) any |= !item_certified(p, it);
    *fix = any;
    if (any && !fa_workspace(ctx, fix_slice(p) * (size_t)ctx->threads)) return FA_ERR_OUT_OF_MEMORY;
    return FA_OK;
}

void fa_cpu_contract_fix(fa_context *ctx, const fa_problem *p) {
    const int64_t d = p->is_backward ? p->d : p->d_v, sk = p->sk_max, heads = p->is_backward ? p->hk : p->hq;
    const int64_t items = p->batch * heads;
    const size_t per = fix_slice(p);
    /* the workspace only grows: prepare's reservation is still there, so this returns it and cannot fail */
    char *ws = fa_workspace(ctx, per * (size_t)ctx->threads);
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->threads)
    for (int64_t it = 0; it < items; it++) {
        if (item_certified(p, it)) continue;
        double *s = (double *)(ws + per * (size_t)fa_thread_id()), *o = s + sk;
        const int64_t b = it / heads, h = it % heads;
        if (p->is_backward) {
            backward_group(p, b, h, s, o, o + d, o + d + sk * d);
            continue;
        }
        fa_head hd;
        fa_cpu_head(p, b, h, &hd);
        const rows_view q = {hd.q, hd.ldq, hd.sq, p->d}, k = {hd.k, hd.ldk, hd.sk, p->d};
        const rows_view v = {hd.v, hd.ldv, hd.sk, p->d_v};
        char *kbad = (char *)(o + d);
        for (int64_t j = 0; j < hd.sk; j++) kbad[j] = (char)row_bad(p, k, j);
        forward_head(p, &hd, q, k, v, kbad, s, o);
    }
}
