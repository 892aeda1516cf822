/* FLASH3 forward kernel (sm_90a). A persistent grid, one CTA per SM; a tile = Br = 128 query rows of one
 * (batch, head):
 *   warpgroup 0, the producer, gives its registers away (setmaxnreg 24); one thread issues the TMA loads of Qi and,
 *     key block after key block (last to first), of Kj and Vj into ST shared-memory stages, each guarded by a full
 *     barrier (TMA bytes landed) and an empty barrier (every consumer warp has finished reading it);
 *   warpgroups 1 and 2, the consumers (setmaxnreg 240), own 64 rows each: S = Qi Kjᵀ by wgmma with both operands
 *     in shared memory, online softmax in fp32 (exp2, the scale folded in with log2 e), O += P Vj by wgmma with P
 *     straight from the S registers (the accumulator layout is the A-operand layout for 16-bit types).
 * Shared tiles are 64-column panels of rows x 128 B in the 128-byte swizzle TMA writes; README.md beside this file
 * has the layouts, the pipeline and the schedules. */
#ifndef FA_WGMMA_FLASH3_FWD_CUH
#define FA_WGMMA_FLASH3_FWD_CUH

#include <float.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../../core/sink.h"
#include "../../core/visible.h"
#include "../contract.h"
#include "../packed.cuh"
#include "flash3_fp8.cuh"
#include "frag.cuh"
#include "ptx.cuh"
#include "tiles.h"
#include "wgmma.cuh"

/* Tiles: Br = 64·NW query rows (NW consumer warpgroups x 64, wgmma M = 64), Bc keys per block, ST K/V stages.
 * Bc keeps S (Bc/2) + O (D/2) + P (Bc/4) registers per thread under the consumers' setmaxnreg and the stages in
 * 227 KB. WIDE is the row's larger tile: FA3's key blocks at d = 128 and 256 (176, 80); at d = 64 three consumer
 * warpgroups (Br = 192, FA3's) at 160 registers, where P stays in registers up to 128 keys. F8 (e4m3 inputs):
 * Bc = 128 (one 128-byte panel of Vᵀ's keys) or WIDE 192 (S, O and P in 184 registers; FA3's 224 spills here); 96
 * at d = 256 (188; 128 spills). DP: a row's 16-bit columns, d/2 for e4m3 (its tiles are laid out as 16-bit ones of
 * half the columns: the same bytes, panels and swizzle). */
template <int D, bool WIDE, bool F8 = false, int DV = D> struct fa3_tile {
    static constexpr int NW = D == 64 && WIDE && !F8 ? 3 : 2; /* consumer warpgroups, 64 query rows each */
    static constexpr int Br = 64 * NW;
    static constexpr int Bc = F8 ? (D == 256 ? 96 : WIDE ? 192 : 128)
                                 : WIDE ? (D == 64 ? 128 : D == 128 ? 176 : 80) : (D == 256 ? 64 : 128);
    static constexpr int ST = 2;
    static constexpr int THREADS = 128 * (NW + 1);
    static constexpr int DP = F8 ? D / 2 : D;
    /* a V stage in 16-bit words: F8 holds whole 128-key panels of Vᵀ (D rows each; keys past Bc are loaded, unused);
     * DV: v's head dim (MLA's pairs, 16-bit only) */
    static_assert(DV == D || (!F8 && DV % 64 == 0 && DV < D), "a V head dim of its own: 16-bit, 64-column panels");
    static constexpr int VS = F8 ? D * ((Bc + 127) / 128) * 64 : Bc * DV;
    /* Q buffers: two where they fit in 227 KB beside the K/V stages (+ 1024 B of barriers and 1024 of alignment
     * slack), so that the producer loads the next tile's Q while the consumers still read this one's (README.md):
     * d = 64 and 128 with 128 keys (H200, bf16: causal 512-2k 1.03-1.09x, long sequences even); one at d = 128 x 176
     * and d = 256 (no room), at d = 64 192 x 128 (two, at 112 keys, were 0.95-0.99x from 4k keys on) and on the
     * e4m3 rows (not measured with two). */
    static constexpr int Q_BYTES = Br * DP * 2, KV_BYTES = ST * (Bc * DP + VS) * 2;
    static constexpr int QB =
        FA3_FWD_Q_BUFFERS > 1 && NW == 2 && !F8 && 2 * Q_BYTES + KV_BYTES + 2048 <= 232448 ? 2 : 1;
    /* setmaxnreg moves registers only within the CTA's launch allocation: per thread, 65536 / THREADS rounded down to
     * 8 (what ptxas gives under __launch_bounds__(THREADS, 1): 168 at 384 threads, 128 at 512). A request above it
     * never completes: with 32 + 2 x 240 > 3 x 168 the consumers' setmaxnreg.inc waited forever (FA3's 24 / 240 and
     * 32 / 160 fill it exactly) */
    static constexpr int LAUNCH_REGS = 65536 / THREADS / 8 * 8;
    /* two Q buffers: the producer holds the next tile through this one's loads (24 spilled 8 bytes there), so 32,
     * and two consumer warpgroups 232 */
    static constexpr int PRODUCER_REGS = QB == 2 ? 32 : 24;
    static constexpr int CONSUMER_REGS = NW == 3 ? 160 : QB == 2 ? 232 : 240;
    static_assert(PRODUCER_REGS + NW * CONSUMER_REGS <= (NW + 1) * LAUNCH_REGS, "the CTA's launch registers");
};

