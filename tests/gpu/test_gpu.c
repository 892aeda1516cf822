/* GPU tests of the CUDA backend (run on a machine with an H200: `make test-gpu`).
 *
 * Every case builds its tensors on the host with the testing library (tests/lib: layouts with padding and
 * offsets, NaN-poisoned allocations), mirrors each whole allocation to the device, runs STANDARD, FLASH1, FLASH2
 * and FLASH3 through the public API on a CUDA context, copies the allocations back and checks, against the float64
 * oracle (tests/lib/oracle.h):
 *   - status FA_OK, or FA_ERR_UNSUPPORTED exactly when the request is outside what the CUDA kernels are built for
 *     (dtype f32 or head_dim not 32/64/96/128 — FLASH2 also 256; FLASH3 64/128/256 — or rows not
 *     16-byte aligned or explicit tiles for the flash kernels), with a reason;
 *   - FLASH3's backward runs from FLASH3's out and lse where it is built (head_dim 64/128/256, varlen and seqused
 *     too, every view TMA-addressable), FLASH2's elsewhere (an explicit FLASH3 backward is refused there with a
 *     reason);
 *     FA_ALGO_AUTO runs FLASH3 exactly where it can, forward and backward;
 *   - every output element written (outputs poisoned with NaN before each call), nothing outside the views written;
 *   - seqused cases: NaN and ±inf in the padding rows of q, k, v and dout (t_case_pad) reach no output;
 *   - out, lse, dq, dk, dv within the rule of tests/lib/tolerance.h: max|x − ref| ≤ 2·max|standard − ref| + atol
 *     (STANDARD = our cuBLAS path in the same dtype);
 *   - v with a head_dim of its own (dv != dqk): STANDARD runs any pair, the FLASH2 forward and backward the pairs
 *     their tables build ((192, 128), also deterministic), the FLASH3 forward (192, 128) in 16 bits and its backward
 *     with FA_CUDA_FLASH3_BWD_PAIRS=1 (scripts/test-gpu.sh sets it), FLASH1 none (FA_ERR_UNSUPPORTED naming v); AUTO
 *     runs FLASH3's forward and FLASH3's backward (FLASH2's without the switch) for (192, 128), STANDARD for the
 *     other pairs;
 *   - FLASH2 and FLASH3 deterministic backward: dq, dk, dv bitwise identical over two runs, the second in another
 *     context (its own workspace); FLASH3's with more key blocks than resident CTAs finishes (det_liveness);
 *   - FLASH3's backward with dQ converted by its own pass and in its main kernel (FA_CUDA_FLASH3_BWD_FUSED_DQ;
 *     scripts/test-gpu.sh sets 1), the deterministic instance bit for bit the same either way;
 *   - the FLASH3 forward's 2-CTA cluster instance runs exactly where the plan should pick it, is checked as above,
 *     and gives out and LSE bit for bit as the single-CTA kernel does (FA_CUDA_FLASH3_CLUSTER=0).
 * Seeds are printed; replay with FA_TEST_SEED. FA_GPU_TEST_SMALL=1 runs a few small cases (compute-sanitizer);
 * FA_GPU_TEST_SHARD=i/n runs every n-th of them from the i-th (parallel sanitizer runs).
 * Each case's line ends with the seconds its oracle and its device calls took. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "testlib.h"

static void cuda_ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "CUDA error in test harness (%s): %s\n", what, cudaGetErrorString(e));
        exit(2);
    }
}

/* A device mirror of a host t_buf: same bytes, same view offset and strides. */
typedef struct dbuf {
    t_buf *h;
    unsigned char *mem;
    fa_tensor t;
} dbuf;

static dbuf d_new(t_buf *h) {
    dbuf d;
    d.h = h;
    cuda_ok(cudaMalloc((void **)&d.mem, h->mem_bytes), "cudaMalloc");
    d.t = h->t;
    d.t.data = d.mem + ((unsigned char *)h->t.data - h->mem);
    return d;
}
static void d_up(dbuf *d) { cuda_ok(cudaMemcpy(d->mem, d->h->mem, d->h->mem_bytes, cudaMemcpyHostToDevice), "up"); }
static void d_down(dbuf *d) { cuda_ok(cudaMemcpy(d->h->mem, d->mem, d->h->mem_bytes, cudaMemcpyDeviceToHost), "down"); }
static void d_free(dbuf *d) { cudaFree(d->mem); }

/* A packed batch's cu_seqlens (and seqused) moved to the device, as a CUDA context reads them, with the longest
 * lengths as the bounds (fa_attn_opts.max_seqlen_q/k); returns the allocation to free (NULL without varlen). */
static int32_t *dev_varlen(fa_attn_opts *o) {
    if (!o->cu_seqlens_q) return NULL;
    const int64_t n = o->n_seqs + 1;
    int32_t *d = NULL;
    cuda_ok(cudaMalloc((void **)&d, 4 * (size_t)n * sizeof(int32_t)), "cudaMalloc cu_seqlens");
    cuda_ok(cudaMemcpy(d, o->cu_seqlens_q, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice), "cu_seqlens_q up");
    cuda_ok(cudaMemcpy(d + n, o->cu_seqlens_k, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice), "cu_seqlens_k up");
    if (o->seqused_q) {
        cuda_ok(cudaMemcpy(d + 2 * n, o->seqused_q, (size_t)(n - 1) * sizeof(int32_t), cudaMemcpyHostToDevice), "seqused_q");
        o->seqused_q = d + 2 * n;
    }
    if (o->seqused_k) {
        cuda_ok(cudaMemcpy(d + 3 * n, o->seqused_k, (size_t)(n - 1) * sizeof(int32_t), cudaMemcpyHostToDevice), "seqused_k");
        o->seqused_k = d + 3 * n;
    }
    for (int64_t s = 0; s < o->n_seqs; ++s) {
        const int64_t a = o->cu_seqlens_q[s + 1] - o->cu_seqlens_q[s], b = o->cu_seqlens_k[s + 1] - o->cu_seqlens_k[s];
        if (a > o->max_seqlen_q) o->max_seqlen_q = a;
        if (b > o->max_seqlen_k) o->max_seqlen_k = b;
    }
    o->cu_seqlens_q = d, o->cu_seqlens_k = d + n;
    return d;
}

