/* Learnable sinks on CUDA (opts.sinks, opts.d_sinks; core/sink.h): the forward's join after any family has run (and
 * after the numerics contract's fix-up, so that every row, recomputed or not, gets its sink once) and the backward's
 * d sinks. Stream-ordered, no allocation, no host synchronisation. docs/numerics.md ("Attention sinks"). */
#ifndef FA_CUDA_SINKS_H
#define FA_CUDA_SINKS_H

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "core/internal.h"
#ifdef __cplusplus
}
#endif

/* Every row of out and lse (the caller's or the contract's [B, Hq, Sq] LSE over the keys; NULL: rows without keys)
 * joined by its head's sink: LSE = log(e^LSE + e^sink), out ·= e^(LSE_keys − LSE). */
cudaError_t fa_cuda_sinks_join(const fa_problem *p, float *lse, cudaStream_t st);
/* d_sinks[h] = −Σ_{b,i} exp(sinks[h] − LSE) · rowsum(dO ∘ O): one CTA per head, summed in a fixed order
 * (deterministic); written, not accumulated into. */
cudaError_t fa_cuda_sinks_grad(const fa_problem *p, cudaStream_t st);

#endif
