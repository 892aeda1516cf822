/* The CUDA decode path, host side: the plan (support, split count, warps, launch shape, workspace, modelled
 * traffic) and the run (a first kernel where needed: append + rotary, a caller's workspace's split counters; the
 * split-KV attention, whose last CTA per row tile merges the splits), and fa_merge_states. No host synchronisation
 * and no allocation once the workspace is large enough (kv_opts.workspace, or the context's cached one); the launch
 * shape depends on the shapes and the capacity only, so a captured graph replays at any cache length. */
#include "kvcache.h"
#include "cuda/plan.h"

extern "C" {
#include "core/kvcache.h"
}

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIN_SPLIT_KEYS 128    /* keys below which a split is not worth its merge */
#define SPLIT_KEYS 512        /* keys a split holds where the grid still fills half the SMs (see the plan) */
#define PAGED_SPLIT_KEYS 1024 /* paged caches: keys below which a second CTA per SM costs more than it hides */
/* paged: keys per split from which 8 warps per CTA beat 4 (4 tiles of 16 keys a warp; GQA 32/8 and 8/8, pages of
 * 16 / 256: batch 16 with 1k keys and batch 1 with 8k 1.05-1.09x, batch 1 and 4 with 1k keys, 128-256 keys a
 * split, 0.96-0.98x) */
#define WARP8_SPLIT_KEYS 512
/* paged: keys per split from which one 8-warp CTA per SM beats two 4-warp CTAs per SM (pages of 16 / 256, GQA
 * 32/8: batch 1 with 64k keys 1.06 / 1.04x, batch 16 with 8k 1.02 / 1.03x, batch 4 with 64k 0.99 / 1.01x; at 2048
 * keys a split, GQA 8/8 and 32/8: batch 1 with 32k keys 1.04-1.08 / 1.02-1.08x, batch 2 / 16k 1.02-1.03 /
 * 1.01-1.05x, batch 4 / 8k 1.01-1.02 / 1.00-1.03x, batch 8 / 4k 1.05 / 1.04x, batch 16 / 2k 1.07 / 1.08x) */
#define WARP8_ONLY_KEYS 2048
/* contiguous: keys per split up to which 8 warps beat 4 where the grid holds at most one CTA per SM (GQA 32/8: batch
 * 1 with 8k keys, 512 a split, 1.06x; batch 4 with 8k, 2048 a split, 1.01x; 4096-65536 keys a split 0.99-1.00x) */
#define WARP8_CONTIG_KEYS 2048
#define LONG_KEYS 32768 /* contiguous: capacity from which a long call's CTAs start at thirds (see the plan) */
#ifndef FA_DEC_FORCE_WARPS
#define FA_DEC_FORCE_WARPS 0 /* 0: the plan's rule; 4 or 8: every d <= 128 call (a build option for measuring) */
#endif

static int aligned16(const fa_tensor *t) {
    return ((uintptr_t)t->data % 16) == 0 && t->stride_batch % 8 == 0 && t->stride_seq % 8 == 0 && t->stride_head % 8 == 0;
}

/* Tiles of FA_DEC_ROWS query rows per K/V head: the GQA group x the new rows. */
static int64_t row_tiles_of(const fa_kv_problem *p) {
    return (p->hq / p->hk * p->sq + FA_DEC_ROWS - 1) / FA_DEC_ROWS;
}

typedef struct dec_ws { float *part_o, *part_lse, *qrot; int *arrived; } dec_ws;

/* The workspace: fp32 partials and split counters where the splits merge through global memory (several splits,
 * no cluster), and the rotated q with rotary. */
static void layout(fa_arena *a, const fa_kv_problem *p, int nsplit, int cluster, dec_ws *w) {
    const size_t rows = (size_t)(p->batch * p->hq * p->sq);
    w->part_o = w->part_lse = w->qrot = NULL;
    w->arrived = NULL;
    if (nsplit > 1 && !cluster) {
        const size_t tiles = (size_t)row_tiles_of(p);
        w->part_o = (float *)fa_arena_take(a, rows * (size_t)nsplit * (size_t)p->d * sizeof(float), 256);
        w->part_lse = (float *)fa_arena_take(a, rows * (size_t)nsplit * sizeof(float), 256);
        w->arrived = (int *)fa_arena_take(a, (size_t)(p->batch * p->hk) * tiles * sizeof(int), 256);
    }
    if (p->rot_cos) w->qrot = (float *)fa_arena_take(a, rows * (size_t)p->d * sizeof(float), 256);
}

