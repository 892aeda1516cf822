/* The attention entry points and the context: fa_context_*, the tensor constructors, fa_forward and fa_backward.
 * Every argument is checked before any output is touched (the shared steps in entry.c), then the backend's plan
 * runs; backends receive a validated fa_problem and never print. The KV-cache entry points are kvcache.c. */
#include "core/entry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

int fa_backend_available(fa_backend b) {
    if (b == FA_BACKEND_CPU) return 1;
    if (b == FA_BACKEND_CUDA) return fa_cuda_built() && fa_cuda_device_count() > 0;
    return 0;
}

/* a·b saturated at INT64_MAX (dims are validated later; a stride that overflowed makes the extent check fail) */
static int64_t sat_mul(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) || r < 0 ? INT64_MAX : r;
}

fa_tensor fa_tensor_bshd(void *data, fa_dtype dtype, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim) {
    fa_tensor t = {data, dtype, batch, seqlen, heads, head_dim, sat_mul(seqlen, sat_mul(heads, head_dim)),
                   sat_mul(heads, head_dim), head_dim};
    return t;
}

fa_tensor fa_tensor_bhsd(void *data, fa_dtype dtype, int64_t batch, int64_t heads, int64_t seqlen, int64_t head_dim) {
    fa_tensor t = {data, dtype, batch, seqlen, heads, head_dim, sat_mul(heads, sat_mul(seqlen, head_dim)), head_dim,
                   sat_mul(seqlen, head_dim)};
    return t;
}

/* ---------------------------------------------------------------------------------------------------------
 * Context
 * ------------------------------------------------------------------------------------------------------- */
static _Thread_local char create_err[FA_ERR_LEN];

const char *fa_create_error(void) { return create_err; }

fa_status fa_context_create(fa_context **out, fa_backend backend, int device_or_threads) {
    create_err[0] = 0;
    if (!out) {
        snprintf(create_err, sizeof create_err, "ctx: the output pointer is NULL");
        return FA_ERR_INVALID_ARGUMENT;
    }
    *out = NULL;
    if (backend != FA_BACKEND_CPU && backend != FA_BACKEND_CUDA) {
        snprintf(create_err, sizeof create_err, "backend: %d is not a fa_backend", (int)backend);
        return FA_ERR_INVALID_ARGUMENT;
    }
    if (device_or_threads < 0) {
        snprintf(create_err, sizeof create_err, "device_or_threads: %d is negative", device_or_threads);
        return FA_ERR_INVALID_ARGUMENT;
    }
    fa_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) {
        snprintf(create_err, sizeof create_err, "ctx: out of memory");
        return FA_ERR_OUT_OF_MEMORY;
    }
    ctx->backend = backend;
    fa_status st;
    if (backend == FA_BACKEND_CPU) {
        int n = device_or_threads;
#ifdef _OPENMP
        if (n == 0) n = omp_get_max_threads();
#else
        n = 1;
#endif
        ctx->threads = n < 1 ? 1 : n;
        st = fa_cpu_init(ctx);
    } else {
        ctx->device = device_or_threads;
        st = fa_cuda_create(ctx, device_or_threads);
    }
    if (st != FA_OK) {
        snprintf(create_err, sizeof create_err, "%s", ctx->err);
        fa_context_destroy(ctx);
        return st;
    }
    *out = ctx;
    return FA_OK;
}

void fa_context_destroy(fa_context *ctx) {
    if (!ctx) return;
    if (ctx->backend == FA_BACKEND_CUDA) fa_cuda_destroy(ctx);
    free(ctx->ws);
    free(ctx->ws_in);
    free(ctx);
}

const char *fa_context_last_error(const fa_context *ctx) { return ctx ? ctx->err : "ctx: NULL context"; }

fa_backend fa_context_backend(const fa_context *ctx) { return ctx ? ctx->backend : (fa_backend)-1; }

int fa_context_threads(const fa_context *ctx) {
    if (!ctx) return -1;
    return ctx->backend == FA_BACKEND_CPU ? ctx->threads : ctx->device;
}

