/* Learnable attention sinks (opts.sinks, opts.d_sinks) on the CPU against the float64 oracle: forward and backward
 * (d sinks included) of every algorithm with masks, GQA, varlen, softcap and every dtype; rows that see no key (O = 0,
 * LSE = the sink, zero gradients); a sink of -inf (no sink) and of NaN (the head's rows NaN); the merge of split
 * states with the sink in exactly one of them, or as a state of its own; KV-cache decoding with and without splits,
 * contiguous and paged; the arguments' checks (nothing written on error, an older opts without the fields).
 * FA_TEST_RANDOM sets the number of random cases. */
#include "testlib.h"
#include "kvcase.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define ALL (T_ALL_ALGOS | T_ALGO_BIT(FA_ALGO_AUTO))

static t_rng R;

static t_case with_sinks(t_case c) {
    t_case_sinks(&c, &R, -2, 4);
    return c;
}

/* Hand-picked cases: each runs forward and backward of every algorithm (t_run_* bind the case's sinks). */
static void named(fa_context *ctx) {
    const fa_dtype F32 = FA_DTYPE_F32, F16 = FA_DTYPE_F16, BF16 = FA_DTYPE_BF16;
    t_case cs[8];
    cs[0] = with_sinks(t_case_laid(2, 17, 31, 4, 2, 16, F32, T_BSHD, T_BHSD, T_STRIDED));
    cs[1] = with_sinks(t_case_make(1, 8, 3, 2, 1, 8, F32)); /* causal: rows 0..4 see no key */
    cs[1].opts.causal = 1;
    cs[2] = with_sinks(t_case_make(2, 65, 113, 8, 2, 64, BF16));
    cs[2].opts.window_left = 7, cs[2].opts.window_right = 3;
    cs[3] = with_sinks(t_case_make(1, 113, 64, 4, 4, 80, F16));
    cs[3].opts.softcap = 20, cs[3].opts.causal = 1;
    cs[4] = with_sinks(t_case_make(1, 1, 239, 8, 1, 128, F32)); /* decoding shape, MQA */
    cs[5] = with_sinks(t_case_make(2, 31, 17, 2, 2, 31, F32));
    cs[5].sinks[1] = -INFINITY; /* no sink for head 1: zero gradient */
    cs[5].opts.block_q = 5, cs[5].opts.block_k = 7;
    cs[6] = with_sinks(t_case_make(1, 64, 64, 2, 1, 32, F32));
    cs[6].sinks[0] = 40, cs[6].sinks[1] = -40; /* nearly all weight on the sink; next to none */
    cs[7] = with_sinks(t_case_make(1, 48, 48, 4, 2, 64, BF16));
    cs[7].opts.causal = 1, cs[7].opts.scale = -0.2f;
    for (int i = 0; i < 8; i++) {
        t_case_bind(&cs[i]);
        t_run_forward(ctx, &cs[i], ALL);
        t_run_backward(ctx, &cs[i], ALL);
    }
}

/* Packed batches with empty query and key sequences: a sequence without keys is all sink. */
static void varlen(fa_context *ctx) {
    t_case c = with_sinks(t_case_make(1, 0, 0, 4, 2, 32, FA_DTYPE_F32));
    static const int lq[4] = {5, 0, 9, 3}, lk[4] = {7, 4, 0, 11};
    c.cu_q[0] = c.cu_k[0] = 0;
    for (int s = 0; s < 4; s++) c.cu_q[s + 1] = c.cu_q[s] + lq[s], c.cu_k[s + 1] = c.cu_k[s] + lk[s];
    c.sq = c.cu_q[4], c.sk = c.cu_k[4], c.opts.n_seqs = 4, c.opts.causal = 1;
    t_case_bind(&c);
    t_run_forward(ctx, &c, ALL);
    t_run_backward(ctx, &c, ALL);
}

