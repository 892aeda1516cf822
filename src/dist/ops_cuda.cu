/* The ring's element operations on device memory (CUDA contexts), queued on the context's stream. Each is one
 * memory-bound pass over a shard, against the step's quadratic attention. */
#include "cuda/convert.cuh"
#include "cuda/state.h"
#include "dist/ring.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#define FA_RING_THREADS 256


/* A [B, S, H, D] view: element strides of its three outer dims (head_dim contiguous). */
typedef struct view4 {
    int64_t S, H, D, sb, ss, sh;
} view4;

static view4 view_of(const fa_tensor *t) {
    view4 v = {t->seqlen, t->heads, t->head_dim, t->stride_batch, t->stride_seq, t->stride_head};
    return v;
}

__device__ __forceinline__ int64_t strided(const view4 &v, int64_t i) {
    const int64_t e = i % v.D, h = i / v.D % v.H, s = i / (v.D * v.H) % v.S, b = i / (v.D * v.H * v.S);
    return b * v.sb + s * v.ss + h * v.sh + e;
}

/* dst[i] (contiguous) = src[strided(i)], elements of es bytes (2 or 4) */
template <typename E> __global__ void pack_kernel(const E *src, E *dst, view4 v, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = src[strided(v, i)];
}

template <typename T> __global__ void round_kernel(const float *src, T *dst, view4 v, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        fa_st(dst + strided(v, i), src[i]);
}

/* acc rows [row0, row0 + n) of [B, S, HD] += x [B, n, HD] */
template <typename T>
__global__ void accum_kernel(float *acc, const T *x, int64_t S, int64_t HD, int64_t row0, int64_t n, int64_t total) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t e = i % HD, r = i / HD % n, b = i / (HD * n);
        acc[(b * S + row0 + r) * HD + e] += fa_ld(x + i);
    }
}

/* One warp per row (b, i, h) of the block: the running state's row merged with the block's by LSE (the CPU's
 * merge_row in ops_cpu.c); lane 0 writes L after the warp has read it. */
template <typename T>
__global__ void merge_kernel(float *O, float *L, const T *o, const float *l, int64_t S, int64_t H, int64_t D,
                             int64_t row0, int64_t n, int first, int64_t rows) {
    const int64_t r = (int64_t)blockIdx.x * (FA_RING_THREADS / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const int64_t h = r % H, i = r / H % n, b = r / (H * n);
    float *Or = O + ((b * S + row0 + i) * H + h) * D, *Lr = L + (b * H + h) * S + row0 + i;
    const T *orow = o + ((b * n + i) * H + h) * D;
    const float ls = l[(b * H + h) * n + i], la = first ? -INFINITY : *Lr;
    float wa = 0.f, ws = 1.f, lnew = ls;
    if (!first) {
        const float M = fmaxf(la, ls);
        if (isnan(la) || isnan(ls)) wa = ws = lnew = NAN;
        else if (M == -INFINITY) wa = 1.f, ws = 0.f, lnew = -INFINITY; /* neither sees a key: O stays 0 */
        else {
            const float a = expf(la - M), s = expf(ls - M), inv = 1.f / (a + s);
            wa = a * inv, ws = s * inv, lnew = M + logf(a + s);
        }
    }
    for (int64_t e = lane; e < D; e += 32) Or[e] = first ? fa_ld(orow + e) : wa * Or[e] + ws * fa_ld(orow + e);
    __syncwarp();
    if (lane == 0) *Lr = lnew;
}

static unsigned grid_for(int64_t n) {
    const int64_t g = (n + FA_RING_THREADS - 1) / FA_RING_THREADS;
    return (unsigned)(g < 1 ? 1 : g > 65535 ? 65535 : g);
}

/* The context's device is current for the call (as fa_cuda_run does), the caller's restored after. */
typedef struct on_device {
    int prev, dev;
} on_device;
static on_device enter(const fa_context *ctx) {
    on_device d = {0, fa_context_threads(ctx)};
    if (cudaGetDevice(&d.prev) != cudaSuccess) d.prev = d.dev;
    if (d.prev != d.dev) cudaSetDevice(d.dev);
    return d;
}
static fa_status leave(fa_context *ctx, on_device d, cudaError_t e, const char *what) {
    if (d.prev != d.dev) cudaSetDevice(d.prev);
    if (e == cudaSuccess) return FA_OK;
    (void)cudaGetLastError();
    return fa_fail(ctx, FA_ERR_DEVICE, "ring: %s: %s", what, cudaGetErrorString(e));
}

static fa_status cuda_alloc(fa_context *ctx, size_t bytes, void **p) {
    on_device d = enter(ctx);
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        *p = NULL;
        (void)cudaGetLastError();
        if (d.prev != d.dev) cudaSetDevice(d.prev);
        return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "ring: cudaMalloc of %zu bytes for the ring's buffers failed: %s",
                       bytes, cudaGetErrorString(e));
    }
    return leave(ctx, d, cudaSuccess, "cudaMalloc");
}

static void cuda_release(void *p, int device) {
    int prev = device;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = device;
    cudaSetDevice(device);
    cudaFree(p);
    cudaSetDevice(prev);
    (void)cudaGetLastError();
}

static fa_status cuda_zero(fa_context *ctx, void *p, size_t bytes) {
    on_device d = enter(ctx);
    return leave(ctx, d, cudaMemsetAsync(p, 0, bytes, fa_cuda_stream_of(ctx)), "cudaMemsetAsync");
}

