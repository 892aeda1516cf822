/* FlashAttention-2 forward (FA2p Algorithm 1) with mma.sync m16n8k16 + ldmatrix + cp.async.
 *
 * Grid (Tr = ceil(Sq/Br), Hq, B): one CTA per query block Qi — the outer loop of FA2 is the grid. NW warps split
 * the Br rows of Qi ("split-Q"): warp w owns rows 16·MW·w .. 16·MW·(w+1)-1, so every row statistic lives inside
 * one quad of lanes and no warp ever talks to another (FA2p §3.3).
 * Inner loop over the key blocks Kj, Vj, last block first (the only one that can need the seqlen mask):
 *   S = Qi Kjᵀ (fp32 registers); mask; m_new = max(m, rowmax S);
 *   P = exp2(S·c − m_new·c), c = scale·log2e (one FFMA + MUFU.EX2 per score); ℓ = 2^((m−m_new)c)·ℓ + rowsum P;
 *   O = 2^((m−m_new)c)·O + P Vj
 * with P fed from the S registers as the A operand (no shared memory). 1/ℓ is applied once at the end and only
 * LSE = m·scale + ln ℓ is written (FA2p §3.1.1). Kj, Vj are double-buffered with cp.async: block j-1 is fetched
 * while block j computes, one __syncthreads per block. (FA2's single-buffered K/V ordering, GPU_NOTES §2.5, was
 * measured first: 168 TFLOP/s at d=64, 4k — the load latency was not hidden with 2 CTAs per SM.) */
#include "common.cuh"

/* Per-CTA values that the loop and the epilogue read back from shared memory: thread 0 writes them before the
 * loop and the loop's first __syncthreads (or the epilogue's) publishes them. Carried in registers across the
 * loop, they (with ℓ, m) were what ptxas spilled in the 4-warp d = 128 tiles, whose 128 O and 64 S accumulators
 * per thread leave no room for anything loop-invariant. */
struct fa_fwd_cta {
    const void *K, *V; /* row 0 of this (batch, K/V head) */
    void *O;           /* row m0 of this (batch, head) */
    int64_t lse0;      /* index of row m0 in p.lse */
    int sq, sk, rows, nb_lo;
};

/* Launch bounds: 4-warp tiles are told "2 CTAs per SM" (up to 255 registers): with the thread count alone, ptxas
 * capped the 64 x 64 tile at 128 registers and spilled 20 B. 8-warp tiles: 1 CTA, 255 registers. */
