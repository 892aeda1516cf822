/* Ring attention on CUDA (run on a machine with an H200: `make test-gpu`).
 *
 * 1. Loopback: W = 1..4 ranks as threads on device 0, each with its own CUDA context and stream, linked by the thread
 *    transport (docs/ring.md): bf16/f16, d 64/128, causal (zigzag) and not, GQA, FLASH2 and AUTO (FLASH3 forward).
 *    Each rank's out, LSE, dq, dk, dv (poisoned before the call, strided shards) are gathered into the whole
 *    sequence and judged against the float64 oracle by the rule of tests/lib/tolerance.h, the baseline being CUDA
 *    STANDARD (cuBLAS) in the same dtype on the whole sequence; uneven shards are rejected on every rank. With
 *    sinks (opts.sinks on each rank's device), each rank's d sinks is its rows' share: their sum is judged.
 * 2. NCCL, when this build has it and >= 2 GPUs are present: 2 ranks (ncclCommInitAll in this process, one thread
 *    per GPU), bf16 d128 causal and not, against the oracle and against single-GPU attention (FLASH2 / AUTO) on the
 *    whole sequence. NCCL_NVLS_ENABLE=0 is set before NCCL starts.
 * Seeds are printed; replay with FA_TEST_SEED. FA_GPU_TEST_SMALL=1 runs the small cases only. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#ifdef FA_TEST_NCCL
#include <nccl.h>
#endif

#include "flashattn_ring.h"
#include "testlib.h"
#include "shard.h"

#define MAX_W 4

static void cuda_ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "CUDA error in test harness (%s): %s\n", what, cudaGetErrorString(e));
        exit(2);
    }
}

/* A device mirror of a host t_buf (same bytes, padding included) on one device. */
typedef struct dbuf {
    t_buf h;
    unsigned char *mem;
    fa_tensor t;
    int dev;
} dbuf;

static dbuf d_new(int dev, fa_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d, t_layout lay) {
    dbuf x;
    x.h = t_buf_new(dt, b, s, h, d, lay);
    x.dev = dev;
    cuda_ok(cudaSetDevice(dev), "cudaSetDevice");
    cuda_ok(cudaMalloc((void **)&x.mem, x.h.mem_bytes), "cudaMalloc");
    x.t = x.h.t;
    x.t.data = x.mem + ((unsigned char *)x.h.t.data - x.h.mem);
    return x;
}
static void d_up(dbuf *x) {
    cuda_ok(cudaMemcpy(x->mem, x->h.mem, x->h.mem_bytes, cudaMemcpyHostToDevice), "up");
}
static void d_down(dbuf *x) {
    cuda_ok(cudaMemcpy(x->h.mem, x->mem, x->h.mem_bytes, cudaMemcpyDeviceToHost), "down");
}
static void d_free(dbuf *x) {
    cudaFree(x->mem);
    t_buf_free(&x->h);
}

/* One rank: its context, comm, shards and outputs on its device. */
typedef struct rank_t {
    int rank, dev, backward;
    fa_context *ctx;
    fa_ring_comm *comm;
    cudaStream_t stream;
    const fa_attn_opts *opts;
    fa_attn_opts own; /* opts with this rank's device sinks and d sinks */
    float *sinks_d, *dsinks_d;
    dbuf q, k, v, o, dout, dq, dk, dv;
    float *lse_d, *lse_h;
    int64_t n_lse;
    fa_status st;
    char msg[512];
} rank_t;

static void *rank_main(void *arg) {
    rank_t *x = arg;
    cudaSetDevice(x->dev);
    if (x->backward)
        x->st = fa_ring_backward(x->ctx, x->comm, x->opts, &x->q.t, &x->k.t, &x->v.t, &x->o.t, x->lse_d, &x->dout.t,
                                 &x->dq.t, &x->dk.t, &x->dv.t);
    else
        x->st = fa_ring_forward(x->ctx, x->comm, x->opts, &x->q.t, &x->k.t, &x->v.t, &x->o.t, x->lse_d);
    if (cudaStreamSynchronize(x->stream) != cudaSuccess && x->st == FA_OK) x->st = FA_ERR_DEVICE;
    snprintf(x->msg, sizeof x->msg, "%s", fa_context_last_error(x->ctx));
    return NULL;
}

