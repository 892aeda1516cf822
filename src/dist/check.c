/* The ring's argument checks on one rank (fa_forward's own tensor, option and overlap rules on the local shapes,
 * through the entry layer's steps, core/entry.h) and the ranks' agreement on the outcome, so that a call fails on
 * every rank or on none. */
#include "dist/ring.h"
#include "core/entry.h"

fa_status fa_ring_check(fa_context *ctx, const fa_ring_comm *comm, const fa_attn_opts *opts_in, fa_attn_opts *opts,
                        const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                        const float *lse, int lse_required, const fa_tensor *const *grads, fa_ring_shape *s) {
    fa_status st;
    if (!comm) return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "comm: NULL");
    if ((st = comm->tr->vt->check_ctx(comm->tr, ctx)) != FA_OK) return st;
    if ((st = fa_entry_attn_opts(ctx, opts_in, opts)) != FA_OK) return st;
    if (opts->window_left != -1 || opts->window_right != -1)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED, "opts.window_left/right: (%d, %d): ring attention has no sliding "
                       "window (leave both at -1)", opts->window_left, opts->window_right);
    if (opts->attention_chunk)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED, "opts.attention_chunk: %d: ring attention has no chunked local "
                       "attention (leave it 0)", opts->attention_chunk);
    if (opts->cu_seqlens_q || opts->cu_seqlens_k || opts->max_seqlen_q || opts->max_seqlen_k)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED, "opts.cu_seqlens_q/k, max_seqlen_q/k: ring attention takes no varlen "
                       "batches");
    if ((st = fa_entry_check_opts(ctx, opts))) return st;

    const int is_bwd = grads != NULL;
    /* STANDARD's backward forms D = rowsum(P ∘ dP) over the keys it is given, which is the row's D only when they
     * are all of its keys; FLASH1/FLASH2 form D = rowsum(dO ∘ O) from the final out, right on any block of keys.
     * AUTO would fall back to STANDARD where no flash kernel takes the call, so the backward asks for FLASH2. */
    if (is_bwd && opts->algo == FA_ALGO_STANDARD)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED, "opts.algo: standard cannot run the ring's backward (its softmax "
                       "gradient needs all of a row's keys at once); use flash1, flash2 or auto");
    if (is_bwd && opts->algo == FA_ALGO_AUTO) opts->algo = FA_ALGO_FLASH2;
    static const char *const names[11] = {"q",  "k",  "v",  "out", "lse",       "dout",
                                          "dq", "dk", "dv", "opts.sinks", "opts.d_sinks"};
    fa_span sp[11];
    const fa_tensor *t[4] = {q, k, v, out};
    for (int i = 0; i < 4; i++)
        if ((st = fa_entry_tensor(ctx, names[i], t[i], i == 3 && !is_bwd, &sp[i])) != FA_OK) return st;
    if ((st = fa_entry_no_fp8(ctx, "q", q, "ring attention"))) return st;
    if (v->head_dim != q->head_dim) /* its K/V blocks travel and merge as [S, H, D] of the one D */
        return fa_fail(ctx, FA_ERR_UNSUPPORTED, "v: head_dim %lld differs from q's %lld: ring attention takes one "
                       "head_dim for q, k, v and out", (long long)v->head_dim, (long long)q->head_dim);
    if ((st = fa_entry_like(ctx, "k", k, "q", q, k->heads)) || (st = fa_entry_like(ctx, "v", v, "k", k, -1)) ||
        (st = fa_entry_like(ctx, "out", out, "q", q, -1)))
        return st;
    if (q->heads % k->heads)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "k: heads = %lld does not divide q.heads = %lld (GQA/MQA)",
                       (long long)k->heads, (long long)q->heads);
    /* fa_forward takes zero extents; the ring's schedules and shards are built for rows on every rank */
    if (q->batch == 0 || q->seqlen == 0)
        return fa_fail(ctx, FA_ERR_UNSUPPORTED, "q: batch %lld x seqlen %lld: ring attention takes no empty shard",
                       (long long)q->batch, (long long)q->seqlen);
    /* sinks: [Hq] floats on the call's device, as fa_forward takes them (the ring joins them once, after its merge) */
    if ((st = fa_entry_f32(ctx, "opts.sinks", opts->sinks, 1, 1, opts->sinks ? q->heads : 0, &sp[9]))) return st;
    if (!is_bwd) opts->d_sinks = NULL; /* read by the backward only, as fa_forward ignores it */
    if (opts->causal && q->seqlen % 2)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "q: seqlen = %lld is odd: with causal, each rank's shard is two "
                       "chunks of the zigzag layout (S_local must be even)", (long long)q->seqlen);
    if (lse_required && !lse)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "lse: NULL (the backward needs the forward's LSE)");
    int n = 4;
    if (lse) {
        if ((st = fa_entry_f32(ctx, "lse", lse, q->batch, q->heads, q->seqlen, &sp[4])) ||
            (st = fa_entry_disjoint(ctx, "lse", sp[4], names, sp, is_bwd ? 3 : 4)) ||
            (!is_bwd && (st = fa_entry_disjoint(ctx, "lse", sp[4], names + 9, sp + 9, 1))))
            return st;
        n = 5;
    } else {
        sp[4].lo = sp[4].hi = 0;
    }
    if (!is_bwd) {
        if ((st = fa_entry_disjoint(ctx, "out", sp[3], names, sp, 3)) ||
            (st = fa_entry_disjoint(ctx, "out", sp[3], names + 9, sp + 9, 1)))
            return st;
    } else {
        for (int i = 0; i < 4; i++) {
            const fa_tensor *g = grads[i], *like = i < 2 ? q : k;
            if ((st = fa_entry_tensor(ctx, names[5 + i], g, i > 0, &sp[5 + i])) ||
                (st = fa_entry_like(ctx, names[5 + i], g, i < 2 ? "q" : "k", like, -1)))
                return st;
        }
        n = 9;
        for (int i = 6; i < n; i++)
            if ((st = fa_entry_disjoint(ctx, names[i], sp[i], names, sp, i)) ||
                (st = fa_entry_disjoint(ctx, names[i], sp[i], names + 9, sp + 9, 1)))
                return st;
        if (opts->d_sinks) { /* written in full (this rank's rows' share), so apart from every other argument */
            if (!opts->sinks)
                return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.d_sinks: set without opts.sinks (it receives "
                               "their gradient)");
            if ((st = fa_entry_f32(ctx, "opts.d_sinks", opts->d_sinks, 1, 1, q->heads, &sp[10])) ||
                (st = fa_entry_disjoint(ctx, "opts.d_sinks", sp[10], names, sp, 10)))
                return st;
        }
    }
    s->B = q->batch, s->S = q->seqlen, s->Hq = q->heads, s->Hk = k->heads, s->D = q->head_dim, s->dt = q->dtype;
    s->causal = opts->causal, s->is_backward = is_bwd;
    s->sinks = opts->sinks != NULL, s->d_sinks = is_bwd && opts->d_sinks;
    return FA_OK;
}

