/* flashattn check: every algorithm, forward and backward, against the float64 oracle on random cases.
 *
 * The oracle, the case generator, the tensors with poisoning and the pass rule are the tests' own (tests/lib,
 * docs/testing.md): for every output max|x − ref64| ≤ 2 · max|x_standard_same_dtype − ref64| + atol, under a ceiling
 * that in fp32 is a relative error of 1e-5. Every output is poisoned with NaN before each call: an element that is
 * not written, or one written outside the view, fails. Case i draws from the stream (seed, i):
 * `--seed S --first i --count 1` replays it alone. */
#include "common.h"

#include "testlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* FLASH3 (Hopper) on CUDA only; where its backward is not built (other head dims, a pair), FLASH2's runs from
 * FLASH3's out and lse */
#define N_ALGOS 4
static const fa_algo ALGOS[N_ALGOS] = {FA_ALGO_STANDARD, FA_ALGO_FLASH1, FA_ALGO_FLASH2, FA_ALGO_FLASH3};
static int n_algos(fa_backend dev) { return dev == FA_BACKEND_CUDA ? 4 : 3; }

enum { OUT_O, OUT_LSE, OUT_DQ, OUT_DK, OUT_DV, N_OUT };
static const char *OUT_NAME[N_OUT] = {"out", "lse", "dq", "dk", "dv"};
enum { B_Q, B_K, B_V, B_O, B_DOUT, B_DQ, B_DK, B_DV, N_BUF };

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
    int64_t unwritten; /* output elements left NaN plus padding elements touched */
} run_out;

/* One case on the host: the tensors (outputs poisoned) and the oracle's results. */
typedef struct case_data {
    t_case c;
    t_buf buf[N_BUF];
    int64_t nlse;
    double *ref[N_OUT];
    int64_t nref[N_OUT];
} case_data;

static int case_alloc(case_data *cd, t_rng *rng) {
    const t_case *c = &cd->c;
    t_layout lo = c->lay_o == T_BCAST ? T_BSHD : c->lay_o;
    const int64_t dv = t_case_dv(c); /* v, out, dout, dv; q, k, dq, dk have c->d */
    struct { int64_t s, h, d; t_layout lay; } shape[N_BUF] = {
        {c->sq, c->hq, c->d, c->lay_q}, {c->sk, c->hk, c->d, c->lay_kv}, {c->sk, c->hk, dv, c->lay_kv},
        {c->sq, c->hq, dv, lo},         {c->sq, c->hq, dv, lo},          {c->sq, c->hq, c->d, lo},
        {c->sk, c->hk, c->d, lo},       {c->sk, c->hk, dv, lo}};
    for (int i = 0; i < N_BUF; i++)
        cd->buf[i] = t_buf_new_r(rng, c->dt, c->b, shape[i].s, shape[i].h, shape[i].d, shape[i].lay);
    double sigma = c->sigma > 0 ? c->sigma : 1;
    t_buf_randn_r(rng, &cd->buf[B_Q], sigma);
    t_buf_randn_r(rng, &cd->buf[B_K], sigma);
    t_buf_randn_r(rng, &cd->buf[B_V], 1);
    t_buf_randn_r(rng, &cd->buf[B_DOUT], 1);
    int64_t nq = c->b * c->sq * c->hq * c->d, nk = c->b * c->sk * c->hk * c->d;
    int64_t no = c->b * c->sq * c->hq * dv, nv = c->b * c->sk * c->hk * dv;
    cd->nlse = c->b * c->hq * c->sq;
    int64_t n[N_OUT] = {no, cd->nlse, nq, nk, nv};
    for (int i = 0; i < N_OUT; i++) {
        cd->nref[i] = n[i];
        if (!(cd->ref[i] = malloc((size_t)(n[i] ? n[i] : 1) * sizeof(double)))) return -1;
    }
    return 0;
}

static void case_free(case_data *cd) {
    for (int i = 0; i < N_BUF; i++) t_buf_free(&cd->buf[i]);
    for (int i = 0; i < N_OUT; i++) free(cd->ref[i]);
}

/* The device's copy of a host view: the whole allocation, so padding travels too. */
static fa_tensor on_device(const t_buf *b, const dev_buf *d) {
    fa_tensor t = b->t;
    t.data = (char *)d->ptr + b->offset;
    return t;
}

