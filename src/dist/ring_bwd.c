/* The ring backward: K/V rotate as in the forward, and each block's fp32 dK/dV accumulators travel with it, one
 * step behind: at step s a rank computes the gradients of its rows against the block it holds (fa_backward with the
 * FINAL out and LSE rows: P = exp(S − LSE) is already the whole sequence's softmax), adds dQ to its own fp32 dQ and
 * dK/dV to the block's accumulators, which arrive from the left neighbour during the step. A last hop returns
 * every block's dK/dV to its owner; each gradient is rounded once. With sinks, the LSE holds them, so dq, dk, dv
 * need nothing new; d sinks comes from this rank's rows' final out and LSE, once (step 0). docs/ring.md. */
#include "dist/ring.h"
#include "core/arena.h"

typedef struct bwd_ws {
    void *kv[2];     /* K then V of a block (the call's dtype): the one being used, the one arriving */
    float *dkv[2];   /* dK then dV of a block (fp32): the one being sent on, the one arriving and accumulated */
    float *dQ;       /* fp32 [B, S, Hq, D] */
    void *dq, *dk, *dv; /* a step's gradients in the call's dtype, contiguous */
    float *lse2;     /* causal: the LSE of the second chunk's rows, [B, Hq, S / 2] */
    float *ds;       /* with opts.d_sinks: d sinks [Hq], copied out once every rank has succeeded */
} bwd_ws;

static size_t block_elems(const fa_ring_shape *s) { return (size_t)(s->B * s->S * s->Hk * s->D); }

static void bwd_layout(fa_arena *a, const fa_ring_shape *s, bwd_ws *w) {
    const size_t es = fa_dtype_size(s->dt), nq = (size_t)(s->B * s->S * s->Hq * s->D), nk = block_elems(s);
    for (int i = 0; i < 2; i++) w->kv[i] = fa_arena_take(a, 2 * nk * es, 256);
    for (int i = 0; i < 2; i++) w->dkv[i] = fa_arena_take(a, 2 * nk * sizeof(float), 256);
    w->dQ = fa_arena_take(a, nq * sizeof(float), 256);
    w->dq = fa_arena_take(a, nq * es, 256);
    w->dk = fa_arena_take(a, nk * es, 256);
    w->dv = fa_arena_take(a, nk * es, 256);
    w->lse2 = s->causal ? fa_arena_take(a, (size_t)(s->B * s->Hq * (s->S / 2)) * sizeof(float), 256) : NULL;
    w->ds = s->d_sinks ? fa_arena_take(a, (size_t)s->Hq * sizeof(float), 256) : NULL;
}

typedef struct bwd_args {
    const fa_tensor *q, *out, *dout;
    const float *lse;
    const float *sinks; /* with opts.d_sinks: the sinks, else NULL */
} bwd_args;

/* Step s: the gradients of this rank's rows against the block in kv, added to dQ and to the block's dkv. */
static fa_status bwd_step(fa_context *ctx, const fa_ring_comm *comm, const fa_ring_ops *ops, fa_attn_opts *opts,
                          const fa_ring_shape *s, const bwd_args *in, void *kv, const bwd_ws *w,
                          int step) {
    const fa_ring_step st = fa_ring_step_of(comm->rank, comm->world, step, s->causal, s->S);
    const size_t nk = block_elems(s);
    const fa_tensor k = fa_tensor_bshd(kv, s->dt, s->B, s->S, s->Hk, s->D);
    const fa_tensor v = fa_tensor_bshd((char *)kv + nk * fa_dtype_size(s->dt), s->dt, s->B, s->S, s->Hk, s->D);
    const fa_tensor qs = fa_ring_rows(in->q, st.q0, st.nq), os = fa_ring_rows(in->out, st.q0, st.nq),
                    dos = fa_ring_rows(in->dout, st.q0, st.nq), ks = fa_ring_rows(&k, 0, st.nk),
                    vs = fa_ring_rows(&v, 0, st.nk);
    const fa_tensor dq = fa_tensor_bshd(w->dq, s->dt, s->B, st.nq, s->Hq, s->D),
                    dk = fa_tensor_bshd(w->dk, s->dt, s->B, st.nk, s->Hk, s->D),
                    dv = fa_tensor_bshd(w->dv, s->dt, s->B, st.nk, s->Hk, s->D);
    const float *lse = st.q0 ? w->lse2 : in->lse;
    opts->causal = st.causal;
    /* d sinks = −Σ_i e^(sink − LSE_i) rowsum(dO_i ∘ O_i) needs each row once, with the final out and LSE: step 0
     * has all of this rank's rows (q0 = 0, nq = S); the other steps run without sinks (P = e^(S − LSE) as is) */
    opts->sinks = step == 0 ? in->sinks : NULL;
    opts->d_sinks = step == 0 ? w->ds : NULL;
    fa_status rc = fa_backward(ctx, opts, &qs, &ks, &vs, &os, lse, &dos, &dq, &dk, &dv);
    if (rc != FA_OK) return fa_ring_step_fail(ctx, rc, step, st.src, "fa_backward");
    return ops->accum(ctx, w->dQ, s->B, s->S, s->Hq, s->D, w->dq, s->dt, st.q0, st.nq);
}

