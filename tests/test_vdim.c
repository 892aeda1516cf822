/* A V head dim of its own (dv != dqk, MLA: 192 / 128 to train, 576 / 512 to decode) on the CPU: forward and
 * backward of STANDARD, FLASH1, FLASH2 (and AUTO) against the float64 oracle for pairs of head dims on both sides of each
 * other — the micro-kernels block dqk for QKᵀ and dv for PV apart — with masks, GQA, varlen, softcap, sinks, strided
 * views and forced tiles; KV-cache decoding with its own dv (contiguous, paged, splits, append, rotary) up to
 * (576, 512); the messages of mismatched head dims; the FLOPs of fa_stats. FA_TEST_RANDOM sets the random cases. */
#include "testlib.h"
#include "kvcase.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ALL (T_ALL_ALGOS | T_ALGO_BIT(FA_ALGO_AUTO))

static t_rng R;

static t_case pair(int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hk, int64_t d, int64_t dv, fa_dtype dt,
                   t_layout lq, t_layout lkv, t_layout lo) {
    t_case c = t_case_laid(b, sq, sk, hq, hk, d, dt, lq, lkv, lo);
    c.dv = dv;
    return c;
}

static void both(fa_context *ctx, const t_case *c) {
    t_run_forward(ctx, c, ALL);
    t_run_backward(ctx, c, ALL);
}

/* Hand-picked pairs: MLA's, each side larger, dims that the vector widths (8, 16, 32) divide differently, 1 and 256. */
static void named(fa_context *ctx) {
    const fa_dtype F32 = FA_DTYPE_F32, F16 = FA_DTYPE_F16, BF16 = FA_DTYPE_BF16;
    static const int pairs[][2] = {{192, 128}, {128, 192}, {64, 32}, {32, 64}, {8, 63}, {63, 8}, {1, 256}, {256, 1},
                                   {96, 80}, {80, 96}, {16, 17}, {2, 1}};
    static const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int i = 0; i < 12; i++) {
        t_case c = pair(1 + i % 2, i % 3 ? 65 : 113, i % 3 ? 113 : 65, 4, i % 2 ? 2 : 4, pairs[i][0], pairs[i][1],
                        dts[i % 3], (t_layout)(i % 3), (t_layout)((i + 1) % 3), (t_layout)((i + 2) % 3));
        c.opts.causal = i % 2;
        if (i % 4 == 3) c.opts.block_q = 16, c.opts.block_k = 24; /* many tiles, partial ones */
        both(ctx, &c);
    }
    t_case c;
    /* masks and score modifiers */
    c = pair(2, 113, 239, 4, 1, 192, 128, BF16, T_BSHD, T_BSHD, T_BSHD);
    c.opts.window_left = 40, c.opts.window_right = 4;
    both(ctx, &c);
    c = pair(1, 239, 113, 2, 2, 64, 128, F16, T_STRIDED, T_BSHD, T_BHSD);
    c.opts.window_left = 16, c.opts.causal = 1; /* sq > sk: rows that see no key */
    both(ctx, &c);
    c = pair(1, 113, 113, 4, 2, 128, 64, F32, T_BSHD, T_BSHD, T_BSHD);
    c.opts.softcap = 20, c.sigma = 2;
    both(ctx, &c);
    c = pair(1, 77, 65, 2, 1, 48, 40, F16, T_BSHD, T_BSHD, T_BSHD);
    c.opts.softcap = 8, c.opts.causal = 1, c.opts.scale = -0.2f;
    both(ctx, &c);
    /* broadcast K/V (stride_batch 0), tiles of 1 x 1 and larger than the sequence */
    c = pair(3, 64, 50, 4, 2, 32, 48, F32, T_BSHD, T_BCAST, T_BSHD);
    t_run_forward(ctx, &c, ALL);
    c = pair(1, 9, 6, 2, 2, 5, 3, F32, T_BSHD, T_BSHD, T_BSHD);
    c.opts.block_q = 1, c.opts.block_k = 1, c.opts.causal = 1;
    both(ctx, &c);
    c = pair(1, 50, 30, 1, 1, 8, 24, F32, T_BSHD, T_BSHD, T_BSHD);
    c.opts.block_q = 4096, c.opts.block_k = 4096;
    both(ctx, &c);
    /* FLASH2 forward's K/V pack (>= 32 Q blocks) and the backward's split K/V blocks (few heads, >= 16 K/V blocks) */
    c = pair(2, 200, 180, 3, 1, 40, 72, F32, T_BSHD, T_BSHD, T_BSHD);
    c.opts.block_q = 8, c.opts.block_k = 24, c.opts.causal = 1;
    t_run_forward(ctx, &c, ALL);
    c = pair(1, 150, 400, 1, 1, 24, 40, BF16, T_BSHD, T_BSHD, T_BSHD);
    c.opts.block_q = 16, c.opts.block_k = 16;
    both(ctx, &c);
    c = pair(1, 150, 400, 1, 1, 40, 24, F16, T_BSHD, T_BSHD, T_BSHD);
    c.opts.block_q = 16, c.opts.block_k = 16, c.opts.causal = 1;
    both(ctx, &c);
    /* sinks */
    c = pair(2, 65, 113, 4, 2, 192, 128, F32, T_BSHD, T_BSHD, T_BSHD);
    t_case_sinks(&c, &R, -2, 4);
    t_case_bind(&c);
    both(ctx, &c);
    c = pair(1, 113, 65, 2, 1, 32, 96, BF16, T_BHSD, T_BSHD, T_STRIDED);
    c.opts.causal = 1;
    t_case_sinks(&c, &R, -1, 3);
    t_case_bind(&c);
    both(ctx, &c);
    /* the bigger MLA shape, once */
    c = pair(1, 512, 512, 2, 1, 192, 128, BF16, T_BSHD, T_BSHD, T_BSHD);
    c.opts.causal = 1;
    both(ctx, &c);
}

