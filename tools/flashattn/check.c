/* flashattn check: every algorithm, forward and backward, against the float64 oracle on random shapes and options.
 *
 * Pass rule (DESIGN.md, from flash-attn's tests): for every output,
 *     max|x − ref64| ≤ 2 · max|x_standard_same_dtype − ref64| + atol,   atol = eps(dtype) · max|ref64|
 * and in fp32 also max|x − ref64| / max|ref64| < 1e-5. STANDARD itself is held to a loose absolute bound in
 * f16/bf16 (it is the yardstick there). Every output is poisoned with NaN before each call: an element that is
 * not written fails. Case i uses the seed (seed, i): `--seed S --first i --count 1` replays it alone. */
#include "common.h"

#include "cpu/reference.h"
#include "core/half.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define N_ALGOS 3
static const fa_algo ALGOS[N_ALGOS] = {FA_ALGO_STANDARD, FA_ALGO_FLASH1, FA_ALGO_FLASH2};

enum { OUT_O, OUT_LSE, OUT_DQ, OUT_DK, OUT_DV, N_OUT };
static const char *OUT_NAME[N_OUT] = {"out", "lse", "dq", "dk", "dv"};

typedef struct check_case {
    fa_dtype dtype;
    int64_t batch, sq, sk, hq, hk, d;
    int causal, wl, wr;
    float softcap, scale;
    int varlen, n_seqs;
    int32_t cu_q[8], cu_k[8];
    int layout[4]; /* q, k, v, out/grads: 0 bshd, 1 bhsd, 2 padded strides */
} check_case;

/* A host tensor view with its own buffer. */
typedef struct htensor {
    fa_tensor t;
    int64_t span; /* elements from data[0] to one past the last element */
    void *host;
} htensor;

static fa_tensor make_view(int layout, fa_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d, uint64_t *rng,
                           int64_t *span) {
    fa_tensor t;
    if (layout == 1) t = fa_tensor_bhsd(NULL, dt, b, h, s, d);
    else t = fa_tensor_bshd(NULL, dt, b, s, h, d);
    if (layout == 2) {
        t.stride_head = d + rng_int(rng, 0, 3);
        t.stride_seq = h * t.stride_head + rng_int(rng, 0, 5);
        t.stride_batch = s * t.stride_seq + rng_int(rng, 0, 7);
    }
    *span = (b - 1) * t.stride_batch + (s - 1) * t.stride_seq + (h - 1) * t.stride_head + d;
    return t;
}

static int htensor_alloc(htensor *x, int layout, fa_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d,
                         uint64_t *rng, int fill) {
    x->t = make_view(layout, dt, b, s, h, d, rng, &x->span);
    size_t bytes = (size_t)x->span * fa_dtype_size(dt);
    x->host = malloc(bytes ? bytes : 1);
    if (!x->host) return -1;
    x->t.data = x->host;
    if (fill) fill_random(x->host, dt, x->span, rng, 1.0f);
    else memset(x->host, 0xff, bytes);
    return 0;
}

/* Contiguous [b, s, h, d] doubles from a view (the oracle's layout). */
static void gather(const fa_tensor *t, const void *base, double *dst) {
    int64_t i = 0;
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seqlen; s++)
            for (int64_t h = 0; h < t->heads; h++)
                for (int64_t x = 0; x < t->head_dim; x++)
                    dst[i++] = fa_load_elem(base, (int)t->dtype,
                                            b * t->stride_batch + s * t->stride_seq + h * t->stride_head + x);
}

static double max_abs(const double *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(x[i]) && fabs(x[i]) > m) m = fabs(x[i]);
    return m;
}

/* max |a − ref|; NaN or a mismatched infinity counts as +inf. */
static double max_err(const double *a, const double *ref, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double e;
        if (isinf(ref[i]) || isinf(a[i])) e = (a[i] == ref[i]) ? 0 : INFINITY;
        else e = fabs(a[i] - ref[i]);
        if (!(e <= m)) m = isnan(e) ? INFINITY : e;
    }
    return m;
}

