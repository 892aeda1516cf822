/* The numerics contract of docs/numerics.md on every CPU algorithm and dtype: finite inputs with a finite scale and
 * softcap never give NaN (huge scales, denormal scale·softcap, logits beyond the fp32 range: outputs inside the
 * convex hull of V, a finite LSE, NaN-free gradients); NaN/±inf in q or k make exactly the affected rows NaN (O and
 * LSE), NaN/inf in v reach the rows that see it; input views BLAS cannot take (stride_seq 0, below head_dim, above
 * INT_MAX) give the oracle's answer; the tensor helpers and the validator never overflow. */
#include "testlib.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


static fa_context *ctx;
static const fa_algo algos[] = {FA_ALGO_STANDARD, FA_ALGO_FLASH1, FA_ALGO_FLASH2};
static const fa_dtype dtypes[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};

typedef struct prob {
    t_buf q, k, v, o, dout, dq, dk, dv;
    float *lse;
    int64_t b, sq, sk, h, d;
} prob;

static void prob_new(prob *p, fa_dtype dt, int64_t b, int64_t sq, int64_t sk, int64_t h, int64_t d, double sigma) {
    p->b = b, p->sq = sq, p->sk = sk, p->h = h, p->d = d;
    p->q = t_buf_new(dt, b, sq, h, d, T_BSHD), p->k = t_buf_new(dt, b, sk, h, d, T_BSHD);
    p->v = t_buf_new(dt, b, sk, h, d, T_BSHD), p->o = t_buf_new(dt, b, sq, h, d, T_BSHD);
    p->dout = t_buf_new(dt, b, sq, h, d, T_BSHD), p->dq = t_buf_new(dt, b, sq, h, d, T_BSHD);
    p->dk = t_buf_new(dt, b, sk, h, d, T_BSHD), p->dv = t_buf_new(dt, b, sk, h, d, T_BSHD);
    t_buf_randn(&p->q, sigma), t_buf_randn(&p->k, sigma), t_buf_randn(&p->v, 1), t_buf_randn(&p->dout, 1);
    p->lse = malloc(sizeof(float) * (size_t)(b * h * sq));
}
static void prob_free(prob *p) {
    t_buf_free(&p->q), t_buf_free(&p->k), t_buf_free(&p->v), t_buf_free(&p->o);
    t_buf_free(&p->dout), t_buf_free(&p->dq), t_buf_free(&p->dk), t_buf_free(&p->dv);
    free(p->lse);
}
static fa_status fwd(prob *p, const fa_attn_opts *o) {
    t_buf_poison(&p->o);
    for (int64_t i = 0; i < p->b * p->h * p->sq; i++) p->lse[i] = t_nanf();
    fa_status st = fa_forward(ctx, o, &p->q.t, &p->k.t, &p->v.t, &p->o.t, p->lse);
    if (st) fprintf(stderr, "  forward: %s\n", fa_context_last_error(ctx));
    return st;
}
static fa_status bwd(prob *p, const fa_attn_opts *o) {
    t_buf_poison(&p->dq), t_buf_poison(&p->dk), t_buf_poison(&p->dv);
    fa_status st = fa_backward(ctx, o, &p->q.t, &p->k.t, &p->v.t, &p->o.t, p->lse, &p->dout.t, &p->dq.t, &p->dk.t,
                               &p->dv.t);
    if (st) fprintf(stderr, "  backward: %s\n", fa_context_last_error(ctx));
    return st;
}
static float lse_at(const prob *p, int64_t b, int64_t h, int64_t s) { return p->lse[(b * p->h + h) * p->sq + s]; }

/* Number of NaN elements of a tensor view. */
static int64_t count_nan(const fa_tensor *t) {
    int64_t n = 0;
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seqlen; s++)
            for (int64_t h = 0; h < t->heads; h++)
                for (int64_t i = 0; i < t->head_dim; i++) n += isnan(t_get(t, b, s, h, i));
    return n;
}

/* Elements of out outside [min, max] of the V rows its row sees (no mask: all of them), with a small slack. */
static int64_t count_outside_hull(const prob *p) {
    int64_t n = 0;
    for (int64_t b = 0; b < p->b; b++)
        for (int64_t h = 0; h < p->h; h++)
            for (int64_t i = 0; i < p->d; i++) {
                double lo = INFINITY, hi = -INFINITY;
                for (int64_t j = 0; j < p->sk; j++) {
                    double x = t_get(&p->v.t, b, j, h, i);
                    lo = x < lo ? x : lo, hi = x > hi ? x : hi;
                }
                const double slack = 1e-2 * (hi - lo) + 1e-6;
                for (int64_t s = 0; s < p->sq; s++) {
                    double o = t_get(&p->o.t, b, s, h, i);
                    n += !(o >= lo - slack && o <= hi + slack);
                }
            }
    return n;
}

