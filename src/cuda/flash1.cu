/* FlashAttention-1 (FA1p Algorithm 1 forward, Algorithm 4 backward), on the same mma.sync building blocks as
 * FLASH2 so that the comparison isolates the algorithm.
 *
 * Forward. Grid (Hq, B): one CTA per (batch, head) — V1 parallelises over batch × heads only.
 *   for j in key blocks (outer):             Kj, Vj -> shared memory
 *     for i in query blocks that see Kj (inner):
 *       Qi -> shared memory; Oi (fp32), ℓi, mi <- HBM
 *       S = Qi Kjᵀ with the NW warps splitting the Bc keys ("split-K", V1's Cta_tile layout);
 *       m~ = rowmax(S) and ℓ~ = rowsum(P~), P~ = exp(S − m~), reduced across warps through shared memory;
 *       each warp's partial P~w Vw (16 x d) is summed across warps through shared memory (FA2p §3.3);
 *       m_new = max(mi, m~); ℓ_new = e^(mi−m_new) ℓi + e^(m~−m_new) ℓ~;
 *       Oi = (ℓi e^(mi−m_new) Oi + e^(m~−m_new) P~ Vj) / ℓ_new  -> HBM (fp32; dtype + LSE on the row block's last j)
 *       ℓi, mi -> HBM
 * The first visit of a row block reads the initial O = 0, ℓ = 0, m = −∞ implicitly (no HBM read).
 *
 * Backward. Grid (Hq, B): the CTA loops over the key blocks itself (outer) and over the query blocks (inner) with
 * the shared body of bwd_block.cuh; dQi is read, updated and written back to HBM (fp32) at every inner step
 * (V1), with no atomics since this CTA is the only writer of its head's dQ. D = rowsum(dO ∘ O) comes from the
 * pre-pass (V1 computed it in the first outer step and stored it to HBM: the same traffic). */
#include "bwd_block.cuh"

/* Tile table (Br x Bc, warps). V1's own shapes (GPU_NOTES §4: STEP = 16 query rows, 128 keys at d=128 and
 * 256 keys at d<=64 for long sequences, 4 warps splitting the keys); the backward uses FLASH2's tiles.
 *   d=64 : fwd 16 x 256, bwd 64 x 128 (a row of bwd_block.cuh's table)
 *   d=128: fwd 16 x 128, bwd 64 x 128 (bwd_block.cuh's default)
 *   d=32 : fwd 16 x 256, bwd 64 x 128;  d=96: fwd 16 x 128, bwd 64 x 64 (untuned) */
template <int D> struct fa1_fwd_tiles;
template <> struct fa1_fwd_tiles<64> { static constexpr int BM = 16, BN = 256, NW = 4, MINB = 0; };
template <> struct fa1_fwd_tiles<128> { static constexpr int BM = 16, BN = 128, NW = 4, MINB = 0; };
/* head dims 32 and 96 with the shapes of the neighbouring head dim (V1 had no 96). MINB: CTAs per SM for the
 * launch bounds (0 = none); with none, ptxas held the d=32 kernel at 80 registers and spilled 12 B. */
template <> struct fa1_fwd_tiles<32> { static constexpr int BM = 16, BN = 256, NW = 4, MINB = 4; };
template <> struct fa1_fwd_tiles<96> { static constexpr int BM = 16, BN = 128, NW = 4, MINB = 0; };
/* backward: bwd_block.cuh's 64 x 128 rows (the d=64 default, 128 x 128, spills 28 B in this kernel's outer loop) */
template <int D> struct fa1_bwd_tiles : fa_bwd_tiles<D, 64> {};
/* d=96: 64 x 64 (half the dK/dV registers): FLASH2's 64 x 128 row spilled 12 B in this kernel's outer loop */
template <> struct fa1_bwd_tiles<96> : fa_bwd_cfg<96, 64, 64, 4, 4, 4, false> {};