static int aligned16(const dbuf *d) {
    return ((uintptr_t)d->t.data % 16) == 0 && d->t.stride_batch % 8 == 0 && d->t.stride_seq % 8 == 0 &&
           d->t.stride_head % 8 == 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* FA_CUDA_FLASH3_BWD_PAIRS=1 (read by the contexts at creation, as here): the FLASH3 backward's (192, 128) row. */
static int flash3_bwd_pairs(void) {
    const char *e = getenv("FA_CUDA_FLASH3_BWD_PAIRS");
    return e && atoi(e) != 0;
}
/* The (dqk, dv) pairs with dv != dqk the tile tables build (src/cuda/mma_sync/tiles.h, src/cuda/wgmma/tiles.h):
 * (192, 128) for the FLASH2 forward and backward, the FLASH3 forward (16-bit) and, with the switch, its backward;
 * no FLASH1 row. */
static int flash_pair_built(fa_algo a, int64_t d, int64_t dv, int backward) {
    return d == 192 && dv == 128 &&
           (a == FA_ALGO_FLASH2 || (a == FA_ALGO_FLASH3 && (!backward || flash3_bwd_pairs())));
}

/* Expected: does the CUDA backend run algo a on this case? (nb = 8: the backward's tensors; FLASH3 runs the forward
 * only, so its row is asked with the forward's 4) */
static int cuda_runs(fa_algo a, const t_case *c, dbuf **bufs, int nb) {
    if (a == FA_ALGO_STANDARD) return 1;
    const int pair = t_case_dv(c) != c->d;
    if (pair && !flash_pair_built(a, c->d, t_case_dv(c), 0)) return 0;
    if (a == FA_ALGO_FLASH3) { /* varlen, seqused and attention_chunk too */
        if (c->dt == FA_DTYPE_F32 || !(pair || c->d == 64 || c->d == 128 || c->d == 256))
            return 0;
        for (int i = 0; i < 4; ++i) /* TMA: 16-byte aligned rows, no broadcast (a zero stride over an extent > 1) */
            if (!aligned16(bufs[i]) || (bufs[i]->t.stride_batch == 0 && bufs[i]->t.batch > 1)) return 0;
        return c->opts.block_q || c->opts.block_k ? -1 : 1; /* explicit tiles: runs where they are FLASH3's own */
    }
    /* FLASH1 and FLASH2: head_dim 32, 64, 96, 128; FLASH2 also 256 and its pairs */
    if (c->dt == FA_DTYPE_F32 || !(pair || c->d == 32 || c->d == 64 || c->d == 96 || c->d == 128 ||
                                   (a == FA_ALGO_FLASH2 && c->d == 256)))
        return 0;
    if (c->opts.block_q || c->opts.block_k) return -1; /* either: depends on the tile table */
    for (int i = 0; i < nb; ++i)
        if (!aligned16(bufs[i])) return 0;
    return 1;
}

/* The backward of algo a: its forward's rule and, for a pair of head dims, a backward row of its own. */
static int bwd_runs(fa_algo a, const t_case *c, dbuf **bufs) {
    const int r = cuda_runs(a, c, bufs, 8);
    return t_case_dv(c) != c->d && a != FA_ALGO_STANDARD && !flash_pair_built(a, c->d, t_case_dv(c), 1) ? 0 : r;
}

/* FLASH3's backward: head_dim 64, 128 or 256 (varlen and seqused too, not attention_chunk) or a pair it builds, all
 * 8 views TMA-addressable; explicit tiles: -1 (either) */
static int flash3_bwd_runs(const t_case *c, dbuf **bufs) {
    const int pair = t_case_dv(c) != c->d;
    if (c->dt == FA_DTYPE_F32 || c->opts.attention_chunk ||
        (pair ? !flash_pair_built(FA_ALGO_FLASH3, c->d, t_case_dv(c), 1)
              : !(c->d == 64 || c->d == 128 || c->d == 256)))
        return 0;
    for (int i = 0; i < 8; ++i)
        if (!aligned16(bufs[i]) || (bufs[i]->t.stride_batch == 0 && bufs[i]->t.batch > 1)) return 0;
    return c->opts.block_q || c->opts.block_k ? -1 : 1;
}

#define N_ALGOS 4
static const fa_algo algos[N_ALGOS] = {FA_ALGO_STANDARD, FA_ALGO_FLASH1, FA_ALGO_FLASH2, FA_ALGO_FLASH3};

static double lse_err(const float *lse, const double *ref, int64_t n) { return t_max_diff_f(lse, ref, n); }

static fa_context *ctx_other; /* the deterministic backward's second run: another context, another workspace */

/* FA_GPU_TEST_SHARD=i/n: this process runs cases i, i + n, ... only, so that n sanitizer runs share the work */
static int shard_i = 0, shard_n = 1, shard_next = 0;

/* The FLASH3 forward row of explicit tiles runs (run_case accepts a refusal of explicit tiles either way). */
static void flash3_row_runs(fa_context *ctx, int d, int bq, int bk, const char *kernel) {
    snprintf(t_case_label, sizeof t_case_label, "FLASH3 forward row %s by block_q %d, block_k %d", kernel, bq, bk);
    t_buf q = t_buf_new(FA_DTYPE_BF16, 1, 300, 2, d, T_BSHD), o = t_buf_new(FA_DTYPE_BF16, 1, 300, 2, d, T_BSHD);
    t_buf_randn(&q, 1);
    dbuf dq = d_new(&q), dout = d_new(&o);
    d_up(&dq);
    fa_attn_opts op = fa_attn_opts_default();
    op.algo = FA_ALGO_FLASH3, op.block_q = bq, op.block_k = bk;
    CHECK_STATUS(fa_forward(ctx, &op, &dq.t, &dq.t, &dq.t, &dout.t, NULL), FA_OK);
    fa_stats st;
    CHECK_STATUS(fa_last_stats(ctx, &st), FA_OK);
    CHECK_STR_CONTAINS(st.kernel, kernel);
    d_free(&dq), d_free(&dout);
    t_buf_free(&q), t_buf_free(&o);
    t_case_label[0] = 0;
}

/* The FLASH3 forward of (d, sq, one head, causal or not) runs the 2-CTA cluster instance (kernel "….cl2") exactly when
 * want says: unmasked, an even number of 128-row query blocks, d 128 or 256, clusters on in ctx. */
static void flash3_cluster_pick(fa_context *ctx, int d, int sq, int causal, int want) {
    snprintf(t_case_label, sizeof t_case_label, "FLASH3 forward clusters: d %d, sq %d, causal %d", d, sq, causal);
    t_buf q = t_buf_new(FA_DTYPE_BF16, 1, sq, 1, d, T_BSHD), o = t_buf_new(FA_DTYPE_BF16, 1, sq, 1, d, T_BSHD);
    t_buf_randn(&q, 1);
    dbuf dq = d_new(&q), dout = d_new(&o);
    d_up(&dq);
    fa_attn_opts op = fa_attn_opts_default();
    op.algo = FA_ALGO_FLASH3, op.causal = causal;
    CHECK_STATUS(fa_forward(ctx, &op, &dq.t, &dq.t, &dq.t, &dout.t, NULL), FA_OK);
    fa_stats st;
    CHECK_STATUS(fa_last_stats(ctx, &st), FA_OK);
    CHECK_MSG((strstr(st.kernel, ".cl2") != NULL) == want, "kernel %s, cluster instance expected: %d", st.kernel, want);
    d_free(&dq), d_free(&dout);
    t_buf_free(&q), t_buf_free(&o);
    t_case_label[0] = 0;
}

/* One FLASH3 forward call (opts op, explicit tiles bq x bk or 0) in ctx and in each of the n contexts cs, out and
 * LSE bit for bit alike: a tile's arithmetic and key order do not depend on which CTA runs it, on its Q buffer or on
 * when its index was taken. cl: whether ctx's run is the 2-CTA cluster instance and the others' are not; -1: not
 * checked. */
static void flash3_same(fa_context *ctx, fa_context *const *cs, int n, const char *what, int b, int sq, int sk, int hq,
                        int hk, int d, const fa_attn_opts *op, int cl) {
    snprintf(t_case_label, sizeof t_case_label, "FLASH3 %s: b %d, sq %d, sk %d, hq %d, d %d, causal %d, window (%d, "
             "%d), tiles %d x %d", what, b, sq, sk, hq, d, op->causal, op->window_left, op->window_right, op->block_q,
             op->block_k);
    t_buf q = t_buf_new(FA_DTYPE_BF16, b, sq, hq, d, T_BSHD), k = t_buf_new(FA_DTYPE_BF16, b, sk, hk, d, T_BSHD);
    t_buf v = t_buf_new(FA_DTYPE_BF16, b, sk, hk, d, T_BSHD), o = t_buf_new(FA_DTYPE_BF16, b, sq, hq, d, T_BSHD);
    t_buf_randn(&q, 1), t_buf_randn(&k, 1), t_buf_randn(&v, 1);
    dbuf Q = d_new(&q), K = d_new(&k), V = d_new(&v), O = d_new(&o);
    d_up(&Q), d_up(&K), d_up(&V);
    const size_t nl = (size_t)b * hq * sq, no = o.mem_bytes;
    float *dl = NULL, *l2 = malloc(2 * nl * sizeof(float));
    unsigned char *o2 = malloc(2 * no);
    cuda_ok(cudaMalloc((void **)&dl, nl * sizeof(float)), "cudaMalloc lse");
    for (int i = 0; i <= n; ++i) { /* each run on poisoned outputs (0xffff: NaN); run 0 in ctx, kept */
        fa_context *c = i ? cs[i - 1] : ctx;
        cuda_ok(cudaMemset(O.mem, 0xff, no), "poison out");
        cuda_ok(cudaMemset(dl, 0xff, nl * sizeof(float)), "poison lse");
        CHECK_STATUS(fa_forward(c, op, &Q.t, &K.t, &V.t, &O.t, dl), FA_OK);
        fa_stats st;
        CHECK_STATUS(fa_last_stats(c, &st), FA_OK);
        if (cl >= 0) CHECK_MSG((strstr(st.kernel, ".cl2") != NULL) == (cl && !i), "kernel %s, run %d", st.kernel, i);
        const int j = i ? 1 : 0;
        cuda_ok(cudaMemcpy(o2 + j * no, O.mem, no, cudaMemcpyDeviceToHost), "out down");
        cuda_ok(cudaMemcpy(l2 + j * nl, dl, nl * sizeof(float), cudaMemcpyDeviceToHost), "lse down");
        if (!i) continue;
        CHECK_MSG(memcmp(o2, o2 + no, no) == 0, "out differs between the contexts (run %d, kernel %s)", i, st.kernel);
        CHECK_MSG(memcmp(l2, l2 + nl, nl * sizeof(float)) == 0, "LSE differs between the contexts (run %d, kernel %s)",
                  i, st.kernel);
    }
    free(o2), free(l2), cudaFree(dl);
    d_free(&Q), d_free(&K), d_free(&V), d_free(&O);
    t_buf_free(&q), t_buf_free(&k), t_buf_free(&v), t_buf_free(&o);
    t_case_label[0] = 0;
}

/* The cluster instance (ctx) and the single-CTA one (c1: FA_CUDA_FLASH3_CLUSTER=0) give out and LSE bit for bit
 * alike. */
static void flash3_cluster_same(fa_context *ctx, fa_context *c1, int b, int sq, int sk, int hq, int hk, int d) {
    fa_attn_opts op = fa_attn_opts_default();
    op.algo = FA_ALGO_FLASH3;
    flash3_same(ctx, &c1, 1, "clusters against one CTA", b, sq, sk, hq, hk, d, &op, 1);
}

static void run_case(fa_context *ctx, t_case *c, int backward) {
    if (shard_next++ % shard_n != shard_i) return;
    char desc[400];
    t_case_describe(c, desc, sizeof desc);
    snprintf(t_case_label, sizeof t_case_label, "gpu %s %s", backward ? "bwd" : "fwd", desc);
    printf("gpu %s %s:", backward ? "bwd" : "fwd", desc);
    fflush(stdout);
    t_layout lo = c->lay_o == T_BCAST ? T_BSHD : c->lay_o;
    const int64_t e = t_case_dv(c); /* v, out, dout, dv */
    t_buf q = t_buf_new(c->dt, c->b, c->sq, c->hq, c->d, c->lay_q);
    t_buf k = t_buf_new(c->dt, c->b, c->sk, c->hk, c->d, c->lay_kv);
    t_buf v = t_buf_new(c->dt, c->b, c->sk, c->hk, e, c->lay_kv);
    t_buf o = t_buf_new(c->dt, c->b, c->sq, c->hq, e, lo);
    t_buf dout = t_buf_new(c->dt, c->b, c->sq, c->hq, e, lo);
    t_buf dq = t_buf_new(c->dt, c->b, c->sq, c->hq, c->d, lo);
    t_buf dk = t_buf_new(c->dt, c->b, c->sk, c->hk, c->d, lo);
    t_buf dv = t_buf_new(c->dt, c->b, c->sk, c->hk, e, lo);
    const double sigma = c->sigma > 0 ? c->sigma : 1;
    t_buf_randn(&q, sigma);
    t_buf_randn(&k, sigma);
    t_buf_randn(&v, 1);
    t_buf_randn(&dout, 1);
    t_case_pad(c, &q, &k, &v, &dout);
    dbuf Q = d_new(&q), K = d_new(&k), V = d_new(&v), O = d_new(&o), DO = d_new(&dout), DQ = d_new(&dq), DK = d_new(&dk),
         DV = d_new(&dv);
    d_up(&Q), d_up(&K), d_up(&V), d_up(&DO);
    dbuf *fwd_bufs[4] = {&Q, &K, &V, &O}, *all_bufs[8] = {&Q, &K, &V, &O, &DO, &DQ, &DK, &DV};

    const int64_t nq = c->b * c->sq * c->hq * c->d, nk = c->b * c->sk * c->hk * c->d, nl = c->b * c->hq * c->sq;
    const int64_t no = c->b * c->sq * c->hq * e, nv = c->b * c->sk * c->hk * e;
    double *ref = malloc(sizeof(double) * (size_t)(no > 0 ? no : 1)), *rlse = malloc(sizeof(double) * (size_t)(nl > 0 ? nl : 1));
    double *rdq = NULL, *rdk = NULL, *rdv = NULL;
    fa_attn_opts opts = c->opts;
    const double t0 = now_s();
    CHECK_STATUS(t_oracle_forward(&opts, &q.t, &k.t, &v.t, ref, rlse), FA_OK);
    CHECK_MSG(!c->nonfinite_padding || (t_all_finite(ref, no, 0) && t_all_finite(rlse, nl, 1)),
              "the oracle's out or lse is not finite: it read padding");
    const double refmax = t_max_abs(ref, no);
    double lscale = t_max_abs(rlse, nl);
    if (!(lscale > 1)) lscale = 1;
    double mq = 0, mk = 0, mv = 0, gmax = 0;
    if (backward) {
        rdq = malloc(sizeof(double) * (size_t)(nq > 0 ? nq : 1));
        rdk = malloc(sizeof(double) * (size_t)(nk > 0 ? nk : 1));
        rdv = malloc(sizeof(double) * (size_t)(nv > 0 ? nv : 1));
        CHECK_STATUS(t_oracle_backward(&opts, &q.t, &k.t, &v.t, &dout.t, rdq, rdk, rdv), FA_OK);
        CHECK_MSG(!c->nonfinite_padding ||
                      (t_all_finite(rdq, nq, 0) && t_all_finite(rdk, nk, 0) && t_all_finite(rdv, nv, 0)),
                  "the oracle's gradients are not finite: it read padding");
        mq = t_max_abs(rdq, nq), mk = t_max_abs(rdk, nk), mv = t_max_abs(rdv, nv);
        gmax = fmax(mq, fmax(mk, mv));
    }
    const double t1 = now_s();
    int32_t *dcu = dev_varlen(&opts); /* after the oracle, which reads the host arrays */
    float *lse = malloc(sizeof(float) * (size_t)(nl > 0 ? nl : 1)), *dlse = NULL;
    cuda_ok(cudaMalloc((void **)&dlse, sizeof(float) * (size_t)(nl > 0 ? nl : 1)), "cudaMalloc lse");

    double err_std = 0, lse_std = 0, gstd[3] = {0, 0, 0};
    for (int ai = 0; ai < N_ALGOS; ++ai) {
        const fa_algo a = algos[ai];
        const int expect = cuda_runs(a, c, backward ? all_bufs : fwd_bufs, backward ? 8 : 4);
        /* FLASH3's backward where it is built, else FLASH2's from FLASH3's out and lse where FLASH2 runs it */
        const int f3b = backward && a == FA_ALGO_FLASH3 ? flash3_bwd_runs(c, all_bufs) : 0;
        const fa_algo ab = a == FA_ALGO_FLASH3 && f3b != 1 ? FA_ALGO_FLASH2 : a;
        const int expect_b = a == FA_ALGO_FLASH3 && f3b != 1 ? bwd_runs(ab, c, all_bufs)
                             : backward && a != FA_ALGO_FLASH3 ? bwd_runs(a, c, all_bufs) : expect;
        for (int det = 0; det <= (backward && (ab == FA_ALGO_FLASH2 || ab == FA_ALGO_FLASH3) ? 1 : 0); ++det) {
            opts.algo = a;
            opts.deterministic = det;
            t_buf_poison(&o);
            d_up(&O);
            for (int64_t i = 0; i < nl; ++i) lse[i] = t_nanf();
            cuda_ok(cudaMemcpy(dlse, lse, sizeof(float) * (size_t)(nl > 0 ? nl : 1), cudaMemcpyHostToDevice), "lse up");
            fa_status st = fa_forward(ctx, &opts, &Q.t, &K.t, &V.t, &O.t, dlse);
            if (st == FA_ERR_UNSUPPORTED && expect != 1) {
                CHECK_MSG(strlen(fa_context_last_error(ctx)) > 10, "%s: UNSUPPORTED without a reason", fa_algo_name(a));
                if (e != c->d && c->dt != FA_DTYPE_F32 && !flash_pair_built(a, c->d, e, 0)) /* refused for the pair */
                    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "v: head_dim");
                printf(" %s:unsupported", fa_algo_name(a));
                break;
            }
            CHECK_STATUS(st, FA_OK);
            if (st != FA_OK) {
                fprintf(stderr, "  %s: %s\n", fa_algo_name(a), fa_context_last_error(ctx));
                break;
            }
            cuda_ok(cudaDeviceSynchronize(), "sync after forward");
            d_down(&O);
            cuda_ok(cudaMemcpy(lse, dlse, sizeof(float) * (size_t)(nl > 0 ? nl : 1), cudaMemcpyDeviceToHost), "lse down");
            fa_stats s;
            CHECK_STATUS(fa_last_stats(ctx, &s), FA_OK);
            CHECK(s.algo == a && s.kernel && strncmp(s.kernel, "cuda.", 5) == 0);
            const int64_t bad = t_buf_check_written(&o);
            CHECK_MSG(bad == 0, "%s: %lld elements of out not written or written outside the view", fa_algo_name(a),
                      (long long)bad);
            if (!backward || det == 0) {
                const double err = t_max_diff(&o.t, ref), lerr = lse_err(lse, rlse, nl);
                if (a == FA_ALGO_STANDARD) err_std = err, lse_std = lerr;
                t_check_err("out", a, c->dt, err, err_std, refmax, 0, c->relax);
                CHECK_MSG(lerr <= 2e-5 * lscale, "%s lse: max abs err %.3e > 2e-5 x %.3g", fa_algo_name(a), lerr, lscale);
                if (a != FA_ALGO_STANDARD)
                    CHECK_MSG(lerr <= 2 * lse_std + 4e-6 * lscale, "%s lse: max abs err %.3e > 2 x standard's %.3e + %.3e",
                              fa_algo_name(a), lerr, lse_std, 4e-6 * lscale);
                if (!backward) printf(" %s %.1e/%.1e", fa_algo_name(a), err, lerr);
            }
            if (!backward) break;

            if (a == FA_ALGO_FLASH3 && f3b != 1 && det == 0) { /* not built for this call: refused, with a reason */
                fa_attn_opts f3 = opts;
                st = fa_backward(ctx, &f3, &Q.t, &K.t, &V.t, &O.t, dlse, &DO.t, &DQ.t, &DK.t, &DV.t);
                if (f3b == 0) {
                    CHECK_STATUS(st, FA_ERR_UNSUPPORTED);
                    CHECK_MSG(strlen(fa_context_last_error(ctx)) > 10, "FLASH3 bwd: UNSUPPORTED without a reason");
                }
                cuda_ok(cudaDeviceSynchronize(), "sync after FLASH3 backward");
            }
            /* backward from this algorithm's own out and lse */
            unsigned char *dq_first = NULL;
            for (int rep = 0; rep < (det ? 2 : 1); ++rep) {
                t_buf_poison(&dq), t_buf_poison(&dk), t_buf_poison(&dv);
                d_up(&DQ), d_up(&DK), d_up(&DV);
                fa_attn_opts bopts = opts;
                bopts.algo = ab;
                fa_context *bctx = det && rep == 1 && ctx_other ? ctx_other : ctx;
                st = fa_backward(bctx, &bopts, &Q.t, &K.t, &V.t, &O.t, dlse, &DO.t, &DQ.t, &DK.t, &DV.t);
                if (expect_b == 0) { /* the backward's views rule it out (e.g. dO or a gradient not 16-byte aligned): refused */
                    CHECK_STATUS(st, FA_ERR_UNSUPPORTED);
                    CHECK_MSG(strlen(fa_context_last_error(ctx)) > 10, "%s bwd: UNSUPPORTED without a reason",
                              fa_algo_name(a));
                    printf(" %s:bwd-unsupported", fa_algo_name(a));
                    break;
                }
                CHECK_STATUS(st, FA_OK);
                if (st != FA_OK) {
                    fprintf(stderr, "  %s bwd: %s\n", fa_algo_name(a), fa_context_last_error(bctx));
                    break;
                }
                cuda_ok(cudaDeviceSynchronize(), "sync after backward");
                d_down(&DQ), d_down(&DK), d_down(&DV);
                CHECK_MSG(t_buf_check_written(&dq) == 0 && t_buf_check_written(&dk) == 0 && t_buf_check_written(&dv) == 0,
                          "%s%s: gradient elements not written (NaN) or written outside the view", fa_algo_name(a),
                          det ? " deterministic" : "");
                if (det && rep == 0) {
                    dq_first = malloc(dq.mem_bytes + dk.mem_bytes + dv.mem_bytes + 1);
                    memcpy(dq_first, dq.mem, dq.mem_bytes);
                    memcpy(dq_first + dq.mem_bytes, dk.mem, dk.mem_bytes);
                    memcpy(dq_first + dq.mem_bytes + dk.mem_bytes, dv.mem, dv.mem_bytes);
                } else if (det) {
                    CHECK_MSG(memcmp(dq_first, dq.mem, dq.mem_bytes) == 0 &&
                                  memcmp(dq_first + dq.mem_bytes, dk.mem, dk.mem_bytes) == 0 &&
                                  memcmp(dq_first + dq.mem_bytes + dk.mem_bytes, dv.mem, dv.mem_bytes) == 0,
                              "%s deterministic: dq, dk or dv differs between runs", fa_algo_name(ab));
                }
            }
            free(dq_first);
            if (st != FA_OK) break;
            const double e[3] = {t_max_diff(&dq.t, rdq), t_max_diff(&dk.t, rdk), t_max_diff(&dv.t, rdv)};
            const char *nm[3] = {"dq", "dk", "dv"};
            for (int g = 0; g < 3; ++g) {
                if (a == FA_ALGO_STANDARD) gstd[g] = e[g];
                t_check_err(nm[g], a, c->dt, e[g], gstd[g], gmax, 1, c->relax);
            }
            printf(" %s%s%s %.1e/%.1e/%.1e", fa_algo_name(a), ab != a ? "(bwd FLASH2)" : "", det ? "(det)" : "", e[0],
                   e[1], e[2]);
        }
    }
    /* AUTO: FLASH3 exactly where it runs the call, else FLASH2 where it does, else STANDARD (the forward) */
    if (!backward) {
        opts.algo = FA_ALGO_AUTO;
        t_buf_poison(&o);
        d_up(&O);
        fa_status st = fa_forward(ctx, &opts, &Q.t, &K.t, &V.t, &O.t, dlse);
        CHECK_STATUS(st, FA_OK);
        if (st == FA_OK) {
            const int f3 = cuda_runs(FA_ALGO_FLASH3, c, fwd_bufs, 4), f2 = cuda_runs(FA_ALGO_FLASH2, c, fwd_bufs, 4);
            const fa_algo want = f3 == 1 ? FA_ALGO_FLASH3 : f2 == 1 ? FA_ALGO_FLASH2 : FA_ALGO_STANDARD;
            fa_stats s;
            CHECK_STATUS(fa_last_stats(ctx, &s), FA_OK);
            /* with explicit tiles (-1) the first algorithm that has them runs */
            const int either = (f3 == -1 && s.algo == FA_ALGO_FLASH3) || (f3 != 1 && f2 == -1 && s.algo == FA_ALGO_FLASH2);
            CHECK_MSG(s.algo == want || either, "auto ran %s, expected %s", fa_algo_name(s.algo), fa_algo_name(want));
            cuda_ok(cudaDeviceSynchronize(), "sync after auto");
            d_down(&O);
            CHECK_MSG(t_buf_check_written(&o) == 0, "auto: out not written in full");
            printf(" auto=%s", fa_algo_name(s.algo));
        } else {
            fprintf(stderr, "  auto: %s\n", fa_context_last_error(ctx));
        }
    }
    /* AUTO backward: FLASH3 exactly where it is built for the call (every row of src/cuda/wgmma/tiles.h is ahead of
     * FLASH2: auto_pick), else FLASH2 where it runs, else STANDARD */
    if (backward && c->opts.block_q == 0 && c->opts.block_k == 0) {
        opts.algo = FA_ALGO_AUTO;
        opts.deterministic = 0;
        fa_status st = fa_forward(ctx, &opts, &Q.t, &K.t, &V.t, &O.t, dlse);
        if (st == FA_OK) st = fa_backward(ctx, &opts, &Q.t, &K.t, &V.t, &O.t, dlse, &DO.t, &DQ.t, &DK.t, &DV.t);
        CHECK_STATUS(st, FA_OK);
        if (st == FA_OK) {
            const fa_algo want = flash3_bwd_runs(c, all_bufs) == 1 ? FA_ALGO_FLASH3
                                 : bwd_runs(FA_ALGO_FLASH2, c, all_bufs) ? FA_ALGO_FLASH2
                                                                            : FA_ALGO_STANDARD;
            fa_stats s;
            CHECK_STATUS(fa_last_stats(ctx, &s), FA_OK);
            CHECK_MSG(s.algo == want, "auto backward ran %s, expected %s", fa_algo_name(s.algo), fa_algo_name(want));
            cuda_ok(cudaDeviceSynchronize(), "sync after auto backward");
            printf(" auto-bwd=%s", fa_algo_name(s.algo));
        } else {
            fprintf(stderr, "  auto backward: %s\n", fa_context_last_error(ctx));
        }
    }
    printf(" [oracle %.2fs, device %.2fs]\n", t1 - t0, now_s() - t1);
    free(ref), free(rlse), free(rdq), free(rdk), free(rdv), free(lse);
    cudaFree(dlse), cudaFree(dcu);
    for (int i = 0; i < 8; ++i) d_free(all_bufs[i]);
    t_buf_free(&q), t_buf_free(&k), t_buf_free(&v), t_buf_free(&o), t_buf_free(&dout), t_buf_free(&dq),
        t_buf_free(&dk), t_buf_free(&dv);
    t_case_label[0] = 0;
}

