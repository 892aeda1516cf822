/* Split-KV attention over a KV cache on the tensor cores (mma.sync m16n8k16). One CTA per (split, K/V head x tile of 16
 * query rows, sequence): the rows that read one K/V head (GQA group x new rows, padded to 16) are the M of the
 * products, so each K/V row is read from HBM once per K/V head, and the products run on the tensor cores (on CUDA
 * cores, a GQA group's FMAs and lane-shuffle reductions cannot keep up with HBM). Each of the NW warps (4, or 8
 * where the plan says so) streams its own tiles of 16 keys (tile w, w + NW, ...) through a 3-stage cp.async ring in
 * shared memory, rows swizzled by 16-byte chunk (chunk ^ row % 8) so the ldmatrix reads are conflict-free; S = Q
 * Kᵀ, the online softmax in log2 units and O += P V as in the FLASH2 forward (P reused from registers as the A
 * operand); the warps' states merge in shared memory. Keys outside a row's visible range are masked; keys outside
 * every row's range are zero-filled, never read. The loop is kept short, since at batch 1 two warps per scheduler
 * are bound by instruction latency before HBM is: copy offsets fixed per CTA, Q in registers (d ≤ 128), no mask on
 * tiles every row sees in full, and O rescaled only when a row's max moved; Q's rows and the first split's first
 * copies go out before the sequence's length comes back (they do not depend on it). Each row's state is held to the
 * numerics contract (a row that fails it is recomputed in float64). One split writes out and LSE; several write
 * fp32 partials, and the last CTA of the row tile merges them (finish.cuh) and zeroes the tile's counter for the
 * next call. An E4M3 cache (the instances of cache type uint8_t) goes through the ring at half the bytes, each tile
 * widened to the dtype before the products. docs/kvcache.md ("The CUDA kernels", "FP8 caches"). */
#include "../mma_sync/mma.cuh"
#include "kvcache.h"
#include "finish.cuh"
#include "qtile.cuh"

#include "core/visible.h"

#include <limits.h>
#include <math.h>

#define FA_KV_STAGES 3                  /* stages of each warp's K/V ring */
#define FA_KV_CLUSTER_SMEM (120 * 1024) /* > half of the SM's 228 KB: one cluster CTA per SM */
#define KV_KT FA_KV_KEYS
static_assert(FA_KV_ROWS == 16 && FA_KV_KEYS == 16, "one m16n8k16 M of rows, two n8 tiles of keys");

/* Elements from one row of a shared-memory tile to the next: d rounded up to 64, so that the chunk swizzle (XOR
 * with row % 8) stays inside the row at d = 96 (a third of its row unused) */
#define KV_DS(D) (((D) + 63) / 64 * 64)

/* CB: bytes of a cache element (2, or 1 for E4M3) */
template <int D, int NW, int CB = 2> struct kv_mma_smem {
    static constexpr int DS = KV_DS(D);
    static constexpr int q = 2 * 16 * DS * 2;                       /* Q tile, bf16/f16 (rotary: hi and lo parts) */
    static constexpr int ring = NW * FA_KV_STAGES * 2 * KV_KT * DS * CB; /* per warp: stages x (K tile, V tile) */
    static constexpr int wide = CB == 1 ? NW * 2 * KV_KT * DS * 2 : 0;  /* E4M3: per warp, its tiles widened to T */
    static constexpr int total = q + ring + wide;
    static constexpr int after_q = ring + wide; /* what the merges reuse once the loop is done */
    static_assert(NW * 16 * (D + 8) * 4 + 2 * NW * 16 * 4 <= after_q, "the warps' merge reuses the ring");
};

/* Byte offset of 16-byte chunk c of row r in a K or V tile of the ring, C the cache's type: 16-bit tiles as swz;
 * E4M3 tiles (rows of D bytes) with the chunk XORed by row % 8 (row % 4 at d = 64), so that the widening's reads,
 * 8 rows of one chunk per shared-memory phase, are conflict-free. */
template <int D, typename C> __device__ __forceinline__ uint32_t tile_off(int r, int c) {
    constexpr int DS = KV_DS(D);
    if constexpr (sizeof(C) == 2) {
        return swz<DS>(r, c);
    } else {
        constexpr int M = (DS / 16 < 8 ? DS / 16 : 8) - 1;
        return (uint32_t)(r * DS + ((c ^ (r & M)) << 4));
    }
}

/* Two E4M3 values (the low 16 bits, the first in the low byte) -> two T, packed, exactly: every E4M3 value, NaN
 * included, is an f16 and a bf16 (sm_89+ converts E4M3 pairs to f16 pairs in one instruction). */
template <typename T> __device__ __forceinline__ uint32_t e4m3x2_to(uint32_t x);
template <> __device__ __forceinline__ uint32_t e4m3x2_to<__half>(uint32_t x) {
    uint32_t r;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"((unsigned short)x));
    return r;
}
template <> __device__ __forceinline__ uint32_t e4m3x2_to<__nv_bfloat16>(uint32_t x) {
    const uint32_t h = e4m3x2_to<__half>(x);
    return fa_pack2<__nv_bfloat16>(__half2float(__ushort_as_half((unsigned short)h)),
                                   __half2float(__ushort_as_half((unsigned short)(h >> 16))));
}

/* E4M3: a warp's K and V tiles of the ring (at sa, tile_off layout) widened to T into its [16][D] pair at da (swz
 * layout, what the 16-bit loop reads). Lane: chunk u / 16 of row u % 16, u = lane + 32 i, so that a phase's 8
 * lanes take one chunk of 8 rows — conflict-free reads and writes. */