static void run_ranks(int W, rank_t *R) {
    pthread_t th[MAX_W];
    for (int r = 0; r < W; r++) pthread_create(&th[r], NULL, rank_main, &R[r]);
    for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
}

typedef struct gcase {
    int W, nccl;
    int64_t B, S, Hq, Hk, D;
    fa_dtype dt;
    fa_attn_opts opts;      /* opts.sinks stays NULL: with_sinks puts the logits in sinks */
    int with_sinks;
    float sinks[8];
    t_layout lay;
} gcase;

/* A float [n] (n <= 8) on device dev: a copy of h, or NaN where h is NULL (an output, poisoned). */
static float *dev_floats(int dev, const float *h, int64_t n) {
    float nan8[8], *d;
    for (int i = 0; i < 8; i++) nan8[i] = t_nanf();
    cuda_ok(cudaSetDevice(dev), "cudaSetDevice");
    cuda_ok(cudaMalloc((void **)&d, sizeof(float) * (size_t)n), "cudaMalloc");
    cuda_ok(cudaMemcpy(d, h ? h : nan8, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice), "sinks up");
    return d;
}

/* The whole sequence on device 0 with algorithm a: out, lse (host copies) and, with dq != NULL, the gradients. */
static void whole(fa_context *ctx, const gcase *c, fa_algo a, t_buf *q, t_buf *k, t_buf *v, t_buf *dout, t_buf *o,
                  float *lse, t_buf *dq, t_buf *dk, t_buf *dv, float *dsinks) {
    fa_attn_opts so = c->opts;
    so.algo = a;
    float *sk = c->with_sinks ? dev_floats(0, c->sinks, c->Hq) : NULL, *dsk = sk ? dev_floats(0, NULL, c->Hq) : NULL;
    so.sinks = sk;
    dbuf Q = d_new(0, c->dt, c->B, c->S, c->Hq, c->D, T_BSHD), K = d_new(0, c->dt, c->B, c->S, c->Hk, c->D, T_BSHD);
    dbuf V = d_new(0, c->dt, c->B, c->S, c->Hk, c->D, T_BSHD), O = d_new(0, c->dt, c->B, c->S, c->Hq, c->D, T_BSHD);
    memcpy(Q.h.mem, q->mem, q->mem_bytes), memcpy(K.h.mem, k->mem, k->mem_bytes), memcpy(V.h.mem, v->mem, v->mem_bytes);
    d_up(&Q), d_up(&K), d_up(&V);
    const int64_t nl = c->B * c->Hq * c->S;
    float *L;
    cuda_ok(cudaMalloc((void **)&L, sizeof(float) * (size_t)nl), "cudaMalloc");
    CHECK_STATUS(fa_forward(ctx, &so, &Q.t, &K.t, &V.t, &O.t, L), FA_OK);
    d_down(&O);
    memcpy(o->mem, O.h.mem, o->mem_bytes);
    cuda_ok(cudaMemcpy(lse, L, sizeof(float) * (size_t)nl, cudaMemcpyDeviceToHost), "lse down");
    if (dq) {
        if (a == FA_ALGO_AUTO || a == FA_ALGO_FLASH3) so.algo = FA_ALGO_FLASH2;
        dbuf DO = d_new(0, c->dt, c->B, c->S, c->Hq, c->D, T_BSHD), DQ = d_new(0, c->dt, c->B, c->S, c->Hq, c->D, T_BSHD);
        dbuf DK = d_new(0, c->dt, c->B, c->S, c->Hk, c->D, T_BSHD), DV = d_new(0, c->dt, c->B, c->S, c->Hk, c->D, T_BSHD);
        memcpy(DO.h.mem, dout->mem, dout->mem_bytes);
        d_up(&DO);
        so.d_sinks = dsk;
        CHECK_STATUS(fa_backward(ctx, &so, &Q.t, &K.t, &V.t, &O.t, L, &DO.t, &DQ.t, &DK.t, &DV.t), FA_OK);
        if (dsk) cuda_ok(cudaMemcpy(dsinks, dsk, sizeof(float) * (size_t)c->Hq, cudaMemcpyDeviceToHost), "d sinks down");
        d_down(&DQ), d_down(&DK), d_down(&DV);
        memcpy(dq->mem, DQ.h.mem, dq->mem_bytes), memcpy(dk->mem, DK.h.mem, dk->mem_bytes);
        memcpy(dv->mem, DV.h.mem, dv->mem_bytes);
        d_free(&DO), d_free(&DQ), d_free(&DK), d_free(&DV);
    }
    cudaFree(L), cudaFree(sk), cudaFree(dsk);
    d_free(&Q), d_free(&K), d_free(&V), d_free(&O);
}

