/* The one parameter block of every CUDA kernel family (the kernels take it by value; FLASH3's launcher derives its
 * kernel's arguments from it), and the launchers' declarations. Filled by backend.cu from a validated fa_problem and
 * the plan's workspace. Strides are in elements; head_dim is contiguous. */
#ifndef FA_CUDA_PARAMS_H
#define FA_CUDA_PARAMS_H

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

typedef struct fa_cuda_params {
    const void *q, *k, *v, *o, *dout; /* inputs (o is an input of the backward) */
    void *out, *dq, *dk, *dv;         /* outputs */
    float *lse;                       /* forward: output or NULL; backward: input */
    float *dsum;                      /* backward: D = rowsum(dO ∘ O), laid out like lse */
    float *lse2;                      /* backward (flash): LSE·log2(e), +inf where LSE = −inf (P = 0); or NULL */
    float *dq_acc;                    /* fp32 [rows like lse][d] dQ accumulator */
    float *dk_acc, *dv_acc;           /* GQA: fp32 per-query-head dK, dV [b, hq, sk, d] (varlen [hq, total_k, d]) */
    float *o_acc, *row_m, *row_l;     /* FLASH1: fp32 O, m, l kept in HBM between outer steps */
    float *tail_acc;                  /* FLASH2 backward: fp32 dK, dV of the last wave's split K/V blocks, or NULL */
    int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, o_sb, o_ss, o_sh;
    int64_t do_sb, do_ss, do_sh, dq_sb, dq_ss, dq_sh, dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh;
    int batch, hq, hk, group, d;
    int sq, sk;             /* seqlens (varlen: the bounds the grid is sized for, opts.max_seqlen_q/k) */
    int total_q, total_k;   /* q.seqlen, k.seqlen (rows of the packed tensors under varlen) */
    const int *cu_q, *cu_k; /* the caller's device cu_seqlens, or NULL (read through fa_get_seq, clamped) */
    float scale;            /* softmax scale */
    float scale_log2;       /* scale·log2(e), or log2(e) with softcap (scale is applied inside the cap) */
    float softcap;          /* 0 = off */
    float softcap_scale;    /* scale / softcap (0 when off), divided once on the host: kept in the kernels, the
                             * quotient was a loop-invariant register that ptxas spilled (FLASH1 d = 128) */
    int wl, wr;             /* window, -1 = unbounded; causal folded in as wr = 0 */
    /* Fields past this point are appended, so that the mma.sync kernels see the offsets above unchanged. */
    int dtype;              /* fa_dtype of every tensor */
    int *tile_counter;      /* FLASH3: a device int, zero at launch, for the dynamic scheduler of masked calls; or NULL */
    const float *q_descale, *k_descale, *v_descale; /* FP8 inputs: [batch][hk] fp32 factors, per (batch, K/V head),
                                                     * that turn the stored values back into real ones; NULL today */
    int *dq_turns;          /* FLASH3 deterministic backward: [batch][hq][query blocks] counters, or NULL */
    const float *sinks;     /* opts.sinks [hq], or NULL: joined by the kernel's epilogue (sinks_joined) or by the pass
                             * after the kernel and the contract's fix-up (sinks.h) */
    const int *used_q, *used_k; /* opts.seqused_q/k (device, with cu_q), or NULL: read through fa_get_seq, clamped */
    int chunk;              /* attention_chunk, 0 = off (core/visible.h; at most 2^30: the same keys as any larger
                             * chunk for sequences below 2^30); the FLASH3 backward refuses it */
    unsigned chunk_mul;     /* diag / chunk = umulhi(diag, chunk_mul) >> chunk_shift for 0 <= diag < 2^31 (a division
                             * costs the flash kernels' masked steps registers they do not have); 0: chunk 1 */
    int chunk_shift;
    int d_v;                /* v's head_dim, and out's, dout's, dv's (dv); d is q's and k's (dqk) */
    unsigned *o_check;      /* forward of a self-checking family (fa_cuda_family.checks_outputs): the numerics
                             * contract's item flags, item (b, h) at o_check[(b·hq + h)·FA_CONTRACT_STRIDE] (contract.h),
                             * which the kernel marks itself; NULL for the other families */
    void *v_t;              /* FLASH3 FP8 forward: V transposed, [batch][hk][d][sk rounded up to 32] (flash3_fp8.cuh) */
    int o_dtype;            /* fa_dtype of out (dtype's, except after FP8 inputs) */
    int sinks_joined;       /* forward with sinks: 1 when the family joins them in its epilogue (fa_cuda_family.
                             * joins_sinks): out and LSE hold the sink, and the contract's check and recompute know it */
    float *d_sinks;         /* backward: opts.d_sinks [hq] or NULL, written from D by the pre-pass's reduction (sinks.h) */
} fa_cuda_params;

