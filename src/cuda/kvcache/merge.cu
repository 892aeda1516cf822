/* fa_merge_states on CUDA: n caller states merged by their LSEs (a KV-cache call's own splits are merged by its
 * last CTA per row tile: finish.cuh). One warp per row: every lane forms the weights w_s = e^(lse_s − M) /
 * Σ e^(lse − M) (natural log), then sums its columns. A row whose states are all empty gives 0 / −inf; a NaN LSE makes
 * the row NaN. Above FA_MERGE_MAX states the host launches chunks that carry an fp32 running state (kvcache.h). */
#include "../convert.cuh"
#include "kvcache.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>


/* M = max lse and 1 / Σ e^(lse − M) over the n states' row idx; the merged LSE. */
__device__ __forceinline__ float merge_lse(const float *const *lse, int64_t idx, int n, float *M, float *inv) {
    float m = -INFINITY;
    bool nan = false;
    for (int s = 0; s < n; s++) {
        const float x = lse[s][idx];
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
    for (int s = 0; s < n; s++) sum += expf(lse[s][idx] - m);
    *inv = 1.f / sum;
    return m + logf(sum);
}

/* The whole merge in one launch (n <= FA_MERGE_MAX): normalised weights, as the KV-cache call's own merge. */
template <typename T> __device__ void merge_row_once(const fa_merge_params &p, int64_t r, int b, int h, int i, int lane) {
    float M, inv;
    const float lse = merge_lse(p.lse_in, r, p.n, &M, &inv);
    float w[FA_MERGE_MAX];
    for (int s = 0; s < p.n; s++) w[s] = fa_kv_weight(p.lse_in[s][r], M, inv);
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

/* One chunk of a longer merge: the running state (M_run, S_run, acc_run) and this chunk's states become
 * M = max(M_run, lse_s), S = S_run e^(M_run − M) + Σ e^(lse_s − M), acc likewise; the last chunk writes acc / S and
 * M + log S. The first chunk holds outs[0] and the last writes out, so out may be outs[0] as in one launch. */
template <typename T> __device__ void merge_row_chunk(const fa_merge_params &p, int64_t r, int b, int h, int i, int lane) {
    float M = -INFINITY, M_run = -INFINITY, S_run = 0.f;
    bool nan = false;
    for (int s = 0; s < p.n; s++) {
        const float x = p.lse_in[s][r];
        nan |= isnan(x);
        M = fmaxf(M, x);
    }
    if (!p.first) {
        M_run = p.run_ml[2 * r], S_run = p.run_ml[2 * r + 1];
        nan |= isnan(M_run);
        M = fmaxf(M, M_run);
    }
    /* the running state's weight: 0 where it is empty (so a 0 · NaN of an empty state stays out) */
    const float keep = M_run == -INFINITY ? 0.f : expf(M_run - M);
    float w[FA_MERGE_MAX], S = S_run * keep;
    for (int s = 0; s < p.n; s++) {
        const float x = p.lse_in[s][r];
        w[s] = x == -INFINITY ? 0.f : expf(x - M);
        S += w[s];
    }
    float *run = p.run_o + r * p.d;
    T *o = (T *)p.out + b * p.o_sb + i * p.o_ss + h * p.o_sh;
    for (int c = lane; c < p.d; c += 32) {
        float acc = keep != 0.f ? run[c] * keep : 0.f;
        for (int s = 0; s < p.n; s++)
            if (w[s] != 0.f || isnan(w[s]))
                acc = fmaf(w[s], fa_ld((const T *)p.in[s] + b * p.in_sb[s] + i * p.in_ss[s] + h * p.in_sh[s] + c), acc);
        if (!p.last) run[c] = acc;
        else fa_st(o + c, nan ? NAN : M == -INFINITY ? 0.f : acc / S);
    }
    __syncwarp();
    if (lane) return;
    if (!p.last) {
        p.run_ml[2 * r] = nan ? NAN : M, p.run_ml[2 * r + 1] = S;
    } else if (p.lse) {
        p.lse[r] = nan ? NAN : M == -INFINITY ? -INFINITY : M + logf(S);
    }
}

template <typename T>
__global__ void __launch_bounds__(FA_KV_THREADS) merge_states_kernel(const fa_merge_params p) {
    const int64_t r = (int64_t)blockIdx.x * (FA_KV_THREADS / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (r >= p.rows) return;
    const int b = (int)(r / ((int64_t)p.heads * p.seqlen)), h = (int)(r / p.seqlen % p.heads), i = (int)(r % p.seqlen);
    if (p.first && p.last) merge_row_once<T>(p, r, b, h, i, lane);
    else merge_row_chunk<T>(p, r, b, h, i, lane);
}

extern "C" cudaError_t fa_merge_states_launch(const fa_merge_params *p, int dtype, cudaStream_t st) {
    const int per = FA_KV_THREADS / 32;
    const unsigned grid = (unsigned)((p->rows + per - 1) / per);
    if (dtype == 0) merge_states_kernel<float><<<grid, FA_KV_THREADS, 0, st>>>(*p);
    else if (dtype == 1) merge_states_kernel<__half><<<grid, FA_KV_THREADS, 0, st>>>(*p);
    else merge_states_kernel<__nv_bfloat16><<<grid, FA_KV_THREADS, 0, st>>>(*p);
    return cudaGetLastError();
}