/* Rows that see no key: out exactly 0, LSE exactly the sink, dq rows exactly 0; NaN sink: exactly that head NaN. */
static void masked_rows(fa_context *ctx) {
    static const fa_algo algos[3] = {FA_ALGO_STANDARD, FA_ALGO_FLASH1, FA_ALGO_FLASH2};
    const int64_t S = 8, Sk = 3, H = 2, D = 8; /* causal: row i sees keys j <= i - 5 */
    float sinks[2] = {0.75f, -1.5f}, lse[2 * 8], ds[2];
    for (int a = 0; a < 3; a++) {
        snprintf(t_case_label, sizeof t_case_label, "masked rows %s", fa_algo_name(algos[a]));
        t_buf q = t_buf_new_r(&R, FA_DTYPE_F32, 1, S, H, D, T_BSHD), k = t_buf_new_r(&R, FA_DTYPE_F32, 1, Sk, H, D, T_BSHD);
        t_buf v = t_buf_new_r(&R, FA_DTYPE_F32, 1, Sk, H, D, T_BSHD), o = t_buf_new_r(&R, FA_DTYPE_F32, 1, S, H, D, T_BSHD);
        t_buf dO = t_buf_new_r(&R, FA_DTYPE_F32, 1, S, H, D, T_BSHD), dq = t_buf_new_r(&R, FA_DTYPE_F32, 1, S, H, D, T_BSHD);
        t_buf dk = t_buf_new_r(&R, FA_DTYPE_F32, 1, Sk, H, D, T_BSHD), dv = t_buf_new_r(&R, FA_DTYPE_F32, 1, Sk, H, D, T_BSHD);
        t_buf_randn_r(&R, &q, 1), t_buf_randn_r(&R, &k, 1), t_buf_randn_r(&R, &v, 1), t_buf_randn_r(&R, &dO, 1);
        fa_attn_opts opts = fa_attn_opts_default();
        opts.causal = 1, opts.algo = algos[a], opts.sinks = sinks, opts.d_sinks = ds;
        CHECK_STATUS(fa_forward(ctx, &opts, &q.t, &k.t, &v.t, &o.t, lse), FA_OK);
        CHECK_STATUS(fa_backward(ctx, &opts, &q.t, &k.t, &v.t, &o.t, lse, &dO.t, &dq.t, &dk.t, &dv.t), FA_OK);
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < S - Sk; i++) {
                CHECK_MSG(lse[h * S + i] == sinks[h], "head %lld row %lld: lse %g, want the sink %g", (long long)h,
                          (long long)i, lse[h * S + i], sinks[h]);
                for (int64_t x = 0; x < D; x++) {
                    CHECK_MSG(t_get(&o.t, 0, i, h, x) == 0, "out of a row without keys is not 0");
                    CHECK_MSG(t_get(&dq.t, 0, i, h, x) == 0, "dq of a row without keys is not 0");
                }
            }
        /* a NaN sink makes its head's rows NaN (out and LSE) and leaves the other head as it was */
        float lse2[2 * 8];
        sinks[0] = NAN;
        CHECK_STATUS(fa_forward(ctx, &opts, &q.t, &k.t, &v.t, &o.t, lse2), FA_OK);
        for (int64_t i = 0; i < S; i++) {
            CHECK_MSG(isnan(lse2[i]) && isnan(t_get(&o.t, 0, i, 0, 0)), "row %lld of a NaN sink's head is not NaN",
                      (long long)i);
            CHECK_MSG(lse2[S + i] == lse[S + i], "row %lld of the other head changed", (long long)i);
        }
        sinks[0] = 0.75f;
        t_buf_free(&q), t_buf_free(&k), t_buf_free(&v), t_buf_free(&o);
        t_buf_free(&dO), t_buf_free(&dq), t_buf_free(&dk), t_buf_free(&dv);
    }
}

/* Key ranges [0, 70) with the sinks and [70, 200) without merge into the call over all keys with the sinks; so do
 * both ranges without sinks and the sink as a state of its own (out = 0 through zero strides, lse = the sink). */
