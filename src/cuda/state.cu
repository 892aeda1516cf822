/* The CUDA context's state: the accessors the plan, the run and the KV-cache path share (state.h). Host code. */
#include "state.h"

const fa_cuda_tuning *fa_cuda_tuning_of(const fa_context *ctx) { return &((const fa_cuda_state *)ctx->cuda)->tune; }
cudaStream_t fa_cuda_stream_of(const fa_context *ctx) { return ((const fa_cuda_state *)ctx->cuda)->stream; }

/* A device buffer of the context grown to at least bytes, never shrunk; *grown says whether it was (re)allocated.
 * The old one is freed after the stream drains: calls before may still read it. */
fa_status fa_cuda_grow(fa_context *ctx, void **buf, size_t *size, size_t bytes, const char *what, int *grown) {
    fa_cuda_state *s = (fa_cuda_state *)ctx->cuda;
    if (grown) *grown = 0;
    if (bytes <= *size) return FA_OK;
    if (*buf) {
        FA_CUDA_TRY(ctx, cudaStreamSynchronize(s->stream));
        cudaFree(*buf);
        *buf = NULL;
        *size = 0;
    }
    if (cudaMalloc(buf, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        *buf = NULL;
        return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "%s: cudaMalloc of %zu bytes failed", what, bytes);
    }
    *size = bytes;
    if (grown) *grown = 1;
    return FA_OK;
}

fa_status fa_cuda_workspace_of(fa_context *ctx, size_t bytes, void **ws) {
    fa_cuda_state *s = (fa_cuda_state *)ctx->cuda;
    fa_status rc = fa_cuda_grow(ctx, &s->ws, &s->ws_size, bytes, "CUDA workspace", NULL);
    *ws = s->ws;
    return rc;
}

/* Counters that every kernel using them leaves at zero: zeroed (on the stream) when allocated or grown, apart from
 * the workspace, which other calls overwrite. */
fa_status fa_cuda_counters_of(fa_context *ctx, size_t n, int **out) {
    fa_cuda_state *s = (fa_cuda_state *)ctx->cuda;
    int grown;
    fa_status rc = fa_cuda_grow(ctx, (void **)&s->counters, &s->counters_bytes, n * sizeof(int), "CUDA split counters",
                                &grown);
    if (rc != FA_OK) return rc;
    if (grown) FA_CUDA_TRY(ctx, cudaMemsetAsync(s->counters, 0, s->counters_bytes, s->stream));
    *out = s->counters;
    return FA_OK;
}

