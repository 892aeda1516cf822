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
#include "cuda/attr_once.h"

#include "tiles.h"

/* The CTA's shared memory: Kj, Vj, Qi double-buffered (rows padded to D + 8); the per-warp partial P~w Vw
 * [NW][BM][D + 4]; the per-warp row max and sum [NW][BM]; per row: the coefficients of Oi and of P~Vj, m~, LSE.
 * The launch's dynamic shared memory is its sizeof. */
template <int D, int BM, int BN, int NW> struct fa1_fwd_smem {
    uint16_t K[BN * (D + 8)], V[BN * (D + 8)], Q[2 * BM * (D + 8)]; /* 16-bit elements (T) */
    float red[NW * BM * (D + 4)], max[NW * BM], sum[NW * BM];
    float a[BM], c[BM], mt[BM], lse[BM];
};

/* FLASH1 forward; tiles: tiles.h (MINB: CTAs per SM for the launch bounds, 0 = none). */
template <typename T, int D, int BM, int BN, int NW, int MINB>
__global__ void __launch_bounds__(NW * 32, MINB) fa_flash1_fwd_kernel(const fa_cuda_params p) {
    constexpr int NTHR = NW * 32, KW = BN / NW, LD = D + 8, LDR = D + 4, NT = KW / 8, DT = D / 8;
    static_assert(BM == 16, "one 16-row tile per step");
    extern __shared__ __align__(16) unsigned char fa_smem[];
    fa1_fwd_smem<D, BM, BN, NW> &sm = *(fa1_fwd_smem<D, BM, BN, NW> *)fa_smem;
    T *sK = (T *)sm.K, *sV = (T *)sm.V, *sQ = (T *)sm.Q;
    float *sRed = sm.red, *sMax = sm.max, *sSum = sm.sum;
    float *sA = sm.a, *sC = sm.c, *sMt = sm.mt, *sLse = sm.lse;

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
                    if (!full && !(fa_visible(p, r, c, s.sq, s.sk) && fa_in_chunk(p, r, c, s.sq, s.sk)))
                        S[0][nt][e] = -INFINITY;
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

template <typename T, class C, bool SOFTCAP>
__global__ void __launch_bounds__(C::NW * 32, 1) fa_flash1_bwd_kernel(const fa_cuda_params p) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
#pragma unroll 1
    for (int j = 0;; ++j) { /* outer loop over Kj, Vj */
        /* the sequence is re-derived every step (opaque to the compiler) so that no loop-carried state competes
         * with the step's registers: kept live across the loop, it spilled 28 B at d = 128 */
        const int h = (int)fa_opaque(blockIdx.x), b = (int)fa_opaque(blockIdx.y);
        const fa_seq s = fa_get_seq(p, b, h);
        if (j * C::BN >= s.sk) break;
        fa_bwd_kv_block<T, C, FA_DQ_RMW, SOFTCAP>(p, s, b, h, j, fa_smem);
    }
}

template <typename T, int R> static cudaError_t fa1_fwd_run(const fa_cuda_params *p, const fa_plan *plan, cudaStream_t st) {
    constexpr fa_f1_fwd_row r = fa_f1_fwd_rows[R];
    const auto kernel = fa_flash1_fwd_kernel<T, r.d, r.bm, r.bn, r.nw, r.minb>;
    static unsigned char ready[64];
    cudaError_t e =
        fa_cuda_attr_once(ready, (const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)plan->smem_bytes);
    if (e != cudaSuccess) return e;
    kernel<<<dim3(plan->grid[0], plan->grid[1], plan->grid[2]), plan->threads, plan->smem_bytes, st>>>(*p);
    return cudaGetLastError();
}
template <int R> static int fa1_fwd_inst(fa_cuda_instance *k) {
    constexpr fa_f1_fwd_row r = fa_f1_fwd_rows[R];
    k->f16 = fa1_fwd_run<__half, R>, k->bf16 = fa1_fwd_run<__nv_bfloat16, R>;
    k->smem = sizeof(fa1_fwd_smem<r.d, r.bm, r.bn, r.nw>);
    return 1;
}
static_assert(sizeof fa_f1_fwd_rows / sizeof fa_f1_fwd_rows[0] == 4, "one case per row of fa_f1_fwd_rows");
extern "C" int fa_flash1_fwd_instance(int row, fa_cuda_instance *k) {
    switch (row) {
    case 0: return fa1_fwd_inst<0>(k);
    case 1: return fa1_fwd_inst<1>(k);
    case 2: return fa1_fwd_inst<2>(k);
    case 3: return fa1_fwd_inst<3>(k);
    default: return 0;
    }
}

