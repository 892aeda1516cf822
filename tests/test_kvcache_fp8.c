/* KV-cache decoding from FP8 (E4M3) caches on the CPU (fa_forward_kvcache with kv_opts.k_descale / v_descale):
 * against the float64 oracle, which decodes the cache exactly with the descales — contiguous and paged caches,
 * with and without append (the new rows quantised with the sequence's descale, rotary first), split-KV, GQA, every
 * mask option, sinks, batch_idx, q in f32, f16 and bf16; leftpad and packed rows against the f32 cache of the same
 * values; the bad arguments (nothing written, neither out nor the cache); and the accuracy of decoding from a cache made by fa_quantize_fp8 against decoding from the bf16 cache.
 * FA_TEST_RANDOM sets the number of random cases. */
#include "testlib.h"
#include "kvcase.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static t_rng R;

static t_kv_spec spec(fa_dtype dt, int batch, int sq, int hq, int hk, int d, int cap, int page) {
    t_kv_spec s = t_kv_spec_of(dt, batch, sq, hq, hk, d, cap, page);
    s.fp8 = 1;
    return s;
}

static float sinks[64];

static void run(fa_context *ctx, const t_kv_spec *s, const char *what) {
    t_kv_case *c = t_kv_new(s, &R);
    snprintf(t_case_label, sizeof t_case_label,
             "%s: fp8 cache, q %s b%d sq%d hq%d hk%d d%d dv%d cap%d page%d append%d rotary%d bidx%d causal%d win(%d,%d) "
             "softcap %g sinks%d splits %d/%d", what, fa_dtype_name(s->dt), s->batch, s->sq, s->hq, s->hk, s->d, c->s.dv,
             s->capacity, s->page_size, s->append, s->rotary, s->batch_idx, s->opts.causal, s->opts.window_left,
             s->opts.window_right, (double)s->opts.softcap, s->opts.sinks != NULL, s->kv.num_splits, s->kv.split_size);
    t_kv_run_cpu(ctx, c);
    t_kv_free(c);
}

/* Layouts x append x splits x GQA, the mask and the rest drawn. */
static void grid(fa_context *ctx) {
    static const int pages[] = {0, 1, 16}, gqa[][2] = {{4, 4}, {8, 2}, {4, 1}}, ds[] = {64, 40, 128};
    static const fa_dtype dts[] = {FA_DTYPE_BF16, FA_DTYPE_F16, FA_DTYPE_F32};
    int n = 0;
    for (int pi = 0; pi < 3; pi++)
        for (int ap = 0; ap < 2; ap++)
            for (int sp = 0; sp < 4; sp++)
                for (int gi = 0; gi < 3; gi++, n++) {
                    t_kv_spec s = spec(dts[n % 3], 3, ap ? 1 + n % 4 : 1 + n % 3, gqa[gi][0], gqa[gi][1], ds[n % 3],
                                       300, pages[pi]);
                    s.append = ap;
                    s.rotary = ap ? n % 3 : 0;
                    s.batch_idx = n % 2;
                    t_kv_set_mask(&s, n % 5);
                    if (sp == 1) s.kv.num_splits = 1;
                    else if (sp == 2) s.kv.num_splits = 5;
                    else if (sp == 3) s.kv.split_size = 40;
                    if (n % 4 == 1) s.opts.sinks = sinks;
                    run(ctx, &s, "grid");
                }
}

/* MLA's head dims (576, 512) and a dv apart from d, through the generic rows. */
static void vdims(fa_context *ctx) {
    t_kv_spec s = spec(FA_DTYPE_BF16, 2, 2, 8, 1, 576, 90, 0);
    s.dv = 512, s.append = 1, s.opts.causal = 1;
    run(ctx, &s, "mla");
    s = spec(FA_DTYPE_F16, 2, 1, 4, 2, 96, 130, 16);
    s.dv = 64, s.kv.num_splits = 3;
    run(ctx, &s, "dv");
}

static void randoms(fa_context *ctx) {
    const char *env = getenv("FA_TEST_RANDOM");
    const int n = env && *env ? atoi(env) : 16;
    for (int i = 0; i < n; i++) {
        t_kv_spec s = t_kv_spec_random(&R, sinks);
        s.fp8 = 1;
        run(ctx, &s, "random");
    }
}

