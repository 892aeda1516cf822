/* Ring attention on the CPU through the thread transport (one thread and one context per rank): world 1..4, causal
 * (zigzag shards) and not, f32/f16/bf16, GQA/MQA, head dims 16..256, softcap and scale, strided shards, sinks (joined
 * by step 0's call; d sinks: each rank's share, summed over the ranks). Each rank's out, LSE, dq, dk, dv (and
 * d sinks) are gathered into the whole sequence (un-zigzagged) and judged against the float64 oracle by the rule of
 * tests/lib/tolerance.h (2 x STANDARD's error in the same dtype on the whole sequence, + atol), every output
 * poisoned before the call; at W = 1, bit for bit against fa_forward / fa_backward with the same opts. Then the
 * rejections: uneven shards, odd S_local with causal, one rank's bad argument, a window, sinks on some ranks only,
 * d_sinks without sinks: the same status on every rank, nothing written anywhere. FA_TEST_RANDOM sets the number of
 * random cases. */
#define _POSIX_C_SOURCE 200809L
#include "testlib.h"
#include "shard.h"

#include "flashattn_ring.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MAX_W 4

typedef struct ring_case {
    int W;
    int64_t B, S, Hq, Hk, D; /* S: the whole sequence */
    fa_dtype dt;
    fa_attn_opts opts;
    t_layout lay; /* of the shards */
    double relax;
    float sinks[8]; /* with_sinks: opts.sinks points here */
} ring_case;

/* Sinks on every head of c (c must stay where it is while it runs). */
static void with_sinks(ring_case *c) {
    for (int h = 0; h < 8; h++) c->sinks[h] = (float)t_randint(-20, 40) / 10;
    if (c->Hq > 1) c->sinks[1] = -INFINITY; /* no sink on head 1: d sinks 0 */
    c->opts.sinks = c->sinks;
}

/* One rank's shards and outputs. */
typedef struct rank_io {
    t_buf q, k, v, o, dout, dq, dk, dv;
    float *lse;
    int64_t n_lse;
} rank_io;

typedef struct job {
    int rank, backward;
    fa_context *ctx;
    fa_ring_comm *comm;
    const fa_attn_opts *opts;
    const fa_tensor *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float *lse;
    fa_status st;
    char msg[512];
} job;

static void *run_job(void *arg) {
    job *j = arg;
    if (j->backward)
        j->st = fa_ring_backward(j->ctx, j->comm, j->opts, j->q, j->k, j->v, j->o, j->lse, j->dout, j->dq, j->dk, j->dv);
    else
        j->st = fa_ring_forward(j->ctx, j->comm, j->opts, j->q, j->k, j->v, j->o, j->lse);
    snprintf(j->msg, sizeof j->msg, "%s", fa_context_last_error(j->ctx));
    return NULL;
}

/* The ring: W threads, each making its rank's call; returns when all have returned. */
static void run_ring(int W, job *jobs) {
    pthread_t th[MAX_W];
    for (int r = 0; r < W; r++) pthread_create(&th[r], NULL, run_job, &jobs[r]);
    for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
}

/* A group of W ranks with their contexts (one thread each: the machine's two cores are shared by the ranks). */
typedef struct ring {
    int W;
    fa_ring_group *g;
    fa_ring_comm *comm[MAX_W];
    fa_context *ctx[MAX_W];
} ring;

static ring ring_new(int W) {
    ring R;
    memset(&R, 0, sizeof R);
    R.W = W;
    CHECK_STATUS(fa_ring_group_create(&R.g, W), FA_OK);
    for (int r = 0; r < W; r++) {
        CHECK_STATUS(fa_ring_comm_thread(&R.comm[r], R.g, r), FA_OK);
        CHECK_EQ_INT(fa_ring_comm_rank(R.comm[r]), r);
        CHECK_EQ_INT(fa_ring_comm_world(R.comm[r]), W);
        if (fa_context_create(&R.ctx[r], FA_BACKEND_CPU, 1) != FA_OK) {
            fprintf(stderr, "cannot create a CPU context: %s\n", fa_create_error());
            exit(2);
        }
    }
    return R;
}

