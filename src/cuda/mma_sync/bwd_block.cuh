/* The backward work of one K/V block (Kj, Vj), shared by FLASH2 (one CTA per block: the grid is the outer loop)
 * and FLASH1 (one CTA per (batch, head) looping over the blocks, as V1 did). FA2p Algorithm 2, per query block Qi:
 *   Sᵀ = Kj Qiᵀ;  dPᵀ = Vj dOiᵀ;  P = exp2(S·scale·log2e − LSE·log2e);  dS = P ∘ (dP − Di)  [∘ (1 − tanh²) softcap]
 *   dVj += Pᵀ dOi;  dKj += dSᵀ Qi        (dKj, dVj stay in registers for the whole loop over Qi)
 *   dQi += dS Kj   FLASH2: staged in shared memory (fp32) and added into the fp32 dQ accumulator by the TMA engine
 *                  (cp.reduce.async.bulk .add.f32, one per row, issued after the next step's first barrier);
 *                  FLASH1: a plain read-modify-write (this CTA is the only writer of its head's dQ);
 *                  FLASH2 deterministic: not here (a second kernel computes dQ by rows).
 * Qi and dOi are double-buffered with cp.async: block i+1 loads while block i computes.
 *
 * The 8 warps tile each of the three GEMM families in two dimensions (FA2's AtomLayoutMSdP / NdKV / MdQ), so that
 * no warp reads a whole operand tile it does not need from shared memory:
 *   Sᵀ, dPᵀ (Bc x Br):    WK_S warps along the keys  x 8/WK_S  along the queries;
 *   dKj, dVj (Bc x d):    WK_KV warps along the keys x 8/WK_KV along d;
 *   dQi (Br x d):         WQ_DQ warps along queries  x 8/WQ_DQ along d.
 * V, dO and dV rows are DV wide (d but for a pair of head dims, MLA's (192, 128)): dPᵀ = Vj dOiᵀ sums over DV
 * and the dV GEMM's warps split DV as the dK GEMM's split d.
 * P and dS (16-bit, rows = keys) go through shared memory between the first GEMMs and the others: one more
 * __syncthreads per step, for half the B-operand reads of a one-dimensional split. Tiles: tiles.h; measurements:
 * docs/cuda-kernels.md. */
#ifndef FA_CUDA_BWD_BLOCK_CUH
#define FA_CUDA_BWD_BLOCK_CUH

#include "common.cuh"
#include "tiles.h"

#include <type_traits>

/* How dQi reaches the fp32 accumulator: bulk reduce-add from a shared staging tile (FLASH2: the TMA engine adds in
 * L2, where per-lane atomics would share the LSU/MIO queue with the next GEMMs' ldmatrix traffic), read-modify-write
 * (FLASH1), or not at all (FLASH2 deterministic, whose dQ kernel recomputes it). */
enum { FA_DQ_REDUCE = 0, FA_DQ_NONE = 1, FA_DQ_RMW = 2 };

/* Br x Bc = BM x BN, 8 warps, the warp grid of each GEMM (see above), and the order of the first half-step. */
template <int D_, int BM_, int BN_, int WK_S_, int WK_KV_, int WQ_DQ_, bool P_SPLIT_, int QSTAGES_ = 2,
          bool Q_LATE_ = false, int DV_ = D_>
struct fa_bwd_cfg {
    static constexpr int D = D_, DV = DV_, BM = BM_, BN = BN_, NW = 8, WK_S = WK_S_, WK_KV = WK_KV_, WQ_DQ = WQ_DQ_;
    static constexpr bool P_SPLIT = P_SPLIT_; /* hot blocks: P between the dPᵀ GEMM's k-steps (fa_bwd_split_step) */
    /* with two buffers, where Qi+1, dOi+1 are issued: after the step's first barrier (false: a whole step to land)
     * or after its second (true: the dK/dV/dQ GEMMs to land; the cp.async issue is off the Sᵀ GEMM's start) */
    static constexpr bool Q_LATE = Q_LATE_;
    /* Qi, dOi buffers: 2 = block i+1 loads during all of block i; 1 (d = 256, shared memory): block i+1 loads
     * during block i's dQ GEMM, after a barrier that ends every warp's reads of Qi and dOi */
    static constexpr int QSTAGES = QSTAGES_;
    static constexpr int LD = D + 8, LDV = DV + 8, LDP = BM + 8; /* padded rows: conflict-free ldmatrix (common.cuh) */
    static constexpr int LQ = D + 8; /* FLASH2's fp32 dQ staging rows: conflict-free float2 stores (see below) */
    static constexpr int SK = BN / WK_S, SQ = BM / (NW / WK_S);     /* a warp's Sᵀ tile: SK keys x SQ queries */
    static constexpr int KK = BN / WK_KV, KD = D / (NW / WK_KV);    /* a warp's dK/dV tile: KK keys x KD cols */
    static constexpr int KDV = DV / (NW / WK_KV);                   /* ... of dV: KK keys x KDV cols */
    static constexpr int QQ = BM / WQ_DQ, QD = D / (NW / WQ_DQ);    /* a warp's dQ tile: QQ queries x QD cols */
    static_assert(SK % 16 == 0 && SQ % 16 == 0 && KK % 16 == 0 && KD % 16 == 0 && KDV % 16 == 0 && QQ % 16 == 0 &&
                      QD % 16 == 0,
                  "every warp tile must be whole 16 x 16 MMA tiles");
};

