/* The KV-cache call's first kernel, where one is needed: append the new K/V rows into the cache at each sequence's
 * current length, rotating k (and writing the rotated q to the workspace) first when rotary is on, and zero the
 * sequence's split counters when they lie in a caller's workspace (the context's stay zero between calls). One CTA
 * per (new row i, sequence b). A sequence whose length, cache row or rotary positions are out of range appends
 * nothing, nor does a key whose block-table entry is outside the pages, so a bad index never writes out of bounds or
 * into another sequence's rows (the attention kernel records it: kvcache.h, fa_kv_check_seq). The attention kernel
 * is launched as its programmatic dependent: it starts at once and waits for this kernel only where it reads what
 * this one writes. */
#include "../convert.cuh"
#include "kvcache.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

extern "C" {
#include "core/fp8.h"
}

/* Element c of a row x[] rotated at position pos (the pair partner read from the same row). */
template <typename T>
__device__ __forceinline__ float rotated(const fa_kv_params &p, const T *x, int c, int pos) {
    const float xc = fa_to_f32(x[c]);
    if (c >= p.rot_dim) return xc;
    const int half = p.rot_dim / 2;
    int j, partner;
    float sign;
    if (p.rot_interleaved) {
        j = c / 2;
        partner = c ^ 1;
        sign = (c & 1) ? 1.f : -1.f;
    } else {
        j = c < half ? c : c - half;
        partner = c < half ? c + half : c - half;
        sign = c < half ? -1.f : 1.f;
    }
    const float cs = p.rcos[(int64_t)pos * half + j], sn = p.rsin[(int64_t)pos * half + j];
    /* x0' = x0 c - x1 s (first of the pair), x1' = x0 s + x1 c (second): the same products as the CPU's */
    const float xp = fa_to_f32(x[partner]);
    return sign < 0 ? xc * cs - xp * sn : xp * sn + xc * cs;
}

/* C: the cache's type, T or E4M3 (uint8_t): new rows quantised with their sequence's descale, x / descale in
 * float64 rounded by core/fp8.h as fa_quantize_fp8 and the CPU's append round (after the rotary, in fp32). */