/* comms[r] made by the caller (thread group or NCCL); ranks on device devs[r]. */
static void run_case(const gcase *c, fa_ring_comm **comms, const int *devs) {
    const int W = c->W, causal = c->opts.causal;
    const int64_t B = c->B, S = c->S, S_l = S / W, Hq = c->Hq, Hk = c->Hk, D = c->D;
    char desc[256];
    snprintf(desc, sizeof desc, "gpu ring %s W%d %s b%lld S%lld h%lld/%lld d%lld %s%s%s algo %s",
             c->nccl ? "nccl" : "loopback", W, fa_dtype_name(c->dt), (long long)B, (long long)S, (long long)Hq,
             (long long)Hk, (long long)D, t_layout_name(c->lay), causal ? " causal" : "", c->with_sinks ? " sinks" : "",
             fa_algo_name(c->opts.algo));
    snprintf(t_case_label, sizeof t_case_label, "%s", desc);
    printf("%s:", desc);
    fflush(stdout);

    t_whole seq;
    fa_attn_opts ho = c->opts; /* the oracle's: host sinks */
    ho.sinks = c->with_sinks ? c->sinks : NULL;
    CHECK_STATUS(t_whole_new(&seq, &ho, c->dt, B, S, Hq, Hk, D), FA_OK);
    t_buf q = seq.q, k = seq.k, v = seq.v, dout = seq.dout; /* views of seq's buffers (freed with it) */
    const double *ref = seq.out, *rlse = seq.lse, *rdq = seq.dq, *rdk = seq.dk, *rdv = seq.dv;
    const int64_t nq = B * S * Hq * D, nk = B * S * Hk * D, nl = B * Hq * S;

    /* baselines on device 0, whole sequence: STANDARD (the rule's) and the ring's own algorithm (for reference) */
    fa_context *c0;
    if (fa_context_create(&c0, FA_BACKEND_CUDA, 0) != FA_OK) {
        fprintf(stderr, "cannot create a CUDA context: %s\n", fa_create_error());
        exit(2);
    }
    t_buf so = t_buf_new(c->dt, B, S, Hq, D, T_BSHD), sdq = t_buf_new(c->dt, B, S, Hq, D, T_BSHD);
    t_buf sdk = t_buf_new(c->dt, B, S, Hk, D, T_BSHD), sdv = t_buf_new(c->dt, B, S, Hk, D, T_BSHD);
    float *sl = malloc(sizeof(float) * (size_t)nl), sds[8];
    whole(c0, c, FA_ALGO_STANDARD, &q, &k, &v, &dout, &so, sl, &sdq, &sdk, &sdv, sds);
    const double e_std = t_max_diff(&so.t, ref), l_std = t_max_diff_f(sl, rlse, nl);
    const double g_std[3] = {t_max_diff(&sdq.t, rdq), t_max_diff(&sdk.t, rdk), t_max_diff(&sdv.t, rdv)};
    double ds_std = 0;
    for (int64_t h = 0; c->with_sinks && h < Hq; h++) ds_std = fmax(ds_std, fabs(sds[h] - seq.dsinks[h]));
    whole(c0, c, c->opts.algo, &q, &k, &v, &dout, &so, sl, &sdq, &sdk, &sdv, sds);
    const double e_one = t_max_diff(&so.t, ref);
    const double g_one[3] = {t_max_diff(&sdq.t, rdq), t_max_diff(&sdk.t, rdk), t_max_diff(&sdv.t, rdv)};

    rank_t R[MAX_W];
    for (int r = 0; r < W; r++) {
        rank_t *x = &R[r];
        memset(x, 0, sizeof *x);
        x->rank = r, x->dev = devs[r], x->comm = comms[r], x->own = c->opts, x->opts = &x->own;
        if (c->with_sinks) { /* d sinks poisoned: each rank writes its share */
            x->own.sinks = x->sinks_d = dev_floats(x->dev, c->sinks, Hq);
            x->own.d_sinks = x->dsinks_d = dev_floats(x->dev, NULL, Hq);
        }
        if (fa_context_create(&x->ctx, FA_BACKEND_CUDA, x->dev) != FA_OK) {
            fprintf(stderr, "cannot create a CUDA context on device %d: %s\n", x->dev, fa_create_error());
            exit(2);
        }
        cuda_ok(cudaSetDevice(x->dev), "cudaSetDevice");
        cuda_ok(cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking), "cudaStreamCreate");
        CHECK_STATUS(fa_context_set_stream(x->ctx, x->stream), FA_OK);
        x->q = d_new(x->dev, c->dt, B, S_l, Hq, D, c->lay), x->k = d_new(x->dev, c->dt, B, S_l, Hk, D, c->lay);
        x->v = d_new(x->dev, c->dt, B, S_l, Hk, D, c->lay), x->dout = d_new(x->dev, c->dt, B, S_l, Hq, D, c->lay);
        x->o = d_new(x->dev, c->dt, B, S_l, Hq, D, c->lay), x->dq = d_new(x->dev, c->dt, B, S_l, Hq, D, c->lay);
        x->dk = d_new(x->dev, c->dt, B, S_l, Hk, D, c->lay), x->dv = d_new(x->dev, c->dt, B, S_l, Hk, D, c->lay);
        t_shard_scatter(&q.t, &x->q.h.t, r, W, causal), t_shard_scatter(&k.t, &x->k.h.t, r, W, causal);
        t_shard_scatter(&v.t, &x->v.h.t, r, W, causal), t_shard_scatter(&dout.t, &x->dout.h.t, r, W, causal);
        d_up(&x->q), d_up(&x->k), d_up(&x->v), d_up(&x->dout), d_up(&x->o), d_up(&x->dq), d_up(&x->dk), d_up(&x->dv);
        x->n_lse = B * Hq * S_l;
        x->lse_h = malloc(sizeof(float) * (size_t)x->n_lse);
        for (int64_t i = 0; i < x->n_lse; i++) x->lse_h[i] = t_nanf();
        cuda_ok(cudaMalloc((void **)&x->lse_d, sizeof(float) * (size_t)x->n_lse), "cudaMalloc");
        cuda_ok(cudaMemcpy(x->lse_d, x->lse_h, sizeof(float) * (size_t)x->n_lse, cudaMemcpyHostToDevice), "lse up");
    }
    run_ranks(W, R);
    double e = 0, le = 0;
    for (int r = 0; r < W; r++) {
        rank_t *x = &R[r];
        CHECK_STATUS(x->st, FA_OK);
        if (x->st != FA_OK) fprintf(stderr, "  rank %d forward: %s\n", r, x->msg);
        d_down(&x->o);
        cuda_ok(cudaMemcpy(x->lse_h, x->lse_d, sizeof(float) * (size_t)x->n_lse, cudaMemcpyDeviceToHost), "lse down");
        CHECK_MSG(t_buf_check_written(&x->o.h) == 0, "rank %d: out not written in full (or outside its view)", r);
        e = fmax(e, t_shard_err(&x->o.h.t, ref, S, r, W, causal));
        le = fmax(le, t_shard_lse_err(x->lse_h, rlse, B * Hq, S, S_l, r, W, causal));
    }
    const fa_algo a = c->opts.algo == FA_ALGO_AUTO ? FA_ALGO_FLASH3 : c->opts.algo;
    t_check_err("out", a, c->dt, e, e_std, t_max_abs(ref, nq), 0, 1);
    const t_verdict lv = t_judge_lse(0, le, l_std, t_lse_scale(rlse, nl));
    CHECK_MSG(lv.ok, "lse: max abs err %.3e > %.3e (2 x standard's %.3e)", le, lv.allowed, l_std);
    printf(" fwd %.1e/%.1e (standard %.1e, one GPU %.1e)", e, le, e_std, e_one);
    fflush(stdout);

    for (int r = 0; r < W; r++) R[r].backward = 1;
    run_ranks(W, R);
    double eg[3] = {0, 0, 0};
    const double gm = fmax(t_max_abs(rdq, nq), fmax(t_max_abs(rdk, nk), t_max_abs(rdv, nk)));
    for (int r = 0; r < W; r++) {
        rank_t *x = &R[r];
        CHECK_STATUS(x->st, FA_OK);
        if (x->st != FA_OK) fprintf(stderr, "  rank %d backward: %s\n", r, x->msg);
        d_down(&x->dq), d_down(&x->dk), d_down(&x->dv);
        CHECK_MSG(t_buf_check_written(&x->dq.h) == 0 && t_buf_check_written(&x->dk.h) == 0 &&
                      t_buf_check_written(&x->dv.h) == 0,
                  "rank %d: a gradient not written in full (or outside its view)", r);
        eg[0] = fmax(eg[0], t_shard_err(&x->dq.h.t, rdq, S, r, W, causal));
        eg[1] = fmax(eg[1], t_shard_err(&x->dk.h.t, rdk, S, r, W, causal));
        eg[2] = fmax(eg[2], t_shard_err(&x->dv.h.t, rdv, S, r, W, causal));
    }
    t_check_err("dq", FA_ALGO_FLASH2, c->dt, eg[0], g_std[0], gm, 1, 1);
    t_check_err("dk", FA_ALGO_FLASH2, c->dt, eg[1], g_std[1], gm, 1, 1);
    t_check_err("dv", FA_ALGO_FLASH2, c->dt, eg[2], g_std[2], gm, 1, 1);
    printf(" bwd %.1e/%.1e/%.1e (standard %.1e/%.1e/%.1e, one GPU %.1e/%.1e/%.1e)", eg[0], eg[1], eg[2], g_std[0],
           g_std[1], g_std[2], g_one[0], g_one[1], g_one[2]);
    if (c->with_sinks) { /* each rank's share of d sinks; their sum is the whole sequence's */
        double sum[8] = {0}, eds = 0;
        for (int r = 0; r < W; r++) {
            float ds[8];
            cuda_ok(cudaMemcpy(ds, R[r].dsinks_d, sizeof(float) * (size_t)Hq, cudaMemcpyDeviceToHost), "d sinks down");
            for (int64_t h = 0; h < Hq; h++) sum[h] += ds[h];
        }
        for (int64_t h = 0; h < Hq; h++) eds = isnan(sum[h]) ? INFINITY : fmax(eds, fabs(sum[h] - seq.dsinks[h]));
        t_check_err("d_sinks", FA_ALGO_FLASH2, c->dt, eds, ds_std, t_dsinks_scale(seq.dsinks, seq.dsinks_mag, Hq, gm),
                    1, 1);
        printf(" d_sinks %.1e (standard %.1e)", eds, ds_std);
    }
    printf("\n");

    for (int r = 0; r < W; r++) {
        rank_t *x = &R[r];
        d_free(&x->q), d_free(&x->k), d_free(&x->v), d_free(&x->o), d_free(&x->dout), d_free(&x->dq), d_free(&x->dk);
        d_free(&x->dv);
        cudaFree(x->lse_d), cudaFree(x->sinks_d), cudaFree(x->dsinks_d);
        free(x->lse_h);
        fa_context_destroy(x->ctx);
        cudaStreamDestroy(x->stream);
    }
    fa_context_destroy(c0);
    free(sl);
    t_buf_free(&so), t_buf_free(&sdq), t_buf_free(&sdk), t_buf_free(&sdv);
    t_whole_free(&seq);
    t_case_label[0] = 0;
}