static void gen_case(uint64_t *rng, const int_list *dtypes, check_case *c) {
    memset(c, 0, sizeof *c);
    c->dtype = (fa_dtype)dtypes->v[rng_int(rng, 0, dtypes->n - 1)];
    static const int dims[] = {1, 8, 63, 64, 80, 128, 256};
    c->d = rng_uniform(rng) < 0.6 ? rng_int(rng, 1, 256) : dims[rng_int(rng, 0, 6)];
    static const int lens[] = {1, 3, 17, 33, 113, 239};
#define RLEN() (rng_uniform(rng) < 0.5 ? rng_int(rng, 1, 64) : rng_uniform(rng) < 0.6 ? lens[rng_int(rng, 0, 5)] : rng_int(rng, 65, 256))
    c->varlen = rng_uniform(rng) < 0.15;
    if (c->varlen) {
        c->n_seqs = rng_int(rng, 1, 4);
        c->cu_q[0] = c->cu_k[0] = 0;
        for (int s = 0; s < c->n_seqs; s++) {
            c->cu_q[s + 1] = c->cu_q[s] + rng_int(rng, 0, 48);
            c->cu_k[s + 1] = c->cu_k[s] + (rng_uniform(rng) < 0.5 ? c->cu_q[s + 1] - c->cu_q[s] : rng_int(rng, 0, 48));
        }
        c->batch = 1;
        c->sq = c->cu_q[c->n_seqs] > 0 ? c->cu_q[c->n_seqs] : 1;
        c->sk = c->cu_k[c->n_seqs] > 0 ? c->cu_k[c->n_seqs] : 1;
        /* the arrays must end at the tensors' seqlen: give an empty total one row of padding in a last sequence */
        if (c->cu_q[c->n_seqs] == 0 || c->cu_k[c->n_seqs] == 0) {
            c->n_seqs++;
            c->cu_q[c->n_seqs] = (int32_t)c->sq;
            c->cu_k[c->n_seqs] = (int32_t)c->sk;
        }
    } else {
        c->batch = rng_int(rng, 1, 3);
        c->sq = RLEN();
        c->sk = rng_uniform(rng) < 0.5 ? c->sq : RLEN();
    }
#undef RLEN
    c->hk = rng_int(rng, 1, 3);
    static const int g[] = {1, 1, 2, 4};
    c->hq = c->hk * g[rng_int(rng, 0, 3)];
    /* keep the float64 oracle cheap: B·H·Sq·Sk·d under ~3e6 */
    while (c->batch * c->hq * c->sq * c->sk * c->d > 3000000 && (c->hq > c->hk || c->batch > 1)) {
        if (c->hq > c->hk) c->hq = c->hk;
        else c->batch--;
    }
    while (c->batch * c->hq * c->sq * c->sk * c->d > 3000000 && c->hk > 1) c->hq = --c->hk;
    c->causal = rng_uniform(rng) < 0.3;
    c->wl = c->wr = -1;
    if (rng_uniform(rng) < 0.15) {
        c->wl = rng_int(rng, 0, (int)c->sk);
        c->wr = rng_int(rng, -1, (int)c->sk);
    }
    c->softcap = rng_uniform(rng) < 0.15 ? (float)(1.0 + 29.0 * rng_uniform(rng)) : 0.0f;
    c->scale = rng_uniform(rng) < 0.2 ? (float)(0.05 + rng_uniform(rng)) : 0.0f;
    for (int i = 0; i < 4; i++) {
        double u = rng_uniform(rng);
        c->layout[i] = u < 0.6 ? 0 : u < 0.8 ? 1 : 2;
    }
}

