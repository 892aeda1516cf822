/* The CUDA KV-cache path, host side, as one family row: supports (or the reason), pick (splits, warps, cluster
 * merge, instance, launch shape), the workspace described once on fa_arena, the traffic model, and the launch
 * (fa_cuda_kv_run: a first kernel where needed — append + rotary, a caller's workspace's split counters —, then
 * the split-KV attention, whose last CTA per row tile merges the splits); and fa_merge_states. No host
 * synchronisation and no allocation once the workspace is large enough (kv_opts.workspace, or the context's cached
 * one); the launch shape depends on the shapes and the capacity only, so a captured graph replays at any cache
 * length. The measurements behind each number: docs/kvcache.md ("Splits and the merge"). */
#include "kvcache.h"
#include "cuda/state.h"

extern "C" {
#include "core/arena.h"
#include "core/kvcache.h"
}

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIN_SPLIT_KEYS 128    /* keys below which a split is not worth its merge */
#define SPLIT_KEYS 512        /* keys a split holds where the grid still fills half the SMs (see pick_splits) */
#define PAGED_SPLIT_KEYS 1024 /* paged caches: keys below which a second CTA per SM costs more than it hides */
#define WARP8_SPLIT_KEYS 512  /* keys per split from which 8 warps per CTA beat 4 (shorter: 0.96-0.98x) */
#define WARP8_ONLY_KEYS 2048  /* paged: keys per split from which one 8-warp CTA per SM beats two 4-warp CTAs */
#define WARP8_CONTIG_KEYS 2048 /* contiguous: keys per split up to which 8 warps beat 4 (longer read the same) */
#define LONG_KEYS 32768       /* contiguous: capacity from which a long call's CTAs start at thirds (pick_splits) */

/* 16-byte aligned rows: the data pointer, and strides of whole 16-byte chunks (8 elements of 16 bits, 16 of E4M3) */
static int aligned16(const fa_tensor *t) {
    const int64_t n = 16 / (int64_t)fa_dtype_size(t->dtype);
    return ((uintptr_t)t->data % 16) == 0 && t->stride_batch % n == 0 && t->stride_seq % n == 0 &&
           t->stride_head % n == 0;
}

/* Tiles of FA_KV_ROWS query rows per K/V head: the GQA group x the new rows. */
static int64_t row_tiles_of(const fa_kv_problem *p) {
    return (p->hq / p->hk * p->sq + FA_KV_ROWS - 1) / FA_KV_ROWS;
}

/* The row of fa_kv_insts for head dim d and nw warps, or -1. */
static int inst_of(int64_t d, int nw) {
    for (int i = 0; i < FA_KV_NINST; i++)
        if (fa_kv_insts[i].d == d && fa_kv_insts[i].nw == nw) return i;
    return -1;
}

/* The row of fa_kv_pair_insts for head dims (d, dv), or -1. */
static int pair_of(int64_t d, int64_t dv) {
    for (int i = 0; i < FA_KV_NPAIR; i++)
        if (fa_kv_pair_insts[i].d == d && fa_kv_pair_insts[i].dv == dv) return i;
    return -1;
}

