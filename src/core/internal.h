/* What the backends (src/cpu, src/cuda) share with the entry layer above them: the validated problem, the plan, the
 * context, and the helpers that sit below both (names.c, status.c, workspace.c). Not installed. The entry files
 * (api.c, kvcache.c, src/dist) fill the problem and ask a backend for its plan; a backend runs it, never prints
 * and never calls up into an entry file. The entry layer's own steps are in entry.h. docs/architecture.md. */
#ifndef FA_INTERNAL_H
#define FA_INTERNAL_H

#include "flashattn.h"
#include "core/visible.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#define FA_HIDDEN __attribute__((visibility("hidden")))

/* The largest head_dim of the library, checked once by the entry layer: the CUDA kernels' d = 256 tiles fill shared
 * memory, and the CUDA numerics contract's fix-up holds a row in 8 elements per lane. */
#define FA_MAX_HEAD_DIM 256
/* KV-cache decoding's own limits, q/k and v: MLA's absorbed decode shape (DeepSeek-V3: 576 = 512 + 64 rope dims
 * against v's 512), which the decode kernels hold a row of per lane group. */
#define FA_MAX_KV_HEAD_DIM 576
#define FA_MAX_KV_HEAD_DIM_V 512

#define FA_STR_(x) #x
#define FA_STR(x) FA_STR_(x)
#define FA_VERSION_TEXT FA_STR(FA_VERSION_MAJOR) "." FA_STR(FA_VERSION_MINOR) "." FA_STR(FA_VERSION_PATCH)

/* A validated attention call. api.c fills it; backends only read it. */
typedef struct fa_problem {
    int is_backward;
    fa_algo algo;          /* resolved: never FA_ALGO_AUTO (AUTO gives FLASH2; the plan may upgrade it) */
    int algo_auto;         /* 1: the caller asked for FA_ALGO_AUTO */
    fa_dtype dtype;        /* of every tensor; FA_DTYPE_F8_E4M3: of q, k, v only (o.dtype is out's) */
    int64_t batch;         /* number of sequences: q.batch, or n_seqs for varlen */
    int64_t hq, hk, d;     /* query heads, K/V heads, the head_dim q and k share (dqk) */
    int64_t d_v;           /* the head_dim v, out (and dout, dv) share (dv); d unless the caller gave v its own */
    int64_t sq_max, sk_max;/* longest query / key sequence (q.seqlen / k.seqlen unless varlen; cu_device: the
                            * caller's bounds, opts.max_seqlen_q/k) */
    float scale;           /* resolved (never 0) */
    float softcap;         /* 0 = off */
    int wl, wr;            /* window, -1 = unbounded; causal is folded in as wr = min(wr, 0) */
    int chunk;             /* attention_chunk, 0 = off (core/visible.h) */
    int causal;            /* as given (informational; wl/wr carry the mask) */
    int block_q, block_k;  /* 0 = tuned default */
    int deterministic;
    const int32_t *cu_q, *cu_k; /* arrays of batch + 1 entries, or NULL */
    const int32_t *used_q, *used_k; /* opts.seqused_q/k: arrays of batch entries (only with cu_q), or NULL */
    int cu_device;         /* cu_q, cu_k are device memory (CUDA): the host never reads them */
    fa_tensor q, k, v, o;  /* o = out */
    float *lse;            /* forward: output (may be NULL); backward: input (never NULL) */
    fa_tensor dout, dq, dk, dv; /* backward only */
    const float *sinks;    /* fp32 [hq] on the call's device, or NULL (core/sink.h) */
    float *d_sinks;        /* backward: fp32 [hq] written with d sinks, or NULL */
    const float *q_descale, *k_descale, *v_descale; /* FP8 forward: fp32 [batch][hk] on the call's device, or NULL = 1 */
} fa_problem;

/* Rows of sequence b (its used rows with seqused_q/k, which the entry layer checked to be within the span); with
 * device arrays, the bound every sequence stays within (what the models count). */
