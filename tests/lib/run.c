/* The CPU harness of the tests: one case, every algorithm, forward or forward + backward, against the oracle. */
#include "run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dtype.h"
#include "oracle.h"
#include "tolerance.h"

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

static const fa_algo run_order[] = {FA_ALGO_STANDARD, FA_ALGO_FLASH1, FA_ALGO_FLASH2, FA_ALGO_AUTO};

/* The stats of a successful call name the algorithm that ran, and a kernel of the pinned level (FA_CPU_ISA). */
static void check_stats_algo(fa_context *ctx, fa_algo a, int is_backward) {
    fa_stats st;
    memset(&st, 0, sizeof st);
    CHECK_STATUS(fa_last_stats(ctx, &st), FA_OK);
    CHECK_EQ_INT(st.algo, a == FA_ALGO_AUTO ? FA_ALGO_FLASH2 : a);
    CHECK_EQ_INT(st.is_backward, is_backward);
    CHECK_EQ_INT(st.backend, FA_BACKEND_CPU);
    t_check_cpu_level(st.kernel);
}

static void check_lse(fa_algo a, double err, double err_std, double scale) {
    t_verdict v = t_judge_lse(a == FA_ALGO_STANDARD, err, err_std, scale);
    CHECK_MSG(v.ok, "%s lse: max abs err %.3e > %s %.3e (2 x standard's %.3e; scale %.3g)", fa_algo_name(a), err,
              v.by_ceiling ? "ceiling" : "bound", v.allowed, err_std, scale);
}

static void snapshot(const t_buf *x, unsigned char **copy) {
    *copy = xmalloc(x->mem_bytes);
    memcpy(*copy, x->mem, x->mem_bytes);
}
static void check_unchanged(const t_buf *x, unsigned char *copy, const char *name) {
    CHECK_MSG(memcmp(x->mem, copy, x->mem_bytes) == 0, "input %s was modified", name);
    free(copy);
}

/* out and lse poisoned (NaN), then fa_forward with algorithm a; a failure is counted and reported. */
static int poisoned_forward(fa_context *ctx, fa_attn_opts *opts, fa_algo a, t_buf *q, t_buf *k, t_buf *v, t_buf *o,
                            float *lse, int64_t n_lse, const char *what) {
    t_buf_poison(o);
    for (int64_t i = 0; i < n_lse; i++) lse[i] = t_nanf();
    opts->algo = a;
    fa_status st = fa_forward(ctx, opts, &q->t, &k->t, &v->t, &o->t, lse);
    CHECK_STATUS(st, FA_OK);
    if (st != FA_OK) fprintf(stderr, "  %s%s: %s\n", fa_algo_name(a), what, fa_context_last_error(ctx));
    return st == FA_OK;
}


int t_run_forward(fa_context *ctx, const t_case *c, unsigned algos) {
    int fails0 = t_failures;
    char desc[400];
    t_case_describe(c, desc, sizeof desc);
    snprintf(t_case_label, sizeof t_case_label, "fwd %s", desc);
    printf("fwd %s:", desc);

    const int64_t dv = t_case_dv(c);
    t_buf q = t_buf_new(c->dt, c->b, c->sq, c->hq, c->d, c->lay_q);
    t_buf k = t_buf_new(c->dt, c->b, c->sk, c->hk, c->d, c->lay_kv);
    t_buf v = t_buf_new(c->dt, c->b, c->sk, c->hk, dv, c->lay_kv);
    t_buf o = t_buf_new(c->dt, c->b, c->sq, c->hq, dv, c->lay_o);
    double sigma = c->sigma > 0 ? c->sigma : 1;
    t_buf_randn(&q, sigma);
    t_buf_randn(&k, sigma);
    t_buf_randn(&v, 1);
    t_case_pad(c, &q, &k, &v, NULL);
    unsigned char *q0, *k0, *v0;
    snapshot(&q, &q0), snapshot(&k, &k0), snapshot(&v, &v0);

    int64_t n_out = c->b * c->sq * c->hq * dv, n_lse = c->b * c->hq * c->sq;
    double *ref = xmalloc(sizeof(double) * (size_t)n_out), *ref_lse = xmalloc(sizeof(double) * (size_t)n_lse);
    float *lse = xmalloc(sizeof(float) * (size_t)n_lse);
    fa_attn_opts opts = c->opts;
    CHECK_STATUS(t_oracle_forward(&opts, &q.t, &k.t, &v.t, ref, ref_lse), FA_OK);
    /* NaN/inf in q, k, v reach the oracle only through padding here, which it must not read either */
    CHECK_MSG(!c->nonfinite_padding || (t_all_finite(ref, n_out, 0) && t_all_finite(ref_lse, n_lse, 1)),
              "the oracle's out or lse is not finite: it read padding");
    double refmax = t_max_abs(ref, n_out), lscale = t_lse_scale(ref_lse, n_lse);

    double err_std = 0, lse_std = 0;
    algos |= T_ALGO_BIT(FA_ALGO_STANDARD);
    for (size_t ai = 0; ai < sizeof run_order / sizeof run_order[0]; ai++) {
        fa_algo a = run_order[ai];
        if (!(algos & T_ALGO_BIT(a))) continue;
        if (!poisoned_forward(ctx, &opts, a, &q, &k, &v, &o, lse, n_lse, "")) continue;
        check_stats_algo(ctx, a, 0);
        int64_t bad = t_buf_check_written(&o);
        CHECK_MSG(bad == 0, "%s: %lld elements of out not written (NaN) or written outside the view", fa_algo_name(a),
                  (long long)bad);
        double err = t_max_diff(&o.t, ref), lerr = t_max_diff_f(lse, ref_lse, n_lse);
        if (a == FA_ALGO_STANDARD) err_std = err, lse_std = lerr;
        t_check_err("out", a, c->dt, err, err_std, refmax, 0, c->relax);
        check_lse(a, lerr, lse_std, lscale);
        printf(" %s %.1e/%.1e", fa_algo_name(a), err, lerr);
    }
    printf(" (max|o| %.2f)\n", refmax);
    check_unchanged(&q, q0, "q"), check_unchanged(&k, k0, "k"), check_unchanged(&v, v0, "v");

    free(ref), free(ref_lse), free(lse);
    t_buf_free(&q), t_buf_free(&k), t_buf_free(&v), t_buf_free(&o);
    t_case_label[0] = 0;
    return t_failures - fails0;
}