/* Varlen case: n sequences with the given lengths packed into batch 1. */
static t_case varlen_case(int n, const int *lq, const int *lk, int hq, int hk, int d, fa_dtype dt, int32_t *cq,
                          int32_t *ck) {
    cq[0] = ck[0] = 0;
    for (int i = 0; i < n; ++i) cq[i + 1] = cq[i] + lq[i], ck[i + 1] = ck[i] + lk[i];
    t_case c = t_case_make(1, cq[n], ck[n], hq, hk, d, dt);
    c.opts.cu_seqlens_q = cq;
    c.opts.cu_seqlens_k = ck;
    c.opts.n_seqs = n;
    return c;
}

/* FLASH3's deterministic backward with more key blocks per head than the GPU holds CTAs (24k keys: 192 blocks of
 * 128, 384 of 64 at d = 256): key blocks wait for each other's dQ turn, so a block that waited for one not yet
 * started would hang. Two runs, the same bits; no oracle (the causal and windowed orders are what matter here, the
 * values are checked on the shapes above). */
static void det_liveness(fa_context *ctx) {
    enum { S = 24576, H = 1 };
    for (int d = 64; d <= 256; d *= 2)
        for (int mask = 0; mask < 3; ++mask) {
            snprintf(t_case_label, sizeof t_case_label, "FLASH3 deterministic backward, %d keys, d %d, %s", S, d,
                     mask == 0 ? "no mask" : mask == 1 ? "causal" : "window (512, 0)");
            t_buf q = t_buf_new(FA_DTYPE_BF16, 1, S, H, d, T_BSHD), k = t_buf_new(FA_DTYPE_BF16, 1, S, H, d, T_BSHD);
            t_buf v = t_buf_new(FA_DTYPE_BF16, 1, S, H, d, T_BSHD), o = t_buf_new(FA_DTYPE_BF16, 1, S, H, d, T_BSHD);
            t_buf dout = t_buf_new(FA_DTYPE_BF16, 1, S, H, d, T_BSHD), g[3];
            for (int i = 0; i < 3; ++i) g[i] = t_buf_new(FA_DTYPE_BF16, 1, S, H, d, T_BSHD);
            t_buf_randn(&q, 1), t_buf_randn(&k, 1), t_buf_randn(&v, 1), t_buf_randn(&dout, 1);
            dbuf Q = d_new(&q), K = d_new(&k), V = d_new(&v), O = d_new(&o), DO = d_new(&dout), G[3];
            for (int i = 0; i < 3; ++i) G[i] = d_new(&g[i]);
            d_up(&Q), d_up(&K), d_up(&V), d_up(&DO);
            float *lse = NULL;
            cuda_ok(cudaMalloc((void **)&lse, sizeof(float) * S * H), "cudaMalloc lse");
            fa_attn_opts opts = fa_attn_opts_default();
            opts.algo = FA_ALGO_FLASH3, opts.deterministic = 1;
            opts.causal = mask == 1;
            if (mask == 2) opts.window_left = 512, opts.window_right = 0;
            fa_status st = fa_forward(ctx, &opts, &Q.t, &K.t, &V.t, &O.t, lse);
            CHECK_STATUS(st, FA_OK);
            unsigned char *first = NULL;
            for (int rep = 0; rep < 2 && st == FA_OK; ++rep) {
                st = fa_backward(ctx, &opts, &Q.t, &K.t, &V.t, &O.t, lse, &DO.t, &G[0].t, &G[1].t, &G[2].t);
                CHECK_STATUS(st, FA_OK);
                cuda_ok(cudaDeviceSynchronize(), "sync after the deterministic backward");
                for (int i = 0; i < 3; ++i) d_down(&G[i]);
                if (rep == 0) {
                    first = malloc(3 * g[0].mem_bytes);
                    for (int i = 0; i < 3; ++i) memcpy(first + i * g[0].mem_bytes, g[i].mem, g[0].mem_bytes);
                } else {
                    int same = 1;
                    for (int i = 0; i < 3; ++i) same &= memcmp(first + i * g[0].mem_bytes, g[i].mem, g[0].mem_bytes) == 0;
                    CHECK_MSG(same, "dq, dk or dv differs between two deterministic runs");
                }
            }
            free(first);
            cudaFree(lse);
            d_free(&Q), d_free(&K), d_free(&V), d_free(&O), d_free(&DO);
            for (int i = 0; i < 3; ++i) d_free(&G[i]), t_buf_free(&g[i]);
            t_buf_free(&q), t_buf_free(&k), t_buf_free(&v), t_buf_free(&o), t_buf_free(&dout);
        }
}

