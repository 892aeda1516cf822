/* libFuzzer harness over fa_forward_kvcache (CPU), built with ASan + UBSan by tests/fuzz/build.sh fuzz_kvcache.
 * The input's first bytes pick the call (dtype, contiguous or paged cache with page sizes 1..64, block tables and
 * batch_idx valid or not, lengths 0..capacity and beyond, seqlen_new 1..5, append on/off, GQA, causal/window/softcap,
 * splits, NULLs, out overlapping q, injected NaN/±inf; on a quarter of the inputs the cache's v, v_new and out of a
 * head_dim of their own); the rest seeds the values. Properties (docs/kvcache.md):
 *   error:   every buffer (q, k_new, v_new, the whole K and V cache, out, lse) byte-identical, a message set; an
 *            index the harness made invalid (length past capacity, row or used page out of range) is an error;
 *   success: out (poisoned first) and lse fully written; with append the cache changed only in the appended rows,
 *            which hold k_new / v_new (rotary off); finite inputs give no NaN in out or lse.
 * Any violation aborts (a finding). */
#include "flashattn.h"

#include "core/half.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_NAME "fuzz_kvcache"
#include "input.h"
static size_t elems(const buf *x) { return x->bytes / es_of(x->t.dtype); }

/* A view [b, s, h, d] with a layout picked by the input; memory = exactly its extent. */
static void mk(rd *r, buf *x, fa_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d) {
    int64_t ss = h * d, sh = d, sb = s * h * d;
    switch (pick(r, 4)) {
    case 1: ss = d, sh = s * d, sb = h * s * d; break;          /* BHSD */
    case 2: ss = h * d + 3, sh = d + 1, sb = s * ss + 5; break; /* padded */
    default: break;
    }
    x->t = (fa_tensor){NULL, dt, b, s, h, d, sb, ss, sh};
    x->bytes = (size_t)((b - 1) * sb + (s - 1) * ss + (h - 1) * sh + d) * es_of(dt);
    x->mem = malloc(x->bytes), x->copy = malloc(x->bytes);
    x->t.data = x->mem;
}
/* A second buffer with x's layout (the cache's V shares K's, so one element index names both), or with a head_dim
 * dv of its own (then contiguous: no pick, so the corpus's picks stay where they were). */
static void like(buf *y, const buf *x, int64_t dv) {
    *y = *x;
    if (dv != x->t.head_dim) {
        const fa_tensor *t = &x->t;
        y->t = (fa_tensor){NULL, t->dtype, t->batch, t->seqlen, t->heads, dv, t->seqlen * t->heads * dv,
                           t->heads * dv, dv};
        y->bytes = (size_t)(t->batch * t->seqlen * t->heads * dv) * es_of(t->dtype);
    }
    y->mem = malloc(y->bytes), y->copy = malloc(y->bytes);
    y->t.data = y->mem;
}
static void rm(buf *x) { free(x->mem), free(x->copy); }
static int64_t off(const fa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t i) {
    return b * t->stride_batch + s * t->stride_seq + h * t->stride_head + i;
}
static double at(const buf *x, int64_t e) { return fa_load_elem(x->mem, x->t.dtype, e); }
static void fill(rd *r, buf *x, double mag) {
    for (size_t i = 0; i < elems(x); i++) fa_store_elem(x->mem, x->t.dtype, (int64_t)i, (float)(mag * uni(r)));
}
static void snap(buf *x) { memcpy(x->copy, x->mem, x->bytes); }
static void same(const buf *x, const char *name) {
    if (memcmp(x->copy, x->mem, x->bytes)) FAIL("%s changed although the call failed", name);
}
static int all_finite(const buf *x) {
    for (size_t e = 0; e < elems(x); e++)
        if (!isfinite(at(x, (int64_t)e))) return 0;
    return 1;
}
/* Every element of the view written (no 0xFF.. poison left), every byte outside it still poison. */
static void written(const buf *x, const char *name) {
    const size_t es = es_of(x->t.dtype);
    uint8_t *seen = calloc(elems(x), 1);
    const fa_tensor *t = &x->t;
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seqlen; s++)
            for (int64_t h = 0; h < t->heads; h++)
                for (int64_t i = 0; i < t->head_dim; i++) {
                    const int64_t o = off(t, b, s, h, i);
                    int poison = 1;
                    seen[o] = 1;
                    for (size_t k = 0; k < es; k++) poison &= x->mem[(size_t)o * es + k] == 0xFF;
                    if (poison) FAIL("%s[%lld, %lld, %lld, %lld] was not written", name, (long long)b, (long long)s,
                                     (long long)h, (long long)i);
                }
    for (size_t e = 0; e < elems(x); e++)
        for (size_t k = 0; k < es && !seen[e]; k++)
            if (x->mem[e * es + k] != 0xFF) FAIL("%s: element %zu outside the view was written", name, e);
    free(seen);
}

