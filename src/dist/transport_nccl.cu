/* The NCCL transport: an exchange is ncclSend to rank + 1 and ncclRecv from rank − 1 in one group on the side
 * stream, after an event from the context's stream (the send buffers are written, the receive buffers free), and
 * the context's stream waits on an event recorded after it: the attention of the step overlaps the transfer and
 * the host never waits. The agreement's all-gather is the one host sync.
 * NCCL is loaded at run time by the first NCCL comm, never linked: a libflashattn that needs libnccl.so.2 made
 * every process that loads it load the system's NCCL first, and a PyTorch loaded after it bound to that older
 * library ("libtorch_cuda.so: undefined symbol: ncclCommResume"). dlopen of the soname returns the NCCL already in
 * the process when there is one — the one the caller's communicator comes from — else the loader's. nccl.h gives
 * the types; only the nine functions below are looked up. */
#include "cuda/state.h"
#include "dist/ring.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* The functions of NCCL the transport calls (ncclSend/ncclRecv: NCCL >= 2.7), typed by nccl.h. */
typedef struct nccl_api {
    decltype(&ncclGroupStart) group_start;
    decltype(&ncclGroupEnd) group_end;
    decltype(&ncclSend) send;
    decltype(&ncclRecv) recv;
    decltype(&ncclAllGather) all_gather;
    decltype(&ncclGetErrorString) error_string;
    decltype(&ncclCommUserRank) user_rank;
    decltype(&ncclCommCount) count;
    decltype(&ncclCommCuDevice) cu_device;
} nccl_api;

/* Loaded once per process (a process has one NCCL, as it has one CUDA driver): the table, or why not. */
static nccl_api g_nccl;
static int g_nccl_ok;
static char g_nccl_err[256];
static pthread_once_t g_nccl_once = PTHREAD_ONCE_INIT;

static void nccl_load(void) {
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        snprintf(g_nccl_err, sizeof g_nccl_err, "libnccl.so.2 could not be loaded (%s)", why ? why : "?");
        return;
    }
    void **slots[] = {(void **)&g_nccl.group_start, (void **)&g_nccl.group_end, (void **)&g_nccl.send,
                      (void **)&g_nccl.recv, (void **)&g_nccl.all_gather, (void **)&g_nccl.error_string,
                      (void **)&g_nccl.user_rank, (void **)&g_nccl.count, (void **)&g_nccl.cu_device};
    static const char *const names[] = {"ncclGroupStart", "ncclGroupEnd", "ncclSend", "ncclRecv", "ncclAllGather",
                                        "ncclGetErrorString", "ncclCommUserRank", "ncclCommCount",
                                        "ncclCommCuDevice"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(*slots[i] = dlsym(h, names[i]))) {
            snprintf(g_nccl_err, sizeof g_nccl_err, "libnccl.so.2 has no %s (NCCL 2.7 or later is needed)", names[i]);
            return; /* the handle stays open: NCCL stays loaded in the process either way */
        }
    g_nccl_ok = 1;
}

/* The table, or NULL with the reason in g_nccl_err. */
static const nccl_api *nccl(void) {
    pthread_once(&g_nccl_once, nccl_load);
    return g_nccl_ok ? &g_nccl : NULL;
}

typedef struct nccl_tr {
    fa_ring_transport base;
    const nccl_api *api;
    ncclComm_t comm;
    int device;
    cudaStream_t side;
    int owns_side;
    cudaEvent_t ready, done;
    int64_t *dev_ints; /* the all-gather's device buffer: (world + 1) x FA_RING_AGREE_INTS */
} nccl_tr;

#define NCCL_FAIL(ctx, nt, call, r)                                                                                \
    fa_fail(ctx, FA_ERR_DEVICE, "ring: %s: %s", call, (nt)->api->error_string(r))
#define CUDA_FAIL(ctx, call, e) fa_fail(ctx, FA_ERR_DEVICE, "ring: %s: %s", call, cudaGetErrorString(e))

typedef struct on_dev {
    int prev, dev;
} on_dev;
static on_dev enter(int dev) {
    on_dev d = {dev, dev};
    if (cudaGetDevice(&d.prev) != cudaSuccess) d.prev = dev;
    if (d.prev != dev) cudaSetDevice(dev);
    return d;
}
static void leave(on_dev d) {
    if (d.prev != d.dev) cudaSetDevice(d.prev);
}

static fa_status nccl_start(fa_ring_transport *t, fa_context *ctx, const fa_ring_ops *ops, const fa_ring_xfer *x,
                            int n) {
    (void)ops;
    nccl_tr *nt = (nccl_tr *)t;
    on_dev d = enter(nt->device);
    cudaError_t e = cudaEventRecord(nt->ready, fa_cuda_stream_of(ctx));
    if (e == cudaSuccess) e = cudaStreamWaitEvent(nt->side, nt->ready, 0);
    if (e != cudaSuccess) {
        leave(d);
        return CUDA_FAIL(ctx, "ordering the exchange after the context's stream", e);
    }
    const int right = (t->rank + 1) % t->world, left = (t->rank + t->world - 1) % t->world;
    const nccl_api *api = nt->api;
    ncclResult_t r = api->group_start();
    for (int i = 0; i < n && r == ncclSuccess; i++) {
        r = api->send(x[i].send, x[i].bytes, ncclUint8, right, nt->comm, nt->side);
        if (r == ncclSuccess) r = api->recv(x[i].recv, x[i].bytes, ncclUint8, left, nt->comm, nt->side);
    }
    const ncclResult_t r2 = api->group_end();
    if (r == ncclSuccess) r = r2;
    if (r != ncclSuccess) {
        leave(d);
        return NCCL_FAIL(ctx, nt, "ncclSend/ncclRecv", r);
    }
    e = cudaEventRecord(nt->done, nt->side);
    leave(d);
    return e == cudaSuccess ? FA_OK : CUDA_FAIL(ctx, "cudaEventRecord", e);
}

