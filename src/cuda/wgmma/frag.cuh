/* What the FLASH3 forward and backward share: acc = A Bᵀ from two K-major shared tiles, packing fp32 accumulators
 * into 16-bit A fragments, and a warp's release of a pipeline stage. */
#ifndef FA_WGMMA_FRAG_CUH
#define FA_WGMMA_FRAG_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ptx.cuh"
#include "wgmma.cuh"

/* Issues acc = A Bᵀ (no wait): A = 64 rows from a_base of a K-major tile of A_ROWS rows, B = N rows of a K-major
 * tile of B_ROWS rows, both D columns in 64-column panels (rows × 128 B each); D/16 k-slices, 32 B apart inside a
 * panel (S = Qi Kjᵀ in the forward, Sᵀ = Kj Qiᵀ and dPᵀ = Vj dOiᵀ in the backward). F8: e4m3 tiles, whose rows of
 * d bytes are laid out as those of D = d/2 16-bit columns, so that a k32 slice is one of these 32-byte slices. */
template <int D, int N, int A_ROWS, int B_ROWS, bool F16, bool F8 = false>
FA_DEV void fa3_gemm_abt(float (&acc)[N / 2], uint32_t a_base, uint32_t b_base) {
    fa3_wgmma_fence();
    const fa3_operand A(a_base, 16, 1024), B(b_base, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const uint64_t da = A.at((kk / 4) * A_ROWS * 128 + (kk % 4) * 32);
        const uint64_t db = B.at((kk / 4) * B_ROWS * 128 + (kk % 4) * 32);
        if constexpr (F8)
            fa_wgmma_ss8<N>(acc, da, db, kk > 0);
        else
            fa_wgmma_ss<N, F16>(acc, da, db, kk > 0);
    }
    fa3_wgmma_commit();
}

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