static void describe(const check_case *c, char *buf, size_t len) {
    int n = snprintf(buf, len, "%s B=%lld Sq=%lld Sk=%lld H=%lld/%lld d=%lld%s", fa_dtype_name(c->dtype),
                     (long long)c->batch, (long long)c->sq, (long long)c->sk, (long long)c->hq, (long long)c->hk,
                     (long long)c->d, c->causal ? " causal" : "");
    if (c->wl >= 0 || c->wr >= 0) n += snprintf(buf + n, len - (size_t)n, " window=(%d,%d)", c->wl, c->wr);
    if (c->softcap > 0) n += snprintf(buf + n, len - (size_t)n, " softcap=%.2f", c->softcap);
    if (c->scale > 0) n += snprintf(buf + n, len - (size_t)n, " scale=%.3f", c->scale);
    if (c->varlen) {
        n += snprintf(buf + n, len - (size_t)n, " varlen q=[");
        for (int s = 0; s <= c->n_seqs; s++) n += snprintf(buf + n, len - (size_t)n, "%s%d", s ? "," : "", c->cu_q[s]);
        n += snprintf(buf + n, len - (size_t)n, "] k=[");
        for (int s = 0; s <= c->n_seqs; s++) n += snprintf(buf + n, len - (size_t)n, "%s%d", s ? "," : "", c->cu_k[s]);
        n += snprintf(buf + n, len - (size_t)n, "]");
    }
    snprintf(buf + n, len - (size_t)n, " layouts=%d%d%d%d", c->layout[0], c->layout[1], c->layout[2], c->layout[3]);
}

/* Per (algo, pass, dtype) worst figures. */
typedef struct agg {
    int cases, failed, unsupported;
    double worst_rel, worst_ratio; /* rel = err / max|ref|; ratio = err / allowed */
    int worst_case;
    char worst_what[8];
} agg;

typedef struct run_out {
    int ok;           /* 1 ran; 0 unsupported; -1 error */
    char msg[256];
    double err[N_OUT];
} run_out;

static double eps_of(fa_dtype dt) {
    return dt == FA_DTYPE_F32 ? 4e-6 : dt == FA_DTYPE_F16 ? 1.0 / 1024 : 1.0 / 128;
}

/* Device copies of the inputs and outputs of one case. */
typedef struct case_bufs {
    htensor q, k, v, o, dout, dq, dk, dv;
    float *lse_h;
    dev_buf dq_, dk_, dv_, dq_d, dk_d, dv_d;
} case_bufs;

static fa_tensor on(const htensor *h, const dev_buf *b) {
    fa_tensor t = h->t;
    t.data = b->ptr;
    return t;
}