/* A packed batch captured in a CUDA graph (forward and backward) and replayed after the device cu_seqlens change:
 * the host reads nothing of them (max_seqlen_q/k bound the launch), so the capture needs no synchronisation, and each
 * replay computes the lengths the arrays hold at that time — the same bits as an eager call at those lengths, and
 * the oracle's result. */
static void varlen_graph(fa_context *ctx) {
    enum { N = 3, HQ = 4, HK = 2, D = 64, TQ = 101, TK = 127 };
    static const int32_t cq[2][N + 1] = {{0, 37, 37, 101}, {0, 64, 100, 101}}; /* lengths (37, 0, 64), (64, 36, 1) */
    static const int32_t ck[2][N + 1] = {{0, 50, 63, 127}, {0, 13, 77, 127}}; /* (50, 13, 64), (13, 64, 50) */
    snprintf(t_case_label, sizeof t_case_label, "varlen graph capture and replay");
    t_buf q = t_buf_new(FA_DTYPE_F16, 1, TQ, HQ, D, T_BSHD), k = t_buf_new(FA_DTYPE_F16, 1, TK, HK, D, T_BSHD);
    t_buf v = t_buf_new(FA_DTYPE_F16, 1, TK, HK, D, T_BSHD), o = t_buf_new(FA_DTYPE_F16, 1, TQ, HQ, D, T_BSHD);
    t_buf dout = t_buf_new(FA_DTYPE_F16, 1, TQ, HQ, D, T_BSHD), dq = t_buf_new(FA_DTYPE_F16, 1, TQ, HQ, D, T_BSHD);
    t_buf dk = t_buf_new(FA_DTYPE_F16, 1, TK, HK, D, T_BSHD), dv = t_buf_new(FA_DTYPE_F16, 1, TK, HK, D, T_BSHD);
    t_buf_randn(&q, 1), t_buf_randn(&k, 1), t_buf_randn(&v, 1), t_buf_randn(&dout, 1);
    dbuf Q = d_new(&q), K = d_new(&k), V = d_new(&v), O = d_new(&o), DO = d_new(&dout), DQ = d_new(&dq),
         DK = d_new(&dk), DV = d_new(&dv);
    d_up(&Q), d_up(&K), d_up(&V), d_up(&DO);
    int32_t *cu = NULL;
    float *lse = NULL;
    cuda_ok(cudaMalloc((void **)&cu, 2 * (N + 1) * sizeof(int32_t)), "cudaMalloc cu");
    cuda_ok(cudaMalloc((void **)&lse, HQ * TQ * sizeof(float)), "cudaMalloc lse");
    cudaStream_t st;
    cuda_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
    CHECK_STATUS(fa_context_set_stream(ctx, st), FA_OK);
    fa_attn_opts op = fa_attn_opts_default();
    op.algo = FA_ALGO_FLASH2, op.causal = 1, op.n_seqs = N;
    op.cu_seqlens_q = cu, op.cu_seqlens_k = cu + N + 1, op.max_seqlen_q = 64, op.max_seqlen_k = 64;
    const size_t nq = q.mem_bytes, nk = k.mem_bytes;
    unsigned char *eager[3], *graph[3];
    dbuf *outs[3] = {&O, &DQ, &DK};
    for (int i = 0; i < 3; i++) eager[i] = malloc(i ? (i == 1 ? nq : nk) : nq), graph[i] = malloc(i == 2 ? nk : nq);
    /* eager at each set of lengths (which also sizes the context's workspace before the capture) */
    for (int set = 1; set >= 0; set--) {
        cuda_ok(cudaMemcpy(cu, cq[set], sizeof cq[set], cudaMemcpyHostToDevice), "cu up");
        cuda_ok(cudaMemcpy(cu + N + 1, ck[set], sizeof ck[set], cudaMemcpyHostToDevice), "cu up");
        CHECK_STATUS(fa_forward(ctx, &op, &Q.t, &K.t, &V.t, &O.t, lse), FA_OK);
        CHECK_STATUS(fa_backward(ctx, &op, &Q.t, &K.t, &V.t, &O.t, lse, &DO.t, &DQ.t, &DK.t, &DV.t), FA_OK);
        cuda_ok(cudaStreamSynchronize(st), "eager");
        if (set == 1)
            for (int i = 0; i < 3; i++)
                cuda_ok(cudaMemcpy(eager[i], outs[i]->mem, i == 2 ? nk : nq, cudaMemcpyDeviceToHost), "down");
    }
    /* captured at lengths 0 */
    cudaGraph_t g;
    cudaGraphExec_t ge;
    cuda_ok(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), "begin capture");
    const fa_status f = fa_forward(ctx, &op, &Q.t, &K.t, &V.t, &O.t, lse);
    const fa_status b = fa_backward(ctx, &op, &Q.t, &K.t, &V.t, &O.t, lse, &DO.t, &DQ.t, &DK.t, &DV.t);
    cuda_ok(cudaStreamEndCapture(st, &g), "end capture");
    CHECK_MSG(f == FA_OK && b == FA_OK, "capture: %s / %s: %s", fa_status_string(f), fa_status_string(b),
              fa_context_last_error(ctx));
    cuda_ok(cudaGraphInstantiate(&ge, g, 0), "instantiate");
    /* replayed at lengths 1: the eager call's bits, and the oracle's result */
    cuda_ok(cudaMemcpy(cu, cq[1], sizeof cq[1], cudaMemcpyHostToDevice), "cu up");
    cuda_ok(cudaMemcpy(cu + N + 1, ck[1], sizeof ck[1], cudaMemcpyHostToDevice), "cu up");
    t_buf_poison(&o), t_buf_poison(&dq), t_buf_poison(&dk);
    d_up(&O), d_up(&DQ), d_up(&DK);
    cuda_ok(cudaGraphLaunch(ge, st), "replay");
    cuda_ok(cudaStreamSynchronize(st), "replay");
    for (int i = 0; i < 3; i++) {
        cuda_ok(cudaMemcpy(graph[i], outs[i]->mem, i == 2 ? nk : nq, cudaMemcpyDeviceToHost), "down");
        CHECK_MSG(!memcmp(graph[i], eager[i], i == 2 ? nk : nq), "replay: %s differs from the eager call",
                  (const char *[]){"out", "dq", "dk"}[i]);
    }
    d_down(&O);
    fa_attn_opts host = op; /* the oracle reads host arrays */
    host.cu_seqlens_q = cq[1], host.cu_seqlens_k = ck[1];
    double *ref = malloc(sizeof(double) * TQ * HQ * D), *rl = malloc(sizeof(double) * HQ * TQ);
    CHECK_STATUS(t_oracle_forward(&host, &q.t, &k.t, &v.t, ref, rl), FA_OK);
    const double err = t_max_diff(&o.t, ref);
    CHECK_MSG(err < 1e-2, "replay: max |out - oracle| = %.3g", err);
    printf("varlen graph: replay %s, max error %.2g\n", t_failures ? "FAILED" : "ok", err);
    free(ref), free(rl);
    for (int i = 0; i < 3; i++) free(eager[i]), free(graph[i]);
    cuda_ok(cudaGraphExecDestroy(ge), "destroy");
    cuda_ok(cudaGraphDestroy(g), "destroy");
    CHECK_STATUS(fa_context_set_stream(ctx, NULL), FA_OK);
    cuda_ok(cudaStreamDestroy(st), "stream");
    cudaFree(cu), cudaFree(lse);
    dbuf *all[8] = {&Q, &K, &V, &O, &DO, &DQ, &DK, &DV};
    for (int i = 0; i < 8; i++) d_free(all[i]);
    t_buf_free(&q), t_buf_free(&k), t_buf_free(&v), t_buf_free(&o), t_buf_free(&dout), t_buf_free(&dq),
        t_buf_free(&dk), t_buf_free(&dv);
    t_case_label[0] = 0;
}

