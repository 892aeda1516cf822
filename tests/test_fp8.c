/* FP8 (E4M3) on the CPU against the float64 oracle: the forward of every algorithm on FP8 q, k, v with descales
 * (GQA, masks, softcap, sinks, varlen, strided views) into f32, f16 and bf16 outputs, held to the rule of
 * tolerance.h in the output's dtype (STANDARD on the same FP8 inputs is the baseline); fa_quantize_fp8 bit for bit
 * against a test-side quantiser (per head, per block, grouped heads, per tensor, the Hadamard rotation), saturation
 * and NaN; the arguments' checks (nothing written on error). FA_TEST_RANDOM sets the number of random cases. */
#include "testlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const fa_dtype E4M3 = FA_DTYPE_F8_E4M3;

/* ---- the forward ---- */

typedef struct fp8_case {
    int64_t b, sq, sk, hq, hk, d;
    t_layout lay;
    fa_attn_opts opts;
    int varlen;       /* b = 1 with 3 packed sequences (one of them empty) */
    int no_descale;   /* leave the descales NULL (= 1) */
} fp8_case;

/* E4M3 values that use the whole range: x = sigma·N(0,1) stored, descales drawn from [0.01, 2]. */
static void fill_fp8(t_buf *x, double sigma) {
    const fa_tensor *t = &x->t;
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seqlen; s++)
            for (int64_t h = 0; h < t->heads; h++)
                for (int64_t i = 0; i < t->head_dim; i++) t_set(t, b, s, h, i, sigma * t_randn());
}

static void run_case(fa_context *ctx, const fp8_case *c, fa_dtype odt) {
    int32_t cu_q[4] = {0, c->sq / 3, c->sq / 3, c->sq}, cu_k[4] = {0, c->sk / 2, c->sk / 2 + 1, c->sk};
    const int64_t nseq = c->varlen ? 3 : c->b;
    fa_attn_opts o = c->opts;
    if (c->varlen) o.cu_seqlens_q = cu_q, o.cu_seqlens_k = cu_k, o.n_seqs = 3;
    t_buf q = t_buf_new(E4M3, c->b, c->sq, c->hq, c->d, c->lay), k = t_buf_new(E4M3, c->b, c->sk, c->hk, c->d, c->lay),
          v = t_buf_new(E4M3, c->b, c->sk, c->hk, c->d, T_BSHD);
    fill_fp8(&q, 40), fill_fp8(&k, 40), fill_fp8(&v, 100);
    float *ds = malloc(sizeof(float) * 3 * (size_t)(nseq * c->hk));
    for (int64_t i = 0; i < 3 * nseq * c->hk; i++) ds[i] = (float)(0.01 + 1.99 * t_uniform());
    if (!c->no_descale) /* q·k ≈ 40² · d · descale²: scales that keep the logits O(1) */
        o.q_descale = ds, o.k_descale = ds + nseq * c->hk, o.v_descale = ds + 2 * nseq * c->hk;
    for (int64_t i = 0; !c->no_descale && i < 2 * nseq * c->hk; i++) ds[i] *= (float)(0.05 / sqrt((double)c->d));
    const int64_t n = c->b * c->sq * c->hq * c->d, nl = c->b * c->hq * c->sq;
    double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1)), *lref = malloc(sizeof(double) * (size_t)(nl ? nl : 1));
    CHECK_STATUS(t_oracle_forward(&o, &q.t, &k.t, &v.t, ref, lref), FA_OK);
    const double refmax = t_max_abs(ref, n), lscale = t_lse_scale(lref, nl);
    static const fa_algo algos[4] = {FA_ALGO_STANDARD, FA_ALGO_FLASH1, FA_ALGO_FLASH2, FA_ALGO_AUTO};
    double err_std = 0, lerr_std = 0;
    for (int a = 0; a < 4; a++) {
        snprintf(t_case_label, sizeof t_case_label, "fp8 b%lld sq%lld sk%lld hq%lld hk%lld d%lld %s%s out %s algo %s",
                 (long long)c->b, (long long)c->sq, (long long)c->sk, (long long)c->hq, (long long)c->hk,
                 (long long)c->d, t_layout_name(c->lay), c->varlen ? " varlen" : "", fa_dtype_name(odt),
                 fa_algo_name(algos[a]));
        t_buf out = t_buf_new(odt, c->b, c->sq, c->hq, c->d, c->lay);
        float *lse = malloc(sizeof(float) * (size_t)(nl ? nl : 1));
        for (int64_t i = 0; i < nl; i++) lse[i] = t_nanf();
        o.algo = algos[a];
        CHECK_STATUS(fa_forward(ctx, &o, &q.t, &k.t, &v.t, &out.t, lse), FA_OK);
        CHECK_EQ_INT(t_buf_check_written(&out), 0);
        fa_stats st;
        if (fa_last_stats(ctx, &st) == FA_OK && nl && c->sk) {
            CHECK_MSG(!strncmp(st.kernel, "cpu.fp8.", 8), "kernel %s is not an FP8 one", st.kernel);
            t_check_cpu_level(st.kernel);
        }
        const double err = t_max_diff(&out.t, ref), lerr = t_max_diff_f(lse, lref, nl);
        if (a == 0) err_std = err, lerr_std = lerr;
        t_check_err("out", algos[a], odt, err, err_std, refmax, 0, 1);
        const t_verdict lv = t_judge_lse(a == 0, lerr, lerr_std, lscale);
        CHECK_MSG(lv.ok, "lse: err %g allowed %g", lerr, lv.allowed);
        free(lse);
        t_buf_free(&out);
    }
    free(ref), free(lref), free(ds);
    t_buf_free(&q), t_buf_free(&k), t_buf_free(&v);
}