static const float scales[] = {0, 1, -1, 0.125f, 3.0f, 1e30f, FLT_MAX, 1.4013e-45f, NAN, INFINITY};
static const float caps[] = {0, 0, 0, 0.5f, 5, 50, 1e-30f, 1e30f, -1, NAN, INFINITY};
static const double mags[] = {1, 1, 3, 30, 1e4, 1e19, 1e38};
static const int page_sizes[] = {1, 2, 3, 4, 7, 8, 16, 33, 64};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rd r = {data, size, 0, 0x9E3779B97F4A7C15ull};
    for (size_t i = 0; i < size; i++) r.s = (r.s ^ data[i]) * 0x100000001B3ull;
    r.s |= 1;
    const fa_dtype dt = (fa_dtype)pick(&r, 3);
    const int paged = pick(&r, 2), append = pick(&r, 3) != 0;
    const int64_t B = 1 + pick(&r, 3), S = 1 + pick(&r, 5), hk = 1 + pick(&r, 2), hq = hk * (1 + pick(&r, 3));
    const int64_t d = pick(&r, 16) == 0 ? 120 + pick(&r, 10) : 1 + pick(&r, 24);
    /* v's own head_dim (MLA decoding) from a hash of the input, not its bytes: the corpus keeps its picks */
    const uint64_t hv = r.s * 0xD6E8FEB86659FD93ull;
    const int64_t dv = hv >> 62                ? d
                       : (hv >> 40) % 16 == 0 ? 120 + (int64_t)((hv >> 8) % 10)
                                              : 1 + (int64_t)((hv >> 8) % 24);
    const int use_bidx = pick(&r, 2);
    const int64_t rows = B + (use_bidx ? pick(&r, 2) : 0);
    const int64_t ps = paged ? page_sizes[pick(&r, sizeof page_sizes / sizeof *page_sizes)] : 0;
    const int64_t max_pages = paged ? 1 + pick(&r, 4) : 0;
    const int64_t pages = paged ? rows * max_pages + pick(&r, 2) : 0;
    const int64_t cap = paged ? max_pages * ps : 1 + pick(&r, 12);
    const int64_t bt_stride = paged && pick(&r, 2) ? max_pages + 1 + pick(&r, 2) : max_pages;
    fa_attn_opts o = fa_attn_opts_default();
    o.scale = scales[pick(&r, sizeof scales / sizeof *scales)];
    o.softcap = caps[pick(&r, sizeof caps / sizeof *caps)];
    o.causal = pick(&r, 2);
    o.window_left = (int)pick(&r, 6) - 1, o.window_right = (int)pick(&r, 6) - 1;
    if (pick(&r, 3)) o.window_left = o.window_right = -1;
    fa_kv_opts ko = fa_kv_opts_default();
    ko.num_splits = (int)pick(&r, 5);
    if (pick(&r, 3) == 0) ko.split_size = (int)pick(&r, 20);
    const double mag = mags[pick(&r, sizeof mags / sizeof *mags)];
    const int inject = (int)pick(&r, 10) % 6; /* 1: q, 2: k_new, 3: v_new, 4: cache k, 5: cache v */
    const float bad = pick(&r, 3) == 0 ? NAN : pick(&r, 2) ? INFINITY : -INFINITY;
    const int overlap = pick(&r, 24) == 0, null_q = pick(&r, 40) == 0, null_opts = pick(&r, 20) == 0;
    const int null_kvopts = pick(&r, 4) == 0, null_lse = pick(&r, 4) == 0, null_vnew = append && pick(&r, 30) == 0;
    const int null_seqlens = pick(&r, 40) == 0;
    int must_fail = null_vnew || null_seqlens;

    /* lengths: mostly valid for the append, sometimes 0, capacity, past it or negative */
    int32_t seqlens[3], bidx[3];
    const int64_t room = cap - (append ? S : 0);
    for (int64_t b = 0; b < B; b++) {
        const unsigned c = pick(&r, 10);
        int64_t L = room >= 0 ? (int64_t)(rnd(&r) % (uint64_t)(room + 1)) : 0;
        if (c == 0) L = 0;
        if (c == 1) L = cap;
        if (c == 2) L = cap + 1 + pick(&r, 3);
        if (c == 3) L = -1 - (int64_t)pick(&r, 2);
        seqlens[b] = (int32_t)L;
        must_fail |= L < 0 || L + (append ? S : 0) > cap;
    }
    const int64_t shift = pick(&r, (unsigned)rows);
    for (int64_t b = 0; b < B; b++) bidx[b] = (int32_t)((b + shift) % rows); /* distinct rows */
    if (use_bidx && pick(&r, 8) == 0) bidx[pick(&r, (unsigned)B)] = pick(&r, 2) ? (int32_t)rows : -1, must_fail = 1;
    /* block table: distinct pages per (row, slot); padding and entries past the used pages hold junk never read */
    int32_t *bt = NULL;
    if (paged) {
        const int64_t rot = pick(&r, (unsigned)pages);
        bt = malloc(sizeof(int32_t) * (size_t)(rows * bt_stride));
        for (int64_t i = 0; i < rows * bt_stride; i++) bt[i] = -7;
        for (int64_t row = 0; row < rows; row++)
            for (int64_t p = 0; p < max_pages; p++) bt[row * bt_stride + p] = (int32_t)((row * max_pages + p + rot) % pages);
        for (int64_t b = 0; b < B; b++) {
            const int64_t row = use_bidx ? bidx[b] : b;
            if (row < 0 || row >= rows || seqlens[b] < 0) continue;
            const int64_t L = seqlens[b] + (append ? S : 0), used = (L + ps - 1) / ps;
            if (used < max_pages && pick(&r, 4) == 0) bt[row * bt_stride + used] = INT32_MAX;
            if (used > 0 && used <= max_pages && pick(&r, 12) == 0)
                bt[row * bt_stride + pick(&r, (unsigned)used)] = pick(&r, 2) ? (int32_t)pages : -1, must_fail = 1;
        }
    }
    snprintf(desc, sizeof desc, "%s %s B %lld S %lld hq %lld hk %lld d %lld dv %lld cap %lld page %lld pages %lld "
             "max_pages %lld rows %lld bidx %d append %d scale %g softcap %g causal %d window (%d, %d) splits %d/%d mag "
             "%g inject %d (%g)", fa_dtype_name(dt), paged ? "paged" : "contiguous", (long long)B, (long long)S,
             (long long)hq, (long long)hk, (long long)d, (long long)dv, (long long)cap, (long long)ps, (long long)pages,
             (long long)max_pages, (long long)rows, use_bidx, append, o.scale, o.softcap, o.causal, o.window_left,
             o.window_right, ko.num_splits, ko.split_size, mag, inject, bad);

    buf q, kc, vc, kn, vn, out;
    const int64_t cb = paged ? pages : rows, cs = paged ? ps : cap;
    mk(&r, &q, dt, B, S, hq, d), mk(&r, &kc, dt, cb, cs, hk, d), like(&vc, &kc, dv);
    mk(&r, &kn, dt, B, S, hk, d), mk(&r, &vn, dt, B, S, hk, dv), mk(&r, &out, dt, B, S, hq, dv);
    fill(&r, &q, mag), fill(&r, &kc, mag), fill(&r, &kn, mag);
    fill(&r, &vc, pick(&r, 2) ? 1 : mag), fill(&r, &vn, pick(&r, 2) ? 1 : mag);
    if (inject) {
        buf *x = inject == 1 ? &q : inject == 2 ? &kn : inject == 3 ? &vn : inject == 4 ? &kc : &vc;
        fa_store_elem(x->mem, dt, (int64_t)(rnd(&r) % elems(x)), bad);
    }
    const int finite = all_finite(&q) && all_finite(&kc) && all_finite(&vc) && all_finite(&kn) && all_finite(&vn);
    const size_t nlse = (size_t)(B * hq * S);
    float *lse = malloc(sizeof(float) * nlse), *lse_copy = malloc(sizeof(float) * nlse);
    memset(out.mem, 0xFF, out.bytes), memset(lse, 0xFF, sizeof(float) * nlse);
    snap(&q), snap(&kc), snap(&vc), snap(&kn), snap(&vn), snap(&out), memcpy(lse_copy, lse, sizeof(float) * nlse);

    fa_kvcache c = {kc.t, vc.t, null_seqlens ? NULL : seqlens, bt, max_pages, bt_stride == max_pages ? 0 : bt_stride,
                    use_bidx ? bidx : NULL, paged && rows == B && pick(&r, 2) ? 0 : rows};
    fa_tensor q_t = q.t, out_t = out.t;
    if (null_q) q_t.data = NULL;
    if (overlap) out_t.data = q.mem;
    must_fail |= null_q || overlap;

    static fa_context *ctx;
    if (!ctx && fa_context_create(&ctx, FA_BACKEND_CPU, 1) != FA_OK) FAIL("cannot create a CPU context");
    const fa_status st = fa_forward_kvcache(ctx, null_opts ? NULL : &o, null_kvopts ? NULL : &ko, &q_t, &c,
                                            append ? &kn.t : NULL, append && !null_vnew ? &vn.t : NULL, &out_t,
                                            null_lse ? NULL : lse);
    same(&q, "q"), same(&kn, "k_new"), same(&vn, "v_new");
    if (st != FA_OK) {
        same(&out, "out"), same(&kc, "cache k"), same(&vc, "cache v");
        if (memcmp(lse, lse_copy, sizeof(float) * nlse)) FAIL("lse changed although the call failed");
        if (!fa_context_last_error(ctx)[0]) FAIL("failed (%s) without a message", fa_status_string(st));
        goto done;
    }
    if (must_fail) FAIL("an invalid call (bad length, row, page, NULL or overlap) was accepted");
    written(&out, "out");
    if (!null_lse)
        for (size_t i = 0; i < nlse; i++) {
            uint32_t bits;
            memcpy(&bits, &lse[i], 4);
            if (bits == 0xFFFFFFFFu) FAIL("lse[%zu] was not written", i);
            if (finite && isnan(lse[i])) FAIL("lse[%zu] is NaN with finite inputs", i);
        }
    if (finite)
        for (int64_t b = 0; b < B; b++)
            for (int64_t s = 0; s < S; s++)
                for (int64_t h = 0; h < hq; h++)
                    for (int64_t x = 0; x < dv; x++)
                        if (isnan(at(&out, off(&out.t, b, s, h, x))))
                            FAIL("out[%lld, %lld, %lld, %lld] is NaN with finite inputs", (long long)b, (long long)s,
                                 (long long)h, (long long)x);
    /* the cache: the appended rows hold k_new / v_new, every other element is untouched */
    {
        uint8_t *mark_k = calloc(elems(&kc), 1), *mark_v = calloc(elems(&vc), 1);
        const size_t es = es_of(dt);
        for (int64_t b = 0; b < B && append; b++)
            for (int64_t s = 0; s < S; s++) {
                const int64_t row = use_bidx ? bidx[b] : b, t = seqlens[b] + s;
                const int64_t cr = paged ? bt[row * bt_stride + t / ps] : row, cp = paged ? t % ps : t;
                for (int64_t h = 0; h < hk; h++)
                    for (int64_t x = 0; x < (d > dv ? d : dv); x++) {
                        const int64_t ek = off(&kc.t, cr, cp, h, x), ev = off(&vc.t, cr, cp, h, x);
                        const double ck = x < d ? at(&kc, ek) : 0, cv = x < dv ? at(&vc, ev) : 0;
                        const double nk = x < d ? at(&kn, off(&kn.t, b, s, h, x)) : 0;
                        const double nv = x < dv ? at(&vn, off(&vn.t, b, s, h, x)) : 0;
                        if (x < d) mark_k[ek] = 1;
                        if (x < dv) mark_v[ev] = 1;
                        if (!(ck == nk || (isnan(ck) && isnan(nk))) || !(cv == nv || (isnan(cv) && isnan(nv))))
                            FAIL("appended key %lld of sequence %lld head %lld elem %lld: cache (%g, %g), new (%g, %g)",
                                 (long long)t, (long long)b, (long long)h, (long long)x, ck, cv, nk, nv);
                    }
            }
        for (size_t e = 0; e < elems(&kc); e++)
            if (!mark_k[e] && memcmp(kc.mem + e * es, kc.copy + e * es, es))
                FAIL("cache k element %zu outside the appended rows was written", e);
        for (size_t e = 0; e < elems(&vc); e++)
            if (!mark_v[e] && memcmp(vc.mem + e * es, vc.copy + e * es, es))
                FAIL("cache v element %zu outside the appended rows was written", e);
        free(mark_k), free(mark_v);
    }
done:
    rm(&q), rm(&kc), rm(&vc), rm(&kn), rm(&vn), rm(&out);
    free(lse), free(lse_copy), free(bt);
    return 0;
}
