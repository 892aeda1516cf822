/* The FLASH3 backward's dQ path, shared by its two kernels: the consumers hand each step's dQi to the dQ writer warp
 * (fa3b_put_dq), which adds it into the fp32 accumulator in global memory with bulk reduce-adds (fa3b_dq_writer);
 * fused (fa3b_kparams::fuse_dq), the key block that adds last into a query block hands that block to two converter warps
 * (fa3b_dq_converter), which write dQ = scale·accumulator into the caller's layout while the CTA computes on, so
 * that no separate conversion pass reads the accumulator back from memory (flash3_bwd.cu's fa3b_dq does it
 * otherwise). FA3 paper Algorithm 3. */
#ifndef FA_WGMMA_FLASH3_BWD_DQ_CUH
#define FA_WGMMA_FLASH3_BWD_DQ_CUH

#include "flash3_bwd_steps.cuh"

/* dQi (NQ accumulators) to the writer's buffer: thread ct's registers 4j..4j+3 at float4 j·128 + ct of its
 * warpgroup's part, which starts after warpgroup 0's NQ0 · 128 floats (consecutive threads, consecutive 16 bytes:
 * no bank conflict), then handed to the writer. */
template <int NQ, int NQ0 = NQ> FA_DEV void fa3b_put_dq(uint32_t dq_base, const float (&dq)[NQ], int cw, int ct) {
    fa3_named_sync(FA3B_DQ_EMPTY + cw, 160);
    const uint32_t dq_s = dq_base + ((cw * (NQ0 / 4) * 128 + ct) << 4);
#pragma unroll
    for (int j = 0; j < NQ / 4; j++) fa3_st_shared4(dq_s + (j << 11), dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
    fa3_fence_async_smem();
    fa3_named_arrive(FA3B_DQ_FULL + cw, 160);
}

/* Where float4 q4 of a query block's accumulator lands: consumer thread ct's registers 4j..4j+3 (the writer's
 * order, above) are columns col, col + 1 of the block's rows row and row + 8. Warpgroup w's part starts at
 * T::NQ/4 · 128 · w; its columns from c0 (the pair: DQ0 · w), its rows from 64 · w where Br = 128. */
template <int D, int DV> FA_DEV void fa3b_dq_place(int q4, int &row, int &col) {
    using T = fa3b_tile<D, DV>;
    constexpr int Br = T::Br, per_wg = T::NQ / 4 * 128;
    int w, j, c0;
    if constexpr (T::PAIR) w = q4 >= per_wg, j = (q4 - w * per_wg) / 128, c0 = w * T::DQ0;
    else w = q4 / per_wg, j = (q4 % per_wg) / 128, c0 = Br == 128 ? 0 : w * (D / 2);
    const int ct = q4 % 128, lane = ct % 32;
    row = (Br == 128 ? 64 * w : 0) + 16 * (ct / 32) + lane / 4;
    col = c0 + 8 * j + 2 * (lane % 4);
}

/* The writer's hand-offs to the converter warps: a ring of (batch, query head, query block) jobs, each slot behind a
 * full barrier (the writer's lane 0) and an empty one (the converters' 64 threads, once they have read it); a query
 * block < 0 ends the converters' loop. cv_full: a job's accumulator block landed in the converters' staging buffer.
 * Both sides address it from its shared-memory address (the producer warps hold 24 registers). */
enum { FA3B_JOBS = 4, FA3B_CONVERTERS = 64 };
struct fa3b_jobs {
    int4 job[FA3B_JOBS];
    uint64_t full[FA3B_JOBS], empty[FA3B_JOBS], cv_full;
};
FA_DEV void fa3b_jobs_init(uint32_t J) {
    for (int s = 0; s < FA3B_JOBS; s++) {
        fa3_bar_init(J + offsetof(fa3b_jobs, full) + 8 * s, 1);
        fa3_bar_init(J + offsetof(fa3b_jobs, empty) + 8 * s, FA3B_CONVERTERS);
    }
    fa3_bar_init(J + offsetof(fa3b_jobs, cv_full), 1);
}
/* Job n (the writer's count) into its slot once the converters have read the slot's last one. */
FA_DEV void fa3b_post(uint32_t J, int n, int b, int h, int m) {
    const uint32_t s = n % FA3B_JOBS;
    fa3_bar_wait(J + offsetof(fa3b_jobs, empty) + 8 * s, ((n / FA3B_JOBS) & 1) ^ 1);
    asm volatile("st.shared.v4.s32 [%0], {%1, %2, %3, %4};\n" ::"r"(J + 16 * s), "r"(b), "r"(h), "r"(m), "r"(0)
                 : "memory");
    fa3_bar_arrive(J + offsetof(fa3b_jobs, full) + 8 * s);
}

/* Key blocks klo/Bc .. (khi − 1)/Bc see query block m: [klo, khi) are its rows' visible keys (p: the CTA's
 * sequence). */
template <int Br> FA_DEV void fa3b_block_keys(const fa3b_kparams &p, int m, int &klo, int &khi) {
    const int m0 = m * Br;
    fa_visible_block32(m0, m0 + Br < p.sq ? m0 + Br : p.sq, p.sq, p.sk, p.wl, p.wr, &klo, &khi);
}

/* The dQ writer (one warp; lane 0 issues): per step, each warpgroup's part of dQi is one bulk reduce-add into the
 * accumulator, and the buffer is handed back once the copy has read it. Its first hand-back is before the first
 * step, and none after the last, so every barrier phase completes.
 * Each query block m gets one add from each key block that sees it: key blocks klo/Bc .. (khi − 1)/Bc of the rows'
 * visible keys [klo, khi). Deterministic: they add in descending order, each waiting for its turn on the block's
 * counter, so the last is key block klo/Bc. Fused (not deterministic): each counts its add, once complete in global
 * memory, on the block's counter, and the one that counts last has the whole sum. Fused, the last hands the block to
 * the converters. */
template <int D, bool DET, int DV = D>
FA_DEV void fa3b_dq_writer(const fa3b_kparams &p, uint32_t src, uint32_t J, int b, int hk, int nb, int nm, int mlo,
                           int steps) {
    using T = fa3b_tile<D, DV>;
    constexpr int Br = T::Br, Bc = T::Bc;
    constexpr uint32_t HALF = T::NQ * 128, REST = Br * D - HALF; /* floats of warpgroup 0, 1 */
    const bool lead = threadIdx.x % 32 == 0;
    if (steps > 0) {
        fa3_named_arrive<FA3B_DQ_EMPTY, 160>();
        fa3_named_arrive<FA3B_DQ_EMPTY + 1, 160>();
    }
    /* (batch, head, query block): the accumulator's block and its counter. Few registers live across the steps
     * (the producer's 24): the rest is recomputed where used. */
    int64_t chunk = (int64_t)(b * p.hq + hk * p.group) * p.nmb + mlo;
    int m = mlo, left = nm, jobs = 0; /* query block m of the current head; blocks left in it */
    for (int it = 0; it < steps; it++) {
        if (DET && lead) { /* descending, the order in which a mask's diagonal brings the key blocks to query block m
                            * (the last key block sees it first): this one's turn is its rank from the last */
            int klo, khi;
            fa3b_block_keys<Br>(p, m, klo, khi);
            while (fa3_ld_acquire(p.turns + chunk) != (khi - 1) / Bc - nb) {
            }
        }
        float *dst = p.dq_acc + chunk * (Br * D);
        __syncwarp(); /* bar.sync is warp-aligned: the lanes meet before each barrier */
        fa3_named_sync<FA3B_DQ_FULL, 160>();
        if (lead) fa3_bulk_add_f32(dst, src, HALF * 4), fa3_bulk_commit();
        __syncwarp();
        fa3_named_sync<FA3B_DQ_FULL + 1, 160>();
        if (lead) {
            fa3_bulk_add_f32(dst + HALF, src + HALF * 4, REST * 4), fa3_bulk_commit();
            if (DET) { /* the adds are done in global memory before the next key block's turn */
                fa3_bulk_wait<0>();
                fa3_fence_async_global();
                __threadfence();
                atomicAdd(p.turns + chunk, 1);
                if (T::FUSE && p.fuse_dq) {
                    int klo, khi;
                    fa3b_block_keys<Br>(p, m, klo, khi);
                    if (nb == klo / Bc) fa3b_post(J, jobs++, b, hk * p.group + it / nm, m); /* the last add */
                }
            } else {
                fa3_bulk_wait_read<0>();
            }
        }
        __syncwarp();
        if (it + 1 < steps) {
            fa3_named_arrive<FA3B_DQ_EMPTY, 160>();
            fa3_named_arrive<FA3B_DQ_EMPTY + 1, 160>();
        }
        if (!DET && T::FUSE && p.fuse_dq && lead) { /* counted once the adds are complete, after the buffer went back */
            fa3_bulk_wait<0>();
            fa3_fence_async_global();
            __threadfence();
            const int counted = atomicAdd(p.turns + chunk, 1);
            int klo, khi;
            fa3b_block_keys<Br>(p, m, klo, khi);
            if (counted == (khi - 1) / Bc - klo / Bc) { /* the last add */
                __threadfence(); /* every other key block's adds are visible before the block is read */
                fa3b_post(J, jobs++, b, hk * p.group + it / nm, m);
            }
        }
        chunk++, m++; /* the next block, or the next head's first (nmb − nm blocks on) */
        if (--left == 0) chunk += p.nmb - nm, m = mlo, left = nm;
    }
    if (lead) {
        fa3_bulk_wait<0>();
        if (T::FUSE && p.fuse_dq) fa3b_post(J, jobs, 0, 0, -1);
    }
}

/* The converter warps (fused; T::FUSE, the tiles with room for the staging buffer cv): per job, the query block's
 * accumulator in FA3B_CV_PARTS parts, each one bulk copy into cv (from L2: the key blocks' adds have just written
 * it), then dQ = scale·cv in the caller's layout (rows past the sequence's end are not written). They run in the
 * producer's 24 registers: the copy, not loads, keeps the bytes in flight; addresses are 32-bit offsets from the
 * kernel's parameters pk (constant bank; the host fuses only where every offset fits: fa3b_run), the CTA's own p
 * read for its sequence's rows alone. */
enum { FA3B_CV_PARTS = 2 }; /* a whole block's 32 KB beside the d = 64 tiles is over 227 KB */
template <int D, bool F16, bool VARLEN>
FA_DEV void fa3b_dq_converter(const fa3b_kparams &pk, const fa3b_kparams &p, uint32_t J, uint32_t cv) {
    using T = fa3b_tile<D>;
    constexpr int Br = T::Br, N4 = Br * D / 4 / FA3B_CV_PARTS; /* float4s of a part */
    static_assert(T::FUSE && T::NQ / 4 * 128 == N4, "the staging buffer; a part is one warpgroup's registers");
    static_assert(FA3B_CV_PARTS % 2 == 0, "each job completes cv_full's phases in pairs: part p waits on parity p & 1");
    if (!pk.fuse_dq) return;
    const int x0 = threadIdx.x % FA3B_CONVERTERS; /* warps 2 and 3 */
    for (int n = 0;; n++) {
        const uint32_t s = n % FA3B_JOBS;
        fa3_bar_wait(J + offsetof(fa3b_jobs, full) + 8 * s, (n / FA3B_JOBS) & 1);
        int b, h, m, unused;
        asm volatile("ld.shared.v4.s32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(b), "=r"(h), "=r"(m), "=r"(unused)
                     : "r"(J + 16 * s)
                     : "memory");
        fa3_bar_arrive(J + offsetof(fa3b_jobs, empty) + 8 * s);
        if (m < 0) return;
        const int ss = (int)pk.dq_ss, rows = p.sq - m * Br;
        const int acc = ((b * pk.hq + h) * pk.nmb + m) * (Br * D);
        const int dq = (VARLEN ? p.qrow * ss : b * (int)pk.dq_sb) + h * (int)pk.dq_sh + m * Br * ss;
#pragma unroll 1
        for (int part = 0; part < FA3B_CV_PARTS; part++) {
            if (x0 == 0) {
                if (part == 0) {
                    __threadfence();          /* the adds the writer's counter saw complete ... */
                    fa3_fence_async_global(); /* ... are what the async proxy's copy reads */
                }
                fa3_fence_async_smem(); /* cv's reads of the last part come before the copy's writes */
                fa3_bar_expect_tx(J + offsetof(fa3b_jobs, cv_full), N4 * 16);
                fa3_bulk_load(cv, pk.dq_acc + acc + part * N4 * 4, N4 * 16, J + offsetof(fa3b_jobs, cv_full));
            }
            fa3_bar_wait(J + offsetof(fa3b_jobs, cv_full), part & 1);
#pragma unroll 1
            for (int x = x0; x < N4; x += FA3B_CONVERTERS) {
                const float4 a = fa3_ld_shared4(cv + 16 * x);
                int row, col;
                fa3b_dq_place<D, D>(part * N4 + x, row, col);
                const int o = dq + row * ss + col;
                if (row < rows) *(uint32_t *)(pk.dq + o) = fa3_pack<F16>(a.x * pk.scale, a.y * pk.scale);
                if (row + 8 < rows) *(uint32_t *)(pk.dq + o + 8 * ss) = fa3_pack<F16>(a.z * pk.scale, a.w * pk.scale);
            }
            fa3_named_sync<FA3B_CV_READ, FA3B_CONVERTERS>(); /* cv is read: the next copy may land */
        }
    }
}

#endif