static void forward(fa_context *ctx) {
    fp8_case cs[8];
    memset(cs, 0, sizeof cs);
    for (int i = 0; i < 8; i++) cs[i].opts = fa_attn_opts_default();
    cs[0] = (fp8_case){2, 17, 31, 4, 2, 16, T_BSHD, cs[0].opts, 0, 0};
    cs[1] = (fp8_case){1, 113, 239, 8, 1, 64, T_STRIDED, cs[1].opts, 0, 0};
    cs[1].opts.causal = 1;
    cs[2] = (fp8_case){2, 65, 64, 4, 4, 128, T_BHSD, cs[2].opts, 0, 0};
    cs[2].opts.window_left = 9, cs[2].opts.window_right = 2, cs[2].opts.softcap = 15;
    cs[3] = (fp8_case){1, 40, 50, 6, 2, 80, T_BSHD, cs[3].opts, 1, 0}; /* varlen, an empty sequence */
    cs[4] = (fp8_case){1, 1, 300, 8, 2, 256, T_BSHD, cs[4].opts, 0, 0}; /* decoding shape */
    cs[5] = (fp8_case){1, 9, 9, 1, 1, 3, T_STRIDED, cs[5].opts, 0, 1};   /* descales NULL */
    cs[5].opts.scale = 0.002f;
    cs[6] = (fp8_case){2, 0, 5, 2, 1, 8, T_BSHD, cs[6].opts, 0, 0};     /* no query rows: zero fill */
    cs[7] = (fp8_case){1, 33, 47, 4, 2, 32, T_BSHD, cs[7].opts, 0, 0};
    static float sinks[4] = {0.5f, -1.0f, 2.0f, -INFINITY};
    cs[7].opts.sinks = sinks;
    static const fa_dtype outs[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 3; j++) run_case(ctx, &cs[i], outs[j]);
    const char *env = getenv("FA_TEST_RANDOM");
    const int nrand = env ? atoi(env) : 12;
    for (int r = 0; r < nrand; r++) {
        fp8_case c;
        memset(&c, 0, sizeof c);
        c.opts = fa_attn_opts_default();
        static const int dims[6] = {1, 8, 31, 64, 96, 128};
        c.hk = t_randint(1, 3), c.hq = c.hk * t_randint(1, 3), c.d = dims[t_randint(0, 5)];
        c.b = t_randint(1, 2), c.sq = t_randint(1, 90), c.sk = t_randint(1, 90);
        c.lay = (t_layout)t_randint(0, 2), c.opts.causal = t_randint(0, 1);
        if (t_randint(0, 3) == 0) c.opts.softcap = 10;
        if (t_randint(0, 4) == 0) c.varlen = 1, c.b = 1, c.sq = c.sq < 3 ? 3 : c.sq, c.sk = c.sk < 3 ? 3 : c.sk;
        run_case(ctx, &c, outs[t_randint(0, 2)]);
    }
}

