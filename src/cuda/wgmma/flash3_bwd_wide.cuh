/* FLASH3 backward kernel for d = 256 (sm_90a), FA3 paper Algorithm 3 with FA3's d = 256 split. One CTA per Bc = 64
 * keys of one K/V head, Br = 64 query rows per step; 64 keys x 256 columns of dK and dV are 256 registers a thread
 * for one warpgroup, so the two consumer warpgroups share the keys and split the work:
 *   warpgroup w: Sᵀ, dPᵀ for query rows 32w..32w+31 of the step (wgmma m64n32, both operands in shared memory),
 *     Pᵀ and dSᵀ to shared memory [key][query];
 *   then both: dKj += dSᵀ Qi, dVj += Pᵀ dOi and dQi = dS Kj for D columns 128w..128w+127 (all operands in shared
 *     memory), so each keeps 64 x 128 of dK, dV and dQi.
 * One stage of Qi and dOi (shared memory is full: 227 KB); Qi is handed back as soon as dK's GEMM has read it and dOi
 * after dV's, so the next step's loads run under the rest of this one. The producer, the dQ writer and the row copies
 * are the d = 64, 128 kernel's (flash3_bwd_steps.cuh).
 * (D, DV) = (192, 128), MLA's pair, is this kernel with the columns split at 64-column panels (a wgmma operand starts
 * at a panel) instead of halves: warpgroup 0 dK and dQi columns 0..127, warpgroup 1 dK and dQi columns 128..191 and
 * all of dV: 128 accumulators and the same tensor work a step each (fa3bp_steps). */
#ifndef FA_WGMMA_FLASH3_BWD_WIDE_CUH
#define FA_WGMMA_FLASH3_BWD_WIDE_CUH

#include "flash3_bwd_dq.cuh"

/* Shared memory: Kj, Vj, Qi, dOi; Pᵀ and dSᵀ twice (a warpgroup writes step it + 1's while the other may still be
 * reading step it's); dQi for the writer; the rows' LSE·log2e and D. */
template <int D, int DV = D> struct alignas(1024) fa3b_wide_shared {
    using T = fa3b_tile<D, DV>;
    uint16_t k[T::Bc * D], v[T::Bc * DV], q[T::Br * D], dout[T::Br * DV];
    uint16_t pt[2][T::Bc * T::Br], ds[2][T::Bc * T::Br];
    float dq[T::Br * D];
    fa3b_shared_rows<T::Br> rows;
    uint64_t full_kv, full_q, full_do, empty_q, empty_do;
    fa3b_kparams kp; /* varlen: the CTA's parameters (fa3b_params) */
};

/* A step's first half, the same in both warpgroups: Sᵀ = Kj Qiᵀ and dPᵀ = Vj dOiᵀ for the warpgroup's 32 query
 * rows (wgmma m64n32, both operands in shared memory), Pᵀ and dSᵀ into the [key][query] tiles pt, ds[it & 1], the
 * next step's LSE / D rows copied in (consumer thread rc < 2·Br); then FA3B_DS_READY: the step's Pᵀ and dSᵀ are
 * whole in shared memory. */
