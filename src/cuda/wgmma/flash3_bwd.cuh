/* FLASH3 backward kernel (sm_90a), FA3 paper Algorithm 3. One CTA per Bc = 128 keys of one K/V head; it walks the
 * query blocks Qi (Br rows) of every query head of its group that see those keys:
 *   warpgroup 0, the producer (setmaxnreg 24): one thread loads Kj, Vj once, then per step Qi and dOi into ST
 *     stages (TMA, full/empty mbarriers);
 *   warpgroups 1 and 2, the consumers (setmaxnreg 240), own 64 keys each:
 *     Sᵀ = Kj Qiᵀ, dPᵀ = Vj dOiᵀ          (wgmma, both operands in shared memory)
 *     Pᵀ = exp2(Sᵀ·scale·log2e − LSE·log2e), dSᵀ = Pᵀ ∘ (dPᵀ − D)   [∘ (1 − tanh²) with softcap]
 *     dVj += Pᵀ dOi, dKj += dSᵀ Qi          (A = Pᵀ, dSᵀ from registers: dK, dV stay in registers all along)
 *     dQi = dS Kj                            (dSᵀ through shared memory: both warpgroups' keys are its K dimension)
 *     dQi goes to shared memory in the order of the accumulator registers;
 *   warp 1 of the producer warpgroup, the dQ writer, adds each warpgroup's dQi into an fp32 accumulator in global
 *     memory with one bulk reduce (flash3_bwd.cu converts it), so the consumers never wait for global memory;
 *     deterministic: the key blocks add in descending order, each waiting for its turn on a per-(batch, head, query
 *     block) counter.
 * With GQA the CTA walks the query heads of its K/V head one after the other, so dK, dV sum in registers (no fp32
 * copies per query head). Shared tiles are 64-column panels in the 128-byte swizzle, as in the forward (README.md).
 * flash3_bwd_steps.cuh has the steps both backward kernels share. */
#ifndef FA_WGMMA_FLASH3_BWD_CUH
#define FA_WGMMA_FLASH3_BWD_CUH

#include "flash3_bwd_dq.cuh"

/* Shared memory: Kj, Vj; ST stages of Qi, dOi; dSᵀ; dQi for the writer; the rows' LSE·log2e and D. */
template <int D> struct alignas(1024) fa3b_shared {
    using T = fa3b_tile<D>;
    uint16_t k[T::Bc * D], v[T::Bc * D];
    uint16_t q[T::ST][T::Br * D], dout[T::ST][T::Br * D];
    uint16_t ds[2][T::Bc * T::Br]; /* dSᵀ [key][query] in 64-query panels; two, so a step never waits for the last dQ */
    float dq[T::Br * D]; /* dQi in the accumulator's order (warpgroup w's half at w·Br·D/2), for the bulk reduce */
    fa3b_shared_rows<T::Br> rows;
    uint64_t full_kv, full_q[T::ST], full_do[T::ST], empty[T::ST];
    fa3b_kparams kp; /* varlen: the CTA's parameters (fa3b_params) */
    alignas(128) float cv[T::Br * D / FA3B_CV_PARTS]; /* fused: a part of a query block's dQ accumulator, for the
                                                       * converters (a bulk copy's and ld.shared.v4's alignment) */
    fa3b_jobs jobs;                                   /* fused: the writer's hand-offs to them */
};

/* acc += A B with A (64 keys x Br queries) from registers and B = a [query][D] tile, MN-major: a k16 slice is 16
 * query rows = 2048 B, the next 64 columns of D are Br x 128 B further. */
template <int D, int Br, bool F16>
FA_DEV void fa3b_rs(float (&acc)[D / 2], const uint32_t (&a)[Br / 16][4], uint32_t b_base) {
    const fa3_operand B(b_base, Br * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < Br / 16; kk++) fa_wgmma_rs<D, F16>(acc, a[kk], B.at(kk * 2048), 1);
}

