#define _POSIX_C_SOURCE 200809L /* pthreads */
/* The thread transport: the ranks of a group are threads of one process. An exchange posts each rank's send
 * buffers, meets at a barrier, copies from the left neighbour's posted buffers with the context's own copy
 * (memcpy, or cudaMemcpyAsync + a stream sync), and meets again before any send buffer may change. On one GPU
 * this is the ring's loopback; it runs the same schedule as NCCL, without the overlap. */
#include "dist/ring.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct fa_ring_slot {
    fa_ring_xfer x[FA_RING_MAX_XFERS];
    int n;
    const int64_t *ints;
} fa_ring_slot;

struct fa_ring_group {
    int world;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    unsigned generation;
    fa_ring_slot *slot;
    unsigned char *taken; /* a comm exists for this rank */
};

typedef struct thread_tr {
    fa_ring_transport base;
    fa_ring_group *g;
    fa_status pending; /* the started exchange's copy status, returned by wait */
} thread_tr;

/* Every rank of the group arrives before any leaves. */
static void barrier(fa_ring_group *g) {
    pthread_mutex_lock(&g->mu);
    const unsigned gen = g->generation;
    if (++g->arrived == g->world) {
        g->arrived = 0;
        g->generation++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (gen == g->generation) pthread_cond_wait(&g->cv, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
}

fa_status fa_ring_group_create(fa_ring_group **out, int world) {
    if (!out) return fa_ring_create_fail(FA_ERR_INVALID_ARGUMENT, "g: NULL");
    *out = NULL;
    if (world < 1 || world > FA_RING_MAX_WORLD)
        return fa_ring_create_fail(FA_ERR_INVALID_ARGUMENT, "world: %d must be in 1..%d", world, FA_RING_MAX_WORLD);
    fa_ring_group *g = calloc(1, sizeof *g);
    if (g) g->slot = calloc((size_t)world, sizeof *g->slot), g->taken = calloc((size_t)world, 1);
    if (!g || !g->slot || !g->taken) {
        if (g) free(g->slot), free(g->taken);
        free(g);
        return fa_ring_create_fail(FA_ERR_OUT_OF_MEMORY, "fa_ring_group_create: out of host memory");
    }
    g->world = world;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    *out = g;
    return FA_OK;
}

void fa_ring_group_destroy(fa_ring_group *g) {
    if (!g) return;
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g->slot);
    free(g->taken);
    free(g);
}

static fa_status thread_start(fa_ring_transport *t, fa_context *ctx, const fa_ring_ops *ops, const fa_ring_xfer *x,
                              int n) {
    thread_tr *tt = (thread_tr *)t;
    fa_ring_group *g = tt->g;
    /* the send buffers were written by work queued on ctx: complete it before a neighbour reads them */
    fa_status st = ops->sync(ctx);
    fa_ring_slot *mine = &g->slot[t->rank];
    mine->n = n;
    memcpy(mine->x, x, sizeof *x * (size_t)n);
    barrier(g);
    const fa_ring_slot *left = &g->slot[(t->rank + t->world - 1) % t->world];
    if (st == FA_OK && left->n != n)
        st = fa_fail(ctx, FA_ERR_INTERNAL, "ring: rank %d exchanges %d blocks, its left neighbour %d", t->rank, n,
                     left->n);
    for (int i = 0; i < n && st == FA_OK; i++) {
        if (left->x[i].bytes != x[i].bytes)
            st = fa_fail(ctx, FA_ERR_INTERNAL, "ring: block %d is %zu bytes on rank %d, %zu on its left neighbour", i,
                         x[i].bytes, t->rank, left->x[i].bytes);
        else
            st = ops->copy(ctx, x[i].recv, left->x[i].send, x[i].bytes);
    }
    tt->pending = st;
    return FA_OK; /* the status comes with wait, after the barrier every rank must reach */
}

static fa_status thread_wait(fa_ring_transport *t, fa_context *ctx, const fa_ring_ops *ops) {
    thread_tr *tt = (thread_tr *)t;
    fa_status st = ops->sync(ctx); /* this rank's copies out of its neighbour's buffers are done */
    barrier(tt->g);                /* ... and every rank's out of this rank's */
    if (tt->pending != FA_OK) st = tt->pending;
    tt->pending = FA_OK;
    return st;
}

static fa_status thread_allgather(fa_ring_transport *t, fa_context *ctx, const int64_t *mine, int64_t *all, int n) {
    (void)ctx;
    fa_ring_group *g = ((thread_tr *)t)->g;
    g->slot[t->rank].ints = mine;
    barrier(g);
    for (int r = 0; r < t->world; r++) memcpy(all + (size_t)r * (size_t)n, g->slot[r].ints, sizeof *all * (size_t)n);
    barrier(g);
    return FA_OK;
}

static fa_status thread_check_ctx(fa_ring_transport *t, fa_context *ctx) {
    (void)t, (void)ctx;
    return FA_OK;
}

static void thread_destroy(fa_ring_transport *t) {
    thread_tr *tt = (thread_tr *)t;
    pthread_mutex_lock(&tt->g->mu);
    tt->g->taken[t->rank] = 0;
    pthread_mutex_unlock(&tt->g->mu);
    free(tt);
}

static const fa_ring_transport_vt thread_vt = {"thread", thread_start, thread_wait, thread_allgather,
                                               thread_check_ctx, thread_destroy};

fa_status fa_ring_transport_thread(fa_ring_group *g, int rank, fa_ring_transport **out) {
    if (!g) return fa_ring_create_fail(FA_ERR_INVALID_ARGUMENT, "g: NULL group");
    if (rank < 0 || rank >= g->world)
        return fa_ring_create_fail(FA_ERR_INVALID_ARGUMENT, "rank: %d is not in 0..%d", rank, g->world - 1);
    thread_tr *t = calloc(1, sizeof *t);
    if (!t) return fa_ring_create_fail(FA_ERR_OUT_OF_MEMORY, "fa_ring_comm_thread: out of host memory");
    pthread_mutex_lock(&g->mu);
    const int taken = g->taken[rank];
    g->taken[rank] = 1;
    pthread_mutex_unlock(&g->mu);
    if (taken) {
        free(t);
        return fa_ring_create_fail(FA_ERR_INVALID_ARGUMENT, "rank: %d of this group already has a comm", rank);
    }
    t->base.vt = &thread_vt;
    t->base.rank = rank;
    t->base.world = g->world;
    t->g = g;
    *out = &t->base;
    return FA_OK;
}
