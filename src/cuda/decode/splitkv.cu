/* Split-KV decode attention (FlashDecoding) over a contiguous or paged cache. One CTA per (split, K/V head x row
 * tile, sequence) holds the RT query rows that read that K/V head (GQA rows x new rows), so each K/V row is read from
 * HBM once per K/V head. A key row is read with 16-byte loads by D/8 lanes (8 elements each); a warp covers 256/D keys
 * per step, U steps in flight (4, or 2 with 8 rows to stay in registers). Each lane group keeps its own online softmax (m, l in log2 units, O for its 8 columns)
 * over the keys it saw; the groups merge by shuffles, the warps through shared memory. One split writes out and LSE;
 * several write fp32 partials merged by merge.cu. docs/decoding.md. */
#include "decode.h"

#include "core/visible.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>


template <typename T> struct vec8;
template <> struct vec8<__half> {
    static __device__ __forceinline__ void to_f(const uint4 &u, float *f) {
        const __half2 *h = (const __half2 *)&u;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 x = __half22float2(h[i]);
            f[2 * i] = x.x, f[2 * i + 1] = x.y;
        }
    }
    static __device__ __forceinline__ uint4 from_f(const float *f) {
        uint4 u;
        __half2 *h = (__half2 *)&u;
#pragma unroll
        for (int i = 0; i < 4; i++) h[i] = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
        return u;
    }
};
template <> struct vec8<__nv_bfloat16> {
    static __device__ __forceinline__ void to_f(const uint4 &u, float *f) {
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
    static __device__ __forceinline__ uint4 from_f(const float *f) {
        uint4 u;
        __nv_bfloat162 *h = (__nv_bfloat162 *)&u;
#pragma unroll
        for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
        return u;
    }
};

/* Merge state (m2, l2, o2) into (m, l, o): m = max; each side scaled by 2^(m_side − m) (0 for an empty side). */
__device__ __forceinline__ void merge_state(float &m, float &l, float *o, float m2, float l2, const float *o2) {
    const float mn = fmaxf(m, m2);
    const float a = m == -INFINITY ? 0.f : exp2f(m - mn), c = m2 == -INFINITY ? 0.f : exp2f(m2 - mn);
    l = l * a + l2 * c;
#pragma unroll
    for (int e = 0; e < 8; e++) o[e] = o[e] * a + o2[e] * c;
    m = mn;
}

template <int D, typename T, int RT>
__global__ void __launch_bounds__(FA_DEC_THREADS) splitkv_kernel(const fa_dec_params p) {
    constexpr int TPK = D / 8, KPW = 32 / TPK, NW = FA_DEC_THREADS / 32, STEP = NW * KPW;
    constexpr int U = RT >= 8 ? 2 : 4; /* key steps in flight per lane group: U x (K + V) 16-byte loads per lane */
    const int s = blockIdx.x, hk = blockIdx.y / p.row_tiles, tile = blockIdx.y % p.row_tiles, b = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, slot = lane / TPK, part = lane % TPK;
    const int L = fa_dec_len(p, b), row = fa_dec_row(p, b);
    int chunk, ns;
    fa_dec_split(p, L, &chunk, &ns);
    if (s >= ns) return;
    const int s0 = s * chunk, s1 = min(L, s0 + chunk);
    const int rows_total = p.group * p.sq, r0 = tile * RT;
    const int R = min(RT, rows_total - r0);

    /* Qi: this lane's 8 columns of each row, pre-multiplied; each row's visible keys inside the split */
    float q[RT][8];
    int lo[RT], hi[RT];
    int klo = s1, khi = s0;
#pragma unroll
    for (int r = 0; r < RT; r++) {
        lo[r] = hi[r] = 0;
        if (r < R) {
            const int gr = r0 + r, i = gr / p.group, hq = hk * p.group + gr % p.group;
            if (p.qrot) {
                const float *x = p.qrot + (((int64_t)b * p.sq + i) * p.hq + hq) * D + part * 8;
#pragma unroll
                for (int e = 0; e < 8; e++) q[r][e] = x[e] * p.qmul;
            } else {
                const uint4 u = *(const uint4 *)((const T *)p.q + b * p.q_sb + i * p.q_ss + hq * p.q_sh + part * 8);
                vec8<T>::to_f(u, q[r]);
#pragma unroll
                for (int e = 0; e < 8; e++) q[r][e] *= p.qmul;
            }
            int a, z;
            fa_visible_keys32(i, p.sq, L, p.wl, p.wr, &a, &z);
            a = max(a, s0), z = min(z, s1);
            lo[r] = a, hi[r] = max(a, z);
            if (hi[r] > lo[r]) klo = min(klo, lo[r]), khi = max(khi, hi[r]);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) q[r][e] = 0.f;
        }
    }
    float m[RT], l[RT], o[RT][8];
#pragma unroll
    for (int r = 0; r < RT; r++) {
        m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
        for (int e = 0; e < 8; e++) o[r][e] = 0.f;
    }
    const T *kc = (const T *)p.kc, *vc = (const T *)p.vc;
    /* walk the keys: lane group (warp, slot) takes keys klo + warp·KPW + slot + it·STEP (it = step·U + u) */
    for (int base = klo + warp * KPW; base < khi; base += STEP * U) {
        uint4 kv[U], vv[U];
        int tk[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            tk[u] = base + u * STEP + slot;
            if (tk[u] < khi) {
                kv[u] = __ldg((const uint4 *)(kc + fa_dec_key(p, row, tk[u], hk, p.k_sb, p.k_ss, p.k_sh)) + part);
                vv[u] = __ldg((const uint4 *)(vc + fa_dec_key(p, row, tk[u], hk, p.v_sb, p.v_ss, p.v_sh)) + part);
            } else {
                kv[u] = vv[u] = make_uint4(0, 0, 0, 0);
            }
        }
        float kf[U][8], sc[RT][U];
#pragma unroll
        for (int u = 0; u < U; u++) vec8<T>::to_f(kv[u], kf[u]);
        /* S = Qi Kjᵀ: 8 products per lane, summed over the TPK lanes of the group */
#pragma unroll
        for (int r = 0; r < RT; r++)
#pragma unroll
            for (int u = 0; u < U; u++) {
                float x = 0.f;
#pragma unroll
                for (int e = 0; e < 8; e++) x = fmaf(q[r][e], kf[u][e], x);
#pragma unroll
                for (int off = TPK / 2; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
                if (p.softcap_mul != 0.f) x = p.softcap_mul * tanhf(x);
                sc[r][u] = (r < R && tk[u] >= lo[r] && tk[u] < hi[r]) ? x : -INFINITY;
            }
        float vf[U][8];
#pragma unroll
        for (int u = 0; u < U; u++) vec8<T>::to_f(vv[u], vf[u]);
        /* m_new = max(m, rowmax(S)); P = 2^(S − m_new); l = 2^(m − m_new) l + rowsum(P); O = 2^(m − m_new) O + P Vj */
#pragma unroll
        for (int r = 0; r < RT; r++) {
            float mx = m[r];
#pragma unroll
            for (int u = 0; u < U; u++) mx = fmaxf(mx, sc[r][u]);
            if (mx == -INFINITY) continue;
            const float alpha = exp2f(m[r] - mx);
            l[r] *= alpha;
#pragma unroll
            for (int e = 0; e < 8; e++) o[r][e] *= alpha;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const float pu = exp2f(sc[r][u] - mx);
                l[r] += pu;
#pragma unroll
                for (int e = 0; e < 8; e++) o[r][e] = fmaf(pu, vf[u][e], o[r][e]);
            }
            m[r] = mx;
        }
    }
    /* the lane groups of a warp: merge by shuffles across the slot bits */
#pragma unroll
    for (int off = TPK; off < 32; off <<= 1)
#pragma unroll
        for (int r = 0; r < RT; r++) {
            float o2[8];
            const float m2 = __shfl_xor_sync(0xffffffffu, m[r], off), l2 = __shfl_xor_sync(0xffffffffu, l[r], off);
#pragma unroll
            for (int e = 0; e < 8; e++) o2[e] = __shfl_xor_sync(0xffffffffu, o[r][e], off);
            merge_state(m[r], l[r], o[r], m2, l2, o2);
        }
    /* the warps: through shared memory, then thread (r, part) finishes row r's 8 columns */
    __shared__ float sm_m[NW][RT], sm_l[NW][RT];
    __shared__ float4 sm_o[NW][RT][TPK][2];
    if (slot == 0) {
#pragma unroll
        for (int r = 0; r < RT; r++) {
            if (part == 0) sm_m[warp][r] = m[r], sm_l[warp][r] = l[r];
            sm_o[warp][r][part][0] = make_float4(o[r][0], o[r][1], o[r][2], o[r][3]);
            sm_o[warp][r][part][1] = make_float4(o[r][4], o[r][5], o[r][6], o[r][7]);
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < R * TPK; idx += FA_DEC_THREADS) {
        const int r = idx / TPK, pt = idx % TPK;
        float M = -INFINITY, Lr = 0.f, O[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int w = 0; w < NW; w++) {
            const float4 a = sm_o[w][r][pt][0], c = sm_o[w][r][pt][1];
            const float o2[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
            merge_state(M, Lr, O, sm_m[w][r], sm_l[w][r], o2);
        }
        const float inv = Lr > 0.f ? 1.f / Lr : 0.f;
        const float lse = Lr > 0.f ? (M + log2f(Lr)) * 0.6931471805599453f : -INFINITY;
#pragma unroll
        for (int e = 0; e < 8; e++) O[e] *= inv;
        const int gr = r0 + r, i = gr / p.group, hq = hk * p.group + gr % p.group;
        if (ns == 1) {
            *(uint4 *)((T *)p.o + b * p.o_sb + i * p.o_ss + hq * p.o_sh + pt * 8) = vec8<T>::from_f(O);
            if (p.lse && pt == 0) p.lse[((int64_t)b * p.hq + hq) * p.sq + i] = lse;
        } else {
            const int64_t pr = (((int64_t)b * p.hq + hq) * p.sq + i) * p.nsplit + s;
            float4 *dst = (float4 *)(p.part_o + pr * D + pt * 8);
            dst[0] = make_float4(O[0], O[1], O[2], O[3]);
            dst[1] = make_float4(O[4], O[5], O[6], O[7]);
            if (pt == 0) p.part_lse[pr] = lse;
        }
    }
}

extern "C" int fa_dec_rows_per_cta(int rows) { return rows <= 1 ? 1 : rows <= 2 ? 2 : rows <= 4 ? 4 : 8; }

template <int D, typename T>
static cudaError_t launch_d(const fa_dec_params *p, cudaStream_t st) {
    const dim3 grid(p->nsplit, p->hk * p->row_tiles, p->batch);
    switch (p->rows_per_cta) {
    case 1: splitkv_kernel<D, T, 1><<<grid, FA_DEC_THREADS, 0, st>>>(*p); break;
    case 2: splitkv_kernel<D, T, 2><<<grid, FA_DEC_THREADS, 0, st>>>(*p); break;
    case 4: splitkv_kernel<D, T, 4><<<grid, FA_DEC_THREADS, 0, st>>>(*p); break;
    default: splitkv_kernel<D, T, 8><<<grid, FA_DEC_THREADS, 0, st>>>(*p); break;
    }
    return cudaGetLastError();
}

template <typename T>
static cudaError_t launch_t(const fa_dec_params *p, cudaStream_t st) {
    switch (p->d) {
    case 64: return launch_d<64, T>(p, st);
    case 128: return launch_d<128, T>(p, st);
    default: return launch_d<256, T>(p, st);
    }
}

extern "C" cudaError_t fa_dec_attend_launch(const fa_dec_params *p, int dtype, cudaStream_t st) {
    return dtype == 1 ? launch_t<__half>(p, st) : launch_t<__nv_bfloat16>(p, st);
}