/* A NaN (0x7f) in one q row makes exactly that row NaN (the numerics contract), every other row as the oracle. */
static void nan_input(fa_context *ctx) {
    snprintf(t_case_label, sizeof t_case_label, "fp8 NaN in q");
    t_buf q = t_buf_new(E4M3, 1, 5, 1, 8, T_BSHD), k = t_buf_new(E4M3, 1, 6, 1, 8, T_BSHD),
          v = t_buf_new(E4M3, 1, 6, 1, 8, T_BSHD), out = t_buf_new(FA_DTYPE_BF16, 1, 5, 1, 8, T_BSHD);
    fill_fp8(&q, 0.5), fill_fp8(&k, 0.5), fill_fp8(&v, 1);
    ((uint8_t *)q.t.data)[2 * 8 + 3] = 0x7f;
    fa_attn_opts o = fa_attn_opts_default();
    CHECK_STATUS(fa_forward(ctx, &o, &q.t, &k.t, &v.t, &out.t, NULL), FA_OK);
    for (int64_t s = 0; s < 5; s++) CHECK(isnan(t_get(&out.t, 0, s, 0, 0)) == (s == 2));
    t_buf_free(&q), t_buf_free(&k), t_buf_free(&v), t_buf_free(&out);
}

/* ---- fa_quantize_fp8 against a quantiser written here ---- */

/* The rotation as flashattn.h defines it: signs from splitmix64(seed + golden·(j+1)), the butterflies h = 1, 2, 4 ...
 * in place, then 1/sqrt(n). */
static void t_rotate(double *x, int64_t n, uint64_t seed) {
    for (int64_t j = 0; j < n; j++) {
        uint64_t z = seed + 0x9e3779b97f4a7c15ull * (uint64_t)(j + 1);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        if ((z ^ (z >> 31)) & 1) x[j] = -x[j];
    }
    for (int64_t h = 1; h < n; h *= 2)
        for (int64_t i = 0; i < n; i += 2 * h)
            for (int64_t j = i; j < i + h; j++) {
                const double a = x[j], b = x[j + h];
                x[j] = a + b, x[j + h] = a - b;
            }
    for (int64_t j = 0; j < n; j++) x[j] = x[j] * (1.0 / sqrt((double)n));
}

static float t_descale_of(float amax) {
    const float d = (float)((double)amax / 448.0);
    return d > 0 ? d : 1.0f;
}