/* ---- supports: yes, or the reason ---- */
static int supports(const fa_kv_problem *p, char *why, size_t why_len) {
    if (p->dtype == FA_DTYPE_F32) {
        snprintf(why, why_len, "dtype: f32 KV-cache attention runs on the CPU only (CUDA: f16, bf16)");
        return 0;
    }
    if (p->cdtype == FA_DTYPE_F8_E4M3 && p->d_v != p->d) {
        snprintf(why, why_len, "cache.k: dtype f8_e4m3 with cache.v's head_dim %lld different from q's %lld: the CUDA "
                 "kernel of such pairs reads f16 and bf16 caches only (a CPU context decodes it)", (long long)p->d_v,
                 (long long)p->d);
        return 0;
    }
    if (p->d_v != p->d && pair_of(p->d, p->d_v) < 0) { /* the pair kernel's rows (kvcache.h) */
        char pairs[64] = "";
        for (int i = 0, n = 0; i < FA_KV_NPAIR; i++)
            n += snprintf(pairs + n, sizeof pairs - (size_t)n, "%s(%d, %d)", n ? ", " : "", fa_kv_pair_insts[i].d,
                          fa_kv_pair_insts[i].dv);
        snprintf(why, why_len, "cache.v: head_dim %lld differs from q's %lld: CUDA KV-cache attention builds the "
                 "pairs (d, d_v) %s; a CPU context decodes any pair up to (576, 512)",
                 (long long)p->d_v, (long long)p->d, pairs);
        return 0;
    }
    if (p->d_v == p->d && inst_of(p->d, 4) < 0) { /* every built head dim has a 4-warp row */
        char dims[64] = "";
        for (int i = 0, n = 0; i < FA_KV_NINST; i++)
            if (fa_kv_insts[i].nw == 4)
                n += snprintf(dims + n, sizeof dims - (size_t)n, "%s%d", n ? ", " : "", fa_kv_insts[i].d);
        snprintf(why, why_len, "head_dim: %lld is not built for CUDA KV-cache attention (%s)", (long long)p->d, dims);
        return 0;
    }
    /* the kernels take one query-row count, the new rows' count equal to it, and keys from position 0 */
    if (p->cu_q || p->cu_new || p->leftpad || (p->append && p->sn != p->sq)) {
        snprintf(why, why_len, "%s: CUDA KV-cache attention has no %s yet (the CPU has)",
                 p->cu_q ? "opts.cu_seqlens_q" : p->cu_new ? "opts.cu_seqlens_k" : p->leftpad ? "kv_opts.cache_leftpad"
                                                                                               : "k_new",
                 p->cu_q || p->cu_new ? "packed (varlen) queries or new keys" : p->leftpad ? "left padding"
                 : "number of new keys different from the query rows");
        return 0;
    }
    const fa_tensor *ts[4] = {&p->q, &p->kc, &p->vc, &p->o};
    static const char *const names[4] = {"q", "cache.k", "cache.v", "out"};
    for (int i = 0; i < 4; i++)
        if (!aligned16(ts[i])) {
            snprintf(why, why_len, "%s: CUDA KV-cache attention reads rows with 16-byte loads: the data pointer must "
                     "be 16-byte aligned and the strides multiples of %d elements", names[i],
                     16 / (int)fa_dtype_size(ts[i]->dtype));
            return 0;
        }
    const int64_t tiles = row_tiles_of(p);
    if (p->batch > 65535 || p->hk * tiles > 65535) {
        snprintf(why, why_len, "batch / heads: the grid (%lld sequences, %lld K/V head tiles) is above 65535",
                 (long long)p->batch, (long long)(p->hk * tiles));
        return 0;
    }
    return 1;
}

/* ---- pick: splits, warps, cluster merge, instance, launch shape ---- */

