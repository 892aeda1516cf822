/* KV-cache decoding entry points: fa_forward_kvcache, fa_kvcache_workspace_size, fa_merge_states. Every argument is
 * checked here (shapes, strides, overlaps through entry.c; on the CPU also every length, page and row index, through
 * kv_indices.c) before a backend plans and runs the call; nothing is written on error. docs/kvcache.md. */
#include "core/entry.h"

#include <stdio.h>
#include <string.h>

/* The options of fa_attn_opts decoding takes; varlen's arrays go to *o for build. */
static fa_status check_attn_opts(fa_context *ctx, const fa_attn_opts *in, fa_kv_problem *p, fa_attn_opts *varlen) {
    fa_attn_opts o;
    fa_status st = fa_entry_attn_opts(ctx, in, &o);
    if (st != FA_OK) return st;
    if (o.algo != FA_ALGO_AUTO)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.algo: %s; decoding has its own kernel, leave it FA_ALGO_AUTO",
                       fa_algo_name(o.algo));
    if (o.block_q || o.block_k)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.block_q/block_k: (%d, %d); decoding takes no tile sizes",
                       o.block_q, o.block_k);
    if (o.max_seqlen_k || o.seqused_q || o.seqused_k)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.max_seqlen_k, seqused_q/k: set; the cache's seqlens give the "
                       "key lengths");
    if (o.max_seqlen_q && !o.cu_seqlens_q)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.max_seqlen_q: %lld without cu_seqlens_q",
                       (long long)o.max_seqlen_q);
    if ((o.cu_seqlens_q || o.cu_seqlens_k) && (o.n_seqs < 0 || o.n_seqs > INT32_MAX || o.max_seqlen_q < 0))
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.n_seqs / max_seqlen_q: (%lld, %lld) with cu_seqlens must be "
                       "in 0..2^31-1 and >= 0", (long long)o.n_seqs, (long long)o.max_seqlen_q);
    if (o.q_descale || o.k_descale || o.v_descale)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.%s_descale: set; decoding takes an FP8 cache's descales in "
                       "kv_opts.k_descale / v_descale (q is never FP8)", o.q_descale ? "q" : o.k_descale ? "k" : "v");
    *varlen = o;
    if ((st = fa_entry_check_opts(ctx, &o))) return st;
    p->scale = o.scale;
    p->softcap = o.softcap;
    p->wl = o.window_left;
    p->wr = o.causal ? 0 : o.window_right;
    p->chunk = o.attention_chunk;
    p->sinks = o.sinks; /* its span is checked by build, with the other inputs */
    return FA_OK;
}

static fa_status check_kv_opts(fa_context *ctx, const fa_kv_opts *in, fa_kv_problem *p) {
    fa_kv_opts o;
    fa_status st = fa_entry_kv_opts(ctx, in, &o);
    if (st != FA_OK) return st;
    if (o.num_splits < 0 || o.num_splits > 1024)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "kv_opts.num_splits: %d must be in 0..1024", o.num_splits);
    if (o.split_size < 0)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "kv_opts.split_size: %d must be >= 0", o.split_size);
    if (o.split_size && o.num_splits)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "kv_opts.split_size: %d with num_splits = %d; set one of them",
                       o.split_size, o.num_splits);
    if (!o.rotary_cos != !o.rotary_sin)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "kv_opts.rotary_%s: NULL while rotary_%s is set",
                       o.rotary_cos ? "sin" : "cos", o.rotary_cos ? "cos" : "sin");
    if (o.rotary_cos) {
        if (o.rotary_dim < 2 || o.rotary_dim % 2 || o.rotary_dim > p->d)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "kv_opts.rotary_dim: %d must be even and in 2..head_dim (%lld)",
                           o.rotary_dim, (long long)p->d);
        if (o.rotary_seqlen < 1)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "kv_opts.rotary_seqlen: %lld must be >= 1",
                           (long long)o.rotary_seqlen);
        if (o.rotary_interleaved != 0 && o.rotary_interleaved != 1)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "kv_opts.rotary_interleaved: %d must be 0 or 1",
                           o.rotary_interleaved);
    }
    if (o.workspace && !o.workspace_bytes)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "kv_opts.workspace_bytes: 0 with a workspace");
    if (o.workspace && ((uintptr_t)o.workspace & 255))
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "kv_opts.workspace: %p is not 256-byte aligned", o.workspace);
    if (o.check_indices != 0 && o.check_indices != 1)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "kv_opts.check_indices: %d must be 0 or 1", o.check_indices);
    p->num_splits = o.num_splits;
    p->split_size = o.split_size;
    p->rot_cos = o.rotary_cos;
    p->rot_sin = o.rotary_sin;
    p->rot_seqlen = o.rotary_seqlen;
    p->rot_dim = o.rotary_cos ? o.rotary_dim : 0;
    p->rot_interleaved = o.rotary_interleaved;
    p->workspace = o.workspace;
    p->workspace_bytes = o.workspace ? o.workspace_bytes : 0;
    p->check_indices = o.check_indices;
    p->leftpad = o.cache_leftpad;
    p->k_descale = o.k_descale;
    p->v_descale = o.v_descale;
    return FA_OK;
}

