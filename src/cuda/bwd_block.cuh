/* The backward work of one K/V block (Kj, Vj), shared by FLASH2 (one CTA per block: the grid is the outer loop)
 * and FLASH1 (one CTA per (batch, head) looping over the blocks, as V1 did).
 *
 * NW warps split the Bc keys of the block ("split-K" rows of Sᵀ): warp w owns keys 16·MW·w ... and keeps dKj, dVj
 * for them in registers for the whole inner loop over query blocks Qi (FA2p Algorithm 2):
 *   Sᵀ = Kj Qiᵀ; dPᵀ = Vj dOiᵀ;  P = exp2(S·scale·log2e − LSE·log2e);  dS = P ∘ (dP − Di)  [∘ (1 − tanh²) with softcap]
 *   dVj += Pᵀ dOi;  dKj += dSᵀ Qi         (Pᵀ and dSᵀ feed the MMAs straight from the registers of Sᵀ, dPᵀ)
 *   dQi += dS Kj   through dSᵀ in shared memory; fp32 atomics (FLASH2), a plain read-modify-write (FLASH1: this
 *                  CTA is the only writer of its head's dQ), or not at all (FLASH2 deterministic: a second kernel
 *                  computes dQ by rows).
 * Qi and dOi are double-buffered with cp.async: block i+1 loads while block i computes. */
#ifndef FA_CUDA_BWD_BLOCK_CUH
#define FA_CUDA_BWD_BLOCK_CUH

#include "common.cuh"

enum { FA_DQ_ATOMIC = 0, FA_DQ_NONE = 1, FA_DQ_RMW = 2 };

/* Where the epilogue writes dKj, dVj: computed before the loop over Qi by thread 0 and parked in shared memory, so
 * that no register carries it (or what it is derived from) across the loop. ptxas kept such values (a 64-bit
 * offset's high word, the row count, the varlen flag) in local memory: 4–20 B of spill in the 255-register
 * kernels. */
struct fa_bwd_out {
    void *dk, *dv; /* row n0 of dK, dV (16-bit, group == 1) or of the fp32 per-query-head dK, dV (GQA) */
    int rows;      /* valid key rows of the block */
};

template <int D, int BM, int BN> FA_DEV constexpr size_t fa_bwd_smem_bytes() {
    return (size_t)(2 * BN * (D + 8) + 4 * BM * (D + 8) + BN * (BM + 8)) * 2 + 4 * BM * sizeof(float) +
           sizeof(fa_bwd_out);
}

/* Row statistics of query block m into shared memory: LSE·log2e (+inf for rows past the end or that saw no key,
 * so that P = 0 there) and D. */
template <int BM>
FA_DEV void fa_bwd_load_stats(const fa_cuda_params &p, const fa_seq &s, int m, float *sL, float *sD, int tid) {
    if (tid < BM) {
        int row = m * BM + tid;
        float L = INFINITY, Dv = 0.f;
        if (row < s.sq) {
            float l = p.lse[s.stat0 + row];
            L = l == -INFINITY ? INFINITY : l * FA_LOG2E;
            Dv = p.dsum[s.stat0 + row];
        }
        sL[tid] = L;
        sD[tid] = Dv;
    }
}

