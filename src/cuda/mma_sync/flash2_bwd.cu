/* FlashAttention-2 backward (FA2p Algorithm 2, §3.2 "parallel over column blocks").
 *
 *   1. D = rowsum(dO ∘ O)                                 (bwd_util.cu; also clears the fp32 dQ accumulator)
 *   2. one CTA per K/V block (Tc = ceil(Sk/Bc) per head, Hq, B; linear, blocks of one head adjacent): CTA j keeps
 *      Kj, Vj, dKj, dVj on chip and loops over the query blocks (bwd_block.cuh); dQ is added into an fp32
 *      accumulator by bulk reduce-adds (TMA engine, one per row). The last wave's blocks are split (below).
 *   3. dQ = scale · dQacc -> dtype (bwd_util.cu); GQA: dK, dV summed over the query heads of a K/V head.
 * Deterministic mode (opts.deterministic): step 2 skips dQ and a second kernel computes dQ by query blocks
 * (grid (Tr, Hq, B), warps split Q rows, Qi dOi resident, loop over Kj Vj recomputing S and dP):
 *   dQi = scale · Σj dSij Kj — no reduction across CTAs, the same bits every run, at the price of recomputing S and dP (two of
 *   the five backward GEMMs run twice: ≈ 7/5 of the FLOPs).
 * Q, K, dQ, dK rows are D wide, V, dO, dV rows DV (D but for a pair of head dims: tiles.h). */
#include "bwd_block.cuh"
#include "cuda/attr_once.h"

/* The last wave, split (the plan decides: plan->aux). The kernel runs one CTA per SM, so N equal K/V blocks leave
 * N mod #SMs of them alone in the last wave. The first launch takes whole = N − split blocks, one per CTA; a second
 * deals the walks of the other blocks — units = split · Tr query blocks — out evenly to `pieces` CTAs, which add
 * their partial dK, dV (fp32) into p.tail_acc atomically; fa_flash2_tail_store_kernel writes them out. Two
 * launches, not one: one kernel with both kinds of CTA spilled at d=64 softcap and d=96. */
struct fa_bwd_tail {
    int tc, tr, whole, pieces; /* K/V blocks per head, query blocks per walk; blocks done whole; split CTAs */
    long long units;           /* query blocks of the split blocks' walks */
};
static fa_bwd_tail fa2_bwd_tail_of(const fa_cuda_params *p, const fa_plan *plan) {
    fa_bwd_tail t;
    const int split = plan->aux[FA_CUDA_AUX_SPLIT];
    t.tc = plan->grid[0], t.tr = (p->sq + plan->block_q - 1) / plan->block_q;
    t.whole = (int)((long long)t.tc * p->hq * p->batch - split);
    t.pieces = plan->aux[FA_CUDA_AUX_PIECES];
    t.units = (long long)split * t.tr;
    return t;
}

/* Linear K/V block g (blocks of one head adjacent, as the whole-block grid (Tc, Hq, B) numbers them) -> its key
 * block, head and batch. */
FA_DEV void fa2_bwd_block_of(const fa_cuda_params &p, const fa_bwd_tail &t, int g, int *n_block, int *h, int *b) {
    *n_block = g % t.tc, *h = (g / t.tc) % p.hq, *b = g / t.tc / p.hq;
}

/* One K/V block per CTA, grid (Tc, Hq, B); the blocks from linear index t.whole on are the split kernel's. */
template <typename T, class C, int DQ_MODE, bool SOFTCAP>
__global__ void __launch_bounds__(C::NW * 32, 1) fa_flash2_bwd_kernel(const fa_cuda_params p, const fa_bwd_tail t) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    const int n_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    if (((long long)b * gridDim.y + h) * gridDim.x + n_block >= t.whole) return;
    const fa_seq s = fa_get_seq(p, b, h);
    if (n_block * C::BN >= s.sk) return;
    fa_bwd_kv_block<T, C, DQ_MODE, SOFTCAP>(p, s, b, h, n_block, fa_smem);
}

/* The split blocks: CTA k walks units [u0, u1) (fewer than Tr: one block's query range, or the end of one and the
 * start of the next); linear block g -> (n_block, h, b) as in the grid above. */
