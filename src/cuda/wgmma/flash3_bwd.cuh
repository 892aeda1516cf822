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
 * copies per query head). Shared tiles are 64-column panels in the 128-byte swizzle, as in the forward (README.md). */
#ifndef FA_WGMMA_FLASH3_BWD_CUH
#define FA_WGMMA_FLASH3_BWD_CUH

#include "../../core/visible.h"
#include "frag.cuh"
#include "ptx.cuh"
#include "wgmma.cuh"

/* Tiles (tiles.h has the rows): Bc = 128 keys, Br query rows per step, ST stages of Qi and dOi. dQi's GEMM is split
 * between the warpgroups by rows (Br = 128: 64 query rows each) or by columns (Br = 64: D/2 columns each); NQ is its
 * accumulators per thread. */
template <int D> struct fa3b_tile {
    static constexpr int Br = D == 64 ? 128 : 64;
    static constexpr int Bc = 128;
    static constexpr int ST = 2;
    static constexpr int THREADS = 384;
    static constexpr int NQ = Br * D / 256;
    static constexpr int NQN = Br == 128 ? D : D / 2; /* N of the dQ GEMM */
};

/* A step's LSE·log2e and D, two steps' worth: the consumers copy step it + 1's in while step it reads its own. */
template <int Br> struct fa3b_shared_rows {
    float lse2[2][Br], dsum[2][Br];
};
template <int D> struct alignas(1024) fa3b_shared {
    using T = fa3b_tile<D>;
    uint16_t k[T::Bc * D], v[T::Bc * D];
    uint16_t q[T::ST][T::Br * D], dout[T::ST][T::Br * D];
    uint16_t ds[2][T::Bc * T::Br]; /* dSᵀ [key][query] in 64-query panels; two, so a step never waits for the last dQ */
    float dq[T::Br * D]; /* dQi in the accumulator's order (warpgroup w's half at w·Br·D/2), for the bulk reduce */
    fa3b_shared_rows<T::Br> rows;
    uint64_t full_kv, full_q[T::ST], full_do[T::ST], empty[T::ST];
};

/* Named barriers (0 is __syncthreads): dSᵀ written and a step's LSE / D copied (the 256 consumer threads); a
 * warpgroup's dQ buffer free and full (its 128 threads and the dQ writer warp: 160). */
enum { FA3B_DS_READY = 1, FA3B_ROWS_READY = 2, FA3B_DQ_EMPTY = 3, FA3B_DQ_FULL = 5 };

struct fa3b_kparams {
    uint16_t *dk, *dv;
    int64_t dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh;
    const float *lse2, *dsum; /* [batch][hq][nmb·Br]: LSE·log2e (+inf past sq: P = 0), D (0 past sq); 8-byte pairs */
    float *dq_acc;            /* [batch][hq][nmb][Br·D] in accumulator order, zeroed */
    int *turns;               /* deterministic: [batch][hq][nmb] zeroed counters; else NULL */
    int sq, sk, hq, group, wl, wr, nmb;
    float scale, scale_log2; /* scale_log2 = log2 e with softcap (the scale is inside the cap) */
    float cap, cap_scale;    /* softcap: score = cap·tanh(s·cap_scale); cap_scale 0 = off */
};

/* acc += A B with A (64 keys x Br queries) from registers and B = a [query][D] tile, MN-major: a k16 slice is 16
 * query rows = 2048 B, the next 64 columns of D are Br x 128 B further. */
template <int D, int Br, bool F16>
FA_DEV void fa3b_rs(float (&acc)[D / 2], const uint32_t (&a)[Br / 16][4], uint32_t b_base) {
#pragma unroll
    for (int kk = 0; kk < Br / 16; kk++) fa_wgmma_rs<D, F16>(acc, a[kk], fa3_desc(b_base + kk * 2048, Br * 128, 1024), 1);
}

/* What the elementwise steps of a thread need beside the kernel's parameters (which stay in the constant bank, not
 * in registers): the step's LSE·log2e and D in shared memory, from its pair (query columns 8j + 2t, +1) on, its key
 * row kr0 (and kr0 + 8), its first query column q0 = m0 + 2t, and the mask (full: the block needs none). */
struct fa3b_rows {
    const float *lse2, *dsum;
    int kr0, q0;
    bool full;
};
/* The mask of key row kr in a masked block, as an offset and a count: query column q0 + c is visible iff
 * (unsigned)(base + c) < count — one add and one compare per element (rows past sk: none visible). */
