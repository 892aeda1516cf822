/* FLASH3 backward, d = 64 and 128, with the consumer warpgroups apart (tiles.h: the rows "nolock", "pingpong" and
 * "ppsum", picked by FA_CUDA_FLASH3_BWD). The walk, tiles, producer and elementwise steps are fa3_bwd_kernel's (flash3_bwd.cuh);
 * what differs is that no barrier joins the two consumer warpgroups inside a step, so that one's elementwise work
 * (Pᵀ, dSᵀ, the dSᵀ store, the dQ hand-off) can run while the other's GEMMs keep the tensor cores busy:
 *   dQi = dS Kj is split by keys, not by rows or columns: warpgroup w computes the partial dQi_w = dS_w Kj,w (Br x D
 *     over its own 64 keys) from its own dSᵀ in shared memory (a barrier of its 128 threads) into its own buffer, and
 *     the dQ writer adds both partials into the fp32 accumulator (two bulk reduce-adds; deterministic: warpgroup
 *     0's done before warpgroup 1's, key blocks in fa3b_dq_writer's turn order);
 *   dKj += dSᵀ Qi reads dSᵀ from shared memory (it is there for dQi), so that dSᵀ's registers are free, and dVj's
 *     GEMM is waited for before dQi's Br·D/128 accumulators are issued (d = 128: dK, dV, dQi in 192 of the 240
 *     registers);
 *   the rows' LSE·log2e and D arrive with Qi and dOi (bulk copies on the stage's mbarriers), not through a
 *     barrier of the consumers.
 * SCHED (tiles.h): NOLOCK as above; PINGPONG, the warpgroups also take turns to issue Sᵀ and dPᵀ (named barriers, the
 * forward's scheduler), so that they stay out of phase: one's Pᵀ, dSᵀ under the other's GEMMs; PPSUM, PINGPONG with
 * one reduce-add per step instead of two (half the L2 traffic of dQ, as the lockstep kernel's): warpgroup 1 adds
 * warpgroup 0's partial, which it takes from shared memory (warpgroup 0 runs ahead by the turns, so it rarely
 * waits), into its own before the hand-off; the sum of two floats is the same either way round, so deterministic
 * mode stays bitwise reproducible. */
#ifndef FA_WGMMA_FLASH3_BWD_NOLOCK_CUH
#define FA_WGMMA_FLASH3_BWD_NOLOCK_CUH

#include "flash3_bwd_steps.cuh"
#include "tiles.h" /* SCHED's values */

/* Shared memory: Kj, Vj; ST stages of Qi, dOi and their rows' LSE·log2e and D; dSᵀ; each warpgroup's partial dQi.
 * dSᵀ: two buffers at d = 128; one at d = 64 (two would pass the 227 KB), where a warpgroup rewrites its rows only
 * after its S GEMM of the next step, which all four of its warps issue after their wait for this step's dQi GEMM. */
template <int D> struct alignas(1024) fa3b_nolock_shared {
    using T = fa3b_tile<D>;
    static constexpr int NDS = D == 64 ? 1 : 2;
    uint16_t k[T::Bc * D], v[T::Bc * D];
    uint16_t q[T::ST][T::Br * D], dout[T::ST][T::Br * D];
    uint16_t ds[NDS][T::Bc * T::Br]; /* dSᵀ [key][query] in 64-query panels: warpgroup w's keys in rows 64w.. */
    float dq[2][T::Br * D]; /* warpgroup w's partial dQi in the accumulator's order, for the bulk reduce */
    float lse2[T::ST][T::Br], dsum[T::ST][T::Br];
    uint64_t full_kv, full_q[T::ST], full_do[T::ST], empty[T::ST];
    fa3b_kparams kp; /* varlen: the CTA's parameters (fa3b_params) */
};

/* One warpgroup's partial dQi added into the accumulator block by the writer warp, and its buffer handed back
 * (more: a later step refills it); deterministic: the add is complete before the next one is issued. */
