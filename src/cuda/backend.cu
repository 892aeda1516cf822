/* The CUDA backend: context state (device, stream, cuBLAS handle, cached workspace and cu_seqlens), the CUDA part
 * of the one selector (fa_cuda_supports), dispatch to the three algorithms, and the modelled HBM traffic that
 * goes into fa_stats. Host code only; never prints. */
extern "C" {
#include "core/internal.h"
}
#include "params.h"
#include "standard.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fa_cuda_state {
    int device, sm_count;
    int fwd_warps;     /* FA_CUDA_FLASH2_FWD_WARPS at creation (0 = the tile table's default): benchmarks only */
    int split_rows;    /* FA_CUDA_BWD_SPLIT_ROWS at creation (default FA_CUDA_BWD_SPLIT_ROWS; < 0 = never): the FLASH2
                        * backward splits its last wave for walks of at least this many query rows; tests, benchmarks */
    cudaStream_t stream;
    cublasHandle_t blas;
    void *ws;          /* device workspace, grown, never shrunk */
    size_t ws_size;
    int *cu_dev;       /* device copy of cu_seqlens_q then cu_seqlens_k */
    size_t cu_cap;     /* entries */
} fa_cuda_state;

#define FA_CUDA_TRY(ctx, call)                                                                             \
    do {                                                                                                   \
        cudaError_t fa_e_ = (call);                                                                        \
        if (fa_e_ != cudaSuccess)                                                                          \
            return fa_fail(ctx, FA_ERR_DEVICE, "%s:%d: %s: %s", __FILE__, __LINE__, #call,                 \
                           cudaGetErrorString(fa_e_));                                                     \
    } while (0)

extern "C" int fa_cuda_built(void) { return 1; }

extern "C" int fa_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" fa_status fa_cuda_create(fa_context *ctx, int device) {
    int n = fa_cuda_device_count();
    if (n == 0) return fa_fail(ctx, FA_ERR_BACKEND_UNAVAILABLE, "backend: no CUDA device is present");
    if (device < 0 || device >= n)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "device_or_threads: CUDA device %d does not exist (%d present)",
                       device, n);
    cudaDeviceProp prop;
    FA_CUDA_TRY(ctx, cudaGetDeviceProperties(&prop, device));
    if (prop.major != 9 || prop.minor != 0)
        return fa_fail(ctx, FA_ERR_BACKEND_UNAVAILABLE,
                       "backend: CUDA device %d (%s) is compute capability %d.%d; this build has sm_90a code only", device,
                       prop.name, prop.major, prop.minor);
    int prev = 0;
    FA_CUDA_TRY(ctx, cudaGetDevice(&prev));
    FA_CUDA_TRY(ctx, cudaSetDevice(device));
    fa_cuda_state *s = (fa_cuda_state *)calloc(1, sizeof *s);
    if (!s) {
        cudaSetDevice(prev);
        return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "backend: out of host memory for the CUDA state");
    }
    s->device = device;
    s->sm_count = prop.multiProcessorCount;
    const char *fw = getenv("FA_CUDA_FLASH2_FWD_WARPS"); /* read once here, never in a call */
    s->fwd_warps = fw ? atoi(fw) : 0;
    const char *sr = getenv("FA_CUDA_BWD_SPLIT_ROWS");
    s->split_rows = sr ? atoi(sr) : FA_CUDA_BWD_SPLIT_ROWS;
    cublasStatus_t bs = cublasCreate(&s->blas);
    cudaSetDevice(prev); /* the caller's current device is left as it was */
    if (bs != CUBLAS_STATUS_SUCCESS) {
        free(s);
        return fa_fail(ctx, FA_ERR_DEVICE, "cublasCreate: %s", cublasGetStatusString(bs));
    }
    ctx->cuda = s;
    ctx->device = device;
    return FA_OK;
}

