/* The few PTX wrappers the CUDA kernels need (sm_80+ instructions, and sm_90 stmatrix, run on sm_90a): cp.async,
 * ldmatrix/stmatrix, mma.sync m16n8k16 with fp32 accumulators, and packing two floats into one 16-bit pair.
 *
 * Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"); g = lane / 4, t = lane % 4:
 *   A 16x16: a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 8+2t..), a[3] = (g+8, 8+2t..)
 *   B 16x8 (k x n): b[0] = (k 2t..2t+1, n g), b[1] = (k 8+2t.., n g)
 *   C 16x8 fp32: c[0], c[1] = (g, 2t, 2t+1); c[2], c[3] = (g+8, 2t, 2t+1)
 * Two adjacent C tiles (n 0-7, 8-15) are exactly one A fragment (k 0-15) once packed to 16 bits: that is how
 * P = exp(S) is fed to P·V straight from registers. */
#ifndef FA_CUDA_MMA_CUH
#define FA_CUDA_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "../convert.cuh"

#define FA_DEV __device__ __forceinline__

FA_DEV uint32_t fa_smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16-byte global -> shared copy through L2 only; src_bytes < 16 zero-fills the rest (0 = pure zero fill). The _at
 * form takes the shared-space address, for loops that form their offsets once instead of per copy. */
FA_DEV void fa_cp_async16_at(uint32_t smem, const void *gmem, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_bytes));
}
FA_DEV void fa_cp_async16(void *smem, const void *gmem, int src_bytes) { fa_cp_async16_at(fa_smem_addr(smem), gmem, src_bytes); }
/* 4-byte global -> shared copy (through L1); src_bytes 0 = zero fill. */
FA_DEV void fa_cp_async4(void *smem, const void *gmem, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(fa_smem_addr(smem)), "l"(gmem),
                 "r"(src_bytes));
}
FA_DEV void fa_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> FA_DEV void fa_cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/* Bulk (TMA-engine) reduction, sm_90: global[dst .. dst+bytes) += shared[src ..) as fp32, asynchronously; bytes and
 * both addresses multiples of 16. The shared data must be visible to the async proxy first (fa_fence_proxy_async
 * by the threads that wrote it, then a barrier); the source may be overwritten after fa_bulk_wait_read. */
FA_DEV void fa_bulk_reduce_add_f32(float *gdst, uint32_t ssrc, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gdst), "r"(ssrc),
                 "r"(bytes)
                 : "memory");
}
FA_DEV void fa_st_shared_zero16(uint32_t addr) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
}
FA_DEV void fa_st_shared_f2(uint32_t addr, float a, float b) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(a), "f"(b) : "memory");
}
FA_DEV void fa_bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
FA_DEV void fa_bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
FA_DEV void fa_bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
FA_DEV void fa_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* A value the compiler cannot see through: applied to a tile's base address inside the main loops so that the
 * many (base + constant) ldmatrix addresses are not hoisted out of the loop into registers of their own (that
 * alone cost ~100 registers per thread and spilled the d = 128 kernels); SASS then uses [reg + imm] addressing. */
FA_DEV uint32_t fa_opaque(uint32_t x) {
    asm volatile("" : "+r"(x));
    return x;
}
FA_DEV int64_t fa_opaque64(int64_t x) {
    asm volatile("" : "+l"(x));
    return x;
}

/* Four 8x8 b16 matrices to shared memory (sm_90 stmatrix), the mirror of ldmatrix: lane l gives the row address of
 * matrix l / 8, and r[i] holds (row l / 4, cols 2(l % 4), +1) of matrix i — the C-fragment layout, packed. */
FA_DEV void fa_stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3));
}

/* Four 8x8 b16 matrices; lane l gives the row address (shared-space byte address) of matrix l / 8. */
FA_DEV void fa_ldmatrix_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
FA_DEV void fa_ldmatrix_x4_trans(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* c += a · b, m16n8k16, fp32 accumulators. T = __nv_bfloat16 or __half. fa_mma keeps program order (volatile);
 * fa_mma_free does not: the product has no side effect, so the compiler may interleave it with the work around it
 * (the KV-cache kernel's copies and softmax). */
#define FA_MMA_DEF(NAME, T, TY, QUAL)                                                                                \
    template <> FA_DEV void NAME<T>(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {                    \
        asm QUAL("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "  \
                 "{%0,%1,%2,%3};\n"                                                                                 \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                                  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                                \
    }
template <typename T> FA_DEV void fa_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
template <typename T> FA_DEV void fa_mma_free(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
FA_MMA_DEF(fa_mma, __nv_bfloat16, "bf16", volatile)
FA_MMA_DEF(fa_mma, __half, "f16", volatile)
FA_MMA_DEF(fa_mma_free, __nv_bfloat16, "bf16", )
FA_MMA_DEF(fa_mma_free, __half, "f16", )
#undef FA_MMA_DEF

/* (lo, hi) -> one 32-bit register of two 16-bit values, round to nearest even. */
template <typename T> FA_DEV uint32_t fa_pack2(float lo, float hi);
template <> FA_DEV uint32_t fa_pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}
template <> FA_DEV uint32_t fa_pack2<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* *a += v, atomically (sm_90's vector float atomics: one RED.E.ADD.F32x2 per call). */
FA_DEV void fa_red_add_f2(float *a, float2 v) { (void)atomicAdd((float2 *)a, v); }

/* 2^x on the SFU (MUFU.EX2), flush-to-zero: exp2(-inf) = 0, exactly what the masked scores need. */
FA_DEV float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* 1/x for x of normal magnitude (2^-125 < |x| < 2^125): the inline fast path of nvcc's IEEE 1.f / x (MUFU.RCP, one
 * FMA Newton step; the same bits), without the subroutine call for the out-of-range case. A call in the epilogue
 * made ptxas save the registers live across it to the stack (reported as spill). */
FA_DEV float fa_rcp_normal(float x) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    const float e = -fmaf(x, r, -1.f);
    return fmaf(r, e, r);
}

/* Reductions over the 4 lanes of a quad (the lanes that share rows g and g+8 of a C fragment). */
FA_DEV float fa_quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
}
FA_DEV float fa_quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x + __shfl_xor_sync(0xffffffffu, x, 1);
}

#endif