/* Run algo forward then backward on dev; errors of each output against the oracle into r. */
static void run_algo(fa_context *ctx, fa_backend dev, fa_algo algo, case_data *cd, run_out *r) {
    memset(r, 0, sizeof *r);
    fa_attn_opts o = cd->c.opts;
    o.algo = algo;
    dev_buf d[N_BUF], lse, cu, sk;
    memset(d, 0, sizeof d);
    memset(&lse, 0, sizeof lse);
    memset(&cu, 0, sizeof cu);
    memset(&sk, 0, sizeof sk);
    int bad = 0;
    for (int i = 0; i < N_BUF && !bad; i++) {
        t_buf *b = &cd->buf[i];
        if (i == B_O || i >= B_DQ) t_buf_poison(b);
        bad = dev_alloc(&d[i], dev, b->mem_bytes) || dev_upload(&d[i], b->mem, b->mem_bytes);
    }
    if (!bad) bad = dev_alloc(&lse, dev, (size_t)cd->nlse * 4) || dev_fill_nan(&lse);
    if (!bad && o.cu_seqlens_q) { /* a packed batch's offsets in the device's memory, the longest lengths as bounds */
        const size_t n = (size_t)o.n_seqs + 1;
        int32_t *h = malloc(2 * n * sizeof(int32_t));
        bad = !h || dev_alloc(&cu, dev, 2 * n * sizeof(int32_t));
        if (!bad) {
            memcpy(h, o.cu_seqlens_q, n * sizeof(int32_t)), memcpy(h + n, o.cu_seqlens_k, n * sizeof(int32_t));
            bad = dev_upload(&cu, h, 2 * n * sizeof(int32_t));
            for (size_t s = 0; s + 1 < n; s++) {
                if (h[s + 1] - h[s] > o.max_seqlen_q) o.max_seqlen_q = h[s + 1] - h[s];
                if (h[n + s + 1] - h[n + s] > o.max_seqlen_k) o.max_seqlen_k = h[n + s + 1] - h[n + s];
            }
            o.cu_seqlens_q = (const int32_t *)cu.ptr, o.cu_seqlens_k = (const int32_t *)cu.ptr + n;
        }
        free(h);
    }
    if (!bad && o.sinks) { /* the sinks in the device's memory too */
        const size_t n = (size_t)cd->c.hq * sizeof(float);
        bad = dev_alloc(&sk, dev, n) || dev_upload(&sk, o.sinks, n);
        if (!bad) o.sinks = (const float *)sk.ptr;
    }
    if (bad) {
        r->ok = -1;
        snprintf(r->msg, sizeof r->msg, "cannot allocate buffers on %s", fa_backend_name(dev));
        goto done;
    }
    fa_tensor t[N_BUF];
    for (int i = 0; i < N_BUF; i++) t[i] = on_device(&cd->buf[i], &d[i]);
    fa_status st = fa_forward(ctx, &o, &t[B_Q], &t[B_K], &t[B_V], &t[B_O], (float *)lse.ptr);
    const int forward_ran = st == FA_OK;
    if (st == FA_OK)
        st = fa_backward(ctx, &o, &t[B_Q], &t[B_K], &t[B_V], &t[B_O], (const float *)lse.ptr, &t[B_DOUT], &t[B_DQ],
                         &t[B_DK], &t[B_DV]);
    if (forward_ran && st == FA_ERR_UNSUPPORTED && o.algo == FA_ALGO_FLASH3) { /* FLASH2's backward instead */
        o.algo = FA_ALGO_FLASH2;
        st = fa_backward(ctx, &o, &t[B_Q], &t[B_K], &t[B_V], &t[B_O], (const float *)lse.ptr, &t[B_DOUT], &t[B_DQ],
                         &t[B_DK], &t[B_DV]);
    }
    if (st == FA_OK && dev_sync(dev)) st = FA_ERR_DEVICE;
    if (st != FA_OK) {
        r->ok = (st == FA_ERR_UNSUPPORTED && dev == FA_BACKEND_CUDA) ? 0 : -1;
        snprintf(r->msg, sizeof r->msg, "%s: %s", fa_status_string(st), fa_context_last_error(ctx));
        goto done;
    }
    r->ok = 1;
    static const int which[4] = {B_O, B_DQ, B_DK, B_DV}, outs[4] = {OUT_O, OUT_DQ, OUT_DK, OUT_DV};
    for (int w = 0; w < 4; w++) {
        t_buf *b = &cd->buf[which[w]];
        if (dev_download(&d[which[w]], b->mem, b->mem_bytes)) {
            r->ok = -1;
            snprintf(r->msg, sizeof r->msg, "cannot download %s", OUT_NAME[outs[w]]);
            goto done;
        }
        r->unwritten += t_buf_check_written(b);
        r->err[outs[w]] = t_max_diff(&b->t, cd->ref[outs[w]]);
    }
    float *l = malloc((size_t)(cd->nlse ? cd->nlse : 1) * 4);
    if (!l || dev_download(&lse, l, (size_t)cd->nlse * 4)) {
        r->ok = -1;
        snprintf(r->msg, sizeof r->msg, "cannot download lse");
    } else {
        r->err[OUT_LSE] = t_max_diff_f(l, cd->ref[OUT_LSE], cd->nlse);
    }
    free(l);
done:
    for (int i = 0; i < N_BUF; i++) dev_free(&d[i]);
    dev_free(&lse);
    dev_free(&cu);
    dev_free(&sk);
}