/* The configuration of row R of fa_bwd_rows (tiles.h). */
template <int R>
struct fa_bwd_row_cfg
    : fa_bwd_cfg<fa_bwd_rows[R].d, fa_bwd_rows[R].bm, fa_bwd_rows[R].bn, fa_bwd_rows[R].wk_s, fa_bwd_rows[R].wk_kv,
                 fa_bwd_rows[R].wq_dq, fa_bwd_rows[R].p_split != 0, fa_bwd_rows[R].qstages, fa_bwd_rows[R].q_late != 0,
                 fa_bwd_rows[R].dv> {};

/* The block's addresses, computed before the loop over Qi by thread 0 and parked in shared memory: read where
 * they are used, so that no register carries them (or what they are derived from) across the loop. Kept in
 * registers, ptxas spilled such values (64-bit row offsets, the row count, the varlen flag) to local memory in the
 * 255-register kernels. */
struct fa_bwd_addr {
    const void *q, *dout;     /* row 0 of (b, h) in Q, dO */
    float *dq;                /* row 0 of (b, h) in the fp32 dQ accumulator */
    const float *lse2, *dsum; /* row 0 of (b, h) in the row statistics */
    void *dk, *dv; /* row n0 of dK, dV (16-bit, group == 1), of the fp32 per-query-head dK, dV (GQA), or of a
                    * split block's fp32 partial sums (FLASH2's last wave) */
    int rows;      /* valid key rows of the block */
};

/* The CTA's shared memory: K, V; Q, dO (QSTAGES buffers); Pᵀ, dSᵀ; LSE·log2e and D double-buffered; the block's
 * addresses; for FLASH2, the fp32 dQ staging tile (rows of LQ = D + 8 floats, 8 banks apart, so that the float2
 * stores of a half-warp — 4 rows x 8 floats — hit 32 distinct banks; 16-byte aligned for the bulk reduce). The launch's dynamic shared memory is its sizeof. */
template <class C> struct fa_bwd_smem_base {
    uint16_t K[C::BN * C::LD], V[C::BN * C::LDV]; /* 16-bit elements (T) */
    uint16_t Q[C::QSTAGES * C::BM * C::LD], dO[C::QSTAGES * C::BM * C::LDV];
    uint16_t P[C::BN * C::LDP], dS[C::BN * C::LDP];
    float L[2 * C::BM], D[2 * C::BM];
    fa_bwd_addr addr;
};
template <class C, int DQ_MODE> struct fa_bwd_smem : fa_bwd_smem_base<C> {};
template <class C> struct fa_bwd_smem<C, FA_DQ_REDUCE> : fa_bwd_smem_base<C> {
    alignas(16) float dQ[C::BM * C::LQ];
};
static_assert(sizeof(fa_bwd_addr) % 16 == 0, "the staging tile follows addr, 16-byte aligned");
/* &dQ of fa_bwd_smem<C, FA_DQ_REDUCE>, derived at run time from the end of addr (the same address: every part of
 * the base is a multiple of 16 bytes): from the struct's constant offset, ptxas allocated the 255-register
 * kernels' loop differently (other SASS). */
template <class C, int DQ_MODE> FA_DEV float *fa_bwd_staging(fa_bwd_smem_base<C> &sm) {
    static_assert(DQ_MODE != FA_DQ_REDUCE ||
                      sizeof(fa_bwd_smem<C, FA_DQ_REDUCE>) == sizeof(sm) + C::BM * C::LQ * sizeof(float),
                  "dQ right after the base");
    return DQ_MODE == FA_DQ_REDUCE ? (float *)(((uintptr_t)(&sm.addr + 1) + 15) & ~(uintptr_t)15) : nullptr;
}

/* Row statistics of query block m -> shared memory with cp.async (part of the caller's commit group): LSE·log2e
 * (+inf for a row that saw no key, so that P = 0 there; written by the D pre-pass) and D. Rows past the end are
 * zero-filled: their Q and dO rows are zero-filled too, so P = 1, dP = 0, dS = 0 and nothing reaches dK, dV or dQ.
 * Asynchronous: a plain load would stall the loading warps before their first MMA of every step. */