extern "C" void fa_cuda_destroy(fa_context *ctx) {
    fa_cuda_state *s = (fa_cuda_state *)ctx->cuda;
    if (!s) return;
    int prev = 0;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = s->device;
    cudaSetDevice(s->device);
    if (s->ws) cudaFree(s->ws);
    if (s->cu_dev) cudaFree(s->cu_dev);
    if (s->blas) cublasDestroy(s->blas);
    cudaSetDevice(prev);
    (void)cudaGetLastError();
    free(s);
    ctx->cuda = NULL;
}

extern "C" fa_status fa_cuda_set_stream(fa_context *ctx, void *stream) {
    fa_cuda_state *s = (fa_cuda_state *)ctx->cuda;
    s->stream = (cudaStream_t)stream;
    cublasStatus_t bs = cublasSetStream(s->blas, s->stream);
    if (bs != CUBLAS_STATUS_SUCCESS) return fa_fail(ctx, FA_ERR_DEVICE, "cublasSetStream: %s", cublasGetStatusString(bs));
    return FA_OK;
}

/* ---- the selector's CUDA part ---- */

static int fa_tensor_aligned16(const fa_tensor *t) {
    return ((uintptr_t)t->data % 16) == 0 && t->stride_batch % 8 == 0 && t->stride_seq % 8 == 0 &&
           t->stride_head % 8 == 0;
}
/* cuBLAS takes the sequence stride as a leading dimension (int, >= head_dim). */
static int fa_tensor_blas_ok(const fa_tensor *t) {
    return (t->seqlen <= 1 || t->stride_seq >= t->head_dim) && t->stride_seq < INT32_MAX && t->stride_head < INT32_MAX;
}

static fa_status fa_cuda_supports(const fa_problem *p, char *why, size_t why_len) {
    const fa_tensor *ts[8] = {&p->q, &p->k, &p->v, &p->o, &p->dout, &p->dq, &p->dk, &p->dv};
    const char *names[8] = {"q", "k", "v", "out", "dout", "dq", "dk", "dv"};
    const int nt = p->is_backward ? 8 : 4;
    if (p->sq_max > INT32_MAX / 2 || p->sk_max > INT32_MAX / 2 || p->q.seqlen > INT32_MAX / 2 ||
        p->k.seqlen > INT32_MAX / 2) {
        snprintf(why, why_len, "seqlen: CUDA kernels index rows with int32 (seqlen must be < 2^30)");
        return FA_ERR_UNSUPPORTED;
    }
    if (p->batch > 65535 || p->hq > 65535) {
        snprintf(why, why_len, "batch %lld x heads %lld: CUDA grid limit is 65535 per dimension", (long long)p->batch,
                 (long long)p->hq);
        return FA_ERR_UNSUPPORTED;
    }
    if (p->algo == FA_ALGO_STANDARD) {
        for (int i = 0; i < nt; ++i)
            if (!fa_tensor_blas_ok(ts[i])) {
                snprintf(why, why_len,
                         "%s: CUDA FA_ALGO_STANDARD (cuBLAS) needs stride_seq >= head_dim and strides < 2^31 "
                         "(stride_seq %lld, head_dim %lld)",
                         names[i], (long long)ts[i]->stride_seq, (long long)ts[i]->head_dim);
                return FA_ERR_UNSUPPORTED;
            }
        return FA_OK; /* block_q/block_k: cuBLAS picks its own tiles; ignored as on the CPU */
    }
    if (p->algo != FA_ALGO_FLASH1 && p->algo != FA_ALGO_FLASH2) {
        snprintf(why, why_len, "algo %s is not implemented on CUDA (standard, flash1, flash2 are)", fa_algo_name(p->algo));
        return FA_ERR_UNSUPPORTED;
    }
    if (p->dtype == FA_DTYPE_F32) {
        snprintf(why, why_len,
                 "dtype f32: CUDA FA_ALGO_%s runs on 16-bit tensor cores (f16, bf16); FA_ALGO_STANDARD accepts f32",
                 p->algo == FA_ALGO_FLASH1 ? "FLASH1" : "FLASH2");
        return FA_ERR_UNSUPPORTED;
    }
    int bm = 0, bn = 0;
    if (!fa_flash_tiles(p->algo, (int)p->d, p->is_backward, &bm, &bn)) {
        snprintf(why, why_len,
                 "head_dim %lld is not built for the CUDA FA_ALGO_%s %s (built: %s); FA_ALGO_STANDARD runs any head_dim",
                 (long long)p->d, p->algo == FA_ALGO_FLASH1 ? "FLASH1" : "FLASH2", p->is_backward ? "backward" : "forward",
                 p->algo == FA_ALGO_FLASH2 ? "32, 64, 96, 128, 256" : "32, 64, 96, 128");
        return FA_ERR_UNSUPPORTED;
    }
    bm = p->block_q, bn = p->block_k;
    if ((bm || bn) && !fa_flash_tiles(p->algo, (int)p->d, p->is_backward, &bm, &bn)) {
        snprintf(why, why_len,
                 "block_q %d / block_k %d: no CUDA FA_ALGO_%s %s kernel is built with these tiles for head_dim %lld "
                 "(0 = the tuned default; see the tile table in src/cuda)",
                 p->block_q, p->block_k, p->algo == FA_ALGO_FLASH1 ? "FLASH1" : "FLASH2",
                 p->is_backward ? "backward" : "forward", (long long)p->d);
        return FA_ERR_UNSUPPORTED;
    }
    for (int i = 0; i < nt; ++i)
        if (!fa_tensor_aligned16(ts[i])) {
            snprintf(why, why_len,
                     "%s: CUDA flash kernels need 16-byte aligned rows (data pointer %% 16 == 0 and every stride a "
                     "multiple of 8 elements); FA_ALGO_STANDARD takes any layout",
                     names[i]);
            return FA_ERR_UNSUPPORTED;
        }
    return FA_OK;
}