fa_status fa_context_set_stream(fa_context *ctx, void *stream) {
    if (!ctx) return FA_ERR_INVALID_ARGUMENT;
    ctx->err[0] = 0;
    if (ctx->backend == FA_BACKEND_CPU) {
        if (stream) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cuda_stream: a CPU context takes no stream (NULL only)");
        return FA_OK;
    }
    return fa_cuda_set_stream(ctx, stream);
}

fa_status fa_last_stats(const fa_context *ctx, fa_stats *s) {
    if (!ctx || !s || !ctx->has_stats) return FA_ERR_INVALID_ARGUMENT;
    *s = ctx->stats;
    return FA_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 * Validation
 * ------------------------------------------------------------------------------------------------------- */
/* seqused (host): 0 <= used[s] <= the span cu[s + 1] - cu[s] of sequence s. */
static fa_status check_used(fa_context *ctx, const char *name, const int32_t *used, const int32_t *cu, int64_t n) {
    for (int64_t s = 0; s < n; s++)
        if (used[s] < 0 || used[s] > cu[s + 1] - cu[s])
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s[%lld] = %d: must be in 0..%d (the span of sequence %lld "
                           "in cu_seqlens)", name, (long long)s, used[s], cu[s + 1] - cu[s], (long long)s);
    return FA_OK;
}

/* Validate the arguments shared by forward and backward and fill p. Outputs are checked by the caller. */
static fa_status build_problem(fa_context *ctx, const fa_attn_opts *opts_in, const fa_tensor *q, const fa_tensor *k,
                               const fa_tensor *v, const fa_tensor *out, fa_problem *p, fa_span sp[4],
                               fa_span *sinks_sp) {
    fa_attn_opts opts;
    fa_status st = fa_entry_attn_opts(ctx, opts_in, &opts);
    if (st != FA_OK) return st;
    if ((st = fa_entry_tensor(ctx, "q", q, 0, &sp[0])) || (st = fa_entry_tensor(ctx, "k", k, 0, &sp[1])) ||
        (st = fa_entry_tensor(ctx, "v", v, 0, &sp[2])) || (st = fa_entry_tensor(ctx, "out", out, 0, &sp[3])))
        return st;
    /* FP8 is an input type: q, k, v in E4M3, out in a type that holds the result (fp8_check.c) */
    const int fp8 = q->dtype == FA_DTYPE_F8_E4M3;
    if (fp8 && out->dtype == FA_DTYPE_F8_E4M3)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "out: dtype f8_e4m3: FP8 is an input type (q, k, v); out must be "
                       "f32, f16 or bf16");
    if (k->dtype != q->dtype || v->dtype != q->dtype || (!fp8 && out->dtype != q->dtype))
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "dtype: q is %s but k/v/out are %s/%s/%s (all must match%s)",
                       fa_dtype_name(q->dtype), fa_dtype_name(k->dtype), fa_dtype_name(v->dtype),
                       fa_dtype_name(out->dtype), fp8 || out->dtype == FA_DTYPE_F8_E4M3
                           ? "; with FP8, q, k and v are f8_e4m3 and out is f32, f16 or bf16" : "");
    /* q and k share one head_dim (dqk), v and out another (dv: MLA's 192 / 128) */
    const int64_t kshape[4] = {q->batch, -1, -1, q->head_dim}; /* k's own seqlen and K/V heads */
    const int64_t vshape[4] = {k->batch, k->seqlen, k->heads, -1};
    const int64_t oshape[4] = {q->batch, q->seqlen, q->heads, -1};
    if ((st = fa_entry_shape(ctx, "k", k, q->dtype, kshape, "q")) ||
        (st = fa_entry_shape(ctx, "v", v, k->dtype, vshape, "k")) ||
        (st = fa_entry_shape(ctx, "out", out, fp8 ? out->dtype : q->dtype, oshape, "q")) ||
        (st = fa_entry_head_dims(ctx, "out", out, v, "v")))
        return st;
    if (q->heads % k->heads)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "k: heads = %lld does not divide q.heads = %lld (GQA/MQA)",
                       (long long)k->heads, (long long)q->heads);
    if ((st = fa_entry_head_dim(ctx, "q", q->head_dim)) || (st = fa_entry_head_dim(ctx, "v", v->head_dim))) return st;
    if ((st = fa_entry_check_opts(ctx, &opts))) return st;
    if ((int)opts.algo < FA_ALGO_AUTO || opts.algo > FA_ALGO_FLASH3)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.algo: %d is not a fa_algo", (int)opts.algo);
    if (opts.block_q < 0 || opts.block_q > 4096 || opts.block_k < 0 || opts.block_k > 4096)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.block_q/block_k: (%d, %d), each must be in 0..4096",
                       opts.block_q, opts.block_k);
    memset(p, 0, sizeof *p);
    p->batch = q->batch;
    if ((opts.seqused_q || opts.seqused_k) && !opts.cu_seqlens_q)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.seqused_%s: set without cu_seqlens (it gives the used rows of "
                       "a packed batch's sequences)", opts.seqused_q ? "q" : "k");
    p->used_q = opts.seqused_q;
    p->used_k = opts.seqused_k;
    if (opts.cu_seqlens_q || opts.cu_seqlens_k) {
        if (!opts.cu_seqlens_q || !opts.cu_seqlens_k)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.cu_seqlens_%s: NULL while cu_seqlens_%s is set",
                           opts.cu_seqlens_q ? "k" : "q", opts.cu_seqlens_q ? "q" : "k");
        if (opts.n_seqs < 0 || opts.n_seqs > INT32_MAX)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.n_seqs: %lld must be in 0..2^31-1 with cu_seqlens",
                           (long long)opts.n_seqs);
        if (q->batch != 1)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "q: batch = %lld, must be 1 with cu_seqlens (packed)",
                           (long long)q->batch);
        if (opts.max_seqlen_q < 0 || opts.max_seqlen_k < 0)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.max_seqlen_q/k: (%lld, %lld), each must be >= 0",
                           (long long)opts.max_seqlen_q, (long long)opts.max_seqlen_k);
        p->batch = opts.n_seqs;
        p->cu_q = opts.cu_seqlens_q;
        p->cu_k = opts.cu_seqlens_k;
        if (ctx->backend == FA_BACKEND_CUDA) {
            /* device arrays: never read here; the launch is sized from the caller's bounds (at most the totals) */
            if ((q->seqlen && !opts.max_seqlen_q) || (k->seqlen && !opts.max_seqlen_k))
                return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.max_seqlen_%s: 0; on a CUDA context cu_seqlens are "
                               "device memory the host does not read: give the longest %s sequence (flash-attn's "
                               "max_seqlen_%s)", q->seqlen && !opts.max_seqlen_q ? "q" : "k",
                               q->seqlen && !opts.max_seqlen_q ? "query" : "key",
                               q->seqlen && !opts.max_seqlen_q ? "q" : "k");
            p->cu_device = 1;
            p->sq_max = opts.max_seqlen_q < q->seqlen ? opts.max_seqlen_q : q->seqlen;
            p->sk_max = opts.max_seqlen_k < k->seqlen ? opts.max_seqlen_k : k->seqlen;
        } else {
            if ((st = fa_entry_cu_seqlens(ctx, "opts.cu_seqlens_q", opts.cu_seqlens_q, opts.n_seqs, q->seqlen, NULL)) ||
                (st = fa_entry_cu_seqlens(ctx, "opts.cu_seqlens_k", opts.cu_seqlens_k, opts.n_seqs, k->seqlen, NULL)))
                return st;
            if ((opts.seqused_q &&
                 (st = check_used(ctx, "opts.seqused_q", opts.seqused_q, opts.cu_seqlens_q, opts.n_seqs))) ||
                (opts.seqused_k &&
                 (st = check_used(ctx, "opts.seqused_k", opts.seqused_k, opts.cu_seqlens_k, opts.n_seqs))))
                return st;
            for (int64_t s = 0; s < opts.n_seqs; s++) {
                int64_t a = opts.cu_seqlens_q[s + 1] - opts.cu_seqlens_q[s],
                        b = opts.cu_seqlens_k[s + 1] - opts.cu_seqlens_k[s];
                if (a > p->sq_max) p->sq_max = a;
                if (b > p->sk_max) p->sk_max = b;
            }
            if ((opts.max_seqlen_q && opts.max_seqlen_q < p->sq_max) ||
                (opts.max_seqlen_k && opts.max_seqlen_k < p->sk_max))
                return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.max_seqlen_q/k: (%lld, %lld) is below the longest "
                               "sequences of cu_seqlens_q/k (%lld, %lld)", (long long)opts.max_seqlen_q,
                               (long long)opts.max_seqlen_k, (long long)p->sq_max, (long long)p->sk_max);
        }
    } else {
        if (opts.max_seqlen_q || opts.max_seqlen_k)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.max_seqlen_q/k: (%lld, %lld) without cu_seqlens (they "
                           "bound a packed batch's sequences)", (long long)opts.max_seqlen_q,
                           (long long)opts.max_seqlen_k);
        p->sq_max = q->seqlen;
        p->sk_max = k->seqlen;
    }
    p->algo = opts.algo == FA_ALGO_AUTO ? FA_ALGO_FLASH2 : opts.algo;
    p->algo_auto = opts.algo == FA_ALGO_AUTO; /* the plan may pick a faster algorithm for the call */
    p->dtype = q->dtype;
    p->hq = q->heads;
    p->hk = k->heads;
    p->d = q->head_dim;
    p->d_v = v->head_dim;
    p->scale = opts.scale != 0 ? opts.scale : (float)(1.0 / sqrt((double)q->head_dim)); /* 1/sqrt(dqk) */
    p->softcap = opts.softcap;
    p->causal = opts.causal;
    p->wl = opts.window_left;
    p->wr = opts.window_right;
    if (opts.causal) p->wr = 0; /* causal = right window 0 (min(wr, 0) for any wr >= -1) */
    p->chunk = opts.attention_chunk;
    p->block_q = opts.block_q;
    p->block_k = opts.block_k;
    p->deterministic = opts.deterministic;
    /* sinks: [hq] floats on the call's device (never read here); an empty span when NULL */
    if ((st = fa_entry_f32(ctx, "opts.sinks", opts.sinks, 1, 1, opts.sinks ? q->heads : 0, sinks_sp))) return st;
    p->sinks = opts.sinks;
    p->d_sinks = opts.d_sinks;
    if ((st = fa_entry_descales(ctx, &opts, q->dtype, p->batch, k->heads))) return st;
    p->q_descale = opts.q_descale;
    p->k_descale = opts.k_descale;
    p->v_descale = opts.v_descale;
    p->q = *q;
    p->k = *k;
    p->v = *v;
    p->o = *out;
    return FA_OK;
}

