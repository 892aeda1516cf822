/* FLASH3 forward: the host side. Tensor maps are encoded per call through the driver entry point (nothing links
 * libcuda); kernel instances per row of tiles.h and dtype; masks and lengths are run-time values. The plan's row
 * (wgmma/family.cu) has checked everything the launch relies on. */
#include <cudaTypedefs.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cuda/params.h"
#include "cuda/attr_once.h"
#include "flash3_fwd.cuh"
#include "tensor_map.h"
#include "tiles.h"

/* causal is folded into the right window (wr = 0) */
static bool fa3_masked(const fa_cuda_params *p) { return p->wl >= 0 || p->wr >= 0 || p->chunk > 0; }

/* Key blocks query block mb visits (the kernel's fa3_work_at; varlen: of a sequence at the grid's bounds). */
static int fa3_blocks_of(const fa_cuda_params *p, int Br, int Bc, int mb) {
    const int m0 = mb * Br, m1 = m0 + Br < p->sq ? m0 + Br : p->sq;
    int lo, hi;
    fa_visible_block32(m0, m1, p->sq, p->sk, p->wl, p->wr, &lo, &hi);
    fa_chunk_keys32(m0 + p->sk - p->sq, m1 - 1 + p->sk - p->sq, p->chunk, &lo, &hi);
    return hi > lo ? (hi + Bc - 1) / Bc - lo / Bc : 0;
}

/* An instance's dynamic shared memory limit, set once per device. */
template <int D, bool WIDE, bool F16, bool F8, int CL, int DV = D> static cudaError_t fa3_smem_attr(size_t smem) {
    static unsigned char ready[64];
    return fa_cuda_attr_once(ready, (const void *)fa3_fwd_kernel<D, WIDE, F16, F8, CL, DV>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
}
/* The launch of a CL = 2 instance: clusters of two consecutive CTAs along x. */
template <int D, bool WIDE>
static cudaLaunchConfig_t fa3_cl2_config(int grid, size_t smem, cudaStream_t st, cudaLaunchAttribute *at) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)grid);
    cfg.blockDim = dim3(fa3_tile<D, WIDE>::THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    at->id = cudaLaunchAttributeClusterDimension;
    at->val.clusterDim.x = 2, at->val.clusterDim.y = 1, at->val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cfg;
}

/* The plan's grid (min(tiles, SMs): persistent), threads and shared memory (this row's fa3_shared + 1024 for the
 * swizzle's alignment). Varlen: tiles for every sequence at the grid's bounds (max_seqlen_q), each tile reading its
 * sequence's rows from the device cu_seqlens (a tile past its sequence's end has no work); the tensors are one
 * packed batch, so the tensor maps have batch 1. */
/* F8: e4m3 q, k (mapped as 16-bit tensors of half the columns: TMA moves bytes) and Vᵀ, written first by
 * fa3_vt_kernel into the workspace (varlen: one padded Vᵀ per sequence, at the bound max_seqlen_k); F16 is then out's
 * type. CL = 2: the row also has the cluster instance, which runs where the plan says (plan->aux[FA3_FWD_AUX_CL]),
 * its K and V boxes half a block's rows (each CTA loads and multicasts one half). */