template <typename T, class C>
__global__ void __launch_bounds__(C::NW * 32, 1) fa_flash2_bwd_split_kernel(const fa_cuda_params p, const fa_bwd_tail t) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    const int k = blockIdx.x;
    for (int it = 0; it < 2; ++it) {
        const long long u0 = t.units * k / t.pieces, u1 = t.units * (k + 1) / t.pieces;
        const int j = (int)(u0 / t.tr) + it;
        const long long j0 = (long long)j * t.tr;
        if (j0 >= u1) break;
        int n_block, h, b;
        fa2_bwd_block_of(p, t, t.whole + j, &n_block, &h, &b);
        const fa_seq s = fa_get_seq(p, b, h);
        fa_bwd_kv_block<T, C, FA_DQ_REDUCE, false, true>(p, s, b, h, n_block, fa_smem, (int)(u0 > j0 ? u0 - j0 : 0),
                                                         (int)(u1 - j0 < t.tr ? u1 - j0 : t.tr),
                                                         p.tail_acc + (size_t)j * C::BN * (C::D + C::DV));
    }
}

/* The split blocks' dK, dV (fp32 sums in p.tail_acc, BN x D then BN x DV per block, dK already scaled) -> the
 * outputs; one CTA per block. */
template <typename T, int BN, int D, int DV>
__global__ void __launch_bounds__(256) fa_flash2_tail_store_kernel(const fa_cuda_params p, const fa_bwd_tail t) {
    const int j = blockIdx.x;
    int n_block, h, b;
    fa2_bwd_block_of(p, t, t.whole + j, &n_block, &h, &b);
    const int n0 = n_block * BN, rows = min(BN, p.sk - n0);
    const float *acc = p.tail_acc + (size_t)j * BN * (D + DV);
    /* no varlen or GQA here (the plan's conditions): K/V head h, rows of batch b */
    T *dk = (T *)p.dk + fa_off(p, p.dk_sb, p.dk_ss, p.dk_sh, b, 0, h) + (int64_t)n0 * p.dk_ss;
    T *dv = (T *)p.dv + fa_off(p, p.dv_sb, p.dv_ss, p.dv_sh, b, 0, h) + (int64_t)n0 * p.dv_ss;
    for (int i = threadIdx.x; i < rows * (D / 2 + DV / 2); i += blockDim.x) {
        const int which = i >= rows * (D / 2), w = which ? DV : D, k = i - which * rows * (D / 2), row = k / (w / 2),
                  c = k % (w / 2) * 2;
        const float2 v = *(const float2 *)(acc + (size_t)which * BN * D + row * w + c);
        *(uint32_t *)((which ? dv + row * p.dv_ss : dk + row * p.dk_ss) + c) = fa_pack2<T>(v.x, v.y);
    }
}

/* Deterministic dQ: dQi = scale · Σj (P ∘ (dP − D)) Kj with warps splitting the rows of Qi; Br = 64, 4 warps,
 * Bc from the backward row (dq_bn). */