static void quant_case(fa_context *ctx, fa_dtype xdt, int64_t B, int64_t S, int64_t H, int64_t D, t_layout lay,
                       const fa_quant_opts *qo) {
    snprintf(t_case_label, sizeof t_case_label, "quantize %s b%lld s%lld h%lld d%lld %s block %lld group %lld%s%s",
             fa_dtype_name(xdt), (long long)B, (long long)S, (long long)H, (long long)D, t_layout_name(lay),
             (long long)qo->block_rows, (long long)qo->heads_per_scale, qo->per_tensor ? " per-tensor" : "",
             qo->hadamard ? " hadamard" : "");
    t_buf x = t_buf_new(xdt, B, S, H, D, lay), y = t_buf_new(E4M3, B, S, H, D, lay);
    t_buf_randn(&x, 3);
    if (B > 0 && S > 0) t_set(&x.t, 0, 0, 0, 0, 1000 * t_randn()); /* an outlier */
    const int64_t G = H / qo->heads_per_scale, nblk = qo->block_rows ? (S + qo->block_rows - 1) / qo->block_rows : 1;
    const int64_t nd = B * G * nblk;
    float *ds = malloc(sizeof(float) * (size_t)(nd + 1));
    for (int64_t i = 0; i <= nd; i++) ds[i] = t_nanf();
    CHECK_STATUS(fa_quantize_fp8(ctx, qo, &x.t, &y.t, ds), FA_OK);
    CHECK(isnan(ds[nd])); /* nothing past the descales */
    /* the test's own: rotated rows, amaxes per item, descales, codes */
    double *rows = malloc(sizeof(double) * (size_t)(B * S * H * D + 1));
    float *want = malloc(sizeof(float) * (size_t)(nd + 1));
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++) {
                double *r = rows + ((b * S + s) * H + h) * D;
                for (int64_t i = 0; i < D; i++) r[i] = t_get(&x.t, b, s, h, i);
                if (qo->hadamard) t_rotate(r, D, qo->seed);
            }
    float tensor_amax = 0;
    for (int64_t it = 0; it < nd; it++) {
        const int64_t b = it / (G * nblk), g = it / nblk % G, k = it % nblk;
        const int64_t s0 = qo->block_rows ? k * qo->block_rows : 0, s1 = qo->block_rows && s0 + qo->block_rows < S
                                                                             ? s0 + qo->block_rows : S;
        double amax = 0;
        for (int64_t s = s0; s < s1; s++)
            for (int64_t h = g * qo->heads_per_scale; h < (g + 1) * qo->heads_per_scale; h++)
                for (int64_t i = 0; i < D; i++) {
                    const double a = fabs(rows[((b * S + s) * H + h) * D + i]);
                    if (isfinite(a) && a > amax) amax = a;
                }
        want[it] = (float)amax;
        tensor_amax = want[it] > tensor_amax ? want[it] : tensor_amax;
    }
    for (int64_t it = 0; it < nd; it++) want[it] = t_descale_of(qo->per_tensor ? tensor_amax : want[it]);
    int64_t bad_ds = 0, bad_y = 0;
    for (int64_t it = 0; it < nd; it++) bad_ds += memcmp(&want[it], &ds[it], 4) != 0;
    CHECK_EQ_INT(bad_ds, 0);
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++) {
                const int64_t it = (b * G + h / qo->heads_per_scale) * nblk + (qo->block_rows ? s / qo->block_rows : 0);
                const uint8_t *got = (const uint8_t *)y.t.data + b * y.t.stride_batch + s * y.t.stride_seq +
                                     h * y.t.stride_head;
                for (int64_t i = 0; i < D; i++)
                    bad_y += got[i] != t_encode_e4m3(rows[((b * S + s) * H + h) * D + i] / (double)want[it]);
            }
    CHECK_EQ_INT(bad_y, 0);
    CHECK_EQ_INT(t_buf_check_written(&y), 0);
    free(rows), free(want), free(ds);
    t_buf_free(&x), t_buf_free(&y);
}

