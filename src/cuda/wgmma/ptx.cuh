/* The Hopper (sm_90a) PTX the FLASH3 kernels use, as small inline-asm wrappers: mbarriers, TMA tensor loads (also
 * multicast), cluster barriers and remote arrivals, wgmma fences and shared-memory descriptors, setmaxnreg, named
 * barriers, ex2; the async-proxy fence, vector reductions and an acquire load for the backward. The wgmma
 * instructions themselves are in wgmma.cuh (generated). */
#ifndef FA_WGMMA_PTX_CUH
#define FA_WGMMA_PTX_CUH

#include <cuda.h>
#include <stdint.h>

#ifndef FA_DEV
#define FA_DEV __device__ __forceinline__
#endif

FA_DEV uint32_t fa3_smem(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* ---- mbarrier: a 64-bit shared-memory barrier with an arrival count and a transaction-byte count ---- */
FA_DEV void fa3_bar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* Makes the initialised barriers visible to the async proxy (TMA) before anyone uses them. */
FA_DEV void fa3_bar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
/* One arrival that also announces `bytes` of TMA transactions the phase must see before it completes. */
FA_DEV void fa3_bar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
FA_DEV void fa3_bar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* Blocks until the phase with the given parity has completed. */
FA_DEV void fa3_bar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 "
                     "p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

/* ---- TMA: a 4-D tile of the tensor map lands in shared memory and completes bytes on the mbarrier ---- */
FA_DEV void fa3_tma_load4(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::"
                 "complete_tx::bytes"
                 " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
/* The same box multicast to the CTAs of cta_mask in the cluster: it lands at dst's offset in each and completes its
 * bytes on the mbarrier at bar's offset in each. */
FA_DEV void fa3_tma_load4_mc(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1, int c2, int c3,
                             uint16_t cta_mask) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%3, %4, %5, %6}], [%2], %7;\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "h"(cta_mask)
                 : "memory");
}

/* ---- thread-block clusters ---- */
FA_DEV uint32_t fa3_cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
/* Every non-exited thread of the cluster arrives (release) and waits (acquire): barrier inits and shared-memory
 * accesses before it are ordered cluster-wide before everything after it. Not .aligned: callers may be divergent. */
FA_DEV void fa3_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
/* One arrival on the mbarrier at bar's offset in CTA `cta` of the cluster (this CTA's own rank included), with the
 * PTX default semantics (release at CTA scope), as fa3_bar_arrive. What it orders is the warp's wgmma reads, complete
 * at wgmma.wait_group before it; .release.cluster would add a MEMBAR.ALL.GPU to every arrival (and .acquire.cluster
 * on the wait an L1 invalidation), for generic-proxy data no other CTA reads. */
FA_DEV void fa3_bar_arrive_cta(uint32_t bar, uint32_t cta) {
    asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
                 "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),
                 "r"(cta)
                 : "memory");
}

/* Shared-memory writes of this thread (st.shared) become visible to the async proxy (wgmma, TMA) that reads them
 * after the next barrier. */
FA_DEV void fa3_fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
FA_DEV void fa3_st_shared4(uint32_t dst, float a, float b, float c, float d) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
/* Bulk reduce: `bytes` (a multiple of 16) of fp32 in shared memory added into global memory by the async proxy, in
 * this thread's bulk group; wait_read: the group's shared-memory reads are done (the buffer may be rewritten);
 * wait: its global writes are done too. */
FA_DEV void fa3_bulk_add_f32(float *dst, uint32_t src, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
                 "r"(bytes)
                 : "memory");
}
/* Bulk copy: `bytes` (a multiple of 16, both ends 16-byte aligned) from global into shared memory by the async proxy,
 * counted on mbarrier bar's transactions (fa3_bar_expect_tx first). */
FA_DEV void fa3_bulk_load(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
/* Generic-proxy accesses of global memory before it ordered with the async proxy's after it. */
FA_DEV void fa3_fence_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }
FA_DEV float4 fa3_ld_shared4(uint32_t a) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(a)
                 : "memory");
    return v;
}
FA_DEV void fa3_bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N> FA_DEV void fa3_bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory"); }
template <int N> FA_DEV void fa3_bulk_wait() { asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory"); }
/* The backward's deterministic dQ: a counter read with acquire semantics (the adds it orders are visible after). */
FA_DEV int fa3_ld_acquire(const int *p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
FA_DEV void fa3_prefetch_map(const CUtensorMap *map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)map) : "memory");
}

/* ---- wgmma ordering ---- */
FA_DEV void fa3_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
FA_DEV void fa3_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> FA_DEV void fa3_wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Pins an accumulator array in place between asm statements, so that nvcc neither reads it before the wgmma that
 * writes it has been waited for nor moves writes to it into an async region. */
template <int N> FA_DEV void fa3_fence_regs(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> FA_DEV void fa3_fence_regs(uint32_t (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(r[i][0]), "+r"(r[i][1]), "+r"(r[i][2]), "+r"(r[i][3])::"memory");
}

/* Shared-memory matrix descriptor with 128-byte swizzle (the layout TMA SWIZZLE_128B writes: 8 rows x 128 B atoms,
 * 1024-B aligned). lbo/sbo in bytes: K-major tiles use sbo = 1024 (next 8 rows) and ignore lbo; MN-major tiles use
 * sbo = 1024 (next 8 rows along K) and lbo = distance between 64-element panels along MN. */
FA_DEV uint64_t fa3_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) |
           (1ull << 62);
}
/* A GEMM operand's descriptors: at(off) is the k-slice at byte offset off from base, the descriptor of base made
 * once plus off >> 4 (off a multiple of 16: the start address field is address >> 4 in bits 0-13, and a
 * shared-window address is below 2^18, so the add never carries out of it). With the warpgroup index and the
 * forward's tile warp-uniform (fa3_warpgroup) the descriptors live in uniform registers: one add per slice instead
 * of a mask, shift, merge and two R2UR (README.md, Descriptors). */
struct fa3_operand {
    uint64_t d0;
    FA_DEV fa3_operand(uint32_t base, uint32_t lbo, uint32_t sbo) : d0(fa3_desc(base, lbo, sbo)) {}
    FA_DEV uint64_t at(uint32_t off) const { return d0 + (off >> 4); }
};

/* The thread's warpgroup, as a shfl from lane 0, so that the compiler knows it is the same in every lane and keeps
 * the shared addresses and descriptors made from it in uniform registers. */
FA_DEV int fa3_warpgroup() { return __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0); }

/* ---- registers, barriers, math ---- */
template <int R> FA_DEV void fa3_regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R)); }
template <int R> FA_DEV void fa3_regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R)); }
FA_DEV void fa3_named_sync(int id, int nthreads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}
FA_DEV void fa3_named_arrive(int id, int nthreads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}
/* The same with the barrier and the count as immediates: no register holds them (the producer has 24). */
template <int ID, int N> FA_DEV void fa3_named_sync() { asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "n"(N) : "memory"); }
template <int ID, int N> FA_DEV void fa3_named_arrive() { asm volatile("bar.arrive %0, %1;\n" ::"n"(ID), "n"(N) : "memory"); }
/* max that keeps a NaN (fmaxf drops it) */
FA_DEV float fa3_max_nan(float a, float b) {
    float y;
    asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(y) : "f"(a), "f"(b));
    return y;
}
FA_DEV float fa3_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

#endif
