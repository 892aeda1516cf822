/* The CUDA context's state: the accessors the plan, the run and the KV-cache path share (state.h). Host code. */
#include "state.h"

const fa_cuda_tuning *fa_cuda_tuning_of(const fa_context *ctx) { return &((const fa_cuda_state *)ctx->cuda)->tune; }
cudaStream_t fa_cuda_stream_of(const fa_context *ctx) { return ((const fa_cuda_state *)ctx->cuda)->stream; }

/* The cached workspace, grown to at least bytes (never shrunk). */
static fa_status fa_cuda_ws_grow(fa_context *ctx, fa_cuda_state *s, size_t bytes) {
    if (bytes <= s->ws_size) return FA_OK;
    if (s->ws) {
        FA_CUDA_TRY(ctx, cudaStreamSynchronize(s->stream));
        cudaFree(s->ws);
        s->ws = NULL;
        s->ws_size = 0;
    }
    if (cudaMalloc(&s->ws, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        s->ws = NULL;
        return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "CUDA workspace: cudaMalloc of %zu bytes failed", bytes);
    }
    s->ws_size = bytes;
    return FA_OK;
}

fa_status fa_cuda_workspace_of(fa_context *ctx, size_t bytes, void **ws) {
    fa_cuda_state *s = (fa_cuda_state *)ctx->cuda;
    fa_status rc = fa_cuda_ws_grow(ctx, s, bytes);
    *ws = s->ws;
    return rc;
}

/* Counters that every kernel using them leaves at zero: zeroed (on the stream) when allocated or grown, never
 * shrunk, apart from the workspace, which other calls overwrite. */
fa_status fa_cuda_counters_of(fa_context *ctx, size_t n, int **out) {
    fa_cuda_state *s = (fa_cuda_state *)ctx->cuda;
    if (n > s->counters_n) {
        if (s->counters) {
            FA_CUDA_TRY(ctx, cudaStreamSynchronize(s->stream));
            cudaFree(s->counters);
            s->counters = NULL;
            s->counters_n = 0;
        }
        if (cudaMalloc(&s->counters, n * sizeof(int)) != cudaSuccess) {
            (void)cudaGetLastError();
            s->counters = NULL;
            return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "CUDA split counters: cudaMalloc of %zu bytes failed",
                           n * sizeof(int));
        }
        FA_CUDA_TRY(ctx, cudaMemsetAsync(s->counters, 0, n * sizeof(int), s->stream));
        s->counters_n = n;
    }
    *out = s->counters;
    return FA_OK;
}