/* One bad call: the status, a message naming `arg`, and nothing written (out still poisoned, the cache as before). */
static void bad(fa_context *ctx, const char *what, const t_kv_case *c, const fa_attn_opts *o, const fa_kv_opts *ko,
                const fa_tensor *q, fa_kvcache *kc, const fa_tensor *out, fa_status want, const char *arg) {
    void *k0 = malloc(c->cache_bytes), *v0 = malloc(c->v_bytes);
    memcpy(k0, kc->k.data, c->cache_bytes);
    memcpy(v0, kc->v.data, c->v_bytes);
    t_buf_poison((t_buf *)&c->out);
    const fa_status st = fa_forward_kvcache(ctx, o, ko, q, kc, &c->kn.t, &c->vn.t, out, c->lse);
    CHECK_MSG(st == want, "%s: status %s, want %s (%s)", what, fa_status_string(st), fa_status_string(want),
              fa_context_last_error(ctx));
    CHECK_MSG(strstr(fa_context_last_error(ctx), arg) != NULL, "%s: message '%s' does not name %s", what,
              fa_context_last_error(ctx), arg);
    CHECK_MSG(t_buf_check_written(&c->out) == c->out.t.batch * c->out.t.seqlen * c->out.t.heads * c->out.t.head_dim,
              "%s: out written on error", what);
    CHECK_MSG(!memcmp(k0, kc->k.data, c->cache_bytes) && !memcmp(v0, kc->v.data, c->v_bytes),
              "%s: cache written on error", what);
    free(k0), free(v0);
}

static void errors(fa_context *ctx) {
    t_kv_spec s = spec(FA_DTYPE_BF16, 2, 1, 4, 2, 64, 40, 0);
    s.append = 1;
    t_kv_case *c = t_kv_new(&s, &R);
    snprintf(t_case_label, sizeof t_case_label, "errors");
    fa_kv_opts ko = t_kv_opts(c, NULL, NULL);
    fa_kvcache kc = t_kv_cache(c, c->kc, c->vc, c->seqlens, c->block_table, c->batch_idx);
    const fa_attn_opts o = fa_attn_opts_default();
    /* FP8 q / out: unsupported */
    t_buf q8 = t_buf_new(FA_DTYPE_F8_E4M3, 2, 1, 4, 64, T_BSHD), o8 = t_buf_new(FA_DTYPE_F8_E4M3, 2, 1, 4, 64, T_BSHD);
    t_buf_randn_r(&R, &q8, 1);
    bad(ctx, "fp8 q", c, &o, &ko, &q8.t, &kc, &c->out.t, FA_ERR_UNSUPPORTED, "q:");
    bad(ctx, "fp8 out", c, &o, &ko, &c->q.t, &kc, &o8.t, FA_ERR_UNSUPPORTED, "out:");
    /* descales not finite or <= 0 */
    static const float vals[] = {0.0f, -1.0f, NAN, INFINITY};
    float *ds = malloc(sizeof(float) * 4);
    for (int i = 0; i < 4; i++)
        for (int w = 0; w < 2; w++) {
            memcpy(ds, w ? c->v_descale : c->k_descale, sizeof(float) * 4);
            ds[3] = vals[i];
            fa_kv_opts kb = ko;
            if (w) kb.v_descale = ds;
            else kb.k_descale = ds;
            bad(ctx, "bad descale", c, &o, &kb, &c->q.t, &kc, &c->out.t, FA_ERR_INVALID_ARGUMENT,
                w ? "kv_opts.v_descale[1][1]" : "kv_opts.k_descale[1][1]");
        }
    free(ds);
    /* mismatched k / v cache dtypes */
    fa_kvcache km = kc;
    km.v.dtype = FA_DTYPE_BF16;
    bad(ctx, "k fp8, v bf16", c, &o, &ko, &c->q.t, &km, &c->out.t, FA_ERR_INVALID_ARGUMENT, "cache.v");
    /* descales in fa_attn_opts, where decoding does not read them */
    fa_attn_opts od = o;
    od.k_descale = c->k_descale;
    bad(ctx, "opts.k_descale", c, &od, &ko, &c->q.t, &kc, &c->out.t, FA_ERR_INVALID_ARGUMENT, "opts.k_descale");
    t_kv_free(c);
    /* descales with a bf16 cache */
    s.fp8 = 0;
    c = t_kv_new(&s, &R);
    float one[4] = {1, 1, 1, 1};
    fa_kv_opts kb = t_kv_opts(c, NULL, NULL);
    kb.k_descale = one;
    kc = t_kv_cache(c, c->kc, c->vc, c->seqlens, c->block_table, c->batch_idx);
    bad(ctx, "descale, bf16 cache", c, &o, &kb, &c->q.t, &kc, &c->out.t, FA_ERR_INVALID_ARGUMENT, "kv_opts.k_descale");
    t_kv_free(c);
    t_buf_free(&q8), t_buf_free(&o8);
}