/* Judge algorithm a of case ci against the oracle and STANDARD's errors (stdr); fold into ag. 1 if it failed. */
static int judge_algo(int a, int64_t ci, const case_data *cd, const run_out *res, const run_out *stdr, agg ag[2],
                      const char *desc) {
    int failed = 0;
    if (res->ok == 1 && res->unwritten) {
        printf("FAIL case %lld %s: %lld output elements not written (NaN) or written outside the view\n      %s\n",
               (long long)ci, fa_algo_name(ALGOS[a]), (long long)res->unwritten, desc);
        failed = 1;
    }
    /* Gradients are judged against the largest of the three (tolerance.h). */
    double gscale = 0;
    for (int w = OUT_DQ; w <= OUT_DV; w++) {
        double m = t_max_abs(cd->ref[w], cd->nref[w]);
        if (m > gscale) gscale = m;
    }
    double lscale = t_lse_scale(cd->ref[OUT_LSE], cd->nlse);
    int is_std = a == 0 || stdr->ok != 1;
    for (int pass = 0; pass < 2; pass++) {
        agg *g = &ag[pass];
        if (res->ok == 0) {
            g->unsupported++;
            continue;
        }
        g->cases++;
        if (res->ok < 0) {
            g->failed++;
            if (pass == 0)
                printf("FAIL case %lld %s: %s\n      %s\n", (long long)ci, fa_algo_name(ALGOS[a]), res->msg, desc);
            failed = 1;
            continue;
        }
        int failed_here = pass == 0 && res->unwritten;
        int lo = pass == 0 ? OUT_O : OUT_DQ, hi = pass == 0 ? OUT_LSE : OUT_DV;
        for (int w = lo; w <= hi; w++) {
            if (cd->nref[w] == 0) continue;
            double err = res->err[w], std_err = stdr->ok == 1 ? stdr->err[w] : 0;
            double refmax = w == OUT_LSE ? lscale : w >= OUT_DQ ? gscale : t_max_abs(cd->ref[w], cd->nref[w]);
            t_verdict v = w == OUT_LSE ? t_judge_lse(is_std, err, std_err, refmax)
                                       : t_judge(cd->c.dt, is_std, w >= OUT_DQ, err, std_err, refmax, cd->c.relax);
            double rel = refmax > 0 ? err / refmax : (err > 0 ? INFINITY : 0);
            if (!(rel <= g->worst_rel)) g->worst_rel = isnan(rel) ? INFINITY : rel;
            if (!(v.ratio <= g->worst_ratio)) {
                g->worst_ratio = v.ratio;
                g->worst_case = (int)ci;
                snprintf(g->worst_what, sizeof g->worst_what, "%s", OUT_NAME[w]);
            }
            if (!v.ok) {
                failed_here = 1;
                printf("FAIL case %lld %s %s %s: max err %.3e > allowed %.3e (%s; max|ref| %.3e)\n      %s\n",
                       (long long)ci, fa_algo_name(ALGOS[a]), pass ? "bwd" : "fwd", OUT_NAME[w], err, v.allowed,
                       v.by_ceiling ? "ceiling" : "2 x standard + atol", refmax, desc);
            }
        }
        if (failed_here) {
            g->failed++;
            failed = 1;
        }
    }
    return failed;
}