static gcase gc(int W, int64_t B, int64_t S, int64_t Hq, int64_t Hk, int64_t D, fa_dtype dt, int causal, fa_algo a,
                t_layout lay) {
    gcase c;
    memset(&c, 0, sizeof c);
    c.W = W, c.B = B, c.S = S, c.Hq = Hq, c.Hk = Hk, c.D = D, c.dt = dt, c.lay = lay;
    c.opts = fa_attn_opts_default();
    c.opts.causal = causal;
    c.opts.algo = a;
    return c;
}

/* Sinks in [-2, 4] (as test_ring.c), none on head 1 (d sinks 0 there). */
static gcase sunk(gcase c) {
    if (c.Hq > 8) {
        fprintf(stderr, "test_gpu_ring: a case with sinks takes at most 8 query heads (gcase.sinks)\n");
        exit(2);
    }
    c.with_sinks = 1;
    for (int h = 0; h < 8; h++) c.sinks[h] = (float)t_randint(-20, 40) / 10;
    if (c.Hq > 1) c.sinks[1] = -INFINITY;
    return c;
}

static void loopback(const gcase *c) {
    fa_ring_group *g;
    fa_ring_comm *comms[MAX_W];
    int devs[MAX_W] = {0, 0, 0, 0};
    CHECK_STATUS(fa_ring_group_create(&g, c->W), FA_OK);
    for (int r = 0; r < c->W; r++) CHECK_STATUS(fa_ring_comm_thread(&comms[r], g, r), FA_OK);
    run_case(c, comms, devs);
    for (int r = 0; r < c->W; r++) fa_ring_comm_destroy(comms[r]);
    fa_ring_group_destroy(g);
}