static inline int64_t fa_seqlen_q(const fa_problem *p, int64_t b) {
    if (p->cu_device) return p->sq_max;
    if (p->used_q) return p->used_q[b];
    return p->cu_q ? (int64_t)p->cu_q[b + 1] - p->cu_q[b] : p->q.seqlen;
}
static inline int64_t fa_seqlen_k(const fa_problem *p, int64_t b) {
    if (p->cu_device) return p->sk_max;
    if (p->used_k) return p->used_k[b];
    return p->cu_k ? (int64_t)p->cu_k[b + 1] - p->cu_k[b] : p->k.seqlen;
}
/* Element offset of row 0 of (sequence b, head h) in a query-side (is_k = 0) or key-side (is_k = 1) tensor. An
 * empty packed sequence gets the tensor's row 0 (never read): its cu[b] may be one past the last row, an offset
 * the validated extent does not bound. Host arrays only (the CPU's). */
static inline int64_t fa_row0(const fa_problem *p, const fa_tensor *t, int is_k, int64_t b, int64_t h) {
    const int32_t *cu = is_k ? p->cu_k : p->cu_q;
    if (!cu) return b * t->stride_batch + h * t->stride_head;
    return (cu[b + 1] > cu[b] ? (int64_t)cu[b] * t->stride_seq : 0) + h * t->stride_head;
}
/* Index of LSE[b, h, 0]; the LSE row of (b, h) is contiguous. */
static inline int64_t fa_lse0(const fa_problem *p, int64_t b, int64_t h) {
    return p->cu_q ? h * p->q.seqlen + p->cu_q[b] : (b * p->hq + h) * p->q.seqlen;
}
/* A call without a single (query, key) pair: no sequence, no query row or no key row. Its outputs are constants —
 * out = 0, LSE = -inf, dq = dk = dv = 0 — and each backend's plan writes them without an attention kernel
 * (fa_plan.zero_fill); the kernels never see zero extents. */
static inline int fa_problem_empty(const fa_problem *p) { return p->batch == 0 || p->sq_max == 0 || p->sk_max == 0; }
/* The bytes a zero-filling plan writes: out and lse (forward) or dq, dk and dv (backward). */
static inline double fa_zero_fill_bytes(const fa_problem *p) {
    const fa_tensor *t[3] = {p->is_backward ? &p->dq : &p->o, &p->dk, &p->dv};
    double n = 0;
    for (int i = 0; i < (p->is_backward ? 3 : 1); i++)
        n += (double)t[i]->batch * t[i]->seqlen * t[i]->heads * t[i]->head_dim * (double)fa_dtype_size(t[i]->dtype);
    const double lse = !p->is_backward && p->lse ? (double)p->q.batch * p->hq * p->q.seqlen * sizeof(float) : 0;
    return n + lse;
}
/* Keys visible to query row i of a (sq, sk) sequence: [*lo, *hi) (empty when *hi <= *lo). core/visible.h. */
static inline void fa_key_range(const fa_problem *p, int64_t sq, int64_t sk, int64_t i, int64_t *lo, int64_t *hi) {
    fa_visible_keys(i, sq, sk, p->wl, p->wr, p->chunk, lo, hi);
}
/* Whether a mask beyond the sequence ends applies (window, causal or chunk): tiles may then be partly visible. */
static inline int fa_problem_masked(const fa_problem *p) { return p->wl >= 0 || p->wr >= 0 || p->chunk > 0; }

/* The plan of one call: what a backend will run for a validated problem. The backend's plan function is the one
 * place that decides it (support, kernel, tiles, launch shape, workspace, modelled traffic); the entry layer, the
 * backend's run, fa_last_stats and the CLI (through fa_stats) read it, and nothing else decides. */
typedef struct fa_plan {
    fa_algo algo;             /* what runs: p->algo, or where p->algo_auto a faster algorithm the plan chose */
    const char *kernel;       /* static name of what runs, e.g. "cuda.flash2.fwd.mma_sync.d128" */
    int block_q, block_k;     /* Br, Bc */
    int threads;              /* CPU: threads of the team; CUDA: threads per CTA of the main kernel */
    int grid[3];              /* CUDA: the main kernel's grid (x, y, z); CPU: 0 */
    size_t smem_bytes;        /* CUDA: dynamic shared memory per CTA of the main kernel; CPU: 0 */
    size_t workspace_bytes;   /* backend workspace the call takes (from its layout's dry run) */
    double read_bytes;        /* modelled slow-memory traffic; the CPU replaces it with the counted bytes */
    double write_bytes;
    int zero_fill;            /* fa_problem_empty: the outputs are written as constants, no attention kernel runs */
    int family;               /* backend-private: the backend's kernel family that runs (CUDA: its family table's row) */
    int entry;                /* backend-private: the row of the backend's kernel table that runs */
    int aux[6];               /* backend-private: further choices of that row (e.g. a split count) */
} fa_plan;
/* The context. State lives here, never in globals. */
#define FA_ERR_LEN 512
struct fa_context {
    fa_backend backend;
    int threads;           /* CPU threads */
    int device;            /* CUDA ordinal */
    char err[FA_ERR_LEN];
    fa_stats stats;
    int has_stats;
    void *ws;              /* CPU workspace, grown, never shrunk (64-byte aligned) */
    size_t ws_size;
    void *ws_in;           /* CPU: inputs converted before a run (FP8 widened to fp32), apart from ws (fa_workspace_in) */
    size_t ws_in_size;
    const void *kernels;   /* CPU: const fa_cpu_kernels * picked once at creation */
    void *cuda;            /* CUDA backend state (src/cuda), NULL on CPU */
};

