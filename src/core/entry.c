/* The entry layer's shared steps (entry.h): one copy of the option reading, tensor and overlap checks, FLOP count
 * and stats that every entry point takes, so that the rules cannot drift apart between them. */
#include "core/entry.h"

#include <string.h>

/* The first struct_size bytes of an extensible options struct from the defaults d (this library's size bytes), and
 * its struct_size field (always the first) set to the caller's. */
static fa_status init_ext(void *opts, const void *d, size_t size, size_t struct_size) {
    if (!opts || struct_size < sizeof(size_t)) return FA_ERR_INVALID_ARGUMENT;
    memcpy(opts, d, struct_size < size ? struct_size : size);
    *(size_t *)opts = struct_size;
    return FA_OK;
}

fa_status fa_attn_opts_init(fa_attn_opts *opts, size_t struct_size) {
    fa_attn_opts d;
    memset(&d, 0, sizeof d);
    d.window_left = -1;
    d.window_right = -1;
    d.algo = FA_ALGO_AUTO;
    return init_ext(opts, &d, sizeof d, struct_size);
}

fa_status fa_kv_opts_init(fa_kv_opts *opts, size_t struct_size) {
    fa_kv_opts d;
    memset(&d, 0, sizeof d);
    return init_ext(opts, &d, sizeof d, struct_size);
}

/* An extensible options struct (its first field the caller's struct_size) over defaults `o` of this library's
 * `size` bytes: the bytes the caller's header knows are copied, those after keep the defaults. name: the argument,
 * type: the struct, min_size: its first release's size. */
static fa_status read_ext(fa_context *ctx, const char *name, const char *type, const void *in, void *o, size_t size,
                          size_t min_size) {
    if (!in) return FA_OK;
    const size_t n = *(const size_t *)in;
    if (n < min_size)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s.struct_size: %zu is below the smallest %s (%zu): "
                       "initialise %s with %s_default()", name, n, type, min_size, name, type);
    if (n > size) {
        const unsigned char *extra = (const unsigned char *)in + size;
        for (size_t i = 0; i < n - size; i++)
            if (extra[i])
                return fa_fail(ctx, FA_ERR_UNSUPPORTED, "%s: fields beyond this library's %s (%zu of %zu bytes) are "
                               "set; this is flashattn %s", name, type, size, n, FA_VERSION_TEXT);
    }
    memcpy(o, in, n < size ? n : size);
    *(size_t *)o = size;
    return FA_OK;
}

/* The first released fa_attn_opts ends at n_seqs; later fields are appended after it. fa_kv_opts takes any prefix
 * from its struct_size on (its fields all default to zero). */
#define FA_OPTS_SIZE_V1 (offsetof(fa_attn_opts, n_seqs) + sizeof(int64_t))

fa_status fa_entry_attn_opts(fa_context *ctx, const fa_attn_opts *in, fa_attn_opts *o) {
    fa_attn_opts_init(o, sizeof *o);
    return read_ext(ctx, "opts", "fa_attn_opts", in, o, sizeof *o, FA_OPTS_SIZE_V1);
}

fa_status fa_entry_kv_opts(fa_context *ctx, const fa_kv_opts *in, fa_kv_opts *o) {
    fa_kv_opts_init(o, sizeof *o);
    return read_ext(ctx, "kv_opts", "fa_kv_opts", in, o, sizeof *o, sizeof o->struct_size);
}

fa_status fa_entry_check_opts(fa_context *ctx, const fa_attn_opts *o) {
    if (!isfinite(o->scale)) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.scale: %g is not finite", o->scale);
    if (!isfinite(o->softcap) || o->softcap < 0)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.softcap: %g must be finite and >= 0", o->softcap);
    if (o->window_left < -1 || o->window_right < -1)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.window_left/right: (%d, %d), each must be >= -1",
                       o->window_left, o->window_right);
    if (o->causal != 0 && o->causal != 1)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.causal: %d must be 0 or 1", o->causal);
    if (o->attention_chunk < 0)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.attention_chunk: %d must be >= 0 (0 = off)",
                       o->attention_chunk);
    return FA_OK;
}