template <typename T, class C, bool SOFTCAP>
static cudaError_t fa1_bwd_run_sc(const fa_cuda_params *p, const fa_plan *plan, cudaStream_t st) {
    const auto kernel = fa_flash1_bwd_kernel<T, C, SOFTCAP>;
    static unsigned char ready[64];
    cudaError_t e =
        fa_cuda_attr_once(ready, (const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)plan->smem_bytes);
    if (e != cudaSuccess) return e;
    kernel<<<dim3(plan->grid[0], plan->grid[1], plan->grid[2]), plan->threads, plan->smem_bytes, st>>>(*p);
    return cudaGetLastError();
}
template <typename T, int R> static cudaError_t fa1_bwd_run(const fa_cuda_params *p, const fa_plan *plan, cudaStream_t st) {
    static_assert(fa_bwd_rows[R].algos & FA_BWD_F1, "a row FLASH1 builds");
    typedef fa_bwd_row_cfg<R> C;
    return p->softcap > 0.f ? fa1_bwd_run_sc<T, C, true>(p, plan, st) : fa1_bwd_run_sc<T, C, false>(p, plan, st);
}
template <int R> static int fa1_bwd_inst(fa_cuda_instance *k) {
    k->f16 = fa1_bwd_run<__half, R>, k->bf16 = fa1_bwd_run<__nv_bfloat16, R>;
    k->smem = sizeof(fa_bwd_smem<fa_bwd_row_cfg<R>, FA_DQ_RMW>);
    return 1;
}
/* the rows of fa_bwd_rows with FA_BWD_F1 */
extern "C" int fa_flash1_bwd_instance(int row, fa_cuda_instance *k) {
    switch (row) {
    case 1: return fa1_bwd_inst<1>(k);
    case 2: return fa1_bwd_inst<2>(k);
    case 4: return fa1_bwd_inst<4>(k);
    case 6: return fa1_bwd_inst<6>(k);
    default: return 0;
    }
}

extern "C" cudaError_t fa_flash1_fwd_launch(const fa_cuda_params *p, const fa_plan *plan, int dtype, cudaStream_t st) {
    fa_cuda_instance k;
    if (!fa_flash1_fwd_instance(plan->entry, &k)) return cudaErrorInvalidValue;
    return (dtype == 1 ? k.f16 : k.bf16)(p, plan, st);
}

/* D pre-pass (and dQacc = 0: the kernel read-modify-writes it), the kernel, dQ conversion, GQA reduction. */
extern "C" cudaError_t fa_flash1_bwd_launch(const fa_cuda_params *p, const fa_plan *plan, int dtype, cudaStream_t st) {
    fa_cuda_instance k;
    if (!fa_flash1_bwd_instance(plan->entry, &k)) return cudaErrorInvalidValue;
    cudaError_t e = fa_bwd_dsum_launch(p, dtype, 1, st);
    if (e != cudaSuccess) return e;
    if ((e = (dtype == 1 ? k.f16 : k.bf16)(p, plan, st)) != cudaSuccess) return e;
    if ((e = fa_bwd_dq_convert_launch(p, dtype, st)) != cudaSuccess) return e;
    if (p->group > 1) e = fa_bwd_dkv_reduce_launch(p, dtype, st);
    return e;
}
