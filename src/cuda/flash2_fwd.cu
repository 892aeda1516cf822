/* FlashAttention-2 forward (FA2p Algorithm 1) with mma.sync m16n8k16 + ldmatrix + cp.async.
 *
 * Grid (Tr = ceil(Sq/Br), Hq, B): one CTA per query block Qi — the outer loop of FA2 is the grid. NW warps split
 * the Br rows of Qi ("split-Q"): warp w owns rows 16·MW·w .. 16·MW·(w+1)-1, so every row statistic lives inside
 * one quad of lanes and no warp ever talks to another (FA2p §3.3).
 * Inner loop over the key blocks Kj, Vj, last block first (the only one that can need the seqlen mask); blocks that
 * every row of Qi sees whole take a step without mask code (the causal diagonal, seqlen tail and windows take the
 * general one):
 *   S = Qi Kjᵀ (fp32 registers); mask; m_new = max(m, rowmax S);
 *   P = exp2(S·c − m_new·c), c = scale·log2e (one FFMA + MUFU.EX2 per score); ℓ = 2^((m−m_new)c)·ℓ + rowsum P;
 *   O = 2^((m−m_new)c)·O + P Vj
 * with P fed from the S registers as the A operand (no shared memory). 1/ℓ is applied once at the end and only
 * LSE = m·scale + ln ℓ is written (FA2p §3.1.1). Kj, Vj are double-buffered with cp.async: block j-1 is fetched
 * while block j computes, one __syncthreads per block. (FA2's single-buffered K/V ordering, GPU_NOTES §2.5, was
 * measured first: 168 TFLOP/s at d=64, 4k — the load latency was not hidden with 2 CTAs per SM.)
 * Query blocks run last to first, so under a causal mask the longest CTAs of each head start first. */
#include "common.cuh"

/* Per-CTA values that the loop and the epilogue read back from shared memory: thread 0 writes them before the
 * loop and a __syncthreads publishes them. Carried in registers across the loop, they (with ℓ, m) were what ptxas
 * spilled in the 4-warp d = 128 tiles (128 O and 64 S accumulators per thread) and in the 3-CTA d = 64 tile
 * (168 registers per thread). */
struct fa_fwd_cta {
    const void *K, *V;   /* row 0 of this (batch, K/V head) */
    void *O;             /* row m0 of this (batch, head) */
    int64_t lse0;        /* index of row m0 in p.lse */
    int64_t k_ss, v_ss;  /* row strides of K and V */
    int sq, sk, rows, m0; /* lengths of this sequence, valid rows of Qi, first row of Qi */
    int nb_lo;           /* lowest key block to visit */
    int f_lo, f_hi;      /* key blocks [f_lo, f_hi] take the hot step (no mask, no softcap) */
    int nb_first;        /* the loop's first block (single-stage tiles only: its V came with the prologue) */
};

/* threadIdx.x, read where it is used: ptxas does not carry a special-register read across the loop's QKᵀ GEMM,
 * where the 3-CTA d = 64 tile (168 registers) otherwise spilled the values derived from it. */
FA_DEV int fa_tid_here() {
    int t;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
    return t;
}

/* Kn-1, Vn-1 -> the other stage (cp.async, one commit group), n = sN[tid] > nb_lo. Every block below the loop's
 * first (the last key block, the only one the seqlen tail can cut) is whole: the loader checks no row (d=128: 1010
 * -> 945 instructions per hot step; measured with the late ℓ store below, H200, bf16, one command, TFLOP/s
 * without -> with: d64 2k 298.1 -> 303.5, 4k 303.9 -> 310.1; d128 2k 330.6 -> 335.7, 4k 337.8 -> 343.8).
 * Issued at the top of the step, after the barrier: issued after the QKᵀ GEMM instead (FA2's place for its next K)
 * it measured 7-9 % slower at d=128 (4k 320.0 vs 352.4), equal at d=64. */