fa_status fa_entry_shape(fa_context *ctx, const char *name, const fa_tensor *t, fa_dtype dtype, const int64_t want[4],
                         const char *from) {
    if (t->dtype != dtype)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: dtype %s does not match %s's %s", name,
                       fa_dtype_name(t->dtype), from, fa_dtype_name(dtype));
    const int64_t got[4] = {t->batch, t->seqlen, t->heads, t->head_dim};
    static const char *const field[4] = {"batch", "seqlen", "heads", "head_dim"};
    for (int i = 0; i < 4; i++)
        if (want[i] >= 0 && got[i] != want[i])
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: %s = %lld does not match %s.%s = %lld", name, field[i],
                           (long long)got[i], from, field[i], (long long)want[i]);
    return FA_OK;
}

fa_status fa_entry_like(fa_context *ctx, const char *name, const fa_tensor *t, const char *like_name,
                        const fa_tensor *like, int64_t heads) {
    const int64_t want[4] = {like->batch, like->seqlen, heads < 0 ? like->heads : heads, like->head_dim};
    return fa_entry_shape(ctx, name, t, like->dtype, want, like_name);
}

fa_status fa_entry_head_dims(fa_context *ctx, const char *name, const fa_tensor *t, const fa_tensor *like,
                             const char *like_name) {
    if (t->head_dim != like->head_dim)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: head_dim %lld must equal %s's head_dim %lld (q and k share one "
                       "head_dim, v and out another)", name, (long long)t->head_dim, like_name,
                       (long long)like->head_dim);
    return FA_OK;
}

fa_status fa_entry_head_dim(fa_context *ctx, const char *name, int64_t head_dim) {
    if (head_dim > FA_MAX_HEAD_DIM)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED, "%s: head_dim %lld is above the supported maximum %d", name,
                       (long long)head_dim, FA_MAX_HEAD_DIM);
    return FA_OK;
}

fa_status fa_entry_tensor(fa_context *ctx, const char *name, const fa_tensor *t, int is_output, fa_span *sp) {
    if (!t) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: NULL tensor", name);
    size_t es = fa_dtype_size(t->dtype);
    if (!es) return fa_fail(ctx, FA_ERR_UNSUPPORTED, "%s: dtype %d is not a fa_dtype", name, (int)t->dtype);
    const int64_t dims[4] = {t->batch, t->seqlen, t->heads, t->head_dim};
    static const char *dn[4] = {"batch", "seqlen", "heads", "head_dim"};
    /* batch and seqlen may be 0 (an empty batch, no query or key rows); heads and head_dim shape every row */
    for (int i = 0; i < 4; i++)
        if (dims[i] < (i < 2 ? 0 : 1))
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: %s = %lld must be %s", name, dn[i], (long long)dims[i],
                           i < 2 ? ">= 0" : "positive");
    const int64_t strides[3] = {t->stride_batch, t->stride_seq, t->stride_head};
    static const char *sn[3] = {"stride_batch", "stride_seq", "stride_head"};
    for (int i = 0; i < 3; i++)
        if (strides[i] < 0)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: %s = %lld is negative", name, sn[i],
                           (long long)strides[i]);
    /* No elements: nothing is addressed (PyTorch gives such tensors a NULL data pointer), an empty span */
    if (t->batch == 0 || t->seqlen == 0) {
        sp->lo = sp->hi = (uintptr_t)t->data;
        return FA_OK;
    }
    if (!t->data)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: data is NULL for %lld x %lld rows (NULL is valid only for a "
                       "tensor of zero elements)", name, (long long)t->batch, (long long)t->seqlen);
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

fa_status fa_entry_f32(fa_context *ctx, const char *name, const float *x, int64_t a, int64_t b, int64_t c,
                       fa_span *sp) {
    int64_t n, bytes;
    sp->lo = (uintptr_t)x;
    if (__builtin_mul_overflow(a, b, &n) || __builtin_mul_overflow(n, c, &n) ||
        __builtin_mul_overflow(n, (int64_t)sizeof(float), &bytes) ||
        __builtin_add_overflow(sp->lo, (uintptr_t)bytes, &sp->hi))
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: extent overflows the address space", name);
    if (!x && n) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: NULL for %lld values", name, (long long)n);
    return FA_OK;
}

