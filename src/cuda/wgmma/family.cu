/* The FLASH3 rows (family.h): wgmma, TMA, warp specialisation. The forward (a persistent grid) and the backward
 * (one CTA per key block and K/V head), varlen in both, take 16-bit inputs at a head dim of their tile tables
 * (tiles.h), with views TMA can address. The forward's traffic is FLASH2's (the same loops). Host code. */
#include "cuda/family.h"
#include "tiles.h"

#include <stdio.h>

#define FA_COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))

/* TMA: a 16-byte aligned base, strides in non-zero multiples of 16 bytes below 2^38 elements, 0 only as a broadcast
 * over an extent of 1 (the launcher then encodes 16 bytes). */
static int fa3_stride_ok(int64_t s, int64_t extent, int64_t esize) {
    return (s * esize) % 16 == 0 && s < ((int64_t)1 << 38) && (s != 0 || extent <= 1);
}
static int fa3_tma_ok(const fa_tensor *t) {
    const int64_t e = fa_dtype_size(t->dtype);
    return (uintptr_t)t->data % 16 == 0 && fa3_stride_ok(t->stride_batch, t->batch, e) &&
           fa3_stride_ok(t->stride_seq, t->seqlen, e) && fa3_stride_ok(t->stride_head, t->heads, e);
}

/* A row's head dim for q, k, v and out alike among the rows of the call's input type (f8: e4m3), or 0 (a pair's
 * row, or another type's). */
static int fa3_one_dim(const fa3_fwd_row &r, int f8) { return r.dv == r.d && r.f8 == f8 ? r.d : 0; }
static int fa3_one_dim(const fa3_bwd_row &r, int) { return r.dv == r.d ? r.d : 0; }

/* The reason for a head dim a tile table (either pass's) does not list, with the ones it does for the call's type. */
template <class Row, int N>
static fa_status fa3_not_built(const Row (&rows)[N], const fa_problem *p, const char *pass, char *why, size_t why_len) {
    int d[N];
    char dims[64];
    for (int i = 0; i < N; ++i) d[i] = fa3_one_dim(rows[i], p->dtype == FA_DTYPE_F8_E4M3);
    fa_cuda_dims_list(d, N, dims, sizeof dims);
    return fa_cuda_unsupported(why, why_len, "head_dim %lld is not built for the CUDA FA_ALGO_FLASH3 %s (built: %s)",
                               (long long)p->d, pass, dims);
}

/* A (d, dv) pair with dv != d that the pass's table builds: 16-bit inputs; the backward's only with
 * FA_CUDA_FLASH3_BWD_PAIRS=1 until its row has run on a GPU (tu->flash3_bwd_pairs). */
static int fa3_pair_built(const fa_cuda_tuning *tu, const fa_problem *p) {
    if (p->dtype == FA_DTYPE_F8_E4M3) return 0;
    if (p->is_backward) {
        for (int i = 0; tu->flash3_bwd_pairs && i < FA_COUNT(fa3_bwd_rows); ++i)
            if (fa3_bwd_rows[i].d == p->d && fa3_bwd_rows[i].dv == p->d_v) return 1;
        return 0;
    }
    for (int i = 0; i < FA_COUNT(fa3_fwd_rows); ++i)
        if (fa3_fwd_rows[i].d == p->d && fa3_fwd_rows[i].dv == p->d_v) return 1;
    return 0;
}

/* What both passes need: 16-bit inputs (the forward also e4m3 with f16/bf16 out), one head_dim, views TMA can
 * address; varlen with or without seqused (forward, e4m3 forward and backward); attention_chunk: the forward only. */
