/* The pass rule; see tolerance.h and docs/testing.md. */
#include "tolerance.h"

#include <math.h>

#include "check.h"

double t_atol(fa_dtype dt, double refmax) {
    switch (dt) {
    case FA_DTYPE_F32: return 5e-6 * refmax;       /* f32's real criterion is the 1e-5 relative bound */
    case FA_DTYPE_F16: return refmax / 1024.0;     /* 1 ulp of binary16 at refmax */
    default: return refmax / 128.0;                /* 1 ulp of bfloat16 at refmax */
    }
}

/* f32: the relative rule. f16/bf16: a few ulps of the dtype (inputs are exact in the dtype, accumulation is fp32,
 * the result is rounded once; gradients also see the rounded O through D = rowsum(dO∘O)). */
double t_ceiling(fa_dtype dt, int is_grad, double refmax, double relax) {
    double rel = dt == FA_DTYPE_F32 ? 1e-5 : dt == FA_DTYPE_F16 ? (is_grad ? 1e-2 : 2e-3) : (is_grad ? 6e-2 : 1.6e-2);
    return rel * (relax > 0 ? relax : 1) * refmax + (dt == FA_DTYPE_F32 ? 0 : t_atol(dt, refmax));
}

double t_std_atol(fa_dtype dt, double refmax, double relax) { return t_atol(dt, refmax) * (relax > 1 ? relax : 1); }

static double ratio_of(double err, double allowed) {
    if (allowed > 0) return err / allowed;
    return err > 0 || isnan(err) ? INFINITY : 0;
}

static t_verdict verdict(double err, double ceiling, int use_std, double std_bound) {
    t_verdict v;
    double rc = ratio_of(err, ceiling), rs = use_std ? ratio_of(err, std_bound) : 0;
    v.by_ceiling = !(rs > rc);
    v.ratio = v.by_ceiling ? rc : rs;
    v.allowed = v.by_ceiling ? ceiling : std_bound;
    v.ok = err <= ceiling && (!use_std || err <= std_bound);
    if (isnan(v.ratio)) v.ratio = INFINITY;
    return v;
}

t_verdict t_judge(fa_dtype dt, int is_standard, int is_grad, double err, double err_std, double refmax, double relax) {
    return verdict(err, t_ceiling(dt, is_grad, refmax, relax), !is_standard, 2 * err_std + t_std_atol(dt, refmax, relax));
}

t_verdict t_judge_lse(int is_standard, double err, double err_std, double scale) {
    return verdict(err, 2e-5 * scale, !is_standard, 2 * err_std + 4e-6 * scale);
}

double t_lse_scale(const double *lse_ref, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(lse_ref[i]) && fabs(lse_ref[i]) > m) m = fabs(lse_ref[i]);
    return m > 1 ? m : 1;
}

double t_dsinks_scale(const double *ds, const double *ds_mag, int64_t n, double gm) {
    for (int64_t h = 0; h < n; h++) gm = fmax(gm, fmax(fabs(ds[h]), ds_mag[h]));
    return gm;
}

int t_check_err(const char *what, fa_algo algo, fa_dtype dt, double err, double err_std, double refmax,
                int is_grad, double relax) {
    double ceiling = t_ceiling(dt, is_grad, refmax, relax), atol = t_std_atol(dt, refmax, relax);
    int ok = 1;
    t_checks++;
    if (!(err <= ceiling)) {
        t_fail_at(__FILE__, __LINE__, "%s %s: max abs err %.3e > ceiling %.3e at max|ref| %.3e (%s)", fa_algo_name(algo),
                  what, err, ceiling, refmax, dt == FA_DTYPE_F32 ? "f32 relative error" : "sanity ceiling");
        ok = 0;
    }
    if (algo != FA_ALGO_STANDARD) {
        t_checks++;
        if (!(err <= 2 * err_std + atol)) {
            t_fail_at(__FILE__, __LINE__, "%s %s: max abs err %.3e > 2 x standard's %.3e + atol %.3e", fa_algo_name(algo),
                      what, err, err_std, atol);
            ok = 0;
        }
    }
    return ok;
}