enum { FA2_DQ_BM = 64, FA2_DQ_NW = 4 };
/* Its shared memory: Qi, dOi; Kj, Vj double-buffered (rows padded to D + 8, DV + 8). */
template <int D, int DV, int BM, int BN> struct fa2_dq_smem {
    uint16_t Q[BM * (D + 8)], dO[BM * (DV + 8)], K[2 * BN * (D + 8)], V[2 * BN * (DV + 8)]; /* 16-bit elements (T) */
};
template <typename T, int D, int DV, int BN>
__global__ void __launch_bounds__(FA2_DQ_NW * 32) fa_flash2_dq_kernel(const fa_cuda_params p) {
    constexpr int BM = FA2_DQ_BM, NW = FA2_DQ_NW;
    constexpr int NTHR = NW * 32, MW = BM / (16 * NW), LD = D + 8, LDV = DV + 8, NT = BN / 8, DT = D / 8;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    fa2_dq_smem<D, DV, BM, BN> &sm = *(fa2_dq_smem<D, DV, BM, BN> *)fa_smem;
    T *sQ = (T *)sm.Q, *sdO = (T *)sm.dO, *sK = (T *)sm.K, *sV = (T *)sm.V;

    const int m_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const fa_seq s = fa_get_seq(p, b, h);
    const int m0 = m_block * BM;
    if (m0 >= s.sq) return;
    const int rows = min(BM, s.sq - m0), hk = h / p.group;
    const T *Q = (const T *)p.q + fa_off(p, p.q_sb, p.q_ss, p.q_sh, b, s.qrow, h) + (int64_t)m0 * p.q_ss;
    const T *dO = (const T *)p.dout + fa_off(p, p.do_sb, p.do_ss, p.do_sh, b, s.qrow, h) + (int64_t)m0 * p.do_ss;
    const T *K = (const T *)p.k + fa_off(p, p.k_sb, p.k_ss, p.k_sh, b, s.krow, hk);
    const T *V = (const T *)p.v + fa_off(p, p.v_sb, p.v_ss, p.v_sh, b, s.krow, hk);
    T *dQg = (T *)p.dq + fa_off(p, p.dq_sb, p.dq_ss, p.dq_sh, b, s.qrow, h) + (int64_t)m0 * p.dq_ss;

    int klo, khi;
    fa_key_span(p, m0, m0 + rows, s.sq, s.sk, &klo, &khi);
    const int nb_lo = klo / BN, nb_hi = khi > klo ? (khi + BN - 1) / BN : nb_lo;
    const int wrow = warp * 16 * MW;
    const float sl2 = p.scale_log2;

    float Lr[MW][2], Dr[MW][2];
#pragma unroll
    for (int mi = 0; mi < MW; ++mi)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = m0 + wrow + mi * 16 + (lane >> 2) + r * 8;
            float L = INFINITY, Dv = 0.f;
            if (row < s.sq) {
                const float l = p.lse[s.stat0 + row];
                L = l == -INFINITY ? INFINITY : l * FA_LOG2E;
                Dv = p.dsum[s.stat0 + row];
            }
            Lr[mi][r] = L;
            Dr[mi][r] = Dv;
        }
    float dQ[MW][DT][4];
#pragma unroll
    for (int mi = 0; mi < MW; ++mi)
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) dQ[mi][dt][0] = dQ[mi][dt][1] = dQ[mi][dt][2] = dQ[mi][dt][3] = 0.f;

    if (nb_hi > nb_lo) {
        fa_load_tile<T, BM, D, LD, NTHR>(sQ, Q, p.q_ss, rows, tid);
        fa_load_tile<T, BM, DV, LDV, NTHR>(sdO, dO, p.do_ss, rows, tid);
        fa_load_tile<T, BN, D, LD, NTHR>(sK, K + (int64_t)nb_lo * BN * p.k_ss, p.k_ss, s.sk - nb_lo * BN, tid);
        fa_load_tile<T, BN, DV, LDV, NTHR>(sV, V + (int64_t)nb_lo * BN * p.v_ss, p.v_ss, s.sk - nb_lo * BN, tid);
        fa_cp_async_commit();
    }
    for (int n = nb_lo; n < nb_hi; ++n) {
        const int buf = (n - nb_lo) & 1, n0 = n * BN;
        const T *sKb = sK + buf * BN * LD, *sVb = sV + buf * BN * LDV;
        fa_cp_async_wait<0>();
        __syncthreads();
        if (n + 1 < nb_hi) {
            fa_load_tile<T, BN, D, LD, NTHR>(sK + (buf ^ 1) * BN * LD, K + (int64_t)(n0 + BN) * p.k_ss, p.k_ss, s.sk - n0 - BN, tid);
            fa_load_tile<T, BN, DV, LDV, NTHR>(sV + (buf ^ 1) * BN * LDV, V + (int64_t)(n0 + BN) * p.v_ss, p.v_ss,
                                               s.sk - n0 - BN, tid);
            fa_cp_async_commit();
        }
        float S[MW][NT][4], dP[MW][NT][4];
#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) S[mi][nt][e] = dP[mi][nt][e] = 0.f;
        fa_warp_gemm_abt<T, MW, NT, D, LD, LD>(S, sQ + wrow * LD, sKb, lane);
        fa_warp_gemm_abt<T, MW, NT, DV, LDV, LDV>(dP, sdO + wrow * LDV, sVb, lane);
        const bool full = fa_block_full(p, m0, m0 + rows, n0, n0 + BN, s.sq, s.sk);
#pragma unroll
        for (int mi = 0; mi < MW; ++mi)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = e >> 1, i = m0 + wrow + mi * 16 + (lane >> 2) + r * 8;
                    const int j = n0 + nt * 8 + (lane & 3) * 2 + (e & 1);
                    float sv = S[mi][nt][e], pv, dcap = 1.f;
                    if (p.softcap > 0.f) { /* sv = c·t, t = tanh(s·scale/c); d sv / d s = scale·(1 − t²) */
                        const float t = tanhf(sv * p.softcap_scale);
                        sv = p.softcap * t;
                        dcap = 1.f - t * t;
                    }
                    if (!full && !(fa_visible(p, i, j, s.sq, s.sk) && fa_in_chunk(p, i, j, s.sq, s.sk)))
                        pv = 0.f;
                    else
                        pv = fa_exp2(fmaf(sv, sl2, -Lr[mi][r]));
                    float ds = pv * (dP[mi][nt][e] - Dr[mi][r]);
                    if (p.softcap > 0.f) ds *= dcap; /* t itself, not (c·t)/c: no division in the loop */
                    dP[mi][nt][e] = ds;
                }
        uint32_t dSa[MW][NT / 2][4];
        fa_acc_to_a<T, MW, NT / 2>(dSa, dP);
        fa_warp_gemm_rb<T, MW, DT, NT / 2, LD>(dQ, dSa, sKb, lane);
    }
    __syncthreads();