/* The split count (and the fixed-split mode's aux entries). */
static int pick_splits(const fa_kv_problem *p, int sms, fa_plan *plan) {
    if (p->split_size) {
        plan->aux[FA_KV_AUX_FIXED] = 1;
        plan->aux[FA_KV_AUX_CHUNK] = p->split_size;
        return (int)((p->capacity + p->split_size - 1) / p->split_size);
    }
    if (p->num_splits) {
        const int64_t most = (p->capacity + 15) / 16;
        return p->num_splits < most ? p->num_splits : (int)most;
    }
    /* One CTA per SM is the worker: its warps' cp.async rings keep the SM's share of HBM bandwidth in flight, and a
     * second split per SM only adds partials to merge. Within 3 % of the best wave: at the CPU's 85 %, batch 1
     * leaves SMs idle for part of a bandwidth-bound call. */
    const int64_t items = p->batch * p->hk * row_tiles_of(p);
    /* An E4M3 cache's worker is two CTAs per SM: one CTA widening its tiles in shared memory reads below the SM's
     * share (H100, 32/8 heads, d = 128: batch 16 at 64k keys 0.72 ms in 2 splits, 1.13 in 1; batch 4 0.20 in 8,
     * 0.30 in 4) */
    const int workers = p->cdtype == FA_DTYPE_F8_E4M3 && !p->paged ? 2 * sms : sms;
    /* Splits of at least SPLIT_KEYS keys, down to MIN_SPLIT_KEYS where that leaves fewer CTAs than half the SMs:
     * fewer, longer splits have fewer CTAs to start and merge. */
    int ns = fa_kv_split_heuristic(items, workers, (p->capacity + SPLIT_KEYS - 1) / SPLIT_KEYS, FA_KV_MAX_SPLITS, 0.97);
    if (ns * items < sms / 2) {
        const int64_t most = (p->capacity + MIN_SPLIT_KEYS - 1) / MIN_SPLIT_KEYS, fill = sms / 2 / items;
        const int64_t more = most < fill ? most : fill;
        if (more > ns) ns = (int)more;
    }
    /* Paged: one CTA's 4 warps read pages slower than a contiguous cache, so two CTAs per SM where each split still
     * has PAGED_SPLIT_KEYS keys — unless one CTA per SM holds WARP8_ONLY_KEYS keys a split: there one CTA of 8
     * warps per SM (pick_warps) reads faster, with fewer splits to merge. */
    const bool one8 = inst_of(p->d, 8) >= 0 && ns * items <= sms && p->capacity / ns >= WARP8_ONLY_KEYS;
    if (p->paged && !one8) {
        const int np = fa_kv_split_heuristic(items, 2 * sms, p->capacity / PAGED_SPLIT_KEYS, FA_KV_MAX_SPLITS, 0.97);
        if (np > ns) ns = np;
    }
    /* Contiguous, more than one wave of two CTAs per SM and long sequences (measured at d <= 128): 3 splits instead
     * of 1, so that a wave's CTAs do not all start a power of two apart, where they meet in the same DRAM channels
     * (the likely cause; batch 128 with 32k-64k keys 1.01-1.04x). */
    if (!p->paged && p->d <= 128 && ns == 1 && items > 2 * (int64_t)sms && p->capacity >= LONG_KEYS) ns = 3;
    return ns;
}

/* Warps per CTA: 8 where the grid holds at most one CTA per SM and each split has at least WARP8_SPLIT_KEYS keys —
 * paged, so that the block-table reads of twice as many warps hide each other; contiguous, up to
 * WARP8_CONTIG_KEYS keys a split. Else 4, as for a head dim without an 8-warp row and for the fixed-split mode,
 * whose sums must not depend on the batch (the warps' order of keys would). */
static int pick_warps(const fa_kv_problem *p, int ns, int sms) {
    if (inst_of(p->d, 8) < 0 || p->split_size) return 4;
    const int64_t ctas = (int64_t)ns * p->batch * p->hk * row_tiles_of(p), keys = p->capacity / ns;
    return ctas <= sms && keys >= WARP8_SPLIT_KEYS && (p->paged || keys <= WARP8_CONTIG_KEYS) ? 8 : 4;
}

/* Clusters of ns CTAs of row inst that the current device holds at once, asked once per shape. */
static int active_clusters(const fa_kv_problem *p, int inst, int ns) {
    /* device, dtype, E4M3 cache, row, ns: the count + 1 */
    static int known[64][2][2][FA_KV_NINST][FA_KV_CLUSTER_MAX + 1];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev >= 64) return 0;
    const int dt = p->dtype == FA_DTYPE_F16 ? 1 : 2, f8 = p->cdtype == FA_DTYPE_F8_E4M3;
    int *k = &known[dev][dt - 1][f8][inst][ns];
    if (!*k) {
        fa_kv_params c;
        memset(&c, 0, sizeof c);
        c.d = fa_kv_insts[inst].d, c.warps = fa_kv_insts[inst].nw, c.nsplit = ns;
        c.hk = 1, c.row_tiles = 1, c.batch = 1, c.cluster = 1;
        *k = fa_kv_active_clusters(&c, inst, dt, f8) + 1;
    }
    return *k - 1;
}