#ifndef FA_DEC_CLUSTER
#define FA_DEC_CLUSTER 1 /* 0: every split merges through global memory (a build option for measuring) */
#endif

/* Clusters of ns CTAs of this kernel that the current device holds at once, asked once per shape. */
static int active_clusters(const fa_kv_problem *p, int warps, int ns) {
    static int known[64][2][3][2][17]; /* device, dtype, d, warps, ns: the count + 1 */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev >= 64) return 0;
    const int dt = p->dtype == FA_DTYPE_F16 ? 1 : 2, di = p->d == 64 ? 0 : p->d == 128 ? 1 : 2;
    int *k = &known[dev][dt - 1][di][warps == 8][ns];
    if (!*k) {
        fa_dec_params c;
        memset(&c, 0, sizeof c);
        c.d = (int)p->d, c.warps = warps, c.nsplit = ns, c.hk = 1, c.row_tiles = 1, c.batch = 1, c.cluster = 1;
        *k = fa_dec_active_clusters(&c, dt) + 1;
    }
    return *k - 1;
}

extern "C" fa_status fa_cuda_kv_plan(const fa_context *ctx, const fa_kv_problem *p, fa_plan *plan, char *why,
                                     size_t why_len) {
    if (p->dtype == FA_DTYPE_F32) {
        snprintf(why, why_len, "dtype: f32 KV-cache decoding runs on the CPU only (CUDA: f16, bf16)");
        return FA_ERR_UNSUPPORTED;
    }
    if (p->d != 64 && p->d != 128 && p->d != 256) {
        snprintf(why, why_len, "head_dim: %lld is not built for CUDA decoding (64, 128, 256)", (long long)p->d);
        return FA_ERR_UNSUPPORTED;
    }
    const fa_tensor *ts[4] = {&p->q, &p->kc, &p->vc, &p->o};
    static const char *const names[4] = {"q", "cache.k", "cache.v", "out"};
    for (int i = 0; i < 4; i++)
        if (!aligned16(ts[i])) {
            snprintf(why, why_len, "%s: CUDA decoding reads rows with 16-byte loads: the data pointer must be 16-byte "
                     "aligned and the strides multiples of 8 elements", names[i]);
            return FA_ERR_UNSUPPORTED;
        }
    const int rpc = FA_DEC_ROWS, sms = fa_cuda_tuning_of(ctx)->sm_count;
    const int64_t tiles = row_tiles_of(p);
    if (p->batch > 65535 || p->hk * tiles > 65535) {
        snprintf(why, why_len, "batch / heads: the grid (%lld sequences, %lld K/V head tiles) is above 65535",
                 (long long)p->batch, (long long)(p->hk * tiles));
        return FA_ERR_UNSUPPORTED;
    }
    int ns;
    if (p->split_size) {
        ns = (int)((p->capacity + p->split_size - 1) / p->split_size);
        plan->aux[FA_KV_AUX_FIXED] = 1;
        plan->aux[FA_KV_AUX_CHUNK] = p->split_size;
    } else if (p->num_splits) {
        const int64_t most = (p->capacity + 15) / 16;
        ns = p->num_splits < most ? p->num_splits : (int)most;
    } else {
        /* One CTA per SM is the worker: its 4 warps' cp.async rings keep enough bytes in flight for the SM's share
         * of HBM bandwidth, and a second split per SM only adds partials to merge (GQA 32/8, bf16, d 128: batch 1
         * with 8k / 64k keys 16 splits 1.33 / 3.22 TB/s against 32 splits 1.19 / 3.13; batch 16 with 1k / 8k no
         * split 2.2 / 3.93 against 2 splits 2.0 / 3.79). Within 3 % of the best wave, not the CPU's 85 %: at batch
         * 1 that rule leaves SMs idle for part of a bandwidth-bound call. */
        const int64_t items = p->batch * p->hk * tiles;
        /* Splits of at least SPLIT_KEYS keys (8 warps each, below), down to MIN_SPLIT_KEYS where that leaves fewer
         * CTAs than half the SMs: fewer, longer splits have fewer CTAs to start and merge (forced counts, GQA 32/8:
         * batch 1 with 2k / 4k keys 8 splits 658 / 1121 GB/s against 16 splits 560 / 986; batch 2 with 1k / 2k 4
         * splits 664 / 1139 against 8 splits 597 / 1046; batch 4 with 1k 2 splits 1150 against 4 splits 1083;
         * batch 1 with 1k keys 2 splits 314 against 8 splits 390). */
        ns = fa_kv_split_heuristic(items, sms, (p->capacity + SPLIT_KEYS - 1) / SPLIT_KEYS, FA_DEC_MAX_SPLITS, 0.97);
        if (ns * items < sms / 2) {
            const int64_t most = (p->capacity + MIN_SPLIT_KEYS - 1) / MIN_SPLIT_KEYS, fill = sms / 2 / items;
            const int64_t more = most < fill ? most : fill;
            if (more > ns) ns = (int)more;
        }
        /* Paged: a tile's copies wait for its block-table entry, which one CTA's 4 warps do not hide; two CTAs per
         * SM where each split still has PAGED_SPLIT_KEYS keys (forced counts, pages of 16, GQA 32/8: batch 16
         * with 8k / 64k keys 2 splits 3.75 / 4.37 TB/s against 1 split 3.17 / 3.45; batch 4 / 64k 8 against 4
         * splits 4.02 / 3.32; batch 1 / 64k 32 against 16 splits 3.07 / 2.87; batch 1 / 8k: 16 splits 1.25 against
         * 32 splits 1.18, hence the floor on the keys) — unless one CTA per SM holds WARP8_ONLY_KEYS keys a split:
         * there one CTA of 8 warps per SM (the warps rule below) reads faster, with fewer splits to merge. */
        const bool one8 = p->d <= 128 && ns * items <= sms && p->capacity / ns >= WARP8_ONLY_KEYS;
        if (p->paged && !one8) {
            const int np = fa_kv_split_heuristic(items, 2 * sms, p->capacity / PAGED_SPLIT_KEYS, FA_DEC_MAX_SPLITS,
                                                 0.97);
            if (np > ns) ns = np;
        }
        /* Contiguous, more than one wave of two CTAs per SM and long sequences: 3 splits instead of 1. One split
         * starts every CTA of a wave at key 0 of its sequence, 2 or 4 splits at offsets a power of two apart, and
         * sequences of a power-of-two capacity then meet in the same DRAM channels (the likely cause); thirds do
         * not (forced counts, bf16, GQA 8/8 and 32/8, 3 rounds: batch 64 with 32k / 64k keys 3 splits
         * 1.013-1.019x one split, 2 and 4 splits 0.990-1.000x; batch 16-64 with 8k keys and batch 16 none faster) */
        if (!p->paged && p->d <= 128 && ns == 1 && items > 2 * (int64_t)sms && p->capacity >= LONG_KEYS) ns = 3;
    }
    if (ns < 1) ns = 1;
    plan->aux[FA_KV_AUX_SPLITS] = ns;
    /* At most one CTA per SM and splits of at least WARP8_SPLIT_KEYS keys: 8 warps. Paged, so that the block-table
     * reads of twice as many warps hide each other (no split added for it: the merge would cost more); contiguous,
     * up to WARP8_CONTIG_KEYS keys a split (longer ones read the same on 4).
     * d = 256 keeps 4 (shared memory); so does the fixed-split mode, whose sums must not depend on the batch (the
     * warps' order of keys would). */
    int warps = 4;
    if (p->d <= 128 && !p->split_size) {
        const int64_t ctas = (int64_t)ns * p->batch * p->hk * tiles, keys = p->capacity / ns;
        if (FA_DEC_FORCE_WARPS) warps = FA_DEC_FORCE_WARPS;
        else if (ctas <= sms && keys >= WARP8_SPLIT_KEYS &&
                 (p->paged || keys <= WARP8_CONTIG_KEYS))
            warps = 8;
    }
    /* Several splits (at most 16, a cluster's limit) and not the fixed-split mode (whose sums must not depend on
     * how the rest of the batch merges): the splits of a row tile run as one cluster and merge through distributed
     * shared memory — no partials, fences or counters in global memory — where the GPU holds every cluster of
     * the grid at once (GQA 32/8, bf16, d 128: batch 1 with 1k keys 1.13x, the other split rows 0.99-1.01x). */
    plan->aux[FA_KV_AUX_CLUSTER] = 0;
    if (ns >= 2 && ns <= FA_DEC_CLUSTER_MAX && !p->split_size && FA_DEC_CLUSTER)
        plan->aux[FA_KV_AUX_CLUSTER] = active_clusters(p, warps, ns) >= p->batch * p->hk * tiles;
    /* no rotary q, no softcap and a tile's keys in one page: the kernel instance without the code of those
     * (instruction fetch is a third of a short call's stalls) */
    plan->aux[FA_KV_AUX_PLAIN] = !p->rot_cos && !(p->softcap > 0) && (!p->paged || p->page_size % FA_DEC_KEYS == 0);
    static const char *const kn[2][3] = {{"cuda.decode.mma.d64", "cuda.decode.mma.d128", "cuda.decode.mma.d256"},
                                         {"cuda.decode.mma.plain.d64", "cuda.decode.mma.plain.d128",
                                          "cuda.decode.mma.plain.d256"}};
    plan->kernel = kn[plan->aux[FA_KV_AUX_PLAIN]][p->d == 64 ? 0 : p->d == 128 ? 1 : 2];
    plan->block_q = rpc;
    plan->block_k = FA_DEC_KEYS;
    plan->threads = 32 * warps;
    plan->grid[0] = ns, plan->grid[1] = (int)(p->hk * tiles), plan->grid[2] = (int)p->batch;
    fa_arena a = fa_arena_dry();
    dec_ws w;
    layout(&a, p, ns, plan->aux[FA_KV_AUX_CLUSTER], &w);
    plan->workspace_bytes = a.size;
    /* modelled at full capacity (the lengths are on the device) */
    const double e = (double)fa_dtype_size(p->dtype), rowb = (double)p->d * e;
    plan->read_bytes = (double)p->batch * ((double)p->capacity * 2 * p->hk + p->sq * p->hq) * rowb;
    plan->write_bytes = (double)p->batch * p->sq * p->hq * rowb;
    return FA_OK;
}

