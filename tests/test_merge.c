/* fa_merge_states at any number of states and any head_dim (flash-attn's flash_attn_combine tests go to 133 splits
 * and head_dim 512): random states of every dtype, some empty (LSE −inf), rows whose every state is empty, against a
 * float64 merge of the same stored values; the same in place (out = outs[0], lse = lses[0]); a NaN LSE making its row
 * NaN; 133 FLASH2 calls over key chunks (some empty) merged against the float64 attention oracle; bad arguments.
 * Built twice from this file: for the CPU (ctest) and, with FA_TEST_CUDA, for CUDA (tests/gpu/CMakeLists.txt, run by
 * `make test-gpu`; above 32 states the CUDA merge runs in chunks over an fp32 running state). */
#include "testlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend_mem.h"

#ifdef FA_TEST_CUDA
#define NAME "test_gpu_merge"
#else
#define NAME "test_merge"
#endif

enum { B = 2, S = 3, H = 2, PAD = 3 };
#define ROWS (B * S * H)

/* n states [B, S, H, d] of dtype dt with PAD elements after every head's row, one host block and its device copy. */
typedef struct states {
    int n, d;
    fa_dtype dt;
    size_t one;           /* bytes of one state */
    unsigned char *host;  /* n states */
    float *lse;           /* host [n][B, H, S] */
    void *dev, *dev_lse;  /* the device copies */
    fa_tensor *t;         /* n device views */
    const float **lp;     /* n device LSE pointers */
} states;

static fa_tensor view(void *data, fa_dtype dt, int d) {
    const int64_t sh = d + PAD, ss = H * sh;
    return (fa_tensor){data, dt, B, S, H, d, S * ss, ss, sh};
}

/* Random states; LSEs in [-6, 6], one state in 7 empty, and row 0 of (b 0, h 1) empty in every state. */
static states mk_states(int n, int d, fa_dtype dt) {
    states s;
    s.n = n, s.d = d, s.dt = dt;
    s.one = (size_t)(B * S * H * (d + PAD)) * fa_dtype_size(dt);
    s.host = calloc((size_t)n, s.one);
    s.lse = malloc(sizeof(float) * (size_t)n * ROWS);
    for (int i = 0; i < n; i++) {
        const fa_tensor t = view(s.host + i * s.one, dt, d);
        for (int b = 0; b < B; b++)
            for (int q = 0; q < S; q++)
                for (int h = 0; h < H; h++)
                    for (int c = 0; c < d; c++) t_set(&t, b, q, h, c, t_rng_randn(&t_default_rng));
        const int empty = t_rng_int(&t_default_rng, 0, 6) == 0;
        for (int r = 0; r < ROWS; r++)
            s.lse[i * ROWS + r] = empty ? -INFINITY : (float)(12 * t_rng_uniform(&t_default_rng) - 6);
        s.lse[i * ROWS + 1 * S + 0] = -INFINITY; /* [b 0, h 1, q 0] */
    }
    s.dev = dev_alloc(s.one * (size_t)n);
    s.dev_lse = dev_alloc(sizeof(float) * (size_t)n * ROWS);
    put(s.dev, s.host, s.one * (size_t)n);
    put(s.dev_lse, s.lse, sizeof(float) * (size_t)n * ROWS);
    s.t = malloc(sizeof(fa_tensor) * (size_t)n);
    s.lp = malloc(sizeof(float *) * (size_t)n);
    for (int i = 0; i < n; i++) {
        s.t[i] = view((unsigned char *)s.dev + i * s.one, dt, d);
        s.lp[i] = (const float *)s.dev_lse + i * ROWS;
    }
    return s;
}
static void rm_states(states *s) { free(s->host), free(s->lse), dev_free(s->dev), dev_free(s->dev_lse), free(s->t), free(s->lp); }

/* The float64 merge of the stored states: ref [B, S, H, d], rl [B, H, S]. */
static void oracle(const states *s, double *ref, double *rl) {
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int q = 0; q < S; q++) {
                const int r = (b * H + h) * S + q;
                double M = -INFINITY, sum = 0;
                for (int i = 0; i < s->n; i++) M = fmax(M, s->lse[i * ROWS + r]);
                for (int i = 0; i < s->n; i++)
                    if (M > -INFINITY) sum += exp((double)s->lse[i * ROWS + r] - M);
                rl[r] = M == -INFINITY ? -INFINITY : M + log(sum);
                for (int c = 0; c < s->d; c++) {
                    double x = 0;
                    for (int i = 0; i < s->n; i++) {
                        const fa_tensor t = view(s->host + i * s->one, s->dt, s->d);
                        if (M > -INFINITY && s->lse[i * ROWS + r] > -INFINITY)
                            x += exp((double)s->lse[i * ROWS + r] - M) / sum * t_get(&t, b, q, h, c);
                    }
                    ref[((b * S + q) * H + h) * s->d + c] = x;
                }
            }
}