/* A 16/32-bit tensor of the call (q, k_new, v_new, out): FP8 lives only in the cache. */
static fa_status no_fp8(fa_context *ctx, const char *name, const fa_tensor *t) {
    if (!t || t->dtype != FA_DTYPE_F8_E4M3) return FA_OK;
    return fa_fail(ctx, FA_ERR_UNSUPPORTED, "%s: dtype f8_e4m3: fa_forward_kvcache takes FP8 only in the cache "
                   "(q, k_new, v_new and out are f32, f16 or bf16)", name);
}

/* The cache's dtype (q's, or E4M3 for both k and v) and the descales: set only with an FP8 cache, [batch][hk]
 * fp32, on a CPU context finite and > 0. Their spans go to sp[2]. */
static fa_status check_fp8_cache(fa_context *ctx, const fa_kvcache *c, fa_kv_problem *p, fa_span sp[2]) {
    const int k8 = c->k.dtype == FA_DTYPE_F8_E4M3, v8 = c->v.dtype == FA_DTYPE_F8_E4M3;
    if (k8 != v8)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cache.%s: dtype %s does not match cache.%s's %s (an FP8 cache "
                       "holds both k and v in f8_e4m3)", k8 ? "v" : "k", fa_dtype_name(k8 ? c->v.dtype : c->k.dtype),
                       k8 ? "k" : "v", fa_dtype_name(FA_DTYPE_F8_E4M3));
    p->cdtype = k8 ? FA_DTYPE_F8_E4M3 : p->dtype;
    static const char *const names[2] = {"kv_opts.k_descale", "kv_opts.v_descale"};
    const float *ds[2] = {p->k_descale, p->v_descale};
    for (int i = 0; i < 2; i++) {
        sp[i].lo = sp[i].hi = 0;
        if (!ds[i]) continue;
        if (!k8)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: set, but the cache is %s (descales belong to an "
                           "f8_e4m3 cache)", names[i], fa_dtype_name(c->k.dtype));
        fa_status st = fa_entry_f32(ctx, names[i], ds[i], 1, p->batch, c->k.heads, &sp[i]);
        if (st != FA_OK) return st;
        if (ctx->backend != FA_BACKEND_CPU) continue; /* device memory: the host cannot read it */
        for (int64_t n = 0; n < p->batch * c->k.heads; n++)
            if (!(isfinite(ds[i][n]) && ds[i][n] > 0))
                return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s[%lld][%lld] = %g must be finite and > 0", names[i],
                               (long long)(n / c->k.heads), (long long)(n % c->k.heads), (double)ds[i][n]);
    }
    return FA_OK;
}