int t_run_backward(fa_context *ctx, const t_case *c, unsigned algos) {
    int fails0 = t_failures;
    char desc[400];
    t_case_describe(c, desc, sizeof desc);
    snprintf(t_case_label, sizeof t_case_label, "bwd %s", desc);
    printf("bwd %s:", desc);

    t_layout lo = c->lay_o == T_BCAST ? T_BSHD : c->lay_o;
    const int64_t e = t_case_dv(c); /* v's head_dim: v, out, dout, dv */
    t_buf q = t_buf_new(c->dt, c->b, c->sq, c->hq, c->d, c->lay_q);
    t_buf k = t_buf_new(c->dt, c->b, c->sk, c->hk, c->d, c->lay_kv);
    t_buf v = t_buf_new(c->dt, c->b, c->sk, c->hk, e, c->lay_kv);
    t_buf o = t_buf_new(c->dt, c->b, c->sq, c->hq, e, lo);
    t_buf dout = t_buf_new(c->dt, c->b, c->sq, c->hq, e, lo);
    t_buf dq = t_buf_new(c->dt, c->b, c->sq, c->hq, c->d, lo);
    t_buf dk = t_buf_new(c->dt, c->b, c->sk, c->hk, c->d, lo);
    t_buf dv = t_buf_new(c->dt, c->b, c->sk, c->hk, e, lo);
    double sigma = c->sigma > 0 ? c->sigma : 1;
    t_buf_randn(&q, sigma);
    t_buf_randn(&k, sigma);
    t_buf_randn(&v, 1);
    t_buf_randn(&dout, 1);
    t_case_pad(c, &q, &k, &v, &dout);
    unsigned char *q0, *k0, *v0, *do0;
    snapshot(&q, &q0), snapshot(&k, &k0), snapshot(&v, &v0), snapshot(&dout, &do0);

    int64_t nq = c->b * c->sq * c->hq * c->d, nk = c->b * c->sk * c->hk * c->d, n_lse = c->b * c->hq * c->sq;
    int64_t nv = c->b * c->sk * c->hk * e;
    double *rdq = xmalloc(sizeof(double) * (size_t)nq), *rdk = xmalloc(sizeof(double) * (size_t)nk),
           *rdv = xmalloc(sizeof(double) * (size_t)nv), *rdvm = xmalloc(sizeof(double) * (size_t)nv);
    float *lse = xmalloc(sizeof(float) * (size_t)n_lse);
    fa_attn_opts opts = c->opts;
    /* with sinks, d sinks too: poisoned before each call, against the oracle's like a gradient */
    double rds[T_MAX_SINK_HEADS], rdsm[T_MAX_SINK_HEADS];
    float ds[T_MAX_SINK_HEADS];
    CHECK_STATUS(t_oracle_backward_sinks(&opts, &q.t, &k.t, &v.t, &dout.t, rdq, rdk, rdv, rdvm,
                                         opts.sinks ? rds : NULL, opts.sinks ? rdsm : NULL), FA_OK);
    CHECK_MSG(!c->nonfinite_padding ||
                  (t_all_finite(rdq, nq, 0) && t_all_finite(rdk, nk, 0) && t_all_finite(rdv, nv, 0)),
              "the oracle's gradients are not finite: it read padding");
    double mq = t_max_abs(rdq, nq), mk = t_max_abs(rdk, nk), mv = t_max_abs(rdv, nv), mvm = t_max_abs(rdvm, nv);
    opts.d_sinks = opts.sinks ? ds : NULL;

    double sq_ = 0, sk_ = 0, sv_ = 0, ss_ = 0;
    algos |= T_ALGO_BIT(FA_ALGO_STANDARD);
    for (size_t ai = 0; ai < sizeof run_order / sizeof run_order[0]; ai++) {
        fa_algo a = run_order[ai];
        if (!(algos & T_ALGO_BIT(a))) continue;
        if (!poisoned_forward(ctx, &opts, a, &q, &k, &v, &o, lse, n_lse, " forward")) continue;
        unsigned char *o0, *lse0 = xmalloc(sizeof(float) * (size_t)n_lse);
        snapshot(&o, &o0);
        memcpy(lse0, lse, sizeof(float) * (size_t)n_lse);
        t_buf_poison(&dq), t_buf_poison(&dk), t_buf_poison(&dv);
        for (int64_t h = 0; opts.d_sinks && h < c->hq; h++) ds[h] = t_nanf();
        fa_status st = fa_backward(ctx, &opts, &q.t, &k.t, &v.t, &o.t, lse, &dout.t, &dq.t, &dk.t, &dv.t);
        CHECK_STATUS(st, FA_OK);
        if (st != FA_OK) {
            fprintf(stderr, "  %s backward: %s\n", fa_algo_name(a), fa_context_last_error(ctx));
            free(o0), free(lse0);
            continue;
        }
        check_stats_algo(ctx, a, 1);
        check_unchanged(&o, o0, "out");
        CHECK_MSG(memcmp(lse0, lse, sizeof(float) * (size_t)n_lse) == 0, "input lse was modified by fa_backward");
        free(lse0);
        int64_t bq = t_buf_check_written(&dq), bk = t_buf_check_written(&dk), bv = t_buf_check_written(&dv);
        CHECK_MSG(bq == 0 && bk == 0 && bv == 0,
                  "%s: elements not written (NaN) or written outside the view: dq %lld, dk %lld, dv %lld",
                  fa_algo_name(a), (long long)bq, (long long)bk, (long long)bv);
        double eq = t_max_diff(&dq.t, rdq), ek = t_max_diff(&dk.t, rdk), ev = t_max_diff(&dv.t, rdv);
        if (a == FA_ALGO_STANDARD) sq_ = eq, sk_ = ek, sv_ = ev;
        /* One scale for the three gradients: dQ or dK can be ~0 by cancellation in dP - D (one visible key:
         * P = 1 and dS = 0 exactly), where any fp32 implementation leaves rounding noise of the size of
         * eps·|dP|; measured against max|dQ| = 0 that noise would be an infinite relative error. */
        double gm = mq > mk ? mq : mk;
        gm = gm > mv ? gm : mv;
        if (c->grad_rel > 0) {
            CHECK_MSG(eq <= 2 * sq_ + c->grad_rel * gm && ek <= 2 * sk_ + c->grad_rel * gm &&
                          ev <= 2 * sv_ + c->grad_rel * gm,
                      "%s: gradient errors %.3e %.3e %.3e > 2 x standard's (%.3e %.3e %.3e) + %.2g x max|ref| %.3g",
                      fa_algo_name(a), eq, ek, ev, sq_, sk_, sv_, c->grad_rel, gm);
        } else {
            t_check_err("dq", a, c->dt, eq, sq_, gm, 1, c->relax);
            t_check_err("dk", a, c->dt, ek, sk_, gm, 1, c->relax);
            /* dV = Σ_i P_ij dO_i over every query row of the K/V head: when its terms nearly cancel (one key, a
             * few hundred rows), max|dV| is far below the terms and their fp32 rounding; dV is held relative to
             * the size of its terms, Σ_i P_ij |dO_i|, where that is larger */
            t_check_err("dv", a, c->dt, ev, sv_, gm > mvm ? gm : mvm, 1, c->relax);
        }
        printf(" %s %.1e/%.1e/%.1e", fa_algo_name(a), eq, ek, ev);
        if (opts.d_sinks) {
            double es = t_max_diff_f(ds, rds, c->hq);
            if (a == FA_ALGO_STANDARD) ss_ = es;
            t_check_err("d_sinks", a, c->dt, es, ss_, t_dsinks_scale(rds, rdsm, c->hq, gm), 1, c->relax);
            printf("/%.1e", es);
        }
    }
    printf(" (max|dq,dk,dv| %.2f %.2f %.2f)\n", mq, mk, mv);
    check_unchanged(&q, q0, "q"), check_unchanged(&k, k0, "k"), check_unchanged(&v, v0, "v");
    check_unchanged(&dout, do0, "dout");

    free(rdq), free(rdk), free(rdv), free(rdvm), free(lse);
    t_buf_free(&q), t_buf_free(&k), t_buf_free(&v), t_buf_free(&o);
    t_buf_free(&dout), t_buf_free(&dq), t_buf_free(&dk), t_buf_free(&dv);
    t_case_label[0] = 0;
    return t_failures - fails0;
}