template <int D, typename T> __device__ __forceinline__ void widen_tiles(uint32_t sa, uint32_t da, int lane) {
    constexpr int CC = D / 16, DS = KV_DS(D);
    /* the row's swizzle, opaque: its offsets are formed here each time, not hoisted into registers held across the
     * key loop (d = 256 spilled) */
    const int x16 = (int)fa_opaque((uint32_t)lane & 7);     /* swz's XOR of row r */
    const int x = DS / 16 < 8 ? x16 & (DS / 16 - 1) : x16;   /* tile_off's */
#pragma unroll
    for (int kv = 0; kv < 2; kv++)
#pragma unroll
        for (int i = 0; i < (KV_KT * CC + 31) / 32; i++) {
            const int u = lane + 32 * i, r = u % 16, c = u / 16;
            if (KV_KT * CC % 32 && u >= KV_KT * CC) break; /* d = 80: 5 chunks a row, a part pass */
            uint32_t w[4];
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                         : "r"(sa + kv * KV_KT * DS + (uint32_t)(r * DS + ((c ^ x) << 4))));
            uint32_t y[8];
#pragma unroll
            for (int e = 0; e < 4; e++) y[2 * e] = e4m3x2_to<T>(w[e]), y[2 * e + 1] = e4m3x2_to<T>(w[e] >> 16);
            const uint32_t d = da + kv * KV_KT * DS * 2;
            const uint32_t d0 = d + (uint32_t)(r * DS * 2 + (((2 * c) ^ x16) << 4)),
                           d1 = d + (uint32_t)(r * DS * 2 + (((2 * c + 1) ^ x16) << 4));
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(d0), "r"(y[0]), "r"(y[1]), "r"(y[2]),
                         "r"(y[3])
                         : "memory");
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(d1), "r"(y[4]), "r"(y[5]), "r"(y[6]),
                         "r"(y[7])
                         : "memory");
        }
}

__device__ __forceinline__ void merge_state8(float &m, float &l, float *o, float m2, float l2, const float *o2) {
    const float mn = fmaxf(m, m2);
    const float a = m == -INFINITY ? 0.f : exp2f(m - mn), c = m2 == -INFINITY ? 0.f : exp2f(m2 - mn);
    l = l * a + l2 * c;
#pragma unroll
    for (int e = 0; e < 8; e++) o[e] = o[e] * a + o2[e] * c;
    m = mn;
}

/* Registers: 8 warps ask for one CTA per SM (else ptxas caps them at 128 registers and d = 64 spills); 4 warps
 * outside a cluster ask for two (left free, ptxas spilled in the key loop once the register merge was added).
 * Cluster CTAs, one per SM by their shared memory, are left free (asking for two read slower). PLAIN (p.plain):
 * built without the code of rotary q, softcap and tiles that span pages. C: the cache's type, T or E4M3 (uint8_t):
 * E4M3 tiles go through the ring at half the bytes, and each is widened to T in the warp's own tile pair before
 * the products (kv_mma_smem::wide); k's descale joins the scores' multiplier, v's the final 1 / ℓ. */