fa_status fa_entry_cu_seqlens(fa_context *ctx, const char *name, const int32_t *cu, int64_t n, int64_t total,
                              int64_t *longest) {
    if (!cu) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: NULL", name);
    if (cu[0] != 0) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s[0] = %d, must be 0", name, cu[0]);
    int64_t most = 0;
    for (int64_t s = 0; s < n; s++) {
        if (cu[s + 1] < cu[s])
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: not non-decreasing at index %lld (%d < %d)", name,
                           (long long)(s + 1), cu[s + 1], cu[s]);
        if (cu[s + 1] - cu[s] > most) most = cu[s + 1] - cu[s];
    }
    if (cu[n] != total)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s[n_seqs] = %d, must equal the tensor's seqlen %lld", name,
                       cu[n], (long long)total);
    if (longest) *longest = most;
    return FA_OK;
}

fa_status fa_entry_disjoint(fa_context *ctx, const char *name, fa_span o, const char *const *names, const fa_span *sp,
                            int n) {
    for (int i = 0; i < n; i++)
        if (fa_span_overlap(o, sp[i]))
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: memory overlaps %s", name, names[i]);
    return FA_OK;
}

/* (query, key) pairs of one sequence of sq query rows over sk keys that the mask leaves visible (core/visible.h). */
static double visible_pairs(int64_t sq, int64_t sk, int wl, int wr, int chunk) {
    double pairs = 0;
    for (int64_t i = 0; i < sq; i++) {
        int64_t lo, hi;
        fa_visible_keys(i, sq, sk, wl, wr, chunk, &lo, &hi);
        pairs += (double)(hi - lo);
    }
    return pairs;
}

/* 2·dqk per pair for QKᵀ, 2·dv for PV */
static double attn_flops(double pairs, int64_t d, int64_t d_v, int64_t hq, int is_backward) {
    const double f = 2.0 * (double)(d + d_v) * (double)hq * pairs;
    return is_backward ? 2.5 * f : f;
}

double fa_problem_flops(const fa_problem *p) {
    double pairs = 0;
    for (int64_t b = 0; b < p->batch; b++) pairs += visible_pairs(fa_seqlen_q(p, b), fa_seqlen_k(p, b), p->wl, p->wr, p->chunk);
    return attn_flops(pairs, p->d, p->d_v, p->hq, p->is_backward);
}

double fa_kv_problem_flops(const fa_kv_problem *p, const int32_t *host_seqlens) {
    double pairs = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        if (!host_seqlens) { /* the model: every sequence at the bounds */
            pairs += visible_pairs(p->sq, p->capacity, p->wl, p->wr, p->chunk);
            continue;
        }
        const int64_t L = host_seqlens[b] + fa_kv_sn(p, b) - fa_kv_lp(p, b);
        pairs += visible_pairs(fa_kv_sq(p, b), L, p->wl, p->wr, p->chunk);
    }
    return attn_flops(pairs, p->d, p->d_v, p->hq, 0);
}

fa_stats fa_entry_stats(const fa_context *ctx, const fa_plan *plan, int is_backward) {
    fa_stats s;
    memset(&s, 0, sizeof s);
    s.backend = ctx->backend;
    s.algo = plan->algo;
    s.is_backward = is_backward;
    s.kernel = plan->kernel;
    s.block_q = plan->block_q;
    s.block_k = plan->block_k;
    s.threads = ctx->backend == FA_BACKEND_CUDA ? 0 : plan->threads;
    s.slow_read_bytes = (int64_t)plan->read_bytes;
    s.slow_write_bytes = (int64_t)plan->write_bytes;
    s.extra_bytes = (int64_t)plan->workspace_bytes;
    return s;
}

void fa_entry_done(fa_context *ctx, fa_stats *s, double flops) {
    s->flops = flops;
    ctx->stats = *s;
    ctx->has_stats = 1;
}