template <int D> static size_t fa1_fwd_smem() {
    typedef fa1_fwd_tiles<D> Tl;
    return (size_t)(2 * Tl::BN + 2 * Tl::BM) * (D + 8) * 2 + (size_t)Tl::NW * Tl::BM * (D + 4) * 4 +
           (size_t)(2 * Tl::NW + 4) * Tl::BM * 4;
}

template <typename T, int D>
__global__ void __launch_bounds__(fa1_fwd_tiles<D>::NW * 32, fa1_fwd_tiles<D>::MINB) fa_flash1_fwd_kernel(const fa_cuda_params p) {
    constexpr int BM = fa1_fwd_tiles<D>::BM, BN = fa1_fwd_tiles<D>::BN, NW = fa1_fwd_tiles<D>::NW;
    constexpr int NTHR = NW * 32, KW = BN / NW, LD = D + 8, LDR = D + 4, NT = KW / 8, DT = D / 8;
    static_assert(BM == 16, "one 16-row tile per step");
    extern __shared__ __align__(16) unsigned char fa_smem[];
    T *sK = (T *)fa_smem, *sV = sK + BN * LD, *sQ = sV + BN * LD;
    float *sRed = (float *)(sQ + 2 * BM * LD);  /* [NW][BM][LDR]: per-warp partial P~w Vw */
    float *sMax = sRed + NW * BM * LDR;          /* [NW][BM] */
    float *sSum = sMax + NW * BM;                /* [NW][BM] */
    float *sA = sSum + NW * BM, *sC = sA + BM;   /* per-row coefficients of Oi and of P~Vj */
    float *sMt = sC + BM;                        /* m~ per row */
    float *sLse = sMt + BM;                      /* LSE per row (last visit) */

    const int h = blockIdx.x, b = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const fa_seq s = fa_get_seq(p, b, h);
    const int hk = h / p.group;
    const T *Q = (const T *)p.q + fa_off(p, p.q_sb, p.q_ss, p.q_sh, b, s.qrow, h);
    const T *K = (const T *)p.k + fa_off(p, p.k_sb, p.k_ss, p.k_sh, b, s.krow, hk);
    const T *V = (const T *)p.v + fa_off(p, p.v_sb, p.v_ss, p.v_sh, b, s.krow, hk);
    T *O = (T *)p.out + fa_off(p, p.o_sb, p.o_ss, p.o_sh, b, s.qrow, h);
    float *Oacc = p.o_acc + s.stat0 * D, *Mg = p.row_m + s.stat0, *Lg = p.row_l + s.stat0;
    const int Tr = (s.sq + BM - 1) / BM, Tc = (s.sk + BN - 1) / BN;
    const float sl2 = p.scale_log2;

    /* Row blocks that see no key at all are never visited: O = 0, LSE = −inf. */
    for (int i = 0; i < Tr; ++i) {
        int klo, khi;
        fa_key_span(p, i * BM, min(s.sq, i * BM + BM), s.sq, s.sk, &klo, &khi);
        if (khi > klo) continue;
        for (int x = tid; x < BM * D; x += NTHR) {
            int r = i * BM + x / D;
            if (r < s.sq) O[(int64_t)r * p.o_ss + x % D] = fa_from_f32<T>(0.f);
        }
        if (p.lse && tid < BM && i * BM + tid < s.sq) p.lse[s.stat0 + i * BM + tid] = -INFINITY;
    }

    for (int j = 0; j < Tc; ++j) {
        const int n0 = j * BN;
        int qlo, qhi;
        fa_query_span(p, n0, min(s.sk, n0 + BN), s.sq, s.sk, &qlo, &qhi);
        const int i_lo = qlo / BM, i_hi = qhi > qlo ? (qhi + BM - 1) / BM : i_lo;
        if (i_hi <= i_lo) continue;
        __syncthreads(); /* previous outer step is done with sK, sV */
        fa_load_tile<T, BN, D, LD, NTHR>(sK, K + (int64_t)n0 * p.k_ss, p.k_ss, s.sk - n0, tid);
        fa_load_tile<T, BN, D, LD, NTHR>(sV, V + (int64_t)n0 * p.v_ss, p.v_ss, s.sk - n0, tid);
        fa_load_tile<T, BM, D, LD, NTHR>(sQ, Q + (int64_t)i_lo * BM * p.q_ss, p.q_ss, s.sq - i_lo * BM, tid);
        fa_cp_async_commit();
        for (int i = i_lo; i < i_hi; ++i) {
            const int m0 = i * BM, rows = min(BM, s.sq - m0), buf = (i - i_lo) & 1;
            const T *sQb = sQ + buf * BM * LD;
            int klo, khi;
            fa_key_span(p, m0, m0 + rows, s.sq, s.sk, &klo, &khi);
            const bool first = j == klo / BN, last = j == (khi - 1) / BN;
            fa_cp_async_wait<0>();
            __syncthreads();
            if (i + 1 < i_hi) {
                fa_load_tile<T, BM, D, LD, NTHR>(sQ + (buf ^ 1) * BM * LD, Q + (int64_t)(m0 + BM) * p.q_ss, p.q_ss,
                                                 s.sq - m0 - BM, tid);
                fa_cp_async_commit();
            }
            /* S = Qi Kwᵀ for this warp's KW keys */
            float S[1][NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) S[0][nt][0] = S[0][nt][1] = S[0][nt][2] = S[0][nt][3] = 0.f;
            fa_warp_gemm_abt<T, 1, NT, D, LD, LD>(S, sQb, sK + warp * KW * LD, lane);
            const bool full = fa_block_full(p, m0, m0 + rows, n0, n0 + BN, s.sq, s.sk);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (p.softcap > 0.f) S[0][nt][e] = fa_softcap(S[0][nt][e], p.softcap_scale, p.softcap);
                    S[0][nt][e] *= sl2; /* log2 units: the max below is right for a negative scale too */
                    const int r = m0 + (lane >> 2) + (e >> 1) * 8, c = n0 + warp * KW + nt * 8 + (lane & 3) * 2 + (e & 1);
                    if (!full && !fa_visible(p, r, c, s.sq, s.sk)) S[0][nt][e] = -INFINITY;
                }
            /* m~ = rowmax S across the warps (shared memory) */
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float mx = -INFINITY;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(S[0][nt][2 * r], S[0][nt][2 * r + 1]));
                mx = fa_quad_max(mx);
                if ((lane & 3) == 0) sMax[warp * BM + (lane >> 2) + r * 8] = mx;
            }
            __syncthreads();
            float sum[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = (lane >> 2) + r * 8;
                float mt = sMax[row];
#pragma unroll
                for (int w = 1; w < NW; ++w) mt = fmaxf(mt, sMax[w * BM + row]);
                const float mu = mt == -INFINITY ? 0.f : mt;
                sum[r] = 0.f;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    S[0][nt][2 * r] = fa_exp2(S[0][nt][2 * r] - mu);
                    S[0][nt][2 * r + 1] = fa_exp2(S[0][nt][2 * r + 1] - mu);
                    sum[r] += S[0][nt][2 * r] + S[0][nt][2 * r + 1];
                }
                sum[r] = fa_quad_sum(sum[r]);
                if ((lane & 3) == 0) {
                    sSum[warp * BM + row] = sum[r];
                    if (warp == 0) sMt[row] = mt;
                }
            }
            /* partial P~w Vw, this warp's keys only; summed across warps below */
            float Ow[1][DT][4];
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) Ow[0][dt][0] = Ow[0][dt][1] = Ow[0][dt][2] = Ow[0][dt][3] = 0.f;
            uint32_t Pa[1][NT / 2][4];
            fa_acc_to_a<T, 1, NT / 2>(Pa, S);
            fa_warp_gemm_rb<T, 1, DT, NT / 2, LD>(Ow, Pa, sV + warp * KW * LD, lane);
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int dt = 0; dt < DT; ++dt)
                    *(float2 *)(sRed + (warp * BM + (lane >> 2) + r * 8) * LDR + dt * 8 + (lane & 3) * 2) =
                        make_float2(Ow[0][dt][2 * r], Ow[0][dt][2 * r + 1]);
            __syncthreads();
            /* m_new, ℓ_new per row; mi, ℓi read from and written back to HBM */
            if (tid < BM && tid < rows) {
                const int row = m0 + tid;
                float mt = sMt[tid], lt = 0.f;
#pragma unroll
                for (int w = 0; w < NW; ++w) lt += sSum[w * BM + tid];
                const float mi = first ? -INFINITY : Mg[row], li = first ? 0.f : Lg[row];
                const float mn = fmaxf(mi, mt);
                const float al = mi == -INFINITY ? 0.f : fa_exp2(mi - mn);
                const float be = mt == -INFINITY ? 0.f : fa_exp2(mt - mn);
                const float ln = al * li + be * lt;
                sA[tid] = ln > 0.f ? al * li / ln : 0.f;
                sC[tid] = ln > 0.f ? be / ln : 0.f;
                if (last) {
                    sLse[tid] = ln > 0.f ? mn * FA_LN2 + logf(ln) : -INFINITY;
                } else {
                    Mg[row] = mn;
                    Lg[row] = ln;
                }
            }
            __syncthreads();
            /* Oi = a·Oi + c·Σw P~w Vw -> HBM */
            for (int x = tid; x < BM * D / 2; x += NTHR) {
                const int r = (2 * x) / D, c = (2 * x) % D;
                if (r >= rows) continue;
                float2 pv = *(const float2 *)(sRed + r * LDR + c);
#pragma unroll
                for (int w = 1; w < NW; ++w) {
                    float2 t = *(const float2 *)(sRed + (w * BM + r) * LDR + c);
                    pv.x += t.x;
                    pv.y += t.y;
                }
                float2 o = make_float2(0.f, 0.f);
                float *og = Oacc + (int64_t)(m0 + r) * D + c;
                if (!first) o = *(const float2 *)og;
                o.x = sA[r] * o.x + sC[r] * pv.x;
                o.y = sA[r] * o.y + sC[r] * pv.y;
                if (last)
                    *(uint32_t *)(O + (int64_t)(m0 + r) * p.o_ss + c) = fa_pack2<T>(o.x, o.y);
                else
                    *(float2 *)og = o;
            }
            if (last && p.lse && tid < rows) p.lse[s.stat0 + m0 + tid] = sLse[tid];
        }
    }
}

