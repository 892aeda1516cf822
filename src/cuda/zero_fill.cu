/* The outputs of a call without a single (query, key) pair (fa_problem_empty, fa_plan.zero_fill): out = 0 and
 * LSE = -inf, or zero gradients, each view filled by one grid-stride kernel. No attention kernel runs, so none of
 * them sees a zero extent (a grid of 0 CTAs does not launch). Graph-capturable: kernels only. */
#include "plan.h"
#include "sinks.h"

#include <math.h>

/* A [b, s, h, d] view of 2- or 4-byte elements. */
typedef struct fa_zero_view {
    char *p;
    int64_t s, h, d, sb, ss, sh;
    int es;
} fa_zero_view;

__global__ void fa_zero_view_kernel(const fa_zero_view v, int64_t n) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = e / v.d;
        const int64_t c = e % v.d, h = r % v.h;
        r /= v.h;
        char *x = v.p + ((r / v.s) * v.sb + (r % v.s) * v.ss + h * v.sh + c) * v.es;
        if (v.es == 4) *(float *)x = 0.f;
        else *(unsigned short *)x = 0;
    }
}

__global__ void fa_ninf_kernel(float *x, int64_t n) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x)
        x[e] = -INFINITY;
}

/* Enough CTAs of 256 threads for n elements, at most 1024 (each thread loops). */
static unsigned fill_grid(int64_t n) { return (unsigned)((n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024); }

static cudaError_t zero_view(const fa_tensor *t, cudaStream_t st) {
    const int64_t n = t->batch * t->seqlen * t->heads * t->head_dim;
    if (!n) return cudaSuccess;
    const fa_zero_view v = {(char *)t->data, t->seqlen, t->heads, t->head_dim, t->stride_batch, t->stride_seq,
                            t->stride_head, (int)fa_dtype_size(t->dtype)};
    fa_zero_view_kernel<<<fill_grid(n), 256, 0, st>>>(v, n);
    return cudaGetLastError();
}

fa_status fa_cuda_zero_fill(fa_context *ctx, const fa_problem *p) {
    const cudaStream_t st = fa_cuda_stream_of(ctx);
    cudaError_t e = cudaSuccess;
    if (p->is_backward) {
        const fa_tensor *g[3] = {&p->dq, &p->dk, &p->dv};
        for (int i = 0; i < 3 && e == cudaSuccess; i++) e = zero_view(g[i], st);
        if (e == cudaSuccess && p->d_sinks) e = cudaMemsetAsync(p->d_sinks, 0, (size_t)p->hq * sizeof(float), st);
    } else {
        e = zero_view(&p->o, st);
        const int64_t n = p->q.batch * p->hq * p->q.seqlen;
        if (e == cudaSuccess && p->lse && n) {
            fa_ninf_kernel<<<fill_grid(n), 256, 0, st>>>(p->lse, n);
            e = cudaGetLastError();
        }
        if (e == cudaSuccess && p->sinks) e = fa_cuda_sinks_join(p, p->lse, st); /* LSE = the sink, no keys */
    }
    if (e != cudaSuccess)
        return fa_fail(ctx, FA_ERR_DEVICE, "cuda.zero_fill: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    return FA_OK;
}
