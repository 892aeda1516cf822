/* fa_quantize_fp8 on CUDA: one CTA per work item (batch, head group, row block), threads over its rows. Each row is
 * widened to double (and rotated) in the thread's local memory, as the CPU's quantiser does (src/cpu/quantize.c), with
 * core/fp8.h's arithmetic: the same bits on both. Normal scales take one kernel (amax by a shared-memory reduction,
 * then the rows again, quantised); per_tensor takes three (items' amaxes into descale, one CTA's maximum written back
 * to every entry, the rows quantised). Not tuned: a row in local memory costs bandwidth; quantisation is not where an
 * FP8 forward spends its time. Kernels only (no host sync): graph-capturable. */
#include "state.h"

#include <cuda_fp16.h>

extern "C" {
#include "core/fp8.h"
}

typedef struct fa_quant_args {
    const void *x;
    uint8_t *y;
    float *descale;
    int64_t xsb, xss, xsh, ysb, yss, ysh;
    int64_t S, H, D, group, block_rows, nblk, items;
    int dtype, hadamard;
    uint64_t seed;
} fa_quant_args;

enum { FA_Q_THREADS = 128 };

__device__ static double fa_q_load(const fa_quant_args &a, int64_t i) {
    if (a.dtype == FA_DTYPE_F32) return (double)((const float *)a.x)[i];
    const unsigned short u = ((const unsigned short *)a.x)[i];
    if (a.dtype == FA_DTYPE_F16) return (double)__half2float(__ushort_as_half(u));
    return (double)__uint_as_float((unsigned)u << 16);
}

/* Rows [s0, s1) of heads [h0, h0 + group) of batch b: item it. */
__device__ static void fa_q_item(const fa_quant_args &a, int64_t it, int64_t *b, int64_t *h0, int64_t *s0, int64_t *s1) {
    const int64_t groups = a.H / a.group;
    *b = it / (groups * a.nblk);
    *h0 = it / a.nblk % groups * a.group;
    *s0 = it % a.nblk * a.block_rows;
    *s1 = min(*s0 + a.block_rows, a.S);
}

/* x / d to e4m3, the CPU's arithmetic; out of line: inlined, its double division spilled the kernel's registers */
__device__ __noinline__ static uint8_t fa_q_e4m3(double x, double d) { return fa_f64_to_e4m3(x / d); }

/* Row n of the item (heads fastest) into row[], rotated when asked; its (s, h). */
__device__ static void fa_q_row(const fa_quant_args &a, int64_t b, int64_t h0, int64_t s0, int64_t n, double *row,
                                int64_t *s, int64_t *h) {
    *s = s0 + n / a.group, *h = h0 + n % a.group;
    const int64_t base = b * a.xsb + *s * a.xss + *h * a.xsh;
    for (int64_t j = 0; j < a.D; j++) row[j] = fa_q_load(a, base + j);
    if (a.hadamard) fa_hadamard_row(row, a.D, a.seed);
}

/* mode 0: amax, descale, quantise; 1: the amax only, into descale; 2: quantise with descale's entry. */
__global__ void __launch_bounds__(FA_Q_THREADS) fa_quantize_kernel(const fa_quant_args a, int mode) {
    __shared__ unsigned amax_bits;
    double row[FA_MAX_HEAD_DIM];
    for (int64_t it = blockIdx.x; it < a.items; it += gridDim.x) {
        int64_t b, h0, s0, s1, s, h;
        fa_q_item(a, it, &b, &h0, &s0, &s1);
        const int64_t rows = (s1 - s0) * a.group;
        float d;
        if (mode != 2) {
            if (threadIdx.x == 0) amax_bits = 0;
            __syncthreads();
            double amax = 0;
            for (int64_t n = threadIdx.x; n < rows; n += blockDim.x) {
                fa_q_row(a, b, h0, s0, n, row, &s, &h);
                for (int64_t j = 0; j < a.D; j++)
                    if (isfinite(row[j]) && fabs(row[j]) > amax) amax = fabs(row[j]);
            }
            atomicMax(&amax_bits, __float_as_uint((float)amax)); /* non-negative floats order as their bits */
            __syncthreads();
            const float m = __uint_as_float(amax_bits);
            if (mode == 1) {
                if (threadIdx.x == 0) a.descale[it] = m;
                __syncthreads();
                continue;
            }
            d = fa_fp8_descale(m);
            if (threadIdx.x == 0) a.descale[it] = d;
        } else {
            d = a.descale[it];
        }
        for (int64_t n = threadIdx.x; n < rows; n += blockDim.x) {
            fa_q_row(a, b, h0, s0, n, row, &s, &h);
            uint8_t *dst = a.y + b * a.ysb + s * a.yss + h * a.ysh;
            for (int64_t j = 0; j < a.D; j++) dst[j] = fa_q_e4m3(row[j], (double)d);
        }
        __syncthreads(); /* amax_bits is reset for the next item */
    }
}

/* per_tensor: the items' amaxes (in descale) to their maximum's descale, written to every entry. One CTA. */
__global__ void __launch_bounds__(256) fa_quantize_tensor_kernel(float *descale, int64_t items) {
    __shared__ unsigned amax_bits;
    if (threadIdx.x == 0) amax_bits = 0;
    __syncthreads();
    float m = 0;
    for (int64_t i = threadIdx.x; i < items; i += blockDim.x) m = fmaxf(m, descale[i]);
    atomicMax(&amax_bits, __float_as_uint(m));
    __syncthreads();
    const float d = fa_fp8_descale(__uint_as_float(amax_bits));
    for (int64_t i = threadIdx.x; i < items; i += blockDim.x) descale[i] = d;
}

extern "C" fa_status fa_cuda_quantize(fa_context *ctx, const fa_quant_problem *q) {
    const cudaStream_t st = fa_cuda_stream_of(ctx);
    fa_quant_args a;
    a.x = q->x.data, a.y = (uint8_t *)q->y.data, a.descale = q->descale;
    a.xsb = q->x.stride_batch, a.xss = q->x.stride_seq, a.xsh = q->x.stride_head;
    a.ysb = q->y.stride_batch, a.yss = q->y.stride_seq, a.ysh = q->y.stride_head;
    a.S = q->x.seqlen, a.H = q->x.heads, a.D = q->x.head_dim, a.group = q->group, a.block_rows = q->block_rows;
    a.nblk = q->nblk, a.items = q->x.batch * (q->x.heads / q->group) * q->nblk;
    a.dtype = (int)q->x.dtype, a.hadamard = q->hadamard, a.seed = q->seed;
    const unsigned grid = (unsigned)(a.items < 65535 * 16 ? a.items : 65535 * 16);
    if (q->per_tensor) {
        fa_quantize_kernel<<<grid, FA_Q_THREADS, 0, st>>>(a, 1);
        FA_CUDA_TRY(ctx, cudaGetLastError());
        fa_quantize_tensor_kernel<<<1, 256, 0, st>>>(a.descale, a.items);
        FA_CUDA_TRY(ctx, cudaGetLastError());
        fa_quantize_kernel<<<grid, FA_Q_THREADS, 0, st>>>(a, 2);
    } else {
        fa_quantize_kernel<<<grid, FA_Q_THREADS, 0, st>>>(a, 0);
    }
    FA_CUDA_TRY(ctx, cudaGetLastError());
    return FA_OK;
}
