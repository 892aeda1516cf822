/* One case against the oracle on a context, for every algorithm asked for. */
#ifndef FA_TESTLIB_RUN_H
#define FA_TESTLIB_RUN_H

#include "cases.h"
#include "flashattn.h"

#define T_ALGO_BIT(a) (1u << (a))
#define T_ALL_ALGOS (T_ALGO_BIT(FA_ALGO_STANDARD) | T_ALGO_BIT(FA_ALGO_FLASH1) | T_ALGO_BIT(FA_ALGO_FLASH2))

/* Forward of every algorithm in `algos` (STANDARD always runs: it is the baseline) against the oracle: status,
 * every output element written (NaN-poisoned first), nothing outside the view written, inputs unchanged, out and
 * lse within the rule of tolerance.h. Returns the number of failures. */
int t_run_forward(fa_context *ctx, const t_case *c, unsigned algos);
/* Forward + backward of every algorithm in `algos` against the oracle's gradients. */
int t_run_backward(fa_context *ctx, const t_case *c, unsigned algos);

#endif