/* The step's dK/dV into the block's accumulators (after they arrived). */
static fa_status bwd_step_kv(fa_context *ctx, const fa_ring_comm *comm, const fa_ring_ops *ops,
                             const fa_ring_shape *s, float *dkv, const bwd_ws *w, int step) {
    const fa_ring_step st = fa_ring_step_of(comm->rank, comm->world, step, s->causal, s->S);
    fa_status rc = ops->accum(ctx, dkv, s->B, s->S, s->Hk, s->D, w->dk, s->dt, 0, st.nk);
    if (rc == FA_OK) rc = ops->accum(ctx, dkv + block_elems(s), s->B, s->S, s->Hk, s->D, w->dv, s->dt, 0, st.nk);
    return rc;
}

fa_status fa_ring_backward(fa_context *ctx, fa_ring_comm *comm, const fa_attn_opts *opts_in, const fa_tensor *q,
                           const fa_tensor *k, const fa_tensor *v, const fa_tensor *out, const float *lse,
                           const fa_tensor *dout, const fa_tensor *dq, const fa_tensor *dk, const fa_tensor *dv) {
    if (!ctx) return FA_ERR_INVALID_ARGUMENT;
    fa_attn_opts opts;
    fa_ring_shape s = {0};
    const fa_tensor *grads[4] = {dout, dq, dk, dv};
    fa_status rc = fa_ring_check(ctx, comm, opts_in, &opts, q, k, v, out, lse, 1, grads, &s);
    if (!comm) return rc;
    const fa_ring_ops *ops = fa_ring_ops_of(ctx);
    bwd_ws w;
    void *base = NULL;
    if (rc == FA_OK) {
        fa_arena a = fa_arena_dry();
        bwd_layout(&a, &s, &w);
        if ((rc = fa_ring_workspace(ctx, comm, a.size, &base)) == FA_OK) {
            a = fa_arena_over(base, a.size);
            bwd_layout(&a, &s, &w);
        }
    }
    if ((rc = fa_ring_agree(ctx, comm, rc, &s, "rejected its arguments")) != FA_OK) return rc;

    /* As in the forward: every rank runs every exchange; the first failure is agreed on before anything is written. */
    fa_ring_transport *tr = comm->tr;
    const int W = comm->world;
    const size_t nk = block_elems(&s), kvb = 2 * nk * fa_dtype_size(s.dt), dkvb = 2 * nk * sizeof(float);
    const bwd_args in = {q, out, dout, lse, s.d_sinks ? opts.sinks : NULL};
    float *const d_sinks = opts.d_sinks; /* the steps' opts take the workspace's instead */
    fa_status err = ops->pack(ctx, k, w.kv[0]);
    if (err == FA_OK) err = ops->pack(ctx, v, (char *)w.kv[0] + kvb / 2);
    if (err == FA_OK) err = ops->zero(ctx, w.dkv[0], dkvb);
    if (err == FA_OK) err = ops->zero(ctx, w.dQ, sizeof(float) * (size_t)(s.B * s.S * s.Hq * s.D));
    if (err == FA_OK && s.causal) err = ops->lse_rows(ctx, w.lse2, lse, s.B * s.Hq, s.S, s.S / 2, s.S / 2);
    for (int step = 0; step < W; step++) {
        /* this step: K/V of the next block arrive; the previous block's dK/dV (finished last step) leave, and
         * this block's (finished by the left neighbour) arrive into dkv[step % 2] */
        fa_ring_xfer x[2];
        int n = 0;
        if (step + 1 < W) x[n++] = (fa_ring_xfer){w.kv[step % 2], w.kv[(step + 1) % 2], kvb};
        if (step > 0) x[n++] = (fa_ring_xfer){w.dkv[(step + 1) % 2], w.dkv[step % 2], dkvb};
        if (n) {
            const fa_status t = tr->vt->start(tr, ctx, ops, x, n);
            if (err == FA_OK) err = t;
        }
        if (err == FA_OK) err = bwd_step(ctx, comm, ops, &opts, &s, &in, w.kv[step % 2], &w, step);
        if (n) {
            const fa_status t = tr->vt->wait(tr, ctx, ops);
            if (err == FA_OK) err = t;
        }
        if (err == FA_OK) err = bwd_step_kv(ctx, comm, ops, &s, w.dkv[step % 2], &w, step);
    }
    /* the last block's dK/dV is rank + 1's: one more hop brings each rank its own */
    int own = 0;
    if (W > 1) {
        const fa_ring_xfer x = {w.dkv[(W - 1) % 2], w.dkv[W % 2], dkvb};
        fa_status t = tr->vt->start(tr, ctx, ops, &x, 1);
        if (t == FA_OK) t = tr->vt->wait(tr, ctx, ops);
        else (void)tr->vt->wait(tr, ctx, ops);
        if (err == FA_OK) err = t;
        own = W % 2;
    }
    if ((rc = fa_ring_agree(ctx, comm, err, NULL, "failed during the call")) != FA_OK) return rc;
    if ((rc = ops->round(ctx, w.dQ, dq)) == FA_OK && (rc = ops->round(ctx, w.dkv[own], dk)) == FA_OK)
        rc = ops->round(ctx, w.dkv[own] + nk, dv);
    if (rc == FA_OK && s.d_sinks) rc = ops->copy(ctx, d_sinks, w.ds, sizeof(float) * (size_t)s.Hq);
    if (rc == FA_OK) ctx->err[0] = 0;
    return rc;
}