template <typename T, int D, int BN, int NTHR>
FA_DEV void fa2_fwd_prefetch(const fa_fwd_cta *cta, T *sK, T *sV, const int *sN) {
    constexpr int LD = D + 8;
    const int tid = fa_tid_here(), n = sN[tid];
    if (n > cta->nb_lo) { /* a whole step to land */
        const int64_t kss = cta->k_ss, vss = cta->v_ss, r0 = (int64_t)(n - 1) * BN;
        T *sK1 = sK + ((n - 1) & 1) * BN * LD, *sV1 = sV + ((n - 1) & 1) * BN * LD;
        fa_load_tile<T, BN, D, LD, NTHR, true>(sK1, (const T *)cta->K + r0 * kss, kss, BN, tid);
        fa_load_tile<T, BN, D, LD, NTHR, true>(sV1, (const T *)cta->V + r0 * vss, vss, BN, tid);
        fa_cp_async_commit();
    }
}

/* Single-stage tiles (NST = 1: one K and one V buffer, FA2's own order, so that d = 256's 64 x 64 tile fits two
 * CTAs per SM): key block r of matrix X (K or V) -> buf, whole rows, one commit group. */
template <typename T, int D, int BN, int NTHR>
FA_DEV void fa2_fwd_load1(T *buf, const void *X, int64_t ss, int r, int tid) {
    fa_load_tile<T, BN, D, D + 8, NTHR, true>(buf, (const T *)X + (int64_t)r * BN * ss, ss, BN, tid);
    fa_cp_async_commit();
}

/* One key block n = sN[tid] of the inner loop, for the MW row tiles of this warp. NST = 2: Kn, Vn are in stage
 * n & 1 of sK, sV; Kn-1, Vn-1 are fetched into the other stage while this block computes. NST = 1 (FA2's order,
 * two barriers per block): Vn is fetched during the QKᵀ GEMM and the softmax, Kn-1 during the PV GEMM.
 * GEN = false: the hot step — every (row, key) of the block visible, scale > 0, no softcap: no mask code at all.
 * GEN = true: softcap / negative scale and the per-element mask (the seqlen tail, the causal diagonal, windows).
 * The thread index, block index and lengths are re-read (special register, shared memory) on each side of the
 * QKᵀ GEMM instead of being held across it: the GEMM (S, O and prefetched fragments live) is the register peak. */
template <typename T, int D, int BM, int BN, int NW, int NST, bool GEN>
FA_DEV void fa2_fwd_step(float (&O)[BM / (16 * NW)][D / 8][4], float (&S)[BM / (16 * NW)][BN / 8][4],
                         const fa_cuda_params &p, const fa_fwd_cta *cta, const T *sQ, T *sK, T *sV, float *sRowM,
                         float *sRowL, const int *sN) {
    constexpr int NTHR = NW * 32, MW = BM / (16 * NW), LD = D + 8, NT = BN / 8, DT = D / 8;
    fa_cp_async_wait<0>();
    __syncthreads(); /* Kn, Vn (and Qi, *cta) landed; every warp is done with the other stage */
    if constexpr (NST == 2) {
        fa2_fwd_prefetch<T, D, BN, NTHR>(cta, sK, sV, sN);
    } else { /* Kn landed, every warp is done with Vn+1: Vn loads during the QKᵀ GEMM and the softmax */
        const int t = fa_tid_here(), n = sN[t];
        if (n != cta->nb_first) fa2_fwd_load1<T, D, BN, NTHR>(sV, cta->V, cta->v_ss, n, t);
    }

    /* S = Qi Knᵀ */
#pragma unroll
    for (int mi = 0; mi < MW; ++mi)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) S[mi][nt][0] = S[mi][nt][1] = S[mi][nt][2] = S[mi][nt][3] = 0.f;
    {
        const int tid = fa_tid_here();
        fa_warp_gemm_abt<T, MW, NT, D, LD, LD>(S, sQ + (tid >> 5) * 16 * MW * LD, sK + (sN[tid] & (NST - 1)) * BN * LD,
                                               tid & 31);
    }
    const int tid = fa_tid_here(), lane = tid & 31, n = sN[tid];
    const int wrow = (tid >> 5) * 16 * MW; /* first row of this warp inside the block */
    const float kl = p.scale_log2 > 0.f && p.softcap == 0.f ? p.scale_log2 : 1.f; /* S·kl is in log2 units */

    if (GEN) {
        /* Scores stay raw and exp2 takes scale·log2e folded into one FFMA (FA2's trick) when the scale is positive;
         * with softcap or a negative scale, S is first mapped to log2 units (one FMUL) and kl = 1. */
        if (!(p.scale_log2 > 0.f && p.softcap == 0.f)) {
#pragma unroll
            for (int mi = 0; mi < MW; ++mi)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        float x = S[mi][nt][e];
                        if (p.softcap > 0.f) x = fa_softcap(x, p.softcap_scale, p.softcap);
                        S[mi][nt][e] = x * p.scale_log2;
                    }
        }
        /* fa_visible per row: query i sees keys [jlo, jhi] (bottom-right aligned window; causal is wr = 0) */
        const int sq = cta->sq, sk = cta->sk;
