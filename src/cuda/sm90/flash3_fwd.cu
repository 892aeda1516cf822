/* FLASH3 forward: the host side. Tensor maps are encoded per call through the driver entry point (nothing links
 * libcuda); kernel instances per (head dim, key block, dtype, schedule); masks and lengths are run-time values. */
#include <cudaTypedefs.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "flash3.h"
#include "flash3_fwd.cuh"

static PFN_cuTensorMapEncodeTiled_v12000 fa3_encode_fn(void) {
    /* the driver's function pointer: the same for the whole process, so looked up once */
    static PFN_cuTensorMapEncodeTiled_v12000 fn = NULL;
    if (!fn) {
        void *f = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)f;
    }
    return fn;
}

/* [batch, rows, heads, D] as a 4-D map {D, rows, heads, batch}; a box is 64 columns (128 B, the swizzle span) of
 * box_rows rows of one head; rows past the end read as zeros. */
static int fa3_map(CUtensorMap *m, const void *base, int dtype, int D, int rows, int heads, int batch,
                   int64_t row_stride, int64_t head_stride, int64_t batch_stride, int box_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = fa3_encode_fn();
    if (!enc) return -1;
    const cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)(rows > 0 ? rows : 1), (cuuint64_t)heads, (cuuint64_t)batch};
    /* a zero stride only comes with an extent of 1 (fa3_supported); TMA wants non-zero multiples of 16 B */
    const cuuint64_t strides[3] = {(cuuint64_t)(row_stride ? row_stride : 8) * 2,
                                   (cuuint64_t)(head_stride ? head_stride : 8) * 2,
                                   (cuuint64_t)(batch_stride ? batch_stride : 8) * 2};
    const cuuint32_t box[4] = {64, (cuuint32_t)box_rows, 1, 1};
    const cuuint32_t estr[4] = {1, 1, 1, 1};
    const CUresult r =
        enc(m, dtype == FA3_FP16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void *)base,
            dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? 0 : -1;
}

/* K/V bytes a section of the masked order may take: about half the H200's 50 MB L2. */
#define FA3_L2_KV_BYTES (24u << 20)

static bool fa3_masked(const fa3_params *p) { return p->causal || p->window_left >= 0 || p->window_right >= 0; }

/* Key blocks query block mb visits (the kernel's fa3_work_at). */
static int fa3_blocks_of(const fa3_params *p, int Br, int Bc, int mb) {
    const int m0 = mb * Br, m1 = m0 + Br < p->seqlen_q ? m0 + Br : p->seqlen_q;
    int lo, hi;
    fa_visible_block32(m0, m1, p->seqlen_q, p->seqlen_k, p->window_left, p->causal ? 0 : p->window_right, &lo, &hi);
    return hi > lo ? (hi + Bc - 1) / Bc - lo / Bc : 0;
}

