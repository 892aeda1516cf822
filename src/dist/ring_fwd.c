/* The ring forward: W steps; at step s a rank attends its rows to the K/V block of rank (rank − s) mod W while the
 * next block travels from its left neighbour (double-buffered), and merges the step's (out, LSE) into an fp32
 * running state by LSE; the sinks join step 0's call only; out is rounded from the state at the end. docs/ring.md. */
#include "dist/ring.h"
#include "core/arena.h"

/* The forward's buffers, described once (a dry run sizes them). */
typedef struct fwd_ws {
    void *kv[2];  /* K then V of a block, contiguous [B, S, Hk, D] each: the one being attended, the one arriving */
    float *O, *L; /* the running state: fp32 [B, S, Hq, D] and [B, Hq, S] */
    void *o;      /* a step's out, the call's dtype, contiguous [B, nq, Hq, D] */
    float *l;     /* a step's LSE [B, Hq, nq] */
} fwd_ws;

static size_t kv_bytes(const fa_ring_shape *s) { return 2 * (size_t)(s->B * s->S * s->Hk * s->D) * fa_dtype_size(s->dt); }

static void fwd_layout(fa_arena *a, const fa_ring_shape *s, fwd_ws *w) {
    const size_t rows = (size_t)(s->B * s->S * s->Hq), es = fa_dtype_size(s->dt);
    w->kv[0] = fa_arena_take(a, kv_bytes(s), 256);
    w->kv[1] = fa_arena_take(a, kv_bytes(s), 256);
    w->O = fa_arena_take(a, rows * (size_t)s->D * sizeof(float), 256);
    w->L = fa_arena_take(a, rows * sizeof(float), 256);
    w->o = fa_arena_take(a, rows * (size_t)s->D * es, 256);
    w->l = fa_arena_take(a, rows * sizeof(float), 256);
}

/* The block's K and V inside a kv buffer. */
static void kv_views(void *kv, const fa_ring_shape *s, fa_tensor *k, fa_tensor *v) {
    *k = fa_tensor_bshd(kv, s->dt, s->B, s->S, s->Hk, s->D);
    *v = fa_tensor_bshd((char *)kv + kv_bytes(s) / 2, s->dt, s->B, s->S, s->Hk, s->D);
}

/* Step s: out_s, lse_s = attention(q rows, the block's keys), merged into the running state. */
static fa_status fwd_step(fa_context *ctx, const fa_ring_comm *comm, const fa_ring_ops *ops, fa_attn_opts *opts,
                          const fa_ring_shape *s, const fa_tensor *q, const float *sinks, void *kv, const fwd_ws *w,
                          int step) {
    const fa_ring_step st = fa_ring_step_of(comm->rank, comm->world, step, s->causal, s->S);
    fa_tensor k, v;
    kv_views(kv, s, &k, &v);
    const fa_tensor qs = fa_ring_rows(q, st.q0, st.nq), ks = fa_ring_rows(&k, 0, st.nk), vs = fa_ring_rows(&v, 0, st.nk);
    const fa_tensor os = fa_tensor_bshd(w->o, s->dt, s->B, st.nq, s->Hq, s->D);
    opts->causal = st.causal;
    /* The merge adds the steps' denominators, so a sink joins exactly one step: step 0, which has every local row
     * (q0 = 0, nq = S). Joined inside the call, before its out is rounded, it costs no rounding of its own: at
     * W = 1 out, LSE (and the backward's d sinks) are a plain fa_forward's, bit for bit. */
    opts->sinks = step == 0 ? sinks : NULL;
    fa_status rc = fa_forward(ctx, opts, &qs, &ks, &vs, &os, w->l);
    if (rc != FA_OK) return fa_ring_step_fail(ctx, rc, step, st.src, "fa_forward");
    return ops->merge(ctx, w->O, w->L, s->B, s->S, s->Hq, s->D, w->o, w->l, s->dt, st.q0, st.nq, step == 0);
}

fa_status fa_ring_forward(fa_context *ctx, fa_ring_comm *comm, const fa_attn_opts *opts_in, const fa_tensor *q,
                          const fa_tensor *k, const fa_tensor *v, const fa_tensor *out, float *lse) {
    if (!ctx) return FA_ERR_INVALID_ARGUMENT;
    fa_attn_opts opts;
    fa_ring_shape s = {0};
    fa_status rc = fa_ring_check(ctx, comm, opts_in, &opts, q, k, v, out, lse, 0, NULL, &s);
    if (!comm) return rc;
    const fa_ring_ops *ops = fa_ring_ops_of(ctx);
    fwd_ws w;
    void *base = NULL;
    if (rc == FA_OK) {
        fa_arena a = fa_arena_dry();
        fwd_layout(&a, &s, &w);
        if ((rc = fa_ring_workspace(ctx, comm, a.size, &base)) == FA_OK) {
            a = fa_arena_over(base, a.size);
            fwd_layout(&a, &s, &w);
        }
    }
    if ((rc = fa_ring_agree(ctx, comm, rc, &s, "rejected its arguments")) != FA_OK) return rc;
    const float *const sinks = opts.sinks; /* fwd_step hands them to step 0's call only */

    /* From here every rank runs every exchange, so that none waits for a neighbour that stopped; the first failure
     * is kept and agreed on at the end, before anything is written. */
    fa_ring_transport *tr = comm->tr;
    const size_t kvb = kv_bytes(&s);
    fa_tensor k0, v0;
    kv_views(w.kv[0], &s, &k0, &v0);
    fa_status err = ops->pack(ctx, k, k0.data);
    if (err == FA_OK) err = ops->pack(ctx, v, v0.data);
    for (int step = 0; step < comm->world; step++) {
        void *cur = w.kv[step % 2], *next = w.kv[(step + 1) % 2];
        const int more = step + 1 < comm->world;
        if (more) {
            const fa_ring_xfer x = {cur, next, kvb};
            const fa_status t = tr->vt->start(tr, ctx, ops, &x, 1);
            if (err == FA_OK) err = t;
        }
        if (err == FA_OK) err = fwd_step(ctx, comm, ops, &opts, &s, q, sinks, cur, &w, step);
        if (more) {
            const fa_status t = tr->vt->wait(tr, ctx, ops);
            if (err == FA_OK) err = t;
        }
    }
    if ((rc = fa_ring_agree(ctx, comm, err, NULL, "failed during the call")) != FA_OK) return rc;
    if ((rc = ops->round(ctx, w.O, out)) != FA_OK) return rc;
    if (lse) rc = ops->copy(ctx, lse, w.L, sizeof(float) * (size_t)(s.B * s.Hq * s.S));
    if (rc == FA_OK) ctx->err[0] = 0;
    return rc;
}
