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
 * while block j computes, one __syncthreads per block (the single-buffered order hid the load latency worse at
 * 2 CTAs per SM; d=256 keeps it to fit 2 CTAs). Query blocks run last to first, so under a causal mask the
 * longest CTAs of each head start first. Q and K rows are D wide, V and O rows DV (D but for the rows of a pair,
 * MLA's 192 / 128). Tiles: tiles.h; measurements: docs/cuda-kernels.md. */
#include "common.cuh"
#include "cuda/attr_once.h"
#include "core/sink.h"
#include "tiles.h"

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
 * first (the last key block, the only one the seqlen tail can cut) is whole: the loader checks no row. Issued at
 * the top of the step, after the barrier, not after the QKᵀ GEMM (FA2's place): the loads then have a whole step to
 * land (docs/cuda-kernels.md). */
template <typename T, int D, int DV, int BN, int NTHR>
FA_DEV void fa2_fwd_prefetch(const fa_fwd_cta *cta, T *sK, T *sV, const int *sN) {
    constexpr int LD = D + 8, LDV = DV + 8;
    const int tid = fa_tid_here(), n = sN[tid];
    if (n > cta->nb_lo) { /* a whole step to land */
        const int64_t kss = cta->k_ss, vss = cta->v_ss, r0 = (int64_t)(n - 1) * BN;
        T *sK1 = sK + ((n - 1) & 1) * BN * LD, *sV1 = sV + ((n - 1) & 1) * BN * LDV;
        fa_load_tile<T, BN, D, LD, NTHR, true>(sK1, (const T *)cta->K + r0 * kss, kss, BN, tid);
        fa_load_tile<T, BN, DV, LDV, NTHR, true>(sV1, (const T *)cta->V + r0 * vss, vss, BN, tid);
        fa_cp_async_commit();
    }
}

/* Single-stage tiles (NST = 1: one K and one V buffer, FA2's own order, so that d = 256's 64 x 64 tile fits two
 * CTAs per SM): key block r of matrix X (K or V: rows of D or DV) -> buf, whole rows, one commit group. */
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
template <typename T, int D, int DV, int BM, int BN, int NW, int NST, bool GEN>
FA_DEV void fa2_fwd_step(float (&O)[BM / (16 * NW)][DV / 8][4], float (&S)[BM / (16 * NW)][BN / 8][4],
                         const fa_cuda_params &p, const fa_fwd_cta *cta, const T *sQ, T *sK, T *sV, float *sRowM,
                         float *sRowL, const int *sN) {
    constexpr int NTHR = NW * 32, MW = BM / (16 * NW), LD = D + 8, LDV = DV + 8, NT = BN / 8, DT = DV / 8;
    fa_cp_async_wait<0>();
    __syncthreads(); /* Kn, Vn (and Qi, *cta) landed; every warp is done with the other stage */
    if constexpr (NST == 2) {
        fa2_fwd_prefetch<T, D, DV, BN, NTHR>(cta, sK, sV, sN);
    } else { /* Kn landed, every warp is done with Vn+1: Vn loads during the QKᵀ GEMM and the softmax */
        const int t = fa_tid_here(), n = sN[t];
        if (n != cta->nb_first) fa2_fwd_load1<T, DV, BN, NTHR>(sV, cta->V, cta->v_ss, n, t);
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
        /* query i sees keys [jlo, jhi] (fa_row_keys): two compares per score */
        const int sq = cta->sq, sk = cta->sk;
#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                int jlo, jhi;
                fa_row_keys(p, cta->m0 + wrow + mi * 16 + (lane >> 2) + r * 8, sq, sk, &jlo, &jhi);
                const int j0 = n * BN + (lane & 3) * 2;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int j = j0 + nt * 8 + c;
                        if (j < jlo || j > jhi) S[mi][nt][2 * r + c] = -INFINITY;
                    }
            }
        if (p.chunk > 0) /* attention_chunk: a pass of its own, after the window's bounds are dead (registers) */
#pragma unroll
            for (int mi = 0; mi < MW; ++mi)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int c0 = fa_row_chunk(p, cta->m0 + wrow + mi * 16 + (lane >> 2) + r * 8, sq, sk);
                    const int j0 = n * BN + (lane & 3) * 2;
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                        for (int c = 0; c < 2; ++c)
                            if ((unsigned)(j0 + nt * 8 + c - c0) >= (unsigned)p.chunk) S[mi][nt][2 * r + c] = -INFINITY;
                }
    }

    /* Online softmax: m_new = max(m, rowmax S); rescale ℓ and O by exp2((m − m_new)·kl). The new ℓ stays in
     * registers until the PV GEMM is issued: ptxas does not move an ldmatrix of V above a shared store it cannot
     * prove disjoint, so an ℓ store here would hold the PV GEMM behind the whole softmax. m is stored here: keeping
     * it too spills the 3-CTA d=64 tile. */
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
    fa_warp_gemm_rb<T, MW, DT, NT / 2, LDV>(O, Pa, sV + (n & (NST - 1)) * BN * LDV, lane);