/* The cache descriptor's shapes (not its index arrays). */
static fa_status check_cache(fa_context *ctx, const fa_kvcache *c, fa_kv_problem *p, fa_span *sk, fa_span *sv,
                             fa_span sds[2]) {
    if (!c) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cache: NULL");
    fa_status st = check_fp8_cache(ctx, c, p, sds);
    if (st != FA_OK) return st;
    if ((st = fa_entry_tensor(ctx, "cache.k", &c->k, p->append, sk)) ||
        (st = fa_entry_tensor(ctx, "cache.v", &c->v, p->append, sv)))
        return st;
    const int64_t kshape[4] = {-1, -1, -1, p->d}; /* the cache's own rows and K/V heads */
    const int64_t vshape[4] = {c->k.batch, c->k.seqlen, c->k.heads, -1}; /* v: its own head_dim (dv) */
    if ((st = fa_entry_shape(ctx, "cache.k", &c->k, p->cdtype, kshape, "q")) ||
        (st = fa_entry_shape(ctx, "cache.v", &c->v, p->cdtype, vshape, "cache.k")))
        return st;
    if (c->v.head_dim > FA_MAX_KV_HEAD_DIM_V)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED, "cache.v: head_dim %lld is above decoding's maximum %d",
                       (long long)c->v.head_dim, FA_MAX_KV_HEAD_DIM_V);
    p->d_v = c->v.head_dim;
    if (p->hq % c->k.heads)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cache.k: heads = %lld does not divide q.heads = %lld (GQA/MQA)",
                       (long long)c->k.heads, (long long)p->hq);
    if (!c->seqlens && p->batch) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cache.seqlens: NULL");
    p->kc = c->k;
    p->vc = c->v;
    p->hk = c->k.heads;
    p->seqlens = c->seqlens;
    p->batch_idx = c->batch_idx;
    p->block_table = c->block_table;
    p->paged = c->block_table != NULL;
    if (p->paged) {
        if (c->max_pages < 1 || c->max_pages > INT32_MAX)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cache.max_pages: %lld must be in 1..2^31-1 with a block table",
                           (long long)c->max_pages);
        p->bt_stride = c->block_table_stride ? c->block_table_stride : c->max_pages;
        if (p->bt_stride < c->max_pages)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cache.block_table_stride: %lld is below max_pages %lld",
                           (long long)c->block_table_stride, (long long)c->max_pages);
        if (c->cache_rows < 0)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cache.cache_rows: %lld is negative", (long long)c->cache_rows);
        p->cache_rows = c->cache_rows ? c->cache_rows : p->batch;
        if (!c->batch_idx && p->cache_rows < p->batch)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cache.cache_rows: %lld block-table rows for batch %lld "
                           "(without batch_idx each sequence needs its own row)", (long long)p->cache_rows,
                           (long long)p->batch);
        int64_t rows_extent;
        if (__builtin_mul_overflow(p->cache_rows, p->bt_stride, &rows_extent))
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cache.block_table: extent overflows int64");
        if (c->k.seqlen < 1) /* t / page_size locates key t */
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cache.k: seqlen (the page size) = 0; a paged cache's pages "
                           "hold >= 1 key");
        p->page_size = c->k.seqlen;
        p->num_pages = c->k.batch;
        if (__builtin_mul_overflow(c->max_pages, p->page_size, &p->capacity))
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cache: capacity max_pages x page_size overflows int64");
    } else {
        p->cache_rows = c->k.batch;
        p->page_size = c->k.seqlen;
        p->num_pages = 0;
        p->capacity = c->k.seqlen;
        if (!c->batch_idx && c->k.batch < p->batch)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cache.k: batch = %lld rows for %lld sequences (without "
                           "batch_idx each sequence needs its own row)", (long long)c->k.batch, (long long)p->batch);
    }
    if (p->capacity > INT32_MAX)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cache: capacity %lld keys is above 2^31-1 (seqlens are int32)",
                       (long long)p->capacity);
    if (p->append && p->sn > p->capacity)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "k_new: %lld new rows are above the cache's capacity %lld",
                       (long long)p->sn, (long long)p->capacity);
    return FA_OK;
}