/* ---- Below the backends: any layer may call these ---- */
/* Record a message on ctx and return status. printf-style. (status.c) */
FA_HIDDEN fa_status fa_fail(fa_context *ctx, fa_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* CPU workspace of at least bytes (64-byte aligned), or NULL after fa_fail(FA_ERR_OUT_OF_MEMORY). (workspace.c) */
FA_HIDDEN void *fa_workspace(fa_context *ctx, size_t bytes);
/* The same for a second buffer that holds a call's converted inputs while the run and the numerics contract use
 * fa_workspace's (which they may grow and move). (workspace.c) */
FA_HIDDEN void *fa_workspace_in(fa_context *ctx, size_t bytes);
/* So are the public fa_dtype_size, fa_dtype_name, fa_algo_name, fa_backend_name and fa_status_string (names.c). */

/* ---- Backends ----
 * Each backend provides plan and run. plan: FA_OK with *plan filled, or FA_ERR_UNSUPPORTED (or another status)
 * with the reason in why — decided before any work starts, nothing falls back silently. run: executes exactly the
 * plan; st arrives filled from the plan (kernel, tiles, threads, workspace, modelled bytes) and run may refine the
 * traffic (the CPU counts it). */

/* CPU backend (src/cpu/) */
FA_HIDDEN fa_status fa_cpu_init(fa_context *ctx);
FA_HIDDEN fa_status fa_cpu_plan(const fa_context *ctx, const fa_problem *p, fa_plan *plan, char *why, size_t why_len);
FA_HIDDEN fa_status fa_cpu_run(fa_context *ctx, const fa_problem *p, const fa_plan *plan, fa_stats *st);

/* A validated fa_quantize_fp8 call (quantize.c); the backends' quantisers read it. */
typedef struct fa_quant_problem {
    fa_tensor x, y;      /* x: f32/f16/bf16, y: f8_e4m3, the same [B, S, H, D] */
    float *descale;      /* [B][H / group][nblk] */
    int64_t group;       /* heads per scale */
    int64_t block_rows;  /* rows per block: S (one block) when the caller gave 0 */
    int64_t nblk;        /* blocks per (batch, head group) */
    int per_tensor;      /* one amax over everything */
    int hadamard;
    uint64_t seed;
} fa_quant_problem;
FA_HIDDEN fa_status fa_cpu_quantize(fa_context *ctx, const fa_quant_problem *q);
FA_HIDDEN fa_status fa_cuda_quantize(fa_context *ctx, const fa_quant_problem *q);

/* ---- CUDA backend (src/cuda/, built when FA_HAVE_CUDA; stubs in src/core/cuda_stub.c otherwise) ---- */
FA_HIDDEN int fa_cuda_built(void);
FA_HIDDEN int fa_cuda_device_count(void);
FA_HIDDEN fa_status fa_cuda_create(fa_context *ctx, int device);
FA_HIDDEN void fa_cuda_destroy(fa_context *ctx);
FA_HIDDEN fa_status fa_cuda_set_stream(fa_context *ctx, void *stream);
FA_HIDDEN fa_status fa_cuda_plan(const fa_context *ctx, const fa_problem *p, fa_plan *plan, char *why, size_t why_len);
FA_HIDDEN fa_status fa_cuda_run(fa_context *ctx, const fa_problem *p, const fa_plan *plan, fa_stats *st);

#endif
