/* The cache's index arrays checked on host copies: the CPU entry runs it on the caller's arrays, the CUDA backend on
 * the ones it copies back for check_indices, so it sits below both. */
#include "core/kvcache.h"

fa_status fa_kv_check_indices(fa_context *ctx, const fa_kv_problem *p, const int32_t *seqlens,
                              const int32_t *block_table, const int32_t *batch_idx) {
    for (int64_t b = 0; b < p->batch; b++) {
        const int64_t row = batch_idx ? batch_idx[b] : b, add = fa_kv_sn(p, b), sq = fa_kv_sq(p, b);
        if (batch_idx && (row < 0 || row >= p->cache_rows))
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cache.batch_idx[%lld] = %lld is outside 0..%lld", (long long)b,
                           (long long)row, (long long)p->cache_rows - 1);
        const int64_t len = seqlens[b];
        if (len < 0 || len + add > p->capacity)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cache.seqlens[%lld] = %lld: with %lld new keys it must be in "
                           "0..%lld (the capacity is %lld)", (long long)b, (long long)len, (long long)add,
                           (long long)(p->capacity - add), (long long)p->capacity);
        if (p->leftpad && (p->leftpad[b] < 0 || p->leftpad[b] > len))
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "kv_opts.cache_leftpad[%lld] = %d: must be in 0..%lld (the "
                           "sequence's cache length)", (long long)b, p->leftpad[b], (long long)len);
        /* rotary positions: the new keys' len .. len + add - 1, the queries' len (+ i with per-row positions) */
        const int64_t qpos = sq == 0 ? 0 : fa_kv_rotary_q_rows(p) ? sq : 1, need = len + (add > qpos ? add : qpos);
        if (p->rot_cos && need > p->rot_seqlen)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "kv_opts.rotary_seqlen: %lld positions, sequence %lld needs "
                           "%lld", (long long)p->rot_seqlen, (long long)b, (long long)need);
        if (p->paged) {
            const int64_t used = (len + add + p->page_size - 1) / p->page_size;
            for (int64_t j = 0; j < used; j++) {
                const int32_t pg = block_table[row * p->bt_stride + j];
                if (pg < 0 || pg >= p->num_pages)
                    return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "cache.block_table[%lld][%lld] = %d is outside "
                                   "0..%lld (sequence %lld)", (long long)row, (long long)j, pg,
                                   (long long)p->num_pages - 1, (long long)b);
            }
        }
    }
    return FA_OK;
}
