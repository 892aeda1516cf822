/* The FLASH3 backward's steps, shared by its two kernels (flash3_bwd.cuh: d = 64, 128; flash3_bwd_wide.cuh:
 * d = 256): the tile, the kernel parameters, the elementwise Pᵀ and dSᵀ, the LSE / D rows copied a step ahead, the
 * dQ writer warp, and the stores of dSᵀ, dQi and dK, dV. FA3 paper Algorithm 3. */
#ifndef FA_WGMMA_FLASH3_BWD_STEPS_CUH
#define FA_WGMMA_FLASH3_BWD_STEPS_CUH

#include "../../core/visible.h"
#include "../packed.cuh"
#include "frag.cuh"
#include "ptx.cuh"
#include "tiles.h"
#include "wgmma.cuh"

/* Tiles (tiles.h has the rows): Bc keys per CTA, Br query rows per step, ST stages of Qi and dOi.
 *   d = 64, 128: Bc = 128, 64 keys per consumer warpgroup (flash3_bwd.cuh);
 *   d = 256: Bc = 64, both warpgroups on the same keys, each with half of the step's query rows in Sᵀ and dPᵀ and
 *     half of the D columns of dK, dV and dQi (flash3_bwd_wide.cuh): 64 x 128 accumulators each, where 64 x 256
 *     would not fit in registers;
 *   (D, DV) = (192, 128), v with a head dim of its own (PAIR): the d = 256 kernel's tile with the columns split at
 *     64-column panels, DQ0 of dK and dQi to warpgroup 0, the rest of them and dV to warpgroup 1 (flash3_bwd_wide.cuh).
 * dQi's GEMM is split between the warpgroups by rows (Br = 128: 64 query rows each) or by columns (Br = 64: D/2
 * columns each, the pair DQ0 and D − DQ0); NQ is its accumulators per thread (the pair: warpgroup 0's). */
template <int D, int DV = D> struct fa3b_tile {
    static constexpr bool PAIR = DV != D;
    static constexpr int DQ0 = PAIR ? 128 : D / 2; /* the pair: dK and dQ columns of warpgroup 0 */
    static constexpr bool WIDE = D == 256 || PAIR;
    static constexpr int Br = D == 64 ? 128 : 64;
    static constexpr int Bc = WIDE ? 64 : 128;
    static constexpr int ST = WIDE ? 1 : 2;
    static constexpr int THREADS = 384;
    static constexpr bool FUSE = fa3_bwd_fuses_dq(D, DV); /* dQ converted in the main kernel (tiles.h) */
    static_assert(!FUSE || !WIDE, "the staging buffer sits beside the d = 64, 128 tiles only");
    static constexpr int NQ = PAIR ? Br * DQ0 / 128 : Br * D / 256;
    static constexpr int NQN = Br == 128 ? D : PAIR ? DQ0 : D / 2; /* N of the dQ GEMM (the pair: warpgroup 0's) */
};

/* A step's LSE·log2e and D, two steps' worth: the consumers copy step it + 1's in while step it reads its own. */
template <int Br> struct fa3b_shared_rows {
    float lse2[2][Br], dsum[2][Br];
};
/* Named barriers (0 is __syncthreads): dSᵀ written and a step's LSE / D copied (the 256 consumer threads); a
 * warpgroup's dQ buffer free and full (its 128 threads and the dQ writer warp: 160); the converters' staging buffer
 * read (their 64 threads, flash3_bwd_dq.cuh). */
enum { FA3B_DS_READY = 1, FA3B_ROWS_READY = 2, FA3B_DQ_EMPTY = 3, FA3B_DQ_FULL = 5, FA3B_CV_READ = 7 };

struct fa3b_kparams {
    uint16_t *dk, *dv;
    int64_t dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh;
    const float *lse2, *dsum; /* [batch][hq][nmb·Br]: LSE·log2e (+inf past sq: P = 0), D (0 past sq); 8-byte pairs */
    float *dq_acc;            /* [batch][hq][nmb][Br·D] in accumulator order, zeroed */
    int *turns;               /* deterministic or fused: [batch][hq][nmb] zeroed counters of dQ's adds; else NULL */
    int sq, sk, hq, group, wl, wr, nmb;
    float scale, scale_log2; /* scale_log2 = log2 e with softcap (the scale is inside the cap) */
    float cap, cap_scale;    /* softcap: score = cap·tanh(s·cap_scale); cap_scale 0 = off */
    const int *cu_q, *cu_k;  /* varlen: the caller's device cu_seqlens (read clamped), else NULL */
    const int *used_q, *used_k; /* varlen: opts.seqused_q/k (device), else NULL: a sequence's used rows */
    int total_q, total_k;    /* varlen: the packed tensors' rows */
    int qrow, krow;          /* varlen, in a CTA's copy (fa3b_seq_of): its sequence's first rows; else 0 */
    /* last: the fields above keep their offsets (moved, the d = 64 kernels' registers spilled) */
    uint16_t *dq;            /* fused (fuse_dq): dQ, the caller's, written by the converter warps (flash3_bwd_dq.cuh) */
    int64_t dq_sb, dq_ss, dq_sh;
    int fuse_dq;             /* 1: the last key block of a query block converts it; 0: flash3_bwd.cu's fa3b_dq */
};

