/* The CUDA backend entry points when flashattn is built without CUDA: every one says so. */
#include "core/kvcache.h"

#include <stdio.h>

int fa_cuda_built(void) { return 0; }
int fa_cuda_device_count(void) { return 0; }
fa_status fa_cuda_create(fa_context *ctx, int device) {
    (void)device;
    return fa_fail(ctx, FA_ERR_BACKEND_UNAVAILABLE, "backend: FA_BACKEND_CUDA is not built into this library "
                                                    "(configure with a CUDA compiler, -DFA_CUDA=ON)");
}
void fa_cuda_destroy(fa_context *ctx) { (void)ctx; }
fa_status fa_cuda_set_stream(fa_context *ctx, void *stream) {
    (void)stream;
    return fa_fail(ctx, FA_ERR_BACKEND_UNAVAILABLE, "CUDA is not built into this library");
}
fa_status fa_cuda_plan(const fa_context *ctx, const fa_problem *p, fa_plan *plan, char *why, size_t why_len) {
    (void)ctx, (void)p, (void)plan;
    snprintf(why, why_len, "CUDA is not built into this library");
    return FA_ERR_BACKEND_UNAVAILABLE;
}
fa_status fa_cuda_run(fa_context *ctx, const fa_problem *p, const fa_plan *plan, fa_stats *st) {
    (void)p, (void)plan, (void)st;
    return fa_fail(ctx, FA_ERR_BACKEND_UNAVAILABLE, "CUDA is not built into this library");
}
fa_status fa_cuda_kv_plan(const fa_context *ctx, const fa_kv_problem *p, fa_plan *plan, char *why, size_t why_len) {
    (void)ctx, (void)p, (void)plan;
    snprintf(why, why_len, "CUDA is not built into this library");
    return FA_ERR_BACKEND_UNAVAILABLE;
}
fa_status fa_cuda_kv_run(fa_context *ctx, const fa_kv_problem *p, const fa_plan *plan, fa_stats *st) {
    (void)p, (void)plan, (void)st;
    return fa_fail(ctx, FA_ERR_BACKEND_UNAVAILABLE, "CUDA is not built into this library");
}
fa_status fa_cuda_merge(fa_context *ctx, const fa_merge_problem *m) {
    (void)m;
    return fa_fail(ctx, FA_ERR_BACKEND_UNAVAILABLE, "CUDA is not built into this library");
}
fa_status fa_cuda_kv_check(fa_context *ctx) {
    return fa_fail(ctx, FA_ERR_BACKEND_UNAVAILABLE, "CUDA is not built into this library");
}
fa_status fa_cuda_quantize(fa_context *ctx, const fa_quant_problem *q) {
    (void)q;
    return fa_fail(ctx, FA_ERR_BACKEND_UNAVAILABLE, "CUDA is not built into this library");
}