/* Packed batches: the drawn varlen cases with dv != dqk (empty sequences included). */
static void varlen(fa_context *ctx) {
    const t_space sp = {113, 256, 0, 0, 0, 100, 2e6, 25, 0, 100};
    for (int i = 0; i < 6; i++) {
        t_case c = t_case_draw(&R, &sp);
        t_case_bind(&c);
        both(ctx, &c);
    }
}

static t_kv_spec kv_spec(fa_dtype dt, int batch, int sq, int hq, int hk, int d, int dv, int cap, int page) {
    t_kv_spec s;
    memset(&s, 0, sizeof s);
    s.dt = dt, s.batch = batch, s.sq = sq, s.hq = hq, s.hk = hk, s.d = d, s.dv = dv, s.capacity = cap;
    s.page_size = page;
    s.opts = fa_attn_opts_default();
    s.kv = fa_kv_opts_default();
    return s;
}

static void kv_run(fa_context *ctx, const t_kv_spec *s) {
    t_kv_case *c = t_kv_new(s, &R);
    snprintf(t_case_label, sizeof t_case_label,
             "decode %s b%d sq%d hq%d hk%d d%d dv%d cap%d page%d append%d rotary%d causal%d splits %d/%d",
             fa_dtype_name(s->dt), s->batch, s->sq, s->hq, s->hk, s->d, s->dv, s->capacity, s->page_size, s->append,
             s->rotary, s->opts.causal, s->kv.num_splits, s->kv.split_size);
    t_kv_run_cpu(ctx, c);
    t_kv_free(c);
}

/* Decoding with the cache's v of its own head_dim: MLA's absorbed (576, 512) with one K/V head, (192, 128), each side
 * larger; every dtype (bf16 pairs where both dims take them, converted rows where one does not); contiguous and
 * paged; no split, forced and fixed splits; append with rotary on q/k's dims. */