/* Decoding from an FP8 cache that fa_quantize_fp8 made from a bf16 one, against decoding from the bf16 cache: both
 * against the float64 oracle on the bf16 values. E4M3 keeps 3 mantissa bits (a relative rounding error up to 2^-4
 * per element, ~0.036 rms); each output averages many values, so its error is a few times below that. */
static void accuracy(fa_context *ctx) {
    enum { B = 4, L = 1024, HQ = 8, HK = 2, D = 128 };
    t_buf q = t_buf_new_r(&R, FA_DTYPE_BF16, B, 1, HQ, D, T_BSHD), k = t_buf_new_r(&R, FA_DTYPE_BF16, B, L, HK, D, T_BSHD);
    t_buf v = t_buf_new_r(&R, FA_DTYPE_BF16, B, L, HK, D, T_BSHD), o16 = t_buf_new_r(&R, FA_DTYPE_BF16, B, 1, HQ, D, T_BSHD);
    t_buf k8 = t_buf_new_r(&R, FA_DTYPE_F8_E4M3, B, L, HK, D, T_BSHD), v8 = t_buf_new_r(&R, FA_DTYPE_F8_E4M3, B, L, HK, D, T_BSHD);
    t_buf o8 = t_buf_new_r(&R, FA_DTYPE_BF16, B, 1, HQ, D, T_BSHD);
    t_buf_randn_r(&R, &q, 1), t_buf_randn_r(&R, &k, 1), t_buf_randn_r(&R, &v, 1);
    float kds[B * HK], vds[B * HK];
    int32_t lens[B];
    for (int b = 0; b < B; b++) lens[b] = L;
    fa_quant_opts qo = fa_quant_opts_default();
    CHECK_STATUS(fa_quantize_fp8(ctx, &qo, &k.t, &k8.t, kds), FA_OK);
    CHECK_STATUS(fa_quantize_fp8(ctx, &qo, &v.t, &v8.t, vds), FA_OK);
    fa_kvcache c16 = {.k = k.t, .v = v.t, .seqlens = lens}, c8 = {.k = k8.t, .v = v8.t, .seqlens = lens};
    fa_kv_opts k16 = fa_kv_opts_default(), kf8 = fa_kv_opts_default();
    kf8.k_descale = kds, kf8.v_descale = vds;
    CHECK_STATUS(fa_forward_kvcache(ctx, NULL, &k16, &q.t, &c16, NULL, NULL, &o16.t, NULL), FA_OK);
    CHECK_STATUS(fa_forward_kvcache(ctx, NULL, &kf8, &q.t, &c8, NULL, NULL, &o8.t, NULL), FA_OK);
    double *ref = malloc(sizeof(double) * B * HQ * D);
    CHECK_STATUS(t_oracle_forward(NULL, &q.t, &k.t, &v.t, ref, NULL), FA_OK);
    double e16 = 0, e8 = 0, rr = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < HQ; h++)
            for (int x = 0; x < D; x++) {
                const double want = ref[(b * HQ + h) * D + x];
                e16 += pow(t_get(&o16.t, b, 0, h, x) - want, 2);
                e8 += pow(t_get(&o8.t, b, 0, h, x) - want, 2);
                rr += want * want;
            }
    const double n = B * HQ * D, rmse16 = sqrt(e16 / n), rmse8 = sqrt(e8 / n), rms = sqrt(rr / n);
    printf("  accuracy (B %d, L %d, hq %d, hk %d, d %d, N(0,1)): out rms %.3e; RMSE bf16 cache %.3e, fp8 cache %.3e "
           "(%.1fx)\n", B, L, HQ, HK, D, rms, rmse16, rmse8, rmse8 / rmse16);
    /* fp8 error bounded relative to the output's size (well above the measured ~0.03 · rms, far below noise) */
    CHECK_MSG(rmse8 <= 0.08 * rms, "fp8 cache RMSE %.3e above 0.08 x rms %.3e", rmse8, rms);
    CHECK_MSG(rmse16 <= rmse8, "bf16 cache RMSE %.3e above the fp8 cache's %.3e", rmse16, rmse8);
    free(ref);
    t_buf_free(&q), t_buf_free(&k), t_buf_free(&v), t_buf_free(&o16), t_buf_free(&k8), t_buf_free(&v8), t_buf_free(&o8);
}

