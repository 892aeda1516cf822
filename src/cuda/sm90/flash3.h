/* FLASH3 forward for Hopper (sm_90a): wgmma, TMA, a producer warpgroup and two consumer warpgroups. Tensors are
 * [batch, seqlen, heads, head_dim] with head_dim contiguous and the other strides in elements; LSE is [batch,
 * heads_q, seqlen_q] fp32, natural log (−inf for a row that sees no key; its O row is 0). GQA: query head h reads
 * K/V head h / (heads_q / heads_k). Plain C so that the backend's C code can include it. */
#ifndef FA_SM90_FLASH3_H
#define FA_SM90_FLASH3_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { FA3_BF16 = 0, FA3_FP16 = 1 };

typedef struct fa3_params {
    const void *q, *k, *v; /* 16-bit, 16-byte aligned */
    void *o;
    float *lse; /* may be NULL */
    int64_t q_batch_stride, q_row_stride, q_head_stride;
    int64_t k_batch_stride, k_row_stride, k_head_stride;
    int64_t v_batch_stride, v_row_stride, v_head_stride;
    int64_t o_batch_stride, o_row_stride, o_head_stride;
    int batch, seqlen_q, seqlen_k, heads_q, heads_k, head_dim;
    float scale;     /* softmax scale, usually 1/sqrt(head_dim) */
    float softcap;   /* 0: off; else scores are softcap·tanh(scale·q·k / softcap) */
    int causal;      /* bottom-right aligned: row i sees keys j <= i + seqlen_k - seqlen_q */
    int window_left; /* -1: unbounded; with causal = 0, window_right -1 too for plain attention */
    int window_right;
    int dtype; /* FA3_BF16 or FA3_FP16 */
    int ctas;  /* CTAs of the persistent grid; 0 = one per SM of the current device (queried) */
    int *tile_counter; /* device int, zero at launch: masked calls take their tiles longest first from it (the
                        * dynamic scheduler); NULL = the static order for every call */
} fa3_params;

/* What fa3_fwd runs for p: its kernel name (static), tiles Br x Bc, threads and dynamic shared memory per CTA, and
 * the tiles of Br query rows the persistent CTAs share. */
typedef struct fa3_shape {
    const char *kernel;
    int br, bc, threads;
    size_t smem;
    long long tiles;
} fa3_shape;
void fa3_shape_of(const fa3_params *p, fa3_shape *s);

/* 1 if fa3_fwd can run p on a device of compute capability cc_major.cc_minor, else 0 with the reason in why. */
int fa3_supported(const fa3_params *p, int cc_major, int cc_minor, char *why, size_t why_len);

/* Launches the forward on stream; checks nothing that fa3_supported checks. Returns the launch error. */
cudaError_t fa3_fwd(const fa3_params *p, cudaStream_t stream);

/* The same with a chosen schedule, for the lab: 0 serial (S, softmax, P V in turn), 1 the softmax of block j+1
 * overlapped with P_j V_j inside each warpgroup, 2 that plus ping-pong between the two warpgroups (the default),
 * 3 schedule 2 with the wide key block (Bc 192 / 176 / 80 at d = 64 / 128 / 256 instead of 128 / 128 / 64).
 * Built with FA3_LAB_SCHEDULES only (the lab, bench/lab/flash3). */
cudaError_t fa3_fwd_schedule(const fa3_params *p, int schedule, cudaStream_t stream);


#ifdef __cplusplus
}
#endif

#endif