/* ---- workspace: described once (a dry run for the size, the real run for the pointers) ---- */
typedef struct kv_ws { float *part_o, *part_lse, *qrot; int *arrived; } kv_ws;

/* fp32 partials and split counters where the splits merge through global memory (several splits, no cluster), and
 * the rotated q with rotary. */
static void layout(fa_arena *a, const fa_kv_problem *p, const fa_plan *plan, kv_ws *w) {
    const size_t rows = (size_t)(p->batch * p->hq * p->sq);
    const int nsplit = plan->aux[FA_KV_AUX_SPLITS];
    w->part_o = w->part_lse = w->qrot = NULL;
    w->arrived = NULL;
    if (nsplit > 1 && !plan->aux[FA_KV_AUX_CLUSTER]) {
        const size_t tiles = (size_t)row_tiles_of(p);
        w->part_o = (float *)fa_arena_take(a, rows * (size_t)nsplit * (size_t)p->d_v * sizeof(float), 256);
        w->part_lse = (float *)fa_arena_take(a, rows * (size_t)nsplit * sizeof(float), 256);
        w->arrived = (int *)fa_arena_take(a, (size_t)(p->batch * p->hk) * tiles * sizeof(int), 256);
    }
    if (p->rot_cos) w->qrot = (float *)fa_arena_take(a, rows * (size_t)p->d * sizeof(float), 256);
}

/* ---- traffic: modelled at full capacity (the lengths are on the device); q, k rows d wide, v, out rows d_v ---- */
static void traffic(const fa_kv_problem *p, fa_plan *plan) {
    const double e = (double)fa_dtype_size(p->dtype), d = (double)p->d, dv = (double)p->d_v;
    const double ce = (double)fa_dtype_size(p->cdtype); /* the cache's: 1 for E4M3 */
    plan->read_bytes = (double)p->batch * ((double)p->capacity * p->hk * (d + dv) * ce + p->sq * p->hq * d * e);
    plan->write_bytes = (double)p->batch * p->sq * p->hq * dv * e;
}

extern "C" fa_status fa_cuda_kv_plan(const fa_context *ctx, const fa_kv_problem *p, fa_plan *plan, char *why,
                                     size_t why_len) {
    if (!supports(p, why, why_len)) return FA_ERR_UNSUPPORTED;
    if (!p->batch || !p->sq) { /* no output element and no new row: nothing to launch (a grid of 0 CTAs fails) */
        plan->zero_fill = 1;
        plan->kernel = "cuda.kvcache.zero_fill";
        return FA_OK;
    }
    const int sms = fa_cuda_tuning_of(ctx)->sm_count;
    const int64_t items = p->batch * p->hk * row_tiles_of(p);
    int ns = pick_splits(p, sms, plan);
    if (ns < 1) ns = 1;
    plan->aux[FA_KV_AUX_SPLITS] = ns;
    plan->block_q = FA_KV_ROWS;
    plan->block_k = FA_KV_KEYS;
    plan->grid[0] = ns, plan->grid[1] = (int)(p->hk * row_tiles_of(p)), plan->grid[2] = (int)p->batch;
    if (p->d_v != p->d) { /* the pair kernel: 8 warps, 32 keys a block, no cluster merge or plain instance */
        plan->aux[FA_KV_AUX_PAIR] = 1;
        plan->entry = pair_of(p->d, p->d_v);
        plan->kernel = fa_kv_pair_insts[plan->entry].kernel;
        plan->block_k = 32;
        plan->threads = 256;
    } else {
        const int warps = pick_warps(p, ns, sms);
        plan->entry = inst_of(p->d, warps);
        /* 2-16 splits (a cluster's limit), not the fixed-split mode (whose sums must not depend on how the rest of the
         * batch merges), and the GPU holds every cluster of the grid at once: the splits of a row tile run as one
         * cluster and merge through distributed shared memory — no partials, fences or counters in global memory. */
        plan->aux[FA_KV_AUX_CLUSTER] = 0;
        if (ns >= 2 && ns <= FA_KV_CLUSTER_MAX && !p->split_size)
            plan->aux[FA_KV_AUX_CLUSTER] = active_clusters(p, plan->entry, ns) >= items;
        /* no rotary q, no softcap and a tile's keys in one page: the instance without the code of those (instruction
         * fetch is a third of a short call's stalls) */
        plan->aux[FA_KV_AUX_PLAIN] = !p->rot_cos && !(p->softcap > 0) && (!p->paged || p->page_size % FA_KV_KEYS == 0);
        const fa_kv_inst *in = &fa_kv_insts[plan->entry];
        const int plain = plan->aux[FA_KV_AUX_PLAIN];
        plan->kernel = p->cdtype == FA_DTYPE_F8_E4M3 ? (plain ? in->kernel_f8_plain : in->kernel_f8)
                                                      : (plain ? in->kernel_plain : in->kernel);
        plan->threads = 32 * in->nw;
    }
    fa_arena a = fa_arena_dry();
    kv_ws w;
    layout(&a, p, plan, &w);
    plan->workspace_bytes = a.size;
    traffic(p, plan);
    return FA_OK;
}