/* Everything but the contents of the index arrays; fills p. */
static fa_status build(fa_context *ctx, const fa_attn_opts *opts, const fa_kv_opts *kv_opts, const fa_tensor *q,
                       const fa_kvcache *cache, const fa_tensor *k_new, const fa_tensor *v_new, const fa_tensor *out,
                       float *lse, int check_out, fa_kv_problem *p) {
    memset(p, 0, sizeof *p);
    fa_span sq, sk, sv, skn = {0, 0}, svn = {0, 0}, so = {0, 0}, sl = {0, 0}, ss = {0, 0}, sds[2];
    fa_status st;
    if ((st = fa_entry_tensor(ctx, "q", q, 0, &sq))) return st;
    if ((st = no_fp8(ctx, "q", q))) return st;
    if (q->head_dim > FA_MAX_KV_HEAD_DIM) /* decoding's own limit: MLA's 576 (core/internal.h) */
        return fa_fail(ctx, FA_ERR_UNSUPPORTED, "q: head_dim %lld is above decoding's maximum %d",
                       (long long)q->head_dim, FA_MAX_KV_HEAD_DIM);
    p->dtype = q->dtype;
    p->batch = q->batch;
    p->sq = q->seqlen;
    p->hq = q->heads;
    p->d = q->head_dim;
    p->q = *q;
    fa_attn_opts vo = fa_attn_opts_default();
    if ((st = check_attn_opts(ctx, opts, p, &vo))) return st;
    if ((st = check_kv_opts(ctx, kv_opts, p))) return st;
    const int host = ctx->backend == FA_BACKEND_CPU; /* the index arrays are read here on the CPU only */
    if (vo.cu_seqlens_q || vo.cu_seqlens_k) {
        p->batch = vo.n_seqs;
        p->cu_q = vo.cu_seqlens_q;
        p->cu_new = vo.cu_seqlens_k;
        if (p->cu_q && q->batch != 1)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "q: batch = %lld, must be 1 with cu_seqlens_q (packed)",
                           (long long)q->batch);
        if (!p->cu_q && q->batch != vo.n_seqs)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.n_seqs: %lld, q has batch %lld (without cu_seqlens_q "
                           "each batch entry is a sequence)", (long long)vo.n_seqs, (long long)q->batch);
        if (p->cu_q && host) {
            int64_t longest;
            if ((st = fa_entry_cu_seqlens(ctx, "opts.cu_seqlens_q", p->cu_q, p->batch, q->seqlen, &longest))) return st;
            if (vo.max_seqlen_q && vo.max_seqlen_q < longest)
                return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.max_seqlen_q: %lld is below the longest query "
                               "sequence of cu_seqlens_q (%lld)", (long long)vo.max_seqlen_q, (long long)longest);
            p->sq = longest;
        } else if (p->cu_q) {
            p->sq = vo.max_seqlen_q && vo.max_seqlen_q < q->seqlen ? vo.max_seqlen_q : q->seqlen;
        }
    }
    if (p->scale == 0) p->scale = (float)(1.0 / sqrt((double)p->d)); /* 1/sqrt(dqk) */
    if ((st = fa_entry_f32(ctx, "opts.sinks", p->sinks, 1, 1, p->sinks ? p->hq : 0, &ss))) return st;
    if (!k_new != !v_new)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: NULL while %s is set", k_new ? "v_new" : "k_new",
                       k_new ? "k_new" : "v_new");
    p->append = k_new != NULL;
    if (p->rot_cos && !p->append)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "kv_opts.rotary_cos: rotary needs k_new/v_new (the new keys are "
                       "rotated at their positions)");
    if (p->cu_new && !p->append)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.cu_seqlens_k: set without k_new (it packs the new keys)");
    if (p->append) { /* the new rows' count: its own, apart from the queries' (speculative decoding, chunked prefill) */
        if (!k_new || !v_new) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "k_new/v_new: NULL");
        p->sn = k_new->seqlen;
        if (p->cu_new && k_new->batch != 1)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "k_new: batch = %lld, must be 1 with cu_seqlens_k (packed)",
                           (long long)k_new->batch);
        if (p->cu_new && host &&
            (st = fa_entry_cu_seqlens(ctx, "opts.cu_seqlens_k", p->cu_new, p->batch, k_new->seqlen, &p->sn)))
            return st;
    }
    if ((st = check_cache(ctx, cache, p, &sk, &sv, sds))) return st;
    if (p->split_size && (p->capacity + p->split_size - 1) / p->split_size > 65535)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "kv_opts.split_size: %d cuts the capacity of %lld keys into more "
                       "than 65535 splits", p->split_size, (long long)p->capacity);
    if (p->append) {
        if ((st = fa_entry_tensor(ctx, "k_new", k_new, 0, &skn)) || (st = fa_entry_tensor(ctx, "v_new", v_new, 0, &svn)))
            return st;
        if ((st = no_fp8(ctx, "k_new", k_new)) || (st = no_fp8(ctx, "v_new", v_new))) return st;
        const int64_t rows[4] = {p->cu_new ? 1 : p->batch, -1, -1, p->d}, heads[4] = {-1, -1, p->hk, -1};
        const int64_t vrows[4] = {k_new->batch, k_new->seqlen, k_new->heads, -1};
        if ((st = fa_entry_shape(ctx, "k_new", k_new, p->dtype, rows, "q")) ||
            (st = fa_entry_shape(ctx, "k_new", k_new, p->dtype, heads, "cache.k")) ||
            (st = fa_entry_shape(ctx, "v_new", v_new, p->dtype, vrows, "k_new")))
            return st;
        /* v_new: absent when only sized (fa_kvcache_workspace_size passes k_new for it) */
        if (v_new != k_new && (st = fa_entry_head_dims(ctx, "v_new", v_new, &p->vc, "cache.v"))) return st;
        p->kn = *k_new;
        p->vn = *v_new;
        p->k_new = &p->kn;
        p->v_new = &p->vn;
        /* the cache is written: it must not overlap what is read while writing it */
        if (fa_span_overlap(sk, sv)) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cache.v: memory overlaps cache.k (appended to)");
        const fa_span ins[6] = {sq, skn, svn, ss, sds[0], sds[1]};
        static const char *const in_names[6] = {"q", "k_new", "v_new", "opts.sinks", "kv_opts.k_descale",
                                                "kv_opts.v_descale"};
        for (int i = 0; i < 6; i++)
            if (fa_span_overlap(sk, ins[i]) || fa_span_overlap(sv, ins[i]))
                return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cache: memory overlaps %s (the cache is appended to)",
                               in_names[i]);
    }
    if (check_out) {
        if ((st = fa_entry_tensor(ctx, "out", out, 1, &so)) || (st = no_fp8(ctx, "out", out))) return st;
        const int64_t oshape[4] = {p->q.batch, p->q.seqlen, p->q.heads, -1};
        if ((st = fa_entry_shape(ctx, "out", out, p->dtype, oshape, "q")) ||
            (st = fa_entry_head_dims(ctx, "out", out, &p->vc, "cache.v")))
            return st;
        p->o = *out;
        /* lse against out first, then both against every input, in one list */
        const fa_span all[9] = {so, sq, sk, sv, skn, svn, ss, sds[0], sds[1]};
        static const char *const names[9] = {"out", "q", "cache.k", "cache.v", "k_new", "v_new", "opts.sinks",
                                             "kv_opts.k_descale", "kv_opts.v_descale"};
        if ((st = fa_entry_disjoint(ctx, "out", so, names + 1, all + 1, 8))) return st;
        if (lse && ((st = fa_entry_f32(ctx, "lse", lse, p->q.batch, p->hq, p->q.seqlen, &sl)) ||
                    (st = fa_entry_disjoint(ctx, "lse", sl, names, all, 9))))
            return st;
        p->lse = lse;
    }
    return FA_OK;
}