template <typename T, int D, int BM, int BN, int NW>
__global__ void __launch_bounds__(NW * 32, NW == 4 ? 2 : 1) fa_flash2_fwd_kernel(const fa_cuda_params p) {
    constexpr int NTHR = NW * 32, MW = BM / (16 * NW), LD = D + 8, NT = BN / 8, DT = D / 8;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    T *sQ = (T *)fa_smem, *sK = sQ + BM * LD, *sV = sK + 2 * BN * LD; /* K and V: two stages each */
    /* ℓ and m of the rows this thread holds, [MW·2][NTHR] each: private to the thread, no barrier needed */
    float *sRowL = (float *)(sV + 2 * BN * LD), *sRowM = sRowL + 2 * MW * NTHR;
    fa_fwd_cta *cta = (fa_fwd_cta *)(sRowM + 2 * MW * NTHR);

    const int m_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const fa_seq s = fa_get_seq(p, b, h);
    const int m0 = m_block * BM;
    if (m0 >= s.sq) return;
    const int rows = min(BM, s.sq - m0);
    const int hk = h / p.group;
    const T *Q = (const T *)p.q + fa_off(p, p.q_sb, p.q_ss, p.q_sh, b, s.qrow, h) + (int64_t)m0 * p.q_ss;
    const T *K = (const T *)p.k + fa_off(p, p.k_sb, p.k_ss, p.k_sh, b, s.krow, hk);
    const T *V = (const T *)p.v + fa_off(p, p.v_sb, p.v_ss, p.v_sh, b, s.krow, hk);
    T *O = (T *)p.out + fa_off(p, p.o_sb, p.o_ss, p.o_sh, b, s.qrow, h) + (int64_t)m0 * p.o_ss;

    int klo, khi;
    fa_key_span(p, m0, m0 + rows, s.sq, s.sk, &klo, &khi);
    const int nb_lo = klo / BN, nb_hi = khi > klo ? (khi + BN - 1) / BN : nb_lo;

    if (tid == 0) {
        cta->K = K, cta->V = V, cta->O = O;
        cta->lse0 = s.stat0 + m0;
        cta->sq = s.sq, cta->sk = s.sk, cta->rows = rows, cta->nb_lo = nb_lo;
    }

    /* Row statistics: this thread holds rows g and g+8 of each of its MW row tiles; slot (2·mi + r)·NTHR + tid. */
    float O_acc[MW][DT][4];
#pragma unroll
    for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) O_acc[mi][dt][0] = O_acc[mi][dt][1] = O_acc[mi][dt][2] = O_acc[mi][dt][3] = 0.f;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            sRowM[(2 * mi + r) * NTHR + tid] = -INFINITY;
            sRowL[(2 * mi + r) * NTHR + tid] = 0.f;
        }
    }
    const int wrow = warp * 16 * MW; /* first row of this warp inside the block */
    const float sl2 = p.scale_log2;
    const bool raw = sl2 > 0.f && p.softcap == 0.f; /* uniform */
    const float kl = raw ? sl2 : 1.f;               /* S·kl is in log2 units */

    if (nb_hi > nb_lo) {
        const int64_t r0 = (int64_t)(nb_hi - 1) * BN;
        fa_load_tile<T, BM, D, LD, NTHR>(sQ, Q, p.q_ss, rows, tid);
        fa_load_tile<T, BN, D, LD, NTHR>(sK, K + r0 * p.k_ss, p.k_ss, s.sk - (int)r0, tid);
        fa_load_tile<T, BN, D, LD, NTHR>(sV, V + r0 * p.v_ss, p.v_ss, s.sk - (int)r0, tid);
        fa_cp_async_commit();
    }
    for (int n = nb_hi - 1, st = 0; n >= nb_lo; --n, st ^= 1) {
        const int n0 = n * BN;
        const T *sKs = sK + st * BN * LD, *sVs = sV + st * BN * LD;
        fa_cp_async_wait<0>();
        __syncthreads(); /* Kj, Vj (and Qi, *cta) landed; every warp is done with the other stage */
        const int sq = cta->sq, sk = cta->sk, rows_c = cta->rows;
        if (n > cta->nb_lo) { /* prefetch Kj-1, Vj-1: a whole iteration to land */
            const T *Kc = (const T *)cta->K, *Vc = (const T *)cta->V;
            fa_load_tile<T, BN, D, LD, NTHR>(sK + (st ^ 1) * BN * LD, Kc + (int64_t)(n0 - BN) * p.k_ss, p.k_ss, sk - (n0 - BN), tid);
            fa_load_tile<T, BN, D, LD, NTHR>(sV + (st ^ 1) * BN * LD, Vc + (int64_t)(n0 - BN) * p.v_ss, p.v_ss, sk - (n0 - BN), tid);
            fa_cp_async_commit();
        }

        /* S = Qi Kjᵀ */
        float S[MW][NT][4];
#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) S[mi][nt][0] = S[mi][nt][1] = S[mi][nt][2] = S[mi][nt][3] = 0.f;
        fa_warp_gemm_abt<T, MW, NT, D, LD, LD>(S, sQ + wrow * LD, sKs, lane);

        /* Scores stay raw and exp2 takes scale·log2e folded into one FFMA (FA2's trick) when the scale is positive;
         * with softcap or a negative scale, S is first mapped to log2 units (one FMUL) and kl = 1. */
        if (!raw) {
#pragma unroll
            for (int mi = 0; mi < MW; ++mi)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        float x = S[mi][nt][e];
                        if (p.softcap > 0.f) x = fa_softcap(x, p.softcap_scale, p.softcap);
                        S[mi][nt][e] = x * sl2;
                    }
        }
        if (!fa_block_full(p, m0, m0 + rows_c, n0, n0 + BN, sq, sk)) {
#pragma unroll
            for (int mi = 0; mi < MW; ++mi)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        int i = m0 + wrow + mi * 16 + (lane >> 2) + (e >> 1) * 8;
                        int j = n0 + nt * 8 + (lane & 3) * 2 + (e & 1);
                        if (!fa_visible(p, i, j, sq, sk)) S[mi][nt][e] = -INFINITY;
                    }
        }

        /* Online softmax: m_new = max(m, rowmax S); rescale ℓ and O by exp2((m − m_new)·kl). */
#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int si = (2 * mi + r) * NTHR + tid;
                const float m_old = sRowM[si];
                float mx = m_old;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(S[mi][nt][2 * r], S[mi][nt][2 * r + 1]));
                mx = fa_quad_max(mx);
                const float m_use = mx == -INFINITY ? 0.f : mx; /* fully masked so far: no NaN from −inf − −inf */
                const float corr = fa_exp2((m_old - m_use) * kl);
                sRowM[si] = mx;
                const float msc = m_use * kl;
                float sum = 0.f;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    S[mi][nt][2 * r] = fa_exp2(fmaf(S[mi][nt][2 * r], kl, -msc));
                    S[mi][nt][2 * r + 1] = fa_exp2(fmaf(S[mi][nt][2 * r + 1], kl, -msc));
                    sum += S[mi][nt][2 * r] + S[mi][nt][2 * r + 1];
                }
                sRowL[si] = sRowL[si] * corr + sum; /* thread-local: the quad sum is deferred to the end */
