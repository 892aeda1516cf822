/* The CUDA plan (plan.cu, fa_cuda_plan in core/internal.h): the one place that decides, for a validated problem,
 * which family row runs (family.h) with what tiles, launch shape, workspace and modelled traffic. This header gathers
 * what the plan's readers take: the family table and the context's state (state.h). Host code. */
#ifndef FA_CUDA_PLAN_H
#define FA_CUDA_PLAN_H

#include "family.h"
#include "state.h"

/* The outputs of a zero_fill plan (fa_problem_empty) on the context's stream (zero_fill.cu). */
fa_status fa_cuda_zero_fill(fa_context *ctx, const fa_problem *p);
/* seqused_q/k: the padding rows of a packed batch's spans written as the header defines them, after the call's
 * kernels (seqused.cu); nothing without seqused. */
cudaError_t fa_cuda_zero_unused(const fa_problem *p, cudaStream_t st);

#endif