struct fa3b_band {
    int base;
    unsigned count;
};
FA_DEV fa3b_band fa3b_band_of(const fa3b_kparams &p, int kr, int q0) {
    int lo = 0, hi = 0;
    if (kr < p.sk) fa_visible_queries32(kr, kr + 1, p.sq, p.sk, p.wl, p.wr, &lo, &hi);
    return {q0 - lo, (unsigned)(hi - lo)};
}
/* Sᵀ -> Pᵀ = exp2(Sᵀ·scale·log2e − LSE·log2e); MASK: 0 where masked (query rows past sq have LSE·log2e = +inf: 0).
 * Element e of block j is key row kr0 + 8·(e / 2), query column q0 + 8j + (e % 2); one key row at a time, so that one
 * band is live. */
template <int Br, bool MASK> FA_DEV void fa3b_p(float (&st)[Br / 2], const fa3b_kparams &p, const fa3b_rows &R) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const fa3b_band B = MASK ? fa3b_band_of(p, R.kr0 + 8 * r, R.q0) : fa3b_band{0, 0};
#pragma unroll
        for (int j = 0; j < Br / 8; j++) {
            const float2 L = *reinterpret_cast<const float2 *>(R.lse2 + 8 * j);
#pragma unroll
            for (int e = 2 * r; e < 2 * r + 2; e++) {
                const float pv = fa3_ex2(fmaf(st[4 * j + e], p.scale_log2, -((e & 1) ? L.y : L.x)));
                st[4 * j + e] = !MASK || (unsigned)(B.base + 8 * j + (e & 1)) < B.count ? pv : 0.f;
            }
        }
    }
}
/* dPᵀ -> dSᵀ = Pᵀ ∘ (dPᵀ − D). */
template <int Br>
FA_DEV void fa3b_ds(float (&dpt)[Br / 2], const float (&pt)[Br / 2], const fa3b_kparams &p, const fa3b_rows &R) {
#pragma unroll
    for (int j = 0; j < Br / 8; j++) {
        const float2 Dq = *reinterpret_cast<const float2 *>(R.dsum + 8 * j);
#pragma unroll
        for (int e = 0; e < 4; e++) dpt[4 * j + e] = pt[4 * j + e] * (dpt[4 * j + e] - ((e & 1) ? Dq.y : Dq.x));
    }
}
/* Both after dPᵀ, for softcap: the score is cap·th, th = tanh(s·cap_scale), and dS picks up d score / ds =
 * scale·(1 − th²) (the scale is applied to dK and dQ at the end). The mask from the parameters element by element
 * (a band per key row, as fa3b_p keeps, spilled at d = 64 beside tanhf's temporaries). */
template <int Br>
FA_DEV void fa3b_p_ds(float (&st)[Br / 2], float (&dpt)[Br / 2], const fa3b_kparams &p, const fa3b_rows &R) {
    const int off = p.sk - p.sq;
#pragma unroll
    for (int j = 0; j < Br / 8; j++) {
        const float2 L = *reinterpret_cast<const float2 *>(R.lse2 + 8 * j);
        const float2 Dq = *reinterpret_cast<const float2 *>(R.dsum + 8 * j);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float th = tanhf(st[4 * j + e] * p.cap_scale);
            const int kr = R.kr0 + 8 * (e / 2), q = R.q0 + 8 * j + (e & 1);
            float pv = fa3_ex2(fmaf(p.cap * th, p.scale_log2, -((e & 1) ? L.y : L.x)));
            pv = R.full || (kr < p.sk && q < p.sq && (p.wl < 0 || kr >= q + off - p.wl) &&
                            (p.wr < 0 || kr <= q + off + p.wr)) ? pv : 0.f;
            st[4 * j + e] = pv;
            dpt[4 * j + e] = pv * (dpt[4 * j + e] - ((e & 1) ? Dq.y : Dq.x)) * (1.f - th * th);
        }
    }
}

/* Consumer thread c's share of step it's LSE·log2e (c < Br) and D (Br <= c < 2·Br): one float from global memory,
 * stored into shared memory a step ahead, behind a named barrier (ordering racecheck can check, unlike TMA's). */