template <int BM>
FA_DEV void fa_bwd_copy_stats(const fa_bwd_addr *a, int sq, int m, float *sL, float *sD, int tid) {
    const int i = tid % BM, row = m * BM + i;
    const float *src = (tid < BM ? a->lse2 : a->dsum) + (row < sq ? row : 0);
    if (tid < 2 * BM) fa_cp_async4((tid < BM ? sL : sD) + i, src, row < sq ? 4 : 0);
}

/* Qi, dOi and the row statistics of query block m (first row m1 = m·BM, passed as the caller has it) -> Q/dO
 * buffer `nb` (always 0 with one buffer) and stats buffer nb, with cp.async in one commit group. */
template <typename T, class C>
FA_DEV void fa_bwd_prefetch_q(const fa_cuda_params &p, const fa_bwd_addr *sA, T *sQ, T *sdO, float *sL, float *sD,
                              int m, int m1, int nb, int sq, int tid) {
    constexpr int BM = C::BM, D = C::D, LD = C::LD, DV = C::DV, LDV = C::LDV, NTHR = C::NW * 32, qb = C::QSTAGES == 2;
    fa_load_tile<T, BM, D, LD, NTHR>(sQ + qb * nb * BM * LD, (const T *)sA->q + (int64_t)m1 * p.q_ss, p.q_ss, sq - m1, tid);
    fa_load_tile<T, BM, DV, LDV, NTHR>(sdO + qb * nb * BM * LDV, (const T *)sA->dout + (int64_t)m1 * p.do_ss, p.do_ss,
                                       sq - m1, tid);
    fa_bwd_copy_stats<BM>(sA, sq, m, sL + nb * BM, sD + nb * BM, tid);
    fa_cp_async_commit();
}

template <int MT, int NT> FA_DEV void fa_zero(float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][nt][e] = 0.f;
}

/* Row statistic of query column qc (c1 = qc & 1) of this block, one 8-byte shared load per column pair. */
FA_DEV float fa_bwd_col_stat(const float *stat, int qc, int c1) {
    const float2 v = *(const float2 *)(stat + qc - c1);
    return c1 ? v.y : v.x;
}
/* Every element of a warp's MS x QS C tiles of Sᵀ / dPᵀ (rows = keys, cols = queries) in the query-column tiles
 * [NT0, NT1), column pair by column pair: col(qc, c1) once per query column (its row statistics), then
 * elem(mi, nt, e, qc, r, that) per element. */
template <int MS, int QS, class Col, class Elem, int NT0 = 0, int NT1 = QS>
FA_DEV void fa_bwd_walk(int lane, Col col, Elem elem) {
#pragma unroll
    for (int nt = NT0; nt < NT1; ++nt)
#pragma unroll
        for (int c1 = 0; c1 < 2; ++c1) {
            const int qc = nt * 8 + (lane & 3) * 2 + c1;
            const auto cs = col(qc, c1);
#pragma unroll
            for (int mi = 0; mi < MS; ++mi)
#pragma unroll
                for (int r = 0; r < 2; ++r) elem(mi, nt, 2 * r + c1, qc, r, cs);
        }
}

/* The elementwise step on a warp's Sᵀ, dPᵀ tiles (rows = keys from key0, cols = queries from q0), in place:
 * St <- P = exp2(S·scale·log2e − LSE·log2e), dPt <- dS = P ∘ (dP − D); with softcap, St comes in as
 * t = tanh(s·scale/c) (−inf where masked), the score is c·t and dS picks up d(c·t)/ds = scale·(1 − t²) (from t
 * itself, not (c·t)/c: no division in the loop); MASK: masked -> 0 here. Written out rather than through
 * fa_bwd_walk: the walker changes nvcc's schedule of this, the measured hot step (same instructions, other order). */