template <typename T, int D, int BM, int BN, int NW, int DQ_MODE>
FA_DEV void fa_bwd_kv_block(const fa_cuda_params &p, const fa_seq &s, int b, int h, int n_block, unsigned char *smem) {
    constexpr int NTHR = NW * 32, MW = BN / (16 * NW), LD = D + 8, LDS = BM + 8, QT = BM / 8, DT = D / 8;
    T *sK = (T *)smem, *sV = sK + BN * LD, *sQ = sV + BN * LD, *sdO = sQ + 2 * BM * LD, *sdS = sdO + 2 * BM * LD;
    float *sL = (float *)(sdS + BN * LDS), *sD = sL + 2 * BM;
    fa_bwd_out *sOut = (fa_bwd_out *)(sD + 2 * BM); /* 8-byte aligned: every region above is a multiple of 16 B */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n0 = n_block * BN, kv_rows = min(BN, s.sk - n0), hk = h / p.group;
    const T *Kj = (const T *)p.k + fa_off(p, p.k_sb, p.k_ss, p.k_sh, b, s.krow, hk) + (int64_t)n0 * p.k_ss;
    const T *Vj = (const T *)p.v + fa_off(p, p.v_sb, p.v_ss, p.v_sh, b, s.krow, hk) + (int64_t)n0 * p.v_ss;
    const T *Q = (const T *)p.q + fa_off(p, p.q_sb, p.q_ss, p.q_sh, b, s.qrow, h);
    const T *dO = (const T *)p.dout + fa_off(p, p.do_sb, p.do_ss, p.do_sh, b, s.qrow, h);

    int qlo, qhi;
    fa_query_span(p, n0, n0 + kv_rows, s.sq, s.sk, &qlo, &qhi);
    const int mb_lo = qlo / BM, mb_hi = qhi > qlo ? (qhi + BM - 1) / BM : mb_lo;
    if (tid == 0) { /* read after the epilogue's first __syncthreads */
        if (p.group == 1) {
            sOut->dk = (T *)p.dk + fa_off(p, p.dk_sb, p.dk_ss, p.dk_sh, b, s.krow, hk) + (int64_t)n0 * p.dk_ss;
            sOut->dv = (T *)p.dv + fa_off(p, p.dv_sb, p.dv_ss, p.dv_sh, b, s.krow, hk) + (int64_t)n0 * p.dv_ss;
        } else {
            const int64_t k0 = p.cu_k ? (int64_t)h * p.total_k + s.krow : ((int64_t)b * p.hq + h) * p.total_k;
            sOut->dk = p.dk_acc + (k0 + n0) * D;
            sOut->dv = p.dv_acc + (k0 + n0) * D;
        }
        sOut->rows = kv_rows;
    }

    float dK[MW][DT][4], dV[MW][DT][4];
#pragma unroll
    for (int mi = 0; mi < MW; ++mi)
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) dK[mi][dt][e] = dV[mi][dt][e] = 0.f;
    const int wkey = warp * 16 * MW;
    const float sl2 = p.scale_log2;

    if (mb_hi > mb_lo) {
        fa_load_tile<T, BN, D, LD, NTHR>(sK, Kj, p.k_ss, kv_rows, tid);
        fa_load_tile<T, BN, D, LD, NTHR>(sV, Vj, p.v_ss, kv_rows, tid);
        fa_load_tile<T, BM, D, LD, NTHR>(sQ, Q + (int64_t)mb_lo * BM * p.q_ss, p.q_ss, s.sq - mb_lo * BM, tid);
        fa_load_tile<T, BM, D, LD, NTHR>(sdO, dO + (int64_t)mb_lo * BM * p.do_ss, p.do_ss, s.sq - mb_lo * BM, tid);
        fa_cp_async_commit();
        fa_bwd_load_stats<BM>(p, s, mb_lo, sL, sD, tid);
    }
    for (int m = mb_lo; m < mb_hi; ++m) {
        const int buf = (m - mb_lo) & 1, m0 = m * BM;
        T *sQb = sQ + buf * BM * LD, *sdOb = sdO + buf * BM * LD;
        const float *sLb = sL + buf * BM, *sDb = sD + buf * BM;
        fa_cp_async_wait<0>();
        __syncthreads(); /* Qi, dOi, stats landed; every warp is done with block i-1 (its buffers, sdS) */
        if (m + 1 < mb_hi) {
            const int nb = buf ^ 1, m1 = m0 + BM;
            fa_load_tile<T, BM, D, LD, NTHR>(sQ + nb * BM * LD, Q + (int64_t)m1 * p.q_ss, p.q_ss, s.sq - m1, tid);
            fa_load_tile<T, BM, D, LD, NTHR>(sdO + nb * BM * LD, dO + (int64_t)m1 * p.do_ss, p.do_ss, s.sq - m1, tid);
            fa_cp_async_commit();
            fa_bwd_load_stats<BM>(p, s, m + 1, sL + nb * BM, sD + nb * BM, tid);
        }

        /* Sᵀ = Kj Qiᵀ, dPᵀ = Vj dOiᵀ (this warp's keys x all BM queries) */
        float St[MW][QT][4], dPt[MW][QT][4];
#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int nt = 0; nt < QT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) St[mi][nt][e] = dPt[mi][nt][e] = 0.f;
        fa_warp_gemm_abt<T, MW, QT, D, LD, LD>(St, sK + wkey * LD, sQb, lane);
        fa_warp_gemm_abt<T, MW, QT, D, LD, LD>(dPt, sV + wkey * LD, sdOb, lane);

        /* P = exp2(S·scale·log2e − LSE·log2e), dS = P ∘ (dP − D), element by element (key row, query col). */
        const bool full = fa_block_full(p, m0, m0 + BM, n0, n0 + BN, s.sq, s.sk);
#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int nt = 0; nt < QT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int qc = nt * 8 + (lane & 3) * 2 + (e & 1);
                    float sv = St[mi][nt][e], pv, dcap = 1.f;
                    if (p.softcap > 0.f) { /* sv = c·t, t = tanh(s·scale/c); d sv / d s = scale·(1 − t²) */
                        const float t = tanhf(sv * p.softcap_scale);
                        sv = p.softcap * t;
                        dcap = 1.f - t * t;
                    }
                    const int j = n0 + wkey + mi * 16 + (lane >> 2) + (e >> 1) * 8;
                    if (!full && !fa_visible(p, m0 + qc, j, s.sq, s.sk))
                        pv = 0.f;
                    else
                        pv = fa_exp2(fmaf(sv, sl2, -sLb[qc]));
                    float ds = pv * (dPt[mi][nt][e] - sDb[qc]);
                    if (p.softcap > 0.f) ds *= dcap; /* t itself, not (c·t)/c: no division in the loop */
                    St[mi][nt][e] = pv;
                    dPt[mi][nt][e] = ds;
                }
        uint32_t Pa[MW][QT / 2][4], dSa[MW][QT / 2][4];
        fa_acc_to_a<T, MW, QT / 2>(Pa, St);
        fa_acc_to_a<T, MW, QT / 2>(dSa, dPt);
        /* dVj += Pᵀ dOi; dKj += dSᵀ Qi */
        fa_warp_gemm_rb<T, MW, DT, QT / 2, LD>(dV, Pa, sdOb, lane);
        fa_warp_gemm_rb<T, MW, DT, QT / 2, LD>(dK, dSa, sQb, lane);

        if (DQ_MODE != FA_DQ_NONE) {
            /* dSᵀ -> shared memory (rows = keys), then dQi += dS Kj split over the warps by (rows, cols) of dQi. */
#pragma unroll
            for (int mi = 0; mi < MW; ++mi)
#pragma unroll
                for (int kt = 0; kt < QT / 2; ++kt) {
                    const int r = wkey + mi * 16 + (lane >> 2), c = kt * 16 + (lane & 3) * 2;
                    *(uint32_t *)(sdS + r * LDS + c) = dSa[mi][kt][0];
                    *(uint32_t *)(sdS + (r + 8) * LDS + c) = dSa[mi][kt][1];
                    *(uint32_t *)(sdS + r * LDS + c + 8) = dSa[mi][kt][2];
                    *(uint32_t *)(sdS + (r + 8) * LDS + c + 8) = dSa[mi][kt][3];
                }
            __syncthreads();
            constexpr int WM = (BM / 16 < NW) ? BM / 16 : NW, MQ = BM / 16 / WM, WN = NW / WM, NQ = DT / WN;
            const int wm = warp % WM, wn = warp / WM;
            float dQp[MQ][NQ][4];
#pragma unroll
            for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
                for (int nt = 0; nt < NQ; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) dQp[mi][nt][e] = 0.f;
            fa_warp_gemm_atb<T, MQ, NQ, BN, LDS, LD>(dQp, sdS + wm * MQ * 16, sK + wn * NQ * 8, lane);
#pragma unroll
            for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int row = m0 + (wm * MQ + mi) * 16 + (lane >> 2) + r * 8;
                    if (row >= s.sq) continue;
                    float *dst = p.dq_acc + (s.stat0 + row) * D + wn * NQ * 8 + (lane & 3) * 2;
#pragma unroll
                    for (int nt = 0; nt < NQ; ++nt) {
                        float2 v = make_float2(dQp[mi][nt][2 * r], dQp[mi][nt][2 * r + 1]);
                        if (DQ_MODE == FA_DQ_ATOMIC) {
                            atomicAdd((float2 *)(dst + nt * 8), v);
                        } else {
                            float2 *q2 = (float2 *)(dst + nt * 8), o = *q2;
                            *q2 = make_float2(o.x + v.x, o.y + v.y);
                        }
                    }
                }
        }
    }

    /* Epilogue: dKj *= scale; write dKj, dVj (16-bit through shared memory, or fp32 per query head for GQA). */
    __syncthreads();
    void *const dk_out = sOut->dk, *const dv_out = sOut->dv;
    const int rows_e = sOut->rows;
    if (p.group == 1) {
#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = wkey + mi * 16 + (lane >> 2) + r * 8;
#pragma unroll
                for (int dt = 0; dt < DT; ++dt) {
                    const int c = dt * 8 + (lane & 3) * 2;
                    *(uint32_t *)(sK + row * LD + c) = fa_pack2<T>(dK[mi][dt][2 * r] * p.scale, dK[mi][dt][2 * r + 1] * p.scale);
                    *(uint32_t *)(sV + row * LD + c) = fa_pack2<T>(dV[mi][dt][2 * r], dV[mi][dt][2 * r + 1]);
                }
            }
        __syncthreads();
        fa_store_tile<T, BN, D, LD, NTHR>((T *)dk_out, p.dk_ss, sK, rows_e, tid);
        fa_store_tile<T, BN, D, LD, NTHR>((T *)dv_out, p.dv_ss, sV, rows_e, tid);
    } else {
#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = wkey + mi * 16 + (lane >> 2) + r * 8;
                if (row >= rows_e) continue;
                float *dk = (float *)dk_out + (int64_t)row * D, *dv = (float *)dv_out + (int64_t)row * D;
#pragma unroll
                for (int dt = 0; dt < DT; ++dt) {
                    const int c = dt * 8 + (lane & 3) * 2;
                    *(float2 *)(dk + c) = make_float2(dK[mi][dt][2 * r] * p.scale, dK[mi][dt][2 * r + 1] * p.scale);
                    *(float2 *)(dv + c) = make_float2(dV[mi][dt][2 * r], dV[mi][dt][2 * r + 1]);
                }
            }
    }
    __syncthreads(); /* FLASH1 reuses sK, sV and sOut for the next block */
}

#endif