/* Every E4M3 byte through the kernel's conversion: one key, so out = its v row exactly (P = 1), in f32; 0x7f and
 * 0xff (NaN) are left out (a NaN makes the whole row NaN), the odd dv runs the vector and the tail steps. */
static void every_byte(fa_context *ctx) {
    enum { DV = 255, D = 16 };
    uint8_t k8[D], v8[DV];
    float qv[D], out[DV];
    for (int i = 0; i < D; i++) k8[i] = (uint8_t)(0x30 + i), qv[i] = (float)t_rng_randn(&R);
    for (int i = 0; i < DV; i++) v8[i] = (uint8_t)i;
    v8[0x7f] = 0x80; /* -0 instead */
    for (int i = 0; i < DV; i++) out[i] = NAN;
    int32_t len = 1;
    fa_kvcache c = {.k = fa_tensor_bshd(k8, FA_DTYPE_F8_E4M3, 1, 1, 1, D), .v = fa_tensor_bshd(v8, FA_DTYPE_F8_E4M3, 1, 1, 1, DV),
                    .seqlens = &len};
    fa_tensor q = fa_tensor_bshd(qv, FA_DTYPE_F32, 1, 1, 1, D), o = fa_tensor_bshd(out, FA_DTYPE_F32, 1, 1, 1, DV);
    snprintf(t_case_label, sizeof t_case_label, "every byte");
    CHECK_STATUS(fa_forward_kvcache(ctx, NULL, NULL, &q, &c, NULL, NULL, &o, NULL), FA_OK);
    int bad = 0;
    for (int i = 0; i < DV; i++) bad += !(out[i] == (float)t_decode_e4m3(v8[i])); /* -0 sums to +0: values only */
    CHECK_MSG(bad == 0, "every byte: %d of %d E4M3 values converted inexactly", bad, DV);
}

/* Every E4M3 byte through the kernels' vector path (d = 256: whole vectors), q f32 and bf16: V exactly (one key: out = its v row), K one element at a time (q one-hot on element i
 * and a second key of zeros: lse = log(1 + e^(k_i / 16)) against float64), and the NaN bytes 0x7f / 0xff in K making
 * the row NaN and in V their column. */