template <int D, bool WIDE, bool F16, int MODE>
static cudaError_t fa3_launch(const fa3_params *p, cudaStream_t stream) {
    using T = fa3_tile<D, WIDE>;
    CUtensorMap tq, tk, tv;
    if (fa3_map(&tq, p->q, p->dtype, D, p->seqlen_q, p->heads_q, p->batch, p->q_row_stride, p->q_head_stride,
                p->q_batch_stride, T::Br) ||
        fa3_map(&tk, p->k, p->dtype, D, p->seqlen_k, p->heads_k, p->batch, p->k_row_stride, p->k_head_stride,
                p->k_batch_stride, T::Bc) ||
        fa3_map(&tv, p->v, p->dtype, D, p->seqlen_k, p->heads_k, p->batch, p->v_row_stride, p->v_head_stride,
                p->v_batch_stride, T::Bc))
        return cudaErrorInvalidValue;
    fa3_kparams kp;
    kp.o = (uint16_t *)p->o;
    kp.lse = p->lse;
    kp.o_batch_stride = p->o_batch_stride;
    kp.o_row_stride = p->o_row_stride;
    kp.o_head_stride = p->o_head_stride;
    kp.sq = p->seqlen_q;
    kp.sk = p->seqlen_k;
    kp.hq = p->heads_q;
    kp.group = p->heads_q / p->heads_k;
    kp.wl = p->window_left;
    kp.wr = p->causal ? 0 : p->window_right;
    const bool cap = p->softcap > 0.f;
    kp.scale = cap ? 1.f : p->scale;
    kp.scale_log2 = (cap ? 1.f : p->scale) * 1.44269504088896340736f;
    kp.cap = p->softcap;
    kp.cap_scale = cap ? p->scale / p->softcap : 0.f; /* IEEE fp32 division, as the other CUDA kernels */
    const size_t smem = sizeof(fa3_shared<D, WIDE>) + 1024;
    cudaError_t e = cudaFuncSetAttribute(fa3_fwd_kernel<D, WIDE, F16, MODE>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    kp.nmb = (p->seqlen_q + T::Br - 1) / T::Br;
    kp.ntiles = kp.nmb * p->heads_q * p->batch;
    kp.bh = p->heads_q * p->batch;
    kp.sec_heads = 0, kp.mb_up = 0, kp.counter = NULL;
    if (fa3_masked(p) && p->tile_counter) { /* tiles differ in work: longest first, dynamically (the .cuh) */
        /* sections of (batch, head)s whose K and V take at most FA3_L2_KV_BYTES, so that the tiles in flight
         * share their K/V in L2 */
        const double kv_bytes = 4.0 * (double)p->seqlen_k * D;
        const double sec = (double)FA3_L2_KV_BYTES / (kv_bytes > 1 ? kv_bytes : 1);
        kp.sec_heads = sec >= kp.bh ? kp.bh : sec < 1 ? 1 : (int)sec;
        kp.mb_up = fa3_blocks_of(p, T::Br, T::Bc, 0) > fa3_blocks_of(p, T::Br, T::Bc, kp.nmb - 1);
        kp.counter = p->tile_counter;
    }
    /* persistent: one CTA per SM (the register budget allows no second), tiles handed out round-robin */
    int dev = 0, sms = p->ctas;
    if (sms <= 0 && ((e = cudaGetDevice(&dev)) != cudaSuccess ||
                     (e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess))
        return e;
    const int grid = kp.ntiles < sms ? kp.ntiles : sms;
    fa3_fwd_kernel<D, WIDE, F16, MODE><<<grid, T::THREADS, smem, stream>>>(tq, tk, tv, kp);
    return cudaGetLastError();
}

extern "C" int fa3_supported(const fa3_params *p, int cc_major, int cc_minor, char *why, size_t why_len) {
    const char *r = NULL;
    const int64_t st[12] = {p->q_batch_stride, p->q_row_stride,   p->q_head_stride,  p->k_batch_stride,
                            p->k_row_stride,   p->k_head_stride,  p->v_batch_stride, p->v_row_stride,
                            p->v_head_stride,  p->o_batch_stride, p->o_row_stride,   p->o_head_stride};
    int strides_ok = 1;
    for (int i = 0; i < 12; i++)
        if (st[i] < 0 || st[i] % 8 != 0 || st[i] >= ((int64_t)1 << 38)) strides_ok = 0;
    /* a zero stride is a broadcast, which only an extent of 1 may have */
    const int ext[12] = {p->batch, p->seqlen_q, p->heads_q, p->batch, p->seqlen_k, p->heads_k,
                         p->batch, p->seqlen_k, p->heads_k, p->batch, p->seqlen_q, p->heads_q};
    for (int i = 0; i < 12; i++)
        if (st[i] == 0 && ext[i] > 1) strides_ok = 0;
    if (cc_major != 9 || cc_minor != 0)
        r = "FLASH3 is built for sm_90a only (compute capability 9.0)";
    else if (p->dtype != FA3_BF16 && p->dtype != FA3_FP16)
        r = "FLASH3 takes bf16 or fp16 only";
    else if (p->head_dim != 64 && p->head_dim != 128 && p->head_dim != 256)
        r = "FLASH3 head_dim must be 64, 128 or 256";
    else if (((uintptr_t)p->q | (uintptr_t)p->k | (uintptr_t)p->v | (uintptr_t)p->o) % 16 != 0)
        r = "FLASH3 needs q, k, v and o 16-byte aligned (TMA)";
    else if (!strides_ok)
        r = "FLASH3 needs strides that are multiples of 8 elements (16 bytes, "
            "TMA), below 2^38, and 0 only for an extent of 1";
    else if (p->batch < 0 || p->batch > 65535 || p->heads_q < 1 || p->heads_q > 65535 || p->heads_k < 1)
        r = "FLASH3 needs 0 <= batch <= 65535 and 1 <= heads <= 65535";
    else if (p->heads_q % p->heads_k != 0)
        r = "FLASH3 needs heads_q to be a multiple of heads_k";
    else if (p->seqlen_q < 0 || p->seqlen_k < 0 || p->seqlen_q >= (1 << 30) || p->seqlen_k >= (1 << 30))
        r = "FLASH3 needs sequence lengths below 2^30";
    else if ((int64_t)((p->seqlen_q + 127) / 128) * p->heads_q * p->batch >= ((int64_t)1 << 31))
        r = "FLASH3 needs fewer than 2^31 tiles of 128 query rows";
    else if (p->window_left < -1 || p->window_right < -1)
        r = "FLASH3 windows are -1 (unbounded) or >= 0";
    else if (!(p->softcap >= 0.f) || isinf(p->softcap))
        r = "FLASH3 softcap must be finite and >= 0";
    if (r && why && why_len) snprintf(why, why_len, "%s", r);
    return r == NULL;
}

template <int MODE, bool WIDE> static cudaError_t fa3_dispatch(const fa3_params *p, cudaStream_t stream) {
    if (p->batch == 0 || p->seqlen_q == 0) return cudaSuccess;
    const bool f16 = p->dtype == FA3_FP16;
    switch (p->head_dim) {
    case 64:
        return f16 ? fa3_launch<64, WIDE, true, MODE>(p, stream) : fa3_launch<64, WIDE, false, MODE>(p, stream);
    case 128:
        return f16 ? fa3_launch<128, WIDE, true, MODE>(p, stream) : fa3_launch<128, WIDE, false, MODE>(p, stream);
    case 256:
        return f16 ? fa3_launch<256, WIDE, true, MODE>(p, stream) : fa3_launch<256, WIDE, false, MODE>(p, stream);
    default:
        return cudaErrorInvalidValue;
    }
}

/* the wide key block where the lab measured it ahead (bench/lab/flash3/results): d = 256 always, d = 128 without a
 * mask; d = 64 stays at 128 keys (192 was slower at every seqlen) */
static bool fa3_wide(const fa3_params *p) { return p->head_dim == 256 || (p->head_dim == 128 && !fa3_masked(p)); }

extern "C" cudaError_t fa3_fwd(const fa3_params *p, cudaStream_t stream) {
    return fa3_wide(p) ? fa3_dispatch<2, true>(p, stream) : fa3_dispatch<2, false>(p, stream);
}

#ifdef FA3_LAB_SCHEDULES /* the lab's schedules 0 and 1 (bench/lab/flash3): not built into the library */
extern "C" cudaError_t fa3_fwd_schedule(const fa3_params *p, int schedule, cudaStream_t stream) {
    switch (schedule) {
    case 0:
        return fa3_dispatch<0, false>(p, stream);
    case 1:
        return fa3_dispatch<1, false>(p, stream);
    case 2:
        return fa3_dispatch<2, false>(p, stream);
    case 3:
        return fa3_dispatch<2, true>(p, stream);
    default:
        return cudaErrorInvalidValue;
    }
}
#endif

template <int D, bool WIDE> static void fa3_shape_at(const fa3_params *p, const char *kernel, fa3_shape *s) {
    using T = fa3_tile<D, WIDE>;
    s->kernel = kernel;
    s->br = T::Br, s->bc = T::Bc, s->threads = T::THREADS;
    s->smem = sizeof(fa3_shared<D, WIDE>) + 1024; /* + the 1024-byte alignment of the swizzled tiles */
    s->tiles = (long long)((p->seqlen_q + T::Br - 1) / T::Br) * p->heads_q * p->batch;
}

extern "C" void fa3_shape_of(const fa3_params *p, fa3_shape *s) {
    memset(s, 0, sizeof *s);
    switch (p->head_dim) {
    case 64: return fa3_shape_at<64, false>(p, "cuda.flash3.fwd.wgmma.d64.128x128", s);
    case 128:
        if (fa3_wide(p)) return fa3_shape_at<128, true>(p, "cuda.flash3.fwd.wgmma.d128.128x176", s);
        return fa3_shape_at<128, false>(p, "cuda.flash3.fwd.wgmma.d128.128x128", s);
    case 256: return fa3_shape_at<256, true>(p, "cuda.flash3.fwd.wgmma.d256.128x80", s);
    default: s->kernel = "cuda.flash3.fwd.unsupported";
    }
}