/* Run algo forward then backward on dev; errors of each output against the oracle into r. */
static void run_algo(fa_context *ctx, fa_backend dev, fa_algo algo, const check_case *c, const fa_attn_opts *base,
                     case_bufs *cb, const double *ref[N_OUT], int64_t nref[N_OUT], run_out *r) {
    memset(r, 0, sizeof *r);
    fa_attn_opts o = *base;
    o.algo = algo;
    size_t es = fa_dtype_size(c->dtype);
    int64_t nlse = c->batch * c->hq * c->sq;
    htensor *hs[8] = {&cb->q, &cb->k, &cb->v, &cb->o, &cb->dout, &cb->dq, &cb->dk, &cb->dv};
    dev_buf d[8], lse;
    memset(d, 0, sizeof d);
    memset(&lse, 0, sizeof lse);
    int bad = 0;
    for (int i = 0; i < 8 && !bad; i++) {
        bad = dev_alloc(&d[i], dev, (size_t)hs[i]->span * es);
        if (!bad && i < 3) bad = dev_upload(&d[i], hs[i]->host, (size_t)hs[i]->span * es);
        if (!bad && i == 4) bad = dev_upload(&d[i], hs[i]->host, (size_t)hs[i]->span * es);
        if (!bad && (i == 3 || i >= 5)) bad = dev_fill_nan(&d[i]);
    }
    if (!bad) bad = dev_alloc(&lse, dev, (size_t)nlse * 4) || dev_fill_nan(&lse);
    if (bad) {
        r->ok = -1;
        snprintf(r->msg, sizeof r->msg, "cannot allocate buffers on %s", fa_backend_name(dev));
        goto done;
    }
    fa_tensor q = on(&cb->q, &d[0]), k = on(&cb->k, &d[1]), v = on(&cb->v, &d[2]), out = on(&cb->o, &d[3]);
    fa_tensor dout = on(&cb->dout, &d[4]), dq = on(&cb->dq, &d[5]), dk = on(&cb->dk, &d[6]), dv = on(&cb->dv, &d[7]);
    fa_status st = fa_forward(ctx, &o, &q, &k, &v, &out, (float *)lse.ptr);
    if (st == FA_OK) st = fa_backward(ctx, &o, &q, &k, &v, &out, (const float *)lse.ptr, &dout, &dq, &dk, &dv);
    if (st == FA_OK && dev_sync(dev)) st = FA_ERR_DEVICE;
    if (st != FA_OK) {
        r->ok = (st == FA_ERR_UNSUPPORTED && dev == FA_BACKEND_CUDA) ? 0 : -1;
        snprintf(r->msg, sizeof r->msg, "%s: %s", fa_status_string(st), fa_context_last_error(ctx));
        goto done;
    }
    r->ok = 1;
    /* download and compare */
    int which[4] = {3, 5, 6, 7};
    int outs[4] = {OUT_O, OUT_DQ, OUT_DK, OUT_DV};
    for (int w = 0; w < 4; w++) {
        htensor *h = hs[which[w]];
        size_t bytes = (size_t)h->span * es;
        void *tmp = malloc(bytes ? bytes : 1);
        double *g = malloc((size_t)nref[outs[w]] * sizeof *g);
        if (!tmp || !g || dev_download(&d[which[w]], tmp, bytes)) {
            r->ok = -1;
            snprintf(r->msg, sizeof r->msg, "out of host memory");
            free(tmp);
            free(g);
            goto done;
        }
        fa_tensor t = h->t;
        gather(&t, tmp, g);
        r->err[outs[w]] = max_err(g, ref[outs[w]], nref[outs[w]]);
        free(tmp);
        free(g);
    }
    {
        float *l = malloc((size_t)nlse * 4);
        double *g = malloc((size_t)nlse * sizeof *g);
        if (!l || !g || dev_download(&lse, l, (size_t)nlse * 4)) {
            r->ok = -1;
            snprintf(r->msg, sizeof r->msg, "out of host memory");
        } else {
            for (int64_t i = 0; i < nlse; i++) g[i] = l[i];
            r->err[OUT_LSE] = max_err(g, ref[OUT_LSE], nlse);
        }
        free(l);
        free(g);
    }
done:
    for (int i = 0; i < 8; i++) dev_free(&d[i]);
    dev_free(&lse);
}

static void check_help(void) {
    printf("usage: flashattn check [--seed S] [--count N] [--first I] [--device cpu|cuda] [--dtype LIST] [--verbose]\n"
           "\n"
           "Runs STANDARD, FLASH1 and FLASH2, forward and backward, on --count random cases (batch, seqlen_q ≠ seqlen_k,\n"
           "GQA/MQA heads, head_dim 1..256, causal, sliding window, softcap, scale, varlen with empty sequences,\n"
           "BSHD/BHSD/strided layouts, f32/f16/bf16) and compares out, lse, dq, dk, dv with the float64 oracle.\n"
           "Pass: max|x-ref| <= 2*max|standard-ref| + eps(dtype)*max|ref|, and in f32 max|x-ref|/max|ref| < 1e-5.\n"
           "Outputs are poisoned with NaN before every call. Exit status 0 only if every case passes.\n"
           "\n"
           "  --seed S       base seed (default: fresh each run, printed); case i uses (S, i)\n"
           "  --count N      number of cases (default 100)\n"
           "  --first I      index of the first case (replay one failure: --first I --count 1)\n"
           "  --device D     cpu or cuda (default cpu; CUDA results are checked against the same CPU oracle)\n"
           "  --dtype LIST   f32, f16, bf16 (default all three)\n"
           "  --threads T    CPU threads (default 0 = all)\n"
           "  --verbose      one line per case\n");
}