/* ---- launch ---- */

/* The kernels' parameter block: the problem's tensors and the plan's choices, over the workspace's pointers. */
static void params_of(const fa_kv_problem *p, const fa_plan *plan, const kv_ws *w, fa_kv_params *c) {
    memset(c, 0, sizeof *c);
    c->q = p->q.data, c->q_sb = p->q.stride_batch, c->q_ss = p->q.stride_seq, c->q_sh = p->q.stride_head;
    c->qrot = w->qrot;
    c->kc = p->kc.data, c->k_sb = p->kc.stride_batch, c->k_ss = p->kc.stride_seq, c->k_sh = p->kc.stride_head;
    c->vc = p->vc.data, c->v_sb = p->vc.stride_batch, c->v_ss = p->vc.stride_seq, c->v_sh = p->vc.stride_head;
    if (p->append) {
        c->kn = p->kn.data, c->kn_sb = p->kn.stride_batch, c->kn_ss = p->kn.stride_seq, c->kn_sh = p->kn.stride_head;
        c->vn = p->vn.data, c->vn_sb = p->vn.stride_batch, c->vn_ss = p->vn.stride_seq, c->vn_sh = p->vn.stride_head;
    }
    c->o = p->o.data, c->o_sb = p->o.stride_batch, c->o_ss = p->o.stride_seq, c->o_sh = p->o.stride_head;
    c->lse = p->lse;
    c->sinks = p->sinks;
    c->seqlens = p->seqlens, c->block_table = p->block_table, c->batch_idx = p->batch_idx;
    c->bt_stride = p->bt_stride;
    c->batch = (int)p->batch, c->sq = (int)p->sq, c->hq = (int)p->hq, c->hk = (int)p->hk;
    c->group = (int)(p->hq / p->hk), c->d = (int)p->d;
    c->paged = p->paged, c->page_size = (int)p->page_size, c->num_pages = (int)p->num_pages;
    /* a cache without rows or pages holds no key: capacity 0 keeps every clamp of an index inside it (clamped to
     * rows - 1 or pages - 1, the index would be -1) */
    c->capacity = p->cache_rows && (!p->paged || p->num_pages) ? (int)p->capacity : 0;
    c->cache_rows = (int)p->cache_rows;
    c->append = p->append;
    c->kn_vec = p->append && !p->rot_cos && aligned16(&p->kn) && aligned16(&p->vn);
    c->rcos = p->rot_cos, c->rsin = p->rot_sin, c->rot_dim = p->rot_dim, c->rot_interleaved = p->rot_interleaved;
    c->rot_seqlen = (int)(p->rot_seqlen < INT32_MAX ? p->rot_seqlen : INT32_MAX);
    c->rot_q_rows = fa_kv_rotary_q_rows(p);
    c->scale = p->scale, c->softcap = p->softcap;
    c->qmul = p->softcap > 0 ? p->scale / p->softcap : p->scale * 1.4426950408889634f;
    c->softcap_mul = p->softcap > 0 ? p->softcap * 1.4426950408889634f : 0.f;
    c->wl = p->wl, c->wr = p->wr, c->attention_chunk = p->chunk;
    c->nsplit = plan->aux[FA_KV_AUX_SPLITS], c->fixed = plan->aux[FA_KV_AUX_FIXED];
    c->chunk = plan->aux[FA_KV_AUX_CHUNK];
    c->row_tiles = (int)row_tiles_of(p);
    c->warps = plan->aux[FA_KV_AUX_PAIR] ? 8 : fa_kv_insts[plan->entry].nw;
    c->cluster = plan->aux[FA_KV_AUX_CLUSTER];
    c->plain = plan->aux[FA_KV_AUX_PLAIN];
    c->part_o = w->part_o, c->part_lse = w->part_lse, c->arrived = w->arrived;
}