#pragma unroll
    for (int mi = 0; mi < MW; ++mi)
#pragma unroll
        for (int r = 0; r < 2; ++r) sRowL[(2 * mi + r) * NTHR + tid] = l_keep[mi][r];
}

/* The CTA's shared memory: Qi (the O staging tile of the epilogue too), NST stages of Kj and Vj (rows padded to
 * D + 8, DV + 8), ℓ and m of the rows each thread holds ([MW·2][NTHR] each: private to the thread, no barrier
 * needed), each thread's copy of the loop's block index, the per-CTA values. The launch's dynamic shared memory is
 * its sizeof. */
template <int D, int DV, int BM, int BN, int NW, int NST> struct fa2_fwd_smem {
    static constexpr int NTHR = NW * 32, MW = BM / (16 * NW), LD = D + 8, LDV = DV + 8;
    uint16_t Q[BM * (LD > LDV ? LD : LDV)], K[NST * BN * LD], V[NST * BN * LDV]; /* 16-bit elements (T) */
    float row_l[2 * MW * NTHR], row_m[2 * MW * NTHR];
    int n[NTHR];
    fa_fwd_cta cta;
};

/* Launch bounds: CTAS CTAs per SM (the table's column; registers per thread <= 65536 / (CTAS · 32·NW)). With the
 * thread count alone, ptxas capped the 64 x 64 tile at 128 registers and spilled 20 B. */
template <typename T, int D, int DV, int BM, int BN, int NW, int CTAS, int NST>
__global__ void __launch_bounds__(NW * 32, CTAS) fa_flash2_fwd_kernel(const fa_cuda_params p) {
    constexpr int NTHR = NW * 32, MW = BM / (16 * NW), LD = D + 8, LDV = DV + 8, NT = BN / 8, DT = DV / 8;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    fa2_fwd_smem<D, DV, BM, BN, NW, NST> &sm = *(fa2_fwd_smem<D, DV, BM, BN, NW, NST> *)fa_smem;
    T *sQ = (T *)sm.Q, *sK = (T *)sm.K, *sV = (T *)sm.V;
    float *sRowL = sm.row_l, *sRowM = sm.row_m;
    int *sN = sm.n;
    fa_fwd_cta *cta = &sm.cta;

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
            int left = p.wl >= 0 ? m0 + rows - 1 + s.sk - s.sq - p.wl : 0; /* keys >= left: every row sees */
            if (p.chunk > 0) { /* keys of the first row's chunk from the last row's chunk start on */
                const int c0 = fa_chunk_start32(m0 + s.sk - s.sq, p.chunk);
                const int c1 = fa_chunk_start32(m0 + rows - 1 + s.sk - s.sq, p.chunk);
                const int lim2 = min(lim, c0 + p.chunk);
                f_hi = lim2 >= BN ? lim2 / BN - 1 : -1;
                left = max(left, c1);
            }
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
        fa_load_tile<T, BN, DV, LDV, NTHR>(sV + st * BN * LDV, V + r0 * p.v_ss, p.v_ss, s.sk - (int)r0, tid);
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
            fa2_fwd_step<T, D, DV, BM, BN, NW, NST, false>(O_acc, S, p, cta, sQ, sK, sV, sRowM, sRowL, sN);
        else
            fa2_fwd_step<T, D, DV, BM, BN, NW, NST, true>(O_acc, S, p, cta, sQ, sK, sV, sRowM, sRowL, sN);
        const int t = fa_tid_here();
        sN[t] = sN[t] - 1;
    }

    /* Epilogue: O /= ℓ, LSE = m·scale + ln ℓ (−inf and O = 0 for a row that saw no key); with sinks the join
     * folds in here (core/sink.h): O ·= 1 / (1 + e^(sink − LSE)), LSE = log(e^LSE + e^sink). */
    __syncthreads(); /* all warps are done with sQ: it becomes the O staging tile; *cta is visible */
    const int rows_e = cta->rows, wrow = warp * 16 * MW;
    const float kl = p.scale_log2 > 0.f && p.softcap == 0.f ? p.scale_log2 : 1.f;