template <int D, int NW, typename T, typename C, bool CL, bool PLAIN>
__global__ void __launch_bounds__(NW * 32, NW == 8 ? 1 : CL ? 0 : 2)
    splitkv_mma_kernel(const typename fa_kv_params_of<C>::type p) {
    constexpr bool F8 = sizeof(C) == 1;
    constexpr int CH = D / 8, NT = NW * 32; /* 16-byte chunks per row of Q; threads */
    constexpr int CC = D * (int)sizeof(C) / 16, EC = 16 / (int)sizeof(C); /* chunks per cache row; elements per chunk */
    using SM = kv_mma_smem<D, NW, (int)sizeof(C)>;
    constexpr int DS = SM::DS; /* elements from one tile row to the next */
    extern __shared__ __align__(128) unsigned char smem[];
    T *sq = (T *)smem;
    const int s = blockIdx.x, hk = blockIdx.y / p.row_tiles, tile = blockIdx.y % p.row_tiles, b = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    /* The first split's first tiles are keys 0, 16, ... whatever the sequence's length, where no append, window or
     * batch_idx moves them: their copies (and a paged cache's block-table entries) go out before the length comes
     * back, as if the sequence filled the cache, and the rows past its end are zeroed once they land. */
    const bool spec = s == 0 && !p.append && !p.batch_idx && p.wl < 0 && p.attention_chunk <= 0;
    /* Q's rows first, by cp.async into the Q tile as the first group (zero beyond R): they do not depend on the
     * length, and the first tiles' copies go out behind them, not before (a CTA's copies ahead of its Q delayed
     * Q by the time they took). With rotary the first kernel writes q: it is read after that kernel, below. */
    const int r0 = tile * 16, R = min(16, p.group * p.sq - r0);
    const bool qrot = !PLAIN && p.qrot;
    if (!qrot)
        for (int c = threadIdx.x; c < 16 * CH; c += NT) {
            const int r = c / CH, cc = c % CH, gr = r0 + r, i = gr / p.group, hq = hk * p.group + gr % p.group;
            const bool ok = r < R;
            fa_cp_async16_at(fa_smem_addr(sq) + swz<DS>(r, cc),
                             ok ? (const void *)((const T *)p.q + b * p.q_sb + i * p.q_ss + hq * p.q_sh + cc * 8) : p.q,
                             ok ? 16 : 0);
        }
    fa_cp_async_commit();
    const int len = p.seqlens[b]; /* its load first: the speculated copies wait for nothing it gives */
    C *ring = (C *)(smem + SM::q) + warp * FA_KV_STAGES * 2 * KV_KT * DS;
    const C *kc = (const C *)p.kc, *vc = (const C *)p.vc;
    /* the keys this warp copies: tiles warp, warp + NW, ... of 16 from kbase, the ones inside [klo, khi) */
    int klo = 0, khi = p.capacity, kbase = 0, mine = 0, row = b, fresh = INT_MAX;
    auto key0 = [&](int it) { return kbase + (warp + it * NW) * KV_KT; }; /* the first key of its it-th tile */
    auto tiles = [&](int ntiles) { return ntiles > warp ? (ntiles - warp + NW - 1) / NW : 0; }; /* its share */
    /* paged: lane k looks up the page and in-page row of key k % 16 of tile it + k / 16 for a pair of tiles
     * (it, it + 1), two tiles ahead of their copies, so the block-table reads are off the copies' critical path
     * and the prologue's two tiles wait for one round trip, not two; the copies take them by shuffle */
    int pg_cur = 0, ip_cur = 0, pg_nxt = 0, ip_nxt = 0;
    int bad_t = INT_MAX; /* the lane's first key whose entry is outside the pages: clamped, recorded after the loop */
    auto lookup = [&](int it) {
        if (p.paged && it < mine) {
            const int t = min(key0(it + (lane >> 4)) + (lane & 15), khi - 1);
            const int pg = p.block_table[(int64_t)row * p.bt_stride + t / p.page_size];
            if ((pg < 0 || pg >= p.num_pages) && t < bad_t) bad_t = t;
            pg_nxt = pg < 0 ? 0 : pg >= p.num_pages ? p.num_pages - 1 : pg;
            ip_nxt = t % p.page_size;
        }
    };
    /* this lane's copies of a tile: 16-byte chunk lane % CH of rows lane / CH + RP·i, i < NIT; their element
     * offsets from the tile's first key and their ring offsets are fixed per CTA, so a tile costs one base
     * offset and NIT pairs of copies */
    /* (a row that is not a divisor of 32 chunks, d = 96: chunk u % CC of row u / CC, u = lane + 32 i, offsets per i) */
    constexpr bool EVEN = 32 % CC == 0;
    constexpr int RP = EVEN ? 32 / CC : 1, NIT = (KV_KT * CC + 31) / 32; /* (E4M3 d = 80: 80 chunks, a part pass) */
    const int64_t lk = (int64_t)hk * p.k_sh + (EVEN ? (int64_t)(lane / CC) * p.k_ss + (lane % CC) * EC : 0),
                  lv = (int64_t)hk * p.v_sh + (EVEN ? (int64_t)(lane / CC) * p.v_ss + (lane % CC) * EC : 0);
    const int64_t stk = (int64_t)RP * p.k_ss, stv = (int64_t)RP * p.v_ss;
    const uint32_t ring_a = fa_smem_addr(ring);
    const uint32_t wide_a = fa_smem_addr(smem) + SM::q + SM::ring + warp * 2 * KV_KT * DS * 2; /* E4M3: its pair */
    constexpr uint32_t TILE_B = KV_KT * DS * sizeof(C); /* bytes of a K or V tile; a stage holds K's, then V's */
    auto stage = [&](int it) { return ring_a + (it % FA_KV_STAGES) * 2 * TILE_B; }; /* the stage of the it-th tile */
    /* pages of a multiple of 16 keys hold a whole tile: its page and first row, once per tile */
    const bool tile_rows = PLAIN || !p.paged || p.page_size % KV_KT == 0;
    auto load = [&](int it) { /* this warp's it-th tile into stage it % NST; every lane commits one group */
        if (it < mine) {
            const int base = key0(it), half = (it & 1) * 16;
            if (p.paged && !(it & 1)) { /* a new pair: its entries, and the next pair's read */
                pg_cur = pg_nxt, ip_cur = ip_nxt;
                lookup(it + 2);
            }
            const uint32_t sk = stage(it), sv = sk + TILE_B;
            if (base + KV_KT > fresh) fa_kv_wait_first(p);
            if (tile_rows) {
                int64_t tk, tv; /* the tile's first key */
                if (p.paged) {
                    const int64_t pg0 = __shfl_sync(0xffffffffu, pg_cur, half),
                                  ip0 = __shfl_sync(0xffffffffu, ip_cur, half);
                    tk = pg0 * p.k_sb + ip0 * p.k_ss, tv = pg0 * p.v_sb + ip0 * p.v_ss;
                } else {
                    tk = (int64_t)row * p.k_sb + (int64_t)base * p.k_ss;
                    tv = (int64_t)row * p.v_sb + (int64_t)base * p.v_ss;
                }
                const C *ks = kc + tk + lk, *vs = vc + tv + lv;
                if constexpr (!EVEN) {
#pragma unroll
                    for (int i = 0; i < NIT; i++) {
                        const int u = lane + 32 * i, kr = u / CC, cc = u % CC;
                        if (KV_KT * CC % 32 && u >= KV_KT * CC) break;
                        const bool ok = base + kr >= klo && base + kr < khi;
                        const uint32_t so = tile_off<D, C>(kr, cc);
                        const int64_t ko = (int64_t)kr * p.k_ss + cc * EC, vo = (int64_t)kr * p.v_ss + cc * EC;
                        fa_cp_async16_at(sk + so, ok ? (const void *)(ks + ko) : kc, ok ? 16 : 0);
                        fa_cp_async16_at(sv + so, ok ? (const void *)(vs + vo) : vc, ok ? 16 : 0);
                    }
                } else if (base >= klo && base + KV_KT <= khi) {
#pragma unroll
                    for (int i = 0; i < NIT; i++) {
                        const uint32_t so = tile_off<D, C>(lane / CC + RP * i, lane % CC);
                        fa_cp_async16_at(sk + so, ks + i * stk, 16);
                        fa_cp_async16_at(sv + so, vs + i * stv, 16);
                    }
                } else { /* keys outside every row's range: zero-filled, never read */
#pragma unroll
                    for (int i = 0; i < NIT; i++) {
                        const int kr = lane / CC + RP * i;
                        const bool ok = base + kr >= klo && base + kr < khi;
                        const uint32_t so = tile_off<D, C>(kr, lane % CC);
                        fa_cp_async16_at(sk + so, ok ? (const void *)(ks + i * stk) : kc, ok ? 16 : 0);
                        fa_cp_async16_at(sv + so, ok ? (const void *)(vs + i * stv) : vc, ok ? 16 : 0);
                    }
                }
            } else { /* pages that split a tile: each row's page by shuffle */
#pragma unroll
                for (int i = 0; i < NIT; i++) { /* every lane takes every shuffle (E4M3 d = 80: 80 chunks a tile) */
                    const int c = lane + 32 * i, kr = min(c / CC, KV_KT - 1), cc = c % CC, t = base + kr;
                    const int64_t pk = __shfl_sync(0xffffffffu, pg_cur, half + kr),
                                  ik = __shfl_sync(0xffffffffu, ip_cur, half + kr);
                    if (KV_KT * CC % 32 && c >= KV_KT * CC) break;
                    const bool ok = t >= klo && t < khi;
                    int64_t ko = pk * p.k_sb + ik * p.k_ss + (int64_t)hk * p.k_sh;
                    int64_t vo = pk * p.v_sb + ik * p.v_ss + (int64_t)hk * p.v_sh;
                    if (!ok) ko = vo = 0;
                    fa_cp_async16_at(sk + tile_off<D, C>(kr, cc), kc + ko + cc * EC, ok ? 16 : 0);
                    fa_cp_async16_at(sv + tile_off<D, C>(kr, cc), vc + vo + cc * EC, ok ? 16 : 0);
                }
            }
        }
        fa_cp_async_commit();
    };
    auto first_copies = [&] { /* the first pair's entries (paged) and the copies of the first NST - 1 tiles */
        lookup(0);
#pragma unroll
        for (int it = 0; it < FA_KV_STAGES - 1; it++) load(it);
    };
    /* speculated: the tiles of keys [0, capacity) (the lookups of later pairs too: a key below the real end gets
     * the same entry; one past it is zero-filled or zeroed, never read) */
    if (spec) {
        mine = tiles((p.capacity + KV_KT - 1) / KV_KT);
        first_copies();
    }
    const int L = fa_kv_len(p, len);
    row = fa_kv_cache_row(p, b);
    if (s == 0 && blockIdx.y == 0 && threadIdx.x == 0) { /* once per sequence */
        fa_kv_check_seq(p, b, len);
        if constexpr (F8) fa_kv_check_descales(p, b);
    }
    /* E4M3: the sequence's k descale of this K/V head joins the scores' multiplier (v's: the final 1 / ℓ, below),
     * kept in shared memory (one more register across the loop spilled d = 256) */
    __shared__ float s_qmul;
    if constexpr (F8)
        if (threadIdx.x == 0) s_qmul = p.ds.k ? p.qmul * p.ds.k[(int64_t)b * p.hk + hk] : p.qmul;
    int chunk, ns;
    fa_kv_split(p, L, &chunk, &ns);
    /* a split past the sequence's end: done, or (cluster merge) an empty state that takes part in the merge */
    const bool idle = s >= ns;
    if (!CL && idle) {
        fa_cp_async_wait<0>(); /* Q's copies land before the CTA leaves */
        return;
    }
    const int s0 = idle ? L : s * chunk, s1 = idle ? L : min(L, s0 + chunk);

    /* each row's visible keys inside the split; this thread's rows g and g + 8; the union over the tile */
    __shared__ int s_lo[16], s_hi[16];
    klo = s1, khi = s0;
    int lo[2] = {0, 0}, hi[2] = {0, 0};
    int kin_lo = s0, kin_hi = s1; /* the keys that every row of the tile sees: tiles inside need no mask */
    for (int r = 0; r < R; r++) {
        int a, z;
        fa_visible_keys32((r0 + r) / p.group, p.sq, L, p.wl, p.wr, &a, &z);
        fa_chunk_keys32((r0 + r) / p.group + L - p.sq, (r0 + r) / p.group + L - p.sq, p.attention_chunk, &a, &z);
        a = max(a, s0), z = max(a, min(z, s1));
        if (z > a) klo = min(klo, a), khi = max(khi, z);
        kin_lo = max(kin_lo, a), kin_hi = min(kin_hi, z);
        if (r == g) lo[0] = a, hi[0] = z;
        if (r == g + 8) lo[1] = a, hi[1] = z;
        if (threadIdx.x == 0) s_lo[r] = a, s_hi[r] = z;
    }
    /* the first kernel writes the rotated q (wait for it here) and the appended rows (keys >= fresh: each warp
     * waits before its copies of the tile that reaches them, by then long done) */
    fresh = p.append ? L - p.sq : INT_MAX;
    if (qrot) fa_kv_wait_first(p);
    kbase = klo & ~(KV_KT - 1);
    const int ntiles = khi > klo ? (khi - kbase + KV_KT - 1) / KV_KT : 0;
    mine = tiles(ntiles); /* tiles warp, warp + NW, ... */

    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    if (!spec) first_copies();
    /* With rotary, q is the fp32 rotated q: it goes in as hi + lo (two tiles of the dtype, S = hi·Kᵀ + lo·Kᵀ), as
     * exact as fp32 for the scores and the LSE, 16 rows, zero beyond R */
    T *sq_lo = sq + 16 * DS;
    for (int c = threadIdx.x; qrot && c < 16 * CH; c += NT) {
        const int r = c / CH, cc = c % CH;
        uint4 u = make_uint4(0, 0, 0, 0), v = u;
        if (r < R) {
            const int gr = r0 + r, i = gr / p.group, hq = hk * p.group + gr % p.group;
            const float *x = p.qrot + (((int64_t)b * p.sq + i) * p.hq + hq) * D + cc * 8;
            float hi[8], lo[8];
#pragma unroll
            for (int e = 0; e < 8; e++) hi[e] = round_to<T>(x[e]), lo[e] = x[e] - hi[e];
            u.x = fa_pack2<T>(hi[0], hi[1]), u.y = fa_pack2<T>(hi[2], hi[3]);
            u.z = fa_pack2<T>(hi[4], hi[5]), u.w = fa_pack2<T>(hi[6], hi[7]);
            v.x = fa_pack2<T>(lo[0], lo[1]), v.y = fa_pack2<T>(lo[2], lo[3]);
            v.z = fa_pack2<T>(lo[4], lo[5]), v.w = fa_pack2<T>(lo[6], lo[7]);
        }
        *(uint4 *)((unsigned char *)sq + swz<DS>(r, cc)) = u;
        *(uint4 *)((unsigned char *)sq_lo + swz<DS>(r, cc)) = v;
    }
    fa_cp_async_wait<FA_KV_STAGES - 1>(); /* Q's group: the first of 1 + (NST - 1) */
    __syncthreads();

    const uint32_t qa = fa_smem_addr(sq);
    /* Q's A fragments stay in registers up to d = 128 (d = 256 would spill): the loop reads only K and V */
    constexpr int QR = D <= 128 ? D / 16 : 1;
    uint32_t qf[QR][4];
    if (D <= 128)
#pragma unroll
        for (int j = 0; j < QR; j++)
            fa_ldmatrix_x4(qf[j], qa + swz<DS>(((lane >> 3) & 1) * 8 + (lane & 7), j * 2 + (lane >> 4)));
    /* a tile of at most 8 rows (GQA group x new rows <= 8) leaves rows 8-15 of the products unused: their softmax
     * is skipped (their P and O rows are garbage, never read) */
    const bool rows_hi = R > 8;
    for (int it = 0; it < mine; it++) {
        fa_cp_async_wait<FA_KV_STAGES - 2>();
        __syncwarp();
        if (spec && it < FA_KV_STAGES - 1) { /* a speculated tile past the end: V's rows there zeroed (0 · NaN is NaN) */
            const int z0 = khi - key0(it);
            if (z0 < KV_KT) {
                const uint32_t sv = stage(it) + TILE_B;
                for (int c = lane; c < (KV_KT - z0) * CC; c += 32)
                    fa_st_shared_zero16(sv + tile_off<D, C>(z0 + c / CC, c % CC));
                __syncwarp();
            }
        }
        load(it + FA_KV_STAGES - 1);
        uint32_t ka, va;
        if constexpr (F8) { /* the tile pair widened to T in the warp's own buffer, read below as a 16-bit stage */
            widen_tiles<D, T>(stage(it), wide_a, lane);
            __syncwarp();
            ka = fa_opaque(wide_a), va = ka + KV_KT * DS * 2;
        } else {
            ka = fa_opaque(stage(it)), va = ka + TILE_B;
        }
        /* S = Q Kᵀ: 16 rows x 16 keys, two n-tiles of 8 keys; even and odd k-steps in separate accumulators (two
         * chains of dependent products instead of one) */
        float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        float sd[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int j = 0; j < D / 16; j++) {
            uint32_t a[4], bk[4];
            float(*acc)[4] = j % 2 ? sd : sc;
            if (D <= 128) a[0] = qf[j % QR][0], a[1] = qf[j % QR][1], a[2] = qf[j % QR][2], a[3] = qf[j % QR][3];
            else fa_ldmatrix_x4(a, qa + swz<DS>(((lane >> 3) & 1) * 8 + (lane & 7), j * 2 + (lane >> 4)));
            fa_ldmatrix_x4(bk, ka + swz<DS>((lane >> 4) * 8 + (lane & 7), j * 2 + ((lane >> 3) & 1)));
            fa_mma_free<T>(acc[0], a, bk[0], bk[1]);
            fa_mma_free<T>(acc[1], a, bk[2], bk[3]);
            if (qrot) {
                fa_ldmatrix_x4(a, qa + 16 * DS * 2 + swz<DS>(((lane >> 3) & 1) * 8 + (lane & 7), j * 2 + (lane >> 4)));
                fa_mma_free<T>(acc[0], a, bk[0], bk[1]);
                fa_mma_free<T>(acc[1], a, bk[2], bk[3]);
            }
        }
        /* scores in log2 units, masked (tiles that every row sees in full need no mask); m_new = max(m, rowmax);
         * P = 2^(S − m_new); l, O rescaled by 2^(m − m_new) */
        const int base = key0(it);
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) sc[nt][e] = (sc[nt][e] + sd[nt][e]) * (F8 ? s_qmul : p.qmul);
        if (!PLAIN && p.softcap_mul != 0.f)
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) sc[nt][e] = p.softcap_mul * tanhf(sc[nt][e]);
        if (base < kin_lo || base + KV_KT > kin_hi)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int key = base + nt * 8 + 2 * t4 + e;
                        if (key < lo[h] || key >= hi[h]) sc[nt][2 * h + e] = -INFINITY;
                    }
        float alpha[2] = {1.f, 1.f};
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (h == 1 && !rows_hi) continue;
            float mx = fmaxf(fmaxf(sc[0][2 * h], sc[0][2 * h + 1]), fmaxf(sc[1][2 * h], sc[1][2 * h + 1]));
            mx = fmaxf(m[h], fa_quad_max(mx));
            const float mu = mx == -INFINITY ? 0.f : mx;
            alpha[h] = fa_exp2(m[h] - mu);
            m[h] = mx;
            l[h] *= alpha[h];
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float pe = fa_exp2(sc[nt][2 * h + e] - mu);
                    sc[nt][2 * h + e] = pe;
                    l[h] += pe;
                }
        }
        /* once the maxima settle, alpha is 1 for every row of the warp: O needs no rescaling */
        if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f))