#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int diag = cta->m0 + wrow + mi * 16 + (lane >> 2) + r * 8 + sk - sq;
                const int jlo = p.wl >= 0 ? diag - p.wl : 0, jhi = p.wr >= 0 ? min(sk - 1, diag + p.wr) : sk - 1;
                const int j0 = n * BN + (lane & 3) * 2;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int j = j0 + nt * 8 + c;
                        if (j < jlo || j > jhi) S[mi][nt][2 * r + c] = -INFINITY;
                    }
            }
    }

    /* Online softmax: m_new = max(m, rowmax S); rescale ℓ and O by exp2((m − m_new)·kl). The new ℓ stays in
     * registers until the PV GEMM is issued: ptxas does not move an ldmatrix of V above a shared-memory store it
     * cannot prove disjoint, so an ℓ store here held every V load (and every PV MMA) behind the whole softmax;
     * stored after the GEMM, the exp2s and the first PV MMAs interleave (as in FA2's SASS). Measured (H200, bf16,
     * one command, TFLOP/s store here -> after the GEMM): d64 2k 303.5 -> 318.5, 4k 310.1 -> 323.5, 16k 315.3 ->
     * 325.8; d128 2k 335.7 -> 342.8, 4k 343.8 -> 352.4, 16k 350.0 -> 359.3 (causal alike, +2-4 %). m stays stored
     * here: it is known before the exp2s, and keeping it too spilled the 3-CTA d=64 tile. */
    float l_keep[MW][2];
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
            l_keep[mi][r] = sRowL[si] * corr + sum; /* thread-local: the quad sum is deferred to the end */
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
                O[mi][dt][2 * r] *= corr;
                O[mi][dt][2 * r + 1] *= corr;
            }
        }
    /* O += P Vn, P straight from the S registers. */
    uint32_t Pa[MW][NT / 2][4];
    fa_acc_to_a<T, MW, NT / 2>(Pa, S);
    if constexpr (NST == 1) {
        fa_cp_async_wait<0>();
        __syncthreads(); /* Vn landed; every warp is done with Kn: Kn-1 loads during the PV GEMM */
        const int t = fa_tid_here(), nn = sN[t];
        if (nn > cta->nb_lo) fa2_fwd_load1<T, D, BN, NTHR>(sK, cta->K, cta->k_ss, nn - 1, t);
    }
    fa_warp_gemm_rb<T, MW, DT, NT / 2, LD>(O, Pa, sV + (n & (NST - 1)) * BN * LD, lane);
#pragma unroll
    for (int mi = 0; mi < MW; ++mi)
#pragma unroll
        for (int r = 0; r < 2; ++r) sRowL[(2 * mi + r) * NTHR + tid] = l_keep[mi][r];
}

/* Launch bounds: CTAS CTAs per SM (the table's column; registers per thread <= 65536 / (CTAS · 32·NW)). With the
 * thread count alone, ptxas capped the 64 x 64 tile at 128 registers and spilled 20 B. */