static fa_status fa3_common(const fa_cuda_tuning *tu, const fa_problem *p, char *why, size_t why_len) {
    if (p->dtype == FA_DTYPE_F8_E4M3 && !p->is_backward) {
        if (p->o.dtype != FA_DTYPE_F16 && p->o.dtype != FA_DTYPE_BF16)
            return fa_cuda_unsupported(why, why_len, "out: dtype %s: the FA_ALGO_FLASH3 FP8 forward writes f16 or bf16",
                                       fa_dtype_name(p->o.dtype));
    } else if (p->dtype != FA_DTYPE_F16 && p->dtype != FA_DTYPE_BF16) {
        return fa_cuda_unsupported(why, why_len, "dtype %s: FA_ALGO_FLASH3 runs on 16-bit tensor cores (f16, bf16)%s",
                                   fa_dtype_name(p->dtype),
                                   p->dtype == FA_DTYPE_F8_E4M3 ? "; f8_e4m3 in the forward only" : "");
    }
    if (p->d_v != p->d && !fa3_pair_built(tu, p)) /* the tiles, TMA boxes and warpgroup split of a row's pair */
        return fa_cuda_unsupported(why, why_len, "v: head_dim %lld differs from q's %lld: FA_ALGO_FLASH3 builds the "
                                   "pair (192, 128) in 16 bits, the backward's taken with FA_CUDA_FLASH3_BWD_PAIRS=1 "
                                   "(not yet run on a GPU); FA_ALGO_FLASH2 (or FA_ALGO_AUTO) runs the pairs of its "
                                   "tables, FA_ALGO_STANDARD any pair",
                                   (long long)p->d_v, (long long)p->d);
    const char *name;
    if (fa_cuda_view_failing(p, fa3_tma_ok, &name))
        return fa_cuda_unsupported(why, why_len,
                                   "%s: FA_ALGO_FLASH3 (TMA) needs a 16-byte aligned data pointer and strides that are "
                                   "multiples of 16 bytes, below 2^38 elements, and 0 only over an extent of 1",
                                   name);
    return FA_OK;
}

static fa_status fa3_pick(const fa_cuda_tuning *tu, const fa_problem *p, fa_plan *plan, char *why, size_t why_len) {
    const fa_status rc = fa3_common(tu, p, why, why_len);
    if (rc != FA_OK) return rc;
    const int masks = p->wl >= 0 || p->wr >= 0 || p->chunk > 0 ? FA3_MASKED : FA3_UNMASKED,
              f8 = p->dtype == FA_DTYPE_F8_E4M3;
    int row = -1;
    /* block_q / block_k: the row of those tiles, for any mask and length; else (or none has them) the first row
     * taking the call's masks and seqlen_k */
    for (int pass = p->block_q || p->block_k ? 0 : 1; pass < 2 && row < 0; ++pass)
        for (int i = 0; i < FA_COUNT(fa3_fwd_rows) && row < 0; ++i) {
            const fa3_fwd_row *r = &fa3_fwd_rows[i];
            if (r->d == p->d && r->dv == p->d_v && r->f8 == f8 &&
                (pass == 0 ? (!p->block_q || r->bm == p->block_q) && (!p->block_k || r->bn == p->block_k)
                           : (r->masks & masks) != 0 && p->sk_max >= r->sk_min))
                row = i;
        }
    if (row < 0) return fa3_not_built(fa3_fwd_rows, p, f8 ? "FP8 forward" : "forward", why, why_len);
    const fa3_fwd_row *r = &fa3_fwd_rows[row];
    if ((p->block_q && p->block_q != r->bm) || (p->block_k && p->block_k != r->bn))
        return fa_cuda_unsupported(why, why_len,
                                   "block_q %d / block_k %d: no FA_ALGO_FLASH3 forward row at head_dim %lld has these "
                                   "tiles (this call's default: %d x %d; 0 = the default; src/cuda/wgmma/tiles.h)",
                                   p->block_q, p->block_k, (long long)p->d, r->bm, r->bn);
    const long long tiles = (p->sq_max + r->bm - 1) / r->bm * p->hq * p->batch; /* varlen: at max_seqlen_q */
    if (tiles >= ((long long)1 << 31))
        return fa_cuda_unsupported(why, why_len,
                                   "seqlen_q %lld x heads %lld x batch %lld: FA_ALGO_FLASH3 needs fewer than 2^31 tiles "
                                   "of %d query rows",
                                   (long long)p->sq_max, (long long)p->hq, (long long)p->batch, r->bm);
    fa_cuda_instance k = {NULL, NULL, 0};
    if (!fa_flash3_fwd_instance(row, &k)) /* a table row without its case in the instance switch */
        return fa_cuda_unsupported(why, why_len, "head_dim %lld: CUDA FA_ALGO_FLASH3 row %d has no kernel instance",
                                   (long long)p->d, row);
    plan->entry = row;
    plan->kernel = r->kernel;
    plan->block_q = r->bm, plan->block_k = r->bn, plan->threads = r->threads;
    plan->grid[0] = (int)(tiles < tu->sm_count ? tiles : tu->sm_count), plan->grid[1] = plan->grid[2] = 1;
    plan->smem_bytes = k.smem;
    /* the tile boundary (README.md): two Q buffers where the row holds them, the next tile's index a tile ahead;
     * FA_CUDA_FLASH3_QBUF=0 / FA_CUDA_FLASH3_EARLY_TILE=0 turn them off (A/B runs) */
    plan->aux[FA3_FWD_AUX_QBUF] = tu->flash3_qbuf ? r->qb : 1;
    plan->aux[FA3_FWD_AUX_EARLY] = tu->flash3_early;
    /* 2-CTA clusters sharing K and V (README.md): where the row has them, for unmasked fixed-length calls with an
     * even number of query blocks per head (a cluster takes two of one head, which visit the same keys), unless
     * FA_CUDA_FLASH3_CLUSTER=0; the grid is whole clusters, at most those the GPU holds at once (its GPCs need not
     * hold SMs / 2) */
    const long long nmb = (p->sq_max + r->bm - 1) / r->bm;
    const int clusters = r->cl == 2 && tu->flash3_cluster && masks == FA3_UNMASKED && !p->cu_q && nmb % 2 == 0
                             ? fa_flash3_fwd_clusters(row, tu->device)
                             : 0;
    if (clusters > 0) {
        plan->kernel = r->kernel_cl;
        plan->aux[FA3_FWD_AUX_CL] = 2;
        plan->grid[0] = 2 * (int)(tiles / 2 < clusters ? tiles / 2 : clusters);
    }
    return FA_OK;
}