template <int Br> FA_DEV float fa3b_row_load(const fa3b_kparams &p, int b, int hk, int nm, int mlo, int it, int c) {
    const int h = hk * p.group + it / nm, m = mlo + it % nm;
    const int64_t row = ((int64_t)(b * p.hq + h) * p.nmb + m) * Br;
    return c < Br ? __ldg(p.lse2 + row + c) : __ldg(p.dsum + row + c - Br);
}
template <int Br> FA_DEV void fa3b_row_store(fa3b_shared_rows<Br> &r, int it, int c, float x) {
    if (c < Br) r.lse2[it & 1][c] = x;
    else r.dsum[it & 1][c - Br] = x;
}

/* The dQ writer (one warp; lane 0 issues): per step, each warpgroup's half of dQi is one bulk reduce-add into the
 * accumulator, and the buffer is handed back once the copy has read it. Its first hand-back is before the first
 * step, and none after the last, so every barrier phase completes. */
template <int D, bool DET>
FA_DEV void fa3b_dq_writer(const fa3b_kparams &p, fa3b_shared<D> &sm, int b, int hk, int nb, int nm, int mlo, int steps) {
    using T = fa3b_tile<D>;
    constexpr int Br = T::Br, Bc = T::Bc;
    constexpr uint32_t HALF = Br * D / 2; /* floats per warpgroup */
    const bool lead = threadIdx.x % 32 == 0;
    const uint32_t src = fa3_smem(sm.dq);
    if (steps > 0) {
        fa3_named_arrive<FA3B_DQ_EMPTY, 160>();
        fa3_named_arrive<FA3B_DQ_EMPTY + 1, 160>();
    }
    const int64_t chunk0 = (int64_t)(b * p.hq + hk * p.group) * p.nmb + mlo; /* (batch, head, query block) */
    float *dst = p.dq_acc + chunk0 * (Br * D);
    int *turn = DET ? p.turns + chunk0 : nullptr;
    int m = mlo, left = nm; /* query block m of the current head; blocks left in it */
    for (int it = 0; it < steps; it++) {
        if (DET && lead) { /* key blocks add in descending order, the order in which a mask's diagonal brings them to
                            * query block m (the last key block sees it first): this one's turn is its rank from the
                            * last key block m sees */
            const int m0 = m * Br;
            int klo, khi;
            fa_visible_block32(m0, m0 + Br < p.sq ? m0 + Br : p.sq, p.sq, p.sk, p.wl, p.wr, &klo, &khi);
            while (fa3_ld_acquire(turn) != (khi - 1) / Bc - nb) {
            }
        }
        __syncwarp(); /* bar.sync is warp-aligned: the lanes meet before each barrier */
        fa3_named_sync<FA3B_DQ_FULL, 160>();
        if (lead) fa3_bulk_add_f32(dst, src, HALF * 4), fa3_bulk_commit();
        __syncwarp();
        fa3_named_sync<FA3B_DQ_FULL + 1, 160>();
        if (lead) {
            fa3_bulk_add_f32(dst + HALF, src + HALF * 4, HALF * 4), fa3_bulk_commit();
            if (DET) { /* the adds are done in global memory before the next key block's turn */
                fa3_bulk_wait<0>();
                asm volatile("fence.proxy.async.global;\n" ::: "memory");
                __threadfence();
                atomicAdd(turn, 1);
            } else {
                fa3_bulk_wait_read<0>();
            }
        }
        __syncwarp();
        dst += Br * D, turn += DET; /* the next block, or the next head's first (nmb − nm blocks on) */
        m++;
        if (--left == 0) dst += (int64_t)(p.nmb - nm) * (Br * D), turn += DET ? p.nmb - nm : 0, m = mlo, left = nm;
        if (it + 1 < steps) {
            fa3_named_arrive<FA3B_DQ_EMPTY, 160>();
            fa3_named_arrive<FA3B_DQ_EMPTY + 1, 160>();
        }
    }
    if (lead) fa3_bulk_wait<0>();
}

