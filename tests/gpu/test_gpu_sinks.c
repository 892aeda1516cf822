/* Learnable sinks on CUDA (opts.sinks, opts.d_sinks in device memory) against the float64 oracle: forward (out, LSE)
 * and backward (dq, dk, dv, d sinks) of STANDARD, FLASH1, FLASH2, FLASH3 and AUTO, f16/bf16, with GQA, causal (rows
 * without keys: O = 0, LSE = the sink), window and softcap; the same-dtype baseline of the pass rule is the CPU's
 * STANDARD on the same case. Every forward joins the sink in one pass after its kernel (src/cuda/sinks.h). Decoding
 * with sinks (one split, the merges): tests/gpu/test_gpu_kvcache.c. Run by scripts/test-gpu.sh. */
#include "testlib.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void cuda_ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

/* A host t_buf's whole allocation on the device, and its view there. */
typedef struct dbuf {
    t_buf *h;
    void *mem;
    fa_tensor t;
} dbuf;
static dbuf d_new(t_buf *h) {
    dbuf d = {h, NULL, h->t};
    cuda_ok(cudaMalloc(&d.mem, h->mem_bytes), "cudaMalloc");
    cuda_ok(cudaMemcpy(d.mem, h->mem, h->mem_bytes, cudaMemcpyHostToDevice), "up");
    d.t.data = (char *)d.mem + h->offset;
    return d;
}
static void d_down(dbuf *d) { cuda_ok(cudaMemcpy(d->h->mem, d->mem, d->h->mem_bytes, cudaMemcpyDeviceToHost), "down"); }
static void *d_copy(const void *x, size_t n) {
    void *d;
    cuda_ok(cudaMalloc(&d, n), "cudaMalloc");
    cuda_ok(cudaMemcpy(d, x, n, cudaMemcpyHostToDevice), "up");
    return d;
}

/* Forward and backward of one case on the CPU (STANDARD: the baseline errors) or CUDA (algorithm a) into the host
 * buffers o, lse, dq, dk, dv, ds. Returns the status of the first failing call. */
static fa_status run(fa_context *ctx, int cuda, fa_attn_opts opts, t_buf *q, t_buf *k, t_buf *v, t_buf *dout, t_buf *o,
                     float *lse, t_buf *dq, t_buf *dk, t_buf *dv, float *ds, int64_t nl, int64_t hq) {
    fa_status st;
    if (!cuda) {
        opts.d_sinks = ds;
        if ((st = fa_forward(ctx, &opts, &q->t, &k->t, &v->t, &o->t, lse))) return st;
        return fa_backward(ctx, &opts, &q->t, &k->t, &v->t, &o->t, lse, &dout->t, &dq->t, &dk->t, &dv->t);
    }
    dbuf Q = d_new(q), K = d_new(k), V = d_new(v), DO = d_new(dout), O = d_new(o), DQ = d_new(dq), DK = d_new(dk),
         DV = d_new(dv);
    float *dl = d_copy(lse, sizeof(float) * (size_t)nl), *dsk = d_copy(opts.sinks, sizeof(float) * (size_t)hq);
    float *dds = d_copy(ds, sizeof(float) * (size_t)hq);
    opts.sinks = dsk, opts.d_sinks = dds;
    st = fa_forward(ctx, &opts, &Q.t, &K.t, &V.t, &O.t, dl);
    if (st == FA_OK) /* each backward from its own forward's out and LSE */
        st = fa_backward(ctx, &opts, &Q.t, &K.t, &V.t, &O.t, dl, &DO.t, &DQ.t, &DK.t, &DV.t);
    cuda_ok(cudaDeviceSynchronize(), "sync");
    d_down(&O), d_down(&DQ), d_down(&DK), d_down(&DV);
    cuda_ok(cudaMemcpy(lse, dl, sizeof(float) * (size_t)nl, cudaMemcpyDeviceToHost), "lse down");
    cuda_ok(cudaMemcpy(ds, dds, sizeof(float) * (size_t)hq, cudaMemcpyDeviceToHost), "d_sinks down");
    cudaFree(Q.mem), cudaFree(K.mem), cudaFree(V.mem), cudaFree(DO.mem), cudaFree(O.mem), cudaFree(DQ.mem);
    cudaFree(DK.mem), cudaFree(DV.mem), cudaFree(dl), cudaFree(dsk), cudaFree(dds);
    return st;
}