/* ---- finding 1: views an sgemm cannot take ---- */
static void blas_views(fa_dtype dt, fa_algo a) {
    snprintf(t_case_label, sizeof t_case_label, "blas views %s %s", fa_dtype_name(dt), fa_algo_name(a));
    /* the library never prints: stdout goes to a temporary file that must stay empty */
    fflush(stdout);
    FILE *tf = tmpfile();
    const int saved = dup(1);
    CHECK(tf && saved >= 0 && dup2(fileno(tf), 1) >= 0);
    fa_attn_opts o = fa_attn_opts_default();
    o.algo = a;
    /* one element each, one input with stride_seq 0 (broadcast) or far beyond INT_MAX: out = v */
    static const int64_t odd[] = {0, (int64_t)1 << 40, (int64_t)1 << 62};
    for (int which = 0; which < 3; which++)
        for (int s = 0; s < 3; s++) {
            prob p;
            prob_new(&p, dt, 1, 1, 1, 1, 1, 1);
            fa_tensor *t = which == 0 ? &p.q.t : which == 1 ? &p.k.t : &p.v.t;
            t->stride_seq = odd[s];
            CHECK_STATUS(fwd(&p, &o), FA_OK);
            double got = t_get(&p.o.t, 0, 0, 0, 0), want = t_get(&p.v.t, 0, 0, 0, 0);
            CHECK_MSG(fabs(got - want) <= 1e-6 * fabs(want), "input %d stride_seq %lld: out %.9g, want v = %.9g", which,
                      (long long)odd[s], got, want);
            prob_free(&p);
        }
    /* B=1, S=4, H=1, D=8 with q (then k, v) rows overlapping (stride_seq 0 or 1): forward and backward vs the oracle */
    for (int which = 0; which < 3; which++)
        for (int64_t ss = 0; ss <= 1; ss++) {
            prob p;
            prob_new(&p, dt, 1, 4, 4, 1, 8, 1);
            fa_tensor *t = which == 0 ? &p.q.t : which == 1 ? &p.k.t : &p.v.t;
            t->stride_seq = ss;
            double ro[32], rl[4], rdq[32], rdk[32], rdv[32];
            CHECK_STATUS(t_oracle_forward(&o, &p.q.t, &p.k.t, &p.v.t, ro, rl), FA_OK);
            CHECK_STATUS(fwd(&p, &o), FA_OK);
            const double tol = dt == FA_DTYPE_F32 ? 1e-5 : 2e-2;
            double e = t_max_diff(&p.o.t, ro);
            CHECK_MSG(e <= tol, "input %d stride_seq %lld: |out - ref| = %g", which, (long long)ss, e);
            e = t_max_diff_f(p.lse, rl, 4);
            CHECK_MSG(e <= tol, "input %d stride_seq %lld: |lse - ref| = %g", which, (long long)ss, e);
            CHECK_STATUS(t_oracle_backward(&o, &p.q.t, &p.k.t, &p.v.t, &p.dout.t, rdq, rdk, rdv), FA_OK);
            CHECK_STATUS(bwd(&p, &o), FA_OK);
            e = fmax(t_max_diff(&p.dq.t, rdq), fmax(t_max_diff(&p.dk.t, rdk), t_max_diff(&p.dv.t, rdv)));
            CHECK_MSG(e <= 10 * tol, "input %d stride_seq %lld: |grad - ref| = %g", which, (long long)ss, e);
            prob_free(&p);
        }
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    fseek(tf, 0, SEEK_END);
    const long printed = ftell(tf);
    CHECK_MSG(printed == 0, "the library printed %ld bytes to stdout", printed);
    fclose(tf);
}

/* ---- findings 2, 3: huge scales, denormal scale·softcap, logits beyond fp32 range ---- */
static void finite_never_nan(fa_dtype dt, fa_algo a, float scale, float softcap, double sigma, int backward,
                             const char *what) {
    snprintf(t_case_label, sizeof t_case_label, "%s (scale %g softcap %g sigma %g) %s %s", what, scale, softcap, sigma,
             fa_dtype_name(dt), fa_algo_name(a));
    prob p;
    prob_new(&p, dt, 1, 16, 16, 1, 16, sigma);
    fa_attn_opts o = fa_attn_opts_default();
    o.algo = a, o.scale = scale, o.softcap = softcap;
    CHECK_STATUS(fwd(&p, &o), FA_OK);
    CHECK_EQ_INT(count_nan(&p.o.t), 0);
    int64_t bad_lse = 0;
    for (int64_t s = 0; s < 16; s++) bad_lse += !isfinite(lse_at(&p, 0, 0, s));
    CHECK_MSG(bad_lse == 0, "%lld of 16 LSE values are not finite (every row sees keys)", (long long)bad_lse);
    CHECK_EQ_INT(count_outside_hull(&p), 0);
    if (backward) {
        CHECK_STATUS(bwd(&p, &o), FA_OK);
        CHECK_EQ_INT(count_nan(&p.dq.t), 0);
        CHECK_EQ_INT(count_nan(&p.dk.t), 0);
        CHECK_EQ_INT(count_nan(&p.dv.t), 0);
    }
    prob_free(&p);
}

