/* The FLASH3 forward's row (family.h): wgmma, TMA, warp specialisation, a persistent grid. It takes 16-bit inputs
 * without varlen, at a head dim of its tile table (tiles.h), with views TMA can address; its traffic is FLASH2's (the
 * same loops). Host code. */
#include "cuda/family.h"
#include "tiles.h"

#include <stdio.h>

#define FA_COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))

/* TMA: a 16-byte aligned base, strides in non-zero multiples of 16 bytes below 2^38 elements, 0 only as a broadcast
 * over an extent of 1 (the launcher then encodes 16 bytes). */
static int fa3_stride_ok(int64_t s, int64_t extent) {
    return s % 8 == 0 && s < ((int64_t)1 << 38) && (s != 0 || extent <= 1);
}
static int fa3_tma_ok(const fa_tensor *t) {
    return (uintptr_t)t->data % 16 == 0 && fa3_stride_ok(t->stride_batch, t->batch) &&
           fa3_stride_ok(t->stride_seq, t->seqlen) && fa3_stride_ok(t->stride_head, t->heads);
}

static fa_status fa3_pick(const fa_cuda_tuning *tu, const fa_problem *p, fa_plan *plan, char *why, size_t why_len) {
    if (p->dtype != FA_DTYPE_F16 && p->dtype != FA_DTYPE_BF16)
        return fa_cuda_unsupported(why, why_len, "dtype %s: FA_ALGO_FLASH3 runs on 16-bit tensor cores (f16, bf16)",
                                   fa_dtype_name(p->dtype));
    if (p->cu_q) return fa_cuda_unsupported(why, why_len, "opts.cu_seqlens_q: FA_ALGO_FLASH3 has no varlen yet (FA_ALGO_FLASH2 has)");
    const int masks = p->wl >= 0 || p->wr >= 0 ? FA3_MASKED : FA3_UNMASKED;
    int row = -1;
    for (int i = 0; i < FA_COUNT(fa3_fwd_rows) && row < 0; ++i)
        if (fa3_fwd_rows[i].d == p->d && (fa3_fwd_rows[i].masks & masks)) row = i;
    if (row < 0) {
        int d[FA_COUNT(fa3_fwd_rows)];
        char dims[64];
        for (int i = 0; i < FA_COUNT(fa3_fwd_rows); ++i) d[i] = fa3_fwd_rows[i].d;
        fa_cuda_dims_list(d, FA_COUNT(d), dims, sizeof dims);
        return fa_cuda_unsupported(why, why_len,
                                   "head_dim %lld is not built for the CUDA FA_ALGO_FLASH3 forward (built: %s)",
                                   (long long)p->d, dims);
    }
    const fa3_fwd_row *r = &fa3_fwd_rows[row];
    if ((p->block_q && p->block_q != r->bm) || (p->block_k && p->block_k != r->bn))
        return fa_cuda_unsupported(why, why_len,
                                   "block_q %d / block_k %d: FA_ALGO_FLASH3 at head_dim %lld runs %d x %d tiles only "
                                   "(0 = its default)",
                                   p->block_q, p->block_k, (long long)p->d, r->bm, r->bn);
    const char *name;
    if (fa_cuda_view_failing(p, fa3_tma_ok, &name))
        return fa_cuda_unsupported(why, why_len,
                                   "%s: FA_ALGO_FLASH3 (TMA) needs a 16-byte aligned data pointer and strides that are "
                                   "multiples of 8 elements, below 2^38, and 0 only over an extent of 1",
                                   name);
    const long long tiles = (p->q.seqlen + r->bm - 1) / r->bm * p->hq * p->batch;
    if (tiles >= ((long long)1 << 31))
        return fa_cuda_unsupported(why, why_len,
                                   "seqlen_q %lld x heads %lld x batch %lld: FA_ALGO_FLASH3 needs fewer than 2^31 tiles "
                                   "of %d query rows",
                                   (long long)p->q.seqlen, (long long)p->hq, (long long)p->batch, r->bm);
    fa_cuda_instance k = {NULL, NULL, 0};
    if (!fa_flash3_fwd_instance(row, &k)) /* a table row without its case in the instance switch */
        return fa_cuda_unsupported(why, why_len, "head_dim %lld: CUDA FA_ALGO_FLASH3 row %d has no kernel instance",
                                   (long long)p->d, row);
    plan->entry = row;
    plan->kernel = r->kernel;
    plan->block_q = r->bm, plan->block_k = r->bn, plan->threads = r->threads;
    plan->grid[0] = (int)(tiles < tu->sm_count ? tiles : tu->sm_count), plan->grid[1] = plan->grid[2] = 1;
    plan->smem_bytes = k.smem;
    return FA_OK;
}

/* The dynamic scheduler's tile counter (masked calls: their tiles differ in work). */
static void fa3_ws(fa_arena *a, const fa_problem *p, const fa_plan *plan, fa_cuda_ws *w) {
    (void)plan;
    if (p->wl >= 0 || p->wr >= 0) w->tile_counter = (int *)fa_arena_take(a, sizeof(int), 256);
}

static fa_cuda_result fa3_run(const fa_cuda_launch *l) {
    fa_cuda_result r = {cudaSuccess, CUBLAS_STATUS_SUCCESS};
    if (l->c->tile_counter) r.cuda = cudaMemsetAsync(l->c->tile_counter, 0, sizeof(int), l->stream);
    if (r.cuda == cudaSuccess) r.cuda = fa_flash3_fwd_launch(l->c, l->plan, l->stream);
    return r;
}

const fa_cuda_family fa_cuda_flash3_fwd = {"FLASH3", FA_ALGO_FLASH3, FA_CUDA_FWD, 1, FA_CUDA_DT_16, fa3_pick,
                                           fa3_ws, fa_cuda_traffic_q_outer, fa3_run};
