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

/* Launch bounds: 4-warp tiles are told "2 CTAs per SM" (up to 255 registers): with the thread count alone, ptxas
 * capped the 64 x 64 tile at 128 registers and spilled 20 B. 8-warp tiles: 1 CTA, 255 registers. */
template <typename T, int D, int BM, int BN, int NW>
__global__ void __launch_bounds__(NW * 32, NW == 4 ? 2 : 1) fa_flash2_fwd_kernel(const fa_cuda_params p) {
    constexpr int NTHR = NW * 32, MW = BM / (16 * NW), LD = D + 8, NT = BN / 8, DT = D / 8;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    T *sQ = (T *)fa_smem, *sK = sQ + BM * LD, *sV = sK + 2 * BN * LD; /* K and V: two stages each */

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

    /* Row statistics: this thread holds rows g and g+8 of each of its MW row tiles. */
    float O_acc[MW][DT][4];
    float row_m[MW][2], row_l[MW][2];
#pragma unroll
    for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) O_acc[mi][dt][0] = O_acc[mi][dt][1] = O_acc[mi][dt][2] = O_acc[mi][dt][3] = 0.f;
        row_m[mi][0] = row_m[mi][1] = -INFINITY;
        row_l[mi][0] = row_l[mi][1] = 0.f;
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
    for (int n = nb_hi - 1; n >= nb_lo; --n) {
        const int n0 = n * BN, st = (nb_hi - 1 - n) & 1;
        const T *sKs = sK + st * BN * LD, *sVs = sV + st * BN * LD;
        fa_cp_async_wait<0>();
        __syncthreads(); /* Kj, Vj (and Qi) landed; every warp is done with the other stage */
        if (n > nb_lo) { /* prefetch Kj-1, Vj-1: a whole iteration to land */
            fa_load_tile<T, BN, D, LD, NTHR>(sK + (st ^ 1) * BN * LD, K + (int64_t)(n0 - BN) * p.k_ss, p.k_ss, s.sk - (n0 - BN), tid);
            fa_load_tile<T, BN, D, LD, NTHR>(sV + (st ^ 1) * BN * LD, V + (int64_t)(n0 - BN) * p.v_ss, p.v_ss, s.sk - (n0 - BN), tid);
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
        if (!fa_block_full(p, m0, m0 + rows, n0, n0 + BN, s.sq, s.sk)) {
#pragma unroll
            for (int mi = 0; mi < MW; ++mi)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        int i = m0 + wrow + mi * 16 + (lane >> 2) + (e >> 1) * 8;
                        int j = n0 + nt * 8 + (lane & 3) * 2 + (e & 1);
                        if (!fa_visible(p, i, j, s.sq, s.sk)) S[mi][nt][e] = -INFINITY;
                    }
        }

        /* Online softmax: m_new = max(m, rowmax S); rescale ℓ and O by exp2((m − m_new)·kl). */
#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float mx = row_m[mi][r];
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(S[mi][nt][2 * r], S[mi][nt][2 * r + 1]));
                mx = fa_quad_max(mx);
                const float m_use = mx == -INFINITY ? 0.f : mx; /* fully masked so far: no NaN from −inf − −inf */
                const float corr = fa_exp2((row_m[mi][r] - m_use) * kl);
                row_m[mi][r] = mx;
                const float msc = m_use * kl;
                float sum = 0.f;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    S[mi][nt][2 * r] = fa_exp2(fmaf(S[mi][nt][2 * r], kl, -msc));
                    S[mi][nt][2 * r + 1] = fa_exp2(fmaf(S[mi][nt][2 * r + 1], kl, -msc));
                    sum += S[mi][nt][2 * r] + S[mi][nt][2 * r + 1];
                }
                row_l[mi][r] = row_l[mi][r] * corr + sum; /* thread-local: the quad sum is deferred to the end */
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
    __syncthreads(); /* all warps are done with sQ: it becomes the O staging tile */
#pragma unroll
    for (int mi = 0; mi < MW; ++mi)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float l = fa_quad_sum(row_l[mi][r]);
            const float inv = l > 0.f ? fa_rcp_normal(l) : 0.f; /* l > 0 is about 1 or more: the row max adds 2^(~0) */
            const int row = wrow + mi * 16 + (lane >> 2) + r * 8;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt)
                *(uint32_t *)(sQ + row * LD + dt * 8 + (lane & 3) * 2) =
                    fa_pack2<T>(O_acc[mi][dt][2 * r] * inv, O_acc[mi][dt][2 * r + 1] * inv);
            if (p.lse && (lane & 3) == 0 && row < rows)
                p.lse[s.stat0 + m0 + row] = l > 0.f ? row_m[mi][r] * kl * FA_LN2 + logf(l) : -INFINITY;
        }
    __syncthreads();
    fa_store_tile<T, BM, D, LD, NTHR>(O, p.o_ss, sQ, rows, tid);
}