template <typename T, typename C>
__global__ void __launch_bounds__(FA_KV_THREADS)
    first_kernel(const typename fa_kv_params_of<C>::type p, const int d_v) {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    const int i = blockIdx.x, b = blockIdx.y;
    if (p.zero_arrived && i == 0) {
        const int n = p.hk * p.row_tiles;
        for (int e = threadIdx.x; e < n; e += blockDim.x) p.arrived[(int64_t)b * n + e] = 0;
    }
    if (!p.append) return;
    const int len = p.seqlens[b];
    const int64_t t = (int64_t)(len < 0 ? 0 : len) + i; /* 64 bits: a bad length near 2^31 plus i */
    const int row = fa_kv_cache_row(p, b);
    const int rot = p.rcos != nullptr && t < p.rot_seqlen;
    /* q's position: its row's own, or the sequence's length for every row (fa_kv_rotary_q_rows) */
    const int64_t tq = p.rot_q_rows ? t : t - i;
    const int rot_q = p.rcos != nullptr && tq < p.rot_seqlen;
    if (p.qrot) { /* rotated q, fp32, for the attention kernel */
        for (int e = threadIdx.x; e < p.hq * p.d; e += blockDim.x) {
            const int h = e / p.d, c = e % p.d;
            const T *x = (const T *)p.q + b * p.q_sb + i * p.q_ss + h * p.q_sh;
            p.qrot[(((int64_t)b * p.sq + i) * p.hq + h) * p.d + c] = rot_q ? rotated(p, x, c, (int)tq) : fa_to_f32(x[c]);
        }
    }
    if (len < 0 || len > p.capacity - p.sq) return; /* the length is out of range (capacity 0: no rows or pages) */
    if (p.batch_idx && (p.batch_idx[b] < 0 || p.batch_idx[b] >= p.cache_rows)) return;
    if (p.rcos && len > p.rot_seqlen - p.sq) return;
    if (p.paged && fa_kv_page_checked(p, row, (int)t) < 0) return;
    if constexpr (sizeof(C) == 1) {
        for (int e = threadIdx.x; e < p.hk * (p.d + d_v); e += blockDim.x) {
            const bool v = e >= p.hk * p.d;
            const int w = v ? d_v : p.d, f = v ? e - p.hk * p.d : e, h = f / w, c = f % w;
            const float *ds = v ? p.ds.v : p.ds.k;
            const double dsc = ds ? (double)ds[(int64_t)b * p.hk + h] : 1.0;
            float x;
            uint8_t *dst;
            if (v) {
                x = fa_to_f32(((const T *)p.vn + b * p.vn_sb + i * p.vn_ss + h * p.vn_sh)[c]);
                dst = (uint8_t *)p.vc + fa_kv_key(p, row, (int)t, h, p.v_sb, p.v_ss, p.v_sh) + c;
            } else {
                const T *kx = (const T *)p.kn + b * p.kn_sb + i * p.kn_ss + h * p.kn_sh;
                x = rot ? rotated(p, kx, c, (int)t) : fa_to_f32(kx[c]);
                dst = (uint8_t *)p.kc + fa_kv_key(p, row, (int)t, h, p.k_sb, p.k_ss, p.k_sh) + c;
            }
            *dst = fa_f64_to_e4m3((double)x / dsc);
        }
    } else {
        if (p.kn_vec) { /* no rotary, 16-byte aligned rows: a 16-byte chunk per thread; K rows d, V rows d_v wide */
            const int ch = p.d / 8, chv = d_v / 8;
            for (int e = threadIdx.x; e < p.hk * (ch + chv); e += blockDim.x) {
                const bool v = e >= p.hk * ch;
                const int w = v ? chv : ch, f = v ? e - p.hk * ch : e, h = f / w, c = f % w * 8;
                const T *x = v ? (const T *)p.vn + b * p.vn_sb + i * p.vn_ss + h * p.vn_sh + c
                               : (const T *)p.kn + b * p.kn_sb + i * p.kn_ss + h * p.kn_sh + c;
                T *dst = v ? (T *)p.vc + fa_kv_key(p, row, (int)t, h, p.v_sb, p.v_ss, p.v_sh) + c
                           : (T *)p.kc + fa_kv_key(p, row, (int)t, h, p.k_sb, p.k_ss, p.k_sh) + c;
                *(uint4 *)dst = *(const uint4 *)x;
            }
            return;
        }
        for (int e = threadIdx.x; e < p.hk * p.d; e += blockDim.x) {
            const int h = e / p.d, c = e % p.d;
            const T *kx = (const T *)p.kn + b * p.kn_sb + i * p.kn_ss + h * p.kn_sh;
            T *kd = (T *)p.kc + fa_kv_key(p, row, (int)t, h, p.k_sb, p.k_ss, p.k_sh);
            kd[c] = rot ? fa_from_f32<T>(rotated(p, kx, c, (int)t)) : kx[c];
        }
        for (int e = threadIdx.x; e < p.hk * d_v; e += blockDim.x) {
            const int h = e / d_v, c = e % d_v;
            const T *vx = (const T *)p.vn + b * p.vn_sb + i * p.vn_ss + h * p.vn_sh;
            ((T *)p.vc + fa_kv_key(p, row, (int)t, h, p.v_sb, p.v_ss, p.v_sh))[c] = vx[c];
        }
    }
}

template <typename T, typename C>
static cudaError_t first_launch(const fa_kv_params *p, const fa_kv_descales *ds, int d_v, cudaStream_t st) {
    const dim3 grid(p->append ? p->sq : 1, p->batch);
    /* the attention kernel's shared-memory carveout, so that SMs need no reconfiguring between the two kernels */
    static unsigned char ready[64];
    const cudaError_t e = fa_cuda_attr_once(ready, (const void *)first_kernel<T, C>,
                                               cudaFuncAttributePreferredSharedMemoryCarveout,
                                               cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess) return e;
    if constexpr (sizeof(C) == 1) {
        fa_kv_e4m3_params q;
        static_cast<fa_kv_params &>(q) = *p;
        q.ds = *ds;
        first_kernel<T, C><<<grid, FA_KV_THREADS, 0, st>>>(q, d_v);
    } else {
        (void)ds;
        first_kernel<T, C><<<grid, FA_KV_THREADS, 0, st>>>(*p, d_v);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t fa_kv_first_launch(const fa_kv_params *p, const fa_kv_descales *ds, int d_v, int dtype,
                                          cudaStream_t st) {
    if (dtype == 1)
        return ds ? first_launch<__half, uint8_t>(p, ds, d_v, st) : first_launch<__half, __half>(p, ds, d_v, st);
    return ds ? first_launch<__nv_bfloat16, uint8_t>(p, ds, d_v, st)
              : first_launch<__nv_bfloat16, __nv_bfloat16>(p, ds, d_v, st);
}