#ifdef __cplusplus
extern "C" {
#endif
#include "core/internal.h"

/* One launcher per kernel family: runs exactly the plan (plan.cu) — its tile row (plan->entry), grid, threads,
 * shared memory and split (plan->aux); dtype 1 = f16, 2 = bf16. Each family's fa_*_instance maps a tile row to its
 * template instance (a plain switch) and gives that instance's shared memory, which the plan records. The family
 * rows (family.h) call them. */
typedef cudaError_t (*fa_cuda_launch_fn)(const fa_cuda_params *p, const fa_plan *plan, cudaStream_t st);
typedef struct fa_cuda_instance {
    fa_cuda_launch_fn f16, bf16;
    size_t smem; /* dynamic shared memory per CTA of the main kernel: sizeof its shared-storage struct */
} fa_cuda_instance;
int fa_flash1_fwd_instance(int row, fa_cuda_instance *k);
int fa_flash2_fwd_instance(int row, fa_cuda_instance *k);
int fa_flash1_bwd_instance(int row, fa_cuda_instance *k);
int fa_flash2_bwd_instance(int row, int deterministic, fa_cuda_instance *k);
cudaError_t fa_flash1_fwd_launch(const fa_cuda_params *p, const fa_plan *plan, int dtype, cudaStream_t st);
cudaError_t fa_flash2_fwd_launch(const fa_cuda_params *p, const fa_plan *plan, int dtype, cudaStream_t st);
cudaError_t fa_flash1_bwd_launch(const fa_cuda_params *p, const fa_plan *plan, int dtype, cudaStream_t st);
cudaError_t fa_flash2_bwd_launch(const fa_cuda_params *p, const fa_plan *plan, int dtype, cudaStream_t st);
int fa_flash3_fwd_instance(int row, fa_cuda_instance *k);
cudaError_t fa_flash3_fwd_launch(const fa_cuda_params *p, const fa_plan *plan, cudaStream_t st);
/* 2-CTA clusters of FLASH3 forward row `row`'s cluster instance that device holds at once (asked once per device
 * and row); 0 where the row has none or the query failed */
int fa_flash3_fwd_clusters(int row, int device);
int fa_flash3_bwd_instance(int row, int deterministic, fa_cuda_instance *k);
cudaError_t fa_flash3_bwd_launch(const fa_cuda_params *p, const fa_plan *plan, cudaStream_t st);

/* Backward helpers (mma_sync/bwd_util.cu). */
/* D = rowsum(dO∘O), and for the flash kernels (p->lse2 set) LSE·log2e; zero_dq: also clear p->dq_acc */
cudaError_t fa_bwd_dsum_launch(const fa_cuda_params *p, int dtype, int zero_dq, cudaStream_t st);
cudaError_t fa_bwd_dq_convert_launch(const fa_cuda_params *p, int dtype, cudaStream_t st); /* dq = dq_acc·scale */
cudaError_t fa_bwd_dkv_reduce_launch(const fa_cuda_params *p, int dtype, cudaStream_t st); /* GQA sum of dk/dv_acc */

#ifdef __cplusplus
}
#endif
#endif