template <int D, bool WIDE, bool F16, bool F8, int CL, int DV>
static cudaError_t fa3_launch(const fa_cuda_params *p, const fa_plan *plan, cudaStream_t stream) {
    using T = fa3_tile<D, WIDE, F8, DV>;
    if (p->batch == 0 || p->total_q == 0 || p->sq == 0) return cudaSuccess;
    const bool cl2 = CL == 2 && plan->aux[FA3_FWD_AUX_CL] == 2;
    const int kv_rows = cl2 ? T::Bc / 2 : T::Bc;
    CUtensorMap tq, tk, tv;
    const int tb = p->cu_q ? 1 : p->batch; /* the tensors' batch */
    if constexpr (F8) {
        const int skp = (p->sk + 31) & ~31;
        if (skp == 0 || !p->v_t) return cudaErrorInvalidValue;
        fa3_vt_kernel<D><<<dim3((unsigned)((skp + FA3_VT_KEYS - 1) / FA3_VT_KEYS), (unsigned)p->hk, (unsigned)p->batch),
                           256, 0, stream>>>((const uint8_t *)p->v, p->v_sb, p->v_ss, p->v_sh, p->sk, skp, p->cu_k,
                                             p->cu_k ? p->used_k : NULL, p->total_k, (uint8_t *)p->v_t);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
        const int64_t half = skp / 2; /* Vᵀ's rows in 16-bit columns */
        if (fa3_map(&tq, p->q, FA_DTYPE_BF16, D / 2, p->total_q, p->hq, tb, p->q_ss / 2, p->q_sh / 2, p->q_sb / 2,
                    T::Br) ||
            (p->cu_q ? fa3_map_ragged(&tk, p->k, FA_DTYPE_BF16, D / 2, p->total_k, p->hk, p->k_ss / 2, p->k_sh / 2,
                                      T::Bc)
                     : fa3_map(&tk, p->k, FA_DTYPE_BF16, D / 2, p->total_k, p->hk, tb, p->k_ss / 2, p->k_sh / 2,
                               p->k_sb / 2, T::Bc)) ||
            fa3_map(&tv, p->v_t, FA_DTYPE_BF16, (int)half, D, p->hk, p->batch, half, D * half, p->hk * D * half, D))
            return cudaErrorInvalidValue;
    } else if (fa3_map(&tq, p->q, p->dtype, D, p->total_q, p->hq, tb, p->q_ss, p->q_sh, p->q_sb, T::Br)) {
        return cudaErrorInvalidValue;
    } else if (p->cu_q
                   ? fa3_map_ragged(&tk, p->k, p->dtype, D, p->total_k, p->hk, p->k_ss, p->k_sh, T::Bc) ||
                         fa3_map_ragged(&tv, p->v, p->dtype, DV, p->total_k, p->hk, p->v_ss, p->v_sh, T::Bc)
                   : fa3_map(&tk, p->k, p->dtype, D, p->total_k, p->hk, tb, p->k_ss, p->k_sh, p->k_sb, kv_rows) ||
                         fa3_map(&tv, p->v, p->dtype, DV, p->total_k, p->hk, tb, p->v_ss, p->v_sh, p->v_sb, kv_rows)) {
        return cudaErrorInvalidValue; /* varlen: ragged K and V maps (the producer's boxes stop at a sequence's keys) */
    }
    fa3_kparams kp;
    kp.o = (uint16_t *)p->out;
    kp.lse = p->lse;
    kp.o_batch_stride = p->o_sb;
    kp.o_row_stride = p->o_ss;
    kp.o_head_stride = p->o_sh;
    kp.sq = p->sq;
    kp.sk = p->sk;
    kp.cu_q = p->cu_q, kp.cu_k = p->cu_k;
    kp.used_q = p->cu_q ? p->used_q : NULL, kp.used_k = p->cu_q ? p->used_k : NULL;
    kp.total_q = p->total_q, kp.total_k = p->total_k;
    kp.hq = p->hq;
    kp.group = p->hq / p->hk;
    kp.wl = p->wl;
    kp.wr = p->wr;
    kp.chunk = p->chunk;
    const bool cap = p->softcap > 0.f;
    kp.scale = cap ? 1.f : p->scale;
    kp.scale_log2 = (cap ? 1.f : p->scale) * 1.44269504088896340736f;
    kp.cap = p->softcap;
    kp.cap_scale = cap ? p->scale / p->softcap : 0.f; /* IEEE fp32 division, as the other CUDA kernels */
    kp.check = p->o_check;
    kp.sinks = p->sinks;
    kp.qd = p->q_descale, kp.kd = p->k_descale, kp.vd = p->v_descale, kp.hk = p->hk;
    const size_t smem = plan->smem_bytes;
    kp.nmb = (p->sq + T::Br - 1) / T::Br;
    kp.ntiles = kp.nmb * p->hq * p->batch;
    kp.bh = p->hq * p->batch;
    kp.sec_heads = 0, kp.mb_up = 0, kp.counter = NULL;
    kp.q_ahead = plan->aux[FA3_FWD_AUX_QBUF] == 2; /* the plan's: the row's qb (tiles.h), or 1 */
    kp.early = plan->aux[FA3_FWD_AUX_EARLY] != 0;
    if (fa3_masked(p) && p->tile_counter) { /* tiles differ in work: longest first, dynamically (the .cuh) */
        kp.sec_heads = fa3_l2_section((F8 ? 1.0 : 2.0) * (double)p->sk * (D + DV), kp.bh); /* K and V of a head */
        kp.mb_up = fa3_blocks_of(p, T::Br, T::Bc, 0) > fa3_blocks_of(p, T::Br, T::Bc, kp.nmb - 1);
        kp.counter = p->tile_counter;
    }
    /* persistent: one CTA per SM (the register budget allows no second), tiles handed out round-robin */
    if constexpr (CL == 2) {
        if (cl2) { /* the kernel walks pairs of query blocks of one head, all keys, fixed lengths (the plan's) */
            if (fa3_masked(p) || p->cu_q || kp.nmb % 2 || plan->grid[0] % 2) return cudaErrorInvalidValue;
            cudaError_t e = fa3_smem_attr<D, WIDE, F16, F8, 2>(smem);
            if (e != cudaSuccess) return e;
            cudaLaunchAttribute at;
            const cudaLaunchConfig_t cfg = fa3_cl2_config<D, WIDE>(plan->grid[0], smem, stream, &at);
            e = cudaLaunchKernelEx(&cfg, fa3_fwd_kernel<D, WIDE, F16, F8, 2>, tq, tk, tv, kp);
            return e != cudaSuccess ? e : cudaGetLastError();
        }
    }
    const cudaError_t e = fa3_smem_attr<D, WIDE, F16, F8, 1, DV>(smem);
    if (e != cudaSuccess) return e;
    fa3_fwd_kernel<D, WIDE, F16, F8, 1, DV><<<plan->grid[0], plan->threads, smem, stream>>>(tq, tk, tv, kp);
    return cudaGetLastError();
}