/* Keys of the FP8 forward's Vᵀ rows: sk rounded up to 32 (flash3_fp8.cuh). */
static int64_t fa3_vt_keys(const fa_problem *p) { return (p->sk_max + 31) / 32 * 32; }

/* The dynamic scheduler's tile counter (masked calls: their tiles differ in work); FP8: Vᵀ. */
static void fa3_ws(fa_arena *a, const fa_problem *p, const fa_plan *plan, fa_cuda_ws *w) {
    (void)plan;
    if (p->wl >= 0 || p->wr >= 0 || p->chunk > 0) w->tile_counter = (int *)fa_arena_take(a, sizeof(int), 256);
    if (p->dtype == FA_DTYPE_F8_E4M3)
        w->v_t = fa_arena_take(a, (size_t)(p->batch * p->hk * p->d * fa3_vt_keys(p)), 1024);
}

/* FLASH2's loops; FP8: V read once more and Vᵀ written, then read in V's place (the same bytes). */
static void fa3_traffic(const fa_problem *p, fa_plan *plan) {
    fa_cuda_traffic_q_outer(p, plan);
    if (p->dtype != FA_DTYPE_F8_E4M3) return;
    const double vt = (double)p->batch * p->hk * p->d * fa3_vt_keys(p);
    plan->read_bytes += (double)p->batch * p->hk * p->sk_max * p->d, plan->write_bytes += vt;
}

static fa_cuda_result fa3_run(const fa_cuda_launch *l) {
    fa_cuda_result r = {cudaSuccess, CUBLAS_STATUS_SUCCESS};
    if (l->c->tile_counter) r.cuda = cudaMemsetAsync(l->c->tile_counter, 0, sizeof(int), l->stream);
    if (r.cuda == cudaSuccess) r.cuda = fa_flash3_fwd_launch(l->c, l->plan, l->stream);
    return r;
}

const fa_cuda_family fa_cuda_flash3_fwd = {"FLASH3", FA_ALGO_FLASH3, FA_CUDA_FWD, 1,
                                           FA_CUDA_DT_16 | FA_CUDA_DT(FA_DTYPE_F8_E4M3), fa3_pick, fa3_ws,
                                           fa3_traffic, fa3_run, 1, 1};

/* ---- the backward ---- */