template <bool SOFTCAP, bool MASK, int MS, int QS>
FA_DEV void fa_bwd_p_ds(float (&St)[MS][QS][4], float (&dPt)[MS][QS][4], const fa_cuda_params &p, const fa_seq &s,
                        int q0, int key0, const float *sLq, const float *sDq, int lane) {
#pragma unroll
    for (int nt = 0; nt < QS; ++nt)
#pragma unroll
        for (int c1 = 0; c1 < 2; ++c1) {
            const int qc = nt * 8 + (lane & 3) * 2 + c1;
            const float2 L2 = *(const float2 *)(sLq + qc - c1), D2 = *(const float2 *)(sDq + qc - c1);
            const float Lq = c1 ? L2.y : L2.x, Dq = c1 ? D2.y : D2.x;
#pragma unroll
            for (int mi = 0; mi < MS; ++mi)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int e = 2 * r + c1;
                    float sv = St[mi][nt][e], dcap = 1.f;
                    if (SOFTCAP) { /* St holds t = tanh(s·scale/c) already, −inf where masked (see the caller) */
                        dcap = fmaxf(1.f - sv * sv, 0.f); /* 0, not −inf, where masked: P = 0 there, dS = 0 */
                        sv *= p.softcap;
                    }
                    float pv = fa_exp2(fmaf(sv, p.scale_log2, -Lq));
                    const int kj = key0 + mi * 16 + (lane >> 2) + r * 8;
                    if (MASK && !(fa_visible(p, q0 + qc, kj, s.sq, s.sk) && fa_in_chunk(p, q0 + qc, kj, s.sq, s.sk)))
                        pv = 0.f;
                    float ds = pv * (dPt[mi][nt][e] - Dq);
                    if (SOFTCAP) ds *= dcap;
                    St[mi][nt][e] = pv;
                    dPt[mi][nt][e] = ds;
                }
        }
}

/* St <- P on the query columns nt in [NT0, NT1) (no mask, no softcap): one slice of the split step below. */
template <int MS, int QS, int NT0, int NT1>
FA_DEV void fa_bwd_p_cols(float (&St)[MS][QS][4], float scale_log2, const float *sLq, int lane) {
    const auto col = [&](int qc, int c1) { return fa_bwd_col_stat(sLq, qc, c1); };
    const auto elem = [&](int mi, int nt, int e, int, int, float Lq) {
        St[mi][nt][e] = fa_exp2(fmaf(St[mi][nt][e], scale_log2, -Lq));
    };
    fa_bwd_walk<MS, QS, decltype(col), decltype(elem), NT0, NT1>(lane, col, elem);
}

/* A warp's MS x QS C tiles (16-bit) -> shared rows (keys) from the shared-space byte address pa, 16 x 16 per
 * stmatrix (see the caller). */
template <typename T, int MS, int QS, int LDP>
FA_DEV void fa_bwd_st_tiles(uint32_t pa, const float (&X)[MS][QS][4]) {
#pragma unroll
    for (int mi = 0; mi < MS; ++mi)
#pragma unroll
        for (int np = 0; np < QS / 2; ++np) {
            const float(&a)[4] = X[mi][2 * np], (&b)[4] = X[mi][2 * np + 1];
            fa_stmatrix_x4(pa + (mi * 16 * LDP + np * 16) * 2, fa_pack2<T>(a[0], a[1]), fa_pack2<T>(a[2], a[3]),
                           fa_pack2<T>(b[0], b[1]), fa_pack2<T>(b[2], b[3]));
        }
}

/* f(std::integral_constant<int, I>) for I = 0 .. N-1: a loop whose index can be a template argument. */
template <int N, int I = 0, class F> FA_DEV void fa_static_for(F f) {
    if constexpr (I < N) {
        f(std::integral_constant<int, I>{});
        fa_static_for<N, I + 1>(f);
    }
}

/* The hot step of tiles with P_SPLIT (no mask, no softcap): dPᵀ = Vj dOiᵀ with P = exp2(S·scale·log2e − LSE·log2e)
 * computed between the GEMM's k-steps, a slice of St's query columns after each (in program order the MUFU work
 * sits among the MMAs, and no shared store stands between them: ptxas does not move an ldmatrix above a shared
 * store it cannot prove disjoint — which is what held FA2's order, P stored before the dPᵀ GEMM, behind the exp2s).
 * P is packed to 16 bits as it is computed (Pp, its shared-memory store), dS = P ∘ (dP − D) takes the fp32 P (FA2's
 * numerics), and both go to shared memory. (At d=64, 128 x 128, the fp32 P of
 * this step spills; the split is off there.) */