static void unsupported_checks(fa_context *ctx) {
    /* reasons come from the selector before any launch: no device memory is touched (NULL-free dummies) */
    t_case c = t_case_make(1, 8, 8, 1, 1, 80, FA_DTYPE_BF16); /* head_dim 80: aligned rows, no flash kernel */
    t_buf q = t_buf_new(c.dt, 1, 8, 1, 80, T_BSHD), o = t_buf_new(c.dt, 1, 8, 1, 80, T_BSHD);
    dbuf Q = d_new(&q), O = d_new(&o);
    fa_attn_opts op = fa_attn_opts_default();
    op.algo = FA_ALGO_FLASH2;
    CHECK_STATUS(fa_forward(ctx, &op, &Q.t, &Q.t, &Q.t, &O.t, NULL), FA_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "head_dim 80");
    op.algo = FA_ALGO_STANDARD;
    d_up(&Q);
    CHECK_STATUS(fa_forward(ctx, &op, &Q.t, &Q.t, &Q.t, &O.t, NULL), FA_OK);
    d_free(&Q), d_free(&O), t_buf_free(&q), t_buf_free(&o);
    /* v of its own head_dim on FLASH3: refused naming v and both dims */
    t_buf q2 = t_buf_new(FA_DTYPE_BF16, 1, 8, 1, 128, T_BSHD), v2 = t_buf_new(FA_DTYPE_BF16, 1, 8, 1, 64, T_BSHD);
    dbuf Q2 = d_new(&q2), V2 = d_new(&v2), O2 = d_new(&v2);
    op.algo = FA_ALGO_FLASH3;
    CHECK_STATUS(fa_forward(ctx, &op, &Q2.t, &Q2.t, &V2.t, &O2.t, NULL), FA_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "v: head_dim 64 differs from q's 128");
    d_free(&Q2), d_free(&V2), d_free(&O2), t_buf_free(&q2), t_buf_free(&v2);
    printf("unsupported: %s\n", t_failures ? "FAILED" : "ok");
}

/* A CUDA context created with environment variable name=value (read at creation only), or NULL (a failed check). */
static fa_context *ctx_with_env(const char *name, const char *value) {
    setenv(name, value, 1);
    fa_context *c = NULL;
    const fa_status st = fa_context_create(&c, FA_BACKEND_CUDA, 0);
    unsetenv(name);
    CHECK(st == FA_OK);
    return st == FA_OK ? c : NULL;
}
/* A context created with FA_CUDA_FLASH3_QBUF=qbuf and FA_CUDA_FLASH3_EARLY_TILE=early (the FLASH3 forward's tile
 * boundary, src/cuda/wgmma/README.md) */
static fa_context *ctx_flash3_boundary(int qbuf, int early) {
    setenv("FA_CUDA_FLASH3_EARLY_TILE", early ? "1" : "0", 1);
    fa_context *c = ctx_with_env("FA_CUDA_FLASH3_QBUF", qbuf ? "1" : "0");
    unsetenv("FA_CUDA_FLASH3_EARLY_TILE");
    return c;
}

/* The split-wave cases' head dim di (64, 128, 256) and its backward tile Br x Bc. */
static void split_tile(int di, int *d, int *bm, int *bn) {
    *d = di == 2 ? 256 : di ? 128 : 64, *bn = *d == 256 ? 64 : 128, *bm = *d == 64 ? 128 : 64;
}