static void decode(fa_context *ctx) {
    static const int pairs[][2] = {{576, 512}, {192, 128}, {128, 192}, {64, 96}, {40, 24}, {33, 7}};
    static const fa_dtype dts[] = {FA_DTYPE_BF16, FA_DTYPE_F16, FA_DTYPE_F32};
    static const int pages[] = {0, 16, 3};
    for (int i = 0; i < 18; i++) {
        const int *pr = pairs[i % 6];
        t_kv_spec s = kv_spec(dts[i % 3], 3, i % 4 ? 1 : 4, pr[0] > 256 ? 16 : 8, pr[0] > 256 ? 1 : 2, pr[0], pr[1],
                              200, pages[i % 3]);
        s.append = i % 2;
        if (s.append && i % 4 == 1) /* rotary on q/k's dims (MLA: on its 64 rope dims) */
            s.rotary = 1 + i / 6 % 2, s.rot_dim = pr[0] > 256 ? 64 : pr[0] / 2 * 2;
        if (i % 5 == 0) s.opts.causal = 1;
        if (i % 3 == 1) s.kv.num_splits = 4;
        if (i % 3 == 2) s.kv.split_size = 48;
        kv_run(ctx, &s);
    }
    /* sinks, softcap, a window */
    t_kv_spec s = kv_spec(FA_DTYPE_BF16, 2, 2, 8, 2, 192, 128, 300, 16);
    static float sk[8] = {0.5f, -1, 2, 0, 1, -3, 0.25f, 3};
    s.opts.sinks = sk, s.kv.num_splits = 3, s.opts.causal = 1;
    kv_run(ctx, &s);
    s.opts.softcap = 5, s.opts.window_left = 40, s.kv.num_splits = 0;
    kv_run(ctx, &s);
}

/* One bad call: the status and a message with every word of want (nothing is written: t_kv and api tests check that
 * for every argument). */
static void expect(fa_context *ctx, fa_status got, fa_status want, const char *needle) {
    CHECK_MSG(got == want, "got %s, want %s (%s)", fa_status_string(got), fa_status_string(want),
              fa_context_last_error(ctx));
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), needle);
}

static void arguments(fa_context *ctx) {
    float buf[4 * 8 * 600];
    const fa_dtype F = FA_DTYPE_F32;
    fa_tensor q = fa_tensor_bshd(buf, F, 1, 4, 2, 192), k = fa_tensor_bshd(buf, F, 1, 8, 2, 192);
    fa_tensor v = fa_tensor_bshd(buf, F, 1, 8, 2, 128), o = fa_tensor_bshd(buf, F, 1, 4, 2, 64);
    float lse[8];
    expect(ctx, fa_forward(ctx, NULL, &q, &k, &v, &o, lse), FA_ERR_INVALID_ARGUMENT,
           "out: head_dim 64 must equal v's head_dim 128");
    o = fa_tensor_bshd(buf, F, 1, 4, 2, 128);
    fa_tensor dout = o, dq = q, dk = k, dv = v;
    dout.head_dim = 192;
    expect(ctx, fa_backward(ctx, NULL, &q, &k, &v, &o, lse, &dout, &dq, &dk, &dv), FA_ERR_INVALID_ARGUMENT,
           "dout: head_dim 192 must equal out's head_dim 128");
    dout.head_dim = 128, dv = fa_tensor_bshd(buf, F, 1, 8, 2, 192);
    expect(ctx, fa_backward(ctx, NULL, &q, &k, &v, &o, lse, &dout, &dq, &dk, &dv), FA_ERR_INVALID_ARGUMENT,
           "dv: head_dim 192 must equal v's head_dim 128");
    dv = v, dq.head_dim = 128;
    expect(ctx, fa_backward(ctx, NULL, &q, &k, &v, &o, lse, &dout, &dq, &dk, &dv), FA_ERR_INVALID_ARGUMENT,
           "dq: head_dim 128 must equal q's head_dim 192");
    v.head_dim = 300, o.head_dim = 300;
    expect(ctx, fa_forward(ctx, NULL, &q, &k, &v, &o, lse), FA_ERR_UNSUPPORTED, "v: head_dim 300");

    /* decoding: q/k up to 576, v up to 512 */
    int32_t lens[1] = {3};
    fa_kvcache cache;
    memset(&cache, 0, sizeof cache);
    cache.k = fa_tensor_bshd(buf, F, 1, 4, 1, 576), cache.v = fa_tensor_bshd(buf, F, 1, 4, 1, 512);
    cache.seqlens = lens;
    fa_tensor dq1 = fa_tensor_bshd(buf, F, 1, 1, 2, 576), dout1 = fa_tensor_bshd(buf, F, 1, 1, 2, 576);
    expect(ctx, fa_forward_kvcache(ctx, NULL, NULL, &dq1, &cache, NULL, NULL, &dout1, NULL), FA_ERR_INVALID_ARGUMENT,
           "out: head_dim 576 must equal cache.v's head_dim 512");
    cache.v.head_dim = 520;
    expect(ctx, fa_forward_kvcache(ctx, NULL, NULL, &dq1, &cache, NULL, NULL, &dout1, NULL), FA_ERR_UNSUPPORTED,
           "cache.v: head_dim 520");
    q.head_dim = 600, cache.k.head_dim = 600;
    expect(ctx, fa_forward_kvcache(ctx, NULL, NULL, &q, &cache, NULL, NULL, &dout1, NULL), FA_ERR_UNSUPPORTED,
           "q: head_dim 600");
    cache.k.head_dim = 192, cache.v.head_dim = 128, q.head_dim = 192;
    fa_tensor kn = fa_tensor_bshd(buf, F, 1, 4, 1, 192), vn = fa_tensor_bshd(buf, F, 1, 4, 1, 192);
    fa_tensor on = fa_tensor_bshd(buf, F, 1, 4, 2, 128);
    cache.k = fa_tensor_bshd(buf, F, 1, 8, 1, 192), cache.v = fa_tensor_bshd(buf, F, 1, 8, 1, 128);
    expect(ctx, fa_forward_kvcache(ctx, NULL, NULL, &q, &cache, &kn, &vn, &on, NULL), FA_ERR_INVALID_ARGUMENT,
           "v_new: head_dim 192 must equal cache.v's head_dim 128");
}

