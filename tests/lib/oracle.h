/* The float64 oracle: straight loops over the definition, used by the tests and `flashattn check`.
 * Part of the testing library (tests/lib), never of libflashattn. Inputs must be valid (the same arguments
 * fa_forward accepted); they are read in their dtype and widened to double exactly. */
#ifndef FA_TESTLIB_ORACLE_H
#define FA_TESTLIB_ORACLE_H

#include "flashattn.h"

/* q and k share one head_dim (dqk), v and out another (dv; the scale defaults to 1/sqrt(dqk)).
 * out: contiguous [q.batch, q.seqlen, q.heads, dv] doubles; lse (may be NULL): [q.batch, q.heads, q.seqlen]
 * doubles, -INFINITY for a row that sees no key (its out row is 0). opts.sinks (host) join every row's denominator:
 * a row that sees no key then has LSE = its sink. FP8 inputs take opts.q/k/v_descale (host). Returns FA_OK or
 * FA_ERR_INVALID_ARGUMENT. */
fa_status t_oracle_forward(const fa_attn_opts *opts, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                           double *out, double *lse);

/* Gradients of sum(out ∘ dout) (dout: out's shape, dv wide): dq contiguous [q.batch, q.seqlen, q.heads, dqk]; dk, dv
 * contiguous [k.batch, k.seqlen, k.heads, dqk | dv] (GQA: summed over the query heads sharing a K/V head). */
fa_status t_oracle_backward(const fa_attn_opts *opts, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                            const fa_tensor *dout, double *dq, double *dk, double *dv);
/* The same, and (dv_mag non-NULL) dv's magnitude: dv_mag = Σ_i P_ij |dO_i| in dv's layout, the size of the terms
 * dv sums. Where they cancel, max|dv| can be far below it, and so can a relative bound on it. */
fa_status t_oracle_backward_mag(const fa_attn_opts *opts, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                                const fa_tensor *dout, double *dq, double *dk, double *dv, double *dv_mag);
/* The same, and (dsinks non-NULL, with opts.sinks) the sinks' gradient: dsinks [q.heads] = −Σ_{b,i} exp(sink −
 * LSE_i) D_i, D_i = dO_i · O_i; with dsinks_mag non-NULL also the size of its terms, Σ_{b,i} |exp(sink − LSE_i) D_i|
 * [q.heads]. A kernel that rounds P to 16 bits before P V carries one relative rounding of P into each row's O, so
 * into each term, coherently over the row (one key: every column): its d sinks error scales with this sum. */
fa_status t_oracle_backward_sinks(const fa_attn_opts *opts, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                                  const fa_tensor *dout, double *dq, double *dk, double *dv, double *dv_mag,
                                  double *dsinks, double *dsinks_mag);

#endif