static void merge(fa_context *ctx) {
    enum { B = 2, Sq = 5, Sk = 200, H = 4, D = 32, N = B * H * Sq };
    snprintf(t_case_label, sizeof t_case_label, "merge with sinks");
    float sinks[H] = {1.5f, -0.5f, 3.0f, 0.0f}, la[N], lb[N], lc[N], lm[N];
    t_buf q = t_buf_new_r(&R, FA_DTYPE_F32, B, Sq, H, D, T_BSHD), k = t_buf_new_r(&R, FA_DTYPE_F32, B, Sk, H, D, T_BSHD);
    t_buf v = t_buf_new_r(&R, FA_DTYPE_F32, B, Sk, H, D, T_BSHD);
    t_buf_randn_r(&R, &q, 1), t_buf_randn_r(&R, &k, 1), t_buf_randn_r(&R, &v, 1);
    t_buf pa = t_buf_new_r(&R, FA_DTYPE_F32, B, Sq, H, D, T_BSHD), pb = t_buf_new_r(&R, FA_DTYPE_F32, B, Sq, H, D, T_BSHD);
    t_buf pc = t_buf_new_r(&R, FA_DTYPE_F32, B, Sq, H, D, T_BSHD), m = t_buf_new_r(&R, FA_DTYPE_F32, B, Sq, H, D, T_BSHD);
    fa_tensor ka = k.t, va = v.t, kb = k.t, vb = v.t;
    ka.seqlen = va.seqlen = 70;
    kb.data = (float *)k.t.data + 70 * k.t.stride_seq, vb.data = (float *)v.t.data + 70 * v.t.stride_seq;
    kb.seqlen = vb.seqlen = Sk - 70;
    fa_attn_opts plain = fa_attn_opts_default(), sunk = plain;
    sunk.sinks = sinks;
    CHECK_STATUS(fa_forward(ctx, &sunk, &q.t, &ka, &va, &pa.t, la), FA_OK);
    CHECK_STATUS(fa_forward(ctx, &plain, &q.t, &kb, &vb, &pb.t, lb), FA_OK);
    double *ref = malloc(sizeof(double) * B * Sq * H * D), *rl = malloc(sizeof(double) * N);
    CHECK_STATUS(t_oracle_forward(&sunk, &q.t, &k.t, &v.t, ref, rl), FA_OK);
    fa_tensor two[2] = {pa.t, pb.t};
    const float *two_l[2] = {la, lb};
    CHECK_STATUS(fa_merge_states(ctx, 2, two, two_l, &m.t, lm), FA_OK);
    CHECK_LE(t_max_diff(&m.t, ref), 1e-5 * t_max_abs(ref, B * Sq * H * D) + 1e-6);
    CHECK_LE(t_max_diff_f(lm, rl, N), 1e-5 * t_lse_scale(rl, N));
    /* the sink as a third state: a zero out of zero strides (one row of D zeros), its lse the head's sink */
    static const float zero[D];
    const fa_tensor z = {(void *)zero, FA_DTYPE_F32, B, Sq, H, D, 0, 0, 0};
    float ls[N];
    for (int i = 0; i < N; i++) ls[i] = sinks[i / Sq % H];
    CHECK_STATUS(fa_forward(ctx, &plain, &q.t, &ka, &va, &pc.t, lc), FA_OK);
    fa_tensor three[3] = {pc.t, pb.t, z};
    const float *three_l[3] = {lc, lb, ls};
    CHECK_STATUS(fa_merge_states(ctx, 3, three, three_l, &m.t, lm), FA_OK);
    CHECK_LE(t_max_diff(&m.t, ref), 1e-5 * t_max_abs(ref, B * Sq * H * D) + 1e-6);
    CHECK_LE(t_max_diff_f(lm, rl, N), 1e-5 * t_lse_scale(rl, N));
    free(ref), free(rl);
    t_buf_free(&q), t_buf_free(&k), t_buf_free(&v), t_buf_free(&pa), t_buf_free(&pb), t_buf_free(&pc), t_buf_free(&m);
}