/* One unit in the last place of the dtype, relative: the merge rounds its fp32 result once. */
static double ulp(fa_dtype dt) { return dt == FA_DTYPE_F32 ? 2e-6 : dt == FA_DTYPE_F16 ? 1.0 / 1024 : 1.0 / 128; }

/* Max |out − ref| over the view of out (host copy of the device memory); NaN gives +inf. */
static double max_err(const unsigned char *host, fa_dtype dt, int d, const double *ref) {
    const fa_tensor t = view((void *)host, dt, d);
    double e = 0;
    for (int b = 0; b < B; b++)
        for (int q = 0; q < S; q++)
            for (int h = 0; h < H; h++)
                for (int c = 0; c < d; c++) {
                    const double x = t_get(&t, b, q, h, c), y = ref[((b * S + q) * H + h) * d + c];
                    e = isnan(x) ? INFINITY : fmax(e, fabs(x - y));
                }
    return e;
}

static void random_states(fa_context *ctx, int n, int d, fa_dtype dt) {
    snprintf(t_case_label, sizeof t_case_label, "merge n %d d %d %s", n, d, fa_dtype_name(dt));
    states s = mk_states(n, d, dt);
    double *ref = malloc(sizeof(double) * ROWS * d), rl[ROWS];
    oracle(&s, ref, rl);
    double refmax = 1e-30;
    for (int i = 0; i < ROWS * d; i++) refmax = fmax(refmax, fabs(ref[i]));
    /* out poisoned with 0xFF (NaN in every dtype) so every element must be written, padding must stay */
    unsigned char *oh = malloc(s.one), *back = malloc(s.one);
    memset(oh, 0xFF, s.one);
    void *od = dev_alloc(s.one);
    float *ld = dev_alloc(sizeof(float) * ROWS), lh[ROWS];
    put(od, oh, s.one);
    const fa_tensor o = view(od, dt, d);
    CHECK_STATUS(fa_merge_states(ctx, n, s.t, s.lp, &o, ld), FA_OK);
    get(back, od, s.one);
    get(lh, ld, sizeof lh);
    const double err = max_err(back, dt, d, ref), tol = 4 * ulp(dt) * refmax;
    CHECK_MSG(err <= tol, "%s: max err %.3e above %.3e", t_case_label, err, tol);
    int pad_kept = 1;
    for (int r = 0; r < ROWS; r++)
        for (int p = 0; p < PAD; p++) {
            const size_t at = ((size_t)r * (d + PAD) + d + p) * fa_dtype_size(dt);
            pad_kept &= back[at] == 0xFF;
        }
    CHECK_MSG(pad_kept, "%s: padding written", t_case_label);
    CHECK_LE(t_max_diff_f(lh, rl, ROWS), 1e-5 * 8);
    /* the all-empty row: 0 and -inf */
    const fa_tensor ob = view(back, dt, d);
    CHECK(lh[1 * S] == -INFINITY && t_get(&ob, 0, 0, 1, 0) == 0 && t_get(&ob, 0, 0, 1, d - 1) == 0);
    /* in place: out = outs[0], lse = lses[0], the same result */
    CHECK_STATUS(fa_merge_states(ctx, n, s.t, s.lp, &s.t[0], (float *)s.lp[0]), FA_OK);
    get(back, s.t[0].data, s.one);
    get(lh, s.lp[0], sizeof lh);
    CHECK_MSG(max_err(back, dt, d, ref) <= tol, "%s: in place", t_case_label);
    CHECK_LE(t_max_diff_f(lh, rl, ROWS), 1e-5 * 8);
    free(ref), free(oh), free(back), dev_free(od), dev_free(ld);
    rm_states(&s);
}

/* A NaN LSE in the last state (past the first chunk on CUDA) makes exactly its row NaN. */
static void nan_lse(fa_context *ctx) {
    const int n = 70, d = 40;
    snprintf(t_case_label, sizeof t_case_label, "merge nan lse n %d", n);
    states s = mk_states(n, d, FA_DTYPE_F32);
    s.lse[(n - 1) * ROWS + 4] = NAN;
    put(s.dev_lse, s.lse, sizeof(float) * (size_t)n * ROWS);
    unsigned char *back = malloc(s.one);
    void *od = dev_alloc(s.one);
    float *ld = dev_alloc(sizeof(float) * ROWS), lh[ROWS];
    const fa_tensor o = view(od, FA_DTYPE_F32, d);
    CHECK_STATUS(fa_merge_states(ctx, n, s.t, s.lp, &o, ld), FA_OK);
    get(back, od, s.one);
    get(lh, ld, sizeof lh);
    const fa_tensor ob = view(back, FA_DTYPE_F32, d);
    /* lse row 4 = (b 0, h 1, q 1): out row [0, 1, 1] */
    int ok = isnan(lh[4]);
    for (int c = 0; c < d; c++) ok &= isnan(t_get(&ob, 0, 1, 1, c));
    for (int r = 0; r < ROWS; r++) ok &= r == 4 || !isnan(lh[r]);
    CHECK_MSG(ok, "a NaN LSE: exactly its row NaN");
    free(back), dev_free(od), dev_free(ld);
    rm_states(&s);
}