static fa_status cuda_err(fa_context *ctx, const char *what, cudaError_t e) {
    return fa_fail(ctx, FA_ERR_DEVICE, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* check_indices: the device index arrays copied back and validated as on the CPU (synchronises). */
static fa_status check_device_indices(fa_context *ctx, const fa_kv_problem *p, cudaStream_t st) {
    const size_t nb = (size_t)p->batch, nbt = p->paged ? (size_t)(p->cache_rows * p->bt_stride) : 0;
    int32_t *h = (int32_t *)malloc(sizeof(int32_t) * (2 * nb + nbt + 1));
    if (!h) return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "kv_opts.check_indices: no host memory for the copies");
    int32_t *lens = h, *bidx = h + nb, *bt = h + 2 * nb;
    cudaError_t e = cudaMemcpyAsync(lens, p->seqlens, nb * 4, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess && p->batch_idx) e = cudaMemcpyAsync(bidx, p->batch_idx, nb * 4, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess && nbt) e = cudaMemcpyAsync(bt, p->block_table, nbt * 4, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    fa_status rc = e != cudaSuccess ? cuda_err(ctx, "kv_opts.check_indices: copying the index arrays", e)
                                    : fa_kv_check_indices(ctx, p, lens, nbt ? bt : NULL, p->batch_idx ? bidx : NULL);
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
        void *base = p->workspace;
        size_t cap = p->workspace_bytes;
        if (!base && plan->workspace_bytes) {
            if ((rc = fa_cuda_workspace_of(ctx, plan->workspace_bytes, &base)) != FA_OK) break;
            cap = plan->workspace_bytes;
        }
        fa_arena a = fa_arena_over(base, cap);
        dec_ws w;
        const int ns = plan->aux[FA_KV_AUX_SPLITS];
        layout(&a, p, ns, plan->aux[FA_KV_AUX_CLUSTER], &w);
        fa_dec_params c;
        memset(&c, 0, sizeof c);
        c.q = p->q.data, c.q_sb = p->q.stride_batch, c.q_ss = p->q.stride_seq, c.q_sh = p->q.stride_head;
        c.qrot = w.qrot;
        c.kc = p->kc.data, c.k_sb = p->kc.stride_batch, c.k_ss = p->kc.stride_seq, c.k_sh = p->kc.stride_head;
        c.vc = p->vc.data, c.v_sb = p->vc.stride_batch, c.v_ss = p->vc.stride_seq, c.v_sh = p->vc.stride_head;
        if (p->append) {
            c.kn = p->kn.data, c.kn_sb = p->kn.stride_batch, c.kn_ss = p->kn.stride_seq, c.kn_sh = p->kn.stride_head;
            c.vn = p->vn.data, c.vn_sb = p->vn.stride_batch, c.vn_ss = p->vn.stride_seq, c.vn_sh = p->vn.stride_head;
        }
        c.o = p->o.data, c.o_sb = p->o.stride_batch, c.o_ss = p->o.stride_seq, c.o_sh = p->o.stride_head;
        c.lse = p->lse;
        c.seqlens = p->seqlens, c.block_table = p->block_table, c.batch_idx = p->batch_idx;
        c.bt_stride = p->bt_stride;
        c.batch = (int)p->batch, c.sq = (int)p->sq, c.hq = (int)p->hq, c.hk = (int)p->hk;
        c.group = (int)(p->hq / p->hk), c.d = (int)p->d;
        c.paged = p->paged, c.page_size = (int)p->page_size, c.num_pages = (int)p->num_pages;
        c.capacity = (int)p->capacity, c.cache_rows = (int)p->cache_rows;
        c.append = p->append;
        c.kn_vec = p->append && !p->rot_cos && aligned16(&p->kn) && aligned16(&p->vn);
        c.rcos = p->rot_cos, c.rsin = p->rot_sin, c.rot_dim = p->rot_dim, c.rot_interleaved = p->rot_interleaved;
        c.rot_seqlen = (int)(p->rot_seqlen < INT32_MAX ? p->rot_seqlen : INT32_MAX);
        c.scale = p->scale, c.softcap = p->softcap;
        c.qmul = p->softcap > 0 ? p->scale / p->softcap : p->scale * 1.4426950408889634f;
        c.softcap_mul = p->softcap > 0 ? p->softcap * 1.4426950408889634f : 0.f;
        c.wl = p->wl, c.wr = p->wr;
        c.nsplit = ns, c.fixed = plan->aux[FA_KV_AUX_FIXED], c.chunk = plan->aux[FA_KV_AUX_CHUNK];
        c.row_tiles = (int)row_tiles_of(p);
        c.warps = plan->threads / 32;
        c.cluster = plan->aux[FA_KV_AUX_CLUSTER];
        c.plain = plan->aux[FA_KV_AUX_PLAIN];
        c.part_o = w.part_o, c.part_lse = w.part_lse, c.arrived = w.arrived;
        /* the split counters: the context's, which stay zero between calls; in a caller's workspace, whose state is
         * not known, the first kernel zeroes them */
        if (c.arrived && !p->workspace) {
            const size_t n = (size_t)(p->batch * p->hk) * (size_t)c.row_tiles;
            if ((rc = fa_cuda_counters_of(ctx, n, &c.arrived)) != FA_OK) break;
        }
        c.zero_arrived = c.arrived && p->workspace;
        const int dt = (int)p->dtype;
        cudaError_t e;
        c.after_first = p->append || c.zero_arrived;
        if (c.after_first && (e = fa_dec_first_launch(&c, dt, stream)) != cudaSuccess) {
            rc = cuda_err(ctx, "decode append launch", e);
            break;
        }
        if ((e = fa_dec_attend_launch(&c, dt, stream)) != cudaSuccess) {
            rc = cuda_err(ctx, "decode split-KV launch", e);
            break;
        }
    } while (0);
    if (prev != ctx->device) cudaSetDevice(prev);
    return rc;
}

extern "C" fa_status fa_cuda_merge(fa_context *ctx, const fa_merge_problem *m) {
    fa_merge_params c;
    memset(&c, 0, sizeof c);
    const fa_tensor *o = &m->o;
    c.n = m->n, c.heads = (int)o->heads, c.seqlen = (int)o->seqlen, c.d = (int)o->head_dim;
    c.rows = (int)(o->batch * o->heads * o->seqlen);
    for (int i = 0; i < m->n; i++) {
        c.in[i] = m->outs[i].data;
        c.in_sb[i] = m->outs[i].stride_batch, c.in_ss[i] = m->outs[i].stride_seq, c.in_sh[i] = m->outs[i].stride_head;
        c.lse_in[i] = m->lses[i];
    }
    c.out = o->data, c.o_sb = o->stride_batch, c.o_ss = o->stride_seq, c.o_sh = o->stride_head;
    c.lse = m->lse;
    if (o->batch * o->heads * o->seqlen > INT32_MAX)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED, "out: %lld rows are above 2^31-1 for the CUDA merge",
                       (long long)(o->batch * o->heads * o->seqlen));
    int prev = 0;
    if (cudaGetDevice(&prev) != cudaSuccess) return fa_fail(ctx, FA_ERR_DEVICE, "cudaGetDevice failed");
    if (prev != ctx->device && cudaSetDevice(ctx->device) != cudaSuccess)
        return fa_fail(ctx, FA_ERR_DEVICE, "cudaSetDevice(%d) failed", ctx->device);
    const cudaError_t e = fa_merge_states_launch(&c, (int)o->dtype, fa_cuda_stream_of(ctx));
    if (prev != ctx->device) cudaSetDevice(prev);
    return e == cudaSuccess ? FA_OK : cuda_err(ctx, "merge states launch", e);
}