/* f16 / bf16: the instance for out of that type (the inputs' type but for the e4m3 rows) */
template <int R> static int fa3_fwd_inst(fa_cuda_instance *k) {
    constexpr fa3_fwd_row r = fa3_fwd_rows[R];
    constexpr bool W = r.wide, F8 = r.f8;
    using T = fa3_tile<r.d, W, F8, r.dv>;
    static_assert(T::Br == r.bm && T::Bc == r.bn && T::THREADS == r.threads, "the row is its instance's tile");
    static_assert(r.cl == 1 || (r.cl == 2 && !F8 && r.dv == r.d), "clusters: 16-bit rows of one head dim only");
    static_assert(r.qb == T::QB, "the row's Q buffers are the ones its shared memory holds");
    static_assert(sizeof(fa3_shared<r.d, W, F8, r.dv>) + 1024 <= 232448, "the opt-in 227 KB of shared memory a block");
    k->f16 = fa3_launch<r.d, W, true, F8, r.cl, r.dv>, k->bf16 = fa3_launch<r.d, W, false, F8, r.cl, r.dv>;
    k->smem = sizeof(fa3_shared<r.d, W, F8, r.dv>) + 1024;
    return 1;
}

/* Row R's clusters the current device holds at once, asked of its bf16 cluster instance (the f16 one takes the same
 * shared memory and registers); 0 for a row without one. */
template <int R> static int fa3_fwd_clusters_of() {
    constexpr fa3_fwd_row r = fa3_fwd_rows[R];
    if constexpr (r.cl != 2) {
        return 0;
    } else {
        constexpr bool W = r.wide;
        const size_t smem = sizeof(fa3_shared<r.d, W>) + 1024;
        cudaLaunchAttribute at;
        const cudaLaunchConfig_t cfg = fa3_cl2_config<r.d, W>(2, smem, 0, &at);
        int n = 0;
        if (fa3_smem_attr<r.d, W, false, false, 2>(smem) != cudaSuccess ||
            cudaOccupancyMaxActiveClusters(&n, fa3_fwd_kernel<r.d, W, false, false, 2>, &cfg) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        return n;
    }
}
extern "C" int fa_flash3_fwd_clusters(int row, int device) {
    static int (*const of[9])(void) = {fa3_fwd_clusters_of<0>, fa3_fwd_clusters_of<1>, fa3_fwd_clusters_of<2>,
                                       fa3_fwd_clusters_of<3>, fa3_fwd_clusters_of<4>, fa3_fwd_clusters_of<5>,
                                       fa3_fwd_clusters_of<6>, fa3_fwd_clusters_of<7>, fa3_fwd_clusters_of<8>};
    static int known[64][9]; /* the count + 1; a race stores the same value twice */
    if (row < 0 || row >= 9 || device < 0 || device >= 64) return 0;
    if (!known[device][row]) {
        int prev = 0;
        if (cudaGetDevice(&prev) != cudaSuccess || (prev != device && cudaSetDevice(device) != cudaSuccess)) {
            (void)cudaGetLastError();
            return 0;
        }
        known[device][row] = of[row]() + 1;
        if (prev != device) cudaSetDevice(prev);
    }
    return known[device][row] - 1;
}
static_assert(sizeof fa3_fwd_rows / sizeof fa3_fwd_rows[0] == 9, "one case per row of fa3_fwd_rows");
extern "C" int fa_flash3_fwd_instance(int row, fa_cuda_instance *k) {
    switch (row) {
    case 0: return fa3_fwd_inst<0>(k);
    case 1: return fa3_fwd_inst<1>(k);
    case 2: return fa3_fwd_inst<2>(k);
    case 3: return fa3_fwd_inst<3>(k);
    case 4: return fa3_fwd_inst<4>(k);
    case 5: return fa3_fwd_inst<5>(k);
    case 6: return fa3_fwd_inst<6>(k);
    case 7: return fa3_fwd_inst<7>(k);
    case 8: return fa3_fwd_inst<8>(k);
    default: return 0;
    }
}

extern "C" cudaError_t fa_flash3_fwd_launch(const fa_cuda_params *p, const fa_plan *plan, cudaStream_t st) {
    fa_cuda_instance k;
    if (!fa_flash3_fwd_instance(plan->entry, &k)) return cudaErrorInvalidValue;
    return (p->o_dtype == FA_DTYPE_F16 ? k.f16 : k.bf16)(p, plan, st);
}
