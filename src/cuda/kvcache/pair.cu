/* Split-KV attention over a KV cache whose v has a head dim of its own (dv != d: MLA's latent (576, 512), (192, 128)),
 * on the tensor cores (mma.sync m16n8k16). The grid and the row tiles are splitkv.cu's: one CTA per (split, K/V head
 * x tile of 16 query rows, sequence), so each K/V row is read from HBM once per K/V head and row tile. What differs
 * is the split of the work among the 8 warps: at dv = 512 one warp cannot hold a 16-row O (256 fp32 registers a
 * thread), so the warps split O's columns (dv / 8 each) and share every key, block by block of 32 keys:
 *   S = Q Kᵀ      warp w: key tile w % 2 (16 keys) x slice w / 2 of d (d / 4 wide) -> fp32 partials, shared memory
 *   softmax       warp w: rows w, w + 8; lane = key: S = Σ partials, masked; m_new = max(m, rowmax(S));
 *                 P = 2^(S − m_new) (16-bit, shared memory); α = 2^(m − m_new); ℓ = α ℓ + rowsum(P)
 *   O = α O + P V warp w: columns [w·dv/8, (w+1)·dv/8) of O, in registers, for every row
 * K and V blocks come in by cp.async (all threads) through a ring of 2 or 3 stages, rows swizzled by 16-byte chunk
 * as in splitkv.cu. The end is splitkv.cu's: the numerics contract per row (a row that fails it is recomputed in
 * float64), out and LSE with one split, else fp32 partials that the last CTA of the row tile merges (finish.cuh).
 * No cluster merge, speculative copies or plain instance: the pair rows are correct first, not tuned
 * (docs/kvcache.md). */
#include "../mma_sync/mma.cuh"
#include "finish.cuh"
#include "kvcache.h"
#include "qtile.cuh"

#include "core/visible.h"

#include <limits.h>
#include <math.h>

/* The CTA's shape and shared memory for head dims (D, DV). */
template <int D, int DV> struct kv_pair_cfg {
    static constexpr int NW = 8, NT = NW * 32;
    static constexpr int BK = 32, KT = BK / 16;   /* keys per block, 16-key tiles per block */
    static constexpr int KS = NW / KT, DS = D / KS; /* slices of d for S, their width */
    static constexpr int CW = DV / NW;            /* O columns per warp */
    static constexpr int CH = D / 8, CHV = DV / 8; /* 16-byte chunks of a K row, a V row */
    static constexpr int LDS = BK + 8, LDP = BK + 8; /* padded rows of the S partials (fp32) and P (16-bit) */
    static constexpr int Q = 2 * 16 * D * 2;       /* Q tile (rotary: hi and lo parts) */
    static constexpr int KB = BK * D * 2, STAGE = KB + BK * DV * 2;
    static constexpr int NST = Q + 3 * STAGE <= 160 * 1024 ? 3 : 2; /* stages of the K/V ring */
    static constexpr int total = Q + NST * STAGE;
    static_assert(DS % 16 == 0 && CW % 16 == 0 && CH % 8 == 0 && CHV % 8 == 0, "whole MMA tiles, whole swizzle rows");
    static_assert(total + KS * 16 * LDS * 4 + 16 * LDP * 2 <= 220 * 1024, "shared memory");
};

