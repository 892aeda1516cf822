/* libFuzzer harness over fa_forward and fa_backward (CPU), built with ASan + UBSan by tests/fuzz/build.sh.
 * The input's first bytes pick the call (dtype, algorithm, shapes, GQA, strides including 0 and huge ones, masks,
 * scale/softcap including NaN/inf/denormals, varlen arrays valid or not, NULLs, overlapping buffers, value
 * magnitudes up to FLT_MAX, injected NaN/±inf; on a quarter of the inputs v, out, dout and dv of a head_dim of their
 * own); the rest seeds the values. Properties (docs/numerics.md):
 *   error:   every buffer byte-identical, a message set;
 *   success: every output element written (outputs are poisoned with 0xFF bytes first), nothing around a view
 *            touched; with finite inputs no NaN anywhere, fully masked rows O = 0 / LSE = −∞, every other row
 *            inside the convex hull of its visible V rows (per element, small slack) with a finite LSE; NaN/±inf
 *            in q or k: exactly the affected rows NaN (O and LSE); the backward (run on the forward's out and LSE)
 *            NaN-free for finite inputs.
 * Any violation aborts (a finding). */
#include "flashattn.h"

#include "core/half.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_NAME "fuzz_attn"
#include "input.h"

/* A view with a layout picked by the input; memory = exactly its extent (ASan catches any read beyond it). */
static void mk(rd *r, buf *x, fa_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d, int input) {
    memset(x, 0, sizeof *x);
    int64_t ss = h * d, sh = d, sb = s * h * d;
    switch (pick(r, 8)) {
    case 1: ss = d, sh = s * d, sb = h * s * d; break;                      /* BHSD */
    case 2: ss = h * d + 3, sh = d + 1, sb = s * ss + 5; break;             /* padded */
    case 3: if (input) ss = 0; break;                                       /* broadcast rows */
    case 4: if (input) ss = 1; break;                                       /* overlapping rows */
    case 5: if (s == 1) ss = (int64_t)1 << (40 + pick(r, 23)); break;       /* huge stride, one row */
    case 6: if (input) sb = 0; break;                                       /* broadcast batch */
    default: break;
    }
    x->t = (fa_tensor){NULL, dt, b, s, h, d, sb, ss, sh};
    if (!b || !s) return; /* zero elements: no memory, a NULL data pointer (as PyTorch gives it) */
    const int64_t last = (b - 1) * sb + (s - 1) * ss + (h - 1) * sh + d - 1;
    x->bytes = (size_t)(last + 1) * es_of(dt);
    x->mem = malloc(x->bytes);
    x->copy = malloc(x->bytes);
    x->t.data = x->mem;
}
static void rm(buf *x) { free(x->mem), free(x->copy); }
static int64_t off(const fa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t i) {
    return b * t->stride_batch + s * t->stride_seq + h * t->stride_head + i;
}
static double get(const buf *x, int64_t b, int64_t s, int64_t h, int64_t i) {
    return fa_load_elem(x->mem, x->t.dtype, off(&x->t, b, s, h, i));
}
static void fill(rd *r, buf *x, double mag) {
    for (size_t i = 0; i < x->bytes / es_of(x->t.dtype); i++) fa_store_elem(x->mem, x->t.dtype, (int64_t)i, (float)(mag * uni(r)));
}
static void snap(buf *x) { if (x->bytes) memcpy(x->copy, x->mem, x->bytes); }
static void same(const buf *x, const char *name) {
    if (x->bytes && memcmp(x->copy, x->mem, x->bytes)) FAIL("%s changed although the call failed", name);
}
/* Every element of the view written (no 0xFF.. poison left) and every byte outside it still poison. */
static void written(const buf *x, const char *name) {
    const size_t es = es_of(x->t.dtype);
    uint8_t *seen = calloc(x->bytes / es, 1);
    const fa_tensor *t = &x->t;
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seqlen; s++)
            for (int64_t h = 0; h < t->heads; h++)
                for (int64_t i = 0; i < t->head_dim; i++) {
                    const int64_t o = off(t, b, s, h, i);
                    seen[o] = 1;
                    int poison = 1;
                    for (size_t k = 0; k < es; k++) poison &= x->mem[(size_t)o * es + k] == 0xFF;
                    if (poison) FAIL("%s[%lld, %lld, %lld, %lld] was not written", name, (long long)b, (long long)s,
                                     (long long)h, (long long)i);
                }
    for (size_t e = 0; e < x->bytes / es; e++)
        for (size_t k = 0; k < es && !seen[e]; k++)
            if (x->mem[e * es + k] != 0xFF) FAIL("%s: element %zu outside the view was written", name, e);
    free(seen);
}