template <int D, int DV, bool F16, bool VARLEN, class SM>
FA_DEV void fa3bw_pds(SM &sm, const fa3b_kparams &p, int it, int steps, int nm, int mlo, int b, int hk, int n0,
                      int off0, int kr0, int rc, int cw, int warp, int g, int t) {
    constexpr int Br = 64, Bc = 64;
    const int qc = 32 * cw; /* this warpgroup's first query row of a step in Sᵀ, dPᵀ */
    const uint32_t k_base = fa3_smem(sm.k), v_base = fa3_smem(sm.v), q_base = fa3_smem(sm.q);
    const uint32_t do_base = fa3_smem(sm.dout);
    const int m0 = (mlo + it % nm) * Br;
    const uint32_t ph = it & 1;
    float st[16], dpt[16];
    const bool ahead = rc < 2 * Br && it + 1 < steps; /* next step's LSE / D: loaded now, stored before FA3B_DS_READY */
    const float next_row = ahead ? fa3b_row_load<Br>(p, b, hk, nm, mlo, it + 1, rc) : 0.f;

    fa3_bar_wait(fa3_smem(&sm.full_q), ph);
    fa3_gemm_abt<D, 32, Bc, Br, F16>(st, k_base, q_base + qc * 128); /* Sᵀ = Kj Qiᵀ, 32 query rows */
    fa3_bar_wait(fa3_smem(&sm.full_do), ph);
    fa3_gemm_abt<DV, 32, Bc, Br, F16>(dpt, v_base, do_base + qc * 128); /* dPᵀ = Vj dOiᵀ */

    fa3b_rows R;
    R.lse2 = sm.rows.lse2[it & 1] + qc + 2 * t, R.dsum = sm.rows.dsum[it & 1] + qc + 2 * t;
    R.kr0 = kr0, R.q0 = m0 + qc + 2 * t;
    const int off = VARLEN ? p.sk - p.sq : off0;
    R.full = n0 + Bc <= p.sk && m0 + Br <= p.sq && (p.wl < 0 || n0 >= m0 + Br - 1 + off - p.wl) &&
             (p.wr < 0 || n0 + Bc - 1 <= m0 + off + p.wr);
    if (p.cap_scale == 0.f) { /* Pᵀ while dPᵀ is still in the tensor cores */
        fa3_wgmma_wait<1>();
        fa3_fence_regs(st);
        if (R.full) fa3b_p<32, false>(st, p, R);
        else fa3b_p<32, true>(st, p, R);
        fa3_wgmma_wait<0>();
        fa3_fence_regs(dpt);
        fa3b_ds<32>(dpt, st, p, R);
    } else {
        fa3_wgmma_wait<0>();
        fa3_fence_regs(st);
        fa3_fence_regs(dpt);
        fa3b_p_ds<32>(st, dpt, p, R); /* softcap */
    }
    uint32_t pa[2][4], dsa[2][4];
    fa3_pack_a<32, F16>(pa, st);
    fa3_pack_a<32, F16>(dsa, dpt);
    const uint32_t pt_base = fa3_smem(sm.pt[it & 1]), ds_base = fa3_smem(sm.ds[it & 1]);
    fa3b_store_kq<4>(pt_base, pa, Bc, 16 * warp + g, 4 * cw); /* query columns qc.. of the [key][query] tiles */
    fa3b_store_kq<4>(ds_base, dsa, Bc, 16 * warp + g, 4 * cw);
    if (ahead) fa3b_row_store<Br>(sm.rows, it + 1, rc, next_row); /* every read of that buffer was before the last
                                                                    * FA3B_DS_READY */
    fa3_fence_async_smem();
    fa3_named_sync<FA3B_DS_READY, 256>();
}

/* The pair's steps of warpgroup CW (the split in the head comment): its NK columns of dK (warpgroup 1: and all of
 * dV) in registers over the walk, the same columns of dQi per step to the writer; then its dK (and dV) rows. */