static fa_status nccl_wait(fa_ring_transport *t, fa_context *ctx, const fa_ring_ops *ops) {
    (void)ops;
    nccl_tr *nt = (nccl_tr *)t;
    on_dev d = enter(nt->device);
    const cudaError_t e = cudaStreamWaitEvent(fa_cuda_stream_of(ctx), nt->done, 0);
    leave(d);
    return e == cudaSuccess ? FA_OK : CUDA_FAIL(ctx, "cudaStreamWaitEvent", e);
}

static fa_status nccl_allgather(fa_ring_transport *t, fa_context *ctx, const int64_t *mine, int64_t *all, int n) {
    nccl_tr *nt = (nccl_tr *)t;
    on_dev d = enter(nt->device);
    int64_t *mine_d = nt->dev_ints, *all_d = nt->dev_ints + FA_RING_AGREE_INTS;
    const size_t b = sizeof(int64_t) * (size_t)n;
    cudaError_t e = cudaMemcpyAsync(mine_d, mine, b, cudaMemcpyHostToDevice, nt->side);
    ncclResult_t r = ncclSuccess;
    if (e == cudaSuccess) r = nt->api->all_gather(mine_d, all_d, (size_t)n, ncclInt64, nt->comm, nt->side);
    if (e == cudaSuccess && r == ncclSuccess)
        e = cudaMemcpyAsync(all, all_d, b * (size_t)t->world, cudaMemcpyDeviceToHost, nt->side);
    if (e == cudaSuccess && r == ncclSuccess) e = cudaStreamSynchronize(nt->side);
    leave(d);
    if (r != ncclSuccess) return NCCL_FAIL(ctx, nt, "ncclAllGather", r);
    return e == cudaSuccess ? FA_OK : CUDA_FAIL(ctx, "the agreement's copies", e);
}

static fa_status nccl_check_ctx(fa_ring_transport *t, fa_context *ctx) {
    const nccl_tr *nt = (const nccl_tr *)t;
    if (fa_context_backend(ctx) != FA_BACKEND_CUDA)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "ctx: a %s context; the NCCL transport needs a CUDA context",
                       fa_backend_name(fa_context_backend(ctx)));
    if (fa_context_threads(ctx) != nt->device)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "ctx: CUDA device %d, but the NCCL communicator's is %d",
                       fa_context_threads(ctx), nt->device);
    return FA_OK;
}

static void nccl_destroy(fa_ring_transport *t) {
    nccl_tr *nt = (nccl_tr *)t;
    on_dev d = enter(nt->device);
    cudaStreamSynchronize(nt->side);
    if (nt->owns_side) cudaStreamDestroy(nt->side);
    if (nt->ready) cudaEventDestroy(nt->ready);
    if (nt->done) cudaEventDestroy(nt->done);
    if (nt->dev_ints) cudaFree(nt->dev_ints);
    (void)cudaGetLastError();
    leave(d);
    free(nt);
}

static const fa_ring_transport_vt nccl_vt = {"nccl", nccl_start, nccl_wait, nccl_allgather, nccl_check_ctx,
                                             nccl_destroy};

extern "C" fa_status fa_ring_transport_nccl(void *nccl_comm, void *side_stream, fa_ring_transport **out) {
    const nccl_api *api = nccl();
    if (!api)
        return fa_ring_create_fail(FA_ERR_BACKEND_UNAVAILABLE, "fa_ring_comm_nccl: %s: the NCCL transport loads NCCL "
                                   "at run time (put libnccl.so.2 on the loader's path, or load it first)",
                                   g_nccl_err);
    ncclComm_t comm = (ncclComm_t)nccl_comm;
    int rank = 0, world = 0, device = 0;
    ncclResult_t r = api->user_rank(comm, &rank);
    if (r == ncclSuccess) r = api->count(comm, &world);
    if (r == ncclSuccess) r = api->cu_device(comm, &device);
    if (r != ncclSuccess)
        return fa_ring_create_fail(FA_ERR_DEVICE, "fa_ring_comm_nccl: querying the communicator: %s",
                                   api->error_string(r));
    if (world > FA_RING_MAX_WORLD)
        return fa_ring_create_fail(FA_ERR_UNSUPPORTED, "nccl_comm: %d ranks, above the ring's %d", world,
                                   FA_RING_MAX_WORLD);
    nccl_tr *t = (nccl_tr *)calloc(1, sizeof *t);
    if (!t) return fa_ring_create_fail(FA_ERR_OUT_OF_MEMORY, "fa_ring_comm_nccl: out of host memory");
    t->base.vt = &nccl_vt;
    t->base.rank = rank;
    t->base.world = world;
    t->api = api;
    t->comm = comm;
    t->device = device;
    on_dev d = enter(device);
    cudaError_t e = cudaSuccess;
    if (side_stream) t->side = (cudaStream_t)side_stream;
    else if ((e = cudaStreamCreateWithFlags(&t->side, cudaStreamNonBlocking)) == cudaSuccess) t->owns_side = 1;
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&t->ready, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&t->done, cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&t->dev_ints, sizeof(int64_t) * FA_RING_AGREE_INTS * (size_t)(world + 1));
    leave(d);
    if (e != cudaSuccess) {
        nccl_destroy(&t->base);
        return fa_ring_create_fail(FA_ERR_DEVICE, "fa_ring_comm_nccl: %s", cudaGetErrorString(e));
    }
    *out = &t->base;
    return FA_OK;
}