/* fa_stats.flops counts 2·dqk per pair for QKᵀ and 2·dv for PV (x2.5 backward). */
static void flops(fa_context *ctx) {
    t_buf q = t_buf_new(FA_DTYPE_F32, 1, 16, 2, 64, T_BSHD), k = t_buf_new(FA_DTYPE_F32, 1, 16, 2, 64, T_BSHD);
    t_buf v = t_buf_new(FA_DTYPE_F32, 1, 16, 2, 32, T_BSHD), o = t_buf_new(FA_DTYPE_F32, 1, 16, 2, 32, T_BSHD);
    t_buf_randn(&q, 1), t_buf_randn(&k, 1), t_buf_randn(&v, 1);
    CHECK_STATUS(fa_forward(ctx, NULL, &q.t, &k.t, &v.t, &o.t, NULL), FA_OK);
    fa_stats st;
    CHECK_STATUS(fa_last_stats(ctx, &st), FA_OK);
    CHECK_LE(fabs(st.flops - 2.0 * (64 + 32) * 2 * 16 * 16), 0.5);
    t_buf_free(&q), t_buf_free(&k), t_buf_free(&v), t_buf_free(&o);
}

int main(void) {
    const uint64_t seed = t_init("test_vdim");
    t_rng_seed(&R, seed);
    fa_context *ctx = t_cpu_ctx();
    arguments(ctx);
    flops(ctx);
    named(ctx);
    varlen(ctx);
    decode(ctx);
    /* random cases: every one with its own dv; masks, GQA, varlen, softcap, sinks, layouts and dtypes drawn */
    int n = 12;
    const char *env = getenv("FA_TEST_RANDOM");
    if (env) n = atoi(env);
    const t_space sp = {239, 256, 1, 1, 0, 20, 2e6, 25, 0, 100};
    for (int i = 0; i < n; i++) {
        t_case c = t_case_draw(&R, &sp);
        t_case_bind(&c);
        both(ctx, &c);
    }
    fa_context_destroy(ctx);
    return t_finish();
}