/* ---- dispatch ---- */

static fa_status fa_cuda_ws(fa_context *ctx, fa_cuda_state *s, size_t bytes) {
    if (bytes <= s->ws_size) return FA_OK;
    if (s->ws) {
        FA_CUDA_TRY(ctx, cudaStreamSynchronize(s->stream));
        cudaFree(s->ws);
        s->ws = NULL;
        s->ws_size = 0;
    }
    bytes = (bytes + 255) & ~(size_t)255;
    if (cudaMalloc(&s->ws, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        s->ws = NULL;
        return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "CUDA workspace: cudaMalloc of %zu bytes failed", bytes);
    }
    s->ws_size = bytes;
    return FA_OK;
}

static void fa_fill_strides(const fa_tensor *t, int64_t *sb, int64_t *ss, int64_t *sh) {
    *sb = t->stride_batch, *ss = t->stride_seq, *sh = t->stride_head;
}

static fa_status fa_cuda_prepare(fa_context *ctx, const fa_problem *p, fa_cuda_params *c) {
    fa_cuda_state *s = (fa_cuda_state *)ctx->cuda;
    memset(c, 0, sizeof *c);
    c->q = p->q.data, c->k = p->k.data, c->v = p->v.data, c->o = p->o.data, c->out = p->o.data;
    c->dout = p->dout.data, c->dq = p->dq.data, c->dk = p->dk.data, c->dv = p->dv.data;
    c->lse = p->lse;
    fa_fill_strides(&p->q, &c->q_sb, &c->q_ss, &c->q_sh);
    fa_fill_strides(&p->k, &c->k_sb, &c->k_ss, &c->k_sh);
    fa_fill_strides(&p->v, &c->v_sb, &c->v_ss, &c->v_sh);
    fa_fill_strides(&p->o, &c->o_sb, &c->o_ss, &c->o_sh);
    if (p->is_backward) {
        fa_fill_strides(&p->dout, &c->do_sb, &c->do_ss, &c->do_sh);
        fa_fill_strides(&p->dq, &c->dq_sb, &c->dq_ss, &c->dq_sh);
        fa_fill_strides(&p->dk, &c->dk_sb, &c->dk_ss, &c->dk_sh);
        fa_fill_strides(&p->dv, &c->dv_sb, &c->dv_ss, &c->dv_sh);
    }
    c->batch = (int)p->batch, c->hq = (int)p->hq, c->hk = (int)p->hk, c->group = (int)(p->hq / p->hk), c->d = (int)p->d;
    c->sq = (int)p->sq_max, c->sk = (int)p->sk_max;
    c->total_q = (int)p->q.seqlen, c->total_k = (int)p->k.seqlen;
    c->scale = p->scale;
    c->softcap = p->softcap;
    c->softcap_scale = p->softcap > 0.f ? p->scale / p->softcap : 0.f; /* IEEE fp32 division, as div.rn on the GPU */
    c->scale_log2 = p->softcap > 0.f ? 1.4426950408889634f : p->scale * 1.4426950408889634f;
    c->wl = p->wl, c->wr = p->wr;
    c->sm_count = s->sm_count, c->split_rows = s->split_rows;
    if (p->cu_q) {
        const size_t n = (size_t)p->batch + 1;
        if (s->cu_cap < 2 * n) {
            if (s->cu_dev) {
                FA_CUDA_TRY(ctx, cudaStreamSynchronize(s->stream));
                cudaFree(s->cu_dev);
                s->cu_dev = NULL;
                s->cu_cap = 0;
            }
            if (cudaMalloc(&s->cu_dev, 2 * n * sizeof(int)) != cudaSuccess) {
                (void)cudaGetLastError();
                s->cu_dev = NULL;
                return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "CUDA cu_seqlens buffer: cudaMalloc failed");
            }
            s->cu_cap = 2 * n;
        }
        FA_CUDA_TRY(ctx, cudaMemcpyAsync(s->cu_dev, p->cu_q, n * sizeof(int), cudaMemcpyHostToDevice, s->stream));
        FA_CUDA_TRY(ctx, cudaMemcpyAsync(s->cu_dev + n, p->cu_k, n * sizeof(int), cudaMemcpyHostToDevice, s->stream));
        c->cu_q = s->cu_dev;
        c->cu_k = s->cu_dev + n;
    }
    return FA_OK;
}