/* Decoding: contiguous and paged caches, no split, n splits and fixed splits (the sink joins once, after the merge),
 * GQA, append, masks, every dtype. */
static void decode(fa_context *ctx) {
    static float sinks[32];
    for (int h = 0; h < 32; h++) sinks[h] = (float)(-2 + 6 * t_rng_uniform(&R));
    sinks[3] = -INFINITY;
    static const fa_dtype dts[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int n = 0; n < 12; n++) {
        t_kv_spec s;
        memset(&s, 0, sizeof s);
        s.dt = dts[n % 3], s.batch = 3, s.sq = (int[]){1, 4, 1}[n % 3], s.hq = n % 2 ? 32 : 8, s.hk = n % 2 ? 8 : 8;
        s.d = (int[]){64, 32, 128}[n % 3], s.capacity = 300, s.page_size = (int[]){0, 16, 3, 0}[n % 4];
        s.append = n % 3 != 2;
        s.opts = fa_attn_opts_default();
        s.opts.sinks = sinks;
        s.opts.causal = n % 2;
        if (n % 5 == 4) s.opts.softcap = 5;
        s.kv = fa_kv_opts_default();
        if (n % 3 == 1) s.kv.num_splits = 4;
        if (n % 3 == 2) s.kv.split_size = 64;
        t_kv_case *c = t_kv_new(&s, &R);
        snprintf(t_case_label, sizeof t_case_label, "decode with sinks: %s b%d sq%d hq%d hk%d d%d page%d splits %d/%d",
                 fa_dtype_name(s.dt), s.batch, s.sq, s.hq, s.hk, s.d, s.page_size, s.kv.num_splits, s.kv.split_size);
        t_kv_run_cpu(ctx, c);
        t_kv_free(c);
    }
}