static fa_status cuda_err(fa_context *ctx, const char *what, cudaError_t e) {
    return fa_fail(ctx, FA_ERR_DEVICE, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* An FP8 cache's descales (host copies, [batch][hk] each, NULL = none): finite and > 0, as a CPU context checks. */
static fa_status check_descales(fa_context *ctx, const fa_kv_problem *p, const float *ds[2]) {
    static const char *const names[2] = {"kv_opts.k_descale", "kv_opts.v_descale"};
    for (int i = 0; i < 2; i++)
        for (int64_t n = 0; ds[i] && n < p->batch * p->hk; n++)
            if (!(isfinite(ds[i][n]) && ds[i][n] > 0))
                return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s[%lld][%lld] = %g must be finite and > 0", names[i],
                               (long long)(n / p->hk), (long long)(n % p->hk), (double)ds[i][n]);
    return FA_OK;
}

/* check_indices: the device index arrays (and an FP8 cache's descales) copied back and validated as on the CPU
 * (synchronises). */
static fa_status check_device_indices(fa_context *ctx, const fa_kv_problem *p, cudaStream_t st) {
    const size_t nb = (size_t)p->batch, nbt = p->paged ? (size_t)(p->cache_rows * p->bt_stride) : 0;
    const size_t nds = (size_t)(p->batch * p->hk);
    int32_t *h = (int32_t *)malloc(sizeof(int32_t) * (2 * nb + nbt + 2 * nds + 1));
    if (!h) return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "kv_opts.check_indices: no host memory for the copies");
    int32_t *lens = h, *bidx = h + nb, *bt = h + 2 * nb;
    float *hds = (float *)(bt + nbt);
    const float *dds[2] = {p->k_descale, p->v_descale}, *ds[2] = {NULL, NULL};
    cudaError_t e = cudaMemcpyAsync(lens, p->seqlens, nb * 4, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess && p->batch_idx) e = cudaMemcpyAsync(bidx, p->batch_idx, nb * 4, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess && nbt) e = cudaMemcpyAsync(bt, p->block_table, nbt * 4, cudaMemcpyDeviceToHost, st);
    for (int i = 0; i < 2; i++)
        if (e == cudaSuccess && dds[i]) {
            ds[i] = hds + i * nds;
            e = cudaMemcpyAsync((float *)ds[i], dds[i], nds * 4, cudaMemcpyDeviceToHost, st);
        }
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    fa_status rc = e != cudaSuccess ? cuda_err(ctx, "kv_opts.check_indices: copying the index arrays", e)
                                    : fa_kv_check_indices(ctx, p, lens, nbt ? bt : NULL, p->batch_idx ? bidx : NULL);
    if (rc == FA_OK) rc = check_descales(ctx, p, ds);
    free(h);
    return rc;
}