template <int D, int DV, typename T>
__global__ void __launch_bounds__(256, 1) splitkv_pair_kernel(const fa_kv_params p) {
    typedef kv_pair_cfg<D, DV> C;
    constexpr int NT = C::NT, BK = C::BK, CH = C::CH, CHV = C::CHV, NST = C::NST, CW = C::CW;
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ __align__(16) float sS[C::KS][16][C::LDS];
    __shared__ __align__(16) uint16_t sP[16][C::LDP];
    __shared__ float s_alpha[16], s_m[16], s_l[16];
    __shared__ int s_lo[16], s_hi[16], s_bad[16];
    T *sq = (T *)smem;
    const int s = blockIdx.x, hk = blockIdx.y / p.row_tiles, tile = blockIdx.y % p.row_tiles, b = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
    const int r0 = tile * 16, R = min(16, p.group * p.sq - r0);
    const bool qrot = p.qrot != nullptr;
    if (!qrot) fa_kv_copy_q<T, D, NT>(p, fa_smem_addr(sq), b, hk, r0, R); /* the first commit group */
    fa_cp_async_commit();
    const int len = p.seqlens[b];
    const int L = fa_kv_len(p, len), row = fa_kv_cache_row(p, b);
    if (s == 0 && blockIdx.y == 0 && tid == 0) fa_kv_check_seq(p, b, len); /* once per sequence */
    int chunk, ns;
    fa_kv_split(p, L, &chunk, &ns);
    if (s >= ns) { /* a split past the sequence's end */
        fa_cp_async_wait<0>();
        return;
    }
    const int s0 = s * chunk, s1 = min(L, s0 + chunk);

    /* each row's visible keys inside the split and their union [klo, khi) */
    int klo = s1, khi = s0;
    for (int r = 0; r < 16; r++) {
        int a = 0, z = 0;
        if (r < R) {
            fa_visible_keys32((r0 + r) / p.group, p.sq, L, p.wl, p.wr, &a, &z);
            fa_chunk_keys32((r0 + r) / p.group + L - p.sq, (r0 + r) / p.group + L - p.sq, p.attention_chunk, &a, &z);
            a = max(a, s0), z = max(a, min(z, s1));
            if (z > a) klo = min(klo, a), khi = max(khi, z);
        }
        if (tid == 0) s_lo[r] = a, s_hi[r] = z, s_bad[r] = 0;
    }
    fa_kv_wait_first(p); /* the first kernel's appended rows and rotated q */
    const int kbase = klo & ~(BK - 1), nblk = khi > klo ? (khi - kbase + BK - 1) / BK : 0;
    const T *kc = (const T *)p.kc, *vc = (const T *)p.vc;
    const uint32_t ring_a = fa_smem_addr(smem + C::Q);
    auto load = [&](int it) { /* block it of keys into stage it % NST, all threads, one commit group */
        if (it < nblk) {
            const int base = kbase + it * BK;
            const uint32_t sk = ring_a + (it % NST) * C::STAGE, sv = sk + C::KB;
            for (int c = tid; c < BK * CH; c += NT) {
                const int r = c / CH, cc = c % CH, t = base + r;
                const bool ok = t >= klo && t < khi; /* keys outside every row's range: zero-filled, never read */
                const T *src = ok ? kc + fa_kv_key(p, row, t, hk, p.k_sb, p.k_ss, p.k_sh) + cc * 8 : kc;
                fa_cp_async16_at(sk + swz<D>(r, cc), src, ok ? 16 : 0);
            }
            for (int c = tid; c < BK * CHV; c += NT) {
                const int r = c / CHV, cc = c % CHV, t = base + r;
                const bool ok = t >= klo && t < khi;
                const T *src = ok ? vc + fa_kv_key(p, row, t, hk, p.v_sb, p.v_ss, p.v_sh) + cc * 8 : vc;
                fa_cp_async16_at(sv + swz<DV>(r, cc), src, ok ? 16 : 0);
            }
            if (p.paged && tid < BK) { /* an entry outside the pages for a key of the sequence: clamped, recorded */
                const int t = base + tid;
                if (t >= klo && t < khi && fa_kv_page_checked(p, row, t) < 0)
                    fa_kv_fault(p, FA_KV_FAULT_BLOCK_TABLE, b, t / p.page_size,
                                p.block_table[(int64_t)row * p.bt_stride + t / p.page_size], p.num_pages);
            }
        }
        fa_cp_async_commit();
    };
#pragma unroll
    for (int it = 0; it < NST - 1; it++) load(it);
    /* with rotary, q is the fp32 rotated q, taken as hi + lo (qtile.cuh) */
    T *sq_lo = sq + 16 * D;
    for (int c = tid; qrot && c < 16 * CH; c += NT) {
        const int r = c / CH, cc = c % CH;
        uint4 u = make_uint4(0, 0, 0, 0), v = u;
        if (r < R) {
            const int gr = r0 + r, i = gr / p.group, hq = hk * p.group + gr % p.group;
            fa_kv_qsplit8<T>(p.qrot + (((int64_t)b * p.sq + i) * p.hq + hq) * D + cc * 8, u, v);
        }
        *(uint4 *)((unsigned char *)sq + swz<D>(r, cc)) = u;
        *(uint4 *)((unsigned char *)sq_lo + swz<D>(r, cc)) = v;
    }

    const uint32_t qa = fa_smem_addr(sq), pa = fa_smem_addr(&sP[0][0]);
    const int kt = warp % C::KT, ks = warp / C::KT, c0 = warp * CW; /* this warp's key tile, d slice, O columns */
    float m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.f, 0.f}; /* rows warp, warp + 8 (softmax step) */
    float o[CW / 8][4];