/* Plan, then run exactly the plan. The backend's plan is the one decision (support, kernel, tiles, workspace,
 * traffic model); the stats start from it. */
static fa_status run(fa_context *ctx, fa_problem *p) {
    const int cuda = ctx->backend == FA_BACKEND_CUDA;
    fa_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.algo = p->algo;
    char why[256] = "";
    fa_status st = cuda ? fa_cuda_plan(ctx, p, &plan, why, sizeof why) : fa_cpu_plan(ctx, p, &plan, why, sizeof why);
    if (st != FA_OK) return fa_fail(ctx, st, "%s", why[0] ? why : "the backend has no plan for this call");
    fa_stats s = fa_entry_stats(ctx, &plan, p->is_backward);
    st = cuda ? fa_cuda_run(ctx, p, &plan, &s) : fa_cpu_run(ctx, p, &plan, &s);
    if (st != FA_OK) return st;
    fa_entry_done(ctx, &s, fa_problem_flops(p));
    return FA_OK;
}

fa_status fa_forward(fa_context *ctx, const fa_attn_opts *opts, const fa_tensor *q, const fa_tensor *k,
                     const fa_tensor *v, const fa_tensor *out, float *lse) {
    if (!ctx) return FA_ERR_INVALID_ARGUMENT;
    ctx->err[0] = 0;
    fa_problem p;
    fa_span sp[5], so, ss;
    fa_status st = build_problem(ctx, opts, q, k, v, out, &p, sp, &ss);
    if (st) return st;
    if ((st = fa_entry_tensor(ctx, "out", out, 1, &so))) return st;
    static const char *const in_names[3] = {"q", "k", "v"};
    if ((st = fa_entry_disjoint(ctx, "out", sp[3], in_names, sp, 3))) return st;
    if ((st = fa_entry_disjoint(ctx, "out", sp[3], (const char *const[]){"opts.sinks"}, &ss, 1))) return st;
    if (lse) {
        if ((st = fa_entry_f32(ctx, "lse", lse, p.q.batch, p.hq, p.q.seqlen, &sp[4]))) return st;
        static const char *const names[4] = {"q", "k", "v", "out"};
        if ((st = fa_entry_disjoint(ctx, "lse", sp[4], names, sp, 4))) return st;
        if ((st = fa_entry_disjoint(ctx, "lse", sp[4], (const char *const[]){"opts.sinks"}, &ss, 1))) return st;
    }
    if ((st = fa_entry_descales_apart(ctx, &p, sp[3], lse ? &sp[4] : NULL))) return st;
    p.d_sinks = NULL; /* the backward's output: the forward ignores it */
    p.lse = lse;
    return run(ctx, &p);
}