template <int D, bool WIDE, bool F8 = false, int DV = D> struct alignas(1024) fa3_shared {
    using T = fa3_tile<D, WIDE, F8, DV>;
    uint16_t q[T::QB][T::Br * T::DP]; /* Q phase qi in slot qi % QB */
    uint16_t k[T::ST][T::Bc * T::DP];
    uint16_t v[T::ST][T::VS]; /* F8: Vᵀ, panels of D rows x 128 keys */
    uint64_t full_q[T::QB], empty_q[T::QB];
    uint64_t full_k[T::ST], full_v[T::ST];
    uint64_t empty_k[T::ST], empty_v[T::ST];
    /* the tile of a slot's Q phase, written by the producer before it arrives on the slot's full_q. Ordered by
     * full_q and empty_q, and accessed with shared-memory atomics: racecheck does not model mbarrier ordering and
     * took plain accesses to it for races (README.md) */
    int tile[T::QB];
};

struct fa3_kparams {
    uint16_t *o;
    float *lse;
    int64_t o_batch_stride, o_row_stride, o_head_stride;
    int sq, sk, hq, group, wl, wr; /* varlen: sq, sk are the bounds the grid is sized for (max_seqlen_q/k) */
    int chunk;                     /* attention_chunk (core/visible.h), 0 = off: narrows each row's keys per tile */
    const int *cu_q, *cu_k;        /* varlen: the caller's device cu_seqlens (read clamped), else NULL */
    const int *used_q, *used_k;    /* varlen: opts.seqused_q/k (device), else NULL: a sequence's used rows */
    int total_q, total_k;          /* rows of the packed tensors */
    int nmb, ntiles; /* query blocks per head; tiles = nmb * heads_q * batch */
    int bh;          /* heads_q * batch */
    int sec_heads;   /* > 0: longest-first order inside sections of this many (batch, head)s; 0: query block fastest */
    int mb_up;       /* with sec_heads: 1 = query blocks in ascending order (the low ones see the most keys) */
    int *counter;    /* NULL: the static snake; else a zeroed int, the dynamic scheduler's next tile - gridDim.x */
    int q_ahead;     /* two Q buffers (fa3_tile::QB): 1 = the next tile's Q loads while this one's last S GEMMs run;
                      * 0 (A/B runs) = only after them, as with one buffer */
    int early;       /* 1: the producer takes tile t + 1's index as soon as tile t's Q load is issued */
    float scale, scale_log2; /* LSE = m·scale + ln ℓ; P = exp2(S·scale_log2 − m·scale_log2) */
    float cap, cap_scale;    /* softcap: S = cap·tanh(s·cap_scale) first (cap_scale = scale / cap; 0 = off), then
                              * scale = 1 and scale_log2 = log2 e */
    unsigned *check;         /* the numerics contract's item flags (fa_cuda_params.o_check), or NULL */
    const float *sinks;      /* opts.sinks [hq], or NULL: joined in the epilogue (core/sink.h) */
    const float *qd, *kd, *vd; /* F8: descales [batch][hk] (NULL = 1): S by qd·kd, O by vd */
    int hk;
};

/* Per-thread softmax state of the two rows a consumer thread owns (g and g + 8 of its warp's 16 rows). */
struct fa3_rows {
    int lo0, hi0, lo1, hi1;
    float sl2, m0, m1, l0, l1;
    float cap_scale; /* softcap (0: off; cap itself is read from the kernel's parameters) */
    float amax;           /* max |logit| before the softcap and the mask, over the blocks the tile tests: not finite
                           * when q or k holds an inf or NaN there */
    int n_test;           /* the tile tests the logits of key blocks from key n_test on (set with the tile), all with
                           * a softcap */
};

/* Issues O += P Vj (no wait): V is [key][d], MN-major here; a k16 slice is 16 key rows = 2048 B further. F8: Vjᵀ
 * [d][key] is K-major, 128 keys a panel of D rows; a k32 slice is 32 B further (flash3_fp8.cuh). */
template <int D, int Bc, bool F16, bool F8 = false>
FA_DEV void fa3_pv(float (&o)[D / 2], const uint32_t (&pa)[Bc / (F8 ? 32 : 16)][4], uint32_t v_base) {
    fa3_wgmma_fence();
    if constexpr (F8) {
        const fa3_operand V(v_base, 16, 1024);
#pragma unroll
        for (int kk = 0; kk < Bc / 32; kk++) fa_wgmma_rs8<D>(o, pa[kk], V.at((kk / 4) * D * 128 + (kk % 4) * 32), 1);
    } else {
        const fa3_operand V(v_base, Bc * 128, 1024);
#pragma unroll
        for (int kk = 0; kk < Bc / 16; kk++) fa_wgmma_rs<D, F16>(o, pa[kk], V.at(kk * 2048), 1);
    }
    fa3_wgmma_commit();
}