/* Uneven shards on the loopback: every rank rejects the call, out stays poisoned. */
static void uneven(void) {
    snprintf(t_case_label, sizeof t_case_label, "gpu ring loopback: uneven shards");
    fa_ring_group *g;
    CHECK_STATUS(fa_ring_group_create(&g, 2), FA_OK);
    rank_t R[2];
    fa_attn_opts o = fa_attn_opts_default();
    for (int r = 0; r < 2; r++) {
        rank_t *x = &R[r];
        memset(x, 0, sizeof *x);
        x->rank = r, x->opts = &o;
        CHECK_STATUS(fa_ring_comm_thread(&x->comm, g, r), FA_OK);
        CHECK_STATUS(fa_context_create(&x->ctx, FA_BACKEND_CUDA, 0), FA_OK);
        cuda_ok(cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking), "cudaStreamCreate");
        CHECK_STATUS(fa_context_set_stream(x->ctx, x->stream), FA_OK);
        const int64_t S_l = r ? 64 : 48;
        x->q = d_new(0, FA_DTYPE_BF16, 1, S_l, 2, 64, T_BSHD), x->k = d_new(0, FA_DTYPE_BF16, 1, S_l, 2, 64, T_BSHD);
        x->v = d_new(0, FA_DTYPE_BF16, 1, S_l, 2, 64, T_BSHD), x->o = d_new(0, FA_DTYPE_BF16, 1, S_l, 2, 64, T_BSHD);
        t_buf_randn(&x->q.h, 1), t_buf_randn(&x->k.h, 1), t_buf_randn(&x->v.h, 1);
        d_up(&x->q), d_up(&x->k), d_up(&x->v), d_up(&x->o);
    }
    run_ranks(2, R);
    for (int r = 0; r < 2; r++) {
        rank_t *x = &R[r];
        CHECK_STATUS(x->st, FA_ERR_INVALID_ARGUMENT);
        CHECK_STR_CONTAINS(x->msg, "seqlen");
        d_down(&x->o);
        CHECK_MSG(t_buf_check_written(&x->o.h) == x->o.h.t.seqlen * 2 * 64, "rank %d: out written by a rejected call", r);
        d_free(&x->q), d_free(&x->k), d_free(&x->v), d_free(&x->o);
        fa_context_destroy(x->ctx);
        cudaStreamDestroy(x->stream);
        fa_ring_comm_destroy(x->comm);
    }
    fa_ring_group_destroy(g);
    printf("gpu ring loopback: uneven shards rejected on every rank: %s\n", R[0].msg);
    t_case_label[0] = 0;
}