template <typename T, class C, int MS, int QS>
FA_DEV void fa_bwd_split_step(float (&St)[MS][QS][4], float (&dPt)[MS][QS][4], const T *sVk, const T *sdOq, float kl,
                              const float *sLq, const float *sDq, uint32_t pa, int lane) {
    constexpr int KS = C::DV / 16, LDV = C::LDV, LDP = C::LDP;
    uint32_t Pp[MS][QS][2];
    fa_warp_gemm_abt<T, MS, QS, C::DV, LDV, LDV>(dPt, sVk, sdOq, lane, [&](int k) {
        fa_static_for<KS>([&](auto K) { /* k is a constant after unrolling: the slice of k-step k */
            constexpr int N0 = decltype(K)::value * QS / KS, N1 = (decltype(K)::value + 1) * QS / KS;
            if (k == decltype(K)::value) {
                fa_bwd_p_cols<MS, QS, N0, N1>(St, kl, sLq, lane);
#pragma unroll
                for (int mi = 0; mi < MS; ++mi)
#pragma unroll
                    for (int nt = N0; nt < N1; ++nt) {
                        Pp[mi][nt][0] = fa_pack2<T>(St[mi][nt][0], St[mi][nt][1]);
                        Pp[mi][nt][1] = fa_pack2<T>(St[mi][nt][2], St[mi][nt][3]);
                    }
            }
        });
    });
    fa_bwd_walk<MS, QS>(
        lane, [&](int qc, int c1) { return fa_bwd_col_stat(sDq, qc, c1); },
        [&](int mi, int nt, int e, int, int, float Dq) {
            dPt[mi][nt][e] = St[mi][nt][e] * (dPt[mi][nt][e] - Dq);
        });
#pragma unroll
    for (int mi = 0; mi < MS; ++mi)
#pragma unroll
        for (int np = 0; np < QS / 2; ++np)
            fa_stmatrix_x4(pa + (mi * 16 * LDP + np * 16) * 2, Pp[mi][2 * np][0], Pp[mi][2 * np][1],
                           Pp[mi][2 * np + 1][0], Pp[mi][2 * np + 1][1]);
    fa_bwd_st_tiles<T, MS, QS, LDP>(pa + C::BN * LDP * 2, dPt);
}

/* dQi += dS Kj on this warp's QQ queries x QD columns (dS read as (dSᵀ)ᵀ): FLASH2 -> the staging tile (made
 * visible to the bulk copy's async proxy), FLASH1 -> added into the fp32 accumulator in place. */
template <typename T, class C, int DQ_MODE>
FA_DEV void fa_bwd_dq_step(const fa_bwd_addr *sA, const T *sdS, const T *sK, float *sdQ, int m0, int sq, int q_row,
                           int q_col, int lane) {
    constexpr int D = C::D, BN = C::BN, LD = C::LD, LDP = C::LDP, MQ = C::QQ / 16, NQ = C::QD / 8;
    float dQp[MQ][NQ][4];
    fa_zero(dQp);
    fa_warp_gemm_sb<T, true, MQ, NQ, BN, LDP, LD>(dQp, sdS + q_row, sK + q_col, lane);
    if (DQ_MODE == FA_DQ_REDUCE) {
        constexpr int LQ = C::LQ;
        const uint32_t st = fa_opaque(fa_smem_addr(sdQ + (q_row + (lane >> 2)) * LQ + q_col + (lane & 3) * 2));
#pragma unroll
        for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int nt = 0; nt < NQ; ++nt)
                    fa_st_shared_f2(st + ((mi * 16 + r * 8) * LQ + nt * 8) * 4, dQp[mi][nt][2 * r],
                                    dQp[mi][nt][2 * r + 1]);
        fa_fence_proxy_async();
        return;
    }
    /* 32-bit and opaque here: nvcc otherwise kept its 64-bit extension across the loop (8 B spill, d=128) */
    const int qoff = (int)fa_opaque((uint32_t)(q_col + (lane & 3) * 2));
#pragma unroll
    for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = m0 + q_row + mi * 16 + (lane >> 2) + r * 8;
            if (row >= sq) continue;
            float *dst = sA->dq + (int64_t)row * D + qoff;
#pragma unroll
            for (int nt = 0; nt < NQ; ++nt) {
                float2 *q2 = (float2 *)(dst + nt * 8), o = *q2;
                *q2 = make_float2(o.x + dQp[mi][nt][2 * r], o.y + dQp[mi][nt][2 * r + 1]);
            }
        }
}

/* The staged dQ of query block m -> dQacc (rows of D floats): one bulk reduce-add per row, issued by thread `row`
 * (rows < sq). The caller has passed a barrier since the staging stores; the tile is rewritten only after
 * fa_bulk_wait_read. Issued from four warps while the other four run ahead into the next GEMMs, at the top of the
 * step (the alternatives: docs/cuda-kernels.md). */
template <class C> FA_DEV void fa_bwd_dq_flush(const fa_bwd_addr *sA, const float *sdQ, int m, int sq, int tid) {
    const int row = m * C::BM + tid;
    if (tid < C::BM && row < sq) {
        fa_bulk_reduce_add_f32(sA->dq + (int64_t)row * C::D, fa_smem_addr(sdQ + tid * C::LQ), C::D * 4);
        fa_bulk_commit();
    }
}

/* PART: the query blocks [q_from, q_to) of the block's walk, and the partial dK (rows 0..BN-1) and dV (the next BN
 * rows) added into part (fp32, atomically): other CTAs walk the rest (flash2_bwd.cu, the split last wave). */