#pragma unroll
    for (int mi = 0; mi < MW; ++mi)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = wrow + mi * 16 + (lane >> 2) + r * 8;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt)
                *(uint32_t *)(sQ + row * LD + dt * 8 + (lane & 3) * 2) =
                    fa_pack2<T>(dQ[mi][dt][2 * r] * p.scale, dQ[mi][dt][2 * r + 1] * p.scale);
        }
    __syncthreads();
    fa_store_tile<T, BM, D, LD, NTHR>(dQg, p.dq_ss, sQ, rows, tid);
}

template <typename T, class C, int DQ_MODE, bool SOFTCAP>
static cudaError_t fa2_bwd_main_sc(const fa_cuda_params *p, const fa_plan *plan, cudaStream_t st) {
    const auto kernel = fa_flash2_bwd_kernel<T, C, DQ_MODE, SOFTCAP>;
    const int smem = (int)plan->smem_bytes;
    static unsigned char ready[64], ready_split[64];
    cudaError_t e = fa_cuda_attr_once(ready, (const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    const fa_bwd_tail t = fa2_bwd_tail_of(p, plan);
    if (plan->grid[0] == 0) return cudaSuccess;
    kernel<<<dim3(plan->grid[0], plan->grid[1], plan->grid[2]), plan->threads, smem, st>>>(*p, t);
    if ((e = cudaGetLastError()) != cudaSuccess || DQ_MODE != FA_DQ_REDUCE || SOFTCAP || !t.pieces) return e;
    e = fa_cuda_attr_once(ready_split, (const void *)fa_flash2_bwd_split_kernel<T, C>,
                          cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    const int split = plan->aux[FA_CUDA_AUX_SPLIT];
    if ((e = cudaMemsetAsync(p->tail_acc, 0, (size_t)split * C::BN * (C::D + C::DV) * sizeof(float), st)) != cudaSuccess)
        return e;
    fa_flash2_bwd_split_kernel<T, C><<<t.pieces, plan->threads, smem, st>>>(*p, t);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    fa_flash2_tail_store_kernel<T, C::BN, C::D, C::DV><<<split, 256, 0, st>>>(*p, t);
    return cudaGetLastError();
}
template <typename T, class C, int DQ_MODE>
static cudaError_t fa2_bwd_main(const fa_cuda_params *p, const fa_plan *plan, cudaStream_t st) {
    return p->softcap > 0.f ? fa2_bwd_main_sc<T, C, DQ_MODE, true>(p, plan, st)
                            : fa2_bwd_main_sc<T, C, DQ_MODE, false>(p, plan, st);
}

/* The K/V-block kernel, and for the deterministic path the dQ kernel after it. */
template <typename T, int R, int DET> static cudaError_t fa2_bwd_run(const fa_cuda_params *p, const fa_plan *plan, cudaStream_t st) {
    static_assert(fa_bwd_rows[R].algos & FA_BWD_F2, "a row FLASH2 builds");
    typedef fa_bwd_row_cfg<R> C;
    constexpr int D = C::D, DV = C::DV, BN = fa_bwd_rows[R].dq_bn;
    if (!DET) return fa2_bwd_main<T, C, FA_DQ_REDUCE>(p, plan, st);
    cudaError_t e = fa2_bwd_main<T, C, FA_DQ_NONE>(p, plan, st);
    if (e != cudaSuccess) return e;
    const int smem = (int)sizeof(fa2_dq_smem<D, DV, FA2_DQ_BM, BN>);
    static unsigned char ready[64];
    e = fa_cuda_attr_once(ready, (const void *)fa_flash2_dq_kernel<T, D, DV, BN>,
                          cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    dim3 grid((p->sq + FA2_DQ_BM - 1) / FA2_DQ_BM, p->hq, p->batch);
    if (grid.x == 0) return cudaSuccess;
    fa_flash2_dq_kernel<T, D, DV, BN><<<grid, FA2_DQ_NW * 32, smem, st>>>(*p);
    return cudaGetLastError();
}
template <int R> static int fa2_bwd_inst(int det, fa_cuda_instance *k) {
    typedef fa_bwd_row_cfg<R> C;
    k->f16 = det ? fa2_bwd_run<__half, R, 1> : fa2_bwd_run<__half, R, 0>;
    k->bf16 = det ? fa2_bwd_run<__nv_bfloat16, R, 1> : fa2_bwd_run<__nv_bfloat16, R, 0>;
    k->smem = det ? sizeof(fa_bwd_smem<C, FA_DQ_NONE>) : sizeof(fa_bwd_smem<C, FA_DQ_REDUCE>);
    return 1;
}
/* the rows of fa_bwd_rows with FA_BWD_F2 */
extern "C" int fa_flash2_bwd_instance(int row, int deterministic, fa_cuda_instance *k) {
    switch (row) {
    case 0: return fa2_bwd_inst<0>(deterministic, k);
    case 1: return fa2_bwd_inst<1>(deterministic, k);
    case 2: return fa2_bwd_inst<2>(deterministic, k);
    case 3: return fa2_bwd_inst<3>(deterministic, k);
    case 4: return fa2_bwd_inst<4>(deterministic, k);
    case 5: return fa2_bwd_inst<5>(deterministic, k);
    case 7: return fa2_bwd_inst<7>(deterministic, k);
    case 8: return fa2_bwd_inst<8>(deterministic, k);
    default: return 0;
    }
}

/* D pre-pass (and dQacc = 0 for the reduce-adds), the kernels, dQ conversion, GQA reduction. */
extern "C" cudaError_t fa_flash2_bwd_launch(const fa_cuda_params *p, const fa_plan *plan, int dtype, cudaStream_t st) {
    const int det = plan->aux[FA_CUDA_AUX_DET];
    fa_cuda_instance k;
    if (!fa_flash2_bwd_instance(plan->entry, det, &k)) return cudaErrorInvalidValue;
    cudaError_t e = fa_bwd_dsum_launch(p, dtype, !det, st);
    if (e != cudaSuccess) return e;
    if ((e = (dtype == 1 ? k.f16 : k.bf16)(p, plan, st)) != cudaSuccess) return e;
    if (!det && (e = fa_bwd_dq_convert_launch(p, dtype, st)) != cudaSuccess) return e;
    if (p->group > 1) e = fa_bwd_dkv_reduce_launch(p, dtype, st);
    return e;
}