#pragma unroll
                for (int dt = 0; dt < DT; ++dt) {
                    O_acc[mi][dt][2 * r] *= corr;
                    O_acc[mi][dt][2 * r + 1] *= corr;
                }
            }
        /* O += P Vj, P straight from the S registers. */
        uint32_t Pa[MW][NT / 2][4];
        fa_acc_to_a<T, MW, NT / 2>(Pa, S);
        fa_warp_gemm_rb<T, MW, DT, NT / 2, LD>(O_acc, Pa, sVs, lane);
    }

    /* Epilogue: O /= ℓ, LSE = m·scale + ln ℓ (−inf and O = 0 for a row that saw no key). */
    __syncthreads(); /* all warps are done with sQ: it becomes the O staging tile; *cta is visible */
    const int rows_e = cta->rows;
#pragma unroll
    for (int mi = 0; mi < MW; ++mi)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float l = fa_quad_sum(sRowL[(2 * mi + r) * NTHR + tid]);
            const float inv = l > 0.f ? fa_rcp_normal(l) : 0.f; /* l > 0 is about 1 or more: the row max adds 2^(~0) */
            const int row = wrow + mi * 16 + (lane >> 2) + r * 8;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt)
                *(uint32_t *)(sQ + row * LD + dt * 8 + (lane & 3) * 2) =
                    fa_pack2<T>(O_acc[mi][dt][2 * r] * inv, O_acc[mi][dt][2 * r + 1] * inv);
            if (p.lse && (lane & 3) == 0 && row < rows_e)
                p.lse[cta->lse0 + row] = l > 0.f ? sRowM[(2 * mi + r) * NTHR + tid] * kl * FA_LN2 + logf(l) : -INFINITY;
        }
    __syncthreads();
    fa_store_tile<T, BM, D, LD, NTHR>((T *)cta->O, p.o_ss, sQ, rows_e, tid);
}

/* Qi, two stages of Kj and Vj, ℓ and m (8 floats per row of Qi: each lane of the row's quad keeps its own ℓ, m),
 * the per-CTA values. */
template <int D, int BM, int BN> static size_t fa2_fwd_smem_bytes() {
    return (size_t)(BM + 4 * BN) * (D + 8) * 2 + (size_t)8 * BM * sizeof(float) + sizeof(fa_fwd_cta);
}

