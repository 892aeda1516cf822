#define _POSIX_C_SOURCE 200809L /* posix_memalign, sysconf */
/* The public API: argument validation, then the backend's plan and run, stats. Every entry point checks everything it is given
 * before touching any output; backends receive a validated fa_problem and never print. */
#include "core/internal.h"
#include "core/kvcache.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* ---------------------------------------------------------------------------------------------------------
 * Names and small helpers
 * ------------------------------------------------------------------------------------------------------- */
#define FA_STR_(x) #x
#define FA_STR(x) FA_STR_(x)
#define FA_VERSION_TEXT FA_STR(FA_VERSION_MAJOR) "." FA_STR(FA_VERSION_MINOR) "." FA_STR(FA_VERSION_PATCH)

const char *fa_version_string(void) {
#ifdef FA_HAVE_CUDA
    return FA_VERSION_TEXT " (cpu, cuda sm_90a)";
#else
    return FA_VERSION_TEXT " (cpu)";
#endif
}

const char *fa_status_string(fa_status s) {
    switch (s) {
    case FA_OK: return "FA_OK";
    case FA_ERR_INVALID_ARGUMENT: return "FA_ERR_INVALID_ARGUMENT";
    case FA_ERR_UNSUPPORTED: return "FA_ERR_UNSUPPORTED";
    case FA_ERR_OUT_OF_MEMORY: return "FA_ERR_OUT_OF_MEMORY";
    case FA_ERR_BACKEND_UNAVAILABLE: return "FA_ERR_BACKEND_UNAVAILABLE";
    case FA_ERR_DEVICE: return "FA_ERR_DEVICE";
    case FA_ERR_INTERNAL: return "FA_ERR_INTERNAL";
    }
    return "unknown fa_status";
}

size_t fa_dtype_size(fa_dtype t) {
    switch (t) {
    case FA_DTYPE_F32: return 4;
    case FA_DTYPE_F16:
    case FA_DTYPE_BF16: return 2;
    }
    return 0;
}

const char *fa_dtype_name(fa_dtype t) {
    switch (t) {
    case FA_DTYPE_F32: return "f32";
    case FA_DTYPE_F16: return "f16";
    case FA_DTYPE_BF16: return "bf16";
    }
    return "?";
}

const char *fa_backend_name(fa_backend b) {
    switch (b) {
    case FA_BACKEND_CPU: return "cpu";
    case FA_BACKEND_CUDA: return "cuda";
    }
    return "?";
}

const char *fa_algo_name(fa_algo a) {
    switch (a) {
    case FA_ALGO_AUTO: return "auto";
    case FA_ALGO_STANDARD: return "standard";
    case FA_ALGO_FLASH1: return "flash1";
    case FA_ALGO_FLASH2: return "flash2";
    case FA_ALGO_FLASH3: return "flash3";
    }
    return "?";
}

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

fa_status fa_attn_opts_init(fa_attn_opts *opts, size_t struct_size) {
    if (!opts || struct_size < sizeof opts->struct_size) return FA_ERR_INVALID_ARGUMENT;
    fa_attn_opts o;
    memset(&o, 0, sizeof o);
    o.window_left = -1;
    o.window_right = -1;
    o.algo = FA_ALGO_AUTO;
    memcpy(opts, &o, struct_size < sizeof o ? struct_size : sizeof o);
    opts->struct_size = struct_size;
    return FA_OK;
}

/* The first released fa_attn_opts ends at n_seqs; later fields are appended after it. */
#define FA_OPTS_SIZE_V1 (offsetof(fa_attn_opts, n_seqs) + sizeof(int64_t))

/* The caller's options as this library's struct: the bytes the caller's header knows, defaults for the rest. */
static fa_status read_opts(fa_context *ctx, const fa_attn_opts *in, fa_attn_opts *o) {
    fa_attn_opts_init(o, sizeof *o);
    if (!in) return FA_OK;
    const size_t n = in->struct_size;
    if (n < FA_OPTS_SIZE_V1)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.struct_size: %zu is below the smallest fa_attn_opts (%zu): "
                       "initialise opts with fa_attn_opts_default()", n, (size_t)FA_OPTS_SIZE_V1);
    if (n > sizeof *o) {
        const unsigned char *extra = (const unsigned char *)in + sizeof *o;
        for (size_t i = 0; i < n - sizeof *o; i++)
            if (extra[i])
                return fa_fail(ctx, FA_ERR_UNSUPPORTED, "opts: fields beyond this library's fa_attn_opts (%zu of %zu "
                               "bytes) are set; this is flashattn %s", sizeof *o, n, FA_VERSION_TEXT);
    }
    memcpy(o, in, n < sizeof *o ? n : sizeof *o);
    o->struct_size = sizeof *o;
    return FA_OK;
}

