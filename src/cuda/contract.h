/* The numerics contract on the CUDA backend (docs/numerics.md), for every CUDA algorithm alike: a scan of the
 * inputs before the algorithm runs, and a fix-up after it that recomputes, in float64 from the definition, exactly
 * the (sequence, head) items the scan could not certify. No host synchronisation and no allocation: the workspace
 * is a part of the plan's layout (plan.cu). Host code; the kernels are in contract.cu. */
#ifndef FA_CUDA_CONTRACT_H
#define FA_CUDA_CONTRACT_H

#include "params.h"

extern "C" {
#include "core/arena.h"
}

/* Items: (sequence, query head) forward, (sequence, K/V head) backward. */
typedef struct fa_contract_ws {
    unsigned *scan;         /* [0]: count of uncertified items; then per item the maxima of |q|, |k|, |v|, |o|, |dO|
                             * as bit patterns of the dtype (NaN and ±inf above every finite value) */
    unsigned *todo;         /* the uncertified items, scan[0] of them */
    double *row_lse, *row_dsum; /* backward: float64 LSE and D = rowsum(dO ∘ O) per query row (LSE layout) */
    float *lse;                 /* forward without the caller's LSE: the kernels write theirs here for the check */
} fa_contract_ws;

/* A self-checking forward kernel (fa_cuda_family.checks_outputs) marks item (b, h) uncertified with
 * atomicOr(&fa_cuda_params.o_check[(b·hq + h)·FA_CONTRACT_STRIDE], 1) when a logit it computed is not finite
 * (before the mask: an inf or NaN in q or k, which −inf logits and a softcap's tanh can hide from the outputs), an
 * element of out is not finite, or an LSE is not certified (FA_LSE_CERTIFIED): the same test as the contract's own
 * scan of k and check of out and LSE, which then do not run. */
#define FA_CONTRACT_STRIDE 5
#define FA_LSE_CERTIFIED 0x1p23f /* |LSE| below this: |max logit| < 2^24, where the kernels' exp2 is exact enough */
unsigned *fa_contract_o_flags(const fa_contract_ws *w);

/* The contract's part of the device workspace (fa_cuda_ws_layout calls it). */
void fa_contract_layout(fa_arena *a, const fa_problem *p, fa_contract_ws *w);
/* Adds the scan's HBM traffic (every input read once, the item maxima written) to the plan's model; self_checked:
 * the forward's kernel checks itself (fa_cuda_family.checks_outputs). */
void fa_contract_traffic(const fa_problem *p, int self_checked, fa_plan *plan);
/* Before the algorithm: clear; backward: scan the inputs, list the uncertified items. */
cudaError_t fa_contract_scan(const fa_cuda_params *c, const fa_problem *p, const fa_contract_ws *w, cudaStream_t st);
/* After the algorithm: forward: check the outputs, list the uncertified items; then rewrite the outputs of the
 * listed items (CTAs: the grid of the fix-up kernels). */
cudaError_t fa_contract_fix(const fa_cuda_params *c, const fa_problem *p, const fa_contract_ws *w, int ctas,
                            cudaStream_t st);

#endif