extern "C" fa_status fa_cuda_kv_run(fa_context *ctx, const fa_kv_problem *p, const fa_plan *plan, fa_stats *st) {
    (void)st;
    cudaStream_t stream = fa_cuda_stream_of(ctx);
    int prev = 0;
    if (cudaGetDevice(&prev) != cudaSuccess) return fa_fail(ctx, FA_ERR_DEVICE, "cudaGetDevice failed");
    if (prev != ctx->device && cudaSetDevice(ctx->device) != cudaSuccess)
        return fa_fail(ctx, FA_ERR_DEVICE, "cudaSetDevice(%d) failed", ctx->device);
    fa_status rc = FA_OK;
    do {
        if (p->check_indices && (rc = check_device_indices(ctx, p, stream)) != FA_OK) break;
        if (plan->zero_fill) break; /* outputs of zero elements */
        void *base = p->workspace;
        size_t cap = p->workspace_bytes;
        if (!base && plan->workspace_bytes) {
            if ((rc = fa_cuda_workspace_of(ctx, plan->workspace_bytes, &base)) != FA_OK) break;
            cap = plan->workspace_bytes;
        }
        fa_arena a = fa_arena_over(base, cap);
        kv_ws w;
        layout(&a, p, plan, &w);
        fa_kv_params c;
        params_of(p, plan, &w, &c);
        c.fault = ((const fa_cuda_state *)ctx->cuda)->kv_fault;
        /* the split counters: the context's, which stay zero between calls; in a caller's workspace, whose state is
         * not known, the first kernel zeroes them */
        if (c.arrived && !p->workspace) {
            const size_t n = (size_t)(p->batch * p->hk) * (size_t)c.row_tiles;
            if ((rc = fa_cuda_counters_of(ctx, n, &c.arrived)) != FA_OK) break;
        }
        c.zero_arrived = c.arrived && p->workspace;
        const int dt = (int)p->dtype;
        /* an E4M3 cache: its descales go with the parameter block of its kernels */
        const fa_kv_descales dsc = {p->k_descale, p->v_descale};
        const fa_kv_descales *ds = p->cdtype == FA_DTYPE_F8_E4M3 ? &dsc : NULL;
        cudaError_t e;
        c.after_first = p->append || c.zero_arrived;
        if (c.after_first && (e = fa_kv_first_launch(&c, ds, (int)p->d_v, dt, stream)) != cudaSuccess) {
            rc = cuda_err(ctx, "kvcache append launch", e);
            break;
        }
        e = plan->aux[FA_KV_AUX_PAIR] ? fa_kv_pair_launch(&c, (int)p->d_v, plan->entry, dt, stream)
                                      : fa_kv_attend_launch(&c, ds, plan->entry, dt, stream);
        if (e != cudaSuccess) {
            rc = cuda_err(ctx, "kvcache split-KV launch", e);
            break;
        }
    } while (0);
    if (prev != ctx->device) cudaSetDevice(prev);
    return rc;
}

extern "C" fa_status fa_cuda_kv_check(fa_context *ctx) {
    const fa_cuda_state *s = (const fa_cuda_state *)ctx->cuda;
    int f[FA_KV_FAULT_INTS];
    int prev = 0;
    if (cudaGetDevice(&prev) != cudaSuccess) return fa_fail(ctx, FA_ERR_DEVICE, "cudaGetDevice failed");
    if (prev != s->device && cudaSetDevice(s->device) != cudaSuccess)
        return fa_fail(ctx, FA_ERR_DEVICE, "cudaSetDevice(%d) failed", s->device);
    /* the calls queued so far have run; the record is read and cleared in stream order */
    cudaError_t e = cudaStreamSynchronize(s->stream);
    if (e == cudaSuccess) e = cudaMemcpy(f, s->kv_fault, sizeof f, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess && f[0]) e = cudaMemset(s->kv_fault, 0, sizeof f);
    if (prev != s->device) cudaSetDevice(prev);
    if (e != cudaSuccess) return cuda_err(ctx, "fa_kvcache_check: reading the fault record", e);
    const int b = f[1], col = f[2], v = f[3], lim = f[4];
    switch (f[0]) {
    case 0: return FA_OK;
    case FA_KV_FAULT_SEQLENS:
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cache.seqlens[%d] = %d: with %d new keys it must be in 0..%d "
                       "(the capacity of the cache, pages or block_table, is %d); a KV-cache call clamped it", b, v,
                       col, lim, lim + col);
    case FA_KV_FAULT_BATCH_IDX:
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cache.batch_idx[%d] = %d is outside 0..%d; a KV-cache call "
                       "clamped it", b, v, lim - 1);
    case FA_KV_FAULT_BLOCK_TABLE:
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cache.block_table: entry %d of sequence %d's row is %d, outside "
                       "0..%d; a KV-cache call clamped it", col, b, v, lim - 1);
    case FA_KV_FAULT_ROTARY:
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "kv_opts.rotary_seqlen: %d positions, sequence %d needs %d; a "
                       "KV-cache call left its keys unrotated past the tables", lim, b, v);
    case FA_KV_FAULT_DESCALE: {
        float x;
        memcpy(&x, &v, sizeof x);
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "kv_opts.%s_descale[%d][%d] = %g must be finite and > 0; a "
                       "KV-cache call used it (kv_opts.check_indices refuses it before the call)", lim ? "v" : "k", b,
                       col, (double)x);
    }
    default: return fa_fail(ctx, FA_ERR_INTERNAL, "fa_kvcache_check: fault code %d", f[0]);
    }
}