/* A CTA's parameters. Varlen: its sequence's (blockIdx.z's) lengths as sq, sk (bounded by the grid's, max_seqlen_q/k,
 * and clamped into the packed tensors, as the forward; with seqused its used rows) and its first rows; the tensors are one packed batch. Fixed
 * lengths: the parameters as they are. */
template <bool VARLEN> FA_DEV const fa3b_kparams &fa3b_seq_of(const fa3b_kparams &p, fa3b_kparams &s) {
    if constexpr (!VARLEN) {
        return p;
    } else {
        s = p;
        const int b = blockIdx.z;
        s.sq = fa_packed_seq(p.cu_q, p.used_q, b, p.total_q, p.sq, &s.qrow);
        s.sk = fa_packed_seq(p.cu_k, p.used_k, b, p.total_k, p.sk, &s.krow);
        return s;
    }
}
/* The parameters the kernel reads after its start: its own (fixed lengths) or, varlen, the CTA's copy in shared
 * memory (kp, written by thread 0 before the first __syncthreads): read where used, as parameters are — held in
 * registers, a copy spilled at d = 64 and 128. */
template <bool VARLEN> FA_DEV const fa3b_kparams &fa3b_params(const fa3b_kparams &p, const fa3b_kparams &kp) {
    if constexpr (VARLEN) return kp;
    else return p;
}

/* One TMA box of BOX rows of head h: fixed lengths, rows r.. of batch b; varlen (a ragged map, tensor_map.h), packed
 * rows r.. of which left are the sequence's (the rest zeros, never the next sequence's rows). */
template <int BOX, bool VARLEN>
FA_DEV void fa3b_box(uint32_t dst, const CUtensorMap *m, uint32_t bar, int c, int r, int h, int b, int left) {
    if constexpr (VARLEN) {
        const int v = left < BOX ? left : BOX;
        fa3_tma_load4(dst, m, bar, c, BOX - v, h, r + v);
    } else {
        fa3_tma_load4(dst, m, bar, c, r, h, b);
    }
}

/* A CTA's walk: key block nb (deterministic: the grid reversed, so that the key blocks start last to first — the
 * order in which they add dQ (fa3b_dq_writer): a CTA then only ever waits for one that started before it, and a
 * block waiting for one not yet resident would hang), its keys [n0, n1), the query blocks mlo .. mlo + nm − 1 of
 * each query head that see them, and its steps (nm per query head of the group). */
struct fa3b_walk {
    int nb, n0, mlo, nm, steps;
};
template <int Br, int Bc, bool DET> FA_DEV fa3b_walk fa3b_walk_of(const fa3b_kparams &p) {
    fa3b_walk w;
    w.nb = DET ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    w.n0 = w.nb * Bc;
    const int n1 = w.n0 + Bc < p.sk ? w.n0 + Bc : p.sk;
    int qlo, qhi;
    fa_visible_queries32(w.n0, n1, p.sq, p.sk, p.wl, p.wr, &qlo, &qhi);
    w.mlo = qlo / Br;
    w.nm = qhi > qlo ? (qhi + Br - 1) / Br - w.mlo : 0;
    w.steps = w.nm * p.group;
    return w;
}

/* The producer thread's first loads: the four tensor maps prefetched, then Kj and Vj (D/64 and DV/64 panels of Bc
 * rows each) on one barrier. */