template <int D, bool F16, bool DET>
__global__ void __launch_bounds__(384, 1)
    fa3_bwd_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                   const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                   const fa3b_kparams p) {
    using T = fa3b_tile<D>;
    constexpr int Br = T::Br, Bc = T::Bc, ST = T::ST, NQ = T::NQ, NQN = T::NQN;
    extern __shared__ uint8_t fa3b_smem_raw[];
    fa3b_shared<D> &sm = *reinterpret_cast<fa3b_shared<D> *>(((uintptr_t)fa3b_smem_raw + 1023) & ~(uintptr_t)1023);

    /* Deterministic: the key blocks start last to first, the order in which they add dQ (fa3b_dq_writer), so a CTA
     * only ever waits for one that started before it; a block waiting for one not yet resident would hang. */
    const int nb = DET ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
    const int n0 = nb * Bc, n1 = n0 + Bc < p.sk ? n0 + Bc : p.sk;
    int qlo, qhi;
    fa_visible_queries32(n0, n1, p.sq, p.sk, p.wl, p.wr, &qlo, &qhi);
    const int mlo = qlo / Br, nm = qhi > qlo ? (qhi + Br - 1) / Br - mlo : 0; /* query blocks per head */
    const int steps = nm * p.group;

    if (threadIdx.x == 0) {
        fa3_bar_init(fa3_smem(&sm.full_kv), 1);
        for (int s = 0; s < ST; s++) {
            fa3_bar_init(fa3_smem(&sm.full_q[s]), 1);
            fa3_bar_init(fa3_smem(&sm.full_do[s]), 1);
            fa3_bar_init(fa3_smem(&sm.empty[s]), 8); /* one arrival per consumer warp */
        }
        fa3_bar_init_fence();
    }
    __syncthreads();

    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        fa3_regs_dec<24>();
        if (threadIdx.x == 0) {
            fa3_prefetch_map(&tq);
            fa3_prefetch_map(&tk);
            fa3_prefetch_map(&tv);
            fa3_prefetch_map(&tdo);
            const uint32_t fkv = fa3_smem(&sm.full_kv);
            fa3_bar_expect_tx(fkv, 2 * Bc * D * 2);
#pragma unroll
            for (int c = 0; c < D / 64; c++) {
                fa3_tma_load4(fa3_smem(sm.k) + c * Bc * 128, &tk, fkv, 64 * c, n0, hk, b);
                fa3_tma_load4(fa3_smem(sm.v) + c * Bc * 128, &tv, fkv, 64 * c, n0, hk, b);
            }
            for (int it = 0; it < steps; it++) {
                const int h = hk * p.group + it / nm, m = mlo + it % nm, s = it % ST;
                const uint32_t fq = fa3_smem(&sm.full_q[s]), fd = fa3_smem(&sm.full_do[s]);
                fa3_bar_wait(fa3_smem(&sm.empty[s]), ((it / ST) & 1) ^ 1);
                fa3_bar_expect_tx(fq, Br * D * 2);
#pragma unroll
                for (int c = 0; c < D / 64; c++)
                    fa3_tma_load4(fa3_smem(sm.q[s]) + c * Br * 128, &tq, fq, 64 * c, m * Br, h, b);
                fa3_bar_expect_tx(fd, Br * D * 2);
#pragma unroll
                for (int c = 0; c < D / 64; c++)
                    fa3_tma_load4(fa3_smem(sm.dout[s]) + c * Br * 128, &tdo, fd, 64 * c, m * Br, h, b);
            }
        } else if (threadIdx.x / 32 == 1) {
            fa3b_dq_writer<D, DET>(p, sm, b, hk, nb, nm, mlo, steps);
        }
        return;
    }

    fa3_regs_inc<240>();
    const int cw = wg - 1, ct = threadIdx.x % 128, warp = ct / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int kr0 = n0 + 64 * cw + 16 * warp + g, kr1 = kr0 + 8; /* this thread's two key rows */
    const int off = p.sk - p.sq;                                  /* the diagonal of query i is key i + off */
    const uint32_t k_base = fa3_smem(sm.k), v_base = fa3_smem(sm.v);
    float dk[D / 2], dv[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) dk[i] = dv[i] = 0.f;
    fa3_bar_wait(fa3_smem(&sm.full_kv), 0); /* also when there is no step: no TMA may land after the CTA exits */
    const int rc = threadIdx.x - 128; /* consumer thread 0..255: which LSE / D value it copies */
    const bool copies = rc < 2 * Br;
    if (steps > 0 && copies) fa3b_row_store<Br>(sm.rows, 0, rc, fa3b_row_load<Br>(p, b, hk, nm, mlo, 0, rc));
    fa3_named_sync<FA3B_ROWS_READY, 256>();

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
        R.full = n0 + Bc <= p.sk && m0 + Br <= p.sq && (p.wl < 0 || n0 >= m0 + Br - 1 + off - p.wl) &&
                 (p.wr < 0 || n0 + Bc - 1 <= m0 + off + p.wr);
        uint32_t pa[Br / 16][4], dsa[Br / 16][4];
        if (p.cap_scale == 0.f) { /* Pᵀ while dPᵀ is still in the tensor cores. dVj += Pᵀ dOi beside dSᵀ as well needs
                                   * over 240 registers at d = 128: ptxas then serialises every wgmma (C7512) */
            fa3_wgmma_wait<1>();
            fa3_fence_regs(st);
            if (R.full) fa3b_p<Br, false>(st, p, R); /* a uniform branch: the mask's arithmetic only where it masks */
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
        fa3_wgmma_fence();
        fa3b_rs<D, Br, F16>(dk, dsa, q_base); /* dKj += dSᵀ Qi */
        fa3_wgmma_commit();

        /* dSᵀ to shared memory (16-byte chunk j % 8 of row r at chunk (j % 8) ^ (r % 8): the swizzle wgmma reads;
         * conflict-free), then dQi = dS Kj, A = dS and B = Kj both MN-major */
        const uint32_t ds_base = fa3_smem(sm.ds[it & 1]);
#pragma unroll
        for (int j = 0; j < Br / 8; j++) {
            const uint32_t r = 64 * cw + 16 * warp + g;
            const uint32_t a0 = ds_base + (j / 8) * Bc * 128 + r * 128 + (((j % 8) ^ g) << 4) + 4 * t;
            const uint32_t *v = dsa[j / 2] + 2 * (j & 1);
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a0), "r"(v[0]) : "memory");
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a0 + 8 * 128), "r"(v[1]) : "memory");
        }
        if (ahead) fa3b_row_store<Br>(sm.rows, it + 1, rc, next_row); /* every read of that buffer was before the last
                                                                        * FA3B_DS_READY */
        fa3_fence_async_smem();
        fa3_named_sync<FA3B_DS_READY, 256>();
        float dq[NQ];
        fa3_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < Bc / 16; kk++) {
            const uint32_t a_off = Br == 128 ? cw * Bc * 128 : 0, b_off = Br == 128 ? 0 : cw * Bc * 128;
            fa_wgmma_sstt<NQN, F16>(dq, fa3_desc(ds_base + a_off + kk * 2048, Bc * 128, 1024),
                                    fa3_desc(k_base + b_off + kk * 2048, Bc * 128, 1024), kk > 0);
        }
        fa3_wgmma_commit();
        fa3_wgmma_wait<0>();
        fa3_fence_regs(dq);
        fa3_fence_regs(dk);
        fa3_fence_regs(dv);
        fa3_fence_regs(pa); /* the RS GEMMs read them until here */
        fa3_fence_regs(dsa);
        fa3_release(fa3_smem(&sm.empty[s]), lane); /* Qi, dOi of this stage are read */

        /* dQi to the writer's buffer: thread ct's registers 4j..4j+3 at float4 j·128 + ct of its warpgroup's half
         * (consecutive threads, consecutive 16 bytes: no bank conflict) */
        fa3_named_sync(FA3B_DQ_EMPTY + cw, 160);
        const uint32_t dq_s = fa3_smem(sm.dq) + ((cw * (NQ / 4) * 128 + ct) << 4);