extern "C" fa_status fa_cuda_merge(fa_context *ctx, const fa_merge_problem *m) {
    fa_merge_params c;
    memset(&c, 0, sizeof c);
    const fa_tensor *o = &m->o;
    if (o->batch == 0 || o->seqlen == 0) return FA_OK; /* nothing to merge (a grid of 0 CTAs fails) */
    if (o->batch * o->heads * o->seqlen > INT32_MAX)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED, "out: %lld rows are above 2^31-1 for the CUDA merge",
                       (long long)(o->batch * o->heads * o->seqlen));
    if (o->head_dim > INT32_MAX)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED, "out: head_dim %lld is above 2^31-1 for the CUDA merge",
                       (long long)o->head_dim);
    c.heads = (int)o->heads, c.seqlen = (int)o->seqlen, c.d = (int)o->head_dim;
    c.rows = (int)(o->batch * o->heads * o->seqlen);
    c.out = o->data, c.o_sb = o->stride_batch, c.o_ss = o->stride_seq, c.o_sh = o->stride_head;
    c.lse = m->lse;
    int prev = 0;
    if (cudaGetDevice(&prev) != cudaSuccess) return fa_fail(ctx, FA_ERR_DEVICE, "cudaGetDevice failed");
    if (prev != ctx->device && cudaSetDevice(ctx->device) != cudaSuccess)
        return fa_fail(ctx, FA_ERR_DEVICE, "cudaSetDevice(%d) failed", ctx->device);
    fa_status rc = FA_OK;
    if (m->n > FA_MERGE_MAX) { /* the running state of the chunks: fp32 [rows, d] and [rows, 2] */
        void *ws = NULL;
        const size_t run_o = (size_t)c.rows * (size_t)c.d * sizeof(float);
        if ((rc = fa_cuda_workspace_of(ctx, run_o + (size_t)c.rows * 2 * sizeof(float), &ws)) == FA_OK)
            c.run_o = (float *)ws, c.run_ml = (float *)((char *)ws + run_o);
    }
    for (int s0 = 0; rc == FA_OK && s0 < m->n; s0 += FA_MERGE_MAX) {
        c.n = m->n - s0 < FA_MERGE_MAX ? m->n - s0 : FA_MERGE_MAX;
        c.first = s0 == 0, c.last = s0 + c.n == m->n;
        for (int j = 0; j < c.n; j++) {
            const fa_tensor *t = &m->outs[s0 + j];
            c.in[j] = t->data, c.in_sb[j] = t->stride_batch, c.in_ss[j] = t->stride_seq, c.in_sh[j] = t->stride_head;
            c.lse_in[j] = m->lses[s0 + j];
        }
        const cudaError_t e = fa_merge_states_launch(&c, (int)o->dtype, fa_cuda_stream_of(ctx));
        if (e != cudaSuccess) rc = cuda_err(ctx, "merge states launch", e);
    }
    if (prev != ctx->device) cudaSetDevice(prev);
    return rc;
}