/* The arguments: messages name them, nothing is written on error, and an opts from an older header has no sinks. */
static void arguments(fa_context *ctx) {
    snprintf(t_case_label, sizeof t_case_label, "sink arguments");
    enum { S = 4, H = 2, D = 8 };
    float q[S * H * D], k[S * H * D], v[S * H * D], o[S * H * D], dO[S * H * D], dq[S * H * D], dk[S * H * D],
        dv[S * H * D], lse[H * S], sinks[H] = {0.5f, 1}, ds[H];
    for (int i = 0; i < S * H * D; i++) q[i] = k[i] = v[i] = dO[i] = (float)(i % 7) * 0.1f;
    fa_tensor tq = fa_tensor_bshd(q, FA_DTYPE_F32, 1, S, H, D), tk = fa_tensor_bshd(k, FA_DTYPE_F32, 1, S, H, D),
              tv = fa_tensor_bshd(v, FA_DTYPE_F32, 1, S, H, D), to = fa_tensor_bshd(o, FA_DTYPE_F32, 1, S, H, D),
              tdo = fa_tensor_bshd(dO, FA_DTYPE_F32, 1, S, H, D), tdq = fa_tensor_bshd(dq, FA_DTYPE_F32, 1, S, H, D),
              tdk = fa_tensor_bshd(dk, FA_DTYPE_F32, 1, S, H, D), tdv = fa_tensor_bshd(dv, FA_DTYPE_F32, 1, S, H, D);
    fa_attn_opts opts = fa_attn_opts_default();
    opts.sinks = sinks;
    CHECK_STATUS(fa_forward(ctx, &opts, &tq, &tk, &tv, &to, lse), FA_OK);
    /* d_sinks without sinks */
    fa_attn_opts bad = fa_attn_opts_default();
    bad.d_sinks = ds;
    ds[0] = ds[1] = 7;
    CHECK_STATUS(fa_backward(ctx, &bad, &tq, &tk, &tv, &to, lse, &tdo, &tdq, &tdk, &tdv), FA_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fa_context_last_error(ctx), "opts.d_sinks") != NULL);
    CHECK(ds[0] == 7 && ds[1] == 7);
    /* d_sinks over dq; sinks over out */
    bad = opts, bad.d_sinks = dq;
    CHECK_STATUS(fa_backward(ctx, &bad, &tq, &tk, &tv, &to, lse, &tdo, &tdq, &tdk, &tdv), FA_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fa_context_last_error(ctx), "opts.d_sinks: memory overlaps dq") != NULL);
    bad = opts, bad.sinks = o + 3;
    CHECK_STATUS(fa_forward(ctx, &bad, &tq, &tk, &tv, &to, lse), FA_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fa_context_last_error(ctx), "opts.sinks") != NULL);
    bad = opts, bad.sinks = dk;
    CHECK_STATUS(fa_backward(ctx, &bad, &tq, &tk, &tv, &to, lse, &tdo, &tdq, &tdk, &tdv), FA_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fa_context_last_error(ctx), "dk: memory overlaps opts.sinks") != NULL);
    /* the forward ignores d_sinks; the backward writes it */
    opts.d_sinks = ds;
    CHECK_STATUS(fa_forward(ctx, &opts, &tq, &tk, &tv, &to, lse), FA_OK);
    CHECK(ds[0] == 7);
    CHECK_STATUS(fa_backward(ctx, &opts, &tq, &tk, &tv, &to, lse, &tdo, &tdq, &tdk, &tdv), FA_OK);
    CHECK(isfinite(ds[0]) && ds[0] != 7 && isfinite(ds[1]));
    /* a caller built before the fields: struct_size ends before sinks; what follows is not read */
    fa_attn_opts old = opts;
    old.struct_size = offsetof(fa_attn_opts, sinks);
    float lse_old[H * S];
    CHECK_STATUS(fa_forward(ctx, &old, &tq, &tk, &tv, &to, lse_old), FA_OK);
    fa_attn_opts none = fa_attn_opts_default();
    float lse_none[H * S];
    CHECK_STATUS(fa_forward(ctx, &none, &tq, &tk, &tv, &to, lse_none), FA_OK);
    CHECK(!memcmp(lse_old, lse_none, sizeof lse_old) && memcmp(lse_old, lse, sizeof lse));
    /* decoding: sinks over out */
    fa_kvcache cache;
    memset(&cache, 0, sizeof cache);
    const int32_t lens[1] = {S};
    cache.k = tk, cache.v = tv, cache.seqlens = lens;
    fa_tensor q1 = fa_tensor_bshd(q, FA_DTYPE_F32, 1, 1, H, D), o1 = fa_tensor_bshd(o, FA_DTYPE_F32, 1, 1, H, D);
    bad = fa_attn_opts_default(), bad.sinks = o;
    CHECK_STATUS(fa_forward_kvcache(ctx, &bad, NULL, &q1, &cache, NULL, NULL, &o1, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fa_context_last_error(ctx), "opts.sinks") != NULL);
}

int main(void) {
    const uint64_t seed = t_init("test_sinks");
    t_rng_seed(&R, seed);
    fa_context *ctx = t_cpu_ctx();
    named(ctx);
    varlen(ctx);
    masked_rows(ctx);
    merge(ctx);
    decode(ctx);
    arguments(ctx);
    /* random cases: masks, GQA, varlen, softcap, layouts and dtypes drawn, every one with sinks */
    int n = 12;
    const char *env = getenv("FA_TEST_RANDOM");
    if (env) n = atoi(env);
    const t_space sp = {239, 128, 1, 0, 0, 25, 2e6, 100, 0, 0};
    for (int i = 0; i < n; i++) {
        t_case c = t_case_draw(&R, &sp);
        t_case_bind(&c);
        t_run_forward(ctx, &c, ALL);
        t_run_backward(ctx, &c, ALL);
    }
    fa_context_destroy(ctx);
    return t_finish();
}
