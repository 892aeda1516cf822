/* The CUDA backend: the context's state created and destroyed (state.h), and the run that executes a plan: the
 * parameter block, then the picked family row's launch inside the numerics contract (plan.cu decides; this file only
 * carries it out). Host code only; never prints. */
#include "plan.h"
#include "sinks.h"
#include "kvcache/kvcache.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" int fa_cuda_built(void) { return 1; }

extern "C" int fa_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

/* An environment variable's integer, or dflt where it is unset. */
static int fa_env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v ? atoi(v) : dflt;
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
    s->tune.device = device;
    s->tune.sm_count = prop.multiProcessorCount;
    /* the tuning switches, read once here, never in a call */
    s->tune.fwd_warps = fa_env_int("FA_CUDA_FLASH2_FWD_WARPS", 0);
    s->tune.split_rows = fa_env_int("FA_CUDA_BWD_SPLIT_ROWS", FA_CUDA_BWD_SPLIT_ROWS);
    s->tune.flash3_cluster = fa_env_int("FA_CUDA_FLASH3_CLUSTER", 1) != 0;
    s->tune.flash3_qbuf = fa_env_int("FA_CUDA_FLASH3_QBUF", 1) != 0;
    s->tune.flash3_early = fa_env_int("FA_CUDA_FLASH3_EARLY_TILE", 0) != 0;
    s->tune.flash3_bwd_pairs = fa_env_int("FA_CUDA_FLASH3_BWD_PAIRS", 0) != 0;
    s->tune.flash3_bwd_fused_dq = fa_env_int("FA_CUDA_FLASH3_BWD_FUSED_DQ", 0);
    cublasStatus_t bs = cublasCreate(&s->blas);
    cudaError_t fe = cudaMalloc((void **)&s->kv_fault, FA_KV_FAULT_INTS * sizeof(int));
    if (fe == cudaSuccess) fe = cudaMemset(s->kv_fault, 0, FA_KV_FAULT_INTS * sizeof(int));
    cudaSetDevice(prev); /* the caller's current device is left as it was */
    if (bs != CUBLAS_STATUS_SUCCESS || fe != cudaSuccess) {
        if (bs == CUBLAS_STATUS_SUCCESS) cublasDestroy(s->blas);
        if (s->kv_fault) cudaFree(s->kv_fault);
        free(s);
        if (fe != cudaSuccess)
            return fa_fail(ctx, FA_ERR_DEVICE, "the KV-cache fault record: %s", cudaGetErrorString(fe));
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
    if (s->counters) cudaFree(s->counters);
    if (s->kv_fault) cudaFree(s->kv_fault);
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

/* ---- run ---- */

static void fa_fill_strides(const fa_tensor *t, int64_t *sb, int64_t *ss, int64_t *sh) {
    *sb = t->stride_batch, *ss = t->stride_seq, *sh = t->stride_head;
}

/* The kernels' parameter block: the problem (the caller's device cu_seqlens as they are), the workspace parts. */
static void fa_cuda_prepare(const fa_problem *p, const fa_cuda_ws *w, fa_cuda_params *c) {
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
    c->wl = p->wl, c->wr = p->wr, c->chunk = p->chunk < (1 << 30) ? p->chunk : 1 << 30;
    c->chunk_mul = 0, c->chunk_shift = 0;
    if (c->chunk > 1) { /* round-up magic number of the divisor (Granlund-Montgomery) */
        int l = 0;
        while ((1u << l) < (unsigned)c->chunk) l++;
        c->chunk_mul = (unsigned)((((uint64_t)1 << (31 + l)) + (uint64_t)c->chunk - 1) / (uint64_t)c->chunk);
        c->chunk_shift = l - 1;
    }
    c->sinks = p->sinks;
    c->dsum = w->dsum, c->lse2 = w->lse2, c->dq_acc = w->dq_acc, c->dk_acc = w->dk_acc, c->dv_acc = w->dv_acc;
    c->tail_acc = w->tail_acc, c->o_acc = w->o_acc, c->row_m = w->row_m, c->row_l = w->row_l;
    c->dtype = (int)p->dtype;
    c->tile_counter = w->tile_counter;
    c->dq_turns = w->dq_turns;
    c->cu_q = p->cu_q, c->cu_k = p->cu_k; /* device memory, read by the kernels only (fa_get_seq clamps them) */
    c->used_q = p->used_q, c->used_k = p->used_k; /* likewise */
    c->d_v = (int)p->d_v;
    c->q_descale = p->q_descale, c->k_descale = p->k_descale, c->v_descale = p->v_descale;
    c->v_t = w->v_t;
    c->o_dtype = (int)p->o.dtype;
}

static fa_status fa_cuda_err(fa_context *ctx, const char *what, cudaError_t e) {
    return fa_fail(ctx, FA_ERR_DEVICE, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* The picked row's launch. */
static fa_status fa_cuda_launch_row(fa_context *ctx, const fa_cuda_state *s, const fa_problem *p, const fa_plan *plan,
                                    const fa_cuda_ws *w, const fa_cuda_params *c) {
    const fa_cuda_launch l = {p, plan, c, w, s->stream, s->blas};
    const fa_cuda_result r = fa_cuda_families[plan->family]->launch(&l);
    if (r.blas != CUBLAS_STATUS_SUCCESS)
        return fa_fail(ctx, FA_ERR_DEVICE, "%s: cuBLAS: %s", plan->kernel, cublasGetStatusString(r.blas));
    if (r.cuda != cudaSuccess) return fa_cuda_err(ctx, plan->kernel, r.cuda);
    return FA_OK;
}

/* Executes the plan on the context's device (fa_cuda_run restores the caller's current device afterwards), inside
 * the numerics contract's scan and fix-up (contract.h). */
static fa_status fa_cuda_run_on(fa_context *ctx, const fa_problem *p, const fa_plan *plan) {
    fa_cuda_state *s = (fa_cuda_state *)ctx->cuda;
    void *ws = NULL;
    fa_status rc = fa_cuda_workspace_of(ctx, plan->workspace_bytes, &ws);
    if (rc != FA_OK) return rc;
    fa_arena a = fa_arena_over(ws, s->ws_size);
    fa_cuda_ws w;
    fa_cuda_ws_layout(&a, p, plan, &w);
    fa_cuda_params c;
    fa_cuda_prepare(p, &w, &c);
    if (!p->is_backward && !c.lse) c.lse = w.contract.lse; /* the contract's check reads the forward's LSE */
    if (!p->is_backward && fa_cuda_families[plan->family]->checks_outputs)
        c.o_check = fa_contract_o_flags(&w.contract); /* the kernel marks the items it cannot certify */
    const int join_pass = !p->is_backward && p->sinks && !fa_cuda_families[plan->family]->joins_sinks;
    c.sinks_joined = !p->is_backward && p->sinks && !join_pass;
    if (p->is_backward) c.d_sinks = p->d_sinks; /* the backward's D pre-pass sums them (sinks.h) */
    cudaError_t e = fa_contract_scan(&c, p, &w.contract, s->stream);
    if (e != cudaSuccess) return fa_cuda_err(ctx, "contract scan", e);
    if ((rc = fa_cuda_launch_row(ctx, s, p, plan, &w, &c)) != FA_OK) return rc;
    if ((e = fa_contract_fix(&c, p, &w.contract, 2 * s->tune.sm_count, s->stream)) != cudaSuccess)
        return fa_cuda_err(ctx, "contract fix-up", e);
    /* a family that does not join the sinks in its epilogue: the pass after the fix-up, so that every row,
     * recomputed or not, joins its sink once (sinks.h); else the kernel and the fix-up have joined them */
    if (join_pass && (e = fa_cuda_sinks_join(p, c.lse, s->stream)) != cudaSuccess)
        return fa_cuda_err(ctx, "sinks join", e);
    if ((e = fa_cuda_zero_unused(p, s->stream)) != cudaSuccess) return fa_cuda_err(ctx, "seqused padding", e);
    return FA_OK;
}

extern "C" fa_status fa_cuda_run(fa_context *ctx, const fa_problem *p, const fa_plan *plan, fa_stats *st) {
    (void)st; /* the stats are the plan's (api.c) */
    const fa_cuda_state *s = (const fa_cuda_state *)ctx->cuda;
    int prev = 0;
    FA_CUDA_TRY(ctx, cudaGetDevice(&prev));
    if (prev != s->device) FA_CUDA_TRY(ctx, cudaSetDevice(s->device));
    fa_status rc = plan->zero_fill ? fa_cuda_zero_fill(ctx, p) : fa_cuda_run_on(ctx, p, plan);
    if (rc == FA_OK && plan->zero_fill) { /* the sinks' LSE of the padding rows back to -inf */
        const cudaError_t e = fa_cuda_zero_unused(p, fa_cuda_stream_of(ctx));
        if (e != cudaSuccess) rc = fa_cuda_err(ctx, "seqused padding", e);
    }
    if (prev != s->device) cudaSetDevice(prev);
    return rc;
}