template <int CW, int D, int DV, bool F16, bool VARLEN, class SM>
FA_DEV void fa3bp_steps(SM &sm, const fa3b_kparams &p, int steps, int nm, int mlo, int b, int hk, int n0, int off0,
                        int kr0, int rc, int warp, int g, int t, int lane, int ct) {
    using T = fa3b_tile<D, DV>;
    constexpr int Br = T::Br, Bc = T::Bc;
    constexpr int C0 = CW == 0 ? 0 : T::DQ0, NK = CW == 0 ? T::DQ0 : D - T::DQ0, NQ = Br * NK / 128;
    static_assert(T::PAIR && C0 % 64 == 0 && NK % 64 == 0 && 2 * (D - T::DQ0) + DV == 2 * T::DQ0,
                  "panel-aligned columns, the same tensor work in both warpgroups");
    /* B operands from this warpgroup's first panel: Qi's and Kj's columns C0.., MN-major (LBO: the next panel) */
    const uint32_t q_base = fa3_smem(sm.q) + (C0 / 64) * Br * 128, k_base = fa3_smem(sm.k) + (C0 / 64) * Bc * 128;
    const uint32_t do_base = fa3_smem(sm.dout);
    float dk[NK / 2], dv[CW == 1 ? DV / 2 : 2];
#pragma unroll
    for (int i = 0; i < NK / 2; i++) dk[i] = 0.f;
#pragma unroll
    for (int i = 0; i < (CW == 1 ? DV / 2 : 2); i++) dv[i] = 0.f;

    for (int it = 0; it < steps; it++) {
        fa3bw_pds<D, DV, F16, VARLEN>(sm, p, it, steps, nm, mlo, b, hk, n0, off0, kr0, rc, CW, warp, g, t);
        const uint32_t pt_base = fa3_smem(sm.pt[it & 1]), ds_base = fa3_smem(sm.ds[it & 1]);
        fa3_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < Br / 16; kk++) { /* dKj += dSᵀ Qi, columns C0.. */
            const fa3_operand A(ds_base, 16, 1024), B(q_base, Br * 128, 1024);
            fa_wgmma_sst<NK, F16>(dk, A.at(kk * 32), B.at(kk * 2048), 1);
        }
        fa3_wgmma_commit();
        if constexpr (CW == 1) {
#pragma unroll
            for (int kk = 0; kk < Br / 16; kk++) { /* dVj += Pᵀ dOi */
                const fa3_operand A(pt_base, 16, 1024), B(do_base, Br * 128, 1024);
                fa_wgmma_sst<DV, F16>(dv, A.at(kk * 32), B.at(kk * 2048), 1);
            }
            fa3_wgmma_commit();
        }
        float dq[NQ];
#pragma unroll
        for (int kk = 0; kk < Bc / 16; kk++) { /* dQi = dS Kj, columns C0.. */
            const fa3_operand A(ds_base, Bc * 128, 1024), B(k_base, Bc * 128, 1024);
            fa_wgmma_sstt<NK, F16>(dq, A.at(kk * 2048), B.at(kk * 2048), kk > 0);
        }
        fa3_wgmma_commit();
        if constexpr (CW == 1) {
            fa3_wgmma_wait<2>();
            fa3_fence_regs(dk);
            fa3_release(fa3_smem(&sm.empty_q), lane);
            fa3_wgmma_wait<1>();
            fa3_fence_regs(dv);
            fa3_release(fa3_smem(&sm.empty_do), lane);
        } else {
            fa3_wgmma_wait<1>();
            fa3_fence_regs(dk);
            fa3_release(fa3_smem(&sm.empty_q), lane);
            fa3_release(fa3_smem(&sm.empty_do), lane); /* its dOi was read by dPᵀ's GEMM, waited for in fa3bw_pds */
        }
        fa3_wgmma_wait<0>();
        fa3_fence_regs(dq);
        fa3b_put_dq<NQ, T::NQ>(fa3_smem(sm.dq), dq, CW, ct); /* after warpgroup 0's T::NQ · 128 floats */
    }
    fa3b_store_one<NK, F16, VARLEN>(p, p.dk, p.dk_sb, p.dk_ss, p.dk_sh, dk, p.scale, b, hk, kr0, C0);
    if constexpr (CW == 1) fa3b_store_one<DV, F16, VARLEN>(p, p.dv, p.dv_sb, p.dv_ss, p.dv_sh, dv, 1.f, b, hk, kr0, 0);
}

