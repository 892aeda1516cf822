/* Ring attention over NCCL on W GPUs of one host (default 2), one thread per GPU: time per call of fa_ring_forward
 * and of forward + backward, the efficiency against W x the one-GPU rate (T_1 / (W · T_ring), T_1 = fa_forward /
 * fa_backward on the whole sequence on GPU 0), and the two terms of docs/ring.md's model, measured apart: the
 * attention of one step's block on one GPU (the causal diagonal block of step 0 and a half block of the others) and
 * one step's exchange of K/V (+ dK/dV for the backward) between the GPUs with ncclSend/ncclRecv. Median of REPS after
 * a warm-up. Benchmark only (scripts/bench-ring.sh); sets NCCL_NVLS_ENABLE=0 before NCCL starts.
 * Usage: bench_ring [world] [seqlens, e.g. 32768,65536,131072] [heads] [head_dim] [causal 0|1] [reps] */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "../cuda_check.h"
#include "flashattn_ring.h"

#define MAX_W 8
#define FA(ctx, x)                                                                                             \
    do {                                                                                                       \
        fa_status s_ = (x);                                                                                    \
        if (s_ != FA_OK) {                                                                                     \
            fprintf(stderr, "%s: %s: %s\n", #x, fa_status_string(s_), fa_context_last_error(ctx));            \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static int cmpd(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, cmpd);
    return x[n / 2];
}

/* bf16 buffers of n elements, N(0,1)-ish: the values do not change the time */
static void *dev_rand(size_t n, unsigned seed) {
    unsigned short *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        const float f = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 3.0f;
        unsigned u;
        memcpy(&u, &f, 4);
        h[i] = (unsigned short)(u >> 16);
    }
    void *d;
    CK(cudaMalloc(&d, n * 2));
    CK(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

typedef struct cfg {
    int W, H, D, causal, reps;
    int64_t S;
} cfg;

/* One rank: its shards, context and comm; the threads meet at a barrier around every timed call. */
typedef struct rank_t {
    int r;
    const cfg *c;
    fa_context *ctx;
    fa_ring_comm *comm;
    cudaStream_t st;
    fa_tensor q, k, v, o, dout, dq, dk, dv;
    float *lse;
    double *t_fwd, *t_fb; /* rank 0: per rep */
} rank_t;

static pthread_barrier_t bar;

static void *rank_main(void *arg) {
    rank_t *x = arg;
    CK(cudaSetDevice(x->r));
    fa_attn_opts opts = fa_attn_opts_default();
    opts.causal = x->c->causal;
    for (int rep = -2; rep < x->c->reps; rep++) {
        for (int fb = 0; fb < 2; fb++) {
            pthread_barrier_wait(&bar);
            const double t0 = now_s();
            FA(x->ctx, fa_ring_forward(x->ctx, x->comm, &opts, &x->q, &x->k, &x->v, &x->o, x->lse));
            if (fb)
                FA(x->ctx, fa_ring_backward(x->ctx, x->comm, &opts, &x->q, &x->k, &x->v, &x->o, x->lse, &x->dout,
                                            &x->dq, &x->dk, &x->dv));
            CK(cudaStreamSynchronize(x->st));
            pthread_barrier_wait(&bar);
            if (x->r == 0 && rep >= 0) (fb ? x->t_fb : x->t_fwd)[rep] = now_s() - t0;
        }
    }
    return NULL;
}

/* Median ms of `reps` runs of fa_forward (and fa_backward with bwd) of q rows sq against sk keys on GPU 0. */
static double one_gpu_ms(fa_context *ctx, cudaStream_t st, int64_t sq, int64_t sk, int H, int D, int causal, int bwd,
                         int reps) {
    const size_t nq = (size_t)sq * H * D, nk = (size_t)sk * H * D;
    void *q = dev_rand(nq, 1), *k = dev_rand(nk, 2), *v = dev_rand(nk, 3), *o = dev_rand(nq, 4), *dout = dev_rand(nq, 5);
    void *dq = dev_rand(nq, 6), *dk = dev_rand(nk, 7), *dv = dev_rand(nk, 8);
    float *lse;
    CK(cudaMalloc((void **)&lse, sizeof(float) * (size_t)H * (size_t)sq));
    const fa_tensor Q = fa_tensor_bshd(q, FA_DTYPE_BF16, 1, sq, H, D), K = fa_tensor_bshd(k, FA_DTYPE_BF16, 1, sk, H, D),
                    V = fa_tensor_bshd(v, FA_DTYPE_BF16, 1, sk, H, D), O = fa_tensor_bshd(o, FA_DTYPE_BF16, 1, sq, H, D),
                    DO = fa_tensor_bshd(dout, FA_DTYPE_BF16, 1, sq, H, D), DQ = fa_tensor_bshd(dq, FA_DTYPE_BF16, 1, sq, H, D),
                    DK = fa_tensor_bshd(dk, FA_DTYPE_BF16, 1, sk, H, D), DV = fa_tensor_bshd(dv, FA_DTYPE_BF16, 1, sk, H, D);
    fa_attn_opts f = fa_attn_opts_default(), b = f;
    f.causal = b.causal = causal;
    b.algo = FA_ALGO_FLASH2; /* what the ring's backward runs */
    double t[64];
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int rep = -2; rep < reps; rep++) {
        CK(cudaEventRecord(e0, st));
        FA(ctx, fa_forward(ctx, &f, &Q, &K, &V, &O, lse));
        if (bwd) FA(ctx, fa_backward(ctx, &b, &Q, &K, &V, &O, lse, &DO, &DQ, &DK, &DV));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (rep >= 0) t[rep] = ms;
    }
    void *all[8] = {q, k, v, o, dout, dq, dk, dv};
    for (int i = 0; i < 8; i++) cudaFree(all[i]);
    cudaFree(lse);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return median(t, reps);
}

/* Median ms of one ring exchange of `bytes` (rank r -> r + 1) over the NCCL comms, timed on rank 0's stream. */
typedef struct xch {
    int r, W, reps;
    ncclComm_t comm;
    size_t bytes;
    double *t;
} xch;
static void *xch_main(void *arg) {
    xch *x = arg;
    CK(cudaSetDevice(x->r));
    void *s, *d;
    CK(cudaMalloc(&s, x->bytes));
    CK(cudaMalloc(&d, x->bytes));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (int rep = -2; rep < x->reps; rep++) {
        pthread_barrier_wait(&bar);
        const double t0 = now_s();
        ncclGroupStart();
        ncclSend(s, x->bytes, ncclUint8, (x->r + 1) % x->W, x->comm, st);
        ncclRecv(d, x->bytes, ncclUint8, (x->r + x->W - 1) % x->W, x->comm, st);
        ncclGroupEnd();
        CK(cudaStreamSynchronize(st));
        pthread_barrier_wait(&bar);
        if (x->r == 0 && rep >= 0) x->t[rep] = 1e3 * (now_s() - t0);
    }
    cudaFree(s), cudaFree(d);
    cudaStreamDestroy(st);
    return NULL;
}
static double exchange_ms(ncclComm_t *comms, int W, size_t bytes, int reps) {
    xch x[MAX_W];
    double t[64];
    pthread_t th[MAX_W];
    for (int r = 0; r < W; r++) {
        x[r] = (xch){r, W, reps, comms[r], bytes, t};
        pthread_create(&th[r], NULL, xch_main, &x[r]);
    }
    for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
    return median(t, reps);
}

int main(int argc, char **argv) {
    setenv("NCCL_NVLS_ENABLE", "0", 1); /* NVLink multicast stays off (docs/ring.md) */
    cfg c = {2, 16, 128, 1, 10, 0};
    const char *seqlens = argc > 2 ? argv[2] : "32768,65536,131072";
    if (argc > 1) c.W = atoi(argv[1]);
    if (argc > 3) c.H = atoi(argv[3]);
    if (argc > 4) c.D = atoi(argv[4]);
    if (argc > 5) c.causal = atoi(argv[5]);
    if (argc > 6) c.reps = atoi(argv[6]);
    if (c.reps > 64) c.reps = 64;
    int n = 0;
    CK(cudaGetDeviceCount(&n));
    if (c.W < 1 || c.W > MAX_W || c.W > n) {
        fprintf(stderr, "bench_ring: world %d needs that many GPUs (%d present, at most %d)\n", c.W, n, MAX_W);
        return 1;
    }
    ncclComm_t comms[MAX_W];
    int devs[MAX_W];
    for (int r = 0; r < c.W; r++) devs[r] = r;
    if (ncclCommInitAll(comms, c.W, devs) != ncclSuccess) {
        fprintf(stderr, "ncclCommInitAll failed\n");
        return 1;
    }
    printf("ring attention over NCCL: %d GPUs, bf16, B = 1, heads %d, head_dim %d, %s; median of %d\n", c.W, c.H, c.D,
           c.causal ? "causal (zigzag)" : "not causal", c.reps);
    printf("| tokens | pass | ring ms | one GPU ms (whole) | efficiency | step attention ms (diag / block) | step "
           "exchange ms | exchange / block |\n|---|---|---|---|---|---|---|---|\n");
    fa_context *c0;
    cudaStream_t s0;
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    if (fa_context_create(&c0, FA_BACKEND_CUDA, 0) != FA_OK) {
        fprintf(stderr, "%s\n", fa_create_error());
        return 1;
    }
    FA(c0, fa_context_set_stream(c0, s0));
    for (const char *p = seqlens; *p;) {
        c.S = strtoll(p, (char **)&p, 10);
        if (*p == ',') p++;
        const int64_t S_l = c.S / c.W, half = S_l / 2;
        if (c.S % (2 * c.W)) {
            fprintf(stderr, "bench_ring: %lld tokens do not split into %d even shards\n", (long long)c.S, c.W);
            return 1;
        }
        rank_t R[MAX_W];
        double t_fwd[64], t_fb[64];
        pthread_barrier_init(&bar, NULL, (unsigned)c.W);
        pthread_t th[MAX_W];
        for (int r = 0; r < c.W; r++) {
            rank_t *x = &R[r];
            memset(x, 0, sizeof *x);
            x->r = r, x->c = &c, x->t_fwd = t_fwd, x->t_fb = t_fb;
            CK(cudaSetDevice(r));
            CK(cudaStreamCreateWithFlags(&x->st, cudaStreamNonBlocking));
            if (fa_context_create(&x->ctx, FA_BACKEND_CUDA, r) != FA_OK) {
                fprintf(stderr, "%s\n", fa_create_error());
                return 1;
            }
            FA(x->ctx, fa_context_set_stream(x->ctx, x->st));
            if (fa_ring_comm_nccl(&x->comm, comms[r], NULL) != FA_OK) {
                fprintf(stderr, "%s\n", fa_ring_create_error());
                return 1;
            }
            const size_t nl = (size_t)S_l * c.H * c.D;
            fa_tensor *ts[8] = {&x->q, &x->k, &x->v, &x->o, &x->dout, &x->dq, &x->dk, &x->dv};
            for (int i = 0; i < 8; i++) *ts[i] = fa_tensor_bshd(dev_rand(nl, 10 * r + i), FA_DTYPE_BF16, 1, S_l, c.H, c.D);
            CK(cudaMalloc((void **)&x->lse, sizeof(float) * (size_t)c.H * (size_t)S_l));
        }
        for (int r = 0; r < c.W; r++) pthread_create(&th[r], NULL, rank_main, &R[r]);
        for (int r = 0; r < c.W; r++) pthread_join(th[r], NULL);
        for (int r = 0; r < c.W; r++) {
            rank_t *x = &R[r];
            fa_tensor *ts[8] = {&x->q, &x->k, &x->v, &x->o, &x->dout, &x->dq, &x->dk, &x->dv};
            for (int i = 0; i < 8; i++) cudaFree(ts[i]->data);
            cudaFree(x->lse);
            fa_ring_comm_destroy(x->comm);
            fa_context_destroy(x->ctx);
            cudaStreamDestroy(x->st);
        }
        const double ring_f = 1e3 * median(t_fwd, c.reps), ring_fb = 1e3 * median(t_fb, c.reps);
        CK(cudaSetDevice(0));
        const double one_f = one_gpu_ms(c0, s0, c.S, c.S, c.H, c.D, c.causal, 0, c.reps);
        const double one_fb = one_gpu_ms(c0, s0, c.S, c.S, c.H, c.D, c.causal, 1, c.reps);
        /* the blocks of one step: step 0 the local causal block; the others a half block (zigzag), or the whole
         * block without causal */
        const double diag_f = one_gpu_ms(c0, s0, S_l, S_l, c.H, c.D, c.causal, 0, c.reps);
        const double blk_f = c.causal ? one_gpu_ms(c0, s0, S_l, half, c.H, c.D, 0, 0, c.reps) : diag_f;
        const double diag_fb = one_gpu_ms(c0, s0, S_l, S_l, c.H, c.D, c.causal, 1, c.reps);
        const double blk_fb = c.causal ? one_gpu_ms(c0, s0, S_l, half, c.H, c.D, 0, 1, c.reps) : diag_fb;
        const size_t kvb = 2 * (size_t)S_l * c.H * c.D * 2, dkvb = 2 * (size_t)S_l * c.H * c.D * 4;
        pthread_barrier_destroy(&bar);
        pthread_barrier_init(&bar, NULL, (unsigned)c.W);
        const double x_kv = exchange_ms(comms, c.W, kvb, c.reps), x_bwd = exchange_ms(comms, c.W, kvb + dkvb, c.reps);
        pthread_barrier_destroy(&bar);
        printf("| %lld | fwd | %.2f | %.2f | %.1f %% | %.2f / %.2f | %.2f (%.0f GB/s) | %.2f |\n", (long long)c.S, ring_f,
               one_f, 100 * one_f / (c.W * ring_f), diag_f, blk_f, x_kv, kvb / x_kv / 1e6, x_kv / blk_f);
        printf("| %lld | fwd+bwd | %.2f | %.2f | %.1f %% | %.2f / %.2f | %.2f (%.0f GB/s) | %.2f |\n", (long long)c.S,
               ring_fb, one_fb, 100 * one_fb / (c.W * ring_fb), diag_fb, blk_fb, x_bwd, (kvb + dkvb) / x_bwd / 1e6,
               x_bwd / (blk_fb - blk_f));
        fflush(stdout);
    }
    fa_context_destroy(c0);
    for (int r = 0; r < c.W; r++) ncclCommDestroy(comms[r]);
    return 0;
}