template <int D, bool F16, bool DET, bool VARLEN>
__global__ void __launch_bounds__(384, 1)
    fa3_bwd_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                   const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                   const fa3b_kparams pk) {
    using T = fa3b_tile<D>;
    constexpr int Br = T::Br, Bc = T::Bc, ST = T::ST, NQ = T::NQ, NQN = T::NQN;
    extern __shared__ uint8_t fa3b_smem_raw[];
    fa3b_shared<D> &sm = *reinterpret_cast<fa3b_shared<D> *>(((uintptr_t)fa3b_smem_raw + 1023) & ~(uintptr_t)1023);

    fa3b_kparams own;
    const fa3b_kparams &p0 = fa3b_seq_of<VARLEN>(pk, own); /* varlen: this sequence's lengths and rows */
    const fa3b_walk W = fa3b_walk_of<Br, Bc, DET>(p0);
    const int nb = W.nb, n0 = W.n0, mlo = W.mlo, nm = W.nm, steps = W.steps, hk = blockIdx.y, b = blockIdx.z;
    if (VARLEN && n0 >= p0.sk) return; /* past the sequence's keys (the grid is sized for the longest): no work */

    if (threadIdx.x == 0) {
        fa3_bar_init(fa3_smem(&sm.full_kv), 1);
        for (int s = 0; s < ST; s++) {
            fa3_bar_init(fa3_smem(&sm.full_q[s]), 1);
            fa3_bar_init(fa3_smem(&sm.full_do[s]), 1);
            fa3_bar_init(fa3_smem(&sm.empty[s]), 8); /* one arrival per consumer warp */
        }
        fa3b_jobs_init(fa3_smem(&sm.jobs));
        fa3_bar_init_fence();
        if constexpr (VARLEN) sm.kp = own;
    }
    __syncthreads();
    const fa3b_kparams &p = fa3b_params<VARLEN>(pk, sm.kp);

    const int wg = fa3_warpgroup(); /* warp-uniform (ptx.cuh) */
    if (wg == 0) {
        fa3_regs_dec<24>();
        if (threadIdx.x == 0) {
            fa3b_load_kv<D, Bc, VARLEN>(&tq, &tk, &tv, &tdo, fa3_smem(sm.k), fa3_smem(sm.v), fa3_smem(&sm.full_kv), n0,
                                        hk, b, p);
            for (int it = 0; it < steps; it++) {
                const int h = hk * p.group + it / nm, m = mlo + it % nm, s = it % ST;
                const uint32_t fq = fa3_smem(&sm.full_q[s]), fd = fa3_smem(&sm.full_do[s]);
                fa3_bar_wait(fa3_smem(&sm.empty[s]), ((it / ST) & 1) ^ 1);
                fa3_bar_expect_tx(fq, Br * D * 2);
#pragma unroll
                for (int c = 0; c < D / 64; c++)
                    fa3b_box<Br, VARLEN>(fa3_smem(sm.q[s]) + c * Br * 128, &tq, fq, 64 * c,
                                         VARLEN ? p.qrow + m * Br : m * Br, h, b, p.sq - m * Br); /* varlen: packed */
                fa3_bar_expect_tx(fd, Br * D * 2);
#pragma unroll
                for (int c = 0; c < D / 64; c++)
                    fa3b_box<Br, VARLEN>(fa3_smem(sm.dout[s]) + c * Br * 128, &tdo, fd, 64 * c,
                                         VARLEN ? p.qrow + m * Br : m * Br, h, b, p.sq - m * Br);
            }
        } else if (threadIdx.x / 32 == 1) {
            fa3b_dq_writer<D, DET>(p, fa3_smem(sm.dq), fa3_smem(&sm.jobs), b, hk, nb, nm, mlo, steps);
        } else if (threadIdx.x >= 64) {
            fa3b_dq_converter<D, F16, VARLEN>(pk, p, fa3_smem(&sm.jobs), fa3_smem(sm.cv));
        }
        return;
    }

    fa3_regs_inc<240>();
    const int cw = wg - 1, ct = threadIdx.x % 128, warp = ct / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int kr0 = n0 + 64 * cw + 16 * warp + g; /* this thread's key rows: kr0, kr0 + 8 */
    const int off0 = p.sk - p.sq; /* the diagonal of query i is key i + off (varlen: per step, below) */
    const uint32_t k_base = fa3_smem(sm.k), v_base = fa3_smem(sm.v);
    float dk[D / 2], dv[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) dk[i] = dv[i] = 0.f;
    const int rc = fa3b_rows_first<Br>(sm, p, b, hk, nm, mlo, steps); /* consumer thread 0..255 */
    const bool copies = rc < 2 * Br;

    for (int it = 0; it < steps; it++) {
        const int m = mlo + it % nm, s = it % ST, m0 = m * Br;
        const uint32_t ph = (it / ST) & 1, q_base = fa3_smem(sm.q[s]), do_base = fa3_smem(sm.dout[s]);
        float st[Br / 2], dpt[Br / 2];
        const bool ahead = copies && it + 1 < steps; /* next step's LSE / D: loaded now, stored before FA3B_DS_READY */
        const float next_row = ahead ? fa3b_row_load<Br>(p, b, hk, nm, mlo, it + 1, rc) : 0.f;

        fa3_bar_wait(fa3_smem(&sm.full_q[s]), ph);
        fa3_gemm_abt<D, Br, Bc, Br, F16>(st, k_base + cw * 64 * 128, q_base); /* Sᵀ = Kj Qiᵀ */
        fa3_bar_wait(fa3_smem(&sm.full_do[s]), ph);
        fa3_gemm_abt<D, Br, Bc, Br, F16>(dpt, v_base + cw * 64 * 128, do_base); /* dPᵀ = Vj dOiᵀ */

        /* Pᵀ and dSᵀ (fa3b_rows: LSE and D from shared memory, copied in during the last step); with softcap both
         * wait for dPᵀ (1 − tanh² needs the scores Pᵀ overwrites). */
        fa3b_rows R;
        R.lse2 = sm.rows.lse2[it & 1] + 2 * t, R.dsum = sm.rows.dsum[it & 1] + 2 * t;
        R.kr0 = kr0, R.q0 = m0 + 2 * t;
        const int off = VARLEN ? p.sk - p.sq : off0;
        R.full = n0 + Bc <= p.sk && m0 + Br <= p.sq && (p.wl < 0 || n0 >= m0 + Br - 1 + off - p.wl) &&
                 (p.wr < 0 || n0 + Bc - 1 <= m0 + off + p.wr);
        uint32_t pa[Br / 16][4], dsa[Br / 16][4];
        if (p.cap_scale == 0.f) { /* Pᵀ while dPᵀ is still in the tensor cores. dVj += Pᵀ dOi beside dSᵀ as well needs
                                   * over 240 registers at d = 128: ptxas then serialises every wgmma (C7512) */
            fa3_wgmma_wait<1>();
            fa3_fence_regs(st);
            if (R.full) fa3b_p<Br, false>(st, p, R); /* uniform: the mask's arithmetic only where it masks */
            else fa3b_p<Br, true>(st, p, R);
            fa3_wgmma_wait<0>();
            fa3_fence_regs(dpt);
            fa3b_ds<Br>(dpt, st, p, R);
        } else {
            fa3_wgmma_wait<0>();
            fa3_fence_regs(st);
            fa3_fence_regs(dpt);
            fa3b_p_ds<Br>(st, dpt, p, R); /* softcap */
        }
        fa3_pack_a<Br, F16>(pa, st);
        fa3_wgmma_fence();
        fa3b_rs<D, Br, F16>(dv, pa, do_base); /* dVj += Pᵀ dOi */
        fa3_wgmma_commit();
        fa3_pack_a<Br, F16>(dsa, dpt);

        /* dSᵀ to shared memory, then dQi = dS Kj (A = dS and B = Kj both MN-major), then dKj += dSᵀ Qi: dQi's copy
         * to the writer runs under dK's GEMM (FA3's order), not after every GEMM of the step */
        const uint32_t ds_base = fa3_smem(sm.ds[it & 1]);
        fa3b_store_kq<Br / 8>(ds_base, dsa, Bc, 64 * cw + 16 * warp + g, 0);
        if (ahead) fa3b_row_store<Br>(sm.rows, it + 1, rc, next_row); /* every read of that buffer was before the last
                                                                        * FA3B_DS_READY */
        fa3_fence_async_smem();
        fa3_named_sync<FA3B_DS_READY, 256>();
        float dq[NQ];
        fa3_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < Bc / 16; kk++) {
            const uint32_t a_off = Br == 128 ? cw * Bc * 128 : 0, b_off = Br == 128 ? 0 : cw * Bc * 128;
            const fa3_operand A(ds_base + a_off, Bc * 128, 1024), B(k_base + b_off, Bc * 128, 1024);
            fa_wgmma_sstt<NQN, F16>(dq, A.at(kk * 2048), B.at(kk * 2048), kk > 0);
        }
        fa3_wgmma_commit();
        fa3b_rs<D, Br, F16>(dk, dsa, q_base); /* dKj += dSᵀ Qi */
        fa3_wgmma_commit();
        fa3_wgmma_wait<1>(); /* dV and dQi done, dK in flight */
        fa3_fence_regs(dq);
        fa3b_put_dq<NQ>(fa3_smem(sm.dq), dq, cw, ct); /* dQi to the writer */
        fa3_wgmma_wait<0>();
        fa3_fence_regs(dk);
        fa3_fence_regs(dv);
        fa3_fence_regs(pa); /* the RS GEMMs read them until here */
        fa3_fence_regs(dsa);
        fa3_release(fa3_smem(&sm.empty[s]), lane); /* Qi, dOi of this stage are read */
    }

    fa3b_store_dkv<D, F16, VARLEN>(p, dk, dv, b, hk, kr0, 0);
}

#endif