fa_status fa_fail(fa_context *ctx, fa_status status, const char *fmt, ...) {
    if (ctx) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
        va_end(ap);
    }
    return status;
}

void *fa_workspace(fa_context *ctx, size_t bytes) {
    if (bytes <= ctx->ws_size) return ctx->ws;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && (double)bytes > 0.8 * (double)pages * (double)page) {
        fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "workspace: the call needs %.2f GB, more than 80%% of this machine's "
                "%.2f GB of memory", (double)bytes / 1e9, (double)pages * (double)page / 1e9);
        return NULL;
    }
    size_t size = (bytes + 4095) & ~(size_t)4095;
    void *p = NULL;
    if (posix_memalign(&p, 4096, size) != 0 || !p) {
        fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "workspace: cannot allocate %zu bytes", size);
        return NULL;
    }
    free(ctx->ws);
    ctx->ws = p;
    ctx->ws_size = size;
    return p;
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
typedef struct span { uintptr_t lo, hi; } span; /* byte range [lo, hi) */

static int spans_overlap(span a, span b) { return a.lo < b.hi && b.lo < a.hi; }

/* Check one tensor on its own: pointer, dtype, dims, strides, int64 extent. Fills its byte span. */
static fa_status check_tensor(fa_context *ctx, const char *name, const fa_tensor *t, int is_output, span *sp) {
    if (!t) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: NULL tensor", name);
    if (!t->data) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: data is NULL", name);
    size_t es = fa_dtype_size(t->dtype);
    if (!es) return fa_fail(ctx, FA_ERR_UNSUPPORTED, "%s: dtype %d is not a fa_dtype", name, (int)t->dtype);
    const int64_t dims[4] = {t->batch, t->seqlen, t->heads, t->head_dim};
    static const char *dn[4] = {"batch", "seqlen", "heads", "head_dim"};
    for (int i = 0; i < 4; i++)
        if (dims[i] <= 0)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: %s = %lld must be positive", name, dn[i],
                           (long long)dims[i]);
    const int64_t strides[3] = {t->stride_batch, t->stride_seq, t->stride_head};
    static const char *sn[3] = {"stride_batch", "stride_seq", "stride_head"};
    for (int i = 0; i < 3; i++)
        if (strides[i] < 0)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: %s = %lld is negative", name, sn[i],
                           (long long)strides[i]);
    /* last element offset = (B-1)sb + (S-1)ss + (H-1)sh + D-1, with overflow checks */
    int64_t last = t->head_dim - 1, term;
    for (int i = 0; i < 3; i++) {
        if (__builtin_mul_overflow(dims[i] - 1, strides[i], &term) || __builtin_add_overflow(last, term, &last))
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: extent overflows int64 (%s = %lld x %s = %lld)", name,
                           dn[i], (long long)dims[i], sn[i], (long long)strides[i]);
    }
    int64_t bytes;
    uintptr_t hi;
    if (__builtin_add_overflow(last, 1, &last) || __builtin_mul_overflow(last, (int64_t)es, &bytes) ||
        __builtin_add_overflow((uintptr_t)t->data, (uintptr_t)bytes, &hi))
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: byte extent overflows the address space", name);
    sp->lo = (uintptr_t)t->data;
    sp->hi = hi;
    if (is_output) {
        /* Distinct indices must give distinct elements: sort the dims of size > 1 by stride, each stride must
         * step over the whole extent of the dims inside it. */
        int64_t st[3], n[3];
        int k = 0;
        for (int i = 0; i < 3; i++)
            if (dims[i] > 1) { st[k] = strides[i]; n[k] = dims[i]; k++; }
        for (int a = 0; a < k; a++)
            for (int b = a + 1; b < k; b++)
                if (st[b] < st[a]) {
                    int64_t x = st[a]; st[a] = st[b]; st[b] = x;
                    x = n[a]; n[a] = n[b]; n[b] = x;
                }
        int64_t extent = t->head_dim;
        for (int a = 0; a < k; a++) {
            if (st[a] < extent)
                return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT,
                               "%s: strides make output elements overlap (a stride of %lld over %lld elements "
                               "inside an extent of %lld)", name, (long long)st[a], (long long)n[a],
                               (long long)extent);
            extent = (n[a] - 1) * st[a] + extent;
        }
    }
    return FA_OK;
}

