/* LSE merges: the splits of one decode call (part_o, part_lse -> out, lse) and fa_merge_states (n caller states).
 * One warp per row: every lane forms the weights w_s = e^(lse_s − M) / Σ e^(lse − M) (natural log), then
 * sums its columns. A row whose states are all empty gives 0 / −inf; a NaN LSE makes the row NaN. */
#include "../convert.cuh"
#include "decode.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>


/* M = max lse and 1 / Σ e^(lse − M) over n values a stride apart; the merged LSE. */
__device__ __forceinline__ float merge_lse(const float *const *lse, int64_t idx, const float *base, int64_t step, int n,
                                           float *M, float *inv) {
    float m = -INFINITY;
    bool nan = false;
    for (int s = 0; s < n; s++) {
        const float x = lse ? lse[s][idx] : base[s * step];
        nan |= isnan(x);
        m = fmaxf(m, x);
    }
    *M = m;
    if (nan) {
        *inv = NAN;
        return NAN;
    }
    if (m == -INFINITY) {
        *inv = 0.f;
        return -INFINITY;
    }
    float sum = 0.f;
    for (int s = 0; s < n; s++) sum += expf((lse ? lse[s][idx] : base[s * step]) - m);
    *inv = 1.f / sum;
    return m + logf(sum);
}

__device__ __forceinline__ float weight(float lse, float M, float inv) {
    return isnan(inv) ? NAN : lse == -INFINITY ? 0.f : expf(lse - M) * inv;
}

/* One warp per (row, 32 columns): the lanes read the splits' LSEs (lane s: splits s, s + 32, ...) and reduce them
 * by shuffles, then each lane sums its column over the splits with the loads independent of the weights (a split
 * of weight 0 is skipped by a select, not a branch), so they are in flight together: the partials are L2-resident
 * and this kernel is bound by their latency, not by bandwidth. */
template <typename T>
__global__ void __launch_bounds__(FA_DEC_THREADS) merge_splits_kernel(const fa_dec_params p) {
    const int cgs = p.d / 32; /* column groups per row */
    const int64_t wi = (int64_t)blockIdx.x * (FA_DEC_THREADS / 32) + threadIdx.x / 32, r = wi / cgs;
    const int lane = threadIdx.x & 31, c = (int)(wi % cgs) * 32 + lane;
    if (r >= (int64_t)p.batch * p.hq * p.sq) return;
    const int b = (int)(r / ((int64_t)p.hq * p.sq)), hq = (int)(r / p.sq % p.hq), i = (int)(r % p.sq);
    int chunk, ns;
    fa_dec_split(p, fa_dec_len(p, b), &chunk, &ns);
    if (ns == 1) return; /* written by the attention kernel */
    const float *pl = p.part_lse + r * p.nsplit;
    float M = -INFINITY, sum = 0.f;
    bool nan = false;
    for (int s = lane; s < ns; s += 32) nan |= isnan(pl[s]), M = fmaxf(M, pl[s]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
    nan = __any_sync(0xffffffffu, nan);
    if (M != -INFINITY)
        for (int s = lane; s < ns; s += 32) sum += pl[s] == -INFINITY ? 0.f : expf(pl[s] - M);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const float inv = nan ? NAN : M == -INFINITY ? 0.f : 1.f / sum;
    const float lse = nan ? NAN : M == -INFINITY ? -INFINITY : M + logf(sum);
    const float *po = p.part_o + r * p.nsplit * p.d + c;
    float acc = 0.f;
    for (int s0 = 0; s0 < ns; s0 += 32) {
        const float wl = s0 + lane < ns ? weight(pl[s0 + lane], M, inv) : 0.f;
        const int n = min(32, ns - s0);
#pragma unroll 8
        for (int j = 0; j < n; j++) {
            const float w = __shfl_sync(0xffffffffu, wl, j), x = po[(int64_t)(s0 + j) * p.d];
            acc += (w != 0.f || isnan(w)) ? w * x : 0.f;
        }
    }
    fa_st((T *)p.o + b * p.o_sb + i * p.o_ss + hq * p.o_sh + c, acc);
    if (p.lse && c == 0) p.lse[r] = lse;
}

extern "C" cudaError_t fa_dec_merge_splits_launch(const fa_dec_params *p, int dtype, cudaStream_t st) {
    const int64_t warps = (int64_t)p->batch * p->hq * p->sq * (p->d / 32), per = FA_DEC_THREADS / 32;
    const unsigned grid = (unsigned)((warps + per - 1) / per);
    if (dtype == 1) merge_splits_kernel<__half><<<grid, FA_DEC_THREADS, 0, st>>>(*p);
    else merge_splits_kernel<__nv_bfloat16><<<grid, FA_DEC_THREADS, 0, st>>>(*p);
    return cudaGetLastError();
}

template <typename T>
__global__ void __launch_bounds__(FA_DEC_THREADS) merge_states_kernel(const fa_merge_params p) {
    const int64_t r = (int64_t)blockIdx.x * (FA_DEC_THREADS / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (r >= p.rows) return;
    const int b = (int)(r / ((int64_t)p.heads * p.seqlen)), h = (int)(r / p.seqlen % p.heads), i = (int)(r % p.seqlen);
    float M, inv;
    const float lse = merge_lse(p.lse_in, r, nullptr, 0, p.n, &M, &inv);
    float w[FA_MERGE_MAX];
    for (int s = 0; s < p.n; s++) w[s] = weight(p.lse_in[s][r], M, inv);
    /* each lane reads its columns of every state before writing them: out may be in[0] */
    T *o = (T *)p.out + b * p.o_sb + i * p.o_ss + h * p.o_sh;
    for (int c = lane; c < p.d; c += 32) {
        float acc = 0.f;
        for (int s = 0; s < p.n; s++)
            if (w[s] != 0.f || isnan(w[s]))
                acc = fmaf(w[s], fa_ld((const T *)p.in[s] + b * p.in_sb[s] + i * p.in_ss[s] + h * p.in_sh[s] + c), acc);
        fa_st(o + c, acc);
    }
    __syncwarp();
    if (p.lse && lane == 0) p.lse[r] = lse;
}

extern "C" cudaError_t fa_merge_states_launch(const fa_merge_params *p, int dtype, cudaStream_t st) {
    const int per = FA_DEC_THREADS / 32;
    const unsigned grid = (unsigned)((p->rows + per - 1) / per);
    if (dtype == 0) merge_states_kernel<float><<<grid, FA_DEC_THREADS, 0, st>>>(*p);
    else if (dtype == 1) merge_states_kernel<__half><<<grid, FA_DEC_THREADS, 0, st>>>(*p);
    else merge_states_kernel<__nv_bfloat16><<<grid, FA_DEC_THREADS, 0, st>>>(*p);
    return cudaGetLastError();
}