static void quantize(fa_context *ctx) {
    fa_quant_opts qo = fa_quant_opts_default();
    quant_case(ctx, FA_DTYPE_F32, 2, 37, 4, 24, T_BSHD, &qo);
    quant_case(ctx, FA_DTYPE_BF16, 1, 5, 2, 1, T_STRIDED, &qo);
    qo.block_rows = 8;
    quant_case(ctx, FA_DTYPE_F16, 2, 37, 4, 40, T_BHSD, &qo);
    qo.heads_per_scale = 2;
    quant_case(ctx, FA_DTYPE_F32, 1, 64, 4, 64, T_STRIDED, &qo);
    qo.hadamard = 1, qo.seed = 12345;
    quant_case(ctx, FA_DTYPE_BF16, 2, 20, 4, 128, T_BSHD, &qo);
    qo = fa_quant_opts_default();
    qo.per_tensor = 1;
    quant_case(ctx, FA_DTYPE_F32, 3, 11, 3, 16, T_BSHD, &qo);
    qo.hadamard = 1, qo.seed = 7;
    quant_case(ctx, FA_DTYPE_F32, 1, 9, 2, 256, T_BSHD, &qo);
    qo = fa_quant_opts_default();
    quant_case(ctx, FA_DTYPE_F32, 2, 0, 2, 8, T_BSHD, &qo); /* no rows: descales of 1 */

    /* saturation, NaN, infinities: the codes of the definition */
    snprintf(t_case_label, sizeof t_case_label, "quantize special values");
    float xs[8] = {1.0f, -448.0f, 460.0f, 1e30f, -INFINITY, NAN, 1e-9f, 0.0f};
    uint8_t ys[8];
    float d = 0;
    fa_tensor x = fa_tensor_bshd(xs, FA_DTYPE_F32, 1, 1, 1, 8), y = fa_tensor_bshd(ys, E4M3, 1, 1, 1, 8);
    xs[2] = 460.0f, xs[3] = 1e30f; /* amax over finite values: 1e30 */
    CHECK_STATUS(fa_quantize_fp8(ctx, NULL, &x, &y, &d), FA_OK);
    CHECK(d == (float)(1e30f / 448.0));
    CHECK_EQ_INT(ys[3], 0x7e);  /* 1e30 / d = 448 */
    CHECK_EQ_INT(ys[4], 0xfe);  /* -inf saturates */
    CHECK_EQ_INT(ys[5] & 0x7f, 0x7f);
    CHECK_EQ_INT(ys[7], 0);
    float small[3] = {1.0f, -2.0f, 448.0f};
    x = fa_tensor_bshd(small, FA_DTYPE_F32, 1, 1, 1, 3), y = fa_tensor_bshd(ys, E4M3, 1, 1, 1, 3);
    CHECK_STATUS(fa_quantize_fp8(ctx, NULL, &x, &y, &d), FA_OK);
    CHECK(d == 1.0f && ys[0] == 0x38 && ys[1] == 0xc0 && ys[2] == 0x7e); /* 1 = 2^0, -2, 448 */
}

/* ---- arguments ---- */

