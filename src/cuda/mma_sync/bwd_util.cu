/* Small memory-bound kernels around the backward pass, shared by STANDARD, FLASH1 and FLASH2 (O, dO, dV rows are
 * d_v wide, Q, dQ, dK rows d):
 *   D = rowsum(dO ∘ O) (fp32, laid out like LSE), and for the flash kernels LSE·log2(e) (+inf for a row that saw
 *   no key), so that they can copy both with cp.async; dQ = scale·dQacc -> dtype; GQA: dK, dV = Σ over the query heads
 *   of a K/V head of the fp32 per-query-head gradients (fixed order: deterministic); with opts.d_sinks, d sinks
 *   from D right after it (sinks.h), so that no kernel reads dO and O for them again.
 * Rows are addressed without the cu_seqlens: under varlen a packed row t of head h is row h·total + t. */
#include "common.cuh"
#include "cuda/sinks.h"

/* Query-side row r -> element offset in a tensor with strides (sb, ss, sh). */
FA_DEV int64_t fa_qrow_off(const fa_cuda_params &p, int64_t r, int64_t sb, int64_t ss, int64_t sh) {
    if (p.cu_q) return (r % p.total_q) * ss + (r / p.total_q) * sh;
    const int64_t i = r % p.sq, h = (r / p.sq) % p.hq, b = r / ((int64_t)p.sq * p.hq);
    return b * sb + i * ss + h * sh;
}

template <typename T> __global__ void fa_dsum_kernel(const fa_cuda_params p, int64_t rows) {
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const T *o = (const T *)p.o + fa_qrow_off(p, r, p.o_sb, p.o_ss, p.o_sh);
    const T *g = (const T *)p.dout + fa_qrow_off(p, r, p.do_sb, p.do_ss, p.do_sh);
    float acc = 0.f;
    for (int c = lane; c < p.d_v; c += 32) acc += fa_to_f32<T>(o[c]) * fa_to_f32<T>(g[c]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) {
        p.dsum[r] = acc;
        if (p.lse2) p.lse2[r] = p.lse[r] == -INFINITY ? INFINITY : p.lse[r] * FA_LOG2E;
    }
}

/* The same for the flash kernels' 16-byte aligned rows, TPR = d / 8 threads per row, 8 elements (16 bytes) each;
 * also clears the row's fp32 dQ accumulator when asked (instead of a separate memset). The one-warp-per-row kernel
 * above moved 2-byte elements and took ~3x the time of the bytes at d = 64. */
template <typename T, int TPR> __global__ void fa_dsum_vec_kernel(const fa_cuda_params p, int64_t rows, int zero_dq) {
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x / TPR) + threadIdx.x / TPR;
    const int c = (threadIdx.x % TPR) * 8;
    float acc = 0.f;
    if (r < rows) {
        const uint4 o = *(const uint4 *)((const T *)p.o + fa_qrow_off(p, r, p.o_sb, p.o_ss, p.o_sh) + c);
        const uint4 g = *(const uint4 *)((const T *)p.dout + fa_qrow_off(p, r, p.do_sb, p.do_ss, p.do_sh) + c);
        const T *oe = (const T *)&o, *ge = (const T *)&g;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc += fa_to_f32<T>(oe[i]) * fa_to_f32<T>(ge[i]);
        if (zero_dq) {
            float4 *q = (float4 *)(p.dq_acc + r * (TPR * 8) + c);
            q[0] = q[1] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
#pragma unroll
    for (int off = TPR / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (r < rows && c == 0) {
        p.dsum[r] = acc;
        p.lse2[r] = p.lse[r] == -INFINITY ? INFINITY : p.lse[r] * FA_LOG2E;
    }
}

template <typename T> __global__ void fa_dq_convert_kernel(const fa_cuda_params p, int64_t n) {
    const int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= n) return;
    const int64_t r = x / p.d, c = x % p.d;
    ((T *)p.dq)[fa_qrow_off(p, r, p.dq_sb, p.dq_ss, p.dq_sh) + c] = fa_from_f32<T>(p.dq_acc[x] * p.scale);
}

/* dQ = scale·dQacc -> T for 16-byte aligned rows: 8 elements per thread. */
template <typename T, int TPR> __global__ void fa_dq_convert_vec_kernel(const fa_cuda_params p, int64_t n8) {
    const int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= n8) return;
    const int64_t r = x / TPR;
    const int c = (int)(x % TPR) * 8;
    const float4 a = *(const float4 *)(p.dq_acc + x * 8), b = *(const float4 *)(p.dq_acc + x * 8 + 4);
    uint4 o;
    o.x = fa_pack2<T>(a.x * p.scale, a.y * p.scale);
    o.y = fa_pack2<T>(a.z * p.scale, a.w * p.scale);
    o.z = fa_pack2<T>(b.x * p.scale, b.y * p.scale);
    o.w = fa_pack2<T>(b.z * p.scale, b.w * p.scale);
    *(uint4 *)((T *)p.dq + fa_qrow_off(p, r, p.dq_sb, p.dq_ss, p.dq_sh) + c) = o;
}