template <typename T, int D, bool SOFTCAP>
__global__ void __launch_bounds__(fa1_bwd_tiles<D>::NW * 32, 1) fa_flash1_bwd_kernel(const fa_cuda_params p) {
    typedef fa1_bwd_tiles<D> Tl;
    extern __shared__ __align__(16) unsigned char fa_smem[];
#pragma unroll 1
    for (int j = 0;; ++j) { /* outer loop over Kj, Vj */
        /* the sequence is re-derived every step (opaque to the compiler) so that no loop-carried state competes
         * with the step's registers: kept live across the loop, it spilled 28 B at d = 128 */
        const int h = (int)fa_opaque(blockIdx.x), b = (int)fa_opaque(blockIdx.y);
        const fa_seq s = fa_get_seq(p, b, h);
        if (j * Tl::BN >= s.sk) break;
        fa_bwd_kv_block<T, Tl, FA_DQ_RMW, SOFTCAP>(p, s, b, h, j, fa_smem);
    }
}

template <typename T, int D> static cudaError_t fa1_fwd_run(const fa_cuda_params *p, cudaStream_t st) {
    const size_t smem = fa1_fwd_smem<D>();
    cudaError_t e = cudaFuncSetAttribute(fa_flash1_fwd_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    fa_flash1_fwd_kernel<T, D><<<dim3(p->hq, p->batch), fa1_fwd_tiles<D>::NW * 32, smem, st>>>(*p);
    return cudaGetLastError();
}
template <typename T, int D, bool SOFTCAP> static cudaError_t fa1_bwd_run_sc(const fa_cuda_params *p, cudaStream_t st) {
    typedef fa1_bwd_tiles<D> Tl;
    const size_t smem = fa_bwd_smem_bytes<Tl, FA_DQ_RMW>();
    cudaError_t e = cudaFuncSetAttribute(fa_flash1_bwd_kernel<T, D, SOFTCAP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    fa_flash1_bwd_kernel<T, D, SOFTCAP><<<dim3(p->hq, p->batch), Tl::NW * 32, smem, st>>>(*p);
    return cudaGetLastError();
}
template <typename T, int D> static cudaError_t fa1_bwd_run(const fa_cuda_params *p, cudaStream_t st) {
    return p->softcap > 0.f ? fa1_bwd_run_sc<T, D, true>(p, st) : fa1_bwd_run_sc<T, D, false>(p, st);
}

template <int D> static cudaError_t fa1_fwd_pick(const fa_cuda_params *p, int dtype, cudaStream_t st, int *bm, int *bn) {
    *bm = fa1_fwd_tiles<D>::BM, *bn = fa1_fwd_tiles<D>::BN;
    return dtype == 1 ? fa1_fwd_run<__half, D>(p, st) : fa1_fwd_run<__nv_bfloat16, D>(p, st);
}

extern "C" cudaError_t fa_flash1_fwd_launch(const fa_cuda_params *p, int dtype, cudaStream_t st, int *bm, int *bn) {
    switch (p->d) {
    case 32: return fa1_fwd_pick<32>(p, dtype, st, bm, bn);
    case 64: return fa1_fwd_pick<64>(p, dtype, st, bm, bn);
    case 96: return fa1_fwd_pick<96>(p, dtype, st, bm, bn);
    case 128: return fa1_fwd_pick<128>(p, dtype, st, bm, bn);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t fa_flash1_bwd_launch(const fa_cuda_params *p, int dtype, cudaStream_t st, int *bm, int *bn) {
    cudaError_t e = fa_bwd_dsum_launch(p, dtype, 1, st); /* and dQacc = 0: the kernel read-modify-writes it */
    if (e != cudaSuccess) return e;
    *bm = fa1_bwd_tiles<64>::BM, *bn = p->d == 96 ? fa1_bwd_tiles<96>::BN : fa1_bwd_tiles<64>::BN;
    switch (p->d) {
    case 32: e = dtype == 1 ? fa1_bwd_run<__half, 32>(p, st) : fa1_bwd_run<__nv_bfloat16, 32>(p, st); break;
    case 64: e = dtype == 1 ? fa1_bwd_run<__half, 64>(p, st) : fa1_bwd_run<__nv_bfloat16, 64>(p, st); break;
    case 96: e = dtype == 1 ? fa1_bwd_run<__half, 96>(p, st) : fa1_bwd_run<__nv_bfloat16, 96>(p, st); break;
    case 128: e = dtype == 1 ? fa1_bwd_run<__half, 128>(p, st) : fa1_bwd_run<__nv_bfloat16, 128>(p, st); break;
    default: return cudaErrorInvalidValue;
    }
    if (e != cudaSuccess) return e;
    e = fa_bwd_dq_convert_launch(p, dtype, st);
    if (e != cudaSuccess) return e;
    if (p->group > 1) e = fa_bwd_dkv_reduce_launch(p, dtype, st);
    return e;
}

extern "C" int fa_flash_tiles(int algo, int d, int backward, int *bm, int *bn) {
    if (algo == 3 && !backward) return fa_flash2_fwd_tiles(d, bm, bn); /* FA_ALGO_FLASH2: a table of choices */
    if (backward && algo == 3) return fa_bwd_tile_pick(d, bm, bn);       /* FLASH2: every row of the table */
    if (d != 32 && d != 64 && d != 96 && d != 128) return 0;
    int tq, tk;
    if (backward) {
        tq = fa1_bwd_tiles<64>::BM, tk = d == 96 ? fa1_bwd_tiles<96>::BN : fa1_bwd_tiles<64>::BN;
    } else {
        tq = 16, tk = d <= 64 ? fa1_fwd_tiles<64>::BN : fa1_fwd_tiles<128>::BN;
    }
    if ((*bm && *bm != tq) || (*bn && *bn != tk)) return 0;
    *bm = tq, *bn = tk;
    return 1;
}