enum { AG_STATUS, AG_BACKEND, AG_B, AG_S, AG_HQ, AG_HK, AG_D, AG_DT, AG_CAUSAL, AG_BWD, AG_SINKS, AG_N };
_Static_assert(AG_N <= FA_RING_AGREE_INTS, "the agreement's buffer (ring.h)");

fa_status fa_ring_agree(fa_context *ctx, fa_ring_comm *comm, fa_status mine, const fa_ring_shape *s, const char *what) {
    const int w = comm->world, n = AG_N;
    int64_t me[AG_N] = {0};
    me[AG_STATUS] = mine;
    me[AG_BACKEND] = fa_context_backend(ctx);
    if (s) {
        me[AG_B] = s->B, me[AG_S] = s->S, me[AG_HQ] = s->Hq, me[AG_HK] = s->Hk, me[AG_D] = s->D, me[AG_DT] = s->dt;
        me[AG_CAUSAL] = s->causal, me[AG_BWD] = s->is_backward, me[AG_SINKS] = s->sinks;
    }
    int64_t *all = comm->agree;
    fa_status st = comm->tr->vt->allgather(comm->tr, ctx, me, all, n);
    if (st != FA_OK) return st;
    if (mine != FA_OK) return mine; /* with this rank's own message */
    for (int r = 0; r < w && st == FA_OK; r++) {
        const int64_t *a = all + (size_t)r * (size_t)n;
        if (a[AG_STATUS] != FA_OK)
            st = fa_fail(ctx, (fa_status)a[AG_STATUS], "ring: rank %d of %d %s (%s); nothing was written on any rank",
                         r, w, what, fa_status_string((fa_status)a[AG_STATUS]));
    }
    static const char *const field[AG_N] = {"status", "the backend", "batch", "seqlen (S_local)",
                                                          "q.heads", "k.heads", "head_dim", "dtype", "opts.causal",
                                                          "forward or backward", "opts.sinks set"};
    for (int r = 1; r < w && st == FA_OK && s; r++)
        for (int i = AG_BACKEND; i < n && st == FA_OK; i++) {
            const int64_t a = all[i], b = all[(size_t)r * (size_t)n + (size_t)i];
            if (a == b) continue;
            st = fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: %s = %lld on rank 0 but %lld on rank %d: every rank must "
                         "make the same call on shards of the same length", i == AG_S ? "q" : "ring", field[i],
                         (long long)a, (long long)b, r);
        }
    return st;
}