/* ---- finding 4: overflow-free helpers and validation ---- */
static void no_overflow(void) {
    snprintf(t_case_label, sizeof t_case_label, "overflow-free tensor helpers and validation");
    float buf[4] = {1, 2, 3, 4}, out[4], lse[4];
    fa_tensor a = fa_tensor_bshd(buf, FA_DTYPE_F32, 1, 4, 12, INT64_MAX / 2);
    fa_tensor b = fa_tensor_bhsd(buf, FA_DTYPE_F32, 1, 12, 4, INT64_MAX / 2);
    CHECK_MSG(a.stride_batch >= 0 && a.stride_seq >= 0 && a.stride_head >= 0, "bshd strides %lld %lld %lld",
              (long long)a.stride_batch, (long long)a.stride_seq, (long long)a.stride_head);
    CHECK_MSG(b.stride_batch >= 0 && b.stride_seq >= 0 && b.stride_head >= 0, "bhsd strides %lld %lld %lld",
              (long long)b.stride_batch, (long long)b.stride_seq, (long long)b.stride_head);
    fa_tensor o1 = fa_tensor_bshd(out, FA_DTYPE_F32, 1, 4, 12, INT64_MAX / 2);
    CHECK_STATUS(fa_forward(ctx, NULL, &a, &a, &a, &o1, lse), FA_ERR_INVALID_ARGUMENT);
    fa_tensor big = fa_tensor_bshd(buf, FA_DTYPE_F32, 1, 3, INT64_MAX / 4, 4);
    fa_tensor ob = fa_tensor_bshd(out, FA_DTYPE_F32, 1, 3, INT64_MAX / 4, 4);
    CHECK_MSG(big.stride_batch >= 0 && big.stride_seq >= 0, "bshd strides %lld %lld", (long long)big.stride_batch,
              (long long)big.stride_seq);
    CHECK_STATUS(fa_forward(ctx, NULL, &big, &big, &big, &ob, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK(fa_context_last_error(ctx)[0] != 0);
    /* batch 2, one element, stride_batch INT64_MAX: the extent check must reject it without overflowing */
    fa_tensor q = fa_tensor_bshd(buf, FA_DTYPE_F32, 2, 1, 1, 1), o2 = fa_tensor_bshd(out, FA_DTYPE_F32, 2, 1, 1, 1);
    q.stride_batch = INT64_MAX;
    memcpy(out, (float[4]){7, 7, 7, 7}, sizeof out);
    CHECK_STATUS(fa_forward(ctx, NULL, &q, &q, &q, &o2, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK(fa_context_last_error(ctx)[0] != 0);
    CHECK(out[0] == 7 && out[1] == 7);
}

/* ---- finding 5: NaN/±inf in q or k make exactly the affected rows NaN ---- */
/* softcap: its tanh turns the ±inf logits of an inf in q or k into finite ones */
static void bad_input_rows(fa_dtype dt, fa_algo a, int in_k, float bad, int masked, float softcap) {
    snprintf(t_case_label, sizeof t_case_label, "%s[5][1] = %g%s softcap %g %s %s", in_k ? "k" : "q", bad,
             masked ? " causal window 2" : "", softcap, fa_dtype_name(dt), fa_algo_name(a));
    const int64_t S = 12, D = 8;
    prob p;
    prob_new(&p, dt, 1, S, S, 2, D, 1);
    fa_attn_opts o = fa_attn_opts_default();
    o.algo = a, o.softcap = softcap;
    if (masked) o.causal = 1, o.window_left = 2; /* row i sees keys i-2..i */
    t_buf *x = in_k ? &p.k : &p.q;
    t_set(&x->t, 0, 5, 1, 1, 0.5);
    CHECK_STATUS(fwd(&p, &o), FA_OK);
    double *clean = malloc(sizeof(double) * (size_t)(S * 2 * D)), clse[24];
    for (int64_t s = 0; s < S; s++)
        for (int64_t h = 0; h < 2; h++) {
            for (int64_t i = 0; i < D; i++) clean[(s * 2 + h) * D + i] = t_get(&p.o.t, 0, s, h, i);
            clse[h * S + s] = lse_at(&p, 0, h, s);
        }
    t_set(&x->t, 0, 5, 1, 1, bad);
    CHECK_STATUS(fwd(&p, &o), FA_OK);
    /* unaffected rows: as in the clean run, up to the dtype's rounding (a head may be recomputed in float64) */
    const double tol = dt == FA_DTYPE_F32 ? 1e-5 : 3e-2;
    int64_t wrong = 0;
    for (int64_t s = 0; s < S; s++)
        for (int64_t h = 0; h < 2; h++) {
            const int hit = h == 1 && (in_k ? (!masked || (s >= 5 && s <= 7)) : s == 5);
            const float l = lse_at(&p, 0, h, s);
            int row_bad = 0;
            for (int64_t i = 0; i < D; i++) {
                const double v = t_get(&p.o.t, 0, s, h, i), c = clean[(s * 2 + h) * D + i];
                row_bad |= hit ? !isnan(v) : !(fabs(v - c) <= tol * (1 + fabs(c)));
            }
            row_bad |= hit ? !isnan(l) : !(fabs(l - clse[h * S + s]) <= tol * (1 + fabs(clse[h * S + s])));
            if (row_bad && wrong < 3)
                fprintf(stderr, "  row %lld head %lld: %s, lse %g\n", (long long)s, (long long)h,
                        hit ? "should be NaN (O and LSE)" : "should equal the clean run", l);
            wrong += row_bad;
        }
    CHECK_MSG(wrong == 0, "%lld rows break the contract", (long long)wrong);
    free(clean);
    prob_free(&p);
}

/* ---- NaN/inf in v reach exactly the rows that see it, in that column ---- */
static void bad_v(fa_dtype dt, fa_algo a, float bad, int masked) {
    snprintf(t_case_label, sizeof t_case_label, "v[4][2] = %g%s %s %s", bad, masked ? " causal" : "",
             fa_dtype_name(dt), fa_algo_name(a));
    const int64_t S = 10, D = 4;
    prob p;
    prob_new(&p, dt, 1, S, S, 1, D, 1);
    fa_attn_opts o = fa_attn_opts_default();
    o.algo = a, o.causal = masked;
    t_set(&p.v.t, 0, 4, 0, 2, bad);
    CHECK_STATUS(fwd(&p, &o), FA_OK);
    int64_t wrong = 0;
    for (int64_t s = 0; s < S; s++) {
        wrong += !isfinite(lse_at(&p, 0, 0, s));
        for (int64_t i = 0; i < D; i++) {
            const double v = t_get(&p.o.t, 0, s, 0, i);
            if (i != 2 || (masked && s < 4)) wrong += !isfinite(v); /* rows 0..3 do not see key 4 under causal */
            else wrong += isfinite(v);
        }
    }
    CHECK_MSG(wrong == 0, "%lld values break the contract", (long long)wrong);
    prob_free(&p);
}

int main(void) {
    t_init("test_nonfinite");
    ctx = t_cpu_ctx();
    no_overflow();
    for (int ai = 0; ai < 3; ai++)
        for (int di = 0; di < 3; di++) {
            const fa_algo a = algos[ai];
            const fa_dtype dt = dtypes[di];
            blas_views(dt, a);
            finite_never_nan(dt, a, 1e20f, 0, 1, 1, "huge scale");
            finite_never_nan(dt, a, 1e30f, 0, 1, 1, "huge scale");
            finite_never_nan(dt, a, FLT_MAX, 0, 1, 1, "huge scale");
            finite_never_nan(dt, a, -FLT_MAX, 0, 1, 1, "huge negative scale");
            finite_never_nan(dt, a, 1.4013e-45f, 1.4013e-45f, 1, 1, "denormal scale and softcap");
            finite_never_nan(dt, a, 1e30f, 1e-30f, 1, 1, "huge scale, tiny softcap");
            if (dt != FA_DTYPE_F16) finite_never_nan(dt, a, 0, 0, 1e19, 0, "logits beyond fp32 range");
            if (dt == FA_DTYPE_F32) finite_never_nan(dt, a, 1, 0, 3e37, 0, "products beyond fp32 range");
            for (int m = 0; m <= 1; m++) {
                const float bads[3] = {INFINITY, -INFINITY, NAN};
                for (int b = 0; b < 3; b++)
                    for (int in_k = 0; in_k <= 1; in_k++)
                        for (int cap = 0; cap <= 1; cap++) bad_input_rows(dt, a, in_k, bads[b], m, cap ? 30.f : 0.f);
                bad_v(dt, a, INFINITY, m);
                bad_v(dt, a, NAN, m);
            }
        }
    fa_context_destroy(ctx);
    return t_finish();
}