/* Mask, then the online-softmax step on S (in place to P, fp32): m_new = max(m, rowmax S); P = exp2(S·scale·log2e −
 * m_new·scale·log2e); l = l·corr + rowsum P (thread-local); corr = exp2((m − m_new)·scale·log2e) is returned for O. */
template <int Bc, bool F8>
FA_DEV void fa3_softmax(float (&sacc)[Bc / 2], int kbase, fa3_rows &R, float cap, float &c0, float &c1) {
    constexpr float p_log2 = F8 ? 8.f : 0.f; /* P = 2^p_log2 at the row's max: e4m3's normal range starts at 2^-6, so
                                              * P up to 256 (FA3's max offset) keeps weights down to 2^-17 normal */
    /* the contract's logit test (contract.h): a −inf logit is a weight of 0 and a softcap makes ±inf finite, so an
     * inf in q or k can hide from the outputs; two chains keep it off the critical path */
    if (kbase >= R.n_test) {
        float a0 = R.amax, a1 = 0.f;
#pragma unroll
        for (int i = 0; i < Bc / 2; i += 2) {
            a0 = fa3_max_nan(a0, fabsf(sacc[i]));
            a1 = fa3_max_nan(a1, fabsf(sacc[i + 1]));
        }
        R.amax = fa3_max_nan(a0, a1);
    }
    if (R.cap_scale != 0.f) { /* softcap: a uniform branch, the scores bounded by ±cap before the mask */
#pragma unroll
        for (int i = 0; i < Bc / 2; i++) sacc[i] = cap * tanhf(sacc[i] * R.cap_scale);
    }
    if (kbase < R.lo1 || kbase + Bc > R.hi0) { /* only blocks that cross a row's visible range [lo, hi) */
#pragma unroll
        for (int j = 0; j < Bc / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int col = kbase + 8 * j + 2 * (int)(threadIdx.x % 4) + e;
                if (col < R.lo0 || col >= R.hi0) sacc[4 * j + e] = -INFINITY;
                if (col < R.lo1 || col >= R.hi1) sacc[4 * j + 2 + e] = -INFINITY;
            }
    }
    float mx0 = R.m0, mx1 = R.m1;
#pragma unroll
    for (int j = 0; j < Bc / 8; j++) {
        mx0 = fmaxf(mx0, fmaxf(sacc[4 * j], sacc[4 * j + 1]));
        mx1 = fmaxf(mx1, fmaxf(sacc[4 * j + 2], sacc[4 * j + 3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    /* a row that has seen no key yet keeps max −inf: subtract 0 instead, so that exp2 gives 0, never NaN */
    const float mu0 = mx0 == -INFINITY ? 0.f : mx0, mu1 = mx1 == -INFINITY ? 0.f : mx1;
    c0 = fa3_ex2((R.m0 - mu0) * R.sl2);
    c1 = fa3_ex2((R.m1 - mu1) * R.sl2);
    R.m0 = mx0;
    R.m1 = mx1;
    const float ms0 = mu0 * R.sl2 - p_log2, ms1 = mu1 * R.sl2 - p_log2;
    float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
    for (int j = 0; j < Bc / 8; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) sacc[4 * j + e] = fa3_ex2(fmaf(sacc[4 * j + e], R.sl2, e < 2 ? -ms0 : -ms1));
        ps0 += sacc[4 * j] + sacc[4 * j + 1];
        ps1 += sacc[4 * j + 2] + sacc[4 * j + 3];
    }
    R.l0 = R.l0 * c0 + ps0;
    R.l1 = R.l1 * c1 + ps1;
}

/* Two 16-bit values of out as stored: adding one exponent ulp to the exponent field carries into bit 15 only for an
 * all-ones exponent (inf, NaN); OR over the words, then bits 15 and 31 say whether any value is not finite. */
template <bool F16> FA_DEV uint32_t fa3_exp_carry(uint32_t x) {
    return F16 ? (x & 0x7c007c00u) + 0x04000400u : (x & 0x7f807f80u) + 0x00800080u;
}

/* P into the PV GEMM's A fragments: 16-bit pairs, or e4m3 in fa3_key_slot order (flash3_fp8.cuh). */
template <int Bc, bool F16, bool F8>
FA_DEV void fa3_pack_p(uint32_t (&pa)[Bc / (F8 ? 32 : 16)][4], const float (&sacc)[Bc / 2]) {
    if constexpr (F8)
        fa3_pack_a8<Bc>(pa, sacc);
    else
        fa3_pack_a<Bc, F16>(pa, sacc);
}

template <int D> FA_DEV void fa3_rescale(float (&o)[D / 2], float c0, float c1) {
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
        o[4 * j] *= c0;
        o[4 * j + 1] *= c0;
        o[4 * j + 2] *= c1;
        o[4 * j + 3] *= c1;
    }
}

/* The work of one tile: query rows [m0, m0 + Br) of head h of batch b, key blocks n_hi - nblk .. n_hi - 1.
 * Two orders (the plan picks, README.md):
 *   - unmasked (every tile the same work): query block fastest, the last block of a head first; the persistent
 *     grid takes them in waves of gridDim.x, CTA c slot c of even waves and gridDim.x - 1 - c of odd ones (snake),
 *     and heads stay in order so that the K/V a wave reads are few heads (L2);
 *   - masked (causal, windows: tiles differ in work): longest first inside sections of sec_heads (batch, head)s
 *     whose K/V fit in L2 — query block outer (the longest first), head inner — handed out by an atomic counter, so
 *     that a CTA that finishes early takes the next tile and the last wave holds the shortest tiles. */
FA_DEV int fa3_tile_of(int wave) {
    return wave * (int)gridDim.x + ((wave & 1) ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x);
}
/* 2-CTA clusters (unmasked, an even number of query blocks per head): the same snake over clusters, whose unit is
 * a pair of tiles (query blocks 2i and 2i + 1 of one head: the same keys), the CTA of rank r taking tile 2·pair + r,
 * so that both CTAs walk the same key blocks in the same order. */
FA_DEV int fa3_pair_tile_of(int wave, int rank) {
    const int n = (int)gridDim.x / 2, c = (int)blockIdx.x / 2;
    return 2 * (wave * n + ((wave & 1) ? n - 1 - c : c)) + rank;
}
/* The producer's tile of a wave after the first: the CTA's next slot of the snake, or the dynamic scheduler's
 * next tile (an atomic on the counter in global memory: a round trip to L2, which p.early hides under a tile).
 * RAW: the counter's value without the + gridDim.x, which fa3_raw_tile adds where the tile is used: an add next to
 * the atomic makes the thread wait there for its result (SASS). */
template <int CL, bool RAW = false> FA_DEV int fa3_take_tile(const fa3_kparams &p, int wave, int rank) {
    if constexpr (CL == 2) return fa3_pair_tile_of(wave, rank);
    return p.counter ? atomicAdd(p.counter, 1) + (RAW ? 0 : (int)gridDim.x) : fa3_tile_of(wave);
}
template <int CL> FA_DEV int fa3_raw_tile(const fa3_kparams &p, int raw) {
    return CL == 1 && p.counter ? raw + (int)gridDim.x : raw;
}
struct fa3_work {
    int m0, h, b, n_hi, nblk;
    int sq, sk;     /* the sequence's lengths */
    int qrow, krow; /* its first rows in the packed tensors (varlen), else 0 */
};
/* UNMASKED: the call has no mask and fixed lengths (the clusters' calls), so that every tile visits all keys. */
template <int Br, int Bc, bool UNMASKED = false> FA_DEV fa3_work fa3_work_at(int tile, const fa3_kparams &p) {
    fa3_work w;
    int mb, bh;
    if (p.sec_heads > 0) {
        const int per = p.sec_heads * p.nmb, sec = tile / per, h0 = sec * p.sec_heads;
        const int hs = p.bh - h0 < p.sec_heads ? p.bh - h0 : p.sec_heads, local = tile - sec * per;
        mb = p.mb_up ? local / hs : p.nmb - 1 - local / hs;
        bh = h0 + local % hs;
    } else {
        mb = p.nmb - 1 - tile % p.nmb;
        bh = tile / p.nmb;
    }
    w.m0 = mb * Br;
    w.h = bh % p.hq;
    w.b = bh / p.hq;
    w.sq = p.sq, w.sk = p.sk, w.qrow = w.krow = 0;
    if (!UNMASKED && p.cu_q) { /* varlen: the sequence's rows, clamped into the packed tensors and to the bounds */
        w.sq = fa_packed_seq(p.cu_q, p.used_q, w.b, p.total_q, p.sq, &w.qrow);
        w.sk = fa_packed_seq(p.cu_k, p.used_k, w.b, p.total_k, p.sk, &w.krow);
    }
    int lo = 0, hi = 0;
    if (UNMASKED) {
        hi = w.sk;
    } else if (w.m0 < w.sq) {
        const int m1 = w.m0 + Br < w.sq ? w.m0 + Br : w.sq;
        fa_visible_block32(w.m0, m1, w.sq, w.sk, p.wl, p.wr, &lo, &hi);
        fa_chunk_keys32(w.m0 + w.sk - w.sq, m1 - 1 + w.sk - w.sq, p.chunk, &lo, &hi);
    }
    w.n_hi = (hi + Bc - 1) / Bc;
    w.nblk = hi > lo ? w.n_hi - lo / Bc : 0;
    return w;
}

/* A K or V box: CL = 2 multicasts it to both CTAs of the cluster (mask 0b11). */
template <int CL>
FA_DEV void fa3_kv_box(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1, int c2, int c3) {
    if constexpr (CL == 2)
        fa3_tma_load4_mc(dst, map, bar, c0, c1, c2, c3, 3);
    else
        fa3_tma_load4(dst, map, bar, c0, c1, c2, c3);
}
/* The consumers' release of a K/V stage: CL = 2, one arrival on each CTA's empty barrier (lane r on rank r's), as
 * both producers write into it. */
template <int CL> FA_DEV void fa3_release_kv(uint32_t bar, int lane) {
    if constexpr (CL == 2) {
        __syncwarp();
        if (lane < 2) fa3_bar_arrive_cta(bar, lane);
    } else {
        fa3_release(bar, lane);
    }
}

/* F8: the descales of the tile's (batch, K/V head), S's (qd·kd) and O's (vd); 1 and 1 otherwise */
template <bool F8> FA_DEV void fa3_descales(const fa3_kparams &p, const fa3_work &w, float &qk, float &vs) {
    qk = vs = 1.f;
    if constexpr (F8) {
        const int64_t di = (int64_t)w.b * p.hk + w.h / p.group;
        qk = (p.qd ? p.qd[di] : 1.f) * (p.kd ? p.kd[di] : 1.f);
        vs = p.vd ? p.vd[di] : 1.f;
    }
}

/* The schedule: intra-warpgroup overlap plus ping-pong between the warpgroups (README.md; the serial and the
 * overlap-only schedules measured slower: bench/lab/flash3/results). */
/* DV: v's and out's head dim where it differs from q's and k's (MLA's pairs, 16-bit): V stages and O of DV columns.
 * F8: e4m3 q, k, v (tv maps Vᵀ, flash3_fp8.cuh); F16 then says out's type. CL = 2: launched in clusters of two
 * CTAs that share the loads of Kj and Vj (16-bit, unmasked, fixed lengths; README.md): each producer loads half of
 * a block's rows (tk and tv then have boxes of Bc/2 rows) and multicasts them to both CTAs, so a stage is free
 * only once the consumers of both have released it. */
template <int D, bool WIDE, bool F16, bool F8, int CL = 1, int DV = D>
__global__ void __launch_bounds__(fa3_tile<D, WIDE, F8, DV>::THREADS, 1)
    fa3_fwd_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                   const __grid_constant__ CUtensorMap tv, const fa3_kparams p) {
    using T = fa3_tile<D, WIDE, F8, DV>;
    constexpr int Br = T::Br, Bc = T::Bc, ST = T::ST, DP = T::DP, KS = F8 ? 32 : 16;
    constexpr uint32_t KV_STAGE = Bc * DP * 2, V_STAGE = T::VS * 2; /* bytes of a K and of a V stage */
    /* a half block's box starts at a whole 8-row swizzle atom, so it is laid out as in the whole block */
    static_assert(CL == 1 || (CL == 2 && !F8 && Bc % 16 == 0), "2-CTA clusters: 16-bit, Bc/2 a multiple of 8");
    constexpr int HB = Bc / CL; /* rows of the K and V boxes a producer loads */
    extern __shared__ uint8_t fa3_smem_raw[];
    fa3_shared<D, WIDE, F8, DV> &sm =
        *reinterpret_cast<fa3_shared<D, WIDE, F8, DV> *>(((uintptr_t)fa3_smem_raw + 1023) & ~(uintptr_t)1023);

    if (threadIdx.x == 0) {
        for (int s = 0; s < T::QB; s++) {
            fa3_bar_init(fa3_smem(&sm.full_q[s]), 1);
            fa3_bar_init(fa3_smem(&sm.empty_q[s]), 4 * T::NW); /* one arrival per consumer warp */
        }
        for (int s = 0; s < ST; s++) {
            fa3_bar_init(fa3_smem(&sm.full_k[s]), 1);
            fa3_bar_init(fa3_smem(&sm.full_v[s]), 1);
            fa3_bar_init(fa3_smem(&sm.empty_k[s]), 4 * T::NW * CL); /* every consumer warp of the cluster */
            fa3_bar_init(fa3_smem(&sm.empty_v[s]), 4 * T::NW * CL);
        }
        fa3_bar_init_fence();
    }
    /* CL = 2: the peer's barriers are initialised before any multicast or remote arrival reaches them */
    if constexpr (CL == 2)
        fa3_cluster_sync();
    else
        __syncthreads();

    /* The producer picks each tile and writes it to its Q slot's sm.tile before its arrival on the slot's full_q
     * (release; the consumers' wait acquires), one Q phase per tile — a tile without keys or the end (tile >=
     * ntiles) is a plain arrival without bytes. qi counts the Q phases, kv the K/V blocks: Q phase qi is slot qi &
     * QSH and that slot's phase qi >> QSH, K/V block kv is stage kv % ST and parity (kv / ST) & 1, on both sides.
     * With two Q slots the next tile's Q (and, as stages free, its first K/V blocks) loads while the consumers still
     * work on this tile: its slot was released at the end of the tile before. */
    constexpr int QSH = T::QB - 1;
    /* warp-uniform (ptx.cuh); F8 keeps the plain division (a uniform one made ptxas spill 4-12 bytes at
     * d = 128 x 192 and 256 x 96) */
    const int wg = F8 ? (int)(threadIdx.x / 128) : fa3_warpgroup();
    if (wg == 0) {
        fa3_regs_dec<T::PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            fa3_prefetch_map(&tq);
            fa3_prefetch_map(&tk);
            fa3_prefetch_map(&tv);
            const int rank = CL == 2 ? (int)fa3_cluster_rank() : 0;
            /* wave counts the Q phases (one a tile); early, tile holds the next one as fa3_take_tile<CL, true> gave
             * it from the end of a wave to the start of the next */
            int kv = 0, tile = CL == 2 ? fa3_pair_tile_of(0, rank) : (int)blockIdx.x;
            for (int wave = 0;; wave++) {
                const int qs = wave & QSH;
                const uint32_t fq = fa3_smem(sm.full_q) + 8 * qs;
                /* the consumers have read the slot's last sm.tile and finished with its Q */
                fa3_bar_wait(fa3_smem(sm.empty_q) + 8 * qs, ((wave >> QSH) & 1) ^ 1);
                /* !q_ahead: also wait for the tile before to release its slot, as a single buffer does (the slots
                 * stay in shared memory: a run-time buffer count made the producer spill) */
                if (QSH && !p.q_ahead && wave > 0)
                    fa3_bar_wait(fa3_smem(sm.empty_q) + 8 * (qs ^ 1), ((wave - 1) >> 1) & 1);
                if (wave > 0) tile = p.early ? fa3_raw_tile<CL>(p, tile) : fa3_take_tile<CL>(p, wave, rank);
                atomicExch(&sm.tile[qs], tile);
                if (tile >= p.ntiles) {
                    fa3_bar_arrive(fq);
                    break;
                }
                const fa3_work w = fa3_work_at<Br, Bc, CL == 2>(tile, p);
                const int hk = w.h / p.group;
                if (w.nblk == 0) {
                    fa3_bar_arrive(fq);
                } else {
                    fa3_bar_expect_tx(fq, Br * DP * 2);
#pragma unroll
                    for (int c = 0; c < DP / 64; c++) /* varlen: rows past the sequence are its neighbour's (a row
                                                      * of out depends on its own q row only; those beyond sq are
                                                      * not written) */
                        fa3_tma_load4(fa3_smem(sm.q) + qs * T::Q_BYTES + c * Br * 128, &tq, fq, 64 * c,
                                      w.qrow + w.m0, w.h, p.cu_q ? 0 : w.b);
                }
                /* early: the next tile's index now, its atomic's latency hidden under this tile's loads and work
                 * (used at the next Q phase). A CTA so holds one tile ahead: in the longest-first order the last
                 * tiles are the shortest, so what it holds while another CTA runs dry is a short one. The end
                 * condition is unchanged: a CTA takes a next tile only after a valid one. */
                if (p.early) tile = fa3_take_tile<CL, true>(p, wave + 1, rank);
                for (int it = 0; it < w.nblk; it++, kv++) {
                    const int s = kv % ST, n = w.n_hi - 1 - it;
                    const uint32_t ph = (kv / ST) & 1;
                    const uint32_t fk = fa3_smem(&sm.full_k[s]), fv = fa3_smem(&sm.full_v[s]);
                    /* K and V boxes: (row, batch); varlen, a ragged box (tensor_map.h) of the sequence's keys from
                     * n·Bc on and zeros after them, never the next sequence's or seqused's padding rows (0·NaN) */
                    const int left = min(w.sk - n * Bc, Bc);
                    /* CL = 2: this CTA's half of the rows (rank·Bc/2 on), into both CTAs; each full barrier still
                     * expects the whole stage, half of it from the peer (fixed lengths only: kz = w.b) */
                    const int ky = p.cu_q ? Bc - left : n * Bc + rank * HB, kz = p.cu_q ? w.krow + n * Bc + left : w.b;
                    const uint32_t half = rank * HB * 128;
                    fa3_bar_wait(fa3_smem(&sm.empty_k[s]), ph ^ 1);
                    fa3_bar_expect_tx(fk, KV_STAGE);
#pragma unroll
                    for (int c = 0; c < DP / 64; c++)
                        fa3_kv_box<CL>(fa3_smem(sm.k[s]) + c * Bc * 128 + half, &tk, fk, 64 * c, ky, hk, kz);
                    fa3_bar_wait(fa3_smem(&sm.empty_v[s]), ph ^ 1);
                    fa3_bar_expect_tx(fv, V_STAGE);
                    if constexpr (F8) { /* Vᵀ [b][hk][D][keys]: 128 keys (64 16-bit columns) a panel of D rows */
#pragma unroll
                        for (int c = 0; c < (Bc + 127) / 128; c++)
                            fa3_tma_load4(fa3_smem(sm.v[s]) + c * D * 128, &tv, fv, (n * Bc + 128 * c) / 2, 0, hk,
                                          w.b);
                    } else {
#pragma unroll
                        for (int c = 0; c < DV / 64; c++)
                            fa3_kv_box<CL>(fa3_smem(sm.v[s]) + c * Bc * 128 + half, &tv, fv, 64 * c, ky, hk, kz);
                    }
                }
            }
        }
        if constexpr (CL == 2) fa3_cluster_sync(); /* the exit's (the consumers' below says why) */
        return;
    }

    fa3_regs_inc<T::CONSUMER_REGS>();
    const int cw = wg - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, t = lane % 4;
    const uint32_t k0 = fa3_smem(sm.k[0]), v0 = fa3_smem(sm.v[0]);
    int qi = 0, kv = 0;
    for (;;) {
        const int qs = qi & QSH;
        fa3_bar_wait(fa3_smem(&sm.full_q[qs]), (qi >> QSH) & 1);
        /* one value for the warp, and said so (a shfl from lane 0), so that the tile's key blocks, the stage
         * indices and the shared addresses they give are warp-uniform too */
        const int tile = __shfl_sync(0xffffffffu, atomicOr(&sm.tile[qs], 0), 0);
        if (tile >= p.ntiles) break;
        const uint32_t q_base = fa3_smem(sm.q[qs]) + cw * 64 * 128, empty_q = fa3_smem(&sm.empty_q[qs]);
        const fa3_work w = fa3_work_at<Br, Bc, CL == 2>(tile, p);
        const int nblk = w.nblk, n_hi = w.n_hi;
        const int r0 = w.m0 + 64 * cw + 16 * warp + lane / 4, r1 = r0 + 8;
        fa3_rows R;
        fa_visible_keys32(r0, w.sq, w.sk, p.wl, p.wr, &R.lo0, &R.hi0);
        fa_visible_keys32(r1, w.sq, w.sk, p.wl, p.wr, &R.lo1, &R.hi1);
        /* attention_chunk: once a tile, so that the key loop holds no division */
        fa_chunk_keys32(r0 + w.sk - w.sq, r0 + w.sk - w.sq, p.chunk, &R.lo0, &R.hi0);
        fa_chunk_keys32(r1 + w.sk - w.sq, r1 + w.sk - w.sq, p.chunk, &R.lo1, &R.hi1);
        /* F8: the descales of the tile's (batch, K/V head) join the scale (S = qd·kd·q·k) and 1/ℓ (O = vd·P V) */
        float qk, vs; /* read again for the epilogue: fewer registers live through the key loop */
        fa3_descales<F8>(p, w, qk, vs);
        R.sl2 = p.cap_scale != 0.f ? p.scale_log2 : p.scale_log2 * qk;
        R.cap_scale = p.cap_scale * qk;
        R.m0 = R.m1 = -INFINITY;
        R.l0 = R.l1 = 0.f;
        R.amax = 0.f;
        /* The logit test needs each key block once per (sequence, head): raw S covers the whole block whatever the
         * mask, a NaN in a key reaches the out of every row that sees it, and only ±inf (a −inf weight of 0; the
         * softcap's tanh) can hide. The visited ranges grow with the query block, so a tile tests the blocks the
         * query block before it does not visit; with a softcap every block (an inf in q hides there too). */
        R.n_test = 0;
        if (w.m0 > 0 && p.cap_scale == 0.f) {
            int plo, phi;
            fa_visible_block32(w.m0 - Br, w.m0, w.sq, w.sk, p.wl, p.wr, &plo, &phi);
            fa_chunk_keys32(w.m0 - Br + w.sk - w.sq, w.m0 - 1 + w.sk - w.sq, p.chunk, &plo, &phi);
            if (phi > plo) R.n_test = (phi + Bc - 1) / Bc * Bc; /* in keys, as kbase */
        }
        float o[DV / 2];
#pragma unroll
        for (int i = 0; i < DV / 2; i++) o[i] = 0.f;
        float sacc[Bc / 2];
        uint32_t pa[Bc / KS][4];
        float c0, c1;

        if (nblk == 0) fa3_release(empty_q, lane); /* nothing loaded: sm.tile is read */
        if (nblk > 0) {
            /* overlapped: S_{j+1} = Qi K_{j+1}ᵀ and O += P_j V_j are issued together and the softmax of
             * block j+1 runs while P_j V_j is still in the tensor cores; ping-pong: the two warpgroups take
             * turns to issue their GEMMs (named barriers 1 and 2), so that one's softmax runs under the
             * other's GEMMs. */
            const int my_turn = 1 + cw, other_turn = 1 + (cw + 1) % T::NW; /* round robin */
            if (cw == T::NW - 1) fa3_named_arrive(1, 256);
            fa3_named_sync(my_turn, 256);
            fa3_bar_wait(fa3_smem(&sm.full_k[kv % ST]), (kv / ST) & 1);
            fa3_gemm_abt<DP, Bc, Br, Bc, F16, F8>(sacc, q_base, k0 + (kv % ST) * KV_STAGE);
            fa3_named_arrive(other_turn, 256);
            fa3_wgmma_wait<0>();
            fa3_fence_regs(sacc);
            fa3_release_kv<CL>(fa3_smem(&sm.empty_k[kv % ST]), lane);
            fa3_softmax<Bc, F8>(sacc, (n_hi - 1) * Bc, R, p.cap, c0, c1);
            fa3_pack_p<Bc, F16, F8>(pa, sacc);
            for (int it = 1; it < nblk; it++) {
                const int g = kv + it, s = g % ST, sp = (g - 1) % ST;
                const uint32_t ph = (g / ST) & 1, php = ((g - 1) / ST) & 1;
                fa3_named_sync(my_turn, 256);
                fa3_bar_wait(fa3_smem(&sm.full_k[s]), ph);
                fa3_gemm_abt<DP, Bc, Br, Bc, F16, F8>(sacc, q_base, k0 + s * KV_STAGE);
                fa3_bar_wait(fa3_smem(&sm.full_v[sp]), php);
                fa3_fence_regs(o);
                fa3_fence_regs(pa);
                fa3_pv<DV, Bc, F16, F8>(o, pa, v0 + sp * V_STAGE);
                fa3_named_arrive(other_turn, 256);
                fa3_wgmma_wait<1>();
                fa3_fence_regs(sacc);
                fa3_release_kv<CL>(fa3_smem(&sm.empty_k[s]), lane);
                fa3_softmax<Bc, F8>(sacc, (n_hi - 1 - it) * Bc, R, p.cap, c0, c1);
                fa3_wgmma_wait<0>();
                fa3_fence_regs(o);
                fa3_fence_regs(pa);
                fa3_release_kv<CL>(fa3_smem(&sm.empty_v[sp]), lane);
                fa3_rescale<DV>(o, c0, c1);
                fa3_pack_p<Bc, F16, F8>(pa, sacc);
            }
            /* every S GEMM of the tile has completed: the producer may load the slot's next Qi */
            fa3_release(empty_q, lane);
            const int g = kv + nblk - 1, s = g % ST;
            fa3_named_sync(my_turn, 256);
            fa3_bar_wait(fa3_smem(&sm.full_v[s]), (g / ST) & 1);
            fa3_fence_regs(o);
            fa3_fence_regs(pa);
            fa3_pv<DV, Bc, F16, F8>(o, pa, v0 + s * V_STAGE);
            /* the last warpgroup's last turn of the tile is not passed on: each sync has one arrive */
            if (cw < T::NW - 1) fa3_named_arrive(other_turn, 256);
            fa3_wgmma_wait<0>();
            fa3_fence_regs(o);
            fa3_release_kv<CL>(fa3_smem(&sm.empty_v[s]), lane);
            kv += nblk;
        }
        qi++;

        /* O = O / l; LSE = m·scale + ln l; a row with l = 0 saw no key: O = 0, LSE = −inf */
        float l0 = R.l0, l1 = R.l1;
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        fa3_descales<F8>(p, w, qk, vs);
        const float lse_scale = p.cap_scale != 0.f ? p.scale : p.scale * qk;
        float inv0 = l0 > 0.f ? vs / l0 : 0.f, inv1 = l1 > 0.f ? vs / l1 : 0.f;
        constexpr float ln_p = F8 ? 8.f * 0.69314718f : 0.f; /* ℓ carries P's 2^p_log2 */
        float L0 = l0 > 0.f ? R.m0 * lse_scale + (logf(l0) - ln_p) : -INFINITY;
        float L1 = l1 > 0.f ? R.m1 * lse_scale + (logf(l1) - ln_p) : -INFINITY;
        /* the contract (contract.h): logits, the keys' LSE of every row (the sink joined below cannot hide a −inf
         * or an uncertified one), and out's elements as stored */
        uint32_t bad = !(R.amax <= FLT_MAX), nf = 0;
        bad |= r0 < w.sq && !(fabsf(L0) < FA_LSE_CERTIFIED) && !(L0 == -INFINITY && R.hi0 <= R.lo0);
        bad |= r1 < w.sq && !(fabsf(L1) < FA_LSE_CERTIFIED) && !(L1 == -INFINITY && R.hi1 <= R.lo1);
        if (p.sinks) { /* the join folded into 1/ℓ (core/sink.h); a uniform branch */
            const float sk = p.sinks[w.h];
            inv0 *= fa_sink_join_lse_f32(L0, sk, &L0);
            inv1 *= fa_sink_join_lse_f32(L1, sk, &L1);
        }
        uint16_t *ob = p.o + (p.cu_q ? (int64_t)w.qrow * p.o_row_stride : (int64_t)w.b * p.o_batch_stride) +
                       (int64_t)w.h * p.o_head_stride + 2 * t;
        if (r0 < w.sq) {
            uint16_t *orow = ob + (int64_t)r0 * p.o_row_stride;
#pragma unroll
            for (int j = 0; j < DV / 8; j++) {
                const uint32_t x = fa3_pack<F16>(o[4 * j] * inv0, o[4 * j + 1] * inv0);
                *reinterpret_cast<uint32_t *>(orow + 8 * j) = x;
                nf |= fa3_exp_carry<F16>(x);
            }
        }
        if (r1 < w.sq) {
            uint16_t *orow = ob + (int64_t)r1 * p.o_row_stride;
#pragma unroll
            for (int j = 0; j < DV / 8; j++) {
                const uint32_t x = fa3_pack<F16>(o[4 * j + 2] * inv1, o[4 * j + 3] * inv1);
                *reinterpret_cast<uint32_t *>(orow + 8 * j) = x;
                nf |= fa3_exp_carry<F16>(x);
            }
        }
        if (p.lse && t == 0) {
            /* [b][hq][sq], varlen [hq][total_q] */
            float *lrow = p.lse + (p.cu_q ? (int64_t)w.h * p.total_q + w.qrow : ((int64_t)w.b * p.hq + w.h) * p.sq);
            if (r0 < w.sq) lrow[r0] = L0;
            if (r1 < w.sq) lrow[r1] = L1;
        }
        if (p.check) {
            bad |= (nf & 0x80008000u) != 0;
            if (__any_sync(0xffffffffu, bad) && lane == 0)
                atomicOr(p.check + ((int64_t)w.b * p.hq + w.h) * FA_CONTRACT_STRIDE, 1u);
        }
    }
    /* CL = 2: a CTA leaves only after the peer's consumers have made their last arrivals on its empty barriers (the
     * peer's multicasts into it have all landed: its own consumers waited for them on its full barriers) */
    if constexpr (CL == 2) fa3_cluster_sync();
}

#endif
