/* Learnable sinks on CUDA (opts.sinks, opts.d_sinks; core/sink.h): the forward's join after a family that does not
 * fold it into its epilogue (fa_cuda_family.joins_sinks; after the numerics contract's fix-up, so that every row,
 * recomputed or not, gets its sink once) and the backward's d sinks from the pre-pass's D. Stream-ordered, no
 * allocation, no host synchronisation. docs/numerics.md ("Attention sinks"). */
#ifndef FA_CUDA_SINKS_H
#define FA_CUDA_SINKS_H

#include <cuda_runtime.h>

#include "params.h"

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
/* c->d_sinks[h] = −Σ_{b,i} exp(sinks[h] − LSE) · D (nothing without d_sinks), after a backward pre-pass has written
 * D = rowsum(dO ∘ O) to c->dsum: row i < n of batch b < nb at c->dsum[(b·hq + h)·dsum_stride + i], its LSE (with
 * the sink) as lse[(b·hq + h)·lse_stride + i] · lse_scale (1: the caller's LSE; ln 2: FLASH3's LSE·log2 e, in D's
 * padded layout, +∞ on padding rows). One CTA per head, summed in a fixed order (deterministic); written, not
 * accumulated into. */
cudaError_t fa_cuda_sinks_grad(const fa_cuda_params *c, const float *lse, double lse_scale, int nb, int n,
                               int64_t dsum_stride, int64_t lse_stride, cudaStream_t st);

#endif