static void errors(fa_context *ctx) {
    snprintf(t_case_label, sizeof t_case_label, "fp8 errors");
    t_buf q = t_buf_new(E4M3, 1, 4, 2, 8, T_BSHD), k = t_buf_new(E4M3, 1, 4, 1, 8, T_BSHD),
          v = t_buf_new(E4M3, 1, 4, 1, 8, T_BSHD), o8 = t_buf_new(E4M3, 1, 4, 2, 8, T_BSHD),
          ob = t_buf_new(FA_DTYPE_BF16, 1, 4, 2, 8, T_BSHD), kb = t_buf_new(FA_DTYPE_BF16, 1, 4, 1, 8, T_BSHD);
    fill_fp8(&q, 1), fill_fp8(&k, 1), fill_fp8(&v, 1), t_buf_randn(&kb, 1);
    fa_attn_opts o = fa_attn_opts_default();
    float bad[1] = {NAN}, one[1] = {1};
    const size_t ob_bytes = ob.mem_bytes;
    unsigned char *before = malloc(ob_bytes);
    memcpy(before, ob.mem, ob_bytes);
    CHECK_STATUS(fa_forward(ctx, &o, &q.t, &k.t, &v.t, &o8.t, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "out: dtype f8_e4m3");
    CHECK_STATUS(fa_forward(ctx, &o, &q.t, &kb.t, &v.t, &ob.t, NULL), FA_ERR_INVALID_ARGUMENT);
    o.k_descale = bad;
    CHECK_STATUS(fa_forward(ctx, &o, &q.t, &k.t, &v.t, &ob.t, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "opts.k_descale[0][0]");
    bad[0] = INFINITY;
    CHECK_STATUS(fa_forward(ctx, &o, &q.t, &k.t, &v.t, &ob.t, NULL), FA_ERR_INVALID_ARGUMENT);
    o.k_descale = NULL, o.v_descale = (const float *)ob.t.data; /* an input inside the output */
    CHECK_STATUS(fa_forward(ctx, &o, &q.t, &k.t, &v.t, &ob.t, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "opts.v_descale");
    CHECK(!memcmp(before, ob.mem, ob_bytes));
    /* descales with 16-bit inputs */
    t_buf qb = t_buf_new(FA_DTYPE_BF16, 1, 4, 2, 8, T_BSHD), vb = t_buf_new(FA_DTYPE_BF16, 1, 4, 1, 8, T_BSHD);
    t_buf_randn(&qb, 1), t_buf_randn(&vb, 1);
    o = fa_attn_opts_default();
    o.q_descale = one;
    CHECK_STATUS(fa_forward(ctx, &o, &qb.t, &kb.t, &vb.t, &ob.t, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "opts.q_descale");
    CHECK(!memcmp(before, ob.mem, ob_bytes));
    /* backward, decoding, merging: no FP8 */
    o = fa_attn_opts_default();
    float lse[8] = {0};
    t_buf dq = t_buf_new(E4M3, 1, 4, 2, 8, T_BSHD), dk = t_buf_new(E4M3, 1, 4, 1, 8, T_BSHD),
          dv = t_buf_new(E4M3, 1, 4, 1, 8, T_BSHD);
    CHECK_STATUS(fa_backward(ctx, &o, &q.t, &k.t, &v.t, &ob.t, lse, &ob.t, &dq.t, &dk.t, &dv.t), FA_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "forward only");
    CHECK_EQ_INT(t_buf_check_written(&dq), (int64_t)dq.mem_elems);
    fa_kvcache cache;
    memset(&cache, 0, sizeof cache);
    cache.k = k.t, cache.v = v.t;
    int32_t seqlens[1] = {2};
    cache.seqlens = seqlens;
    CHECK_STATUS(fa_forward_kvcache(ctx, NULL, NULL, &q.t, &cache, NULL, NULL, &ob.t, NULL), FA_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "f8_e4m3");
    const float *lses[1] = {lse};
    CHECK_STATUS(fa_merge_states(ctx, 1, &q.t, lses, &o8.t, NULL), FA_ERR_UNSUPPORTED);
    CHECK(!memcmp(before, ob.mem, ob_bytes));
    /* fa_quantize_fp8 */
    t_buf x = t_buf_new(FA_DTYPE_F32, 1, 4, 2, 48, T_BSHD), y = t_buf_new(E4M3, 1, 4, 2, 48, T_BSHD),
          yb = t_buf_new(FA_DTYPE_BF16, 1, 4, 2, 48, T_BSHD);
    t_buf_randn(&x, 1);
    float ds[8];
    for (int i = 0; i < 8; i++) ds[i] = t_nanf();
    fa_quant_opts qo = fa_quant_opts_default();
    CHECK_STATUS(fa_quantize_fp8(ctx, &qo, &x.t, &yb.t, ds), FA_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fa_quantize_fp8(ctx, &qo, &y.t, &y.t, ds), FA_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fa_quantize_fp8(ctx, &qo, &x.t, &y.t, NULL), FA_ERR_INVALID_ARGUMENT);
    qo.hadamard = 1;
    CHECK_STATUS(fa_quantize_fp8(ctx, &qo, &x.t, &y.t, ds), FA_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "power of two");
    qo = fa_quant_opts_default();
    qo.heads_per_scale = 3;
    CHECK_STATUS(fa_quantize_fp8(ctx, &qo, &x.t, &y.t, ds), FA_ERR_INVALID_ARGUMENT);
    qo = fa_quant_opts_default();
    qo.per_tensor = 1, qo.block_rows = 2;
    CHECK_STATUS(fa_quantize_fp8(ctx, &qo, &x.t, &y.t, ds), FA_ERR_INVALID_ARGUMENT);
    qo = fa_quant_opts_default();
    CHECK_STATUS(fa_quantize_fp8(ctx, &qo, &x.t, &y.t, (float *)y.t.data), FA_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(t_buf_check_written(&y), (int64_t)y.mem_elems);
    for (int i = 0; i < 8; i++) CHECK(isnan(ds[i]));
    free(before);
    t_buf *all[14] = {&q, &k, &v, &o8, &ob, &kb, &qb, &vb, &dq, &dk, &dv, &x, &y, &yb};
    for (int i = 0; i < 14; i++) t_buf_free(all[i]);
}

int main(void) {
    t_init("test_fp8");
    fa_context *ctx = t_cpu_ctx();
    forward(ctx);
    nan_input(ctx);
    quantize(ctx);
    errors(ctx);
    fa_context_destroy(ctx);
    return t_finish();
}