template <int W, bool DET> FA_DEV void fa3b_nolock_add(float *dst, uint32_t src, uint32_t bytes, bool lead, bool more) {
    __syncwarp(); /* bar.sync is warp-aligned: the lanes meet before each barrier */
    fa3_named_sync<FA3B_DQ_FULL + W, 160>();
    if (lead) {
        fa3_bulk_add_f32(dst, src, bytes), fa3_bulk_commit();
        if (DET) fa3_bulk_wait<0>();
        else fa3_bulk_wait_read<0>();
    }
    __syncwarp();
    if (more) fa3_named_arrive<FA3B_DQ_EMPTY + W, 160>();
}

/* The partial dQi_w (MB blocks of 64 query rows x D) to warpgroup w's buffer: register 4j..4j+3 of block mi at float4
 * (mi·D/8 + j)·128 + ct — at d = 64, 128 the order of fa3b_put_dq's halves, which fa3b_dq (flash3_bwd.cu) reads —
 * then handed to the writer. ADD (ppsum, warpgroup 1): plus warpgroup 0's partial from the same places of add, two
 * float4 at a time, so that few registers are live beside dK, dV and dQi. */
template <int D, int MB, bool ADD = false>
FA_DEV void fa3b_nolock_put(uint32_t buf, const float (&dq)[MB][D / 2], int cw, int ct, const float4 *add = nullptr) {
    fa3_named_sync(FA3B_DQ_EMPTY + cw, 160);
    const uint32_t s = buf + (ct << 4);
#pragma unroll
    for (int mi = 0; mi < MB; mi++)
#pragma unroll
        for (int j = 0; j < D / 8; j += 2) {
            float4 x[2] = {};
            if constexpr (ADD) x[0] = add[(mi * (D / 8) + j) * 128 + ct], x[1] = add[(mi * (D / 8) + j + 1) * 128 + ct];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float *r = dq[mi] + 4 * (j + h);
                if constexpr (ADD)
                    fa3_st_shared4(s + ((mi * (D / 8) + j + h) << 11), r[0] + x[h].x, r[1] + x[h].y, r[2] + x[h].z,
                                   r[3] + x[h].w);
                else
                    fa3_st_shared4(s + ((mi * (D / 8) + j + h) << 11), r[0], r[1], r[2], r[3]);
            }
        }
    fa3_fence_async_smem();
    fa3_named_arrive(FA3B_DQ_FULL + cw, 160);
}

/* The dQ writer (one warp; lane 0 issues): per step, warpgroup 0's partial then warpgroup 1's, each Br·D floats,
 * into the same block of the accumulator (SUM: warpgroup 1's only, which holds both); the walk and the deterministic
 * turns as fa3b_dq_writer's. */
template <int D, bool DET, bool SUM>
FA_DEV void fa3b_nolock_dq_writer(const fa3b_kparams &p, uint32_t src, int b, int hk, int nb, int nm, int mlo,
                                  int steps) {
    using T = fa3b_tile<D>;
    constexpr int Br = T::Br, Bc = T::Bc;
    constexpr uint32_t PART = Br * D * 4; /* bytes per warpgroup */
    const bool lead = threadIdx.x % 32 == 0;
    if (steps > 0) {
        if (!SUM) fa3_named_arrive<FA3B_DQ_EMPTY, 160>();
        fa3_named_arrive<FA3B_DQ_EMPTY + 1, 160>();
    }
    const int64_t chunk0 = (int64_t)(b * p.hq + hk * p.group) * p.nmb + mlo; /* (batch, head, query block) */
    float *dst = p.dq_acc + chunk0 * (Br * D);
    int *turn = DET ? p.turns + chunk0 : nullptr;
    int m = mlo, left = nm;
    for (int it = 0; it < steps; it++) {
        if (DET && lead) {
            const int m0 = m * Br;
            int klo, khi;
            fa_visible_block32(m0, m0 + Br < p.sq ? m0 + Br : p.sq, p.sq, p.sk, p.wl, p.wr, &klo, &khi);
            while (fa3_ld_acquire(turn) != (khi - 1) / Bc - nb) {
            }
        }
        const bool more = it + 1 < steps;
        if (!SUM) fa3b_nolock_add<0, DET>(dst, src, PART, lead, more);
        fa3b_nolock_add<1, DET>(dst, src + PART, PART, lead, more);
        if (DET && lead) { /* both adds are done in global memory before the next key block's turn */
            asm volatile("fence.proxy.async.global;\n" ::: "memory");
            __threadfence();
            atomicAdd(turn, 1);
        }
        __syncwarp();
        dst += Br * D, turn += DET;
        m++;
        if (--left == 0) dst += (int64_t)(p.nmb - nm) * (Br * D), turn += DET ? p.nmb - nm : 0, m = mlo, left = nm;
    }
    if (lead) fa3_bulk_wait<0>();
}