static fa_status check_varlen(fa_context *ctx, const char *name, const int32_t *cu, int64_t n, int64_t total) {
    if (cu[0] != 0) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s[0] = %d, must be 0", name, cu[0]);
    for (int64_t s = 0; s < n; s++)
        if (cu[s + 1] < cu[s])
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: not non-decreasing at index %lld (%d < %d)", name,
                           (long long)(s + 1), cu[s + 1], cu[s]);
    if (cu[n] != total)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s[n_seqs] = %d, must equal the tensor's seqlen %lld", name,
                       cu[n], (long long)total);
    return FA_OK;
}

#define SAME(field, a, b, an, bn)                                                                                   \
    if ((a)->field != (b)->field)                                                                                   \
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: " #field " = %lld does not match %s." #field " = %lld", bn, \
                       (long long)(b)->field, an, (long long)(a)->field);

/* Validate the arguments shared by forward and backward and fill p. Outputs are checked by the caller. */
static fa_status build_problem(fa_context *ctx, const fa_attn_opts *opts_in, const fa_tensor *q, const fa_tensor *k,
                               const fa_tensor *v, const fa_tensor *out, fa_problem *p, span sp[4]) {
    fa_attn_opts opts;
    fa_status st = read_opts(ctx, opts_in, &opts);
    if (st != FA_OK) return st;
    if ((st = check_tensor(ctx, "q", q, 0, &sp[0])) || (st = check_tensor(ctx, "k", k, 0, &sp[1])) ||
        (st = check_tensor(ctx, "v", v, 0, &sp[2])) || (st = check_tensor(ctx, "out", out, 0, &sp[3])))
        return st;
    if (k->dtype != q->dtype || v->dtype != q->dtype || out->dtype != q->dtype)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "dtype: q is %s but k/v/out are %s/%s/%s (all must match)",
                       fa_dtype_name(q->dtype), fa_dtype_name(k->dtype), fa_dtype_name(v->dtype),
                       fa_dtype_name(out->dtype));
    SAME(batch, q, k, "q", "k") SAME(batch, q, v, "q", "v") SAME(batch, q, out, "q", "out")
    SAME(head_dim, q, k, "q", "k") SAME(head_dim, q, v, "q", "v") SAME(head_dim, q, out, "q", "out")
    SAME(seqlen, k, v, "k", "v") SAME(seqlen, q, out, "q", "out")
    SAME(heads, k, v, "k", "v") SAME(heads, q, out, "q", "out")
    if (q->heads % k->heads)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "k: heads = %lld does not divide q.heads = %lld (GQA/MQA)",
                       (long long)k->heads, (long long)q->heads);
    if (q->head_dim > 256)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED, "head_dim: %lld is above the supported maximum 256",
                       (long long)q->head_dim);
    if (!isfinite(opts.scale)) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.scale: %g is not finite", opts.scale);
    if (!isfinite(opts.softcap) || opts.softcap < 0)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.softcap: %g must be finite and >= 0", opts.softcap);
    if (opts.window_left < -1 || opts.window_right < -1)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.window_left/right: (%d, %d), each must be >= -1",
                       opts.window_left, opts.window_right);
    if (opts.causal != 0 && opts.causal != 1)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.causal: %d must be 0 or 1", opts.causal);
    if ((int)opts.algo < FA_ALGO_AUTO || opts.algo > FA_ALGO_FLASH3)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.algo: %d is not a fa_algo", (int)opts.algo);
    if (opts.block_q < 0 || opts.block_q > 4096 || opts.block_k < 0 || opts.block_k > 4096)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.block_q/block_k: (%d, %d), each must be in 0..4096",
                       opts.block_q, opts.block_k);
    memset(p, 0, sizeof *p);
    p->batch = q->batch;
    if (opts.cu_seqlens_q || opts.cu_seqlens_k) {
        if (!opts.cu_seqlens_q || !opts.cu_seqlens_k)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.cu_seqlens_%s: NULL while cu_seqlens_%s is set",
                           opts.cu_seqlens_q ? "k" : "q", opts.cu_seqlens_q ? "q" : "k");
        if (opts.n_seqs < 1 || opts.n_seqs > INT32_MAX)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.n_seqs: %lld must be >= 1 with cu_seqlens",
                           (long long)opts.n_seqs);
        if (q->batch != 1)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "q: batch = %lld, must be 1 with cu_seqlens (packed)",
                           (long long)q->batch);
        if ((st = check_varlen(ctx, "opts.cu_seqlens_q", opts.cu_seqlens_q, opts.n_seqs, q->seqlen)) ||
            (st = check_varlen(ctx, "opts.cu_seqlens_k", opts.cu_seqlens_k, opts.n_seqs, k->seqlen)))
            return st;
        p->batch = opts.n_seqs;
        p->cu_q = opts.cu_seqlens_q;
        p->cu_k = opts.cu_seqlens_k;
        for (int64_t s = 0; s < opts.n_seqs; s++) {
            int64_t a = opts.cu_seqlens_q[s + 1] - opts.cu_seqlens_q[s], b = opts.cu_seqlens_k[s + 1] - opts.cu_seqlens_k[s];
            if (a > p->sq_max) p->sq_max = a;
            if (b > p->sk_max) p->sk_max = b;
        }
    } else {
        p->sq_max = q->seqlen;
        p->sk_max = k->seqlen;
    }
    p->algo = opts.algo == FA_ALGO_AUTO ? FA_ALGO_FLASH2 : opts.algo;
    p->algo_auto = opts.algo == FA_ALGO_AUTO; /* the plan may pick a faster algorithm for the call */
    p->dtype = q->dtype;
    p->hq = q->heads;
    p->hk = k->heads;
    p->d = q->head_dim;
    p->scale = opts.scale != 0 ? opts.scale : (float)(1.0 / sqrt((double)q->head_dim));
    p->softcap = opts.softcap;
    p->causal = opts.causal;
    p->wl = opts.window_left;
    p->wr = opts.window_right;
    if (opts.causal) p->wr = 0; /* causal = right window 0 (min(wr, 0) for any wr >= -1) */
    p->block_q = opts.block_q;
    p->block_k = opts.block_k;
    p->deterministic = opts.deterministic;
    p->q = *q;
    p->k = *k;
    p->v = *v;
    p->o = *out;
    return FA_OK;
}