/* Elements [0, nk) are dK's (rows of d), the rest dV's (rows of d_v): one launch for both. */
template <typename T> __global__ void fa_dkv_reduce_kernel(const fa_cuda_params p, int64_t nk, int64_t n) {
    int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= n) return;
    const int is_v = x >= nk, w = is_v ? p.d_v : p.d;
    if (is_v) x -= nk;
    const int64_t r = x / w, c = x % w; /* r: a K/V-side row over (b, hk, sk) or (hk, total_k) */
    const int64_t sb = is_v ? p.dv_sb : p.dk_sb, ss = is_v ? p.dv_ss : p.dk_ss, sh = is_v ? p.dv_sh : p.dk_sh;
    int64_t src0, step, dst;
    if (p.cu_k) {
        const int64_t t = r % p.total_k, g = r / p.total_k;
        src0 = (g * p.group * p.total_k + t) * w + c;
        step = (int64_t)p.total_k * w;
        dst = t * ss + g * sh;
    } else {
        const int64_t j = r % p.sk, g = (r / p.sk) % p.hk, b = r / ((int64_t)p.sk * p.hk);
        src0 = ((b * p.hq + g * p.group) * p.sk + j) * w + c;
        step = (int64_t)p.sk * w;
        dst = b * sb + j * ss + g * sh;
    }
    const float *acc = is_v ? p.dv_acc : p.dk_acc;
    float sum = 0.f;
    for (int h = 0; h < p.group; ++h) sum += acc[src0 + h * step];
    ((T *)(is_v ? p.dv : p.dk))[dst + c] = fa_from_f32<T>(sum);
}

static int64_t fa_q_rows(const fa_cuda_params *p) {
    return p->cu_q ? (int64_t)p->hq * p->total_q : (int64_t)p->batch * p->hq * p->sq;
}
static int64_t fa_k_rows(const fa_cuda_params *p) {
    return p->cu_k ? (int64_t)p->hk * p->total_k : (int64_t)p->batch * p->hk * p->sk;
}

#define FA_DTYPE_SWITCH(dtype, KERNEL, grid, block, st, ...)                                  \
    do {                                                                                     \
        if ((dtype) == 0) KERNEL<float><<<grid, block, 0, st>>>(__VA_ARGS__);                \
        else if ((dtype) == 1) KERNEL<__half><<<grid, block, 0, st>>>(__VA_ARGS__);          \
        else KERNEL<__nv_bfloat16><<<grid, block, 0, st>>>(__VA_ARGS__);                    \
    } while (0)

/* The 16-byte-vector kernels: 16-bit dtype (1 = f16, else bf16) x V = d / 8 threads per row, a power of two from
 * 4 to 32 (a shuffle tree; d = 96's 12 threads take the generic kernels). */
#define FA_VEC_DTYPE(dtype, KERNEL, V, grid, st, ...)                                                     \
    ((dtype) == 1 ? KERNEL<__half, V><<<grid, 256, 0, st>>>(__VA_ARGS__)                               \
                  : KERNEL<__nv_bfloat16, V><<<grid, 256, 0, st>>>(__VA_ARGS__))