#pragma unroll
        for (int j = 0; j < NQ / 4; j++) fa3_st_shared4(dq_s + (j << 11), dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
        fa3_fence_async_smem();
        fa3_named_arrive(FA3B_DQ_FULL + cw, 160);
    }

    /* dKj = scale·Σ dSᵀ Q, dVj: 16-bit, straight from the registers (rows past sk are not written) */
    const int64_t kb = (int64_t)b * p.dk_sb + (int64_t)hk * p.dk_sh + 2 * t, vb = (int64_t)b * p.dv_sb + (int64_t)hk * p.dv_sh + 2 * t;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int kr = r ? kr1 : kr0;
        if (kr >= p.sk) continue;
        uint16_t *dkrow = p.dk + kb + (int64_t)kr * p.dk_ss, *dvrow = p.dv + vb + (int64_t)kr * p.dv_ss;
#pragma unroll
        for (int j = 0; j < D / 8; j++) {
            *reinterpret_cast<uint32_t *>(dkrow + 8 * j) =
                fa3_pack<F16>(dk[4 * j + 2 * r] * p.scale, dk[4 * j + 2 * r + 1] * p.scale);
            *reinterpret_cast<uint32_t *>(dvrow + 8 * j) = fa3_pack<F16>(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
        }
    }
}

#endif