#pragma unroll
    for (int n = 0; n < CW / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

    for (int it = 0; it < nblk; it++) {
        fa_cp_async_wait<NST - 2>();
        __syncthreads(); /* block it landed; every warp is past block it − 1 (its stage, sS, sP) */
        load(it + NST - 1);
        const uint32_t ka = ring_a + (it % NST) * C::STAGE, va = ka + C::KB;
        { /* S partial: 16 rows x this warp's 16 keys over its slice of d */
            float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
            for (int j = ks * (C::DS / 16); j < (ks + 1) * (C::DS / 16); j++) {
                uint32_t a[4], bk[4];
                fa_ldmatrix_x4(a, qa + swz<D>(((lane >> 3) & 1) * 8 + (lane & 7), j * 2 + (lane >> 4)));
                fa_ldmatrix_x4(bk, ka + swz<D>(kt * 16 + (lane >> 4) * 8 + (lane & 7), j * 2 + ((lane >> 3) & 1)));
                fa_mma_free<T>(sc[0], a, bk[0], bk[1]);
                fa_mma_free<T>(sc[1], a, bk[2], bk[3]);
                if (qrot) {
                    fa_ldmatrix_x4(a, qa + 16 * D * 2 +
                                          swz<D>(((lane >> 3) & 1) * 8 + (lane & 7), j * 2 + (lane >> 4)));
                    fa_mma_free<T>(sc[0], a, bk[0], bk[1]);
                    fa_mma_free<T>(sc[1], a, bk[2], bk[3]);
                }
            }
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    *(float2 *)&sS[ks][g + 8 * h][kt * 16 + nt * 8 + 2 * t4] =
                        make_float2(sc[nt][2 * h], sc[nt][2 * h + 1]);
        }
        __syncthreads(); /* every partial of S */
        { /* the online softmax of rows warp and warp + 8, lane = key (log2 units) */
            const int key = kbase + it * BK + lane;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = warp + 8 * h;
                float x = 0.f;
#pragma unroll
                for (int k = 0; k < C::KS; k++) x += sS[k][r][lane];
                x *= p.qmul;
                if (p.softcap_mul != 0.f) x = p.softcap_mul * tanhf(x);
                if (r >= R || key < s_lo[r] || key >= s_hi[r]) x = -INFINITY;
                float mx = x;
#pragma unroll
                for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
                mx = fmaxf(m[h], mx);
                const float mu = mx == -INFINITY ? 0.f : mx, alpha = fa_exp2(m[h] - mu), pe = fa_exp2(x - mu);
                m[h] = mx;
                lsum[h] = lsum[h] * alpha + pe; /* per lane; summed over the warp at the end */
                const uint32_t pk = fa_pack2<T>(pe, 0.f);
                sP[r][lane] = (uint16_t)(pk & 0xffffu);
                if (lane == 0) s_alpha[r] = alpha;
            }
        }
        __syncthreads(); /* P and α of every row */
        { /* O = α O + P V on this warp's columns */
            const float a0 = s_alpha[g], a1 = s_alpha[g + 8];
#pragma unroll
            for (int n = 0; n < CW / 8; n++) o[n][0] *= a0, o[n][1] *= a0, o[n][2] *= a1, o[n][3] *= a1;
#pragma unroll
            for (int kk = 0; kk < C::KT; kk++) {
                uint32_t a[4];
                fa_ldmatrix_x4(a, pa + ((lane & 15) * C::LDP + kk * 16 + (lane >> 4) * 8) * 2);
#pragma unroll
                for (int np = 0; np < CW / 16; np++) {
                    uint32_t bv[4];
                    fa_ldmatrix_x4_trans(bv, va + swz<DV>(kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7),
                                                           c0 / 8 + np * 2 + (lane >> 4)));
                    fa_mma_free<T>(o[2 * np], a, bv[0], bv[1]);
                    fa_mma_free<T>(o[2 * np + 1], a, bv[2], bv[3]);
                }
            }
        }
    }
    fa_cp_async_wait<0>();
    /* each row's m and ℓ from the warp that kept them */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float l = lsum[h];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
        if (lane == 0) s_m[warp + 8 * h] = m[h], s_l[warp + 8 * h] = l;
    }
    __syncthreads();
    /* the numerics contract: a row whose fp32 state does not stand is recomputed below, in float64 */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = g + 8 * h;
        if (r >= R || s_hi[r] <= s_lo[r]) continue;
        float z8[8];
