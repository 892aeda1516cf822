/* What the KV-cache attention kernels (splitkv.cu, pair.cu) share about their tiles: the swizzle of 16-byte chunks,
 * the row tile's Q rows copied in, and the rotated q (fp32, written by the first kernel) as two tiles of the dtype,
 * hi + lo, so that S = hi·Kᵀ + lo·Kᵀ is as exact as fp32 for the scores and the LSE. splitkv.cu writes the last two
 * out in place: called through these functions, nvcc allocated its tuned kernels' registers otherwise (other SASS). */
#ifndef FA_CUDA_KVCACHE_QTILE_CUH
#define FA_CUDA_KVCACHE_QTILE_CUH

#include "../mma_sync/mma.cuh"
#include "kvcache.h"

/* Byte offset of element (row, 8·chunk) in a [rows][W] tile of 16-bit values, chunks swizzled by row (conflict-free
 * ldmatrix; W / 8 a multiple of 8). */
template <int W> __device__ __forceinline__ uint32_t swz(int row, int chunk) {
    return (uint32_t)(row * W + ((chunk ^ (row & 7)) << 3)) * 2u;
}

/* The 16 query rows of row tile r0 (R of them valid: the GQA group x the new rows of K/V head hk) -> the [16][D] Q
 * tile at shared address sa by cp.async, zero beyond R; NT threads, no commit. */
template <typename T, int D, int NT>
__device__ __forceinline__ void fa_kv_copy_q(const fa_kv_params &p, uint32_t sa, int b, int hk, int r0, int R) {
    constexpr int CH = D / 8;
    for (int c = threadIdx.x; c < 16 * CH; c += NT) {
        const int r = c / CH, cc = c % CH, gr = r0 + r, i = gr / p.group, hq = hk * p.group + gr % p.group;
        const bool ok = r < R;
        fa_cp_async16_at(sa + swz<D>(r, cc),
                         ok ? (const void *)((const T *)p.q + b * p.q_sb + i * p.q_ss + hq * p.q_sh + cc * 8) : p.q,
                         ok ? 16 : 0);
    }
}

/* x rounded to T and back (the high part of a hi + lo split). */
template <typename T> __device__ __forceinline__ float round_to(float x);
template <> __device__ __forceinline__ float round_to<__nv_bfloat16>(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
template <> __device__ __forceinline__ float round_to<__half>(float x) { return __half2float(__float2half_rn(x)); }

/* Eight values x[0..7] -> their hi parts (u) and lo parts (v), packed in T. */
template <typename T> __device__ __forceinline__ void fa_kv_qsplit8(const float *x, uint4 &u, uint4 &v) {
    float hi[8], lo[8];
#pragma unroll
    for (int e = 0; e < 8; e++) hi[e] = round_to<T>(x[e]), lo[e] = x[e] - hi[e];
    u.x = fa_pack2<T>(hi[0], hi[1]), u.y = fa_pack2<T>(hi[2], hi[3]);
    u.z = fa_pack2<T>(hi[4], hi[5]), u.w = fa_pack2<T>(hi[6], hi[7]);
    v.x = fa_pack2<T>(lo[0], lo[1]), v.y = fa_pack2<T>(lo[2], lo[3]);
    v.z = fa_pack2<T>(lo[4], lo[5]), v.w = fa_pack2<T>(lo[6], lo[7]);
}

#endif