#pragma unroll
    for (int mi = 0; mi < MW; ++mi)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float l = fa_quad_sum(sRowL[(2 * mi + r) * NTHR + tid]);
            float inv = l > 0.f ? fa_rcp_normal(l) : 0.f; /* l > 0 is about 1 or more: the row max adds 2^(~0) */
            float lse = l > 0.f ? sRowM[(2 * mi + r) * NTHR + tid] * kl * FA_LN2 + logf(l) : -INFINITY;
            if (p.sinks) inv *= fa_sink_join_lse_f32(lse, p.sinks[blockIdx.y], &lse); /* uniform branch */
            const int row = wrow + mi * 16 + (lane >> 2) + r * 8;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) /* O's rows staged DV + 8 apart */
                *(uint32_t *)(sQ + row * LDV + dt * 8 + (lane & 3) * 2) =
                    fa_pack2<T>(O_acc[mi][dt][2 * r] * inv, O_acc[mi][dt][2 * r + 1] * inv);
            if (p.lse && (lane & 3) == 0 && row < rows_e) p.lse[cta->lse0 + row] = lse;
        }
    __syncthreads();
    fa_store_tile<T, BM, DV, LDV, NTHR>((T *)cta->O, p.o_ss, sQ, rows_e, tid);
}

template <typename T, int R> static cudaError_t fa2_fwd_run(const fa_cuda_params *p, const fa_plan *plan, cudaStream_t st) {
    constexpr fa_f2_fwd_row r = fa_f2_fwd_rows[R];
    const auto kernel = fa_flash2_fwd_kernel<T, r.d, r.dv, r.bm, r.bn, r.nw, r.ctas, r.nst>;
    static unsigned char ready[64];
    cudaError_t e =
        fa_cuda_attr_once(ready, (const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)plan->smem_bytes);
    if (e != cudaSuccess) return e;
    if (plan->grid[0] == 0) return cudaSuccess;
    kernel<<<dim3(plan->grid[0], plan->grid[1], plan->grid[2]), plan->threads, plan->smem_bytes, st>>>(*p);
    return cudaGetLastError();
}
template <int R> static int fa2_fwd_inst(fa_cuda_instance *k) {
    constexpr fa_f2_fwd_row r = fa_f2_fwd_rows[R];
    k->f16 = fa2_fwd_run<__half, R>, k->bf16 = fa2_fwd_run<__nv_bfloat16, R>;
    k->smem = sizeof(fa2_fwd_smem<r.d, r.dv, r.bm, r.bn, r.nw, r.nst>);
    return 1;
}
static_assert(sizeof fa_f2_fwd_rows / sizeof fa_f2_fwd_rows[0] == 15, "one case per row of fa_f2_fwd_rows");
extern "C" int fa_flash2_fwd_instance(int row, fa_cuda_instance *k) {
    switch (row) {
    case 0: return fa2_fwd_inst<0>(k);
    case 1: return fa2_fwd_inst<1>(k);
    case 2: return fa2_fwd_inst<2>(k);
    case 3: return fa2_fwd_inst<3>(k);
    case 4: return fa2_fwd_inst<4>(k);
    case 5: return fa2_fwd_inst<5>(k);
    case 6: return fa2_fwd_inst<6>(k);
    case 7: return fa2_fwd_inst<7>(k);
    case 8: return fa2_fwd_inst<8>(k);
    case 9: return fa2_fwd_inst<9>(k);
    case 10: return fa2_fwd_inst<10>(k);
    case 11: return fa2_fwd_inst<11>(k);
    case 12: return fa2_fwd_inst<12>(k);
    case 13: return fa2_fwd_inst<13>(k);
    case 14: return fa2_fwd_inst<14>(k);
    default: return 0;
    }
}

extern "C" cudaError_t fa_flash2_fwd_launch(const fa_cuda_params *p, const fa_plan *plan, int dtype, cudaStream_t st) {
    fa_cuda_instance k;
    if (!fa_flash2_fwd_instance(plan->entry, &k)) return cudaErrorInvalidValue;
    return (dtype == 1 ? k.f16 : k.bf16)(p, plan, st);
}
