/* The CUDA backend: context state (device, stream, cuBLAS handle, cached workspace and cu_seqlens) and the run
 * that executes a plan (plan.cu decides; this file only carries it out). Host code only; never prints. */
#include "plan.h"
#include "standard.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fa_cuda_state {
    int device;
    fa_cuda_tuning tune; /* read at creation, consulted by the plan */
    cudaStream_t stream;
    cublasHandle_t blas;
    void *ws;          /* device workspace, grown, never shrunk */
    size_t ws_size;
    int *cu_dev;       /* device copy of cu_seqlens_q then cu_seqlens_k */
    size_t cu_cap;     /* entries */
    int *counters;     /* decoding's split counters, zero between calls (fa_cuda_counters_of) */
    size_t counters_n; /* entries */
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
    s->tune.sm_count = prop.multiProcessorCount;
    const char *fw = getenv("FA_CUDA_FLASH2_FWD_WARPS"); /* read once here, never in a call */
    s->tune.fwd_warps = fw ? atoi(fw) : 0;
    const char *sr = getenv("FA_CUDA_BWD_SPLIT_ROWS");
    s->tune.split_rows = sr ? atoi(sr) : FA_CUDA_BWD_SPLIT_ROWS;
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
    if (s->counters) cudaFree(s->counters);
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

const fa_cuda_tuning *fa_cuda_tuning_of(const fa_context *ctx) { return &((const fa_cuda_state *)ctx->cuda)->tune; }
cudaStream_t fa_cuda_stream_of(const fa_context *ctx) { return ((const fa_cuda_state *)ctx->cuda)->stream; }

/* ---- run ---- */

/* The cached workspace, grown to at least bytes (never shrunk). */
static fa_status fa_cuda_ws_grow(fa_context *ctx, fa_cuda_state *s, size_t bytes) {
    if (bytes <= s->ws_size) return FA_OK;
    if (s->ws) {
        FA_CUDA_TRY(ctx, cudaStreamSynchronize(s->stream));
        cudaFree(s->ws);
        s->ws = NULL;
        s->ws_size = 0;
    }
    if (cudaMalloc(&s->ws, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        s->ws = NULL;
        return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "CUDA workspace: cudaMalloc of %zu bytes failed", bytes);
    }
    s->ws_size = bytes;
    return FA_OK;
}

fa_status fa_cuda_workspace_of(fa_context *ctx, size_t bytes, void **ws) {
    fa_cuda_state *s = (fa_cuda_state *)ctx->cuda;
    fa_status rc = fa_cuda_ws_grow(ctx, s, bytes);
    *ws = s->ws;
    return rc;
}

/* Counters that every kernel using them leaves at zero: zeroed (on the stream) when allocated or grown, never
 * shrunk, apart from the workspace, which other calls overwrite. */
fa_status fa_cuda_counters_of(fa_context *ctx, size_t n, int **out) {
    fa_cuda_state *s = (fa_cuda_state *)ctx->cuda;
    if (n > s->counters_n) {
        if (s->counters) {
            FA_CUDA_TRY(ctx, cudaStreamSynchronize(s->stream));
            cudaFree(s->counters);
            s->counters = NULL;
            s->counters_n = 0;
        }
        if (cudaMalloc(&s->counters, n * sizeof(int)) != cudaSuccess) {
            (void)cudaGetLastError();
            s->counters = NULL;
            return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "CUDA split counters: cudaMalloc of %zu bytes failed",
                           n * sizeof(int));
        }
        FA_CUDA_TRY(ctx, cudaMemsetAsync(s->counters, 0, n * sizeof(int), s->stream));
        s->counters_n = n;
    }
    *out = s->counters;
    return FA_OK;
}

static void fa_fill_strides(const fa_tensor *t, int64_t *sb, int64_t *ss, int64_t *sh) {
    *sb = t->stride_batch, *ss = t->stride_seq, *sh = t->stride_head;
}