#pragma unroll
            for (int n = 0; n < D / 8; n++)
                o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];
        /* O += P V: P (16 rows x 16 keys) is the A operand straight from the score registers */
        const uint32_t pa[4] = {fa_pack2<T>(sc[0][0], sc[0][1]), fa_pack2<T>(sc[0][2], sc[0][3]),
                                fa_pack2<T>(sc[1][0], sc[1][1]), fa_pack2<T>(sc[1][2], sc[1][3])};
#pragma unroll
        for (int np = 0; np < D / 16; np++) {
            uint32_t bv[4];
            fa_ldmatrix_x4_trans(bv, va + swz<DS>(((lane >> 3) & 1) * 8 + (lane & 7), np * 2 + (lane >> 4)));
            fa_mma_free<T>(o[2 * np], pa, bv[0], bv[1]);
            fa_mma_free<T>(o[2 * np + 1], pa, bv[2], bv[3]);
        }
        __syncwarp();
    }
    fa_cp_async_wait<0>();
    /* an entry outside the pages for a key of the sequence (the speculated lookups also see entries past its end,
     * which it never uses) */
    if (bad_t < L)
        fa_kv_fault(p, FA_KV_FAULT_BLOCK_TABLE, b, bad_t / p.page_size,
                    p.block_table[(int64_t)row * p.bt_stride + bad_t / p.page_size], p.num_pages);
    l[0] = fa_quad_sum(l[0]), l[1] = fa_quad_sum(l[1]);

    /* the warps' states through shared memory (the ring is free once every warp is done) */
    __syncthreads();
    /* rows of D + 8 floats: a warp's float2 stores of rows g = 0..3 fall on distinct banks */
    constexpr int DP = D + 8;
    float *sm_o = (float *)(smem + SM::q); /* [NW][16][DP], rows < R only */
    float *sm_m = sm_o + NW * 16 * DP, *sm_l = sm_m + NW * 16;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = g + 8 * h;
        if (r >= R) continue;
        if (t4 == 0) sm_m[warp * 16 + r] = m[h], sm_l[warp * 16 + r] = l[h];
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *(float2 *)(sm_o + (warp * 16 + r) * DP + n * 8 + 2 * t4) = make_float2(o[n][2 * h], o[n][2 * h + 1]);
    }
    __shared__ int s_bad[16];
    if (threadIdx.x < 16) s_bad[threadIdx.x] = 0;
    __syncthreads();
    /* row r's state over the 4 warps, columns 8·pt ... 8·pt + 7 */
    auto state = [&](int r, int pt, float &M, float &Lr, float *O) {
        M = -INFINITY, Lr = 0.f;
#pragma unroll
        for (int e = 0; e < 8; e++) O[e] = 0.f;
        for (int w = 0; w < NW; w++) {
            const float4 a = *(const float4 *)(sm_o + (w * 16 + r) * DP + pt * 8),
                         c = *(const float4 *)(sm_o + (w * 16 + r) * DP + pt * 8 + 4);
            const float o2[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
            merge_state8(M, Lr, O, sm_m[w * 16 + r], sm_l[w * 16 + r], o2);
        }
    };
    /* cluster merge: the split's normalised O and LSE per row, after the warps' states in the ring */
    float *cl_o = sm_l + NW * 16, *cl_lse = cl_o + 16 * D;
    static_assert(NW * 16 * DP * 4 + 2 * NW * 16 * 4 + 16 * D * 4 + 16 * 4 <= SM::after_q,
                  "the warps' and the cluster's states fit in the ring");
    auto put = [&](int r, int pt, const float *O, float lse) { /* 8 columns of row r: out (one split) or the partial */
        const int gr = r0 + r, i = gr / p.group, hq = hk * p.group + gr % p.group;
        if (CL) { /* this split's state, for the cluster's merge */
            float *co = cl_o + r * D + pt * 8;
#pragma unroll
            for (int e = 0; e < 8; e++) co[e] = O[e];
            if (pt == 0) cl_lse[r] = lse;
        } else if (ns == 1) {
            uint4 u;
            u.x = fa_pack2<T>(O[0], O[1]), u.y = fa_pack2<T>(O[2], O[3]);
            u.z = fa_pack2<T>(O[4], O[5]), u.w = fa_pack2<T>(O[6], O[7]);
            *(uint4 *)((T *)p.o + b * p.o_sb + i * p.o_ss + hq * p.o_sh + pt * 8) = u;
            if (p.lse && pt == 0) p.lse[((int64_t)b * p.hq + hq) * p.sq + i] = lse;
        } else {
            const int64_t pr = (((int64_t)b * p.hq + hq) * p.sq + i) * p.nsplit + s;
            float4 *dst = (float4 *)(p.part_o + pr * D + pt * 8);
            dst[0] = make_float4(O[0], O[1], O[2], O[3]);
            dst[1] = make_float4(O[4], O[5], O[6], O[7]);
            if (pt == 0) p.part_lse[pr] = lse;
        }
    };
    /* the sink joins a row once, where the row is finished: here with one split (outside a cluster), else in the
     * merge (fa_kv_put_column) */
    const bool join = p.sinks && !CL && ns == 1;
    /* each row's state written as it stands; the numerics contract: a row whose state does not stand is written
     * again below, from float64 */
    for (int idx = threadIdx.x; idx < R * CH; idx += NT) {
        const int r = idx / CH, pt = idx % CH;
        float M, Lr, O[8];
        state(r, pt, M, Lr, O);
        const bool any = s_hi[r] > s_lo[r]; /* a row that sees no key here: O = 0, LSE = −inf (a masked 0·inf aside) */
        if (any && !fa_kv_stands(M, Lr, O)) s_bad[r] = 1;
        float inv = any ? 1.f / Lr : 0.f, lse = any ? (M + log2f(Lr)) * 0.6931471805599453f : -INFINITY;
        if (join) /* m in natural-log units and ℓ, joined in float64 (core/sink.h); no key: O = 0, LSE = the sink */
            inv = fa_sink_join(any ? (double)M * 0.6931471805599453 : -INFINITY, any ? (double)Lr : 0.0,
                               p.sinks[hk * p.group + (r0 + r) % p.group], &lse);
        if constexpr (F8) /* P (v·vds) = (P v)·vds, as the CPU */
            if (p.ds.v) inv *= p.ds.v[(int64_t)b * p.hk + hk];
#pragma unroll
        for (int e = 0; e < 8; e++) O[e] = any ? O[e] * inv : 0.f;
        put(r, pt, O, lse);
    }
    __syncthreads(); /* s_bad is complete, and a bad row's first write comes before its rewrite */
    for (int r = warp; r < R; r += NW) {
        if (!s_bad[r]) continue;
        const int gr = r0 + r, i = gr / p.group, hq = hk * p.group + gr % p.group;
        double x[(D + 31) / 32], lse;
        fa_kv_wait_first(p); /* it reads the appended rows from the cache */
        fa_kv_exact_row<D, T, D, C>(p, b, row, hk, i, hq, s_lo[r], s_hi[r], x, &lse);
        float lf = (float)lse;
        const float f = join ? fa_sink_join_lse(lf, p.sinks[hq], &lf) : 1.f; /* as the CPU's exact row */
        const int64_t rr = ((int64_t)b * p.hq + hq) * p.sq + i;
#pragma unroll
        for (int j = 0; j < (D + 31) / 32; j++) { /* lane: columns lane + 32 j (below D) */
            const int c = lane + 32 * j;
            if (D % 32 && c >= D) continue;
            if (CL) cl_o[r * D + c] = (float)x[j];
            else if (ns == 1) fa_st((T *)p.o + b * p.o_sb + i * p.o_ss + hq * p.o_sh + c, (float)x[j] * f);
            else p.part_o[(rr * p.nsplit + s) * D + c] = (float)x[j];
        }
        if (lane == 0) {
            if (CL) cl_lse[r] = lf;
            else if (ns > 1) p.part_lse[rr * p.nsplit + s] = lf;
            else if (p.lse) p.lse[rr] = lf;
        }
    }
    if (CL) { /* the splits of this row tile are one cluster: merge through distributed shared memory */
        fa_kv_cluster_merge<D, T, NW * 32>(p, cl_o, cl_lse, b, hk, r0, R);
        return;
    }
    if (ns == 1) return;
    /* the last CTA of this row tile to finish merges the splits (the counter is zero between calls). One thread
     * counts with release and acquire semantics at GPU scope, between two barriers: the barrier before orders the
     * CTA's partials before its release, the one after orders the last CTA's reads of the others' partials after
     * its acquire — no fence by every thread */
    __shared__ int s_last;
    __syncthreads();
    if (threadIdx.x == 0) {
        fa_kv_wait_first(p);
        int *const cnt = p.arrived + (int64_t)b * gridDim.y + blockIdx.y;
        s_last = fa_kv_count_acq_rel(cnt) == ns - 1;
        if (s_last) *cnt = 0; /* every split has counted: zero again for the next call */
    }
    __syncthreads();
    if (!s_last) return;
    if (ns <= FA_KV_CLUSTER_MAX) fa_kv_merge_regs<D, T, NW * 32>(p, b, hk, r0, R, ns);
    else fa_kv_merge_tile<D, T, NW * 32>(p, smem + SM::q, SM::after_q, b, hk, r0, R, ns);
}