static fa_status plan_of(fa_context *ctx, const fa_kv_problem *p, fa_plan *plan) {
    memset(plan, 0, sizeof *plan);
    plan->algo = FA_ALGO_FLASH2; /* decoding is FLASH2's loop order: what fa_stats.algo reports */
    char why[256] = "";
    const int cuda = ctx->backend == FA_BACKEND_CUDA;
    fa_status st = cuda ? fa_cuda_kv_plan(ctx, p, plan, why, sizeof why) : fa_cpu_kv_plan(ctx, p, plan, why, sizeof why);
    if (st != FA_OK) return fa_fail(ctx, st, "%s", why[0] ? why : "the backend has no decoding plan for this call");
    return FA_OK;
}

fa_status fa_forward_kvcache(fa_context *ctx, const fa_attn_opts *opts, const fa_kv_opts *kv_opts, const fa_tensor *q,
                             const fa_kvcache *cache, const fa_tensor *k_new, const fa_tensor *v_new,
                             const fa_tensor *out, float *lse) {
    if (!ctx) return FA_ERR_INVALID_ARGUMENT;
    ctx->err[0] = 0;
    fa_kv_problem p;
    fa_status st = build(ctx, opts, kv_opts, q, cache, k_new, v_new, out, lse, 1, &p);
    if (st != FA_OK) return st;
    if (ctx->backend == FA_BACKEND_CPU &&
        (st = fa_kv_check_indices(ctx, &p, p.seqlens, p.block_table, p.batch_idx)) != FA_OK)
        return st;
    fa_plan plan;
    if ((st = plan_of(ctx, &p, &plan)) != FA_OK) return st;
    if (p.workspace && p.workspace_bytes < plan.workspace_bytes)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "kv_opts.workspace_bytes: %zu, the call needs %zu "
                       "(fa_kvcache_workspace_size)", p.workspace_bytes, plan.workspace_bytes);
    fa_stats s = fa_entry_stats(ctx, &plan, 0);
    st = ctx->backend == FA_BACKEND_CUDA ? fa_cuda_kv_run(ctx, &p, &plan, &s) : fa_cpu_kv_run(ctx, &p, &plan, &s);
    if (st != FA_OK) return st;
    /* CPU: the pairs under the caller's lengths; CUDA: modelled at the capacity (its lengths are on the device) */
    fa_entry_done(ctx, &s, fa_kv_problem_flops(&p, ctx->backend == FA_BACKEND_CPU ? p.seqlens : NULL));
    return FA_OK;
}

