/* The transport seam of the ring: how a rank sends blocks to rank + 1 and receives them from rank − 1, and how the
 * ranks compare a few integers. The schedules (ring_fwd.c, ring_bwd.c) see only this; the thread transport
 * (transport_thread.c) and the NCCL transport (transport_nccl.cu) implement it. */
#ifndef FA_DIST_TRANSPORT_H
#define FA_DIST_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

struct fa_ring_ops;

/* One block of a step's exchange: send (read until the exchange's wait) goes to rank + 1, recv (written by then)
 * comes from rank − 1; the same bytes on every rank. */
typedef struct fa_ring_xfer {
    const void *send;
    void *recv;
    size_t bytes;
} fa_ring_xfer;

#define FA_RING_MAX_XFERS 2

typedef struct fa_ring_transport fa_ring_transport;
typedef struct fa_ring_transport_vt {
    const char *name;
    /* Start one exchange of n (1..FA_RING_MAX_XFERS) blocks, ordered after the work already queued on ctx. */
    fa_status (*start)(fa_ring_transport *t, fa_context *ctx, const struct fa_ring_ops *ops, const fa_ring_xfer *x,
                       int n);
    /* Work queued on ctx after this sees the exchange's recv buffers complete, and the send buffers may be reused. */
    fa_status (*wait)(fa_ring_transport *t, fa_context *ctx, const struct fa_ring_ops *ops);
    /* all[r·n + i] := rank r's mine[i] on every rank (host memory; returns when all is filled). Needs no context:
     * a rank whose context is unusable still takes part. */
    fa_status (*allgather)(fa_ring_transport *t, fa_context *ctx, const int64_t *mine, int64_t *all, int n);
    /* FA_OK if ctx can use this transport (NCCL: a CUDA context on the communicator's device). */
    fa_status (*check_ctx)(fa_ring_transport *t, fa_context *ctx);
    void (*destroy)(fa_ring_transport *t);
} fa_ring_transport_vt;

struct fa_ring_transport {
    const fa_ring_transport_vt *vt;
    int rank, world;
};

#define FA_RING_MAX_WORLD 1024

/* The constructors; on failure the message is the thread's constructor message (fa_ring_create_error). */
typedef struct fa_ring_group fa_ring_group;
fa_status fa_ring_transport_thread(fa_ring_group *g, int rank, fa_ring_transport **t);
fa_status fa_ring_transport_nccl(void *nccl_comm, void *side_stream, fa_ring_transport **t);

#ifdef __cplusplus
}
#endif

#endif
