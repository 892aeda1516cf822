/* The pass rule, from flash-attn's tests (docs/testing.md):
 *     max|out − ref64| ≤ 2 · max|standard_same_dtype − ref64| + atol
 * where ref64 is the float64 oracle, standard_same_dtype is FA_ALGO_STANDARD run in the same dtype, and
 * atol = one unit in the last place of the dtype at max|ref| (f32: 5e-6 relative). On top, every algorithm
 * (STANDARD included) must stay under a ceiling: in f32 a relative error (max abs err / max|ref|) under 1e-5, in
 * f16/bf16 a few units of the dtype. Gradients take max|ref| over dQ, dK and dV together: one of them can cancel
 * to ~0 (one visible key gives dS = 0) while its rounding noise keeps the size of the others. */
#ifndef FA_TESTLIB_TOLERANCE_H
#define FA_TESTLIB_TOLERANCE_H

#include "flashattn.h"

double t_atol(fa_dtype dt, double refmax);
/* The ceiling on max abs err for any algorithm; relax (0 = 1) multiplies its relative part. */
/* The absolute slack of the 2 × standard rule: t_atol, times relax where relax > 1 (a case whose rounding every
 * implementation suffers, e.g. logits of 1e4, where STANDARD's own error depends on its summation order). */
double t_std_atol(fa_dtype dt, double refmax, double relax);
double t_ceiling(fa_dtype dt, int is_grad, double refmax, double relax);

typedef struct t_verdict {
    int ok;
    double allowed; /* the tighter of the bounds that apply */
    double ratio;   /* err / allowed: ≤ 1 passes */
    int by_ceiling; /* 1: the ceiling failed (or is the bound that applies); 0: the 2 × standard rule */
} t_verdict;

/* One output (out, dq, dk or dv): err = max|x − ref64|, err_std = STANDARD's error in the same dtype; with
 * is_standard (or when no STANDARD result exists) only the ceiling applies. */
t_verdict t_judge(fa_dtype dt, int is_standard, int is_grad, double err, double err_std, double refmax, double relax);
/* LSE (fp32 in every dtype): err ≤ 2e-5 · scale, and for the others ≤ 2 · STANDARD's + 4e-6 · scale, where
 * scale = max(1, max|lse_ref|) (t_lse_scale). */
t_verdict t_judge_lse(int is_standard, double err, double err_std, double scale);
double t_lse_scale(const double *lse_ref, int64_t n);

/* The max|ref| d sinks is held against: the largest of max|ds| (the oracle's d sinks), max ds_mag (its terms' size,
 * t_oracle_backward_sinks: a cancelling sum, into whose terms a 16-bit P carries its rounding) and gm (the other
 * gradients'); n heads. */
double t_dsinks_scale(const double *ds, const double *ds_mag, int64_t n, double gm);

/* t_judge reported through the harness: a failure is counted and printed. Returns 1 if it passed. */
int t_check_err(const char *what, fa_algo algo, fa_dtype dt, double err, double err_std, double refmax,
                int is_grad, double relax);

#endif