static fa_status cuda_copy(fa_context *ctx, void *dst, const void *src, size_t bytes) {
    on_device d = enter(ctx);
    return leave(ctx, d, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, fa_cuda_stream_of(ctx)),
                 "cudaMemcpyAsync");
}

static fa_status cuda_sync(fa_context *ctx) {
    on_device d = enter(ctx);
    return leave(ctx, d, cudaStreamSynchronize(fa_cuda_stream_of(ctx)), "cudaStreamSynchronize");
}

static fa_status cuda_pack(fa_context *ctx, const fa_tensor *t, void *dst) {
    on_device d = enter(ctx);
    const int64_t n = t->batch * t->seqlen * t->heads * t->head_dim;
    cudaStream_t s = fa_cuda_stream_of(ctx);
    if (t->dtype == FA_DTYPE_F32)
        pack_kernel<float><<<grid_for(n), FA_RING_THREADS, 0, s>>>((const float *)t->data, (float *)dst, view_of(t), n);
    else
        pack_kernel<uint16_t><<<grid_for(n), FA_RING_THREADS, 0, s>>>((const uint16_t *)t->data, (uint16_t *)dst,
                                                                     view_of(t), n);
    return leave(ctx, d, cudaGetLastError(), "pack");
}

static fa_status cuda_round(fa_context *ctx, const float *src, const fa_tensor *t) {
    on_device d = enter(ctx);
    const int64_t n = t->batch * t->seqlen * t->heads * t->head_dim;
    cudaStream_t s = fa_cuda_stream_of(ctx);
    const view4 v = view_of(t);
    if (t->dtype == FA_DTYPE_F32) round_kernel<float><<<grid_for(n), FA_RING_THREADS, 0, s>>>(src, (float *)t->data, v, n);
    else if (t->dtype == FA_DTYPE_F16)
        round_kernel<__half><<<grid_for(n), FA_RING_THREADS, 0, s>>>(src, (__half *)t->data, v, n);
    else round_kernel<__nv_bfloat16><<<grid_for(n), FA_RING_THREADS, 0, s>>>(src, (__nv_bfloat16 *)t->data, v, n);
    return leave(ctx, d, cudaGetLastError(), "round");
}

static fa_status cuda_accum(fa_context *ctx, float *acc, int64_t B, int64_t S, int64_t H, int64_t D, const void *x,
                            fa_dtype dt, int64_t row0, int64_t n) {
    on_device d = enter(ctx);
    const int64_t total = B * n * H * D;
    cudaStream_t s = fa_cuda_stream_of(ctx);
    const unsigned g = grid_for(total);
    if (dt == FA_DTYPE_F32) accum_kernel<float><<<g, FA_RING_THREADS, 0, s>>>(acc, (const float *)x, S, H * D, row0, n, total);
    else if (dt == FA_DTYPE_F16)
        accum_kernel<__half><<<g, FA_RING_THREADS, 0, s>>>(acc, (const __half *)x, S, H * D, row0, n, total);
    else accum_kernel<__nv_bfloat16><<<g, FA_RING_THREADS, 0, s>>>(acc, (const __nv_bfloat16 *)x, S, H * D, row0, n, total);
    return leave(ctx, d, cudaGetLastError(), "accumulate");
}

static fa_status cuda_merge(fa_context *ctx, float *O, float *L, int64_t B, int64_t S, int64_t H, int64_t D,
                            const void *o, const float *l, fa_dtype dt, int64_t row0, int64_t n, int first) {
    on_device d = enter(ctx);
    const int64_t rows = B * n * H, per = FA_RING_THREADS / 32;
    const unsigned g = (unsigned)((rows + per - 1) / per);
    cudaStream_t s = fa_cuda_stream_of(ctx);
    if (dt == FA_DTYPE_F32)
        merge_kernel<float><<<g, FA_RING_THREADS, 0, s>>>(O, L, (const float *)o, l, S, H, D, row0, n, first, rows);
    else if (dt == FA_DTYPE_F16)
        merge_kernel<__half><<<g, FA_RING_THREADS, 0, s>>>(O, L, (const __half *)o, l, S, H, D, row0, n, first, rows);
    else
        merge_kernel<__nv_bfloat16><<<g, FA_RING_THREADS, 0, s>>>(O, L, (const __nv_bfloat16 *)o, l, S, H, D, row0, n,
                                                                  first, rows);
    return leave(ctx, d, cudaGetLastError(), "merge");
}

static fa_status cuda_lse_rows(fa_context *ctx, float *dst, const float *src, int64_t BH, int64_t S, int64_t row0,
                               int64_t n) {
    on_device d = enter(ctx);
    const size_t w = sizeof(float) * (size_t)n;
    return leave(ctx, d, cudaMemcpy2DAsync(dst, w, src + row0, sizeof(float) * (size_t)S, w, (size_t)BH,
                                           cudaMemcpyDefault, fa_cuda_stream_of(ctx)), "cudaMemcpy2DAsync");
}

static const fa_ring_ops cuda_ops = {cuda_alloc, cuda_release, cuda_zero,  cuda_copy,  cuda_sync,
                                     cuda_pack,  cuda_merge,   cuda_accum, cuda_round, cuda_lse_rows};

extern "C" const fa_ring_ops *fa_ring_ops_cuda(void) { return &cuda_ops; }