static void every_byte_vec(fa_context *ctx) {
    enum { D = 256 };
    static uint8_t k8[2 * D], v8[2 * D], qo[2][2 * D * 4]; /* q, out: f32 or bf16 */
    int bad = 0;
    for (int t = 0; t < 2; t++) {
        const fa_dtype dt = t ? FA_DTYPE_BF16 : FA_DTYPE_F32;
        int32_t len = 1;
        float lse = 0;
        fa_kvcache c = {.k = fa_tensor_bshd(k8, FA_DTYPE_F8_E4M3, 1, 2, 1, D),
                        .v = fa_tensor_bshd(v8, FA_DTYPE_F8_E4M3, 1, 2, 1, D), .seqlens = &len};
        fa_tensor q = fa_tensor_bshd(qo[0], dt, 1, 1, 1, D), o = fa_tensor_bshd(qo[1], dt, 1, 1, 1, D);
        snprintf(t_case_label, sizeof t_case_label, "every byte, vectors, q %s", fa_dtype_name(dt));
        memset(k8, 0, sizeof k8), memset(qo[0], 0, sizeof qo[0]);
        for (int i = 0; i < D; i++) v8[i] = (uint8_t)((i & 0x7f) == 0x7f ? i & 0x80 : i); /* NaN: ±0 instead */
        for (int nan = 0; nan < 2; nan++) { /* V: the row exactly; then 0x7f at column 5: that column NaN */
            v8[5] = nan ? 0x7f : 5;
            CHECK_STATUS(fa_forward_kvcache(ctx, NULL, NULL, &q, &c, NULL, NULL, &o, NULL), FA_OK);
            for (int i = 0; i < D; i++) {
                const double got = t_load(qo[1], dt, i), want = t_decode_e4m3(v8[i]);
                bad += isnan(want) ? !isnan(got) : !(got == want);
            }
        }
        len = 2; /* K: key 0 the bytes, key 1 zeros; V zeros */
        memset(v8, 0, sizeof v8);
        for (int i = 0; i < D; i++) k8[i] = (uint8_t)((i & 0x7f) == 0x7f ? i & 0x80 : i);
        for (int i = 0; i < D; i++) {
            memset(qo[0], 0, sizeof qo[0]);
            if (t) ((uint16_t *)qo[0])[i] = 0x3f80; /* 1.0 */
            else ((float *)qo[0])[i] = 1.0f;
            CHECK_STATUS(fa_forward_kvcache(ctx, NULL, NULL, &q, &c, NULL, NULL, &o, &lse), FA_OK);
            const double want = log1p(exp(t_decode_e4m3(k8[i]) / 16));
            bad += !(fabs(lse - want) <= 1e-6 * fmax(1, want));
        }
        for (int x = 0; x < 2; x++) { /* a NaN byte anywhere in k makes the row NaN */
            k8[77] = x ? 0xff : 0x7f;
            CHECK_STATUS(fa_forward_kvcache(ctx, NULL, NULL, &q, &c, NULL, NULL, &o, &lse), FA_OK);
            bad += !isnan(lse) || !isnan(t_load(qo[1], dt, 0));
        }
    }
    CHECK_MSG(bad == 0, "every byte through the vectors: %d values differ", bad);
}

/* Leftpad, packed queries and packed new rows (test_kvcache_varlen.c holds them against the oracle on an f32 cache):
 * an FP8 cache with power-of-two descales against the f32 cache of its exact values, and new rows that E4M3 holds
 * exactly, so both calls see the same keys; the descales then scale q and O exactly, and the outputs agree to fp32
 * rounding. */