template <int D, int Bc, bool VARLEN, int DV = D>
FA_DEV void fa3b_load_kv(const CUtensorMap *tq, const CUtensorMap *tk, const CUtensorMap *tv, const CUtensorMap *tdo,
                         uint32_t k, uint32_t v, uint32_t full_kv, int n0, int hk, int b, const fa3b_kparams &p) {
    fa3_prefetch_map(tq);
    fa3_prefetch_map(tk);
    fa3_prefetch_map(tv);
    fa3_prefetch_map(tdo);
    fa3_bar_expect_tx(full_kv, Bc * (D + DV) * 2);
#pragma unroll
    for (int c = 0; c < (D > DV ? D : DV) / 64; c++) {
        if (c < D / 64)
            fa3b_box<Bc, VARLEN>(k + c * Bc * 128, tk, full_kv, 64 * c, VARLEN ? p.krow + n0 : n0, hk, b, p.sk - n0);
        if (c < DV / 64)
            fa3b_box<Bc, VARLEN>(v + c * Bc * 128, tv, full_kv, 64 * c, VARLEN ? p.krow + n0 : n0, hk, b, p.sk - n0);
    }
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
template <int Br, bool MASK>
FA_DEV void fa3b_p(float (&st)[Br / 2], const fa3b_kparams &p, const fa3b_rows &R) {
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

/* The consumers' start: K and V have landed, and the first step's LSE / D rows are in shared memory (consumer thread rc
 * copies value rc) and visible to both warpgroups. Returns rc; threads with rc < 2·Br copy the next steps' rows too. */
template <int Br, class SM>
FA_DEV int fa3b_rows_first(SM &sm, const fa3b_kparams &p, int b, int hk, int nm, int mlo, int steps) {
    fa3_bar_wait(fa3_smem(&sm.full_kv), 0); /* also when there is no step: no TMA may land after the CTA exits */
    const int rc = threadIdx.x - 128;
    if (steps > 0 && rc < 2 * Br) fa3b_row_store<Br>(sm.rows, 0, rc, fa3b_row_load<Br>(p, b, hk, nm, mlo, 0, rc));
    fa3_named_sync<FA3B_ROWS_READY, 256>();
    return rc;
}

/* dKj = scale·Σ dSᵀ Q and dVj, 16-bit, straight from the accumulators: register 4j + 2r + e is key row kr0 + 8r,
 * column c0 + 8j + 2t + e (rows past sk are not written; varlen: rows of the sequence, from its first packed row). */
template <int N, bool F16, bool VARLEN>
FA_DEV void fa3b_store_dkv(const fa3b_kparams &p, const float (&dk)[N / 2], const float (&dv)[N / 2], int b, int hk,
                           int kr0, int c0) {
    const int t = threadIdx.x % 4;
    int64_t kb = (int64_t)b * p.dk_sb + (int64_t)hk * p.dk_sh + c0 + 2 * t;
    int64_t vb = (int64_t)b * p.dv_sb + (int64_t)hk * p.dv_sh + c0 + 2 * t;
    if constexpr (VARLEN) { /* one packed batch: from the sequence's first key row instead */
        const int64_t k0 = p.krow;
        kb += k0 * p.dk_ss - (int64_t)b * p.dk_sb, vb += k0 * p.dv_ss - (int64_t)b * p.dv_sb;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int kr = kr0 + 8 * r;
        if (kr >= p.sk) continue;
        uint16_t *dkrow = p.dk + kb + (int64_t)kr * p.dk_ss, *dvrow = p.dv + vb + (int64_t)kr * p.dv_ss;
#pragma unroll
        for (int j = 0; j < N / 8; j++) {
            *reinterpret_cast<uint32_t *>(dkrow + 8 * j) =
                fa3_pack<F16>(dk[4 * j + 2 * r] * p.scale, dk[4 * j + 2 * r + 1] * p.scale);
            *reinterpret_cast<uint32_t *>(dvrow + 8 * j) = fa3_pack<F16>(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
        }
    }
}

/* One of them alone, for the pair's split (a warpgroup's dK and dV columns differ there): acc·scale into dst (strides
 * sb, ss, sh) in the same order. */
template <int N, bool F16, bool VARLEN>
FA_DEV void fa3b_store_one(const fa3b_kparams &p, uint16_t *dst, int64_t sb, int64_t ss, int64_t sh,
                           const float (&acc)[N / 2], float scale, int b, int hk, int kr0, int c0) {
    int64_t base = (int64_t)b * sb + (int64_t)hk * sh + c0 + 2 * (threadIdx.x % 4);
    if constexpr (VARLEN) base += (int64_t)p.krow * ss - (int64_t)b * sb;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int kr = kr0 + 8 * r;
        if (kr >= p.sk) continue;
        uint16_t *row = dst + base + (int64_t)kr * ss;
#pragma unroll
        for (int j = 0; j < N / 8; j++)
            *reinterpret_cast<uint32_t *>(row + 8 * j) =
                fa3_pack<F16>(acc[4 * j + 2 * r] * scale, acc[4 * j + 2 * r + 1] * scale);
    }
}

/* dSᵀ or Pᵀ (packed A fragments of 64 keys x 8·NJ queries from query column 8·j0) to a [key][query] tile of 64-query
 * panels in the 128-byte swizzle wgmma reads: 16-byte chunk j % 8 of row r at chunk (j % 8) ^ (r % 8) — conflict-free. */
template <int NJ>
FA_DEV void fa3b_store_kq(uint32_t base, const uint32_t (&a)[NJ / 2][4], int rows, int r, int j0) {
    const int g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
#pragma unroll
    for (int jj = 0; jj < NJ; jj++) {
        const int j = j0 + jj;
        const uint32_t a0 = base + (j / 8) * rows * 128 + r * 128 + (((j % 8) ^ g) << 4) + 4 * t;
        const uint32_t *v = a[jj / 2] + 2 * (jj & 1);
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a0), "r"(v[0]) : "memory");
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a0 + 8 * 128), "r"(v[1]) : "memory");
    }
}

#endif