fa_status fa_backward(fa_context *ctx, const fa_attn_opts *opts, const fa_tensor *q, const fa_tensor *k,
                      const fa_tensor *v, const fa_tensor *out, const float *lse, const fa_tensor *dout,
                      const fa_tensor *dq, const fa_tensor *dk, const fa_tensor *dv) {
    if (!ctx) return FA_ERR_INVALID_ARGUMENT;
    ctx->err[0] = 0;
    fa_problem p;
    fa_span sp[11];
    fa_status st = build_problem(ctx, opts, q, k, v, out, &p, sp, &sp[9]);
    if (st) return st;
    if (p.dtype == FA_DTYPE_F8_E4M3)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED, "q: dtype f8_e4m3: FP8 inputs are forward only (fa_backward takes "
                       "f32, f16 or bf16 tensors)");
    if (!lse && p.q.batch && p.q.seqlen) /* NULL stands for an LSE of zero elements only */
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "lse: NULL (backward needs the forward's LSE)");
    if ((st = fa_entry_f32(ctx, "lse", lse, p.q.batch, p.hq, p.q.seqlen, &sp[4]))) return st;
    if ((st = fa_entry_tensor(ctx, "dout", dout, 0, &sp[5]))) return st;
    if ((st = fa_entry_tensor(ctx, "dq", dq, 1, &sp[6])) || (st = fa_entry_tensor(ctx, "dk", dk, 1, &sp[7])) ||
        (st = fa_entry_tensor(ctx, "dv", dv, 1, &sp[8])))
        return st;
    /* each gradient has its tensor's shape: dout out's, dq q's, dk k's, dv v's (so dv and dout carry v's head_dim) */
    const fa_tensor *grads[4] = {dout, dq, dk, dv}, *like[4] = {out, q, k, v};
    static const char *gn[4] = {"dout", "dq", "dk", "dv"}, *ln[4] = {"out", "q", "k", "v"};
    for (int i = 0; i < 4; i++) {
        const int64_t want[4] = {like[i]->batch, like[i]->seqlen, like[i]->heads, -1};
        if ((st = fa_entry_shape(ctx, gn[i], grads[i], q->dtype, want, ln[i])) ||
            (st = fa_entry_head_dims(ctx, gn[i], grads[i], like[i], ln[i])))
            return st;
    }
    static const char *const names[10] = {"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv", "opts.sinks"};
    for (int i = 6; i < 9; i++) {
        if ((st = fa_entry_disjoint(ctx, gn[i - 5], sp[i], names, sp, i))) return st;
        if ((st = fa_entry_disjoint(ctx, gn[i - 5], sp[i], names + 9, sp + 9, 1))) return st;
    }
    if (p.d_sinks) { /* d sinks: written in full, so apart from every other argument */
        if (!p.sinks)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.d_sinks: set without opts.sinks (it receives their "
                           "gradient)");
        if ((st = fa_entry_f32(ctx, "opts.d_sinks", p.d_sinks, 1, 1, p.hq, &sp[10])) ||
            (st = fa_entry_disjoint(ctx, "opts.d_sinks", sp[10], names, sp, 10)))
            return st;
    }
    p.is_backward = 1;
    p.lse = (float *)lse;
    p.dout = *dout;
    p.dq = *dq;
    p.dk = *dk;
    p.dv = *dv;
    return run(ctx, &p);
}