static void varlen(fa_context *ctx) {
    enum { B = 3, CAP = 48, H = 4, HK = 2, D = 32, TQ = 7, TN = 5 };
    int32_t lens[B] = {10, 0, 30}, lp[B] = {3, 0, 12}, cuq[B + 1] = {0, 3, 4, 7}, cun[B + 1] = {0, 2, 2, 5};
    float kds[B * HK], vds[B * HK];
    for (int i = 0; i < B * HK; i++) kds[i] = ldexpf(1, t_rng_int(&R, -6, -3)), vds[i] = ldexpf(1, t_rng_int(&R, -6, -3));
    const size_t n = (size_t)B * CAP * HK * D;
    uint8_t *k8 = malloc(n), *v8 = malloc(n);
    float *k32 = malloc(n * 4), *v32 = malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        const int h = (int)(i / D % HK), b = (int)(i / ((size_t)CAP * HK * D));
        k8[i] = t_encode_e4m3(t_rng_randn(&R) / kds[b * HK + h]), v8[i] = t_encode_e4m3(t_rng_randn(&R) / vds[b * HK + h]);
        k32[i] = (float)(t_decode_e4m3(k8[i]) * kds[b * HK + h]), v32[i] = (float)(t_decode_e4m3(v8[i]) * vds[b * HK + h]);
    }
    t_buf q = t_buf_new_r(&R, FA_DTYPE_F32, 1, TQ, H, D, T_BSHD), kn = t_buf_new_r(&R, FA_DTYPE_F32, 1, TN, HK, D, T_BSHD);
    t_buf vn = t_buf_new_r(&R, FA_DTYPE_F32, 1, TN, HK, D, T_BSHD), o8 = t_buf_new_r(&R, FA_DTYPE_F32, 1, TQ, H, D, T_BSHD);
    t_buf o32 = t_buf_new_r(&R, FA_DTYPE_F32, 1, TQ, H, D, T_BSHD);
    t_buf_randn_r(&R, &q, 1);
    for (int b = 0; b < B; b++) /* new rows E4M3 holds exactly at their sequence's descale */
        for (int i = cun[b]; i < cun[b + 1]; i++)
            for (int h = 0; h < HK; h++)
                for (int e = 0; e < D; e++) {
                    t_set(&kn.t, 0, i, h, e, t_decode_e4m3(t_encode_e4m3(t_rng_randn(&R) / kds[b * HK + h])) * kds[b * HK + h]);
                    t_set(&vn.t, 0, i, h, e, t_decode_e4m3(t_encode_e4m3(t_rng_randn(&R) / vds[b * HK + h])) * vds[b * HK + h]);
                }
    fa_attn_opts op = fa_attn_opts_default();
    op.causal = 1, op.n_seqs = B, op.cu_seqlens_q = cuq, op.cu_seqlens_k = cun;
    fa_kv_opts ko = fa_kv_opts_default();
    ko.cache_leftpad = lp, ko.num_splits = 3;
    fa_kvcache c32 = {.k = fa_tensor_bshd(k32, FA_DTYPE_F32, B, CAP, HK, D), .v = fa_tensor_bshd(v32, FA_DTYPE_F32, B, CAP, HK, D),
                      .seqlens = lens};
    fa_kvcache c8 = {.k = fa_tensor_bshd(k8, FA_DTYPE_F8_E4M3, B, CAP, HK, D),
                     .v = fa_tensor_bshd(v8, FA_DTYPE_F8_E4M3, B, CAP, HK, D), .seqlens = lens};
    snprintf(t_case_label, sizeof t_case_label, "fp8 leftpad + packed");
    CHECK_STATUS(fa_forward_kvcache(ctx, &op, &ko, &q.t, &c32, &kn.t, &vn.t, &o32.t, NULL), FA_OK);
    ko.k_descale = kds, ko.v_descale = vds;
    CHECK_STATUS(fa_forward_kvcache(ctx, &op, &ko, &q.t, &c8, &kn.t, &vn.t, &o8.t, NULL), FA_OK);
    CHECK(t_buf_check_written(&o8) == 0);
    double err = 0, mx = 0;
    for (int i = 0; i < TQ; i++)
        for (int h = 0; h < H; h++)
            for (int e = 0; e < D; e++) {
                const double a = t_get(&o8.t, 0, i, h, e), w = t_get(&o32.t, 0, i, h, e);
                err = fmax(err, isnan(a - w) ? INFINITY : fabs(a - w)), mx = fmax(mx, fabs(w));
            }
    int bad_cache = 0; /* the appended rows hold the exact values */
    for (size_t i = 0; i < n; i++)
        bad_cache += (float)(t_decode_e4m3(k8[i]) * kds[i / D % HK + i / ((size_t)CAP * HK * D) * HK]) != k32[i] ||
                     (float)(t_decode_e4m3(v8[i]) * vds[i / D % HK + i / ((size_t)CAP * HK * D) * HK]) != v32[i];
    CHECK_MSG(err <= 1e-6 * fmax(mx, 1), "fp8 leftpad + packed: out differs from the f32 cache's by %.3g", err);
    CHECK_MSG(bad_cache == 0, "fp8 leftpad + packed: %d cache elements differ from the f32 cache's", bad_cache);
    free(k8), free(v8), free(k32), free(v32);
    t_buf_free(&q), t_buf_free(&kn), t_buf_free(&vn), t_buf_free(&o8), t_buf_free(&o32);
}

int main(void) {
    t_rng_seed(&R, t_init("test_kvcache_fp8"));
    for (int i = 0; i < 64; i++) sinks[i] = (float)(t_rng_randn(&R) * 2);
    fa_context *ctx = t_cpu_ctx();
    errors(ctx);
    every_byte(ctx);
    every_byte_vec(ctx);
    accuracy(ctx);
    grid(ctx);
    vdims(ctx);
    varlen(ctx);
    randoms(ctx);
    fa_context_destroy(ctx);
    return t_finish();
}