static fa_status check_lse(fa_context *ctx, const fa_problem *p, const float *lse, span *sp) {
    int64_t n, bytes;
    sp->lo = (uintptr_t)lse;
    if (__builtin_mul_overflow(p->q.batch, p->hq, &n) || __builtin_mul_overflow(n, p->q.seqlen, &n) ||
        __builtin_mul_overflow(n, (int64_t)sizeof(float), &bytes) ||
        __builtin_add_overflow(sp->lo, (uintptr_t)bytes, &sp->hi))
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "lse: extent overflows the address space");
    return FA_OK;
}

static fa_status check_disjoint(fa_context *ctx, const char *oname, span o, const char **names, const span *sps, int n) {
    for (int i = 0; i < n; i++)
        if (spans_overlap(o, sps[i]))
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: memory overlaps %s", oname, names[i]);
    return FA_OK;
}

double fa_problem_flops(const fa_problem *p) {
    double pairs = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        int64_t sq = fa_seqlen_q(p, b), sk = fa_seqlen_k(p, b);
        for (int64_t i = 0; i < sq; i++) {
            int64_t lo, hi;
            fa_key_range(p, sq, sk, i, &lo, &hi);
            pairs += (double)(hi - lo);
        }
    }
    double f = 4.0 * (double)p->d * (double)p->hq * pairs;
    return p->is_backward ? 2.5 * f : f;
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
    fa_stats s;
    memset(&s, 0, sizeof s);
    s.backend = ctx->backend;
    s.algo = plan.algo;
    s.is_backward = p->is_backward;
    s.kernel = plan.kernel;
    s.block_q = plan.block_q;
    s.block_k = plan.block_k;
    s.threads = cuda ? 0 : plan.threads;
    s.slow_read_bytes = (int64_t)plan.read_bytes;
    s.slow_write_bytes = (int64_t)plan.write_bytes;
    s.extra_bytes = (int64_t)plan.workspace_bytes;
    st = cuda ? fa_cuda_run(ctx, p, &plan, &s) : fa_cpu_run(ctx, p, &plan, &s);
    if (st != FA_OK) return st;
    s.flops = fa_problem_flops(p);
    ctx->stats = s;
    ctx->has_stats = 1;
    return FA_OK;
}