/* The kernels' parameter block: the problem, the device copy of the cu_seqlens, the workspace parts. */
static fa_status fa_cuda_prepare(fa_context *ctx, const fa_problem *p, const fa_cuda_ws *w, fa_cuda_params *c) {
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
    c->dsum = w->dsum, c->lse2 = w->lse2, c->dq_acc = w->dq_acc, c->dk_acc = w->dk_acc, c->dv_acc = w->dv_acc;
    c->tail_acc = w->tail_acc, c->o_acc = w->o_acc, c->row_m = w->row_m, c->row_l = w->row_l;
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

static fa_status fa_cuda_err(fa_context *ctx, const char *what, cudaError_t e) {
    return fa_fail(ctx, FA_ERR_DEVICE, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

static fa_status fa_std_err(fa_context *ctx, const char *what, fa_std_status r) {
    if (r.blas != CUBLAS_STATUS_SUCCESS)
        return fa_fail(ctx, FA_ERR_DEVICE, "%s: cuBLAS: %s", what, cublasGetStatusString(r.blas));
    if (r.cuda != cudaSuccess) return fa_cuda_err(ctx, what, r.cuda);
    return FA_OK;
}

/* The plan's algorithm. */
static fa_status fa_cuda_algo(fa_context *ctx, fa_cuda_state *s, const fa_problem *p, const fa_plan *plan,
                              const fa_cuda_ws &w, const fa_cuda_params &c) {
    if (plan->algo == FA_ALGO_FLASH3) { /* its own parameter block (sm90/flash3.h) */
        fa3_params f;
        fa_flash3_params(p, plan->grid[0], &f);
        f.lse = c.lse;
        f.tile_counter = w.tile_counter;
        if (w.tile_counter) FA_CUDA_TRY(ctx, cudaMemsetAsync(w.tile_counter, 0, sizeof(int), s->stream));
        const cudaError_t e = fa3_fwd(&f, s->stream);
        return e == cudaSuccess ? FA_OK : fa_cuda_err(ctx, "flash3 forward launch", e);
    }
    const int dtype = (int)p->dtype;
    if (plan->algo == FA_ALGO_STANDARD) {
        const fa_std_status r =
            p->is_backward
                ? fa_standard_backward(&c, dtype, p->cu_q, p->cu_k, s->blas, s->stream, w.standard, w.standard_bytes)
                : fa_standard_forward(&c, dtype, p->cu_q, p->cu_k, s->blas, s->stream, w.standard, w.standard_bytes);
        return fa_std_err(ctx, p->is_backward ? "standard backward" : "standard forward", r);
    }
    cudaError_t e;
    if (plan->algo == FA_ALGO_FLASH2)
        e = p->is_backward ? fa_flash2_bwd_launch(&c, plan, dtype, s->stream) : fa_flash2_fwd_launch(&c, plan, dtype, s->stream);
    else
        e = p->is_backward ? fa_flash1_bwd_launch(&c, plan, dtype, s->stream) : fa_flash1_fwd_launch(&c, plan, dtype, s->stream);
    if (e != cudaSuccess)
        return fa_cuda_err(ctx, !p->is_backward ? (plan->algo == FA_ALGO_FLASH2 ? "flash2 forward launch" : "flash1 forward launch")
                                                : "flash backward launch",
                           e);
    return FA_OK;
}

/* Executes the plan on the context's device (fa_cuda_run restores the caller's current device afterwards), inside
 * the numerics contract's scan and fix-up (contract.h). */
static fa_status fa_cuda_run_on(fa_context *ctx, const fa_problem *p, const fa_plan *plan) {
    fa_cuda_state *s = (fa_cuda_state *)ctx->cuda;
    fa_status rc = fa_cuda_ws_grow(ctx, s, plan->workspace_bytes);
    if (rc != FA_OK) return rc;
    fa_arena a = fa_arena_over(s->ws, s->ws_size);
    fa_cuda_ws w;
    fa_cuda_ws_layout(&a, p, plan, &w);
    fa_cuda_params c;
    if ((rc = fa_cuda_prepare(ctx, p, &w, &c)) != FA_OK) return rc;
    if (!p->is_backward && !c.lse) c.lse = w.contract.lse; /* the contract's check reads the forward's LSE */
    cudaError_t e = fa_contract_scan(&c, p, &w.contract, s->stream);
    if (e != cudaSuccess) return fa_cuda_err(ctx, "contract scan", e);
    if ((rc = fa_cuda_algo(ctx, s, p, plan, w, c)) != FA_OK) return rc;
    if ((e = fa_contract_fix(&c, p, &w.contract, 2 * s->tune.sm_count, s->stream)) != cudaSuccess)
        return fa_cuda_err(ctx, "contract fix-up", e);
    return FA_OK;
}

extern "C" fa_status fa_cuda_run(fa_context *ctx, const fa_problem *p, const fa_plan *plan, fa_stats *st) {
    (void)st; /* the stats are the plan's (api.c) */
    const fa_cuda_state *s = (const fa_cuda_state *)ctx->cuda;
    int prev = 0;
    FA_CUDA_TRY(ctx, cudaGetDevice(&prev));
    if (prev != s->device) FA_CUDA_TRY(ctx, cudaSetDevice(s->device));
    fa_status rc = fa_cuda_run_on(ctx, p, plan);
    if (prev != s->device) cudaSetDevice(prev);
    return rc;
}