static void ring_free(ring *R) {
    for (int r = 0; r < R->W; r++) fa_ring_comm_destroy(R->comm[r]), fa_context_destroy(R->ctx[r]);
    fa_ring_group_destroy(R->g);
}

static void describe(const ring_case *c, char *buf, size_t n) {
    snprintf(buf, n, "ring W%d %s b%lld S%lld h%lld/%lld d%lld %s%s algo %s%s%s%s", c->W, fa_dtype_name(c->dt),
             (long long)c->B, (long long)c->S, (long long)c->Hq, (long long)c->Hk, (long long)c->D,
             t_layout_name(c->lay), c->opts.causal ? " causal" : "", fa_algo_name(c->opts.algo),
             c->opts.softcap > 0 ? " softcap" : "", c->opts.scale != 0 ? " scale" : "", c->opts.sinks ? " sinks" : "");
}

/* Elements where two views of the same shape differ (bit for bit up to -0 == 0; NaN counts as a difference). */
static int64_t n_differ(const fa_tensor *a, const fa_tensor *b) {
    int64_t n = 0;
    for (int64_t x = 0; x < a->batch; x++)
        for (int64_t s = 0; s < a->seqlen; s++)
            for (int64_t h = 0; h < a->heads; h++)
                for (int64_t i = 0; i < a->head_dim; i++) n += !(t_get(a, x, s, h, i) == t_get(b, x, s, h, i));
    return n;
}

/* W = 1: the ring is one step over the whole sequence, so its results must be those of fa_forward and fa_backward
 * with the same opts on the same tensors, bit for bit: every partial is the call's own, rounded once (the sinks join
 * step 0's call, not the merged state, which would round out a second time). The forward's when !backward, else the
 * backward's, from the ring's own out and LSE. */
static void check_one_rank(const ring_case *c, fa_context *ctx, const rank_io *x, const float *d_sinks, int backward) {
    fa_attn_opts o = c->opts;
    float ds[8];
    if (backward && o.algo == FA_ALGO_AUTO) o.algo = FA_ALGO_FLASH2; /* as the ring's backward takes AUTO */
    o.d_sinks = backward && o.sinks ? ds : NULL;
    const fa_tensor *q = &x->q.t;
    t_buf a = t_buf_new(c->dt, q->batch, q->seqlen, q->heads, q->head_dim, c->lay);
    t_buf bk = t_buf_new(c->dt, c->B, q->seqlen, c->Hk, q->head_dim, c->lay);
    t_buf bv = t_buf_new(c->dt, c->B, q->seqlen, c->Hk, q->head_dim, c->lay);
    float *l = malloc(sizeof(float) * (size_t)x->n_lse);
    if (!backward) {
        CHECK_STATUS(fa_forward(ctx, &o, q, &x->k.t, &x->v.t, &a.t, l), FA_OK);
        const int64_t n = n_differ(&a.t, &x->o.t);
        CHECK_MSG(n == 0, "W = 1: %lld elements of out differ from fa_forward's", (long long)n);
        CHECK_MSG(!memcmp(l, x->lse, sizeof(float) * (size_t)x->n_lse), "W = 1: lse differs from fa_forward's");
    } else {
        CHECK_STATUS(fa_backward(ctx, &o, q, &x->k.t, &x->v.t, &x->o.t, x->lse, &x->dout.t, &a.t, &bk.t, &bv.t), FA_OK);
        const int64_t n = n_differ(&a.t, &x->dq.t) + n_differ(&bk.t, &x->dk.t) + n_differ(&bv.t, &x->dv.t);
        CHECK_MSG(n == 0, "W = 1: %lld elements of dq, dk, dv differ from fa_backward's", (long long)n);
        for (int64_t h = 0; o.sinks && h < c->Hq; h++)
            CHECK_MSG(ds[h] == d_sinks[h] || (isnan(ds[h]) && isnan(d_sinks[h])),
                      "W = 1: d_sinks[%lld] %.9e differs from fa_backward's %.9e", (long long)h, d_sinks[h], ds[h]);
    }
    t_buf_free(&a), t_buf_free(&bk), t_buf_free(&bv);
    free(l);
}