int main(void) {
    t_init("test_gpu");
    fa_context *ctx = NULL;
    fa_status st = fa_context_create(&ctx, FA_BACKEND_CUDA, 0);
    if (st != FA_OK) {
        fprintf(stderr, "test_gpu: no CUDA context: %s (%s)\n", fa_status_string(st), fa_create_error());
        return 1;
    }
    const int small = getenv("FA_GPU_TEST_SMALL") != NULL;
    const char *shard = getenv("FA_GPU_TEST_SHARD");
    if (shard && (sscanf(shard, "%d/%d", &shard_i, &shard_n) != 2 || shard_n < 1 || shard_i < 0 || shard_i >= shard_n)) {
        fprintf(stderr, "test_gpu: FA_GPU_TEST_SHARD=%s: expected i/n with 0 <= i < n\n", shard);
        return 2;
    }
    static const fa_dtype dts[2] = {FA_DTYPE_BF16, FA_DTYPE_F16};
    CHECK_STATUS(fa_context_create(&ctx_other, FA_BACKEND_CUDA, 0), FA_OK);

    if (shard_i == 0) {
        unsupported_checks(ctx);
        varlen_graph(ctx);
    }
    if (!small && shard_i == 0) det_liveness(ctx);
    /* fixed shapes: awkward seqlens, sq != sk, both head dims, both dtypes, masks */
    static const int shapes[][4] = {{1, 1, 64, 1},    {2, 3, 3, 64},    {1, 113, 239, 64}, {2, 239, 113, 128},
                                    {1, 128, 128, 128}, {1, 1023, 1023, 64}, {1, 256, 512, 128}, {1, 4224, 4224, 128}};
    const int nshape = small ? 3 : (int)(sizeof shapes / sizeof shapes[0]);
    for (int si = 0; si < nshape; ++si)
        for (int di = 0; di < 2; ++di)
            for (int mode = 0; mode < (small ? 2 : 5); ++mode) {
                const int d = shapes[si][3] == 1 ? 64 : shapes[si][3];
                t_case c = t_case_make(shapes[si][0], shapes[si][1], shapes[si][2], 2, mode == 3 ? 1 : 2, d, dts[di]);
                if (mode == 3) c.hq = 4; /* GQA 4:1 */
                if (mode == 1) c.opts.causal = 1;
                if (mode == 2) c.opts.window_left = 37, c.opts.window_right = 5;
                if (mode == 4) c.opts.softcap = 20.f, c.opts.causal = 1, c.lay_q = T_BHSD, c.lay_kv = T_STRIDED;
                if (shapes[si][1] > 2000 && mode > 1) continue;
                run_case(ctx, &c, 0);
                if (shapes[si][1] <= 1100) run_case(ctx, &c, 1);
            }
    /* the extra head dims (32, 96, 256; forward and backward; FLASH1 at 256: FA_ERR_UNSUPPORTED expected), the
     * fixed shapes' masks and layouts, both dtypes */
    for (int di = 0; di < 3; ++di)
        for (int mode = 0; mode < (small ? 2 : 5); ++mode) {
            const int d = di == 2 ? 256 : di ? 96 : 32;
            t_case c = t_case_make(2, small ? 113 : 239, small ? 239 : 1023, 2, mode == 3 ? 1 : 2, d, dts[mode & 1]);
            if (mode == 3) c.hq = 4; /* GQA 4:1 */
            if (mode == 1) c.opts.causal = 1;
            if (mode == 2) c.opts.window_left = 37, c.opts.window_right = 5;
            if (mode == 4) c.opts.softcap = 20.f, c.opts.causal = 1, c.lay_q = T_BHSD, c.lay_kv = T_STRIDED;
            run_case(ctx, &c, 0);
            run_case(ctx, &c, 1);
        }
    /* every built FLASH2 forward tile configuration (opts.block_q/block_k); the small set (compute-sanitizer) keeps
     * 300 keys — still several key blocks with a partial one — as racecheck's time grows with every access */
    const int tile_sk = small ? 300 : 1023;
    {
        static const int tiles[][3] = {{64, 128, 64}, {64, 256, 64},  {64, 128, 128}, {64, 64, 64},   {128, 128, 64},
                                       {128, 64, 64}, {128, 128, 32}, {32, 128, 64},  {32, 128, 128}, {256, 128, 64},
                                       {256, 64, 64}, {96, 128, 64}, {128, 256, 64}};
        for (int ti = 0; ti < (int)(sizeof tiles / sizeof tiles[0]); ++ti) {
            t_case c = t_case_make(2, 239, tile_sk, 2, 1, tiles[ti][0], FA_DTYPE_BF16);
            c.opts.causal = ti % 2;
            c.opts.block_q = tiles[ti][1], c.opts.block_k = tiles[ti][2];
            run_case(ctx, &c, 0);
        }
        /* the single-stage d=256 64 x 64 row (the default; one K and one V buffer, loads ordered inside the step):
         * the other mask modes, f16, a left window (the loop ends above block 0) and keys within one block */
        for (int v = 0; v < 4; ++v) {
            t_case c = t_case_make(2, v == 3 ? 70 : 239, v == 3 ? 40 : tile_sk, 2, 1, 256,
                                   v == 1 ? FA_DTYPE_F16 : FA_DTYPE_BF16);
            c.opts.causal = v == 1;
            if (v == 2) c.opts.window_left = 100, c.opts.window_right = 7;
            c.opts.block_q = 64, c.opts.block_k = 64;
            run_case(ctx, &c, 0);
        }
    }
    /* every built FLASH2 backward tile (opts.block_q; Bc = 128), odd lengths, sq != sk, causal and not, GQA */
    {
        static const int tiles[][2] = {{64, 128}, {64, 64}, {128, 64}, {32, 128}, {32, 64}, {96, 64}, {256, 64}};
        for (int ti = 0; ti < 7; ++ti)
            for (int v = 0; v < (small ? 1 : 3); ++v) {
                t_case c = t_case_make(2, v == 2 ? 300 : 239, v == 1 ? 77 : tile_sk, 2, v == 2 ? 1 : 2, tiles[ti][0],
                                       v == 1 ? FA_DTYPE_F16 : FA_DTYPE_BF16);
                c.opts.causal = v != 0;
                c.opts.block_q = tiles[ti][1], c.opts.block_k = tiles[ti][0] == 256 ? 64 : 128;
                run_case(ctx, &c, 1);
            }
    }
    /* the 8-warp d=128 forward row, reachable only through FA_CUDA_FLASH2_FWD_WARPS (read at context creation):
     * explicit 128 x 64 and the default tile, both dtypes, causal and not, plus an odd-length GQA case */
    {
        fa_context *c8 = ctx_with_env("FA_CUDA_FLASH2_FWD_WARPS", "8");
        if (c8) {
            for (int ti = 0; ti < (small ? 1 : 4); ++ti) {
                t_case c = t_case_make(2, 239, tile_sk, 2, ti == 3 ? 1 : 2, 128, dts[ti & 1]);
                c.opts.causal = ti % 2;
                if (ti < 2) c.opts.block_q = 128, c.opts.block_k = 64;
                run_case(c8, &c, 0);
            }
            fa_context_destroy(c8);
        }
    }
    /* regression: B·Hq·Sq odd (615 rows) put the fp32 dQ accumulator at a 4-byte offset in the workspace, and its
     * float2 accesses faulted (flashattn check, seed 730645 case 286) */
    {
        t_case c = t_case_make(1, 205, 63, 3, 3, 64, FA_DTYPE_F16);
        c.opts.causal = 1;
        c.opts.softcap = 28.93f;
        c.lay_q = T_BHSD;
        run_case(ctx, &c, 1);
        c.hk = 1; /* GQA 3:1 */
        run_case(ctx, &c, 1);
    }
    /* varlen with an empty sequence, sq > sk (fully masked rows under causal) */
    {
        int32_t cq[5], ck[5];
        const int lq[4] = {17, 0, 130, 64}, lk[4] = {33, 5, 64, 200};
        for (int di = 0; di < 4; ++di)
            for (int causal = 0; causal < 2; ++causal) {
                static const int vd[4] = {64, 128, 32, 96};
                t_case c = varlen_case(4, lq, lk, 4, 2, vd[di], dts[di & 1], cq, ck);
                c.opts.causal = causal;
                run_case(ctx, &c, 0);
                run_case(ctx, &c, 1);
            }
    }
    /* seqused_q/k (used lengths inside the spans, 0 and whole spans too): every algorithm against the oracle, the
     * padding rows 0 / -inf and zero gradients of padding rows and keys (every output is poisoned first), with NaN
     * and ±inf in the padding rows of q, k, v and dout, which must reach no output */
    {
        int32_t cq[5], ck[5];
        static const int lq[4] = {17, 0, 130, 64}, lk[4] = {33, 5, 64, 200};
        static const int32_t uq[4] = {9, 0, 130, 1}, uk[4] = {33, 0, 20, 150};
        for (int di = 0; di < 4; ++di)
            for (int m = 0; m < 3; ++m) {
                static const int vd[4] = {64, 128, 32, 96};
                t_case c = varlen_case(4, lq, lk, 4, 2, vd[di], dts[di & 1], cq, ck);
                c.opts.causal = m == 1, c.opts.window_left = m == 2 ? 16 : -1;
                c.opts.seqused_q = m == 2 ? NULL : uq, c.opts.seqused_k = uk;
                c.nonfinite_padding = 1;
                run_case(ctx, &c, 0);
                run_case(ctx, &c, 1);
            }
    }
    /* the FLASH2 backward's split last wave (flash2_bwd.cu): N = 2·Hq K/V blocks, the last N mod #SMs of them walked
     * in pieces that add partial dK, dV, the second block of each head partial. Default threshold (walks of >= 2048
     * query rows): N ≈ #SMs + 18 (pieces cross block boundaries) and #SMs + 4 (one piece per query block); then
     * every walk split (FA_CUDA_BWD_SPLIT_ROWS=0, read at context creation) on 2 query blocks: N ≈ #SMs + 68 (pieces
     * cross), the small set's (sanitizer) case. */
    int sms = 0;
    cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
    if (!small)
        for (int di = 0; di < 3; ++di)
            for (int v = 0; v < 2; ++v) {
                int d, bm, bn;
                split_tile(di, &d, &bm, &bn);
                const int hq = v ? sms / 2 + 2 : (sms + 19) / 2;
                t_case c = t_case_make(1, 2048 + bm - 17, 2 * bn - 37, hq, hq, d, dts[(di + v) & 1]);
                run_case(ctx, &c, 1);
            }
    {
        fa_context *c0 = ctx_with_env("FA_CUDA_BWD_SPLIT_ROWS", "0");
        if (c0) {
            for (int di = 0; di < (small ? 1 : 3); ++di) {
                int d, bm, bn;
                split_tile(di, &d, &bm, &bn);
                const int hq = (sms + 69) / 2;
                t_case c = t_case_make(1, 2 * bm - 17, 2 * bn - 37, hq, hq, d, dts[di & 1]);
                run_case(c0, &c, 1);
            }
            { /* MLA's pair (192, 128), 64 x 64 tiles: the split blocks' fp32 dK rows of 192, dV rows of 128 */
                t_case c = t_case_make(1, 2 * 64 - 17, 2 * 64 - 37, (sms + 69) / 2, (sms + 69) / 2, 192, FA_DTYPE_BF16);
                c.dv = 128;
                run_case(c0, &c, 1);
            }
            fa_context_destroy(c0);
        }
    }
    /* FLASH3: odd lengths, sq != sk both ways, every mask mode, GQA 1/4/8, both dtypes, layouts, head dims 64, 128,
     * 256, logits of magnitude 1e4 (sigma 100 at d = 128), fully masked rows (causal with sq > sk, a window
     * beyond the keys), softcap (plain and causal), varlen */
    {
        static const int lens[][2] = {{1, 1}, {17, 113}, {113, 17}, {1023, 1023}, {300, 4097}, {4097, 4097}};
        const int nl = small ? 3 : (int)(sizeof lens / sizeof lens[0]);
        for (int li = 0; li < nl; ++li)
            for (int di = 0; di < 3; ++di)
                for (int mode = 0; mode < (small ? 2 : 6); ++mode) {
                    const int d = di == 0 ? 64 : di == 1 ? 128 : 256, sq = lens[li][0], sk = lens[li][1];
                    if (sq * (int64_t)sk > 1 << 22 && (d != 128 || mode > 1)) continue; /* the oracle's time */
                    static const int groups[3] = {1, 4, 8};
                    const int g = groups[(li + mode) % 3];
                    t_case c = t_case_make(li % 2 ? 2 : 1, sq, sk, 8, 8 / g, d, dts[(li + di + mode) & 1]);
                    if (mode == 1) c.opts.causal = 1;
                    if (mode == 2) c.opts.window_left = 37, c.opts.window_right = 5;
                    if (mode == 3) c.opts.window_left = 100, c.lay_q = T_BHSD, c.lay_kv = T_STRIDED;
                    if (mode == 4) c.opts.window_left = 0, c.opts.window_right = 0, c.lay_o = T_STRIDED;
                    /* logits ~1e4: a near one-hot softmax whose P rounding is the error of every algorithm alike
                     * (STANDARD's own f16 error reaches the sanity ceiling at d = 256): relax 2 */
                    if (mode == 5) c.opts.causal = 1, c.sigma = 100, c.relax = 2;
                    run_case(ctx, &c, 0);
                    if (sq * (int64_t)sk <= 1 << 20 && mode < 2) run_case(ctx, &c, 1);
                }
        for (int v = 0; v < 3; ++v) {
            t_case c = t_case_make(v + 1, 130 + 500 * v, 257 + 300 * v, 4, v ? 1 : 2, v == 2 ? 256 : 64 << v,
                                   v == 1 ? FA_DTYPE_F16 : FA_DTYPE_BF16);
            c.opts.softcap = v == 2 ? 5.f : 30.f;
            c.opts.causal = v == 1;
            run_case(ctx, &c, 0);
            if (v == 2) run_case(ctx, &c, 1); /* the d = 256 backward's softcap */
        }
        /* three consumer warpgroups at d = 64 (192 x 128, the default from 4096 keys on, tiles.h) at any length
         * through opts.block_q / block_k: odd lengths, GQA, causal, a window, fully masked rows */
        flash3_row_runs(ctx, 64, 192, 128, "d64.192x128");
        for (int v = 0; v < (small ? 1 : 4); ++v) {
            static const int l3[4][2] = {{300, 457}, {1023, 1023}, {17, 113}, {450, 200}};
            t_case c = t_case_make(v % 2 + 1, l3[v][0], l3[v][1], 8, v == 1 ? 2 : 8, 64, dts[v & 1]);
            c.opts.block_q = 192, c.opts.block_k = 128;
            if (v == 1) c.opts.causal = 1;
            if (v == 2) c.opts.window_left = 37, c.opts.window_right = 5;
            if (v == 3) c.opts.causal = 1, c.lay_q = T_BHSD; /* sq > sk: fully masked rows */
            run_case(ctx, &c, 0);
        }
        /* varlen: the FLASH3 forward reads each tile's sequence from the device cu_seqlens (an empty sequence, one
         * row, lengths across block edges; tiles past a sequence's end; rows past it in a block are its neighbour's);
         * its backward too (below) */
        for (int v = 0; v < (small ? 2 : 6); ++v) {
            int32_t cq[5], ck[5];
            static const int lq[2][4] = {{100, 0, 130, 1}, {1, 257, 1000, 128}}, lk[2][4] = {{64, 7, 300, 129},
                                                                                              {1000, 1, 513, 128}};
            const int d = v % 3 == 0 ? 128 : v % 3 == 1 ? 64 : 256;
            t_case cv = varlen_case(4, lq[v & 1], lk[v & 1], 4, v < 3 ? 4 : 1, d, v & 1 ? FA_DTYPE_BF16 : FA_DTYPE_F16,
                                    cq, ck);
            if (v % 3 == 0) cv.opts.causal = 1;
            if (v % 3 == 2) cv.opts.window_left = 40, cv.opts.window_right = 3;
            run_case(ctx, &cv, 0);
            if (v < 3) run_case(ctx, &cv, 1);
            if (d != 256 && !small) { /* the rows taken from 4096 keys on (tiles.h), here through their tiles */
                cv.opts.block_q = d == 64 ? 192 : 128, cv.opts.block_k = d == 64 ? 128 : 176;
                run_case(ctx, &cv, 0);
            }
        }
    }
    /* FLASH3's 2-CTA clusters (K and V loaded half by each CTA and multicast to both): unmasked fixed-length calls
     * with an even number of query blocks per head at d = 128 and 256. One key block of fewer keys than half of it
     * (the second CTA's half all zeros), a partial last block, many blocks, the wide key block (explicit and from
     * 4096 keys on), more tiles than the grid (several waves of pairs), GQA and MQA, batches, query rows past sq in the
     * last block, softcap, both dtypes; the pick (an odd number of query blocks, causal, d = 64 and
     * FA_CUDA_FLASH3_CLUSTER=0 run the single-CTA kernel) */
    {
        static const int cc[][7] = {/* b, sq, sk, hq, hk, d, block_k */
                                    {2, 256, 64, 8, 2, 128, 0},    {1, 250, 33, 4, 4, 256, 0},
                                    {1, 512, 1000, 4, 1, 128, 0},  {2, 256, 500, 4, 2, 128, 176},
                                    {1, 256, 4500, 2, 1, 128, 0},  {1, 512, 2000, 2, 2, 256, 0},
                                    {2, 1024, 130, 16, 8, 128, 0}, {2, 768, 90, 16, 4, 256, 0}};
        for (int i = 0; i < 8; ++i) {
            if (small && i > 1 && i != 6) continue; /* the sanitizer's: one key block, and several waves */
            t_case c = t_case_make(cc[i][0], cc[i][1], cc[i][2], cc[i][3], cc[i][4], cc[i][5], dts[i & 1]);
            c.opts.block_k = cc[i][6], c.opts.block_q = cc[i][6] ? 128 : 0;
            if (i == 2 || i == 5) c.opts.softcap = 20.f;
            run_case(ctx, &c, 0);
        }
        flash3_cluster_pick(ctx, 128, 256, 0, 1);
        flash3_cluster_pick(ctx, 256, 1024, 0, 1);
        flash3_cluster_pick(ctx, 128, 300, 0, 0);
        flash3_cluster_pick(ctx, 128, 256, 1, 0);
        flash3_cluster_pick(ctx, 64, 256, 0, 0);
        fa_context *c0 = ctx_with_env("FA_CUDA_FLASH3_CLUSTER", "0");
        if (c0) {
            flash3_cluster_pick(c0, 128, 256, 0, 0);
            t_case c = t_case_make(2, 256, 500, 4, 2, 128, FA_DTYPE_BF16); /* the same call without clusters */
            run_case(c0, &c, 0);
            if (shard_i == 0) { /* once over the sanitizers' shards */
                flash3_cluster_same(ctx, c0, 2, 1024, 700, 16, 4, 128); /* several waves of pairs */
                flash3_cluster_same(ctx, c0, 1, 512, 4500, 4, 4, 128);  /* the 176-key row */
                flash3_cluster_same(ctx, c0, 3, 256, 333, 8, 2, 256);
            }
            fa_context_destroy(c0);
        }
    }
    /* FLASH3 forward's tile boundary (two Q buffers where the build and the row have them, on by default; the next
     * tile's index a tile ahead, off by default): many tiles per CTA (more than the SMs: several waves),
     * 1-2 and many key blocks, causal (the dynamic longest-first order), windows, no mask (the static snake, with and
     * without clusters), tiles without keys right after full ones (causal with sq > sk: the longest-first order
     * hands them out last; varlen: empty sequences and tiles past a sequence's end), d = 64 (both rows), 128, 256
     * (rows with one Q buffer: the early index only). Checked against the oracle on and off, and bit for bit against
     * the three other settings of FA_CUDA_FLASH3_QBUF / FA_CUDA_FLASH3_EARLY_TILE. */
    {
        fa_context *cb[3] = {ctx_flash3_boundary(0, 0), ctx_flash3_boundary(0, 1), ctx_flash3_boundary(1, 1)};
        if (cb[0] && cb[1] && cb[2]) {
            /* b, sq, sk, hq, hk, d, causal, window_left, window_right, block_q, block_k */
            static const int bc[][11] = {{2, 1000, 1000, 16, 4, 64, 1, -1, -1, 0, 0},
                                         {1, 2000, 300, 16, 16, 128, 1, -1, -1, 0, 0},
                                         {4, 300, 100, 40, 8, 128, 0, -1, -1, 0, 0},
                                         {4, 256, 100, 40, 8, 128, 0, -1, -1, 0, 0},
                                         {2, 700, 900, 20, 5, 64, 0, 37, 5, 0, 0},
                                         {2, 1500, 1500, 12, 4, 64, 1, -1, -1, 192, 128},
                                         {1, 1024, 1024, 20, 4, 256, 1, -1, -1, 0, 0},
                                         {1, 1000, 200, 24, 8, 64, 0, 0, 0, 0, 0},
                                         {3, 600, 4200, 16, 2, 128, 1, -1, -1, 128, 128}};
            for (int i = 0; i < (int)(sizeof bc / sizeof bc[0]); ++i) {
                if (small && i != 1 && i != 3) continue; /* the sanitizer's: empty tiles after full ones; clusters */
                fa_attn_opts op = fa_attn_opts_default();
                op.algo = FA_ALGO_FLASH3, op.causal = bc[i][6], op.window_left = bc[i][7];
                op.window_right = bc[i][8], op.block_q = bc[i][9], op.block_k = bc[i][10];
                if (shard_i == 0)
                    flash3_same(ctx, cb, 3, "tile boundary", bc[i][0], bc[i][1], bc[i][2], bc[i][3], bc[i][4],
                                bc[i][5], &op, -1);
                if (small || bc[i][1] * (int64_t)bc[i][2] > 1 << 21) continue; /* the oracle's time */
                t_case c = t_case_make(bc[i][0], bc[i][1], bc[i][2], bc[i][3], bc[i][4], bc[i][5], dts[i & 1]);
                c.opts.causal = op.causal, c.opts.window_left = op.window_left, c.opts.window_right = op.window_right;
                c.opts.block_q = op.block_q, c.opts.block_k = op.block_k;
                run_case(ctx, &c, 0);
                run_case(cb[0], &c, 0);
            }
            /* varlen, several waves: empty sequences (q, k), one row, tiles past a sequence's end; no mask (the
             * static snake) and causal (the counter) */
            for (int v = 0; v < (small ? 1 : 4); ++v) {
                int32_t cq[6], ck[6];
                static const int lq[5] = {300, 0, 700, 1, 513}, lk[5] = {500, 7, 700, 0, 129};
                t_case c = varlen_case(5, lq, lk, 16, 4, v % 2 ? 64 : 128, dts[v & 1], cq, ck);
                c.opts.causal = v >= 2;
                run_case(ctx, &c, 0);
                if (!small) run_case(cb[v % 3], &c, 0);
            }
        }
        for (int i = 0; i < 3; ++i) fa_context_destroy(cb[i]);
    }
    /* FLASH3's varlen backward (flash3_bwd.cu: a CTA per key block of each sequence at max_seqlen_k, TMA boxes
     * that end at the sequence's last row): odd lengths across block edges, an empty sequence (q, k or both) in the
     * middle and at the end, one row, seqlen_q != seqlen_k both ways under causal (bottom-right per sequence, fully
     * masked rows), GQA 1/4/8, windows, softcap, both dtypes, head dims 64, 128, 256; run_case runs the
     * deterministic instance too (bitwise the same twice, in two contexts). The small set (compute-sanitizer)
     * keeps two short cases. */
    {
        static const int lq[3][5] = {{113, 0, 239, 65, 0}, {1, 300, 130, 64, 17}, {40, 0, 7, 129, 0}};
        static const int lk[3][5] = {{77, 5, 300, 0, 17}, {129, 64, 257, 64, 0}, {70, 0, 1, 129, 0}};
        static const int groups[3] = {4, 1, 8};
        for (int di = 0; di < 3; ++di)
            for (int mode = 0; mode < 4; ++mode) {
                const int d = di == 0 ? 64 : di == 1 ? 128 : 256, set = small ? 2 : (di + mode) % 3;
                if (small && !((di == 0 && mode == 1) || (di == 2 && mode == 2))) continue;
                int32_t cq[6], ck[6];
                t_case c = varlen_case(5, lq[set], lk[set], 8, 8 / groups[(di + mode) % 3], d, dts[(di + mode) & 1],
                                       cq, ck);
                if (mode == 1) c.opts.causal = 1;
                if (mode == 2) c.opts.window_left = 37, c.opts.window_right = 5;
                if (mode == 3) c.opts.softcap = 20.f, c.opts.causal = 1;
                run_case(ctx, &c, 1);
            }
    }
    /* FLASH3's backward with dQ converted by its own pass (FA_CUDA_FLASH3_BWD_FUSED_DQ=0), in the main kernel (=1)
     * and there for the deterministic instance as well (=2; flash3_bwd_dq.cuh): d 64 and 128, causal with sq > sk
     * (rows that see no key: their dQ 0 from the pre-pass), GQA, windows, several query blocks a key block, varlen
     * with empty sequences. run_case checks both instances against the oracle, and the deterministic one bit for bit
     * against its run in ctx_other (the environment's setting: every conversion gives the same bits). The small set
     * keeps one case of each setting. */
    {
        static const char *set[3] = {"0", "1", "2"};
        /* b, sq, sk, hq, hk, d, mode (0 none, 1 causal, 2 window) */
        static const int fc[][7] = {{2, 700, 300, 8, 2, 128, 1}, {1, 1000, 1000, 4, 4, 64, 0},
                                    {2, 239, 513, 4, 1, 64, 2},  {1, 300, 900, 8, 8, 128, 0}};
        for (int si = 0; si < 3; ++si) {
            fa_context *cf = ctx_with_env("FA_CUDA_FLASH3_BWD_FUSED_DQ", set[si]);
            if (!cf) continue;
            for (int i = 0; i < (small ? 1 : 4); ++i) {
                t_case c = t_case_make(fc[i][0], fc[i][1], fc[i][2], fc[i][3], fc[i][4], fc[i][5], dts[(i + si) & 1]);
                c.opts.causal = fc[i][6] == 1;
                if (fc[i][6] == 2) c.opts.window_left = 37, c.opts.window_right = 5;
                run_case(cf, &c, 1);
            }
            if (!small) {
                int32_t cq[6], ck[6];
                static const int lq[5] = {300, 0, 129, 1, 700}, lk[5] = {100, 9, 0, 64, 650};
                t_case c = varlen_case(5, lq, lk, 8, 2, si % 2 ? 64 : 128, dts[si & 1], cq, ck);
                c.opts.causal = 1;
                run_case(cf, &c, 1);
            }
            fa_context_destroy(cf);
        }
    }
    /* attention_chunk (Llama 4's chunked local attention) on STANDARD, FLASH1, FLASH2 forward and backward and the
     * FLASH3 forward (its backward refuses it: FLASH2's runs from FLASH3's out and lse): chunks shorter and longer
     * than a tile, with causal and windows, sq != sk both ways, GQA, varlen */
    {
        static const int cs[][6] = {{64, 0, 200, 200, 64, 1},  {37, 1, 300, 300, 128, 4}, {128, 1, 113, 517, 64, 1},
                                    {16, 0, 517, 113, 96, 2},  {5, 1, 239, 239, 32, 8},   {200, 1, 1023, 1023, 128, 1}};
        for (int i = 0; i < (small ? 2 : 6); ++i) {
            t_case c = t_case_make(i % 2 + 1, cs[i][2], cs[i][3], 8, 8 / cs[i][5], cs[i][4], dts[i & 1]);
            c.opts.attention_chunk = cs[i][0], c.opts.causal = cs[i][1];
            if (i == 3) c.opts.window_left = 40, c.opts.window_right = 7;
            run_case(ctx, &c, 0);
            run_case(ctx, &c, 1);
        }
        int32_t cq[4], ck[4];
        const int lq[3] = {100, 0, 130}, lk[3] = {64, 7, 300};
        t_case cv = varlen_case(3, lq, lk, 4, 4, 128, FA_DTYPE_F16, cq, ck);
        cv.opts.causal = 1, cv.opts.attention_chunk = 48;
        run_case(ctx, &cv, 0);
        run_case(ctx, &cv, 1);
    }
    /* v with a head_dim of its own: MLA's (192, 128) and (128, 192), pairs of built and unbuilt dims, masks, GQA,
     * softcap, layouts, varlen; STANDARD runs each, the flash algorithms where their tables build the pair (else
     * FA_ERR_UNSUPPORTED naming v), AUTO what runs */
    {
        static const int pairs[][2] = {{192, 128}, {128, 192}, {128, 64}, {64, 32}, {96, 128}, {80, 48}};
        for (int pi = 0; pi < 6; ++pi)
            for (int mode = 0; mode < (small ? 2 : 5); ++mode) {
                t_case c = t_case_make(2, small ? 113 : 239, small ? 239 : 1023, 4, mode == 3 ? 1 : 2, pairs[pi][0],
                                       dts[(pi + mode) & 1]);
                c.dv = pairs[pi][1];
                if (mode == 1) c.opts.causal = 1;
                if (mode == 2) c.opts.window_left = 37, c.opts.window_right = 5;
                if (mode == 4) c.opts.softcap = 20.f, c.opts.causal = 1, c.lay_q = T_BHSD, c.lay_kv = T_STRIDED;
                run_case(ctx, &c, 0);
                run_case(ctx, &c, 1);
            }
        /* more tiles than SMs (the FLASH3 forward's persistent CTAs take several, their stages' phases carried on);
         * the backward's 64 x 64 tiles over 11 key blocks and GQA's 4 query heads a K/V head */
        for (int causal = 0; causal < (small ? 0 : 2); ++causal) {
            t_case c = t_case_make(2, 700, 700, 16, 4, 192, causal ? FA_DTYPE_F16 : FA_DTYPE_BF16);
            c.dv = 128, c.opts.causal = causal;
            run_case(ctx, &c, 0);
            run_case(ctx, &c, 1);
        }
        int32_t cq[5], ck[5];
        static const int lq[4] = {17, 0, 130, 64}, lk[4] = {33, 5, 64, 200};
        t_case c = varlen_case(4, lq, lk, 4, 2, 192, FA_DTYPE_BF16, cq, ck);
        c.dv = 128, c.opts.causal = 1;
        run_case(ctx, &c, 0);
        run_case(ctx, &c, 1);
        c.dt = FA_DTYPE_F32; /* STANDARD's f32 path (cuBLAS fp32 GEMMs) */
        run_case(ctx, &c, 1);
    }
    /* random small cases (any dtype, head_dim, layout, mask; explicit tiles dropped half the time) */
    for (int i = 0; i < (small ? 2 : 40); ++i) {
        t_case c = t_case_random(239, 128, 1);
        if (t_randint(0, 1)) {
            static const int rd[4] = {64, 128, 32, 96};
            c.d = rd[t_randint(0, 3)];
        }
        if (c.dt == FA_DTYPE_F32 && t_randint(0, 1)) c.dt = FA_DTYPE_BF16;
        if (t_randint(0, 1)) c.opts.block_q = c.opts.block_k = 0;
        run_case(ctx, &c, i % 2);
    }
    fa_context_destroy(ctx);
    fa_context_destroy(ctx_other);
    return t_finish();
}