static void check_help(void) {
    printf("usage: flashattn check [--seed S] [--count N] [--first I] [--device cpu|cuda] [--dtype LIST] [--verbose]\n"
           "\n"
           "Runs STANDARD, FLASH1 and FLASH2 (on CUDA also FLASH3; FLASH2's backward where FLASH3's\n"
           "is not built), forward and backward, on\n"
           "--count random cases (batch, seqlen_q ≠ seqlen_k, GQA/MQA heads, head_dim 1..256 (v's its own on 20 %%),\n"
           "causal, sliding window, softcap, scale, sinks, varlen with empty sequences, BSHD/BHSD/strided/broadcast\n"
           "layouts, f32/f16/bf16) and compares out, lse, dq, dk, dv with the float64 oracle.\n"
           "Pass: max|x-ref| <= 2*max|standard-ref| + ulp(dtype)*max|ref|, under a ceiling (f32: max|x-ref|/max|ref| <=\n"
           "1e-5; f16/bf16: a few ulps). Outputs are poisoned with NaN before every call; an element left unwritten or\n"
           "written outside its view fails. The rule and the cases are the tests' own (docs/testing.md).\n"
           "KV-cache decoding is checked by the test suite (tests/test_kvcache.c; on CUDA tests/gpu/test_gpu_kvcache.c).\n"
           "Exit status 0 only if every case passes.\n"
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
            if (!(v = opt_value(S, argc, argv, &i, "--dtype")) || parse_dtype_list(S, "--dtype", v, &dtypes, 0))
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
    int n_fail_cases = 0;
    double t0 = now_ms();
    /* no tile options: check runs the tuned defaults; sinks on 20 %, attention_chunk on 15 %, v's own head_dim
     * (dv != dqk) on 20 % */
    t_space space = {239, 256, 1, 0, 0, 15, 3e6, 20, 15, 20};
    for (int i = 0; i < dtypes.n; i++) space.dtypes |= 1u << dtypes.v[i];
    for (int64_t ci = first; ci < first + count; ci++) {
        t_rng rng;
        t_rng_seed(&rng, (uint64_t)seed * 0x9e3779b97f4a7c15ull ^ ((uint64_t)ci + 1) * 0xd1b54a32d192ed03ull);
        case_data cd;
        memset(&cd, 0, sizeof cd);
        cd.c = t_case_draw(&rng, &space);
        t_case_bind(&cd.c);
        char desc[512];
        t_case_describe(&cd.c, desc, sizeof desc);
        fa_status rs = FA_ERR_OUT_OF_MEMORY;
        if (case_alloc(&cd, &rng) == 0) {
            rs = t_oracle_forward(&cd.c.opts, &cd.buf[B_Q].t, &cd.buf[B_K].t, &cd.buf[B_V].t, cd.ref[OUT_O],
                                  cd.ref[OUT_LSE]);
            if (rs == FA_OK)
                rs = t_oracle_backward(&cd.c.opts, &cd.buf[B_Q].t, &cd.buf[B_K].t, &cd.buf[B_V].t, &cd.buf[B_DOUT].t,
                                       cd.ref[OUT_DQ], cd.ref[OUT_DK], cd.ref[OUT_DV]);
        }
        if (rs != FA_OK) {
            printf("case %lld: the oracle could not run the case (%s): %s\n", (long long)ci, fa_status_string(rs), desc);
            n_fail_cases++;
        } else {
            run_out res[N_ALGOS];
            for (int a = 0; a < n_algos(dev); a++) run_algo(ctx, dev, ALGOS[a], &cd, &res[a]);
            /* STANDARD's errors are the yardstick; on a device where it did not run, the CPU's STANDARD. */
            run_out stdr = res[0];
            if (stdr.ok != 1 && dev != FA_BACKEND_CPU) {
                fa_context *cpu = NULL;
                if (fa_context_create(&cpu, FA_BACKEND_CPU, 0) == FA_OK) {
                    run_algo(cpu, FA_BACKEND_CPU, FA_ALGO_STANDARD, &cd, &stdr);
                    fa_context_destroy(cpu);
                }
            }
            int dti = cd.c.dt == FA_DTYPE_F32 ? 0 : cd.c.dt == FA_DTYPE_F16 ? 1 : 2, case_failed = 0;
            for (int a = 0; a < n_algos(dev); a++) {
                agg per_pass[2] = {ag[a][0][dti], ag[a][1][dti]};
                case_failed |= judge_algo(a, ci, &cd, &res[a], &stdr, per_pass, desc);
                ag[a][0][dti] = per_pass[0], ag[a][1][dti] = per_pass[1];
            }
            if (case_failed) n_fail_cases++;
            if (verbose) printf("case %lld %s: %s\n", (long long)ci, case_failed ? "FAIL" : "ok", desc);
        }
        case_free(&cd);
        fflush(stdout);
    }
    fa_context_destroy(ctx);

    printf("\n| %-8s | %-4s | %-5s | %5s | %6s | %11s | %13s | %19s |\n", "algo", "pass", "dtype", "cases", "failed",
           "worst rel", "worst err/ok", "where");
    printf("|----------|------|-------|------:|-------:|------------:|--------------:|---------------------|\n");
    static const fa_dtype DT[3] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int a = 0; a < n_algos(dev); a++)
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
    printf("\nworst rel = max|x-ref|/max|ref| (lse: /max(1, max|ref|); gradients: / the largest of max|dq|, max|dk|, max|dv|);\n"
           "worst err/ok = max|x-ref| / allowed (≤ 1 passes)\n");
    printf("%lld cases in %.1f s: %s (%d failing case%s)\n", (long long)count, (now_ms() - t0) / 1e3,
           n_fail_cases ? "FAILED" : "all passed", n_fail_cases, n_fail_cases == 1 ? "" : "s");
    if (n_fail_cases)
        printf("replay a case: flashattn check --seed %lld --first I --count 1 --verbose\n", (long long)seed);
    return n_fail_cases ? 1 : 0;
}