/* Forward and backward of one case on every rank, against the oracle on the whole sequence. */
static void run_case(const ring_case *c) {
    const int W = c->W, causal = c->opts.causal;
    const int64_t B = c->B, S = c->S, S_l = S / W, Hq = c->Hq, Hk = c->Hk, D = c->D;
    char desc[256];
    describe(c, desc, sizeof desc);
    snprintf(t_case_label, sizeof t_case_label, "%s", desc);
    printf("%s:", desc);
    fflush(stdout);

    /* the whole sequence: the oracle and STANDARD in the same dtype (the baseline of the rule) */
    t_whole seq;
    CHECK_STATUS(t_whole_new(&seq, &c->opts, c->dt, B, S, Hq, Hk, D), FA_OK);
    t_buf q = seq.q, k = seq.k, v = seq.v, dout = seq.dout; /* views of seq's buffers (freed with it) */
    const double *ref = seq.out, *rlse = seq.lse, *rdq = seq.dq, *rdk = seq.dk, *rdv = seq.dv;
    const int64_t nq = B * S * Hq * D, nk = B * S * Hk * D, nl = B * Hq * S;
    ring R = ring_new(W);
    double e_std = 0, l_std = 0, g_std[3] = {0, 0, 0}, ds_std = 0;
    float ds[MAX_W][8], ds1[8];
    {
        fa_attn_opts so = c->opts;
        so.algo = FA_ALGO_STANDARD;
        so.d_sinks = c->opts.sinks ? ds1 : NULL;
        t_buf o = t_buf_new(c->dt, B, S, Hq, D, T_BSHD), dq = t_buf_new(c->dt, B, S, Hq, D, T_BSHD);
        t_buf dk = t_buf_new(c->dt, B, S, Hk, D, T_BSHD), dv = t_buf_new(c->dt, B, S, Hk, D, T_BSHD);
        float *l = malloc(sizeof(float) * (size_t)nl);
        CHECK_STATUS(fa_forward(R.ctx[0], &so, &q.t, &k.t, &v.t, &o.t, l), FA_OK);
        CHECK_STATUS(fa_backward(R.ctx[0], &so, &q.t, &k.t, &v.t, &o.t, l, &dout.t, &dq.t, &dk.t, &dv.t), FA_OK);
        e_std = t_max_diff(&o.t, ref), l_std = t_max_diff_f(l, rlse, nl);
        g_std[0] = t_max_diff(&dq.t, rdq), g_std[1] = t_max_diff(&dk.t, rdk), g_std[2] = t_max_diff(&dv.t, rdv);
        for (int64_t h = 0; c->opts.sinks && h < Hq; h++) ds_std = fmax(ds_std, fabs(ds1[h] - seq.dsinks[h]));
        t_buf_free(&o), t_buf_free(&dq), t_buf_free(&dk), t_buf_free(&dv);
        free(l);
    }

    /* the shards, the outputs poisoned */
    rank_io io[MAX_W];
    job jobs[MAX_W];
    fa_attn_opts ro[MAX_W]; /* each rank's opts: its own d_sinks (NaN until written) */
    for (int r = 0; r < W; r++) {
        rank_io *x = &io[r];
        ro[r] = c->opts;
        ro[r].d_sinks = c->opts.sinks ? ds[r] : NULL;
        for (int h = 0; h < 8; h++) ds[r][h] = t_nanf();
        x->q = t_buf_new(c->dt, B, S_l, Hq, D, c->lay), x->k = t_buf_new(c->dt, B, S_l, Hk, D, c->lay);
        x->v = t_buf_new(c->dt, B, S_l, Hk, D, c->lay), x->dout = t_buf_new(c->dt, B, S_l, Hq, D, c->lay);
        x->o = t_buf_new(c->dt, B, S_l, Hq, D, c->lay), x->dq = t_buf_new(c->dt, B, S_l, Hq, D, c->lay);
        x->dk = t_buf_new(c->dt, B, S_l, Hk, D, c->lay), x->dv = t_buf_new(c->dt, B, S_l, Hk, D, c->lay);
        t_shard_scatter(&q.t, &x->q.t, r, W, causal), t_shard_scatter(&k.t, &x->k.t, r, W, causal);
        t_shard_scatter(&v.t, &x->v.t, r, W, causal), t_shard_scatter(&dout.t, &x->dout.t, r, W, causal);
        x->n_lse = B * Hq * S_l;
        x->lse = malloc(sizeof(float) * (size_t)x->n_lse);
        for (int64_t i = 0; i < x->n_lse; i++) x->lse[i] = t_nanf();
        jobs[r] = (job){r, 0, R.ctx[r], R.comm[r], &ro[r], &x->q.t, &x->k.t, &x->v.t, &x->o.t, &x->dout.t,
                        &x->dq.t, &x->dk.t, &x->dv.t, x->lse, FA_OK, ""};
    }
    const fa_algo a = c->opts.algo == FA_ALGO_STANDARD ? FA_ALGO_FLASH2 : c->opts.algo; /* the 2 x rule applies */

    run_ring(W, jobs);
    double e = 0, le = 0, refmax = t_max_abs(ref, nq), lscale = t_lse_scale(rlse, nl);
    for (int r = 0; r < W; r++) {
        CHECK_STATUS(jobs[r].st, FA_OK);
        if (jobs[r].st != FA_OK) fprintf(stderr, "  rank %d forward: %s\n", r, jobs[r].msg);
        CHECK_MSG(t_buf_check_written(&io[r].o) == 0, "rank %d: out not written in full (or outside its view)", r);
        e = fmax(e, t_shard_err(&io[r].o.t, ref, S, r, W, causal));
        le = fmax(le, t_shard_lse_err(io[r].lse, rlse, B * Hq, S, S_l, r, W, causal));
    }
    t_check_err("out", a, c->dt, e, e_std, refmax, 0, c->relax);
    t_verdict lv = t_judge_lse(0, le, l_std, lscale);
    CHECK_MSG(lv.ok, "lse: max abs err %.3e > %.3e (2 x standard's %.3e)", le, lv.allowed, l_std);
    printf(" fwd %.1e/%.1e (std %.1e)", e, le, e_std);
    if (W == 1) check_one_rank(c, R.ctx[0], &io[0], NULL, 0);

    for (int r = 0; r < W; r++) jobs[r].backward = 1;
    run_ring(W, jobs);
    if (c->opts.algo == FA_ALGO_STANDARD) { /* its backward needs all of a row's keys at once */
        for (int r = 0; r < W; r++) {
            CHECK_STATUS(jobs[r].st, FA_ERR_UNSUPPORTED);
            CHECK_STR_CONTAINS(jobs[r].msg, "standard");
            CHECK_MSG(t_buf_check_written(&io[r].dq) == B * S_l * Hq * D, "rank %d: dq written by a rejected call", r);
        }
        printf(" bwd rejected: %s\n", jobs[0].msg);
        goto done;
    }
    double eg[3] = {0, 0, 0};
    const double gm = fmax(t_max_abs(rdq, nq), fmax(t_max_abs(rdk, nk), t_max_abs(rdv, nk)));
    for (int r = 0; r < W; r++) {
        CHECK_STATUS(jobs[r].st, FA_OK);
        if (jobs[r].st != FA_OK) fprintf(stderr, "  rank %d backward: %s\n", r, jobs[r].msg);
        CHECK_MSG(t_buf_check_written(&io[r].dq) == 0 && t_buf_check_written(&io[r].dk) == 0 &&
                      t_buf_check_written(&io[r].dv) == 0,
                  "rank %d: a gradient not written in full (or outside its view)", r);
        eg[0] = fmax(eg[0], t_shard_err(&io[r].dq.t, rdq, S, r, W, causal));
        eg[1] = fmax(eg[1], t_shard_err(&io[r].dk.t, rdk, S, r, W, causal));
        eg[2] = fmax(eg[2], t_shard_err(&io[r].dv.t, rdv, S, r, W, causal));
    }
    t_check_err("dq", a, c->dt, eg[0], g_std[0], gm, 1, c->relax);
    t_check_err("dk", a, c->dt, eg[1], g_std[1], gm, 1, c->relax);
    t_check_err("dv", a, c->dt, eg[2], g_std[2], gm, 1, c->relax);
    printf(" bwd %.1e/%.1e/%.1e (std %.1e/%.1e/%.1e)", eg[0], eg[1], eg[2], g_std[0], g_std[1], g_std[2]);
    if (W == 1) check_one_rank(c, R.ctx[0], &io[0], ds[0], 1);
    if (c->opts.sinks) { /* each rank's share of d sinks; their sum is the whole sequence's */
        double eds = 0;
        for (int64_t h = 0; h < Hq; h++) {
            double sum = 0;
            for (int r = 0; r < W; r++) sum += ds[r][h];
            eds = isnan(sum) ? INFINITY : fmax(eds, fabs(sum - seq.dsinks[h]));
        }
        t_check_err("d_sinks", a, c->dt, eds, ds_std, t_dsinks_scale(seq.dsinks, seq.dsinks_mag, Hq, gm), 1, c->relax);
        printf(" d_sinks %.1e (std %.1e)", eds, ds_std);
    }
    printf("\n");
done:

    for (int r = 0; r < W; r++) {
        rank_io *x = &io[r];
        t_buf_free(&x->q), t_buf_free(&x->k), t_buf_free(&x->v), t_buf_free(&x->o), t_buf_free(&x->dout);
        t_buf_free(&x->dq), t_buf_free(&x->dk), t_buf_free(&x->dv);
        free(x->lse);
    }
    ring_free(&R);
    t_whole_free(&seq);
    t_case_label[0] = 0;
}