/* Rows of the fp32 row statistics (LSE layout): B·Hq·Sq, or Hq·total_q under varlen. */
static size_t fa_stat_rows(const fa_problem *p) { return (size_t)p->hq * p->q.seqlen * (p->cu_q ? 1 : p->batch); }
static size_t fa_krows_q_heads(const fa_problem *p) { return (size_t)p->hq * p->k.seqlen * (p->cu_k ? 1 : p->batch); }

/* Tiling model: visited (query block, key block) pairs, query blocks visited, summed over sequences, per head. */
static void fa_model_pairs(const fa_problem *p, int bm, int bn, double *pairs, double *qblocks) {
    *pairs = 0, *qblocks = 0;
    for (int64_t b = 0; b < p->batch; ++b) {
        const int64_t sq = fa_seqlen_q(p, b), sk = fa_seqlen_k(p, b);
        for (int64_t m0 = 0; m0 < sq; m0 += bm) {
            const int64_t r1 = m0 + bm < sq ? m0 + bm : sq;
            int64_t lo = 0, hi = sk;
            if (p->wl >= 0 && m0 + sk - sq - p->wl > lo) lo = m0 + sk - sq - p->wl;
            if (p->wr >= 0 && r1 - 1 + sk - sq + p->wr + 1 < hi) hi = r1 - 1 + sk - sq + p->wr + 1;
            if (hi <= lo) continue;
            *pairs += (double)((hi + bn - 1) / bn - lo / bn);
            *qblocks += 1;
        }
    }
    *pairs *= (double)p->hq;
    *qblocks *= (double)p->hq;
}