#ifndef FA_TEST_CUDA
/* 133 FLASH2 calls over key chunks of 0..5 keys merged equal the attention over all keys (the float64 oracle). */
static void attention_chunks(fa_context *ctx) {
    const int n = 133, Sq = 4, Hh = 2, D = 64;
    int cuts[134], Sk = 0;
    for (int i = 0; i < n; i++) cuts[i] = Sk, Sk += t_rng_int(&t_default_rng, 0, 5);
    cuts[n] = Sk;
    snprintf(t_case_label, sizeof t_case_label, "merge of %d FLASH2 calls over %d keys", n, Sk);
    t_buf q = t_buf_new(FA_DTYPE_F32, 1, Sq, Hh, D, T_BSHD), k = t_buf_new(FA_DTYPE_F32, 1, Sk, Hh, D, T_BSHD);
    t_buf v = t_buf_new(FA_DTYPE_F32, 1, Sk, Hh, D, T_BSHD), m = t_buf_new(FA_DTYPE_F32, 1, Sq, Hh, D, T_BSHD);
    t_buf_randn(&q, 1), t_buf_randn(&k, 1), t_buf_randn(&v, 1);
    t_buf *parts = malloc(sizeof(t_buf) * n);
    fa_tensor *pt = malloc(sizeof(fa_tensor) * n);
    float *ls = malloc(sizeof(float) * n * Hh * Sq), lm[Hh * Sq];
    const float **lp = malloc(sizeof(float *) * n);
    fa_attn_opts o = fa_attn_opts_default();
    o.algo = FA_ALGO_FLASH2;
    for (int i = 0; i < n; i++) {
        parts[i] = t_buf_new(FA_DTYPE_F32, 1, Sq, Hh, D, T_BSHD);
        fa_tensor kk = k.t, vv = v.t;
        kk.data = (float *)kk.data + cuts[i] * kk.stride_seq, kk.seqlen = cuts[i + 1] - cuts[i];
        vv.data = (float *)vv.data + cuts[i] * vv.stride_seq, vv.seqlen = kk.seqlen;
        CHECK_STATUS(fa_forward(ctx, &o, &q.t, &kk, &vv, &parts[i].t, ls + i * Hh * Sq), FA_OK);
        pt[i] = parts[i].t, lp[i] = ls + i * Hh * Sq;
    }
    CHECK_STATUS(fa_merge_states(ctx, n, pt, lp, &m.t, lm), FA_OK);
    CHECK_EQ_INT(t_buf_check_written(&m), 0);
    double ref[Sq * Hh * D], rl[Hh * Sq];
    CHECK_STATUS(t_oracle_forward(&o, &q.t, &k.t, &v.t, ref, rl), FA_OK);
    const double refmax = t_max_abs(ref, Sq * Hh * D);
    CHECK_LE(t_max_diff(&m.t, ref), 1e-5 * refmax);
    CHECK_LE(t_max_diff_f(lm, rl, Hh * Sq), 1e-5 * 8);
    for (int i = 0; i < n; i++) t_buf_free(&parts[i]);
    free(parts), free(pt), free(ls), free(lp);
    t_buf_free(&q), t_buf_free(&k), t_buf_free(&v), t_buf_free(&m);
}
#endif

static void errors(fa_context *ctx) {
    snprintf(t_case_label, sizeof t_case_label, "merge errors");
    states s = mk_states(2, 8, FA_DTYPE_F32);
    void *od = dev_alloc(s.one);
    const fa_tensor o = view(od, FA_DTYPE_F32, 8), o16 = view(od, FA_DTYPE_F16, 8);
    CHECK_STATUS(fa_merge_states(ctx, 0, s.t, s.lp, &o, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "n: 0 must be >= 1");
    CHECK_STATUS(fa_merge_states(ctx, -5, s.t, s.lp, &o, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fa_merge_states(ctx, 2, s.t, s.lp, &o16, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "outs[0]");
    const float *bad[2] = {s.lp[0], NULL};
    CHECK_STATUS(fa_merge_states(ctx, 2, s.t, bad, &o, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "lses[1]");
    dev_free(od);
    rm_states(&s);
}

int main(void) {
    t_init(NAME);
    fa_context *ctx = t_backend_ctx();
    static const int ns[] = {1, 2, 31, 32, 33, 64, 65, 133};
    static const int ds[] = {1, 64, 257, 512};
    static const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int a = 0; a < 8; a++)
        for (int c = 0; c < 4; c++) random_states(ctx, ns[a], ds[c], dts[(a + c) % 3]);
    random_states(ctx, 133, 512, FA_DTYPE_BF16);
    nan_lse(ctx);
#ifndef FA_TEST_CUDA
    attention_chunks(ctx);
#endif
    errors(ctx);
    fa_context_destroy(ctx);
    return t_finish();
}