#define FA_VEC_SWITCH(d, dtype, KERNEL, grid, st, ...)                                                    \
    do {                                                                                                 \
        if ((d) == 4 * 8) FA_VEC_DTYPE(dtype, KERNEL, 4, grid, st, __VA_ARGS__);                         \
        else if ((d) == 8 * 8) FA_VEC_DTYPE(dtype, KERNEL, 8, grid, st, __VA_ARGS__);                    \
        else if ((d) == 16 * 8) FA_VEC_DTYPE(dtype, KERNEL, 16, grid, st, __VA_ARGS__);                  \
        else FA_VEC_DTYPE(dtype, KERNEL, 32, grid, st, __VA_ARGS__);                                     \
    } while (0)

/* The flash kernels' tensors: 16-bit, rows 16-byte aligned (the plan's rule), LSE·log2e wanted, and d / 8 a power
 * of two from 4 to 32; one head_dim for every row (the vector kernels' D and dQ rows share a width). */
static int fa_flash_rows(const fa_cuda_params *p, int dtype) {
    const int v = p->d / 8;
    return p->lse2 && dtype != 0 && p->d == p->d_v && p->d % 8 == 0 && v >= 4 && v <= 32 && (v & (v - 1)) == 0;
}

static cudaError_t fa_bwd_dsum_rows(const fa_cuda_params *p, int dtype, int zero_dq, int64_t rows, cudaStream_t st) {
    if (fa_flash_rows(p, dtype)) {
        const unsigned grid = (unsigned)((rows * (p->d / 8) + 255) / 256);
        FA_VEC_SWITCH(p->d, dtype, fa_dsum_vec_kernel, grid, st, *p, rows, zero_dq);
        return cudaGetLastError();
    }
    if (zero_dq) {
        const cudaError_t e = cudaMemsetAsync(p->dq_acc, 0, (size_t)rows * p->d * sizeof(float), st);
        if (e != cudaSuccess) return e;
    }
    FA_DTYPE_SWITCH(dtype, fa_dsum_kernel, (unsigned)((rows + 7) / 8), 256, st, *p, rows);
    return cudaGetLastError();
}

extern "C" cudaError_t fa_bwd_dsum_launch(const fa_cuda_params *p, int dtype, int zero_dq, cudaStream_t st) {
    const int64_t rows = fa_q_rows(p);
    if (rows == 0) return cudaSuccess;
    const cudaError_t e = fa_bwd_dsum_rows(p, dtype, zero_dq, rows, st);
    if (e != cudaSuccess || !p->d_sinks) return e;
    /* d sinks from D, laid out like LSE: [B, Hq, Sq], or [Hq, total_q] under varlen */
    const int nb = p->cu_q ? 1 : p->batch, n = p->cu_q ? p->total_q : p->sq;
    return fa_cuda_sinks_grad(p, p->lse, 1.0, nb, n, n, n, st);
}
extern "C" cudaError_t fa_bwd_dq_convert_launch(const fa_cuda_params *p, int dtype, cudaStream_t st) {
    const int64_t n = fa_q_rows(p) * p->d;
    if (n == 0) return cudaSuccess;
    if (fa_flash_rows(p, dtype)) {
        const unsigned grid = (unsigned)((n / 8 + 255) / 256);
        FA_VEC_SWITCH(p->d, dtype, fa_dq_convert_vec_kernel, grid, st, *p, n / 8);
        return cudaGetLastError();
    }
    FA_DTYPE_SWITCH(dtype, fa_dq_convert_kernel, (unsigned)((n + 255) / 256), 256, st, *p, n);
    return cudaGetLastError();
}
extern "C" cudaError_t fa_bwd_dkv_reduce_launch(const fa_cuda_params *p, int dtype, cudaStream_t st) {
    const int64_t nk = fa_k_rows(p) * p->d, n = nk + fa_k_rows(p) * p->d_v;
    if (n == 0) return cudaSuccess;
    FA_DTYPE_SWITCH(dtype, fa_dkv_reduce_kernel, (unsigned)((n + 255) / 256), 256, st, *p, nk, n);
    return cudaGetLastError();
}