static ring_case rc(int W, int64_t B, int64_t S, int64_t Hq, int64_t Hk, int64_t D, fa_dtype dt, int causal,
                    t_layout lay) {
    ring_case c;
    memset(&c, 0, sizeof c);
    c.W = W, c.B = B, c.S = S, c.Hq = Hq, c.Hk = Hk, c.D = D, c.dt = dt, c.lay = lay, c.relax = 1;
    c.opts = fa_attn_opts_default();
    c.opts.causal = causal;
    return c;
}

/* ---- rejections: the same status on every rank, nothing written ---- */

typedef struct snap {
    unsigned char *o, *l;
} snap;

/* Every rank gets S_l[r] rows and the forward (or backward) with opts; rank `bad` (if >= 0) gets bad_opts, or
 * without them out in the wrong dtype. Expect `want` on every rank, the outputs untouched, and `needle` in rank
 * `named`'s message. */
static void reject(int W, const int64_t *S_l, const fa_attn_opts *opts, int backward, int bad,
                   const fa_attn_opts *bad_opts, fa_status want, int named, const char *needle) {
    ring R = ring_new(W);
    const fa_dtype dt = FA_DTYPE_F32;
    const int64_t B = 1, H = 2, D = 8;
    rank_io io[MAX_W];
    job jobs[MAX_W];
    fa_tensor bad_o;
    snap sn[MAX_W];
    for (int r = 0; r < W; r++) {
        rank_io *x = &io[r];
        x->q = t_buf_new(dt, B, S_l[r], H, D, T_BSHD), x->k = t_buf_new(dt, B, S_l[r], H, D, T_BSHD);
        x->v = t_buf_new(dt, B, S_l[r], H, D, T_BSHD), x->dout = t_buf_new(dt, B, S_l[r], H, D, T_BSHD);
        x->o = t_buf_new(dt, B, S_l[r], H, D, T_BSHD), x->dq = t_buf_new(dt, B, S_l[r], H, D, T_BSHD);
        x->dk = t_buf_new(dt, B, S_l[r], H, D, T_BSHD), x->dv = t_buf_new(dt, B, S_l[r], H, D, T_BSHD);
        t_buf_randn(&x->q, 1), t_buf_randn(&x->k, 1), t_buf_randn(&x->v, 1), t_buf_randn(&x->dout, 1);
        t_buf_randn(&x->o, 1); /* the backward reads it; the forward must leave it as it is */
        x->n_lse = B * H * S_l[r];
        x->lse = malloc(sizeof(float) * (size_t)x->n_lse);
        for (int64_t i = 0; i < x->n_lse; i++) x->lse[i] = 0.5f;
        jobs[r] = (job){r, backward, R.ctx[r], R.comm[r], opts, &x->q.t, &x->k.t, &x->v.t, &x->o.t, &x->dout.t,
                        &x->dq.t, &x->dk.t, &x->dv.t, x->lse, FA_OK, ""};
        if (r == bad && bad_opts) {
            jobs[r].opts = bad_opts;
        } else if (r == bad) {
            bad_o = x->o.t;
            bad_o.dtype = FA_DTYPE_BF16;
            jobs[r].o = &bad_o;
        }
        sn[r].o = malloc(x->o.mem_bytes * 4);
        memcpy(sn[r].o, x->o.mem, x->o.mem_bytes);
        memcpy(sn[r].o + x->o.mem_bytes, x->dq.mem, x->dq.mem_bytes);
        memcpy(sn[r].o + 2 * x->o.mem_bytes, x->dk.mem, x->dk.mem_bytes);
        memcpy(sn[r].o + 3 * x->o.mem_bytes, x->dv.mem, x->dv.mem_bytes);
        sn[r].l = malloc(sizeof(float) * (size_t)x->n_lse);
        memcpy(sn[r].l, x->lse, sizeof(float) * (size_t)x->n_lse);
    }
    run_ring(W, jobs);
    for (int r = 0; r < W; r++) {
        rank_io *x = &io[r];
        CHECK_STATUS(jobs[r].st, want);
        CHECK_MSG(jobs[r].msg[0] != 0, "rank %d: no message", r);
        CHECK_MSG(!memcmp(sn[r].o, x->o.mem, x->o.mem_bytes) && !memcmp(sn[r].o + x->o.mem_bytes, x->dq.mem, x->dq.mem_bytes) &&
                      !memcmp(sn[r].o + 2 * x->o.mem_bytes, x->dk.mem, x->dk.mem_bytes) &&
                      !memcmp(sn[r].o + 3 * x->o.mem_bytes, x->dv.mem, x->dv.mem_bytes) &&
                      !memcmp(sn[r].l, x->lse, sizeof(float) * (size_t)x->n_lse),
                  "rank %d: an output was written by a rejected call", r);
        if (r == named) CHECK_STR_CONTAINS(jobs[r].msg, needle);
        if (r != named && bad >= 0) CHECK_STR_CONTAINS(jobs[r].msg, "rank");
        printf("  rank %d: %s: %s\n", r, fa_status_string(jobs[r].st), jobs[r].msg);
        free(sn[r].o), free(sn[r].l);
        t_buf_free(&x->q), t_buf_free(&x->k), t_buf_free(&x->v), t_buf_free(&x->o), t_buf_free(&x->dout);
        t_buf_free(&x->dq), t_buf_free(&x->dk), t_buf_free(&x->dv);
        free(x->lse);
    }
    ring_free(&R);
}