static fa_status fa3_bwd_pick(const fa_cuda_tuning *tu, const fa_problem *p, fa_plan *plan, char *why,
                              size_t why_len) {
    const fa_status rc = fa3_common(tu, p, why, why_len);
    if (rc != FA_OK) return rc;
    if (p->chunk > 0) /* its walks and masks take the window's bands only (the forward takes the chunk) */
        return fa_cuda_unsupported(why, why_len, "opts.attention_chunk: %d: the FA_ALGO_FLASH3 backward has no "
                                   "chunked local attention yet (FA_ALGO_FLASH2's backward has; FA_ALGO_AUTO runs it "
                                   "from FLASH3's out and lse)", p->chunk);
    int row = -1;
    for (int i = 0; i < FA_COUNT(fa3_bwd_rows) && row < 0; ++i)
        if (fa3_bwd_rows[i].d == p->d && fa3_bwd_rows[i].dv == p->d_v) row = i;
    if (row < 0) return fa3_not_built(fa3_bwd_rows, p, "backward", why, why_len);
    const fa3_bwd_row *r = &fa3_bwd_rows[row];
    if (p->algo_auto && !r->auto_pick)
        return fa_cuda_unsupported(why, why_len,
                                   "head_dim %lld: FA_ALGO_AUTO runs FLASH2's backward, faster than FLASH3's there "
                                   "(tiles.h); FA_ALGO_FLASH3 runs FLASH3's",
                                   (long long)p->d);
    if ((p->block_q && p->block_q != r->bm) || (p->block_k && p->block_k != r->bn))
        return fa_cuda_unsupported(why, why_len,
                                   "block_q %d / block_k %d: the FA_ALGO_FLASH3 backward at head_dim %lld runs %d x %d "
                                   "tiles only (0 = its default)",
                                   p->block_q, p->block_k, (long long)p->d, r->bm, r->bn);
    fa_cuda_instance k = {NULL, NULL, 0};
    if (!fa_flash3_bwd_instance(row, p->deterministic, &k))
        return fa_cuda_unsupported(why, why_len, "head_dim %lld: CUDA FA_ALGO_FLASH3 backward row %d has no instance",
                                   (long long)p->d, row);
    plan->entry = row;
    plan->kernel = p->deterministic ? r->kernel_det : r->kernel;
    plan->aux[FA3_BWD_AUX_DET] = p->deterministic ? 1 : 0;
    plan->aux[FA3_BWD_AUX_FUSED] =
        fa3_bwd_fuses_dq(r->d, r->dv) && tu->flash3_bwd_fused_dq > plan->aux[FA3_BWD_AUX_DET];
    plan->block_q = r->bm, plan->block_k = r->bn, plan->threads = r->threads;
    /* varlen: every sequence at the bounds (max_seqlen_k), batch = the sequences */
    plan->grid[0] = (int)((p->sk_max + r->bn - 1) / r->bn), plan->grid[1] = (int)p->hk, plan->grid[2] = (int)p->batch;
    plan->smem_bytes = k.smem;
    return FA_OK;
}

/* Query rows padded to whole blocks, over every (batch, query head): the layout of D, LSE·log2e and dQ's fp32
 * accumulator (flash3_bwd.cu); varlen: every sequence at max_seqlen_q. */
static size_t fa3_bwd_rows_padded(const fa_problem *p, const fa_plan *plan) {
    const size_t bm = (size_t)plan->block_q;
    return (size_t)p->batch * p->hq * (((size_t)p->sq_max + bm - 1) / bm) * bm;
}

static void fa3_bwd_ws(fa_arena *a, const fa_problem *p, const fa_plan *plan, fa_cuda_ws *w) {
    const size_t rows = fa3_bwd_rows_padded(p, plan);
    w->dsum = (float *)fa_arena_take(a, rows * sizeof(float), 256);
    w->lse2 = (float *)fa_arena_take(a, rows * sizeof(float), 256);
    w->dq_acc = (float *)fa_arena_take(a, rows * p->d * sizeof(float), 256);
    if (p->deterministic || plan->aux[FA3_BWD_AUX_FUSED])
        w->dq_turns = (int *)fa_arena_take(a, rows / plan->block_q * sizeof(int), 256);
}

/* Pre-pass: O, dO, LSE read; D, LSE·log2e written, the accumulator cleared. Per visited (query block, key block)
 * pair: Qi, dOi, their LSE and D read, dQi added (an fp32 read and write). Kj, Vj read and dKj, dVj written once per
 * key block and K/V head. dQ conversion: the accumulator read, dQ written. */
static void fa3_bwd_traffic(const fa_problem *p, fa_plan *plan) {
    const fa_cuda_traffic_in t = fa_cuda_traffic_of(p);
    const double e = t.e, d = t.d, qrows = t.qrows, kvrows = t.kvrows, bm = plan->block_q;
    const double padded = (double)fa3_bwd_rows_padded(p, plan);
    double pairs, qb;
    fa_cuda_model_pairs(p, plan->block_q, plan->block_k, &pairs, &qb);
    plan->read_bytes = 2 * qrows * d * e + 4 * qrows + pairs * bm * (2 * d * e + 8 + 4 * d) + 2 * kvrows * d * e +
                       padded * d * 4;
    plan->write_bytes = 8 * padded + padded * d * 4 + pairs * bm * 4 * d + 2 * kvrows * d * e + qrows * d * e;
}

static fa_cuda_result fa3_bwd_run(const fa_cuda_launch *l) {
    fa_cuda_result r = {fa_flash3_bwd_launch(l->c, l->plan, l->stream), CUBLAS_STATUS_SUCCESS};
    return r;
}

const fa_cuda_family fa_cuda_flash3_bwd = {"FLASH3", FA_ALGO_FLASH3, FA_CUDA_BWD, 1, FA_CUDA_DT_16, fa3_bwd_pick,
                                           fa3_bwd_ws, fa3_bwd_traffic, fa3_bwd_run, 0, 0};
