/* Register helpers the FLASH3 forward and backward share: packing fp32 accumulators into 16-bit A fragments, and a
 * warp's release of a pipeline stage. */
#ifndef FA_WGMMA_FRAG_CUH
#define FA_WGMMA_FRAG_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ptx.cuh"

template <bool F16> FA_DEV uint32_t fa3_pack(float a, float b) {
    uint32_t r;
    if constexpr (F16) {
        __half2 h = __floats2half2_rn(a, b);
        r = *reinterpret_cast<uint32_t *>(&h);
    } else {
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        r = *reinterpret_cast<uint32_t *>(&h);
    }
    return r;
}

/* Two adjacent n8 accumulator blocks = one k16 A fragment (rows g, g+8; columns 2t.., 8+2t..): the m64nN
 * accumulator layout is the A-operand layout for 16-bit types, so P (forward) and Pᵀ, dSᵀ (backward) feed the next
 * GEMM from registers. */
template <int N, bool F16> FA_DEV void fa3_pack_a(uint32_t (&a)[N / 16][4], const float (&acc)[N / 2]) {
#pragma unroll
    for (int kk = 0; kk < N / 16; kk++) {
        a[kk][0] = fa3_pack<F16>(acc[8 * kk], acc[8 * kk + 1]);
        a[kk][1] = fa3_pack<F16>(acc[8 * kk + 2], acc[8 * kk + 3]);
        a[kk][2] = fa3_pack<F16>(acc[8 * kk + 4], acc[8 * kk + 5]);
        a[kk][3] = fa3_pack<F16>(acc[8 * kk + 6], acc[8 * kk + 7]);
    }
}

/* One arrival per consumer warp on a stage's empty barrier, once the warp's wgmma reading it has completed. */
FA_DEV void fa3_release(uint32_t bar, int lane) {
    __syncwarp();
    if (lane == 0) fa3_bar_arrive(bar);
}

#endif