#pragma unroll
        for (int e = 0; e < 8; e++) z8[e] = 0.f;
#pragma unroll
        for (int n = 0; n < CW / 8; n++) z8[n % 4 * 2] += o[n][2 * h] * 0.f, z8[n % 4 * 2 + 1] += o[n][2 * h + 1] * 0.f;
        if (!fa_kv_stands(s_m[r], s_l[r], z8)) s_bad[r] = 1;
    }
    /* this warp's columns of each row: out (one split, the sink joined here) or the split's fp32 partial */
    const bool join = p.sinks && ns == 1;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = g + 8 * h;
        if (r >= R) continue;
        const int gr = r0 + r, i = gr / p.group, hq = hk * p.group + gr % p.group;
        const bool any = s_hi[r] > s_lo[r]; /* a row that sees no key here: O = 0, LSE = −inf */
        const float M = s_m[r], Lr = s_l[r];
        float inv = any ? 1.f / Lr : 0.f, lse = any ? (M + log2f(Lr)) * 0.6931471805599453f : -INFINITY;
        if (join)
            inv = fa_sink_join(any ? (double)M * 0.6931471805599453 : -INFINITY, any ? (double)Lr : 0.0, p.sinks[hq],
                               &lse);
        const int64_t rr = ((int64_t)b * p.hq + hq) * p.sq + i;