fa_status fa_kvcache_check(fa_context *ctx) {
    if (!ctx) return FA_ERR_INVALID_ARGUMENT;
    ctx->err[0] = 0;
    /* the CPU validates every index before it runs a call: nothing is ever recorded */
    return ctx->backend == FA_BACKEND_CUDA ? fa_cuda_kv_check(ctx) : FA_OK;
}

fa_status fa_kvcache_workspace_size(fa_context *ctx, const fa_attn_opts *opts, const fa_kv_opts *kv_opts,
                                    const fa_tensor *q, const fa_kvcache *cache, const fa_tensor *k_new,
                                    size_t *bytes) {
    if (!ctx) return FA_ERR_INVALID_ARGUMENT;
    ctx->err[0] = 0;
    if (!bytes) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "bytes: NULL");
    fa_kv_problem p;
    /* v_new only matters through its presence: k_new stands in for it */
    fa_status st = build(ctx, opts, kv_opts, q, cache, k_new, k_new, NULL, NULL, 0, &p);
    if (st != FA_OK) return st;
    fa_plan plan;
    if ((st = plan_of(ctx, &p, &plan)) != FA_OK) return st;
    *bytes = plan.workspace_bytes;
    return FA_OK;
}

fa_status fa_merge_states(fa_context *ctx, int n, const fa_tensor *outs, const float *const *lses,
                          const fa_tensor *out, float *lse) {
    if (!ctx) return FA_ERR_INVALID_ARGUMENT;
    ctx->err[0] = 0;
    /* any number of states (flash-attn's combine tests go to 133 splits) and any head_dim: the backends loop over
     * both, so neither has a limit of its own */
    if (n < 1) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "n: %d must be >= 1", n);
    if (!outs) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "outs: NULL");
    if (!lses) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "lses: NULL");
    fa_status st;
    fa_span so, sl = {0, 0}, si, sli;
    if ((st = fa_entry_tensor(ctx, "out", out, 1, &so))) return st;
    if ((st = fa_entry_no_fp8(ctx, "out", out, "fa_merge_states"))) return st;
    if (lse && (st = fa_entry_f32(ctx, "lse", lse, out->batch, out->heads, out->seqlen, &sl))) return st;
    if (lse && fa_span_overlap(sl, so)) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "lse: memory overlaps out");
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "outs[%d]", i);
        if ((st = fa_entry_tensor(ctx, name, &outs[i], 0, &si))) return st;
        if ((st = fa_entry_like(ctx, name, &outs[i], "out", out, -1))) return st;
        snprintf(name, sizeof name, "lses[%d]", i);
        if ((st = fa_entry_f32(ctx, name, lses[i], out->batch, out->heads, out->seqlen, &sli))) return st;
        const int same_out = i == 0 && outs[0].data == out->data && outs[0].stride_batch == out->stride_batch &&
                             outs[0].stride_seq == out->stride_seq && outs[0].stride_head == out->stride_head;
        const int same_lse = i == 0 && lse && lses[0] == lse;
        if (!same_out && fa_span_overlap(si, so))
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "out: memory overlaps outs[%d]", i);
        if (fa_span_overlap(sli, so)) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "out: memory overlaps lses[%d]", i);
        if (lse && !same_lse && fa_span_overlap(sli, sl))
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "lse: memory overlaps lses[%d]", i);
        if (lse && fa_span_overlap(si, sl)) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "lse: memory overlaps outs[%d]", i);
    }
    fa_merge_problem m = {n, outs, lses, *out, lse};
    return ctx->backend == FA_BACKEND_CUDA ? fa_cuda_merge(ctx, &m) : fa_cpu_merge(ctx, &m);
}
