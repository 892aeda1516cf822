/* Learnable sinks on CUDA (sinks.h): one warp per row joins the sink into out and LSE; one CTA per head sums the
 * sink's gradient. Both read each row once; the join costs one more pass over out, which the FLASH2 epilogue could
 * fold in (docs/numerics.md). */
#include "sinks.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/sink.h"

namespace {

/* The rows of the LSE layout [B, Hq, S] (packed: [1, Hq, total]) and the views they address. */
struct fa_sink_rows {
    void *o;
    const void *dout;
    float *lse;
    const float *sinks;
    float *d_sinks;
    int64_t o_sb, o_ss, o_sh, do_sb, do_ss, do_sh;
    int64_t B, H, S;
    int d, dtype;
};

__device__ __forceinline__ float fa_sink_ld(const void *x, int dt, int64_t i) {
    if (dt == FA_DTYPE_F16) return __half2float(((const __half *)x)[i]);
    if (dt == FA_DTYPE_BF16) return __bfloat162float(((const __nv_bfloat16 *)x)[i]);
    return ((const float *)x)[i];
}

__device__ __forceinline__ void fa_sink_st(void *x, int dt, int64_t i, float v) {
    if (dt == FA_DTYPE_F16) ((__half *)x)[i] = __float2half_rn(v);
    else if (dt == FA_DTYPE_BF16) ((__nv_bfloat16 *)x)[i] = __float2bfloat16_rn(v);
    else ((float *)x)[i] = v;
}

__global__ void fa_sinks_join_kernel(const fa_sink_rows a) {
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (r >= a.B * a.H * a.S) return;
    const int64_t b = r / (a.H * a.S), h = r / a.S % a.H, i = r % a.S;
    float lse;
    const float f = fa_sink_join_lse(a.lse ? a.lse[r] : -INFINITY, a.sinks[h], &lse);
    const int64_t o0 = b * a.o_sb + i * a.o_ss + h * a.o_sh;
    for (int x = lane; x < a.d; x += 32) fa_sink_st(a.o, a.dtype, o0 + x, fa_sink_ld(a.o, a.dtype, o0 + x) * f);
    __syncwarp(); /* every lane has read the row's LSE */
    if (a.lse && lane == 0) a.lse[r] = lse;
}

constexpr int FA_SINK_GRAD_THREADS = 256;

__global__ void __launch_bounds__(FA_SINK_GRAD_THREADS) fa_sinks_grad_kernel(const fa_sink_rows a) {
    __shared__ double part[FA_SINK_GRAD_THREADS / 32];
    const int h = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const double sink = a.sinks[h];
    double g = 0;
    for (int64_t n = warp; sink != -INFINITY && n < a.B * a.S; n += FA_SINK_GRAD_THREADS / 32) {
        const int64_t b = n / a.S, i = n % a.S, o0 = b * a.o_sb + i * a.o_ss + h * a.o_sh;
        const int64_t d0 = b * a.do_sb + i * a.do_ss + h * a.do_sh;
        float D = 0; /* D = rowsum(dO ∘ O) */
        for (int x = lane; x < a.d; x += 32) D += fa_sink_ld(a.dout, a.dtype, d0 + x) * fa_sink_ld(a.o, a.dtype, o0 + x);
        for (int s = 16; s > 0; s >>= 1) D += __shfl_xor_sync(0xffffffffu, D, s);
        g -= exp(sink - (double)a.lse[(b * a.H + h) * a.S + i]) * (double)D;
    }
    if (lane == 0) part[warp] = g;
    __syncthreads();
    if (threadIdx.x == 0) { /* a fixed order: the same sum on every run */
        double t = 0;
        for (int w = 0; w < FA_SINK_GRAD_THREADS / 32; ++w) t += part[w];
        a.d_sinks[h] = (float)t;
    }
}

fa_sink_rows rows_of(const fa_problem *p, float *lse) {
    fa_sink_rows a;
    a.o = p->o.data, a.dout = p->dout.data, a.lse = lse, a.sinks = p->sinks, a.d_sinks = p->d_sinks;
    a.o_sb = p->o.stride_batch, a.o_ss = p->o.stride_seq, a.o_sh = p->o.stride_head;
    a.do_sb = p->dout.stride_batch, a.do_ss = p->dout.stride_seq, a.do_sh = p->dout.stride_head;
    a.B = p->q.batch, a.H = p->hq, a.S = p->q.seqlen, a.d = (int)p->d_v, a.dtype = (int)p->dtype;
    return a;
}

} // namespace

cudaError_t fa_cuda_sinks_join(const fa_problem *p, float *lse, cudaStream_t st) {
    const fa_sink_rows a = rows_of(p, lse);
    const int64_t rows = a.B * a.H * a.S, per = 256 / 32;
    if (rows == 0) return cudaSuccess;
    fa_sinks_join_kernel<<<(unsigned)((rows + per - 1) / per), 256, 0, st>>>(a);
    return cudaGetLastError();
}

cudaError_t fa_cuda_sinks_grad(const fa_problem *p, cudaStream_t st) {
    const fa_sink_rows a = rows_of(p, p->lse);
    fa_sinks_grad_kernel<<<(unsigned)p->hq, FA_SINK_GRAD_THREADS, 0, st>>>(a);
    return cudaGetLastError();
}