template <typename T, int D, int BM, int BN, int NW> static cudaError_t fa2_fwd_run(const fa_cuda_params *p, cudaStream_t st) {
    const size_t smem = fa2_fwd_smem_bytes<D, BM, BN>();
    cudaError_t e = cudaFuncSetAttribute(fa_flash2_fwd_kernel<T, D, BM, BN, NW>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    dim3 grid((p->sq + BM - 1) / BM, p->hq, p->batch);
    if (grid.x == 0) return cudaSuccess;
    fa_flash2_fwd_kernel<T, D, BM, BN, NW><<<grid, NW * 32, smem, st>>>(*p);
    return cudaGetLastError();
}

/* Tile table (Br x Bc, warps); the first row of each head dim is the default, the others are reachable through
 * opts.block_q/block_k for sweeps, and rows that differ only in warps through FA_CUDA_FLASH2_FWD_WARPS (read at
 * context creation: among the rows that match the request, the first with that many warps). Registers from
 * -Xptxas -v, nvcc 13.0 (no spills in any row); CTAs/SM from registers and shared memory.
 * Measured on the H200, bf16, flashattn bench (B·S = 16k, model dim 2048), median of 10, ms for seqlen
 * 1k / 4k / 16k non-causal, before the row statistics moved to shared memory (2026-11-30, first round):
 *   d=64 : 128 x 64,  4 warps: 0.513 / 1.882 / 7.350  <- default (2 row tiles per warp: half the K/V ldmatrix
 *                                                        traffic per FLOP; 206 regs, 2 CTAs/SM)
 *          256 x 64,  8 warps: 0.544 / 1.983 / 7.650  (210 regs, 1 CTA/SM)
 *          128 x 128, 8 warps: 0.667 / 2.428 / 9.397  (182 regs, 1 CTA/SM)
 *          64 x 64,   4 warps: slower in an earlier round (164 vs 191 TFLOP/s for 128 x 64 at 4k) (126 regs)
 *   d=128: 128 x 64,  4 warps: not measured yet       <- default: FA2's H100 choice, the d=64 winner's shape
 *                                                        (2 row tiles per warp: half the K/V shared-memory reads
 *                                                        per MMA of the 8-warp tile). 255 regs, 0 spill (it
 *                                                        spilled 72 B while ℓ, m and the per-CTA values lived in
 *                                                        registers), 2 CTAs/SM = 8 warps/SM like the 8-warp row
 *          128 x 64,  8 warps: 0.609 / 2.245 / 8.803  (the default until the 4-warp row fitted; 158 regs,
 *                                                        1 CTA/SM; FA_CUDA_FLASH2_FWD_WARPS=8)
 *          64 x 64,   4 warps: 0.633 / 2.372 / 9.325  (158 regs, 2 CTAs/SM) */
typedef struct fa2_fwd_cfg {
    int d, bm, bn, nw;
    const char *kernel; /* the name fa_stats reports */
} fa2_fwd_cfg;
static const fa2_fwd_cfg fa2_fwd_table[] = {
    {64, 128, 64, 4, "cuda.flash2.fwd.mma_sync.d64.128x64w4"},   {64, 256, 64, 8, "cuda.flash2.fwd.mma_sync.d64.256x64w8"},
    {64, 128, 128, 8, "cuda.flash2.fwd.mma_sync.d64.128x128w8"}, {64, 64, 64, 4, "cuda.flash2.fwd.mma_sync.d64.64x64w4"},
    {128, 128, 64, 4, "cuda.flash2.fwd.mma_sync.d128.128x64w4"}, {128, 128, 64, 8, "cuda.flash2.fwd.mma_sync.d128.128x64w8"},
    {128, 64, 64, 4, "cuda.flash2.fwd.mma_sync.d128.64x64w4"}};

/* The row for head dim d, tile bm x bn (0 = any) and nw warps (0 = any; ignored when no matching row has nw). */
static const fa2_fwd_cfg *fa2_fwd_find(int d, int bm, int bn, int nw) {
    for (int pass = 0; pass < 2; ++pass)
        for (size_t i = 0; i < sizeof fa2_fwd_table / sizeof fa2_fwd_table[0]; ++i) {
            const fa2_fwd_cfg *c = &fa2_fwd_table[i];
            if (c->d == d && (bm == 0 || bm == c->bm) && (bn == 0 || bn == c->bn) && (pass || !nw || nw == c->nw))
                return c;
        }
    return NULL;
}

extern "C" int fa_flash2_fwd_tiles(int d, int *bm, int *bn) {
    const fa2_fwd_cfg *c = fa2_fwd_find(d, *bm, *bn, 0);
    if (!c) return 0;
    *bm = c->bm, *bn = c->bn;
    return 1;
}

template <typename T> static cudaError_t fa2_fwd_dispatch(const fa_cuda_params *p, const fa2_fwd_cfg *c, cudaStream_t st) {
    const int bm = c->bm, bn = c->bn, nw = c->nw;
    if (p->d == 64 && bm == 128 && bn == 64 && nw == 4) return fa2_fwd_run<T, 64, 128, 64, 4>(p, st);
    if (p->d == 64 && bm == 64 && bn == 64 && nw == 4) return fa2_fwd_run<T, 64, 64, 64, 4>(p, st);
    if (p->d == 64 && bm == 128 && bn == 128 && nw == 8) return fa2_fwd_run<T, 64, 128, 128, 8>(p, st);
    if (p->d == 64 && bm == 256 && bn == 64 && nw == 8) return fa2_fwd_run<T, 64, 256, 64, 8>(p, st);
    if (p->d == 128 && bm == 64 && bn == 64 && nw == 4) return fa2_fwd_run<T, 128, 64, 64, 4>(p, st);
    if (p->d == 128 && bm == 128 && bn == 64 && nw == 4) return fa2_fwd_run<T, 128, 128, 64, 4>(p, st);
    if (p->d == 128 && bm == 128 && bn == 64 && nw == 8) return fa2_fwd_run<T, 128, 128, 64, 8>(p, st);
    return cudaErrorInvalidValue;
}

/* *bm, *bn: in = requested (0 = default), out = used; nw: requested warps (0 = the table's order); *kernel: the
 * name of the row that ran. */
extern "C" cudaError_t fa_flash2_fwd_launch(const fa_cuda_params *p, int dtype, int nw, cudaStream_t st, int *bm, int *bn,
                                            const char **kernel) {
    const fa2_fwd_cfg *c = fa2_fwd_find(p->d, *bm, *bn, nw);
    if (!c) return cudaErrorInvalidValue;
    *bm = c->bm, *bn = c->bn, *kernel = c->kernel;
    return dtype == 1 ? fa2_fwd_dispatch<__half>(p, c, st) : fa2_fwd_dispatch<__nv_bfloat16>(p, c, st);
}