template <typename T, class C, int DQ_MODE, bool SOFTCAP, bool PART = false>
FA_DEV void fa_bwd_kv_block(const fa_cuda_params &p, const fa_seq &s, int b, int h, int n_block, unsigned char *smem,
                            int q_from = 0, int q_to = INT_MAX, float *part = nullptr) {
    constexpr int D = C::D, DV = C::DV, BM = C::BM, BN = C::BN, NTHR = C::NW * 32, LD = C::LD, LDV = C::LDV;
    constexpr int LDP = C::LDP, MS = C::SK / 16, QS = C::SQ / 8, MK = C::KK / 16, NK = C::KD / 8, NKV = C::KDV / 8;
    constexpr int QST = C::QSTAGES;
    constexpr bool Q_LATE = C::Q_LATE && DQ_MODE != FA_DQ_RMW; /* FLASH1's d=128 kernels spilled 12-16 B with it */
    fa_bwd_smem_base<C> &sm = *(fa_bwd_smem_base<C> *)smem;
    T *sK = (T *)sm.K, *sV = (T *)sm.V, *sQ = (T *)sm.Q, *sdO = (T *)sm.dO, *sP = (T *)sm.P, *sdS = (T *)sm.dS;
    float *sL = sm.L, *sD = sm.D;
    fa_bwd_addr *sA = &sm.addr;
    float *sdQ = fa_bwd_staging<C, DQ_MODE>(sm); /* FLASH2's dQ staging tile */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n0 = n_block * BN, kv_rows = min(BN, s.sk - n0), hk = h / p.group;
    const T *Kj = (const T *)p.k + fa_off(p, p.k_sb, p.k_ss, p.k_sh, b, s.krow, hk) + (int64_t)n0 * p.k_ss;
    const T *Vj = (const T *)p.v + fa_off(p, p.v_sb, p.v_ss, p.v_sh, b, s.krow, hk) + (int64_t)n0 * p.v_ss;

    int qlo, qhi;
    fa_query_span(p, n0, n0 + kv_rows, s.sq, s.sk, &qlo, &qhi);
    const int walk_lo = qlo / BM, walk_hi = qhi > qlo ? (qhi + BM - 1) / BM : walk_lo; /* the block's whole walk */
    const int mb_lo = PART ? max(walk_lo, q_from) : walk_lo, mb_hi = PART ? min(walk_hi, q_to) : walk_hi;
    if (tid == 0) {
        sA->q = (const T *)p.q + fa_off(p, p.q_sb, p.q_ss, p.q_sh, b, s.qrow, h);
        sA->dout = (const T *)p.dout + fa_off(p, p.do_sb, p.do_ss, p.do_sh, b, s.qrow, h);
        sA->dq = p.dq_acc + s.stat0 * D;
        sA->lse2 = p.lse2 + s.stat0;
        sA->dsum = p.dsum + s.stat0;
        if (PART) {
            sA->dk = part;
            sA->dv = part + BN * D; /* the block's fp32 dK (BN x D), then its dV (BN x DV) */
        } else if (p.group == 1) {
            sA->dk = (T *)p.dk + fa_off(p, p.dk_sb, p.dk_ss, p.dk_sh, b, s.krow, hk) + (int64_t)n0 * p.dk_ss;
            sA->dv = (T *)p.dv + fa_off(p, p.dv_sb, p.dv_ss, p.dv_sh, b, s.krow, hk) + (int64_t)n0 * p.dv_ss;
        } else {
            const int64_t k0 = p.cu_k ? (int64_t)h * p.total_k + s.krow : ((int64_t)b * p.hq + h) * p.total_k;
            sA->dk = p.dk_acc + (k0 + n0) * D;
            sA->dv = p.dv_acc + (k0 + n0) * DV;
        }
        sA->rows = kv_rows;
    }
    __syncthreads(); /* sA */

    /* this warp's place in each GEMM's warp grid */
    const int s_key = (warp % C::WK_S) * C::SK, s_qry = (warp / C::WK_S) * C::SQ;
    const int kv_key = (warp % C::WK_KV) * C::KK, kv_col = (warp / C::WK_KV) * C::KD;
    const int kv_colv = (warp / C::WK_KV) * C::KDV; /* dV's columns (kv_col where DV = D) */
    const int q_row = (warp % C::WQ_DQ) * C::QQ, q_col = (warp / C::WQ_DQ) * C::QD;
    float dK[MK][NK][4], dV[MK][NKV][4];
    fa_zero(dK);
    fa_zero(dV);

    if (mb_hi > mb_lo) {
        fa_load_tile<T, BN, D, LD, NTHR>(sK, Kj, p.k_ss, kv_rows, tid);
        fa_load_tile<T, BN, DV, LDV, NTHR>(sV, Vj, p.v_ss, kv_rows, tid);
        fa_bwd_prefetch_q<T, C>(p, sA, sQ, sdO, sL, sD, mb_lo, mb_lo * BM, 0, s.sq, tid); /* same commit group as K, V */
    }
    for (int m = mb_lo; m < mb_hi; ++m) {
        const int buf = (m - mb_lo) & 1, m0 = m * BM;
        T *sQb = sQ + (QST == 2 ? buf : 0) * BM * LD, *sdOb = sdO + (QST == 2 ? buf : 0) * BM * LDV;
        const float *sLb = sL + buf * BM, *sDb = sD + buf * BM;
        fa_cp_async_wait<0>();
        __syncthreads(); /* Qi, dOi, stats landed; every warp is done with block i-1 (its buffers, sP, sdS, sdQ) */
        if (DQ_MODE == FA_DQ_REDUCE && m > mb_lo) fa_bwd_dq_flush<C>(sA, sdQ, m - 1, s.sq, tid); /* block i-1's dQ */
        const auto prefetch = [&] { /* Qi+1, dOi+1 -> the other buffer (every warp is past block i-1, its reader) */
            if (QST == 2 && m + 1 < mb_hi)
                fa_bwd_prefetch_q<T, C>(p, sA, sQ, sdO, sL, sD, m + 1, m0 + BM, buf ^ 1, s.sq, tid);
        };
        if (!Q_LATE) prefetch();

        { /* Sᵀ = Kj Qiᵀ, dPᵀ = Vj dOiᵀ on this warp's SK keys x SQ queries; P and dS -> shared memory */
            /* 16 x 16 of P and dS per stmatrix (4 x fewer shared-memory instructions than 32-bit stores: the MIO
             * queue stalls the d = 64 kernel); shared-space addresses from one opaque base (a generic 64-bit pointer
             * kept across the loop for these stores spills at d = 128) */
            const uint32_t pa = fa_opaque(fa_smem_addr(sP + (s_key + (lane & 15)) * LDP + s_qry + (lane >> 4) * 8));
            float St[MS][QS][4], dPt[MS][QS][4];
            fa_zero(St);
            fa_zero(dPt);
            fa_warp_gemm_abt<T, MS, QS, D, LD, LD>(St, sK + s_key * LD, sQb + s_qry * LD, lane);
            if (C::P_SPLIT && !SOFTCAP && fa_block_full(p, m0, m0 + BM, n0, n0 + BN, s.sq, s.sk)) {
                fa_bwd_split_step<T, C, MS, QS>(St, dPt, sV + s_key * LDV, sdOb + s_qry * LDV, p.scale_log2, sLb + s_qry,
                                                sDb + s_qry, pa, lane);
            } else {
                if (SOFTCAP) { /* t = tanh(s·scale/c), or −inf where masked, before dPᵀ is live (no spill for tanhf) */
                    const bool full = fa_block_full(p, m0, m0 + BM, n0, n0 + BN, s.sq, s.sk);
#pragma unroll
                    for (int mi = 0; mi < MS; ++mi)
#pragma unroll
                        for (int nt = 0; nt < QS; ++nt)
#pragma unroll
                            for (int e = 0; e < 4; ++e) {
                                const int q = m0 + s_qry + nt * 8 + (lane & 3) * 2 + (e & 1);
                                const int j = n0 + s_key + mi * 16 + (lane >> 2) + (e >> 1) * 8;
                                const float th = tanhf(St[mi][nt][e] * p.softcap_scale);
                                const bool vis = fa_visible(p, q, j, s.sq, s.sk) && fa_in_chunk(p, q, j, s.sq, s.sk);
                                St[mi][nt][e] = full || vis ? th : -INFINITY;
                            }
                }
                fa_warp_gemm_abt<T, MS, QS, DV, LDV, LDV>(dPt, sV + s_key * LDV, sdOb + s_qry * LDV, lane);
                /* P = exp2(S·scale·log2e − LSE·log2e), dS = P ∘ (dP − D) [∘ (1 − t²) with softcap], in place */
                if (SOFTCAP || fa_block_full(p, m0, m0 + BM, n0, n0 + BN, s.sq, s.sk)) /* hot path: no mask, no branch */
                    fa_bwd_p_ds<SOFTCAP, false, MS, QS>(St, dPt, p, s, m0 + s_qry, n0 + s_key, sLb + s_qry, sDb + s_qry, lane);
                else
                    fa_bwd_p_ds<false, true, MS, QS>(St, dPt, p, s, m0 + s_qry, n0 + s_key, sLb + s_qry, sDb + s_qry, lane);
                fa_bwd_st_tiles<T, MS, QS, LDP>(pa, St);
                fa_bwd_st_tiles<T, MS, QS, LDP>(pa + BN * LDP * 2, dPt);
            }
        }
        if (DQ_MODE == FA_DQ_REDUCE) fa_bulk_wait_read(); /* block i-1's dQ has left the staging tile */
        __syncthreads(); /* Pᵀ and dSᵀ of the whole block are in shared memory; the staging tile is free */
        if (Q_LATE) prefetch();

        /* dVj += Pᵀ dOi; dKj += dSᵀ Qi (this warp's KK keys x KD columns); dQi += dS Kj */
        fa_warp_gemm_sb<T, false, MK, NKV, BM, LDP, LDV>(dV, sP + kv_key * LDP, sdOb + kv_colv, lane);
        fa_warp_gemm_sb<T, false, MK, NK, BM, LDP, LD>(dK, sdS + kv_key * LDP, sQb + kv_col, lane);
        if (QST == 1) { /* one Q/dO buffer: every warp is done with Qi, dOi; block i+1 loads during the dQ GEMM */
            __syncthreads();
            if (m + 1 < mb_hi) fa_bwd_prefetch_q<T, C>(p, sA, sQ, sdO, sL, sD, m + 1, m0 + BM, buf ^ 1, s.sq, tid);
        }
        if (DQ_MODE != FA_DQ_NONE) fa_bwd_dq_step<T, C, DQ_MODE>(sA, sdS, sK, sdQ, m0, s.sq, q_row, q_col, lane);
    }

    /* Epilogue: dKj *= scale; write dKj, dVj (16-bit through shared memory, or fp32 per query head for GQA). */
    __syncthreads();
    if (DQ_MODE == FA_DQ_REDUCE && mb_hi > mb_lo) { /* the last block's dQ, complete before the CTA exits */
        fa_bwd_dq_flush<C>(sA, sdQ, mb_hi - 1, s.sq, tid);
        fa_bulk_wait_all();
    }
    void *const dk_out = sA->dk, *const dv_out = sA->dv;
    const int rows_e = sA->rows;
    /* nt < NK: dK's column tiles, nt < NKV: dV's (the same tiles where DV = D) */
    constexpr int NKM = NK > NKV ? NK : NKV;
    if (p.group == 1 && !PART) {
#pragma unroll
        for (int mi = 0; mi < MK; ++mi)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = kv_key + mi * 16 + (lane >> 2) + r * 8;
#pragma unroll
                for (int nt = 0; nt < NKM; ++nt) {
                    const int c = kv_col + nt * 8 + (lane & 3) * 2, cv = kv_colv + nt * 8 + (lane & 3) * 2;
                    if (nt < NK)
                        *(uint32_t *)(sK + row * LD + c) = fa_pack2<T>(dK[mi][nt][2 * r] * p.scale, dK[mi][nt][2 * r + 1] * p.scale);
                    if (nt < NKV) *(uint32_t *)(sV + row * LDV + cv) = fa_pack2<T>(dV[mi][nt][2 * r], dV[mi][nt][2 * r + 1]);
                }
            }
        __syncthreads();
        fa_store_tile<T, BN, D, LD, NTHR>((T *)dk_out, p.dk_ss, sK, rows_e, tid);
        fa_store_tile<T, BN, DV, LDV, NTHR>((T *)dv_out, p.dv_ss, sV, rows_e, tid);
    } else {
#pragma unroll
        for (int mi = 0; mi < MK; ++mi)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = kv_key + mi * 16 + (lane >> 2) + r * 8;
                if (row >= rows_e) continue;
                float *dk = (float *)dk_out + (int64_t)row * D, *dv = (float *)dv_out + (int64_t)row * DV;
#pragma unroll
                for (int nt = 0; nt < NKM; ++nt) {
                    const int c = kv_col + nt * 8 + (lane & 3) * 2, cv = kv_colv + nt * 8 + (lane & 3) * 2;
                    if (nt < NK) {
                        const float2 k2 = make_float2(dK[mi][nt][2 * r] * p.scale, dK[mi][nt][2 * r + 1] * p.scale);
                        if (PART) fa_red_add_f2(dk + c, k2);
                        else *(float2 *)(dk + c) = k2;
                    }
                    if (nt < NKV) {
                        const float2 v2 = make_float2(dV[mi][nt][2 * r], dV[mi][nt][2 * r + 1]);
                        if (PART) fa_red_add_f2(dv + cv, v2);
                        else *(float2 *)(dv + cv) = v2;
                    }
                }
            }
    }
    __syncthreads(); /* FLASH1 reuses sK, sV and sA for the next block */
}

#endif
