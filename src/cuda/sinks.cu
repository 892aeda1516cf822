/* Learnable sinks on CUDA (sinks.h): one warp per row joins the sink into out and LSE, for the families that do
 * not fold the join into their epilogue (STANDARD, FLASH1: one more pass over out); one CTA per head sums the
 * sink's gradient from the D = rowsum(dO ∘ O) that every backward's pre-pass has written (docs/numerics.md). */
#include "sinks.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/sink.h"

namespace {

/* The rows of the LSE layout [B, Hq, S] (packed: [1, Hq, total]) and the views they address. */
struct fa_sink_rows {
    void *o;
    float *lse;
    const float *sinks;
    int64_t o_sb, o_ss, o_sh;
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

/* One CTA per head: enough warps to keep the rows' loads in flight (a 256-thread CTA walking 16k rows with a 64-bit
 * division per row took ~60 µs, 4 % of an H100's FLASH3 backward at 4k). */
constexpr int FA_SINK_GRAD_THREADS = 1024;

/* d sinks[h] = −Σ exp(sink − L·lse_scale) · D over the rows of head h: row i of batch b at dsum[(b·hq + h)·ds + i]
 * and L at lse[(b·hq + h)·ls + i] (lse_scale 1: the LSE; ln 2: LSE·log2 e). Float64 partials per thread, summed in
 * a fixed tree (the warps' shuffles, then the warps' partials): the same bits on every run. A row with L = −∞ (no
 * key and no sink, or seqused's padding) has no weight on the sink; FLASH3's padding rows (L = +∞, D = 0) add 0. */
__global__ void __launch_bounds__(FA_SINK_GRAD_THREADS) fa_sinks_grad_kernel(const float *dsum, const float *lse,
                                                                              double lse_scale, const float *sinks,
                                                                              float *d_sinks, int hq, int nb, int n,
                                                                              int64_t ds, int64_t ls) {
    __shared__ double part[FA_SINK_GRAD_THREADS / 32];
    const int h = blockIdx.x, t = threadIdx.x;
    const double sink = sinks[h];
    double g = 0;
    for (int b = 0; sink != -INFINITY && b < nb; ++b) {
        const int64_t bh = (int64_t)b * hq + h;
        const float *L = lse + bh * ls, *D = dsum + bh * ds;
        for (int i = t; i < n; i += FA_SINK_GRAD_THREADS) {
            const float l = L[i];
            if (l != -INFINITY) g -= exp(sink - (double)l * lse_scale) * (double)D[i];
        }
    }
    for (int o = 16; o > 0; o >>= 1) g += __shfl_down_sync(0xffffffffu, g, o);
    if (t % 32 == 0) part[t / 32] = g;
    __syncthreads();
    if (t < 32) {
        g = part[t];
        for (int o = 16; o > 0; o >>= 1) g += __shfl_down_sync(0xffffffffu, g, o);
        if (t == 0) d_sinks[h] = (float)g;
    }
}

fa_sink_rows rows_of(const fa_problem *p, float *lse) {
    fa_sink_rows a;
    a.o = p->o.data, a.lse = lse, a.sinks = p->sinks;
    a.o_sb = p->o.stride_batch, a.o_ss = p->o.stride_seq, a.o_sh = p->o.stride_head;
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

cudaError_t fa_cuda_sinks_grad(const fa_cuda_params *c, const float *lse, double lse_scale, int nb, int n,
                               int64_t dsum_stride, int64_t lse_stride, cudaStream_t st) {
    if (!c->d_sinks || c->hq == 0) return cudaSuccess;
    fa_sinks_grad_kernel<<<(unsigned)c->hq, FA_SINK_GRAD_THREADS, 0, st>>>(
        c->dsum, lse, lse_scale, c->sinks, c->d_sinks, c->hq, nb, n, dsum_stride, lse_stride);
    return cudaGetLastError();
}