template <typename T, int D, int BM, int BN, int NW, int CTAS, int NST>
__global__ void __launch_bounds__(NW * 32, CTAS) fa_flash2_fwd_kernel(const fa_cuda_params p) {
    constexpr int NTHR = NW * 32, MW = BM / (16 * NW), LD = D + 8, NT = BN / 8, DT = D / 8;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    T *sQ = (T *)fa_smem, *sK = sQ + BM * LD, *sV = sK + NST * BN * LD; /* K and V: NST stages each */
    /* ℓ and m of the rows this thread holds, [MW·2][NTHR] each: private to the thread, no barrier needed */
    float *sRowL = (float *)(sV + NST * BN * LD), *sRowM = sRowL + 2 * MW * NTHR;
    int *sN = (int *)(sRowM + 2 * MW * NTHR); /* [NTHR]: each thread's copy of the loop's block index */
    fa_fwd_cta *cta = (fa_fwd_cta *)(sN + NTHR);

    /* Query blocks last to first: under a causal mask the last blocks see the most keys, so the heaviest CTAs of
     * each (batch, head) start first and the short ones fill the tail of the grid. */
    const int m_block = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
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
        cta->k_ss = p.k_ss, cta->v_ss = p.v_ss;
        cta->sq = s.sq, cta->sk = s.sk, cta->rows = rows, cta->m0 = m0, cta->nb_lo = nb_lo;
        if (NST == 1) cta->nb_first = nb_hi - 1;
        /* Blocks [f_lo, f_hi] need no per-element mask (fa_block_full as a range: the seqlen tail and the causal /
         * right window cap f_hi, the left window raises f_lo); with a positive scale and no softcap they take the
         * hot step. */
        int f_lo = 0, f_hi = -1;
        if (p.scale_log2 > 0.f && p.softcap == 0.f) {
            const int lim = p.wr >= 0 ? min(s.sk, m0 + s.sk - s.sq + p.wr + 1) : s.sk; /* keys < lim: every row sees */
            f_hi = lim >= BN ? lim / BN - 1 : -1;
            const int left = p.wl >= 0 ? m0 + rows - 1 + s.sk - s.sq - p.wl : 0; /* keys >= left: every row sees */
            f_lo = left > 0 ? (left + BN - 1) / BN : 0;
        }
        cta->f_lo = f_lo, cta->f_hi = f_hi;
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
    sN[tid] = nb_hi - 1;

    if (nb_hi > nb_lo) {
        const int64_t r0 = (int64_t)(nb_hi - 1) * BN;
        const int st = (nb_hi - 1) & (NST - 1);
        fa_load_tile<T, BM, D, LD, NTHR>(sQ, Q, p.q_ss, rows, tid);
        fa_load_tile<T, BN, D, LD, NTHR>(sK + st * BN * LD, K + r0 * p.k_ss, p.k_ss, s.sk - (int)r0, tid);
        fa_load_tile<T, BN, D, LD, NTHR>(sV + st * BN * LD, V + r0 * p.v_ss, p.v_ss, s.sk - (int)r0, tid);
        fa_cp_async_commit();
    }
    __syncthreads(); /* *cta visible */
    /* The inner loop, last key block first. The block index lives in the thread's shared slot sN[tid] (re-read
     * after each step's barrier; in a register it was one of the values ptxas spilled in the 3-CTA d = 64 tile).
     * A block takes the hot step unless it needs the general one: the choice is uniform, outside the step's body. */
    for (;;) {
        const int n = sN[fa_tid_here()];
        if (n < cta->nb_lo) break;
        float S[MW][NT][4];
        if (n <= cta->f_hi && n >= cta->f_lo)
            fa2_fwd_step<T, D, BM, BN, NW, NST, false>(O_acc, S, p, cta, sQ, sK, sV, sRowM, sRowL, sN);
        else
            fa2_fwd_step<T, D, BM, BN, NW, NST, true>(O_acc, S, p, cta, sQ, sK, sV, sRowM, sRowL, sN);
        const int t = fa_tid_here();
        sN[t] = sN[t] - 1;
    }

    /* Epilogue: O /= ℓ, LSE = m·scale + ln ℓ (−inf and O = 0 for a row that saw no key). */
    __syncthreads(); /* all warps are done with sQ: it becomes the O staging tile; *cta is visible */
    const int rows_e = cta->rows, wrow = warp * 16 * MW;
    const float kl = p.scale_log2 > 0.f && p.softcap == 0.f ? p.scale_log2 : 1.f;
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

/* Qi, NST stages of Kj and Vj, ℓ and m (8 floats per row of Qi: each lane of the row's quad keeps its own ℓ, m),
 * the per-CTA values. */
template <int D, int BM, int BN, int NW, int NST> static size_t fa2_fwd_smem_bytes() {
    return (size_t)(BM + 2 * NST * BN) * (D + 8) * 2 + (size_t)8 * BM * sizeof(float) + NW * 32 * sizeof(int) +
           sizeof(fa_fwd_cta);
}

template <typename T, int D, int BM, int BN, int NW, int CTAS, int NST>
static cudaError_t fa2_fwd_run(const fa_cuda_params *p, cudaStream_t st) {
    const size_t smem = fa2_fwd_smem_bytes<D, BM, BN, NW, NST>();
    cudaError_t e = cudaFuncSetAttribute(fa_flash2_fwd_kernel<T, D, BM, BN, NW, CTAS, NST>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    dim3 grid((p->sq + BM - 1) / BM, p->hq, p->batch);
    if (grid.x == 0) return cudaSuccess;
    fa_flash2_fwd_kernel<T, D, BM, BN, NW, CTAS, NST><<<grid, NW * 32, smem, st>>>(*p);
    return cudaGetLastError();
}

/* Tile table (Br x Bc, warps, CTAs per SM for the launch bounds); the first row of each head dim is the default,
 * the others are reachable through opts.block_q/block_k for sweeps, and rows that differ only in warps through
 * FA_CUDA_FLASH2_FWD_WARPS (read at context creation: among the rows that match the request, the first with that
 * many warps). Registers from -Xptxas -v, nvcc 13.0, bf16 (f16 alike); no row spills.
 *
 * Defaults as built, H200, bf16, 2026-11-30 fifth session (scripts/gpu-pick.sh, bench/results/h200-2026-11-30-e.md:
 * d=64 from the sixth call, d=128 from the seventh; the other head dims at 4k from the first), TFLOP/s and ratio to
 * PyTorch's flash backend in the same command, seqlen 512 / 1k / 2k / 4k / 8k / 16k:
 *   d=64  non-causal 279.7 / 303.4 / 315.8 / 322.9 / 326.8 / 328.5 = 1.12 / 1.12 / 1.09 / 1.08 / 1.07 / 1.06
 *         causal     180.8 / 229.3 / 262.4 / 287.3 / 303.1 / 313.3 = 1.31 / 1.15 / 1.04 / 1.04 / 1.12 / 1.08
 *   d=128 non-causal 295.7 / 323.5 / 341.9 / 351.3 / 356.7 / 358.7 = 1.04 / 1.02 / 1.05 / 1.01 / 1.00 / 1.02
 *         causal     194.4 / 245.7 / 282.1 / 303.7 / 318.5 / 329.0 = 1.24 / 1.14 / 1.11 / 1.02 / 1.07 / 1.13
 *   4k: d=32 233.3 = 1.06, causal 212.2 = 1.05; d=96 280.8 = 0.86, causal 259.6 = 0.86; d=256 279.6 = 0.87,
 *   causal 241.1 = 0.89. (The sweep below predates the late ℓ store and the row-check-free prefetch, +4-7 %.)
 *
 * The sweep that chose the rows (one device run, 2026-11-30 17:12 UTC, with a sweep build that picked any row
 * through an environment variable, not kept; registers below are the built kernels'), bf16, flashattn bench at the protocol shapes (B·S = 16k, model dim 2048),
 * median of 10, TFLOP/s at seqlen 512 / 4k, non-causal | causal, and the ratio to PyTorch's flash backend (FA2)
 * from the same command:
 *   d=64 : 128 x 64,  4 warps, 3 CTAs/SM: 267.7 / 305.3 | 143.2 / 265.7 = 1.07 / 1.05 | 1.00 / 0.96  <- default
 *             (168 regs: 12 warps/SM instead of 8; it spilled 12 B until the loop's block index, the thread
 *             index and the K/V strides were re-read from shared memory / %tid instead of held in registers —
 *             measured with the spill)
 *          128 x 64,  4 warps, 2 CTAs/SM: 233.9 / 279.2 | 119.3 / 239.1 = 0.94 / 0.96 | 0.84 / 0.87 (not built
 *             now: same tile; 206-210 regs; the default until this round: 1.88 ms at 4k in the first round vs 1.98
 *             for 256 x 64 8w, 2.43 for 128 x 128 8w)
 *          128 x 128, 4 warps (FA2's tile): 252.2 / 291.0 | 115.1 / 250.7 = 1.01 / 1.00 | 0.81 / 0.91 (spills
 *             4-8 B now: not built)
 *          64 x 64,   4 warps, 4 CTAs/SM: 227.9 / 256.2 | 158.5 / 234.9 = 0.91 / 0.88 | 1.11 / 0.85 (119 regs)
 *          256 x 64,  8 warps (210 regs); 128 x 128, 8 warps (186 regs): slower in the first round (above)
 *   d=128: 128 x 64,  4 warps, 2 CTAs/SM: 282.6 / 331.5 | 158.9 / 277.9 = 1.10 / 0.95 | 0.94 / 0.96  <- default
 *             (FA2's H100 tile; 253 regs; 2 row tiles per warp: half the K/V shared-memory reads per MMA of
 *             the 8-warp tile; 2.315 -> 1.611 ms at 4k against 128 x 64 8w when it became the default)
 *          128 x 32,  4 warps: 256.4 / 294.1 | 149.0 / 250.0 = 1.00 / 0.84 | 0.88 / 0.86 (234 regs)
 *          64 x 64,   4 warps: 0.633 / 2.372 / 9.325 ms at 1k / 4k / 16k in the first round (153 regs)
 *          128 x 64,  8 warps: 0.609 / 2.245 / 8.803 ms in the first round (153 regs, FA_CUDA_FLASH2_FWD_WARPS=8)
 *          256 x 64,  8 warps (fourth session, 4k / 16k non-causal, causal; same command as the default's 336.0 /
 *             340.9, 288.7 / 317.4): 319.2 / 326.4, 260.2 / 293.7; the same tile in FA3's ping-pong schedule
 *             (two 4-warp groups alternating GEMM and softmax phases, not kept) 317.2 / 327.6, 260.7 / 295.2
 *   d=96 : 128 x 64,  4 warps, 2 CTAs/SM (FA2's d=96 tile): 287.0 / 257.3 at 4k = 0.91 / 0.94 <- default
 *             (seventh session, scripts/fwd-tiles.sh, 1k / 4k / 16k non-causal | causal: 261.5 / 280.6 / 287.4 |
 *             213.6 / 261.3 / 280.7 = 0.86 / 0.85 / 0.84 | 0.91 / 0.87 / 0.93; after fa_load_tile moved whole
 *             rows per pass at d = 96 (common.cuh), in the next call: 274.2 / 294.6 / 303.4 | 223.9 / 275.6 /
 *             298.1 = 0.90 / 0.87 / 0.88 | 0.95 / 0.91 / 0.98, +5-6 %)
 *   d=32 : 128 x 64,  4 warps: 194.9 / 225.2 |  93.7 / 193.9 = 1.11 / 1.03 | 0.92 / 0.97  <- default (144 regs:
 *             3 CTAs/SM by registers)
 *          128 x 128, 4 warps (FA2's tile): 174.8 / 214.4 | 72.5 / 180.2 = 1.00 / 0.98 | 0.71 / 0.90 (254 regs)
 *   d=256: 64 x 64,   4 warps, single-stage K/V, 2 CTAs/SM  <- default since the seventh session (FA2's H100 tile
 *             and load order; 230 regs, 102 KB shared memory per CTA). scripts/fwd-tiles.sh, best of 2 interleaved
 *             rounds, seqlen 1k / 4k / 16k, non-causal | causal, TFLOP/s and ratio to torch-flash, against the
 *             previous default (next row) in the same command: 265.1 / 287.3 / 290.7 | 212.8 / 253.5 / 297.5 =
 *             0.92 / 0.90 / 0.89 | 0.91 / 0.91 / 1.10, vs 254.3 / 277.6 / 282.8 | 194.8 / 238.4 / 286.0 = 0.88 /
 *             0.87 / 0.87 | 0.83 / 0.86 / 1.06 (+3-9 %); 64 x 32 with two stages (2 CTAs/SM, 208 regs): 0.76-0.92,
 *             not built. Same run, d=96: 64 x 64 4 warps 3 CTAs/SM (152 regs) 0.74-0.82 and 128 x 32 0.78-0.86
 *             against the default's 0.84-0.93: not built.
 *          128 x 64,  8 warps, 1 CTA/SM:  217.4 / 256.0 | 140.2 / 216.5 = 0.91 / 0.83 | 0.83 / 0.84  (the default
 *             until the seventh session; 235 regs, 203 KB shared memory: Q + two K/V stages)
 *          64 x 64,   4 warps with two K/V stages, 1 CTA/SM (169 KB): 172.6 / 202.6 | 126.4 / 188.1 = 0.72 / 0.66 |
 *             0.74 / 0.73 (227 regs, 4 warps/SM; replaced by the single-stage row)
 * Tried and dropped in the same run (not built): computing the next block's S during this block's softmax in one
 * warp ("pipe", a second S in registers, so the MMAs and the exp2/max/sum interleave): d=64 128 x 64 2 CTAs
 * 237.9 / 289.0 | 101.7 / 245.8 (+1-4 % over the same tile without it, slower causal at 512, 255 regs + spill,
 * and no room for 3 CTAs/SM); d=128 128 x 32 256.6 / 326.4 | 134.1 / 271.4 and 64 x 64 224.3 / 280.8 | 153.5 /
 * 258.5 — below the default. */
typedef cudaError_t (*fa2_fwd_fn)(const fa_cuda_params *, cudaStream_t);
typedef struct fa2_fwd_cfg {
    int d, bm, bn, nw, ctas;
    const char *kernel; /* the name fa_stats reports */
    fa2_fwd_fn run_f16, run_bf16;
} fa2_fwd_cfg;
#define FA2_FWD_ROW_S(D, BM, BN, NW, CTAS, NST, SUFFIX)                                                                \
    {D, BM, BN, NW, CTAS, "cuda.flash2.fwd.mma_sync.d" #D "." #BM "x" #BN "w" #NW SUFFIX,                              \
     fa2_fwd_run<__half, D, BM, BN, NW, CTAS, NST>, fa2_fwd_run<__nv_bfloat16, D, BM, BN, NW, CTAS, NST>}
#define FA2_FWD_ROW(D, BM, BN, NW, CTAS) FA2_FWD_ROW_S(D, BM, BN, NW, CTAS, 2, "")
static const fa2_fwd_cfg fa2_fwd_table[] = {
    FA2_FWD_ROW(64, 128, 64, 4, 3),  FA2_FWD_ROW(64, 256, 64, 8, 1), FA2_FWD_ROW(64, 128, 128, 8, 1),
    FA2_FWD_ROW(64, 64, 64, 4, 4),   FA2_FWD_ROW(128, 128, 64, 4, 2), FA2_FWD_ROW(128, 128, 64, 8, 1),
    FA2_FWD_ROW(128, 128, 32, 4, 2), FA2_FWD_ROW(128, 64, 64, 4, 2),  FA2_FWD_ROW(32, 128, 64, 4, 2),
    FA2_FWD_ROW(32, 128, 128, 4, 2), FA2_FWD_ROW_S(256, 64, 64, 4, 2, 1, ".1stage"), FA2_FWD_ROW(256, 128, 64, 8, 1),
    FA2_FWD_ROW(96, 128, 64, 4, 2),  FA2_FWD_ROW(128, 256, 64, 8, 1)};
#undef FA2_FWD_ROW
#undef FA2_FWD_ROW_S

/* The row for head dim d, tile bm x bn (0 = any) and nw warps (0 = any; ignored when no matching row has nw). */
static const fa2_fwd_cfg *fa2_fwd_find(int d, int bm, int bn, int nw) {
    for (int pass = 0; pass < 2; ++pass)
        for (size_t i = 0; i < sizeof fa2_fwd_table / sizeof fa2_fwd_table[0]; ++i) {
            const fa2_fwd_cfg *c = &fa2_fwd_table[i];
            if (c->d == d && (bm == 0 || bm == c->bm) && (bn == 0 || bn == c->bn) &&
                (pass || !nw || nw == c->nw))
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

/* *bm, *bn: in = requested (0 = default), out = used; nw: requested warps (0 = the table's order); *kernel: the
 * name of the row that ran. */
extern "C" cudaError_t fa_flash2_fwd_launch(const fa_cuda_params *p, int dtype, int nw, cudaStream_t st, int *bm, int *bn,
                                            const char **kernel) {
    const fa2_fwd_cfg *c = fa2_fwd_find(p->d, *bm, *bn, nw);
    if (!c) return cudaErrorInvalidValue;
    *bm = c->bm, *bn = c->bn, *kernel = c->kernel;
    return dtype == 1 ? c->run_f16(p, st) : c->run_bf16(p, st);
}