/* The launch configuration of a call (cluster: the splits of a row tile are one cluster of nsplit CTAs). */
template <int D, int NW, typename T, typename C, bool CL, bool PLAIN>
static cudaError_t config(const fa_kv_params *p, cudaStream_t st, cudaLaunchConfig_t *cfg, cudaLaunchAttribute at[2]) {
    /* a cluster's CTAs each take more than half an SM's shared memory, so that no two share an SM: packed two to an
     * SM, a cluster of 4-warp CTAs left half its SMs idle */
    using SM = kv_mma_smem<D, NW, (int)sizeof(C)>;
    constexpr int smem = CL && SM::total < FA_KV_CLUSTER_SMEM ? FA_KV_CLUSTER_SMEM : SM::total;
    static unsigned char ready[64], wide[64];
    const void *fn = (const void *)splitkv_mma_kernel<D, NW, T, C, CL, PLAIN>;
    cudaError_t e = fa_cuda_attr_once(ready, fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e == cudaSuccess && CL) e = fa_cuda_attr_once(wide, fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    *cfg = cudaLaunchConfig_t{};
    cfg->gridDim = dim3(p->nsplit, p->hk * p->row_tiles, p->batch);
    cfg->blockDim = dim3(NW * 32);
    cfg->dynamicSmemBytes = smem;
    cfg->stream = st;
    int n = 0;
    if (p->after_first) { /* start while the first kernel runs; it waits where it reads its writes */
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (CL) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = p->nsplit, at[n].val.clusterDim.y = 1, at[n++].val.clusterDim.z = 1;
    }
    cfg->attrs = at;
    cfg->numAttrs = n;
    return e;
}

template <int D, int NW, typename T, typename C, bool CL, bool PLAIN>
static cudaError_t launch_mma_d(const fa_kv_params *p, const fa_kv_descales *ds, cudaStream_t st) {
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute at[2];
    const cudaError_t e = config<D, NW, T, C, CL, PLAIN>(p, st, &cfg, at);
    if (e != cudaSuccess) return e;
    if constexpr (sizeof(C) == 1) {
        fa_kv_e4m3_params q;
        static_cast<fa_kv_params &>(q) = *p;
        q.ds = *ds;
        return cudaLaunchKernelEx(&cfg, splitkv_mma_kernel<D, NW, T, C, CL, PLAIN>, q);
    } else {
        return cudaLaunchKernelEx(&cfg, splitkv_mma_kernel<D, NW, T, C, CL, PLAIN>, *p);
    }
}

/* Clusters of this call's shape that the GPU runs at once (0: none, or the query failed); asked of the general
 * kernel, whose registers and shared memory bound the plain one's. */
template <int D, int NW, typename T, typename C> static int clusters_d(const fa_kv_params *p) {
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute at[2];
    int n = 0;
    if (config<D, NW, T, C, true, false>(p, 0, &cfg, at) != cudaSuccess ||
        cudaOccupancyMaxActiveClusters(&n, splitkv_mma_kernel<D, NW, T, C, true, false>, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

/* Row I of fa_kv_insts for dtype T and cache type C: the attention launch (cluster merge or not, plain or general
 * instance) and the cluster occupancy query. */
template <int I, typename T, typename C>
static cudaError_t launch_row(const fa_kv_params *p, const fa_kv_descales *ds, cudaStream_t st) {
    constexpr int D = fa_kv_insts[I].d, NW = fa_kv_insts[I].nw;
    if (p->cluster)
        return p->plain ? launch_mma_d<D, NW, T, C, true, true>(p, ds, st)
                        : launch_mma_d<D, NW, T, C, true, false>(p, ds, st);
    return p->plain ? launch_mma_d<D, NW, T, C, false, true>(p, ds, st)
                    : launch_mma_d<D, NW, T, C, false, false>(p, ds, st);
}
struct kv_row_fns {
    cudaError_t (*launch)(const fa_kv_params *, const fa_kv_descales *, cudaStream_t);
    int (*clusters)(const fa_kv_params *);
};
template <int I, typename T, typename C> static kv_row_fns row_fns_c() {
    return {launch_row<I, T, C>, clusters_d<fa_kv_insts[I].d, fa_kv_insts[I].nw, T, C>};
}
/* dtype T's instances of row I over a cache of T, or of E4M3 (f8) */
template <int I, typename T> static kv_row_fns row_fns(int f8) {
    return f8 ? row_fns_c<I, T, uint8_t>() : row_fns_c<I, T, T>();
}
/* The instances of row inst (dtype 1 = f16, else bf16; f8: over an E4M3 cache); none where inst is not a row of the
 * table or not p's. */
static kv_row_fns row_of(const fa_kv_params *p, int inst, int dtype, int f8) {
    static_assert(FA_KV_NINST == 7, "one case per row of fa_kv_insts");
    if (inst < 0 || inst >= FA_KV_NINST || fa_kv_insts[inst].d != p->d || fa_kv_insts[inst].nw != p->warps) return {};
    const bool h = dtype == 1;
    switch (inst) {
    case 0: return h ? row_fns<0, __half>(f8) : row_fns<0, __nv_bfloat16>(f8);
    case 1: return h ? row_fns<1, __half>(f8) : row_fns<1, __nv_bfloat16>(f8);
    case 2: return h ? row_fns<2, __half>(f8) : row_fns<2, __nv_bfloat16>(f8);
    case 3: return h ? row_fns<3, __half>(f8) : row_fns<3, __nv_bfloat16>(f8);
    case 4: return h ? row_fns<4, __half>(f8) : row_fns<4, __nv_bfloat16>(f8);
    case 5: return h ? row_fns<5, __half>(f8) : row_fns<5, __nv_bfloat16>(f8);
    case 6: return h ? row_fns<6, __half>(f8) : row_fns<6, __nv_bfloat16>(f8);
    default: return {};
    }
}

extern "C" cudaError_t fa_kv_attend_launch(const fa_kv_params *p, const fa_kv_descales *ds, int inst, int dtype,
                                           cudaStream_t st) {
    const kv_row_fns f = row_of(p, inst, dtype, ds != NULL);
    return f.launch ? f.launch(p, ds, st) : cudaErrorInvalidValue;
}

extern "C" int fa_kv_active_clusters(const fa_kv_params *p, int inst, int dtype, int f8) {
    const kv_row_fns f = row_of(p, inst, dtype, f8);
    return f.clusters ? f.clusters(p) : 0;
}