template <typename T, int D, int BM, int BN, int NW> static cudaError_t fa2_fwd_run(const fa_cuda_params *p, cudaStream_t st) {
    const size_t smem = (size_t)(BM + 4 * BN) * (D + 8) * sizeof(T);
    cudaError_t e = cudaFuncSetAttribute(fa_flash2_fwd_kernel<T, D, BM, BN, NW>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    dim3 grid((p->sq + BM - 1) / BM, p->hq, p->batch);
    if (grid.x == 0) return cudaSuccess;
    fa_flash2_fwd_kernel<T, D, BM, BN, NW><<<grid, NW * 32, smem, st>>>(*p);
    return cudaGetLastError();
}

/* Tile table (Br x Bc, warps); the first row of each head dim is the default, the others are reachable through
 * opts.block_q/block_k for sweeps. Registers from -Xptxas -v (no spills in any row). Measured on the H200, bf16,
 * flashattn bench (B·S = 16k, model dim 2048), median of 10, ms for seqlen 1k / 4k / 16k non-causal, with the
 * final kernel (K/V double-buffered, FFMA-folded exp2):
 *   d=64 : 128 x 64,  4 warps: 0.513 / 1.882 / 7.350  <- default (2 row tiles per warp: half the K/V ldmatrix
 *                                                        traffic per FLOP; 246 regs, 2 CTAs/SM)
 *          256 x 64,  8 warps: 0.544 / 1.983 / 7.650
 *          128 x 128, 8 warps: 0.667 / 2.428 / 9.397
 *          64 x 64,   4 warps: slower in an earlier round (164 vs 191 TFLOP/s for 128 x 64 at 4k)
 *   d=128: 128 x 64,  8 warps: 0.609 / 2.245 / 8.803  <- default
 *          64 x 64,   4 warps: 0.633 / 2.372 / 9.325
 *          (128 x 64 with 4 warps, FA2's choice, spills 72 B here: ptxas keeps too many fragments live) */
typedef struct fa2_fwd_cfg {
    int d, bm, bn;
} fa2_fwd_cfg;
static const fa2_fwd_cfg fa2_fwd_table[] = {{64, 128, 64}, {64, 256, 64}, {64, 128, 128}, {64, 64, 64}, {128, 128, 64}, {128, 64, 64}};

extern "C" int fa_flash2_fwd_tiles(int d, int *bm, int *bn) {
    for (size_t i = 0; i < sizeof fa2_fwd_table / sizeof fa2_fwd_table[0]; ++i) {
        const fa2_fwd_cfg *c = &fa2_fwd_table[i];
        if (c->d == d && (*bm == 0 || *bm == c->bm) && (*bn == 0 || *bn == c->bn)) {
            *bm = c->bm, *bn = c->bn;
            return 1;
        }
    }
    return 0;
}

template <typename T> static cudaError_t fa2_fwd_dispatch(const fa_cuda_params *p, int bm, int bn, cudaStream_t st) {
    if (p->d == 64 && bm == 128 && bn == 64) return fa2_fwd_run<T, 64, 128, 64, 4>(p, st);
    if (p->d == 64 && bm == 64 && bn == 64) return fa2_fwd_run<T, 64, 64, 64, 4>(p, st);
    if (p->d == 64 && bm == 128 && bn == 128) return fa2_fwd_run<T, 64, 128, 128, 8>(p, st);
    if (p->d == 64 && bm == 256 && bn == 64) return fa2_fwd_run<T, 64, 256, 64, 8>(p, st);
    if (p->d == 128 && bm == 64 && bn == 64) return fa2_fwd_run<T, 128, 64, 64, 4>(p, st);
    if (p->d == 128 && bm == 128 && bn == 64) return fa2_fwd_run<T, 128, 128, 64, 8>(p, st);
    return cudaErrorInvalidValue;
}

/* *bm, *bn: in = requested (0 = default), out = used. */
extern "C" cudaError_t fa_flash2_fwd_launch(const fa_cuda_params *p, int dtype, cudaStream_t st, int *bm, int *bn) {
    if (!fa_flash2_fwd_tiles(p->d, bm, bn)) return cudaErrorInvalidValue;
    return dtype == 1 ? fa2_fwd_dispatch<__half>(p, *bm, *bn, st) : fa2_fwd_dispatch<__nv_bfloat16>(p, *bm, *bn, st);
}