static fa_status fa_cuda_err(fa_context *ctx, const char *what, cudaError_t e) {
    return fa_fail(ctx, FA_ERR_DEVICE, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

static fa_status fa_std_err(fa_context *ctx, const char *what, fa_std_status r) {
    if (r.blas != CUBLAS_STATUS_SUCCESS)
        return fa_fail(ctx, FA_ERR_DEVICE, "%s: cuBLAS: %s", what, cublasGetStatusString(r.blas));
    if (r.cuda != cudaSuccess) return fa_cuda_err(ctx, what, r.cuda);
    return FA_OK;
}

/* fa_last_stats of a CUDA call: what ran, its tiles, the modelled HBM bytes, the workspace it needed. */
static void fa_cuda_stats(fa_stats *st, const fa_problem *p, int backward, const char *kernel, int bm, int bn,
                          double rd, double wr, size_t ws) {
    st->backend = FA_BACKEND_CUDA;
    st->algo = p->algo;
    st->is_backward = backward;
    st->kernel = kernel;
    st->block_q = bm, st->block_k = bn;
    st->threads = 0;
    st->slow_read_bytes = (int64_t)rd;
    st->slow_write_bytes = (int64_t)wr;
    st->extra_bytes = (int64_t)ws;
}

static fa_status fa_cuda_forward_on(fa_context *ctx, const fa_problem *p, fa_stats *st) {
    fa_cuda_state *s = (fa_cuda_state *)ctx->cuda;
    fa_cuda_params c;
    fa_status rc = fa_cuda_prepare(ctx, p, &c);
    if (rc != FA_OK) return rc;
    const int dtype = (int)p->dtype;
    const double e = (double)fa_dtype_size(p->dtype), d = (double)p->d;
    const double qrows = (double)fa_stat_rows(p), kvrows = (double)p->k.seqlen * (p->cu_k ? 1 : p->batch) * p->hk;
    int bm = 0, bn = 0;
    size_t ws = 0;
    double rd = 0, wr = 0;
    const char *kernel = "";
    if (p->algo == FA_ALGO_STANDARD) {
        ws = fa_standard_ws_bytes(&c, dtype, 0);
        if ((rc = fa_cuda_ws(ctx, s, ws)) != FA_OK) return rc;
        fa_std_status r = fa_standard_forward(&c, dtype, p->cu_q, p->cu_k, s->blas, s->stream, s->ws);
        if ((rc = fa_std_err(ctx, "standard forward", r)) != FA_OK) return rc;
        kernel = "cuda.standard.cublas";
        double ss = 0;
        for (int64_t b = 0; b < p->batch; ++b) ss += (double)fa_seqlen_q(p, b) * fa_seqlen_k(p, b);
        ss *= (double)p->hq;
        /* Q, K, V; S written (fp32) and read by the softmax; P written and read by the PV GEMM; O, LSE */
        rd = qrows * d * e + 2 * kvrows * d * e + ss * 4 + ss * e;
        wr = ss * 4 + ss * e + qrows * d * e + (p->lse ? qrows * 4 : 0);
    } else if (p->algo == FA_ALGO_FLASH2) {
        bm = p->block_q, bn = p->block_k;
        cudaError_t ce = fa_flash2_fwd_launch(&c, dtype, s->fwd_warps, s->stream, &bm, &bn, &kernel);
        if (ce != cudaSuccess) return fa_cuda_err(ctx, "flash2 forward launch", ce);
        double pairs, qb;
        fa_model_pairs(p, bm, bn, &pairs, &qb);
        /* Qi once per query block, Kj Vj once per visited pair; O and LSE written once */
        rd = qb * bm * d * e + pairs * 2.0 * bn * d * e;
        wr = qrows * d * e + (p->lse ? qrows * 4 : 0);
    } else {
        ws = fa_stat_rows(p) * (p->d + 2) * sizeof(float);
        if ((rc = fa_cuda_ws(ctx, s, ws)) != FA_OK) return rc;
        c.o_acc = (float *)s->ws;
        c.row_m = c.o_acc + fa_stat_rows(p) * p->d;
        c.row_l = c.row_m + fa_stat_rows(p);
        cudaError_t ce = fa_flash1_fwd_launch(&c, dtype, s->stream, &bm, &bn);
        if (ce != cudaSuccess) return fa_cuda_err(ctx, "flash1 forward launch", ce);
        kernel = p->d == 64 ? "cuda.flash1.fwd.mma_sync.d64" : "cuda.flash1.fwd.mma_sync.d128";
        double pairs, qb;
        fa_model_pairs(p, bm, bn, &pairs, &qb);
        /* Kj Vj once per (b, h); Qi per pair; Oi (fp32), ℓi, mi read on every visit but the first and written on
         * every visit but the last (which writes O in dtype and LSE) */
        const double rmw = (pairs - qb) * bm * (4 * d + 8);
        rd = 2 * (double)p->k.seqlen * (p->cu_k ? 1 : p->batch) * p->hq * d * e + pairs * bm * d * e + rmw;
        wr = rmw + qrows * d * e + (p->lse ? qrows * 4 : 0);
    }
    fa_cuda_stats(st, p, 0, kernel, bm, bn, rd, wr, ws);
    return FA_OK;
}

static fa_status fa_cuda_backward_on(fa_context *ctx, const fa_problem *p, fa_stats *st) {
    fa_cuda_state *s = (fa_cuda_state *)ctx->cuda;
    fa_cuda_params c;
    fa_status rc = fa_cuda_prepare(ctx, p, &c);
    if (rc != FA_OK) return rc;
    const int dtype = (int)p->dtype;
    const double e = (double)fa_dtype_size(p->dtype), d = (double)p->d;
    const double qrows = (double)fa_stat_rows(p), kvrows = (double)p->k.seqlen * (p->cu_k ? 1 : p->batch) * p->hk;
    const size_t rows = fa_stat_rows(p);
    int bm = 0, bn = 0;
    size_t ws = 0;
    double rd = 0, wr = 0;
    const char *kernel = "";
    if (p->algo == FA_ALGO_STANDARD) {
        ws = rows * sizeof(float) + fa_standard_ws_bytes(&c, dtype, 1);
        ws = (ws + 255) & ~(size_t)255;
        if ((rc = fa_cuda_ws(ctx, s, ws)) != FA_OK) return rc;
        c.dsum = (float *)s->ws;
        void *w2 = (char *)s->ws + ((rows * sizeof(float) + 255) & ~(size_t)255);
        fa_std_status r = fa_standard_backward(&c, dtype, p->cu_q, p->cu_k, s->blas, s->stream, w2);
        if ((rc = fa_std_err(ctx, "standard backward", r)) != FA_OK) return rc;
        kernel = "cuda.standard.cublas";
        double ss = 0;
        for (int64_t b = 0; b < p->batch; ++b) ss += (double)fa_seqlen_q(p, b) * fa_seqlen_k(p, b);
        ss *= (double)p->hq;
        /* inputs once (Q, K, V, O, dO, LSE); S, dP (fp32) and P/dS written and read back */
        rd = 3 * qrows * d * e + 2 * kvrows * d * e + qrows * 4 + ss * (4 + 4 + 4 + 3 * e);
        wr = ss * (4 + 4 + 2 * e) + qrows * d * e + 2 * kvrows * d * e;
    } else {
        /* D, LSE·log2(e), dQ accumulator (fp32), GQA per-query-head dK dV (fp32), FLASH2's split last-wave
         * blocks' dK dV (fp32) */
        const size_t gq = p->hq / p->hk > 1 ? fa_krows_q_heads(p) * p->d * 2 : 0;
        /* each part 256-byte aligned: the kernels access dQacc, dKacc, dVacc as float2 */
        const size_t a0 = (rows * sizeof(float) + 255) & ~(size_t)255, a1 = (rows * p->d * sizeof(float) + 255) & ~(size_t)255;
        const size_t a2 = (gq * sizeof(float) + 255) & ~(size_t)255;
        int tbm = p->block_q, tbn = p->block_k;
        const size_t tail = p->algo == FA_ALGO_FLASH2 && fa_flash_tiles(3, (int)p->d, 1, &tbm, &tbn)
                                ? fa_flash2_bwd_tail_bytes(&c, p->deterministic, tbm, tbn)
                                : 0;
        ws = 2 * a0 + a1 + a2 + tail;
        if ((rc = fa_cuda_ws(ctx, s, ws)) != FA_OK) return rc;
        c.dsum = (float *)s->ws;
        c.lse2 = (float *)((char *)s->ws + a0);
        c.dq_acc = (float *)((char *)s->ws + 2 * a0);
        c.dk_acc = (float *)((char *)s->ws + 2 * a0 + a1);
        c.dv_acc = c.dk_acc + gq / 2;
        c.tail_acc = tail ? (float *)((char *)s->ws + 2 * a0 + a1 + a2) : NULL;
        cudaError_t ce;
        if (p->algo == FA_ALGO_FLASH2) {
            bm = p->block_q, bn = p->block_k;
            ce = fa_flash2_bwd_launch(&c, dtype, p->deterministic, s->stream, &bm, &bn);
            kernel = p->deterministic ? "cuda.flash2.bwd.deterministic" : "cuda.flash2.bwd.bulk_reduce_dq";
        } else {
            ce = fa_flash1_bwd_launch(&c, dtype, s->stream, &bm, &bn);
            kernel = "cuda.flash1.bwd";
        }
        if (ce != cudaSuccess) return fa_cuda_err(ctx, "flash backward launch", ce);
        double pairs, qb;
        fa_model_pairs(p, bm, bn, &pairs, &qb);
        /* D pre-pass: O, dO read. Per visited pair: Qi, dOi (+ LSE, D) read; dQi fp32 read+written (bulk reduce-adds or
         * RMW). Kj Vj read once per key block; dK dV written once. dQ conversion: fp32 read, dtype written. */
        rd = 2 * qrows * d * e + pairs * bm * (2 * d * e + 8 + 4 * d) + 2 * kvrows * d * e * p->hq / p->hk + qrows * d * 4;
        wr = qrows * 4 + pairs * bm * 4 * d + qrows * d * e + 2 * kvrows * d * e + (double)gq * 4;
        rd += (double)tail, wr += 2.0 * tail; /* split blocks: cleared, partial sums added, read back once */
        if (p->algo == FA_ALGO_FLASH2 && p->deterministic) { /* no dQ traffic per pair; the dQ kernel reads Kj Vj per pair */
            rd -= pairs * bm * 4 * d + qrows * d * 4;
            wr -= pairs * bm * 4 * d;
            rd += pairs * 2.0 * bm * d * e;
        }
    }
    fa_cuda_stats(st, p, 1, kernel, bm, bn, rd, wr, ws);
    return FA_OK;
}

/* Work is queued on the context's device; the caller's current device is restored afterwards. */
static fa_status fa_cuda_exec(fa_context *ctx, const fa_problem *p, fa_stats *st, int backward) {
    const fa_cuda_state *s = (const fa_cuda_state *)ctx->cuda;
    int prev = 0;
    FA_CUDA_TRY(ctx, cudaGetDevice(&prev));
    if (prev != s->device) FA_CUDA_TRY(ctx, cudaSetDevice(s->device));
    fa_status rc = backward ? fa_cuda_backward_on(ctx, p, st) : fa_cuda_forward_on(ctx, p, st);
    if (prev != s->device) cudaSetDevice(prev);
    return rc;
}
extern "C" fa_status fa_cuda_plan(const fa_context *ctx, const fa_problem *p, fa_plan *plan, char *why, size_t why_len) {
    (void)ctx, (void)plan;
    return fa_cuda_supports(p, why, why_len);
}
extern "C" fa_status fa_cuda_run(fa_context *ctx, const fa_problem *p, const fa_plan *plan, fa_stats *st) {
    (void)plan;
    return fa_cuda_exec(ctx, p, st, p->is_backward);
}