int cmd_check(int argc, char **argv) {
    const char *S = "check";
    int64_t seed = -1, count = 100, first = 0, threads = 0;
    int verbose = 0;
    fa_backend dev = FA_BACKEND_CPU;
    int_list dtypes = {3, {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16}};
    for (int i = 0; i < argc; i++) {
        const char *x = argv[i], *v;
        if (strcmp(x, "--help") == 0 || strcmp(x, "-h") == 0) {
            check_help();
            return 0;
        }
        if (strcmp(x, "--verbose") == 0 || strcmp(x, "-v") == 0) { verbose = 1; continue; }
#define INTOPT(name, lo, hi, dst)                                                                                      \
    if (opt_is(x, name)) {                                                                                             \
        if (!(v = opt_value(S, argc, argv, &i, name)) || parse_int(S, name, v, lo, hi, &dst)) return CLI_EXIT_USAGE;   \
        continue;                                                                                                      \
    }
        INTOPT("--seed", 0, INT64_MAX, seed)
        INTOPT("--count", 0, 10000000, count)
        INTOPT("--first", 0, 10000000, first)
        INTOPT("--threads", 0, 1024, threads)
#undef INTOPT
        if (opt_is(x, "--device")) {
            int_list dl;
            if (!(v = opt_value(S, argc, argv, &i, "--device")) || parse_device_list(S, "--device", v, &dl))
                return CLI_EXIT_USAGE;
            if (dl.n != 1) return cli_usage_error(S, "--device: give one device");
            dev = (fa_backend)dl.v[0];
            continue;
        }
        if (opt_is(x, "--dtype")) {
            if (!(v = opt_value(S, argc, argv, &i, "--dtype")) || parse_dtype_list(S, "--dtype", v, &dtypes))
                return CLI_EXIT_USAGE;
            continue;
        }
        return cli_usage_error(S, "unknown argument '%s'", x);
    }
    int random_seed = seed < 0;
    if (random_seed) seed = (int64_t)(((uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid()) % 1000000);
    fa_context *ctx = NULL;
    fa_status st = fa_context_create(&ctx, dev, dev == FA_BACKEND_CPU ? (int)threads : 0);
    if (st != FA_OK) {
        fprintf(stderr, "flashattn check: device %s: %s: %s\n", fa_backend_name(dev), fa_status_string(st),
                fa_create_error());
        return 1;
    }
    printf("flashattn check — %s, device %s, seed %lld%s, cases %lld..%lld\n", fa_version_string(), fa_backend_name(dev),
           (long long)seed, random_seed ? " (fresh; --seed replays it)" : "", (long long)first,
           (long long)(first + count - 1));
    agg ag[N_ALGOS][2][3];
    memset(ag, 0, sizeof ag);
    int n_fail_cases = 0, n_errors = 0;
    double t0 = now_ms();
    for (int64_t ci = first; ci < first + count; ci++) {
        uint64_t rng = (uint64_t)seed * 0x9e3779b97f4a7c15ull ^ ((uint64_t)ci + 1) * 0xd1b54a32d192ed03ull;
        check_case c;
        gen_case(&rng, &dtypes, &c);
        char desc[512];
        describe(&c, desc, sizeof desc);
        fa_attn_opts o = fa_attn_opts_default();
        o.causal = c.causal;
        o.window_left = c.wl;
        o.window_right = c.wr;
        o.softcap = c.softcap;
        o.scale = c.scale;
        if (c.varlen) {
            o.cu_seqlens_q = c.cu_q;
            o.cu_seqlens_k = c.cu_k;
            o.n_seqs = c.n_seqs;
        }
        case_bufs cb;
        memset(&cb, 0, sizeof cb);
        int64_t nq = c.batch * c.sq * c.hq * c.d, nk = c.batch * c.sk * c.hk * c.d, nl = c.batch * c.hq * c.sq;
        double *ref[N_OUT] = {0};
        int64_t nref[N_OUT] = {nq, nl, nq, nk, nk};
        int bad = htensor_alloc(&cb.q, c.layout[0], c.dtype, c.batch, c.sq, c.hq, c.d, &rng, 1) ||
                  htensor_alloc(&cb.k, c.layout[1], c.dtype, c.batch, c.sk, c.hk, c.d, &rng, 1) ||
                  htensor_alloc(&cb.v, c.layout[2], c.dtype, c.batch, c.sk, c.hk, c.d, &rng, 1) ||
                  htensor_alloc(&cb.o, c.layout[3], c.dtype, c.batch, c.sq, c.hq, c.d, &rng, 0) ||
                  htensor_alloc(&cb.dout, c.layout[0], c.dtype, c.batch, c.sq, c.hq, c.d, &rng, 1) ||
                  htensor_alloc(&cb.dq, c.layout[3], c.dtype, c.batch, c.sq, c.hq, c.d, &rng, 0) ||
                  htensor_alloc(&cb.dk, c.layout[3], c.dtype, c.batch, c.sk, c.hk, c.d, &rng, 0) ||
                  htensor_alloc(&cb.dv, c.layout[3], c.dtype, c.batch, c.sk, c.hk, c.d, &rng, 0);
        for (int i = 0; i < N_OUT && !bad; i++) bad = !(ref[i] = malloc((size_t)(nref[i] ? nref[i] : 1) * sizeof(double)));
        fa_status rs = FA_OK;
        if (!bad) rs = fa_reference_forward(&o, &cb.q.t, &cb.k.t, &cb.v.t, ref[OUT_O], ref[OUT_LSE]);
        if (!bad && rs == FA_OK)
            rs = fa_reference_backward(&o, &cb.q.t, &cb.k.t, &cb.v.t, &cb.dout.t, ref[OUT_DQ], ref[OUT_DK], ref[OUT_DV]);
        run_out res[N_ALGOS];
        memset(res, 0, sizeof res);
        if (bad || rs != FA_OK) {
            printf("case %lld: %s: %s\n", (long long)ci, bad ? "out of host memory" : "the oracle refused the case",
                   desc);
            n_errors++;
            n_fail_cases++;
        } else {
            const double *cref[N_OUT] = {ref[0], ref[1], ref[2], ref[3], ref[4]};
            for (int a = 0; a < N_ALGOS; a++) run_algo(ctx, dev, ALGOS[a], &c, &o, &cb, cref, nref, &res[a]);
            /* STANDARD's errors are the yardstick; on a device where it did not run, the CPU's STANDARD. */
            run_out stdr = res[0];
            if (stdr.ok != 1 && dev != FA_BACKEND_CPU) {
                fa_context *cpu = NULL;
                if (fa_context_create(&cpu, FA_BACKEND_CPU, 0) == FA_OK) {
                    run_algo(cpu, FA_BACKEND_CPU, FA_ALGO_STANDARD, &c, &o, &cb, cref, nref, &stdr);
                    fa_context_destroy(cpu);
                }
            }
            double eps = eps_of(c.dtype);
            int case_failed = 0;
            int dti = c.dtype == FA_DTYPE_F32 ? 0 : c.dtype == FA_DTYPE_F16 ? 1 : 2;
            for (int a = 0; a < N_ALGOS; a++) {
                for (int pass = 0; pass < 2; pass++) {
                    agg *g = &ag[a][pass][dti];
                    if (res[a].ok == 0) {
                        g->unsupported++;
                        continue;
                    }
                    g->cases++;
                    if (res[a].ok < 0) {
                        g->failed++;
                        case_failed = 1;
                        if (pass == 0)
                            printf("FAIL case %lld %s: %s\n      %s\n", (long long)ci, fa_algo_name(ALGOS[a]), res[a].msg,
                                   desc);
                        continue;
                    }
                    int failed_here = 0;
                    int lo = pass == 0 ? OUT_O : OUT_DQ, hi = pass == 0 ? OUT_LSE : OUT_DV;
                    /* Gradients are judged against the largest of the three (a gradient that cancels to ~0, e.g.
                     * dq with one key, keeps the magnitude of the terms that cancelled): the natural scale. */
                    double gscale = 0;
                    for (int w = OUT_DQ; w <= OUT_DV; w++) {
                        double m = max_abs(ref[w], nref[w]);
                        if (m > gscale) gscale = m;
                    }
                    for (int w = lo; w <= hi; w++) {
                        double refmax = w >= OUT_DQ ? gscale : max_abs(ref[w], nref[w]);
                        double err = res[a].err[w];
                        double allowed, rel = refmax > 0 ? err / refmax : (err > 0 ? INFINITY : 0);
                        if (w == OUT_LSE) {
                            allowed = 2 * (stdr.ok == 1 ? stdr.err[w] : 0) + 1e-5 * (1 + refmax);
                            rel = err / (1 + refmax);
                        } else if (a == 0 || stdr.ok != 1) {
                            /* the yardstick itself: f32 by the relative rule, halves by a loose bound */
                            allowed = c.dtype == FA_DTYPE_F32 ? 1e-5 * refmax
                                                              : (w == OUT_O ? 8 : 32) * eps * refmax + 1e-30;
                        } else {
                            allowed = 2 * stdr.err[w] + eps * refmax;
                        }
                        int ok = err <= allowed;
                        if (c.dtype == FA_DTYPE_F32 && w != OUT_LSE && !(rel < 1e-5)) ok = 0;
                        if (nref[w] == 0) ok = 1, rel = 0, err = 0;
                        double ratio = allowed > 0 ? err / allowed : (err > 0 ? INFINITY : 0);
                        if (!(rel <= g->worst_rel)) g->worst_rel = isnan(rel) ? INFINITY : rel;
                        if (!(ratio <= g->worst_ratio)) {
                            g->worst_ratio = isnan(ratio) ? INFINITY : ratio;
                            g->worst_case = (int)ci;
                            snprintf(g->worst_what, sizeof g->worst_what, "%s", OUT_NAME[w]);
                        }
                        if (!ok) {
                            failed_here = 1;
                            printf("FAIL case %lld %s %s %s: max err %.3e > allowed %.3e (max|ref| %.3e)\n      %s\n",
                                   (long long)ci, fa_algo_name(ALGOS[a]), pass ? "bwd" : "fwd", OUT_NAME[w], err,
                                   allowed, refmax, desc);
                        }
                    }
                    if (failed_here) {
                        g->failed++;
                        case_failed = 1;
                    }
                }
            }
            if (case_failed) n_fail_cases++;
            if (verbose)
                printf("case %lld %s: %s\n", (long long)ci, case_failed ? "FAIL" : "ok", desc);
        }
        for (int i = 0; i < N_OUT; i++) free(ref[i]);
        htensor *hs[8] = {&cb.q, &cb.k, &cb.v, &cb.o, &cb.dout, &cb.dq, &cb.dk, &cb.dv};
        for (int i = 0; i < 8; i++) free(hs[i]->host);
        fflush(stdout);
    }
    fa_context_destroy(ctx);

    printf("\n| %-8s | %-4s | %-5s | %5s | %6s | %11s | %13s | %19s |\n", "algo", "pass", "dtype", "cases", "failed",
           "worst rel", "worst err/ok", "where");
    printf("|----------|------|-------|------:|-------:|------------:|--------------:|---------------------|\n");
    static const fa_dtype DT[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int a = 0; a < N_ALGOS; a++)
        for (int pass = 0; pass < 2; pass++)
            for (int t = 0; t < 3; t++) {
                agg *g = &ag[a][pass][t];
                if (!g->cases && !g->unsupported) continue;
                char where[32] = "-";
                if (g->cases) snprintf(where, sizeof where, "case %d %s", g->worst_case, g->worst_what);
                printf("| %-8s | %-4s | %-5s | %5d | %6d | %11.3e | %13.3f | %-19s |", fa_algo_name(ALGOS[a]),
                       pass ? "bwd" : "fwd", fa_dtype_name(DT[t]), g->cases, g->failed, g->worst_rel, g->worst_ratio,
                       where);
                if (g->unsupported) printf(" %d unsupported on %s", g->unsupported, fa_backend_name(dev));
                printf("\n");
            }
    printf("\nworst rel = max|x-ref|/max|ref| (lse: /(1+max|ref|); gradients: / the largest of max|dq|, max|dk|, max|dv|);\n"
           "worst err/ok = max|x-ref| / allowed (≤ 1 passes)\n");
    printf("%lld cases in %.1f s: %s (%d failing case%s)\n", (long long)count, (now_ms() - t0) / 1e3,
           n_fail_cases ? "FAILED" : "all passed", n_fail_cases, n_fail_cases == 1 ? "" : "s");
    if (n_fail_cases)
        printf("replay a case: flashattn check --seed %lld --first I --count 1 --verbose\n", (long long)seed);
    (void)n_errors;
    return n_fail_cases ? 1 : 0;
}