/* Every element of the allocation finite (values rounded to f16 may have become ±inf). */
static int all_finite(const buf *x) {
    for (size_t e = 0; e < x->bytes / es_of(x->t.dtype); e++)
        if (!isfinite(fa_load_elem(x->mem, x->t.dtype, (int64_t)e))) return 0;
    return 1;
}

static int nan_in_view(const buf *x) {
    const fa_tensor *t = &x->t;
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seqlen; s++)
            for (int64_t h = 0; h < t->heads; h++)
                for (int64_t i = 0; i < t->head_dim; i++)
                    if (isnan(get(x, b, s, h, i))) return 1;
    return 0;
}

static const float scales[] = {0, 1, -1, 0.125f, 3.0f, 1e20f, 1e30f, FLT_MAX, -FLT_MAX, 1.4013e-45f, 1e-30f, NAN,
                               INFINITY};
static const float caps[] = {0, 0, 0, 0.5f, 5, 50, 1.4013e-45f, 1e-30f, 1e30f, -1, NAN, INFINITY};
static const double mags[] = {1, 1, 3, 30, 1e4, 1e19, 1e30, 1e38};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rd r = {data, size, 0, 0x9E3779B97F4A7C15ull};
    for (size_t i = 0; i < size; i++) r.s = (r.s ^ data[i]) * 0x100000001B3ull;
    r.s |= 1;
    const fa_dtype dt = (fa_dtype)pick(&r, 3);
    const int backward = pick(&r, 2), varlen = pick(&r, 5) == 0;
    const int64_t hk = 1 + pick(&r, 2), hq = hk * (1 + pick(&r, 2)), d = pick(&r, 16) == 0 ? 250 + pick(&r, 10) : 1 + pick(&r, 24);
    /* v's (and out's) own head_dim on a quarter of the inputs, drawn from a hash of the input rather than its bytes,
     * so that the picks and values of the checked-in corpus stay what they were */
    const uint64_t hv = r.s * 0xD6E8FEB86659FD93ull;
    const int64_t dv = hv >> 62                ? d
                       : (hv >> 40) % 16 == 0 ? 250 + (int64_t)((hv >> 8) % 10)
                                              : 1 + (int64_t)((hv >> 8) % 24);
    int64_t b = 1 + pick(&r, 2), sq = 1 + pick(&r, 9), sk = 1 + pick(&r, 9);
    switch (pick(&r, 24)) { /* zero extents: valid calls, out = 0 / LSE = -inf / zero gradients where defined */
    case 0: b = 0; break;
    case 1: sq = 0; break;
    case 2: sk = 0; break;
    default: break;
    }
    fa_attn_opts o = fa_attn_opts_default();
    o.algo = (fa_algo)pick(&r, 4);
    o.scale = scales[pick(&r, sizeof scales / sizeof *scales)];
    o.softcap = caps[pick(&r, sizeof caps / sizeof *caps)];
    o.causal = pick(&r, 3) == 0;
    o.window_left = (int)pick(&r, 6) - 1, o.window_right = (int)pick(&r, 6) - 1;
    if (pick(&r, 3)) o.window_left = o.window_right = -1;
    if (pick(&r, 4) == 0) o.block_q = (int)pick(&r, 40), o.block_k = (int)pick(&r, 40);
    o.deterministic = pick(&r, 2);
    const double mag = mags[pick(&r, sizeof mags / sizeof *mags)];
    const int inject = (int)pick(&r, 6) % 4; /* 1: q, 2: k, 3: v gets one NaN/±inf */
    const float bad = pick(&r, 3) == 0 ? NAN : pick(&r, 2) ? INFINITY : -INFINITY;
    int overlap = pick(&r, 24) == 0;
    const int null_data = pick(&r, 40) == 0, null_opts = pick(&r, 40) == 0;
    int32_t cu_q[4], cu_k[4];
    if (varlen) { /* up to 3 sequences packed into batch 1; sometimes invalid */
        o.n_seqs = 1 + pick(&r, 3);
        cu_q[0] = cu_k[0] = 0;
        for (int s = 1; s <= o.n_seqs; s++) cu_q[s] = cu_q[s - 1] + (int)pick(&r, 4), cu_k[s] = cu_k[s - 1] + (int)pick(&r, 4);
        if (pick(&r, 8) == 0) cu_q[1] += 7;
        sq = cu_q[o.n_seqs], sk = cu_k[o.n_seqs]; /* 0 too: packed batches without query or key rows */
        b = 1;
        o.cu_seqlens_q = cu_q, o.cu_seqlens_k = cu_k;
    }
    snprintf(desc, sizeof desc, "%s %s b %lld sq %lld sk %lld hq %lld hk %lld d %lld scale %g softcap %g causal %d "
             "window (%d, %d) blocks (%d, %d) varlen %d mag %g inject %d (%g) backward %d dv %lld", fa_dtype_name(dt),
             fa_algo_name(o.algo), (long long)b, (long long)sq, (long long)sk, (long long)hq, (long long)hk,
             (long long)d, o.scale, o.softcap, o.causal, o.window_left, o.window_right, o.block_q, o.block_k, varlen,
             mag, inject, bad, backward, (long long)dv);
    buf q, k, v, out, dout, dq, dk, gv; /* gv: the gradient dv */
    mk(&r, &q, dt, b, sq, hq, d, 1), mk(&r, &k, dt, b, sk, hk, d, 1), mk(&r, &v, dt, b, sk, hk, dv, 1);
    mk(&r, &out, dt, b, sq, hq, dv, 0);
    fill(&r, &q, mag), fill(&r, &k, mag), fill(&r, &v, pick(&r, 2) ? 1 : mag);
    if (inject && (inject == 1 ? q.bytes : k.bytes)) {
        buf *x = inject == 1 ? &q : inject == 2 ? &k : &v;
        fa_store_elem(x->mem, dt, (int64_t)(rnd(&r) % (x->bytes / es_of(dt))), bad);
    }
    const int64_t nlse = b * hq * sq;
    float *lse = malloc(sizeof(float) * (size_t)nlse), *lse_copy = malloc(sizeof(float) * (size_t)nlse);
    if (out.bytes) memset(out.mem, 0xFF, out.bytes);
    memset(lse, 0xFF, sizeof(float) * (size_t)nlse);
    fa_tensor out_t = out.t;
    if (overlap && q.bytes && out.bytes) out_t.data = q.mem;
    else if (overlap) overlap = 0; /* nothing to overlap with: zero elements */
    if (null_data) out_t.data = NULL; /* valid only for an out of zero elements */
    snap(&q), snap(&k), snap(&v), snap(&out), memcpy(lse_copy, lse, sizeof(float) * (size_t)nlse);

    static fa_context *ctx;
    if (!ctx && fa_context_create(&ctx, FA_BACKEND_CPU, 1) != FA_OK) FAIL("cannot create a CPU context");
    fa_status st = fa_forward(ctx, null_opts ? NULL : &o, &q.t, &k.t, &v.t, &out_t, lse);
    if (null_opts) o = fa_attn_opts_default();
    same(&q, "q"), same(&k, "k"), same(&v, "v");
    if (overlap && st == FA_OK) FAIL("out overlapping q was accepted");
    if (st != FA_OK) {
        same(&out, "out");
        if (memcmp(lse, lse_copy, sizeof(float) * (size_t)nlse)) FAIL("lse changed although the call failed");
        if (!fa_context_last_error(ctx)[0]) FAIL("failed (%s) without a message", fa_status_string(st));
        goto done;
    }
    written(&out, "out");
    for (int64_t i = 0; i < nlse; i++) {
        uint32_t bits;
        memcpy(&bits, &lse[i], 4);
        if (bits == 0xFFFFFFFFu) FAIL("lse[%lld] was not written", (long long)i);
    }
    /* finite inputs: scale and softcap were accepted (finite), so no NaN; hull, masked rows; bad q/k rows NaN */
    const int64_t nseq = varlen ? o.n_seqs : b, group = hq / hk;
    for (int64_t s = 0; s < nseq; s++) {
        const int64_t bb = varlen ? 0 : s, q0 = varlen ? cu_q[s] : 0, k0 = varlen ? cu_k[s] : 0;
        const int64_t n_q = varlen ? cu_q[s + 1] - cu_q[s] : sq, n_k = varlen ? cu_k[s + 1] - cu_k[s] : sk;
        for (int64_t h = 0; h < hq; h++)
            for (int64_t i = 0; i < n_q; i++) {
                const int64_t diag = i + n_k - n_q;
                const int wr = o.causal ? 0 : o.window_right; /* causal = right window 0 */
                int64_t lo = o.window_left >= 0 ? diag - o.window_left : 0, hi = wr >= 0 ? diag + wr + 1 : n_k;
                lo = lo < 0 ? 0 : lo, hi = hi > n_k ? n_k : hi;
                const float l = lse[varlen ? h * sq + q0 + i : (bb * hq + h) * sq + i];
                int qbad = 0, kbad = 0, vbad = 0;
                for (int64_t x = 0; x < d; x++) qbad |= !isfinite(get(&q, bb, q0 + i, h, x));
                for (int64_t j = lo; j < hi; j++) {
                    for (int64_t x = 0; x < d; x++) kbad |= !isfinite(get(&k, bb, k0 + j, h / group, x));
                    for (int64_t x = 0; x < dv; x++) vbad |= !isfinite(get(&v, bb, k0 + j, h / group, x));
                }
                if (hi <= lo) {
                    for (int64_t x = 0; x < dv; x++)
                        if (get(&out, bb, q0 + i, h, x) != 0) FAIL("fully masked row %lld (batch %lld head %lld) has O[%lld] = %g, LSE %g", (long long)i, (long long)bb, (long long)h, (long long)x, get(&out, bb, q0 + i, h, x), l);
                    if (!(isinf(l) && l < 0)) FAIL("fully masked row %lld has LSE %g", (long long)i, l);
                    continue;
                }
                if (qbad || kbad) {
                    if (!isnan(l)) FAIL("row %lld: q or a visible key is not finite but LSE = %g", (long long)i, l);
                    for (int64_t x = 0; x < dv; x++)
                        if (!isnan(get(&out, bb, q0 + i, h, x))) FAIL("row %lld: non-finite q/k but O not NaN", (long long)i);
                    continue;
                }
                if (!isfinite(l)) FAIL("row %lld (finite q, k; %lld keys) has LSE %g", (long long)i, (long long)(hi - lo), l);
                if (vbad) continue;
                for (int64_t x = 0; x < dv; x++) {
                    double mn = INFINITY, mx = -INFINITY;
                    for (int64_t j = lo; j < hi; j++) {
                        const double e = get(&v, bb, k0 + j, h / group, x);
                        mn = e < mn ? e : mn, mx = e > mx ? e : mx;
                    }
                    const double rel = dt == FA_DTYPE_F32 ? 1e-5 : 1e-2; /* rounding of P and of out */
                    const double y = get(&out, bb, q0 + i, h, x);
                    const double slack = 1e-2 * (mx - mn) + rel * fmax(fabs(mn), fabs(mx)) + 1e-30;
                    if (!(y >= mn - slack && y <= mx + slack))
                        FAIL("row %lld head %lld elem %lld: O = %g outside [%g, %g] of its visible V rows (%s %s)",
                             (long long)i, (long long)h, (long long)x, y, mn, mx, fa_dtype_name(dt), fa_algo_name(o.algo));
                }
            }
    }
    if (backward) {
        mk(&r, &dout, dt, b, sq, hq, dv, 1), mk(&r, &dq, dt, b, sq, hq, d, 0);
        mk(&r, &dk, dt, b, sk, hk, d, 0), mk(&r, &gv, dt, b, sk, hk, dv, 0);
        fill(&r, &dout, 1);
        buf *gs[3] = {&dq, &dk, &gv};
        for (int a = 0; a < 3; a++)
            if (gs[a]->bytes) memset(gs[a]->mem, 0xFF, gs[a]->bytes);
        snap(&dout), snap(&dq), snap(&dk), snap(&gv), snap(&out);
        st = fa_backward(ctx, &o, &q.t, &k.t, &v.t, &out.t, lse, &dout.t, &dq.t, &dk.t, &gv.t);
        same(&q, "q"), same(&k, "k"), same(&v, "v"), same(&out, "out"), same(&dout, "dout");
        if (st != FA_OK) {
            same(&dq, "dq"), same(&dk, "dk"), same(&gv, "dv");
            if (!fa_context_last_error(ctx)[0]) FAIL("backward failed (%s) without a message", fa_status_string(st));
        } else {
            written(&dq, "dq"), written(&dk, "dk"), written(&gv, "dv");
            if (all_finite(&q) && all_finite(&k) && all_finite(&v) && all_finite(&dout)) {
                const buf *g[3] = {&dq, &dk, &gv};
                for (int a = 0; a < 3; a++)
                    if (nan_in_view(g[a]))
                            FAIL("backward: NaN in %s with finite inputs (%s %s scale %g softcap %g mag %g)",
                                 a == 0 ? "dq" : a == 1 ? "dk" : "dv", fa_dtype_name(dt), fa_algo_name(o.algo),
                                 o.scale, o.softcap, mag);
            }
        }
        rm(&dout), rm(&dq), rm(&dk), rm(&gv);
    }
done:
    rm(&q), rm(&k), rm(&v), rm(&out);
    free(lse), free(lse_copy);
    return 0;
}