static void one_case(fa_context *cpu, fa_context *gpu, t_case *c) {
    static const fa_algo algos[5] = {FA_ALGO_STANDARD, FA_ALGO_FLASH1, FA_ALGO_FLASH2, FA_ALGO_FLASH3, FA_ALGO_AUTO};
    char desc[400];
    t_case_describe(c, desc, sizeof desc);
    printf("gpu sinks %s:", desc);
    t_buf q = t_buf_new(c->dt, c->b, c->sq, c->hq, c->d, T_BSHD), k = t_buf_new(c->dt, c->b, c->sk, c->hk, c->d, T_BSHD);
    t_buf v = t_buf_new(c->dt, c->b, c->sk, c->hk, c->d, T_BSHD), o = t_buf_new(c->dt, c->b, c->sq, c->hq, c->d, T_BSHD);
    t_buf dout = t_buf_new(c->dt, c->b, c->sq, c->hq, c->d, T_BSHD), dq = t_buf_new(c->dt, c->b, c->sq, c->hq, c->d, T_BSHD);
    t_buf dk = t_buf_new(c->dt, c->b, c->sk, c->hk, c->d, T_BSHD), dv = t_buf_new(c->dt, c->b, c->sk, c->hk, c->d, T_BSHD);
    t_buf_randn(&q, 1), t_buf_randn(&k, 1), t_buf_randn(&v, 1), t_buf_randn(&dout, 1);
    const int64_t nq = c->b * c->sq * c->hq * c->d, nk = c->b * c->sk * c->hk * c->d, nl = c->b * c->hq * c->sq;
    double *ref = malloc(sizeof(double) * (size_t)nq), *rl = malloc(sizeof(double) * (size_t)nl);
    double *rdq = malloc(sizeof(double) * (size_t)nq), *rdk = malloc(sizeof(double) * (size_t)nk);
    double *rdv = malloc(sizeof(double) * (size_t)nk), rds[T_MAX_SINK_HEADS];
    float *lse = malloc(sizeof(float) * (size_t)nl), ds[T_MAX_SINK_HEADS];
    CHECK_STATUS(t_oracle_forward(&c->opts, &q.t, &k.t, &v.t, ref, rl), FA_OK);
    CHECK_STATUS(t_oracle_backward_sinks(&c->opts, &q.t, &k.t, &v.t, &dout.t, rdq, rdk, rdv, NULL, rds), FA_OK);
    const double om = t_max_abs(ref, nq), ls = t_lse_scale(rl, nl);
    const double gm = fmax(t_max_abs(rds, c->hq), fmax(t_max_abs(rdq, nq), fmax(t_max_abs(rdk, nk), t_max_abs(rdv, nk))));
    double base[6] = {0};
    for (int ai = -1; ai < 5; ai++) {
        const fa_algo a = ai < 0 ? FA_ALGO_STANDARD : algos[ai];
        fa_attn_opts opts = c->opts;
        opts.algo = a;
        t_buf_poison(&o), t_buf_poison(&dq), t_buf_poison(&dk), t_buf_poison(&dv);
        for (int64_t i = 0; i < nl; i++) lse[i] = t_nanf();
        for (int64_t h = 0; h < c->hq; h++) ds[h] = t_nanf();
        const fa_status st = run(ai < 0 ? cpu : gpu, ai >= 0, opts, &q, &k, &v, &dout, &o, lse, &dq, &dk, &dv, ds, nl, c->hq);
        if (st == FA_ERR_UNSUPPORTED && a == FA_ALGO_FLASH1) { /* FLASH1's head dims: the plan says why */
            printf(" flash1:unsupported");
            continue;
        }
        CHECK_STATUS(st, FA_OK);
        if (st != FA_OK) {
            fprintf(stderr, "  %s: %s\n", fa_algo_name(a), fa_context_last_error(ai < 0 ? cpu : gpu));
            continue;
        }
        const double e[6] = {t_max_diff(&o.t, ref), t_max_diff_f(lse, rl, nl), t_max_diff(&dq.t, rdq),
                             t_max_diff(&dk.t, rdk), t_max_diff(&dv.t, rdv), t_max_diff_f(ds, rds, c->hq)};
        if (ai < 0) {
            memcpy(base, e, sizeof base);
            continue;
        }
        t_check_err("out", a, c->dt, e[0], base[0], om, 0, 1);
        const t_verdict lv = t_judge_lse(0, e[1], base[1], ls);
        CHECK_MSG(lv.ok, "%s lse: err %.3e, allowed %.3e", fa_algo_name(a), e[1], lv.allowed);
        static const char *const gn[4] = {"dq", "dk", "dv", "d_sinks"};
        for (int g = 0; g < 4; g++) t_check_err(gn[g], a, c->dt, e[2 + g], base[2 + g], gm, 1, 1);
        printf(" %s %.1e/%.1e/%.1e", fa_algo_name(a), e[0], e[1], e[5]);
    }
    printf("\n");
    free(ref), free(rl), free(rdq), free(rdk), free(rdv), free(lse);
    t_buf_free(&q), t_buf_free(&k), t_buf_free(&v), t_buf_free(&o), t_buf_free(&dout), t_buf_free(&dq);
    t_buf_free(&dk), t_buf_free(&dv);
}