#pragma unroll
        for (int n = 0; n < CW / 8; n++) {
            const int c = c0 + n * 8 + 2 * t4;
            const float x0 = any ? o[n][2 * h] * inv : 0.f, x1 = any ? o[n][2 * h + 1] * inv : 0.f;
            if (ns == 1) *(uint32_t *)((T *)p.o + b * p.o_sb + i * p.o_ss + hq * p.o_sh + c) = fa_pack2<T>(x0, x1);
            else *(float2 *)(p.part_o + (rr * p.nsplit + s) * DV + c) = make_float2(x0, x1);
        }
        if (warp == 0 && t4 == 0) {
            if (ns > 1) p.part_lse[rr * p.nsplit + s] = lse;
            else if (p.lse) p.lse[rr] = lse;
        }
    }
    __syncthreads(); /* s_bad is complete, and a bad row's first write comes before its rewrite */
    for (int r = warp; r < R; r += C::NW) {
        if (!s_bad[r]) continue;
        const int gr = r0 + r, i = gr / p.group, hq = hk * p.group + gr % p.group;
        double x[DV / 32], lse;
        fa_kv_exact_row<D, T, DV>(p, b, row, hk, i, hq, s_lo[r], s_hi[r], x, &lse);
        float lf = (float)lse;
        const float f = join ? fa_sink_join_lse(lf, p.sinks[hq], &lf) : 1.f;
        const int64_t rr = ((int64_t)b * p.hq + hq) * p.sq + i;
#pragma unroll
        for (int j = 0; j < DV / 32; j++) {
            const int c = lane + 32 * j;
            if (ns == 1) fa_st((T *)p.o + b * p.o_sb + i * p.o_ss + hq * p.o_sh + c, (float)x[j] * f);
            else p.part_o[(rr * p.nsplit + s) * DV + c] = (float)x[j];
        }
        if (lane == 0) {
            if (ns > 1) p.part_lse[rr * p.nsplit + s] = lf;
            else if (p.lse) p.lse[rr] = lf;
        }
    }
    if (ns == 1) return;
    /* the last CTA of this row tile merges the splits (splitkv.cu's protocol: one counter per row tile, zero
     * between calls; release and acquire at GPU scope by one thread between two barriers) */
    __shared__ int s_last;
    __syncthreads();
    if (tid == 0) {
        int *const cnt = p.arrived + (int64_t)b * gridDim.y + blockIdx.y;
        s_last = fa_kv_count_acq_rel(cnt) == ns - 1;
        if (s_last) *cnt = 0;
    }
    __syncthreads();
    if (!s_last) return;
    if (ns <= FA_KV_CLUSTER_MAX) fa_kv_merge_regs<DV, T, NT>(p, b, hk, r0, R, ns);
    else fa_kv_merge_tile<DV, T, NT>(p, smem + C::Q, NST * C::STAGE, b, hk, r0, R, ns);
}

template <int D, int DV, typename T> static cudaError_t launch_pair(const fa_kv_params *p, cudaStream_t st) {
    constexpr int smem = kv_pair_cfg<D, DV>::total;
    static unsigned char ready[64];
    const void *fn = (const void *)splitkv_pair_kernel<D, DV, T>;
    cudaError_t e = fa_cuda_attr_once(ready, fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = dim3(p->nsplit, p->hk * p->row_tiles, p->batch);
    cfg.blockDim = dim3(kv_pair_cfg<D, DV>::NT);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    if (p->after_first) { /* start while the first kernel runs; it waits before it reads the cache */
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at, cfg.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&cfg, splitkv_pair_kernel<D, DV, T>, *p);
}

template <int I> static cudaError_t launch_pair_row(const fa_kv_params *p, int dtype, cudaStream_t st) {
    constexpr int D = fa_kv_pair_insts[I].d, DV = fa_kv_pair_insts[I].dv;
    return dtype == 1 ? launch_pair<D, DV, __half>(p, st) : launch_pair<D, DV, __nv_bfloat16>(p, st);
}

extern "C" cudaError_t fa_kv_pair_launch(const fa_kv_params *p, int d_v, int inst, int dtype, cudaStream_t st) {
    static_assert(FA_KV_NPAIR == 2, "one case per row of fa_kv_pair_insts");
    if (inst < 0 || inst >= FA_KV_NPAIR || fa_kv_pair_insts[inst].d != p->d || fa_kv_pair_insts[inst].dv != d_v)
        return cudaErrorInvalidValue;
    switch (inst) {
    case 0: return launch_pair_row<0>(p, dtype, st);
    case 1: return launch_pair_row<1>(p, dtype, st);
    default: return cudaErrorInvalidValue;
    }
}