static void rejections(void) {
    fa_attn_opts o = fa_attn_opts_default(), oc = o, ow = o, o3 = o;
    oc.causal = 1;
    ow.window_left = 4;
    o3.causal = 1, o3.algo = FA_ALGO_FLASH3; /* valid arguments the CPU's plan refuses: a failure inside the schedule */
    static float sk[2] = {0.5f, 1}, ds_bad[2];
    fa_attn_opts os = oc, o_d = o;
    os.sinks = sk;
    o_d.d_sinks = ds_bad;
    const int64_t uneven[3] = {8, 10, 8}, even[4] = {8, 8, 8, 8}, odd[2] = {7, 7};
    for (int bwd = 0; bwd <= 1; bwd++) {
        snprintf(t_case_label, sizeof t_case_label, "uneven shards (%s)", bwd ? "backward" : "forward");
        printf("%s\n", t_case_label);
        reject(3, uneven, &o, bwd, -1, NULL, FA_ERR_INVALID_ARGUMENT, 0, "seqlen");
        snprintf(t_case_label, sizeof t_case_label, "odd S_local with causal (%s)", bwd ? "backward" : "forward");
        printf("%s\n", t_case_label);
        reject(2, odd, &oc, bwd, -1, NULL, FA_ERR_INVALID_ARGUMENT, 1, "odd");
        snprintf(t_case_label, sizeof t_case_label, "rank 2's bad out (%s)", bwd ? "backward" : "forward");
        printf("%s\n", t_case_label);
        reject(4, even, &oc, bwd, 2, NULL, FA_ERR_INVALID_ARGUMENT, 2, "out: dtype");
        snprintf(t_case_label, sizeof t_case_label, "rank 1 fails inside the schedule (%s)", bwd ? "backward" : "forward");
        printf("%s\n", t_case_label);
        reject(3, even, &oc, bwd, 1, &o3, FA_ERR_UNSUPPORTED, 1, "ring step 0");
        snprintf(t_case_label, sizeof t_case_label, "window (%s)", bwd ? "backward" : "forward");
        printf("%s\n", t_case_label);
        reject(2, even, &ow, bwd, -1, NULL, FA_ERR_UNSUPPORTED, 0, "window");
        snprintf(t_case_label, sizeof t_case_label, "sinks on rank 1 only (%s)", bwd ? "backward" : "forward");
        printf("%s\n", t_case_label);
        reject(3, even, &oc, bwd, 1, &os, FA_ERR_INVALID_ARGUMENT, 0, "opts.sinks");
        if (bwd) {
            snprintf(t_case_label, sizeof t_case_label, "d_sinks without sinks (backward)");
            printf("%s\n", t_case_label);
            reject(2, even, &o, bwd, 0, &o_d, FA_ERR_INVALID_ARGUMENT, 0, "opts.d_sinks");
        }
    }
    t_case_label[0] = 0;

    /* the constructors */
    fa_ring_group *g = NULL;
    fa_ring_comm *c = NULL, *c2 = NULL;
    CHECK_STATUS(fa_ring_group_create(&g, 0), FA_ERR_INVALID_ARGUMENT);
    CHECK(g == NULL);
    CHECK_STR_CONTAINS(fa_ring_create_error(), "world");
    CHECK_STATUS(fa_ring_group_create(&g, 2), FA_OK);
    CHECK_STATUS(fa_ring_comm_thread(&c, g, 2), FA_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(fa_ring_create_error(), "rank");
    CHECK_STATUS(fa_ring_comm_thread(&c, g, 1), FA_OK);
    CHECK_STATUS(fa_ring_comm_thread(&c2, g, 1), FA_ERR_INVALID_ARGUMENT);
    CHECK(c2 == NULL);
    CHECK_STR_CONTAINS(fa_ring_comm_transport(c), "thread");
    CHECK_STATUS(fa_ring_comm_nccl(&c2, NULL, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(fa_ring_create_error(), "nccl_comm");
    fa_context *ctx = t_cpu_ctx();
    CHECK_STATUS(fa_ring_forward(ctx, NULL, NULL, NULL, NULL, NULL, NULL, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "comm");
    CHECK_STATUS(fa_ring_forward(NULL, c, NULL, NULL, NULL, NULL, NULL, NULL), FA_ERR_INVALID_ARGUMENT);
    fa_context_destroy(ctx);
    fa_ring_comm_destroy(c);
    fa_ring_comm_destroy(NULL);
    fa_ring_group_destroy(g);
    fa_ring_group_destroy(NULL);
    CHECK_EQ_INT(fa_ring_comm_rank(NULL), -1);
}

int main(void) {
    t_init("test_ring");
    const fa_dtype F32 = FA_DTYPE_F32, F16 = FA_DTYPE_F16, BF16 = FA_DTYPE_BF16;
    ring_case c;

    c = rc(1, 1, 12, 2, 2, 16, F32, 1, T_BSHD);
    run_case(&c);
    c = rc(1, 2, 24, 4, 2, 32, BF16, 0, T_STRIDED);
    run_case(&c);
    c = rc(2, 2, 40, 4, 4, 64, F32, 1, T_BSHD);
    run_case(&c);
    c = rc(2, 1, 64, 4, 1, 32, BF16, 1, T_BHSD); /* MQA */
    run_case(&c);
    c = rc(2, 2, 50, 2, 2, 64, F16, 0, T_STRIDED); /* S_local 25: odd is fine without causal */
    run_case(&c);
    c = rc(3, 1, 78, 6, 2, 64, F32, 1, T_STRIDED);
    c.opts.softcap = 5;
    run_case(&c);
    c = rc(3, 2, 96, 4, 4, 128, BF16, 1, T_BSHD);
    run_case(&c);
    c = rc(3, 1, 63, 4, 2, 32, F32, 0, T_BSHD);
    c.opts.scale = 0.3f;
    c.opts.algo = FA_ALGO_FLASH1;
    run_case(&c);
    c = rc(4, 1, 128, 8, 2, 64, BF16, 1, T_BSHD);
    run_case(&c);
    c = rc(4, 2, 80, 4, 4, 80, F32, 1, T_STRIDED);
    c.opts.algo = FA_ALGO_STANDARD;
    run_case(&c);
    c = rc(4, 1, 256, 4, 4, 128, F32, 0, T_BSHD);
    run_case(&c);
    c = rc(4, 1, 200, 2, 1, 256, BF16, 1, T_BSHD);
    run_case(&c);
    c = rc(2, 1, 96, 8, 8, 64, F16, 1, T_BSHD);
    c.opts.algo = FA_ALGO_FLASH2, c.opts.block_q = 16, c.opts.block_k = 32, c.opts.deterministic = 1;
    run_case(&c);
    /* sinks: joined by step 0's call; each rank's d sinks is its rows' share */
    c = rc(1, 1, 12, 2, 2, 16, F32, 1, T_BSHD);
    with_sinks(&c);
    run_case(&c);
    c = rc(2, 2, 40, 4, 2, 64, F32, 1, T_STRIDED);
    with_sinks(&c);
    run_case(&c);
    c = rc(3, 1, 63, 6, 3, 32, BF16, 0, T_BHSD);
    c.opts.algo = FA_ALGO_FLASH1;
    with_sinks(&c);
    run_case(&c);
    c = rc(4, 2, 64, 4, 1, 64, F16, 1, T_BSHD); /* MQA, softcap */
    c.opts.softcap = 5;
    with_sinks(&c);
    run_case(&c);
    c = rc(2, 1, 32, 2, 2, 32, F32, 1, T_BSHD); /* STANDARD: the forward takes sinks, the backward is refused */
    c.opts.algo = FA_ALGO_STANDARD;
    with_sinks(&c);
    run_case(&c);

    int n = 12;
    const char *env = getenv("FA_TEST_RANDOM");
    if (env) n = atoi(env);
    static const int dims[] = {8, 32, 64, 72, 128};
    static const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    static const int gqa[][2] = {{2, 2}, {4, 1}, {4, 2}, {6, 3}};
    for (int i = 0; i < n; i++) {
        const int W = t_randint(1, 4), causal = t_randint(0, 1), gi = t_randint(0, 3);
        const int64_t S_l = causal ? 2 * t_randint(1, 24) : t_randint(1, 40);
        c = rc(W, t_randint(1, 2), W * S_l, gqa[gi][0], gqa[gi][1], dims[t_randint(0, 4)], dts[t_randint(0, 2)],
               causal, (t_layout)t_randint(0, 2));
        if (t_randint(0, 3) == 0) c.opts.softcap = 8;
        if (t_randint(0, 2) == 0) with_sinks(&c);
        run_case(&c);
    }

    rejections();
    return t_finish();
}