template <int D, bool F16, bool DET, bool VARLEN, int DV = D>
__global__ void __launch_bounds__(384, 1)
    fa3_bwd_wide_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                        const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                        const fa3b_kparams pk) {
    using T = fa3b_tile<D, DV>;
    constexpr int Br = T::Br, Bc = T::Bc, NQ = T::NQ, NQN = T::NQN, H = D / 2; /* H: a warpgroup's columns */
    static_assert(T::WIDE && Br == 64 && Bc == 64 && (T::PAIR || NQN == H), "the split this kernel is written for");
    extern __shared__ uint8_t fa3bw_smem_raw[];
    fa3b_wide_shared<D, DV> &sm =
        *reinterpret_cast<fa3b_wide_shared<D, DV> *>(((uintptr_t)fa3bw_smem_raw + 1023) & ~(uintptr_t)1023);

    fa3b_kparams own;
    const fa3b_kparams &p0 = fa3b_seq_of<VARLEN>(pk, own); /* varlen: this sequence's lengths and rows */
    const fa3b_walk W = fa3b_walk_of<Br, Bc, DET>(p0);
    const int nb = W.nb, n0 = W.n0, mlo = W.mlo, nm = W.nm, steps = W.steps, hk = blockIdx.y, b = blockIdx.z;
    if (VARLEN && n0 >= p0.sk) return; /* past the sequence's keys (the grid is sized for the longest): no work */

    if (threadIdx.x == 0) {
        fa3_bar_init(fa3_smem(&sm.full_kv), 1);
        fa3_bar_init(fa3_smem(&sm.full_q), 1);
        fa3_bar_init(fa3_smem(&sm.full_do), 1);
        fa3_bar_init(fa3_smem(&sm.empty_q), 8); /* one arrival per consumer warp */
        fa3_bar_init(fa3_smem(&sm.empty_do), 8);
        fa3_bar_init_fence();
        if constexpr (VARLEN) sm.kp = own;
    }
    __syncthreads();
    const fa3b_kparams &p = fa3b_params<VARLEN>(pk, sm.kp);

    const int wg = fa3_warpgroup(); /* warp-uniform (ptx.cuh) */
    if (wg == 0) {
        fa3_regs_dec<24>();
        if (threadIdx.x == 0) {
            fa3b_load_kv<D, Bc, VARLEN, DV>(&tq, &tk, &tv, &tdo, fa3_smem(sm.k), fa3_smem(sm.v),
                                            fa3_smem(&sm.full_kv), n0, hk, b, p);
            const uint32_t fq = fa3_smem(&sm.full_q), fd = fa3_smem(&sm.full_do);
            for (int it = 0; it < steps; it++) {
                const int h = hk * p.group + it / nm, m = mlo + it % nm, r = VARLEN ? p.qrow + m * Br : m * Br;
                const uint32_t ph = (it & 1) ^ 1;
                fa3_bar_wait(fa3_smem(&sm.empty_q), ph);
                fa3_bar_expect_tx(fq, Br * D * 2);
#pragma unroll
                for (int c = 0; c < D / 64; c++)
                    fa3b_box<Br, VARLEN>(fa3_smem(sm.q) + c * Br * 128, &tq, fq, 64 * c, r, h, b, p.sq - m * Br);
                fa3_bar_wait(fa3_smem(&sm.empty_do), ph);
                fa3_bar_expect_tx(fd, Br * DV * 2);
#pragma unroll
                for (int c = 0; c < DV / 64; c++)
                    fa3b_box<Br, VARLEN>(fa3_smem(sm.dout) + c * Br * 128, &tdo, fd, 64 * c, r, h, b, p.sq - m * Br);
            }
        } else if (threadIdx.x / 32 == 1) {
            fa3b_dq_writer<D, DET, DV>(p, fa3_smem(sm.dq), 0, b, hk, nb, nm, mlo, steps); /* no converters */
        }
        return;
    }

    fa3_regs_inc<240>();
    const int cw = wg - 1, ct = threadIdx.x % 128, warp = ct / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int kr0 = n0 + 16 * warp + g; /* this thread's key rows: kr0, kr0 + 8 */
    const int off0 = p.sk - p.sq;       /* the diagonal of query i is key i + off (varlen: per step, fa3bw_pds) */
    if constexpr (T::PAIR) {
        const int rc = fa3b_rows_first<Br>(sm, p, b, hk, nm, mlo, steps); /* consumer thread 0..255 */
        if (cw == 0)
            fa3bp_steps<0, D, DV, F16, VARLEN>(sm, p, steps, nm, mlo, b, hk, n0, off0, kr0, rc, warp, g, t, lane, ct);
        else
            fa3bp_steps<1, D, DV, F16, VARLEN>(sm, p, steps, nm, mlo, b, hk, n0, off0, kr0, rc, warp, g, t, lane, ct);
    } else {
        const uint32_t k_base = fa3_smem(sm.k), q_base = fa3_smem(sm.q);
        const uint32_t do_base = fa3_smem(sm.dout);
        float dk[H / 2], dv[H / 2];
#pragma unroll
        for (int i = 0; i < H / 2; i++) dk[i] = dv[i] = 0.f;
        const int rc = fa3b_rows_first<Br>(sm, p, b, hk, nm, mlo, steps); /* consumer thread 0..255 */

        for (int it = 0; it < steps; it++) {
            fa3bw_pds<D, DV, F16, VARLEN>(sm, p, it, steps, nm, mlo, b, hk, n0, off0, kr0, rc, cw, warp, g, t);
            const uint32_t pt_base = fa3_smem(sm.pt[it & 1]), ds_base = fa3_smem(sm.ds[it & 1]);

            /* A = Pᵀ, dSᵀ K-major ([key][query], one 64-query panel: a k16 slice is 32 B); B = this warpgroup's 128
             * columns of Qi, dOi (panels 2w, 2w + 1), MN-major: a k16 slice is 16 query rows */
            fa3_wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < Br / 16; kk++) { /* dKj += dSᵀ Qi */
                const fa3_operand A(ds_base, 16, 1024), B(q_base + 2 * cw * Br * 128, Br * 128, 1024);
                fa_wgmma_sst<H, F16>(dk, A.at(kk * 32), B.at(kk * 2048), 1);
            }
            fa3_wgmma_commit();
#pragma unroll
            for (int kk = 0; kk < Br / 16; kk++) { /* dVj += Pᵀ dOi */
                const fa3_operand A(pt_base, 16, 1024), B(do_base + 2 * cw * Br * 128, Br * 128, 1024);
                fa_wgmma_sst<H, F16>(dv, A.at(kk * 32), B.at(kk * 2048), 1);
            }
            fa3_wgmma_commit();
            float dq[NQ];
#pragma unroll
            for (int kk = 0; kk < Bc / 16; kk++) { /* dQi = dS Kj: A = dS, B = Kj's columns, both MN-major */
                const fa3_operand A(ds_base, Bc * 128, 1024), B(k_base + 2 * cw * Bc * 128, Bc * 128, 1024);
                fa_wgmma_sstt<NQN, F16>(dq, A.at(kk * 2048), B.at(kk * 2048), kk > 0);
            }
            fa3_wgmma_commit();
            fa3_wgmma_wait<2>();
            fa3_fence_regs(dk);
            fa3_release(fa3_smem(&sm.empty_q), lane); /* Qi is read: the next one loads under dV's and dQ's GEMMs */
            fa3_wgmma_wait<1>();
            fa3_fence_regs(dv);
            fa3_release(fa3_smem(&sm.empty_do), lane);
            fa3_wgmma_wait<0>();
            fa3_fence_regs(dq);
            fa3b_put_dq<NQ>(fa3_smem(sm.dq), dq, cw, ct); /* dQi to the writer */
        }

        fa3b_store_dkv<H, F16, VARLEN>(p, dk, dv, b, hk, kr0, H * cw);
    }
}

#endif
