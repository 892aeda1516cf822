/* What the FLASH3 forward's FP8 (e4m3) instances add (README.md beside this file, "FP8"): P packed into e4m3 A
 * fragments, and V transposed into the workspace, since 8-bit wgmma takes B only K-major (Vᵀ: [d][key]).
 *
 * The m64nNk32 A fragment of a thread holds row g (and g + 8) at columns 4t..4t+3 and 16+4t..16+4t+3 of a 32-key
 * slice, while S's accumulators hold columns 2t, 2t+1 of each n8 block. Rather than exchange bytes between the
 * threads of a quad, P keeps the accumulator's keys and Vᵀ stores its keys in the same order: a key's slot in its
 * 32-key group is fa3_key_slot. P Vᵀ sums over the keys, so the order is free as long as both agree. */
#ifndef FA_WGMMA_FLASH3_FP8_CUH
#define FA_WGMMA_FLASH3_FP8_CUH

#include <cuda_fp8.h>
#include <stdint.h>

#include "../packed.cuh"
#include "ptx.cuh"

/* Slot of key a (0..31 of its group) in the A fragment's column order: byte i of register 0 or 2 (h = 0, 1) of
 * thread t holds key 16h + 8·(i >> 1) + 2t + (i & 1). */
FA_DEV int fa3_key_slot(int a) {
    const int h = a >> 4, r = a & 15;
    return 16 * h + 4 * ((r & 7) >> 1) + (r & 1) + 2 * (r >> 3);
}
/* ... and its inverse: the key in slot s. */
FA_DEV int fa3_slot_key(int s) {
    const int h = s >> 4, t = (s & 15) >> 2, i = s & 3;
    return 16 * h + 8 * (i >> 1) + 2 * t + (i & 1);
}

/* Four fp32 values to e4m3 (round to nearest even, saturating; NaN stays NaN), x0 in the lowest byte. */
FA_DEV uint32_t fa3_e4m3x4(float x0, float x1, float x2, float x3) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(x0, x1), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(x2, x3), __NV_SATFINITE, __NV_E4M3);
    return lo | hi << 16;
}

/* P's accumulators (n8 blocks 4kk .. 4kk+3 of a 32-key slice) as the e4m3 A fragment of slice kk, keys in
 * fa3_key_slot order: register 0 row g, 1 row g + 8 (blocks 4kk, 4kk+1), 2 and 3 the same for blocks 4kk+2, 4kk+3. */
template <int Bc> FA_DEV void fa3_pack_a8(uint32_t (&a)[Bc / 32][4], const float (&acc)[Bc / 2]) {
#pragma unroll
    for (int kk = 0; kk < Bc / 32; kk++) {
        const float *c = acc + 16 * kk;
        a[kk][0] = fa3_e4m3x4(c[0], c[1], c[4], c[5]);
        a[kk][1] = fa3_e4m3x4(c[2], c[3], c[6], c[7]);
        a[kk][2] = fa3_e4m3x4(c[8], c[9], c[12], c[13]);
        a[kk][3] = fa3_e4m3x4(c[10], c[11], c[14], c[15]);
    }
}

/* Vᵀ for the FP8 forward: v [batch][sk][hk][D] (strides in elements) into vt [batch][hk][D][skp], skp = sk rounded up
 * to 32, each key at 32·(key / 32) + fa3_key_slot(key % 32); keys sk .. skp − 1 are zero. Varlen (cu_k, the device
 * cu_seqlens_k, read clamped to [0, total_k]): sequence b's keys from row cu_k[b] of the packed v, sk the bound, and
 * with used_k (seqused_k) its first used_k[b] keys only. One
 * CTA per 64 keys of one (batch, K/V head): 64 rows of v into shared memory, then D rows of 64 slots out, 16 bytes a
 * thread at a time. */
#define FA3_VT_KEYS 64
template <int D>
__global__ void __launch_bounds__(256) fa3_vt_kernel(const uint8_t *__restrict__ v, int64_t sb, int64_t ss, int64_t sh,
                                                    int sk, int skp, const int *__restrict__ cu_k,
                                                    const int *__restrict__ used_k, int total_k,
                                                    uint8_t *__restrict__ vt) {
    __shared__ __align__(16) uint8_t tile[FA3_VT_KEYS][D + 16];
    const int k0 = blockIdx.x * FA3_VT_KEYS, hk = blockIdx.y, b = blockIdx.z, hks = gridDim.y;
    const uint8_t *src = v + (int64_t)b * sb + (int64_t)hk * sh;
    if (cu_k) { /* the sequence's rows, clamped into the packed tensor and to the bound */
        int r0;
        sk = fa_packed_seq(cu_k, used_k, b, total_k, sk, &r0); /* seqused_k: the keys past it are padding, zeros */
        src = v + (int64_t)r0 * ss + (int64_t)hk * sh;
    }
    for (int c = threadIdx.x; c < FA3_VT_KEYS * D / 16; c += blockDim.x) {
        const int r = c / (D / 16), x = c % (D / 16), key = k0 + r;
        uint4 w = make_uint4(0, 0, 0, 0);
        if (key < sk) w = *reinterpret_cast<const uint4 *>(src + (int64_t)key * ss + 16 * x);
        *reinterpret_cast<uint4 *>(&tile[r][16 * x]) = w;
    }
    __syncthreads();
    uint8_t *dst = vt + (((int64_t)b * hks + hk) * D) * skp + k0;
    const int nk = skp - k0 < FA3_VT_KEYS ? skp - k0 : FA3_VT_KEYS; /* a multiple of 32 */
    for (int c = threadIdx.x; c < D * (nk / 16); c += blockDim.x) {
        const int d = c / (nk / 16), s0 = 16 * (c % (nk / 16)); /* slots s0 .. s0 + 15 of row d */
        uint32_t w[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint32_t x = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int s = s0 + 4 * j + i, key = 32 * (s >> 5) + fa3_slot_key(s & 31);
                x |= (uint32_t)tile[key][d] << (8 * i);
            }
            w[j] = x;
        }
        *reinterpret_cast<uint4 *>(dst + (int64_t)d * skp + s0) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

#endif