template <int D, bool F16, bool DET, bool VARLEN, int SCHED>
__global__ void __launch_bounds__(384, 1)
    fa3_bwd_nolock_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                          const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                          const fa3b_kparams pk) {
    using T = fa3b_tile<D>;
    static_assert(!T::WIDE && T::Bc == 128, "64 keys per consumer warpgroup: d = 64, 128");
    constexpr int Br = T::Br, Bc = T::Bc, ST = T::ST, MB = Br / 64, NDS = fa3b_nolock_shared<D>::NDS;
    constexpr bool PP = SCHED != FA3B_NOLOCK, SUM = SCHED == FA3B_PPSUM;
    extern __shared__ uint8_t fa3b_smem_raw[];
    fa3b_nolock_shared<D> &sm =
        *reinterpret_cast<fa3b_nolock_shared<D> *>(((uintptr_t)fa3b_smem_raw + 1023) & ~(uintptr_t)1023);

    fa3b_kparams own;
    const fa3b_kparams &p0 = fa3b_seq_of<VARLEN>(pk, own);
    const fa3b_walk W = fa3b_walk_of<Br, Bc, DET>(p0);
    const int nb = W.nb, n0 = W.n0, mlo = W.mlo, nm = W.nm, steps = W.steps, hk = blockIdx.y, b = blockIdx.z;
    if (VARLEN && n0 >= p0.sk) return;

    if (threadIdx.x == 0) {
        fa3_bar_init(fa3_smem(&sm.full_kv), 1);
        for (int s = 0; s < ST; s++) {
            fa3_bar_init(fa3_smem(&sm.full_q[s]), 1);
            fa3_bar_init(fa3_smem(&sm.full_do[s]), 1);
            fa3_bar_init(fa3_smem(&sm.empty[s]), 8); /* one arrival per consumer warp */
        }
        fa3_bar_init_fence();
        if constexpr (VARLEN) sm.kp = own;
    }
    __syncthreads();
    const fa3b_kparams &p = fa3b_params<VARLEN>(pk, sm.kp);

    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        fa3_regs_dec<24>();
        if (threadIdx.x == 0) {
            fa3b_load_kv<D, Bc, VARLEN>(&tq, &tk, &tv, &tdo, fa3_smem(sm.k), fa3_smem(sm.v), fa3_smem(&sm.full_kv), n0,
                                        hk, b, p);
            for (int it = 0; it < steps; it++) {
                const int h = hk * p.group + it / nm, m = mlo + it % nm, s = it % ST;
                const uint32_t fq = fa3_smem(&sm.full_q[s]), fd = fa3_smem(&sm.full_do[s]);
                const int64_t row = ((int64_t)(b * p.hq + h) * p.nmb + m) * Br; /* padded rows: whole 256-byte blocks */
                fa3_bar_wait(fa3_smem(&sm.empty[s]), ((it / ST) & 1) ^ 1);
                fa3_bar_expect_tx(fq, Br * D * 2 + Br * 4);
#pragma unroll
                for (int c = 0; c < D / 64; c++)
                    fa3b_box<Br, VARLEN>(fa3_smem(sm.q[s]) + c * Br * 128, &tq, fq, 64 * c,
                                         VARLEN ? p.qrow + m * Br : m * Br, h, b, p.sq - m * Br);
                fa3_bulk_load(fa3_smem(sm.lse2[s]), p.lse2 + row, Br * 4, fq);
                fa3_bar_expect_tx(fd, Br * D * 2 + Br * 4);
#pragma unroll
                for (int c = 0; c < D / 64; c++)
                    fa3b_box<Br, VARLEN>(fa3_smem(sm.dout[s]) + c * Br * 128, &tdo, fd, 64 * c,
                                         VARLEN ? p.qrow + m * Br : m * Br, h, b, p.sq - m * Br);
                fa3_bulk_load(fa3_smem(sm.dsum[s]), p.dsum + row, Br * 4, fd);
            }
        } else if (threadIdx.x / 32 == 1) {
            fa3b_nolock_dq_writer<D, DET, SUM>(p, fa3_smem(sm.dq), b, hk, nb, nm, mlo, steps);
        }
        return;
    }

    fa3_regs_inc<240>();
    const int cw = wg - 1, ct = threadIdx.x % 128, warp = ct / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int kr0 = n0 + 64 * cw + 16 * warp + g; /* this thread's key rows: kr0, kr0 + 8 */
    const int off0 = p.sk - p.sq;
    const uint32_t k_base = fa3_smem(sm.k), v_base = fa3_smem(sm.v);
    float dk[D / 2], dv[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) dk[i] = dv[i] = 0.f;
    fa3_bar_wait(fa3_smem(&sm.full_kv), 0); /* also when there is no step: no TMA may land after the CTA exits */
    if (PP && cw == 1 && steps > 0) fa3_named_arrive<FA3B_TURN, 256>(); /* warpgroup 0 issues first */
    if (SUM && cw == 1 && steps > 0) fa3_named_arrive<FA3B_DQ_EMPTY, 256>(); /* warpgroup 0's buffer is free */

    for (int it = 0; it < steps; it++) {
        const int m = mlo + it % nm, s = it % ST, m0 = m * Br;
        const uint32_t ph = (it / ST) & 1, q_base = fa3_smem(sm.q[s]), do_base = fa3_smem(sm.dout[s]);
        float st[Br / 2], dpt[Br / 2];

        fa3_bar_wait(fa3_smem(&sm.full_q[s]), ph);
        if (PP) fa3_named_sync(FA3B_TURN + cw, 256);
        fa3_gemm_abt<D, Br, Bc, Br, F16>(st, k_base + cw * 64 * 128, q_base); /* Sᵀ = Kj Qiᵀ */
        fa3_bar_wait(fa3_smem(&sm.full_do[s]), ph);
        fa3_gemm_abt<D, Br, Bc, Br, F16>(dpt, v_base + cw * 64 * 128, do_base); /* dPᵀ = Vj dOiᵀ */
        if (PP && (cw == 0 || it + 1 < steps)) /* the last turn of warpgroup 1 is not passed on: one arrive per sync */
            fa3_named_arrive(FA3B_TURN + 1 - cw, 256);

        fa3b_rows R; /* LSE·log2e and D of this stage, landed with Qi and dOi */
        R.lse2 = sm.lse2[s] + 2 * t, R.dsum = sm.dsum[s] + 2 * t;
        R.kr0 = kr0, R.q0 = m0 + 2 * t;
        const int off = VARLEN ? p.sk - p.sq : off0;
        R.full = n0 + Bc <= p.sk && m0 + Br <= p.sq && (p.wl < 0 || n0 >= m0 + Br - 1 + off - p.wl) &&
                 (p.wr < 0 || n0 + Bc - 1 <= m0 + off + p.wr);
        uint32_t pa[Br / 16][4], dsa[Br / 16][4];
        if (p.cap_scale == 0.f) { /* Pᵀ while dPᵀ is still in the tensor cores */
            fa3_wgmma_wait<1>();
            fa3_fence_regs(st);
            if (R.full) fa3b_p<Br, false>(st, p, R);
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

        /* dSᵀ of this warpgroup's keys to shared memory, for dKj += dSᵀ Qi (A K-major) and dQi_w = dS_w Kj,w (A and
         * B MN-major): only this warpgroup reads it */
        fa3_pack_a<Br, F16>(dsa, dpt);
        const uint32_t ds_base = fa3_smem(sm.ds[it % NDS]), ds_w = ds_base + cw * 64 * 128; /* panel p: + p·Bc·128 */
        fa3b_store_kq<Br / 8>(ds_base, dsa, Bc, 64 * cw + 16 * warp + g, 0);
        fa3_fence_async_smem();
        fa3_named_sync(FA3B_WG_DS + cw, 128);
        fa3_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < Br / 16; kk++) /* A = dSᵀ K-major: 16 queries = 32 B, 64 queries a panel */
            fa_wgmma_sst<D, F16>(dk, fa3_desc(ds_w + (kk / 4) * Bc * 128 + (kk % 4) * 32, 16, 1024),
                                 fa3_desc(q_base + kk * 2048, Br * 128, 1024), 1);
        fa3_wgmma_commit();
        fa3_wgmma_wait<1>(); /* dVj's GEMM: Pᵀ's registers are free for dQi's accumulators */
        fa3_fence_regs(dv);
        fa3_fence_regs(pa);
        float dq[MB][D / 2];
        fa3_wgmma_fence();
#pragma unroll
        for (int mi = 0; mi < MB; mi++) /* 64 query rows = one panel of dSᵀ */
#pragma unroll
            for (int kk = 0; kk < 4; kk++) /* 64 keys: K-slices of 16 key rows, 2048 B apart in dSᵀ and in Kj */
                fa_wgmma_sstt<D, F16>(dq[mi], fa3_desc(ds_w + mi * Bc * 128 + kk * 2048, Bc * 128, 1024),
                                      fa3_desc(k_base + cw * 64 * 128 + kk * 2048, Bc * 128, 1024), kk > 0);
        fa3_wgmma_commit();
        fa3_wgmma_wait<0>();
#pragma unroll
        for (int mi = 0; mi < MB; mi++) fa3_fence_regs(dq[mi]);
        fa3_fence_regs(dk);
        fa3_release(fa3_smem(&sm.empty[s]), lane); /* Qi, dOi and their rows of this stage are read */

        if (SUM && cw == 0) { /* the partial to warpgroup 1 (barriers of both warpgroups: 256) */
            fa3_named_sync<FA3B_DQ_EMPTY, 256>();
            const uint32_t d0 = fa3_smem(sm.dq[0]) + (ct << 4);
#pragma unroll
            for (int mi = 0; mi < MB; mi++)
#pragma unroll
                for (int j = 0; j < D / 8; j++)
                    fa3_st_shared4(d0 + ((mi * (D / 8) + j) << 11), dq[mi][4 * j], dq[mi][4 * j + 1], dq[mi][4 * j + 2],
                                   dq[mi][4 * j + 3]);
            fa3_named_arrive<FA3B_DQ_FULL, 256>();
        } else if (SUM) { /* both partials to the writer: warpgroup 0's read where this thread's own lie */
            fa3_named_sync<FA3B_DQ_FULL, 256>();
            fa3b_nolock_put<D, MB, true>(fa3_smem(sm.dq[1]), dq, 1, ct, reinterpret_cast<const float4 *>(sm.dq[0]));
            if (it + 1 < steps) fa3_named_arrive<FA3B_DQ_EMPTY, 256>(); /* read: warpgroup 0 may refill it */
        } else {
            fa3b_nolock_put<D, MB>(fa3_smem(sm.dq[cw]), dq, cw, ct); /* the partial dQi_w to the writer */
        }
    }

    fa3b_store_dkv<D, F16, VARLEN>(p, dk, dv, b, hk, kr0, 0);
}

#endif
