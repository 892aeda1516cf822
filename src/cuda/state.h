/* The CUDA context's state (fa_context.cuda) and its accessors: below the plan, the run and the KV-cache path, which
 * all read it. backend.cu creates and destroys it. Host code. */
#ifndef FA_CUDA_STATE_H
#define FA_CUDA_STATE_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "core/internal.h"
}

/* Settings read once at context creation and consulted by the plan. */
typedef struct fa_cuda_tuning {
    int device;     /* the context's device (queries the plan makes once per device and kernel) */
    int sm_count;   /* the device's SMs (FLASH3's persistent grid, the FLASH2 backward's last-wave split) */
    int fwd_warps;  /* FA_CUDA_FLASH2_FWD_WARPS (0 = the table's default): benchmarks only */
    int split_rows; /* FA_CUDA_BWD_SPLIT_ROWS: split the FLASH2 backward's last wave for walks of at least this many
                     * query rows; < 0 = never. Tests, benchmarks */
    int flash3_cluster; /* FA_CUDA_FLASH3_CLUSTER (default 1; 0 = off): the FLASH3 forward's 2-CTA clusters where its
                         * rows have them (wgmma/tiles.h). Benchmarks (A/B), tests */
    int flash3_qbuf;  /* FA_CUDA_FLASH3_QBUF (default 1; 0 = off): the FLASH3 forward's two Q buffers where its rows
                       * hold them (wgmma/tiles.h qb). Benchmarks (A/B), tests */
    int flash3_early; /* FA_CUDA_FLASH3_EARLY_TILE (default 0: slower at d = 128 causal from 2k keys; 1 = on): the
                       * FLASH3 forward's producer takes the next tile's index a tile ahead. Benchmarks (A/B), tests */
    int flash3_bwd_pairs; /* FA_CUDA_FLASH3_BWD_PAIRS (default 0; 1 = on): the FLASH3 backward's rows for v with a
                           * head_dim of its own ((192, 128), wgmma/tiles.h), off until they have run on a GPU. Tests */
    int flash3_bwd_fused_dq; /* FA_CUDA_FLASH3_BWD_FUSED_DQ: the FLASH3 backward's main kernel converts dQ
                              * (wgmma/flash3_bwd_dq.cuh) in the default backward (1), also the deterministic (2), or
                              * neither (0: the separate conversion pass; the default until it has run on a GPU).
                              * Benchmarks (A/B), tests */
} fa_cuda_tuning;
/* The default of split_rows (the split's measurements: docs/cuda-kernels.md). */
#define FA_CUDA_BWD_SPLIT_ROWS 2048

typedef struct fa_cuda_state {
    int device;
    fa_cuda_tuning tune; /* read at creation, consulted by the plan */
    cudaStream_t stream;
    cublasHandle_t blas;
    void *ws;          /* device workspace, grown, never shrunk */
    size_t ws_size;
    int *counters;     /* decoding's split counters, zero between calls (fa_cuda_counters_of) */
    size_t counters_bytes;
    int *kv_fault;     /* decoding's fault record (kvcache/kvcache.h), zero = none: allocated at creation, so that a
                        * call allocates nothing for it and a captured graph records into it */
} fa_cuda_state;

#define FA_CUDA_TRY(ctx, call)                                                                             \
    do {                                                                                                   \
        cudaError_t fa_e_ = (call);                                                                        \
        if (fa_e_ != cudaSuccess)                                                                          \
            return fa_fail(ctx, FA_ERR_DEVICE, "%s:%d: %s: %s", __FILE__, __LINE__, #call,                 \
                           cudaGetErrorString(fa_e_));                                                     \
    } while (0)

const fa_cuda_tuning *fa_cuda_tuning_of(const fa_context *ctx);
cudaStream_t fa_cuda_stream_of(const fa_context *ctx);
/* A device buffer of the context (*buf, *size bytes) grown to at least bytes, never shrunk: a stream sync and an
 * allocation when it grows; *grown (may be NULL) says whether it did. what names it in the out-of-memory message. */
fa_status fa_cuda_grow(fa_context *ctx, void **buf, size_t *size, size_t bytes, const char *what, int *grown);
/* The context's cached workspace grown to at least bytes (an allocation and a stream sync when it grows). */
fa_status fa_cuda_workspace_of(fa_context *ctx, size_t bytes, void **ws);
/* The context's split counters (n ints, zero between calls: every kernel that counts leaves them at zero). */
fa_status fa_cuda_counters_of(fa_context *ctx, size_t n, int **out);

#endif