/* AUTO runs a forward with sinks on FLASH3 where FLASH3 runs the call (the join is the same pass for every forward). */
static void auto_pick(fa_context *gpu) {
    snprintf(t_case_label, sizeof t_case_label, "gpu sinks: AUTO's forward");
    enum { S = 64, H = 2, D = 128 };
    t_buf q = t_buf_new(FA_DTYPE_BF16, 1, S, H, D, T_BSHD), o = t_buf_new(FA_DTYPE_BF16, 1, S, H, D, T_BSHD);
    t_buf_randn(&q, 1);
    dbuf Q = d_new(&q), O = d_new(&o);
    const float sinks[H] = {0.5f, 1};
    float *dsk = d_copy(sinks, sizeof sinks);
    fa_attn_opts opts = fa_attn_opts_default();
    opts.sinks = dsk, opts.algo = FA_ALGO_AUTO;
    CHECK_STATUS(fa_forward(gpu, &opts, &Q.t, &Q.t, &Q.t, &O.t, NULL), FA_OK);
    fa_stats st;
    CHECK_STATUS(fa_last_stats(gpu, &st), FA_OK);
    CHECK_EQ_INT(st.algo, FA_ALGO_FLASH3);
    cudaFree(Q.mem), cudaFree(O.mem), cudaFree(dsk);
    t_buf_free(&q), t_buf_free(&o);
}

int main(void) {
    const uint64_t seed = t_init("test_gpu_sinks");
    t_rng r;
    t_rng_seed(&r, seed);
    if (!fa_backend_available(FA_BACKEND_CUDA)) {
        fprintf(stderr, "test_gpu_sinks: no CUDA device\n");
        return 77;
    }
    fa_context *cpu = t_cpu_ctx(), *gpu = NULL;
    CHECK_STATUS(fa_context_create(&gpu, FA_BACKEND_CUDA, 0), FA_OK);
    if (!gpu) return t_finish();
    const fa_dtype F16 = FA_DTYPE_F16, BF16 = FA_DTYPE_BF16;
    t_case cs[6] = {t_case_make(2, 128, 128, 8, 2, 64, BF16), t_case_make(1, 200, 77, 4, 4, 128, F16),
                    t_case_make(2, 65, 300, 4, 1, 128, BF16), t_case_make(1, 256, 256, 2, 2, 64, F16),
                    t_case_make(3, 1, 513, 8, 8, 128, BF16), t_case_make(1, 96, 96, 4, 2, 256, BF16)};
    cs[1].opts.causal = 1; /* rows 0..122 see no key */
    cs[2].opts.window_left = 31, cs[2].opts.window_right = 5;
    cs[3].opts.softcap = 30, cs[3].opts.causal = 1;
    for (int i = 0; i < 6; i++) {
        t_case_sinks(&cs[i], &r, -2, 4);
        t_case_bind(&cs[i]);
        snprintf(t_case_label, sizeof t_case_label, "gpu sinks case %d", i);
        one_case(cpu, gpu, &cs[i]);
    }
    auto_pick(gpu);
    fa_context_destroy(gpu);
    fa_context_destroy(cpu);
    return t_finish();
}