fa_status fa_forward(fa_context *ctx, const fa_attn_opts *opts, const fa_tensor *q, const fa_tensor *k,
                     const fa_tensor *v, const fa_tensor *out, float *lse) {
    if (!ctx) return FA_ERR_INVALID_ARGUMENT;
    ctx->err[0] = 0;
    fa_problem p;
    span sp[5], so;
    fa_status st = build_problem(ctx, opts, q, k, v, out, &p, sp);
    if (st) return st;
    if ((st = check_tensor(ctx, "out", out, 1, &so))) return st;
    static const char *in_names[3] = {"q", "k", "v"};
    if ((st = check_disjoint(ctx, "out", sp[3], in_names, sp, 3))) return st;
    if (lse) {
        if ((st = check_lse(ctx, &p, lse, &sp[4]))) return st;
        static const char *names[4] = {"q", "k", "v", "out"};
        if ((st = check_disjoint(ctx, "lse", sp[4], names, sp, 4))) return st;
    }
    p.lse = lse;
    return run(ctx, &p);
}

fa_status fa_backward(fa_context *ctx, const fa_attn_opts *opts, const fa_tensor *q, const fa_tensor *k,
                      const fa_tensor *v, const fa_tensor *out, const float *lse, const fa_tensor *dout,
                      const fa_tensor *dq, const fa_tensor *dk, const fa_tensor *dv) {
    if (!ctx) return FA_ERR_INVALID_ARGUMENT;
    ctx->err[0] = 0;
    fa_problem p;
    span sp[9];
    fa_status st = build_problem(ctx, opts, q, k, v, out, &p, sp);
    if (st) return st;
    if (!lse) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "lse: NULL (backward needs the forward's LSE)");
    if ((st = check_lse(ctx, &p, lse, &sp[4]))) return st;
    if ((st = check_tensor(ctx, "dout", dout, 0, &sp[5]))) return st;
    if ((st = check_tensor(ctx, "dq", dq, 1, &sp[6])) || (st = check_tensor(ctx, "dk", dk, 1, &sp[7])) ||
        (st = check_tensor(ctx, "dv", dv, 1, &sp[8])))
        return st;
    const fa_tensor *grads[4] = {dout, dq, dk, dv};
    static const char *gn[4] = {"dout", "dq", "dk", "dv"};
    for (int i = 0; i < 4; i++) {
        const fa_tensor *g = grads[i], *like = i < 2 ? q : k;
        const char *ln = i < 2 ? "q" : "k";
        if (g->dtype != q->dtype)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: dtype %s does not match q's %s", gn[i],
                           fa_dtype_name(g->dtype), fa_dtype_name(q->dtype));
        SAME(batch, like, g, ln, gn[i]) SAME(seqlen, like, g, ln, gn[i]) SAME(heads, like, g, ln, gn[i])
        SAME(head_dim, like, g, ln, gn[i])
    }
    static const char *names[8] = {"q", "k", "v", "out", "lse", "dout", "dq", "dk"};
    for (int i = 6; i < 9; i++)
        if ((st = check_disjoint(ctx, gn[i - 5], sp[i], names, sp, i))) return st;
    p.is_backward = 1;
    p.lse = (float *)lse;
    p.dout = *dout;
    p.dq = *dq;
    p.dk = *dk;
    p.dv = *dv;
    return run(ctx, &p);
}

/* Hooks for src/core/kvcache.c: the same tensor and option rules as fa_forward's. */
fa_status fa_check_tensor(fa_context *ctx, const char *name, const fa_tensor *t, int is_output, uintptr_t *lo,
                          uintptr_t *hi) {
    span sp = {0, 0};
    fa_status st = check_tensor(ctx, name, t, is_output, &sp);
    *lo = sp.lo, *hi = sp.hi;
    return st;
}
fa_status fa_read_opts(fa_context *ctx, const fa_attn_opts *in, fa_attn_opts *o) { return read_opts(ctx, in, o); }
