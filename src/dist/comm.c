/* Ring communicators: construction over a transport, and the ring's buffers. */
#include "dist/ring.h"

#include <stdio.h>
#include <stdlib.h>

static fa_status make_comm(fa_ring_comm **c, fa_status st, fa_ring_transport *t) {
    if (st != FA_OK) return st;
    fa_ring_comm *m = calloc(1, sizeof *m);
    if (m) m->agree = calloc((size_t)t->world * FA_RING_AGREE_INTS, sizeof *m->agree);
    if (!m || !m->agree) {
        free(m);
        t->vt->destroy(t);
        return fa_ring_create_fail(FA_ERR_OUT_OF_MEMORY, "fa_ring_comm: out of host memory");
    }
    m->rank = t->rank;
    m->world = t->world;
    m->tr = t;
    *c = m;
    fa_ring_create_ok();
    return FA_OK;
}

fa_status fa_ring_comm_thread(fa_ring_comm **c, fa_ring_group *g, int rank) {
    if (!c) return fa_ring_create_fail(FA_ERR_INVALID_ARGUMENT, "c: NULL");
    *c = NULL;
    fa_ring_transport *t = NULL;
    const fa_status st = fa_ring_transport_thread(g, rank, &t);
    return make_comm(c, st, t);
}

fa_status fa_ring_comm_nccl(fa_ring_comm **c, void *nccl_comm, void *side_stream) {
    if (!c) return fa_ring_create_fail(FA_ERR_INVALID_ARGUMENT, "c: NULL");
    *c = NULL;
    if (!nccl_comm) return fa_ring_create_fail(FA_ERR_INVALID_ARGUMENT, "nccl_comm: NULL");
    fa_ring_transport *t = NULL;
    const fa_status st = fa_ring_transport_nccl(nccl_comm, side_stream, &t);
    return make_comm(c, st, t);
}

void fa_ring_comm_destroy(fa_ring_comm *c) {
    if (!c) return;
    if (c->ws) c->ws_ops->release(c->ws, c->ws_device);
    c->tr->vt->destroy(c->tr);
    free(c->agree);
    free(c);
}

int fa_ring_comm_rank(const fa_ring_comm *c) { return c ? c->rank : -1; }
int fa_ring_comm_world(const fa_ring_comm *c) { return c ? c->world : -1; }
const char *fa_ring_comm_transport(const fa_ring_comm *c) { return c ? c->tr->vt->name : "?"; }

const fa_ring_ops *fa_ring_ops_of(const fa_context *ctx) {
    return fa_context_backend(ctx) == FA_BACKEND_CUDA ? fa_ring_ops_cuda() : fa_ring_ops_cpu();
}

fa_status fa_ring_workspace(fa_context *ctx, fa_ring_comm *comm, size_t bytes, void **ws) {
    const fa_ring_ops *ops = fa_ring_ops_of(ctx);
    const int cuda = fa_context_backend(ctx) == FA_BACKEND_CUDA, device = cuda ? fa_context_threads(ctx) : -1;
    if (comm->ws && (comm->ws_size < bytes || comm->ws_cuda != cuda || comm->ws_device != device)) {
        /* a neighbour may still read this buffer only until the wait of the exchange that posted it: over by now */
        fa_status st = ops->sync(ctx);
        if (st != FA_OK) return st;
        comm->ws_ops->release(comm->ws, comm->ws_device);
        comm->ws = NULL;
        comm->ws_size = 0;
    }
    if (!comm->ws) {
        fa_status st = ops->alloc(ctx, bytes, &comm->ws);
        if (st != FA_OK) return st;
        comm->ws_size = bytes;
        comm->ws_cuda = cuda;
        comm->ws_device = device;
        comm->ws_ops = ops;
    }
    *ws = comm->ws;
    return FA_OK;
}

fa_status fa_ring_step_fail(fa_context *ctx, fa_status st, int s, int src, const char *what) {
    char why[FA_ERR_LEN];
    snprintf(why, sizeof why, "%s", fa_context_last_error(ctx));
    return fa_fail(ctx, st, "ring step %d (%s on the block of rank %d): %s", s, what, src, why);
}
