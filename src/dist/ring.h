/* Ring attention, internal: the comm, the element operations a schedule needs on each backend (ops), the
 * argument checks and the ranks' agreement. The schedules are ring_fwd.c and ring_bwd.c; the transports are
 * behind transport.h. docs/ring.md describes the whole design. */
#ifndef FA_DIST_RING_H
#define FA_DIST_RING_H

#ifdef __cplusplus
extern "C" {
#endif

#include "core/internal.h"
#include "flashattn_ring.h"
#include "dist/transport.h"

/* Element operations on a context's memory (host for CPU, device for CUDA, queued on the context's stream).
 * Buffers named "contiguous" are [B, S, H, D] (or [B, H, S] for LSE) with no padding. */
typedef struct fa_ring_ops {
    fa_status (*alloc)(fa_context *ctx, size_t bytes, void **p);
    void (*release)(void *p, int device);
    fa_status (*zero)(fa_context *ctx, void *p, size_t bytes);
    fa_status (*copy)(fa_context *ctx, void *dst, const void *src, size_t bytes); /* any memory to any memory */
    fa_status (*sync)(fa_context *ctx);                                           /* the context's work is done */
    /* src (any strides) -> dst contiguous, same dtype */
    fa_status (*pack)(fa_context *ctx, const fa_tensor *src, void *dst);
    /* Running state (O fp32 [B, S, H, D], L fp32 [B, H, S]) rows [row0, row0 + n) merged with a block's result
     * (o dtype contiguous [B, n, H, D], l [B, H, n]) by LSE; first: the state := the block's (n = S). */
    fa_status (*merge)(fa_context *ctx, float *O, float *L, int64_t B, int64_t S, int64_t H, int64_t D,
                       const void *o, const float *l, fa_dtype dt, int64_t row0, int64_t n, int first);
    /* acc fp32 [B, S, H, D] rows [row0, row0 + n) += x (dtype contiguous [B, n, H, D]) */
    fa_status (*accum)(fa_context *ctx, float *acc, int64_t B, int64_t S, int64_t H, int64_t D, const void *x,
                       fa_dtype dt, int64_t row0, int64_t n);
    /* src fp32 contiguous -> dst (any strides, its dtype), rounded once */
    fa_status (*round)(fa_context *ctx, const float *src, const fa_tensor *dst);
    /* dst [BH, n] := src [BH, S] columns [row0, row0 + n) */
    fa_status (*lse_rows)(fa_context *ctx, float *dst, const float *src, int64_t BH, int64_t S, int64_t row0,
                          int64_t n);
} fa_ring_ops;

FA_HIDDEN const fa_ring_ops *fa_ring_ops_cpu(void);
/* NULL in a build without CUDA (no CUDA context can exist there). */
FA_HIDDEN const fa_ring_ops *fa_ring_ops_cuda(void);

struct fa_ring_comm {
    int rank, world;
    fa_ring_transport *tr;
    /* the ring's buffers, grown never shrunk, on the backend (and device) of the context that grew them */
    void *ws;
    size_t ws_size;
    int ws_cuda, ws_device;
    const fa_ring_ops *ws_ops;
    int64_t *agree; /* world x FA_RING_AGREE_INTS: the ranks' agreement (check.c) */
};
#define FA_RING_AGREE_INTS 16

/* The ops of ctx's backend. */
FA_HIDDEN const fa_ring_ops *fa_ring_ops_of(const fa_context *ctx);
/* comm's buffers for ctx, at least bytes (an allocation, after a sync, when it grows). */
FA_HIDDEN fa_status fa_ring_workspace(fa_context *ctx, fa_ring_comm *comm, size_t bytes, void **ws);
/* Set the thread's constructor message and return status; clear it after a constructor succeeded. (create_error.c) */
FA_HIDDEN fa_status fa_ring_create_fail(fa_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
FA_HIDDEN void fa_ring_create_ok(void);

/* What rank `rank` computes at step s of a ring of `world` ranks over shards of S rows: it holds the K/V block
 * of rank src and attends its query rows [q0, q0 + nq) to the block's keys [0, nk), causal or not. Causal uses
 * the zigzag layout (flashattn_ring.h): step 0 is the local causal block; a block from a lower rank is seen by
 * every local row in its first chunk only; a block from a higher rank is seen whole by the second chunk only. */
typedef struct fa_ring_step {
    int src, causal;
    int64_t q0, nq, nk;
} fa_ring_step;

static inline fa_ring_step fa_ring_step_of(int rank, int world, int s, int causal, int64_t S) {
    fa_ring_step st = {(rank - s + world) % world, 0, 0, S, S};
    if (!causal) return st;
    if (s == 0) st.causal = 1;
    else if (st.src < rank) st.nk = S / 2;
    else st.q0 = S / 2, st.nq = S / 2;
    return st;
}

/* Rows [r0, r0 + n) of a tensor: the same strides. */
static inline fa_tensor fa_ring_rows(const fa_tensor *t, int64_t r0, int64_t n) {
    fa_tensor v = *t;
    v.data = (char *)t->data + r0 * t->stride_seq * (int64_t)fa_dtype_size(t->dtype);
    v.seqlen = n;
    return v;
}

/* A step's failure as the call's message: the step and the block named before the inner call's reason. */
FA_HIDDEN fa_status fa_ring_step_fail(fa_context *ctx, fa_status st, int s, int src, const char *what);

/* A call's shapes, as the ranks compare them. */
typedef struct fa_ring_shape {
    int64_t B, S, Hq, Hk, D;
    fa_dtype dt;
    int causal, is_backward;
    int sinks;   /* opts.sinks set (the ranks agree on it) */
    int d_sinks; /* the backward writes opts.d_sinks */
} fa_ring_shape;

/* This rank's argument checks (the rules of fa_forward / fa_backward on the local shapes, opts.sinks and
 * opts.d_sinks included, plus the ring's own: equal q/k lengths, even S_local with causal, no window, no varlen).
 * Fills *s; the message is on ctx.
 * grads NULL for the forward; else dout, dq, dk, dv. */
FA_HIDDEN fa_status fa_ring_check(fa_context *ctx, const fa_ring_comm *comm, const fa_attn_opts *opts_in,
                                  fa_attn_opts *opts, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                                  const fa_tensor *out, const float *lse, int lse_required,
                                  const fa_tensor *const *grads, fa_ring_shape *s);
/* The ranks' agreement: every rank passes its own status (and shape); returns FA_OK on every rank only if every
 * rank passed FA_OK with the same shape, else the same failing status on every rank (the message on ctx names the
 * rank and the reason; a rank keeps its own message when it is the one that failed). A transport failure is
 * returned as such. */
FA_HIDDEN fa_status fa_ring_agree(fa_context *ctx, fa_ring_comm *comm, fa_status mine, const fa_ring_shape *s,
                                  const char *what);

#ifdef __cplusplus
}
#endif
#endif
