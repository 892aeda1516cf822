/* Learnable attention sinks (opts.sinks): the one formula by which a head's sink joins a finished row, compiled by
 * the C backends and by nvcc alike. The sink is a logit that attends to nothing: it adds exp(sink) to the row's
 * softmax denominator and nothing to its numerator. Every path keeps its usual online softmax over the keys and
 * joins the sink once at the end of the row (or of the merge of a row's splits), so it is counted exactly once.
 * docs/numerics.md ("Attention sinks"). */
#ifndef FA_SINK_H
#define FA_SINK_H

#include "core/visible.h"

#include <math.h>

/* A row's key state — m (natural-log units; -inf when the row saw no key) and ℓ = Σ_j exp(s_j − m) — joined by the
 * sink: *lse = log(exp(sink) + ℓ·exp(m)), and the factor exp(m − *lse) that turns the unnormalised Σ_j exp(s_j − m)
 * v_j into O (a row without keys: factor 0, LSE = sink). Float64, so that m + log ℓ loses nothing to the join.
 * NaN in m, ℓ or the sink, or a sink of +inf, gives NaN (the contract's NaN row); a sink of -inf is no sink. */
FA_HD float fa_sink_join(double m, double l, float sink, float *lse) {
    const double s = sink;
    if (m != m || l != l || s != s || s == INFINITY) {
        *lse = NAN;
        return NAN;
    }
    const double mx = m > s ? m : s;
    if (mx == -INFINITY) { /* no key and no sink */
        *lse = -INFINITY;
        return 0.0f;
    }
    const double wk = m == -INFINITY ? 0.0 : exp(m - mx), den = l * wk + exp(s - mx);
    *lse = (float)(mx + log(den));
    return (float)(wk / den);
}

/* The same for a row already normalised over its keys (O = Σ_j P_j v_j, lse_keys = m + log ℓ): the factor O is
 * multiplied by, exp(lse_keys − *lse) = 1 / (1 + exp(sink − lse_keys)). */
FA_HD float fa_sink_join_lse(float lse_keys, float sink, float *lse) {
    return lse_keys == -INFINITY ? fa_sink_join(-INFINITY, 0.0, sink, lse) : fa_sink_join(lse_keys, 1.0, sink, lse);
}

/* fa_sink_join_lse in float arithmetic, for the GPU kernels' epilogues that fold the join into their 1/ℓ (16-bit
 * out: the rounding of the float join, a few ulp of |lse_keys| in the factor, is far below out's). */
FA_HD float fa_sink_join_lse_f32(float lse_keys, float sink, float *lse) {
    if (lse_keys != lse_keys || sink != sink || sink == INFINITY) {
        *lse = NAN;
        return NAN;
    }
    if (lse_keys == -INFINITY) { /* no key: the row's whole weight is on the sink (O = 0) */
        *lse = sink;
        return 0.0f;
    }
    if (sink == -INFINITY) {
        *lse = lse_keys;
        return 1.0f;
    }
    const float mx = lse_keys > sink ? lse_keys : sink, lo = lse_keys > sink ? sink : lse_keys;
    *lse = mx + log1pf(expf(lo - mx));
    return expf(lse_keys - *lse);
}

/* log(exp(lse_keys) + exp(sink)) in float64, with fa_sink_join's rules (the float64 recomputes of the contract). */
FA_HD double fa_sink_lse(double lse_keys, float sink) {
    const double s = sink;
    if (lse_keys != lse_keys || s != s || s == INFINITY) return NAN;
    const double mx = lse_keys > s ? lse_keys : s;
    if (mx == -INFINITY) return -INFINITY;
    return mx + log(exp(lse_keys - mx) + exp(s - mx));
}

#endif