#ifdef FA_TEST_NCCL
static void nccl_cases(int small) {
    int n = 0;
    cuda_ok(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    if (n < 2) {
        printf("gpu ring nccl: %d GPU(s): the 2-rank NCCL cases are skipped\n", n);
        return;
    }
    setenv("NCCL_NVLS_ENABLE", "0", 1); /* NVLink multicast stays off (docs/ring.md) */
    ncclComm_t nc[2];
    const int devs[2] = {0, 1};
    if (ncclCommInitAll(nc, 2, devs) != ncclSuccess) {
        CHECK_MSG(0, "ncclCommInitAll failed");
        return;
    }
    fa_ring_comm *comms[2];
    for (int r = 0; r < 2; r++) {
        CHECK_STATUS(fa_ring_comm_nccl(&comms[r], nc[r], NULL), FA_OK);
        CHECK_EQ_INT(fa_ring_comm_rank(comms[r]), r);
        CHECK_EQ_INT(fa_ring_comm_world(comms[r]), 2);
    }
    const int64_t S = small ? 1024 : 2048; /* the float64 oracle on the host is O(S²) */
    gcase c;
    for (int causal = 0; causal <= 1; causal++)
        for (int ai = 0; ai < 2; ai++) {
            c = gc(2, 1, S, 8, 2, 128, FA_DTYPE_BF16, causal, ai ? FA_ALGO_AUTO : FA_ALGO_FLASH2, T_BSHD);
            c.nccl = 1;
            run_case(&c, comms, devs);
        }
    for (int r = 0; r < 2; r++) fa_ring_comm_destroy(comms[r]), ncclCommDestroy(nc[r]);
}
#endif

int main(void) {
    t_init("test_gpu_ring");
    const int small = getenv("FA_GPU_TEST_SMALL") && atoi(getenv("FA_GPU_TEST_SMALL"));
    const fa_dtype BF16 = FA_DTYPE_BF16, F16 = FA_DTYPE_F16;
    const fa_algo F2 = FA_ALGO_FLASH2, AUTO = FA_ALGO_AUTO;
    gcase c;
    c = gc(1, 1, 256, 4, 4, 64, BF16, 1, F2, T_BSHD);
    loopback(&c);
    c = gc(2, 2, 256, 4, 2, 128, BF16, 1, F2, T_BSHD);
    loopback(&c);
    c = gc(2, 1, 384, 8, 1, 64, F16, 0, AUTO, T_BHSD);
    loopback(&c);
    c = gc(3, 1, 384, 4, 4, 128, BF16, 1, AUTO, T_BSHD);
    loopback(&c);
    c = gc(4, 1, 512, 4, 2, 64, F16, 1, F2, T_BHSD);
    loopback(&c);
    c = sunk(gc(1, 1, 256, 4, 2, 128, BF16, 1, AUTO, T_BSHD));
    loopback(&c);
    c = sunk(gc(2, 1, 384, 8, 2, 64, F16, 0, F2, T_BSHD));
    loopback(&c);
    c = sunk(gc(3, 2, 384, 4, 4, 128, BF16, 1, AUTO, T_BHSD));
    loopback(&c);
    if (!small) {
        c = gc(4, 2, 1024, 8, 2, 128, BF16, 1, AUTO, T_BSHD);
        loopback(&c);
        c = gc(3, 1, 1536, 4, 4, 128, BF16, 0, F2, T_BSHD);
        loopback(&c);
        c = gc(2, 1, 2048, 8, 8, 64, F16, 1, AUTO, T_BHSD);
        loopback(&c);
    }
    uneven();
#ifdef FA_TEST_NCCL
    nccl_cases(small);
#else
    printf("gpu ring nccl: this build has no NCCL: the 2-rank NCCL cases are skipped\n");
#endif
    return t_finish();
}
