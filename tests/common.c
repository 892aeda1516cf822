/* Shared test helpers; see common.h. */
#include "common.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cpu/reference.h"
#include "core/half.h"

int t_failures = 0;
int t_checks = 0;
char t_case_label[512] = "";
static const char *t_name = "test";

void t_fail_at(const char *file, int line, const char *fmt, ...) {
    t_failures++;
    if (t_failures > 60) {
        if (t_failures == 61) fprintf(stderr, "(further failures not printed)\n");
        return;
    }
    fflush(stdout);
    fprintf(stderr, "\nFAIL %s:%d [%s]: ", file, line, t_case_label);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

int t_finish(void) {
    const char *seed = getenv("FA_TEST_SEED");
    printf("%s: %d checks, %d failures%s%s\n", t_name, t_checks, t_failures, t_failures ? " -- replay with FA_TEST_SEED=" : "",
           t_failures ? (seed ? seed : "(see the seed above)") : "");
    return t_failures ? 1 : 0;
}

/* ---- RNG: xoshiro256** seeded through splitmix64 ---- */
static uint64_t rng_s[4];
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
uint64_t t_rand_u64(void) {
    uint64_t r = rotl(rng_s[1] * 5, 7) * 9, t = rng_s[1] << 17;
    rng_s[2] ^= rng_s[0];
    rng_s[3] ^= rng_s[1];
    rng_s[1] ^= rng_s[2];
    rng_s[0] ^= rng_s[3];
    rng_s[2] ^= t;
    rng_s[3] = rotl(rng_s[3], 45);
    return r;
}
double t_uniform(void) { return (double)(t_rand_u64() >> 11) * (1.0 / 9007199254740992.0); }
double t_randn(void) {
    double u1 = t_uniform(), u2 = t_uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
int t_randint(int lo, int hi) { return lo + (int)(t_rand_u64() % (uint64_t)(hi - lo + 1)); }

uint64_t t_init(const char *name) {
    t_name = name;
    uint64_t seed;
    const char *env = getenv("FA_TEST_SEED");
    if (env && *env) {
        seed = strtoull(env, NULL, 0);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = ((uint64_t)ts.tv_sec * 1000003u) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
        seed %= 1000000000000ull; /* short enough to type */
    }
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) rng_s[i] = splitmix64(&x);
    printf("%s: seed %llu (replay: FA_TEST_SEED=%llu)\n", name, (unsigned long long)seed, (unsigned long long)seed);
    const char *isa = getenv("FA_CPU_ISA");
    if (isa && *isa) printf("%s: FA_CPU_ISA=%s\n", name, isa);
    fflush(stdout);
    return seed;
}

fa_context *t_cpu_ctx(void) {
    int threads = 2;
    const char *env = getenv("FA_TEST_THREADS");
    if (env && *env) threads = atoi(env);
    fa_context *ctx = NULL;
    fa_status st = fa_context_create(&ctx, FA_BACKEND_CPU, threads);
    if (st != FA_OK || !ctx) {
        fprintf(stderr, "%s: cannot create a CPU context: %s (%s)\n", t_name, fa_status_string(st), fa_create_error());
        exit(1);
    }
    return ctx;
}

const char *t_layout_name(t_layout l) {
    switch (l) {
    case T_BSHD: return "bshd";
    case T_BHSD: return "bhsd";
    case T_STRIDED: return "strided";
    case T_BCAST: return "bcast";
    }
    return "?";
}

/* ---- tensors ---- */
static size_t esize(fa_dtype dt) { return dt == FA_DTYPE_F32 ? 4 : 2; }

static void store_nan(unsigned char *p, fa_dtype dt) {
    if (dt == FA_DTYPE_F32) {
        uint32_t u = 0x7fc00000u;
        memcpy(p, &u, 4);
    } else {
        uint16_t u = dt == FA_DTYPE_F16 ? 0x7e00u : 0x7fc0u;
        memcpy(p, &u, 2);
    }
}

float t_nanf(void) { return fa_bits_to_f32(0x7fc00000u); }

t_buf t_buf_new(fa_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d, t_layout lay) {
    t_buf x;
    memset(&x, 0, sizeof x);
    int64_t sb, ss, sh, off = 0, elems;
    switch (lay) {
    case T_BHSD:
        ss = d, sh = s * d, sb = h * s * d;
        elems = b * sb;
        break;
    case T_STRIDED: {
        int64_t ph = t_randint(1, 5), ps = t_randint(0, 7), pb = t_randint(0, 9);
        off = t_randint(0, 7);
        if (t_randint(0, 1)) { /* seq outer, head inner (padded bshd) */
            sh = d + ph, ss = h * sh + ps, sb = s * ss + pb;
        } else { /* head outer, seq inner (padded bhsd) */
            ss = d + ph, sh = s * ss + ps, sb = h * sh + pb;
        }
        elems = off + (b - 1) * sb + (s - 1) * ss + (h - 1) * sh + d + t_randint(0, 5);
        break;
    }
    case T_BCAST:
        sh = d, ss = h * d, sb = 0;
        elems = s * h * d;
        break;
    case T_BSHD:
    default:
        sh = d, ss = h * d, sb = s * h * d;
        elems = b * sb;
        break;
    }
    if (elems < 1) elems = 1;
    x.mem_elems = (size_t)elems;
    x.mem_bytes = (size_t)elems * esize(dt);
    x.mem = malloc(x.mem_bytes);
    x.in_view = calloc((size_t)elems, 1);
    if (!x.mem || !x.in_view) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    x.t.data = x.mem + off * (int64_t)esize(dt);
    x.t.dtype = dt;
    x.t.batch = b, x.t.seqlen = s, x.t.heads = h, x.t.head_dim = d;
    x.t.stride_batch = sb, x.t.stride_seq = ss, x.t.stride_head = sh;
    for (int64_t ib = 0; ib < b; ib++)
        for (int64_t is = 0; is < s; is++)
            for (int64_t ih = 0; ih < h; ih++)
                for (int64_t i = 0; i < d; i++) x.in_view[off + ib * sb + is * ss + ih * sh + i] = 1;
    t_buf_poison(&x);
    return x;
}

void t_buf_free(t_buf *x) {
    free(x->mem);
    free(x->in_view);
    memset(x, 0, sizeof *x);
}

void t_buf_poison(t_buf *x) {
    size_t es = esize(x->t.dtype);
    for (size_t i = 0; i < x->mem_elems; i++) store_nan(x->mem + i * es, x->t.dtype);
}

static int64_t t_index(const fa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t i) {
    return b * t->stride_batch + s * t->stride_seq + h * t->stride_head + i;
}
double t_get(const fa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t i) {
    return fa_load_elem(t->data, (int)t->dtype, t_index(t, b, s, h, i));
}
void t_set(const fa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t i, double v) {
    fa_store_elem(t->data, (int)t->dtype, t_index(t, b, s, h, i), (float)v);
}

void t_buf_randn(t_buf *x, double sigma) {
    const fa_tensor *t = &x->t;
    int64_t nb = t->stride_batch == 0 ? 1 : t->batch;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t s = 0; s < t->seqlen; s++)
            for (int64_t h = 0; h < t->heads; h++)
                for (int64_t i = 0; i < t->head_dim; i++) t_set(t, b, s, h, i, sigma * t_randn());
}

int64_t t_buf_check_written(const t_buf *x) {
    size_t es = esize(x->t.dtype);
    unsigned char nan_bits[4];
    store_nan(nan_bits, x->t.dtype);
    int64_t bad = 0;
    for (size_t i = 0; i < x->mem_elems; i++) {
        const unsigned char *p = x->mem + i * es;
        if (x->in_view[i]) {
            if (!isfinite(fa_load_elem(x->mem, (int)x->t.dtype, (int64_t)i))) bad++;
        } else if (memcmp(p, nan_bits, es) != 0) {
            bad++;
        }
    }
    return bad;
}

double t_max_diff(const fa_tensor *t, const double *ref) {
    double m = 0;
    int64_t n = 0;
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seqlen; s++)
            for (int64_t h = 0; h < t->heads; h++)
                for (int64_t i = 0; i < t->head_dim; i++, n++) {
                    double e = fabs(t_get(t, b, s, h, i) - ref[n]);
                    if (!(e <= m)) m = isnan(e) ? INFINITY : e;
                }
    return m;
}

double t_max_abs(const double *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(x[i]) && fabs(x[i]) > m) m = fabs(x[i]);
    return m;
}

double t_max_diff_f(const float *a, const double *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isinf(a[i]) && isinf(b[i]) && (a[i] < 0) == (b[i] < 0)) continue;
        double e = fabs((double)a[i] - b[i]);
        if (!(e <= m)) m = isnan(e) ? INFINITY : e;
    }
    return m;
}

/* ---- tolerance ---- */
double t_atol(fa_dtype dt, double refmax) {
    switch (dt) {
    case FA_DTYPE_F32: return 5e-6 * refmax;       /* f32's real criterion is the 1e-5 relative bound */
    case FA_DTYPE_F16: return refmax / 1024.0;     /* 1 ulp of binary16 at refmax */
    default: return refmax / 128.0;                /* 1 ulp of bfloat16 at refmax */
    }
}

int t_check_err(const char *what, fa_algo algo, fa_dtype dt, double err, double err_std, double refmax,
                int is_grad, double relax) {
    double atol = t_atol(dt, refmax);
    /* A sanity ceiling every algorithm (STANDARD included) must meet: for f32 the relative rule of DESIGN.md;
     * for f16/bf16 a few ulps of the dtype (inputs are exact in the dtype, accumulation is fp32, the result is
     * rounded once; gradients also see the rounded O through D = rowsum(dO∘O)). */
    double rel = (dt == FA_DTYPE_F32 ? 1e-5 : dt == FA_DTYPE_F16 ? (is_grad ? 1e-2 : 2e-3) : (is_grad ? 6e-2 : 1.6e-2)) *
                 (relax > 0 ? relax : 1);
    int ok = 1;
    t_checks++;
    if (!(err <= rel * refmax + (dt == FA_DTYPE_F32 ? 0 : atol))) {
        t_fail_at(__FILE__, __LINE__, "%s %s: max abs err %.3e > %.1e x max|ref| %.3e (%s)", fa_algo_name(algo), what,
                  err, rel, refmax, dt == FA_DTYPE_F32 ? "f32 relative error" : "sanity ceiling");
        ok = 0;
    }
    if (algo != FA_ALGO_STANDARD) {
        t_checks++;
        if (!(err <= 2 * err_std + atol)) {
            t_fail_at(__FILE__, __LINE__, "%s %s: max abs err %.3e > 2 x standard's %.3e + atol %.3e", fa_algo_name(algo),
                      what, err, err_std, atol);
            ok = 0;
        }
    }
    return ok;
}

/* ---- cases ---- */
t_case t_case_make(int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hk, int64_t d, fa_dtype dt) {
    t_case c;
    memset(&c, 0, sizeof c);
    c.b = b, c.sq = sq, c.sk = sk, c.hq = hq, c.hk = hk, c.d = d, c.dt = dt;
    c.lay_q = c.lay_kv = c.lay_o = T_BSHD;
    c.opts = fa_attn_opts_default();
    c.sigma = 1;
    c.relax = 1;
    return c;
}

t_case t_case_laid(int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hk, int64_t d, fa_dtype dt, t_layout lq,
                   t_layout lkv, t_layout lo) {
    t_case c = t_case_make(b, sq, sk, hq, hk, d, dt);
    c.lay_q = lq, c.lay_kv = lkv, c.lay_o = lo;
    return c;
}

void t_case_describe(const t_case *c, char *buf, size_t n) {
    const fa_attn_opts *o = &c->opts;
    int w = snprintf(buf, n, "%s b%lld sq%lld sk%lld h%lld/%lld d%lld q:%s kv:%s o:%s", fa_dtype_name(c->dt),
                     (long long)c->b, (long long)c->sq, (long long)c->sk, (long long)c->hq, (long long)c->hk,
                     (long long)c->d, t_layout_name(c->lay_q), t_layout_name(c->lay_kv), t_layout_name(c->lay_o));
    if (w < 0 || (size_t)w >= n) return;
    if (o->causal) w += snprintf(buf + w, n - (size_t)w, " causal");
    if (o->window_left >= 0 || o->window_right >= 0)
        w += snprintf(buf + w, n - (size_t)w, " win(%d,%d)", o->window_left, o->window_right);
    if (o->softcap != 0) w += snprintf(buf + w, n - (size_t)w, " cap%g", o->softcap);
    if (o->scale != 0) w += snprintf(buf + w, n - (size_t)w, " scale%g", o->scale);
    if (o->block_q || o->block_k) w += snprintf(buf + w, n - (size_t)w, " tiles%dx%d", o->block_q, o->block_k);
    if (o->cu_seqlens_q) w += snprintf(buf + w, n - (size_t)w, " varlen(%lld)", (long long)o->n_seqs);
    if (c->sigma != 1) snprintf(buf + w, n - (size_t)w, " sigma%g", c->sigma);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

static const fa_algo run_order[] = {FA_ALGO_STANDARD, FA_ALGO_FLASH1, FA_ALGO_FLASH2, FA_ALGO_AUTO};

/* The stats of a successful call name the algorithm that ran. */
static void check_stats_algo(fa_context *ctx, fa_algo a, int is_backward) {
    fa_stats st;
    memset(&st, 0, sizeof st);
    CHECK_STATUS(fa_last_stats(ctx, &st), FA_OK);
    CHECK_EQ_INT(st.algo, a == FA_ALGO_AUTO ? FA_ALGO_FLASH2 : a);
    CHECK_EQ_INT(st.is_backward, is_backward);
    CHECK_EQ_INT(st.backend, FA_BACKEND_CPU);
}

static double lse_scale(const double *lse, int64_t n) {
    double m = t_max_abs(lse, n);
    return m > 1 ? m : 1;
}

static void check_lse(fa_algo a, double err, double err_std, double scale) {
    /* LSE is fp32 in every dtype: within 2x standard + 4e-6 relative, and within 2e-5 relative absolutely. */
    CHECK_MSG(err <= 2e-5 * scale, "%s lse: max abs err %.3e > 2e-5 x %.3g", fa_algo_name(a), err, scale);
    if (a != FA_ALGO_STANDARD)
        CHECK_MSG(err <= 2 * err_std + 4e-6 * scale, "%s lse: max abs err %.3e > 2 x standard's %.3e + %.3e",
                  fa_algo_name(a), err, err_std, 4e-6 * scale);
}

static void snapshot(const t_buf *x, unsigned char **copy) {
    *copy = xmalloc(x->mem_bytes);
    memcpy(*copy, x->mem, x->mem_bytes);
}
static void check_unchanged(const t_buf *x, unsigned char *copy, const char *name) {
    CHECK_MSG(memcmp(x->mem, copy, x->mem_bytes) == 0, "input %s was modified", name);
    free(copy);
}

/* out and lse poisoned (NaN), then fa_forward with algorithm a; a failure is counted and reported. */
static int poisoned_forward(fa_context *ctx, fa_attn_opts *opts, fa_algo a, t_buf *q, t_buf *k, t_buf *v, t_buf *o,
                            float *lse, int64_t n_lse, const char *what) {
    t_buf_poison(o);
    for (int64_t i = 0; i < n_lse; i++) lse[i] = t_nanf();
    opts->algo = a;
    fa_status st = fa_forward(ctx, opts, &q->t, &k->t, &v->t, &o->t, lse);
    CHECK_STATUS(st, FA_OK);
    if (st != FA_OK) fprintf(stderr, "  %s%s: %s\n", fa_algo_name(a), what, fa_context_last_error(ctx));
    return st == FA_OK;
}


int t_run_forward(fa_context *ctx, const t_case *c, unsigned algos) {
    int fails0 = t_failures;
    char desc[400];
    t_case_describe(c, desc, sizeof desc);
    snprintf(t_case_label, sizeof t_case_label, "fwd %s", desc);
    printf("fwd %s:", desc);

    t_buf q = t_buf_new(c->dt, c->b, c->sq, c->hq, c->d, c->lay_q);
    t_buf k = t_buf_new(c->dt, c->b, c->sk, c->hk, c->d, c->lay_kv);
    t_buf v = t_buf_new(c->dt, c->b, c->sk, c->hk, c->d, c->lay_kv);
    t_buf o = t_buf_new(c->dt, c->b, c->sq, c->hq, c->d, c->lay_o);
    double sigma = c->sigma > 0 ? c->sigma : 1;
    t_buf_randn(&q, sigma);
    t_buf_randn(&k, sigma);
    t_buf_randn(&v, 1);
    unsigned char *q0, *k0, *v0;
    snapshot(&q, &q0), snapshot(&k, &k0), snapshot(&v, &v0);

    int64_t n_out = c->b * c->sq * c->hq * c->d, n_lse = c->b * c->hq * c->sq;
    double *ref = xmalloc(sizeof(double) * (size_t)n_out), *ref_lse = xmalloc(sizeof(double) * (size_t)n_lse);
    float *lse = xmalloc(sizeof(float) * (size_t)n_lse);
    fa_attn_opts opts = c->opts;
    CHECK_STATUS(fa_reference_forward(&opts, &q.t, &k.t, &v.t, ref, ref_lse), FA_OK);
    double refmax = t_max_abs(ref, n_out), lscale = lse_scale(ref_lse, n_lse);

    double err_std = 0, lse_std = 0;
    algos |= T_ALGO_BIT(FA_ALGO_STANDARD);
    for (size_t ai = 0; ai < sizeof run_order / sizeof run_order[0]; ai++) {
        fa_algo a = run_order[ai];
        if (!(algos & T_ALGO_BIT(a))) continue;
        if (!poisoned_forward(ctx, &opts, a, &q, &k, &v, &o, lse, n_lse, "")) continue;
        check_stats_algo(ctx, a, 0);
        int64_t bad = t_buf_check_written(&o);
        CHECK_MSG(bad == 0, "%s: %lld elements of out not written (NaN) or written outside the view", fa_algo_name(a),
                  (long long)bad);
        double err = t_max_diff(&o.t, ref), lerr = t_max_diff_f(lse, ref_lse, n_lse);
        if (a == FA_ALGO_STANDARD) err_std = err, lse_std = lerr;
        t_check_err("out", a, c->dt, err, err_std, refmax, 0, c->relax);
        check_lse(a, lerr, lse_std, lscale);
        printf(" %s %.1e/%.1e", fa_algo_name(a), err, lerr);
    }
    printf(" (max|o| %.2f)\n", refmax);
    check_unchanged(&q, q0, "q"), check_unchanged(&k, k0, "k"), check_unchanged(&v, v0, "v");

    free(ref), free(ref_lse), free(lse);
    t_buf_free(&q), t_buf_free(&k), t_buf_free(&v), t_buf_free(&o);
    t_case_label[0] = 0;
    return t_failures - fails0;
}

int t_run_backward(fa_context *ctx, const t_case *c, unsigned algos) {
    int fails0 = t_failures;
    char desc[400];
    t_case_describe(c, desc, sizeof desc);
    snprintf(t_case_label, sizeof t_case_label, "bwd %s", desc);
    printf("bwd %s:", desc);

    t_layout lo = c->lay_o == T_BCAST ? T_BSHD : c->lay_o;
    t_buf q = t_buf_new(c->dt, c->b, c->sq, c->hq, c->d, c->lay_q);
    t_buf k = t_buf_new(c->dt, c->b, c->sk, c->hk, c->d, c->lay_kv);
    t_buf v = t_buf_new(c->dt, c->b, c->sk, c->hk, c->d, c->lay_kv);
    t_buf o = t_buf_new(c->dt, c->b, c->sq, c->hq, c->d, lo);
    t_buf dout = t_buf_new(c->dt, c->b, c->sq, c->hq, c->d, lo);
    t_buf dq = t_buf_new(c->dt, c->b, c->sq, c->hq, c->d, lo);
    t_buf dk = t_buf_new(c->dt, c->b, c->sk, c->hk, c->d, lo);
    t_buf dv = t_buf_new(c->dt, c->b, c->sk, c->hk, c->d, lo);
    double sigma = c->sigma > 0 ? c->sigma : 1;
    t_buf_randn(&q, sigma);
    t_buf_randn(&k, sigma);
    t_buf_randn(&v, 1);
    t_buf_randn(&dout, 1);
    unsigned char *q0, *k0, *v0, *do0;
    snapshot(&q, &q0), snapshot(&k, &k0), snapshot(&v, &v0), snapshot(&dout, &do0);

    int64_t nq = c->b * c->sq * c->hq * c->d, nk = c->b * c->sk * c->hk * c->d, n_lse = c->b * c->hq * c->sq;
    double *rdq = xmalloc(sizeof(double) * (size_t)nq), *rdk = xmalloc(sizeof(double) * (size_t)nk),
           *rdv = xmalloc(sizeof(double) * (size_t)nk);
    float *lse = xmalloc(sizeof(float) * (size_t)n_lse);
    fa_attn_opts opts = c->opts;
    CHECK_STATUS(fa_reference_backward(&opts, &q.t, &k.t, &v.t, &dout.t, rdq, rdk, rdv), FA_OK);
    double mq = t_max_abs(rdq, nq), mk = t_max_abs(rdk, nk), mv = t_max_abs(rdv, nk);

    double sq_ = 0, sk_ = 0, sv_ = 0;
    algos |= T_ALGO_BIT(FA_ALGO_STANDARD);
    for (size_t ai = 0; ai < sizeof run_order / sizeof run_order[0]; ai++) {
        fa_algo a = run_order[ai];
        if (!(algos & T_ALGO_BIT(a))) continue;
        if (!poisoned_forward(ctx, &opts, a, &q, &k, &v, &o, lse, n_lse, " forward")) continue;
        unsigned char *o0, *lse0 = xmalloc(sizeof(float) * (size_t)n_lse);
        snapshot(&o, &o0);
        memcpy(lse0, lse, sizeof(float) * (size_t)n_lse);
        t_buf_poison(&dq), t_buf_poison(&dk), t_buf_poison(&dv);
        fa_status st = fa_backward(ctx, &opts, &q.t, &k.t, &v.t, &o.t, lse, &dout.t, &dq.t, &dk.t, &dv.t);
        CHECK_STATUS(st, FA_OK);
        if (st != FA_OK) {
            fprintf(stderr, "  %s backward: %s\n", fa_algo_name(a), fa_context_last_error(ctx));
            free(o0), free(lse0);
            continue;
        }
        check_stats_algo(ctx, a, 1);
        check_unchanged(&o, o0, "out");
        CHECK_MSG(memcmp(lse0, lse, sizeof(float) * (size_t)n_lse) == 0, "input lse was modified by fa_backward");
        free(lse0);
        int64_t bq = t_buf_check_written(&dq), bk = t_buf_check_written(&dk), bv = t_buf_check_written(&dv);
        CHECK_MSG(bq == 0 && bk == 0 && bv == 0,
                  "%s: elements not written (NaN) or written outside the view: dq %lld, dk %lld, dv %lld",
                  fa_algo_name(a), (long long)bq, (long long)bk, (long long)bv);
        double eq = t_max_diff(&dq.t, rdq), ek = t_max_diff(&dk.t, rdk), ev = t_max_diff(&dv.t, rdv);
        if (a == FA_ALGO_STANDARD) sq_ = eq, sk_ = ek, sv_ = ev;
        /* One scale for the three gradients: dQ or dK can be ~0 by cancellation in dP - D (one visible key:
         * P = 1 and dS = 0 exactly), where any fp32 implementation leaves rounding noise of the size of
         * eps·|dP|; measured against max|dQ| = 0 that noise would be an infinite relative error. */
        double gm = mq > mk ? mq : mk;
        gm = gm > mv ? gm : mv;
        if (c->grad_rel > 0) {
            CHECK_MSG(eq <= 2 * sq_ + c->grad_rel * gm && ek <= 2 * sk_ + c->grad_rel * gm &&
                          ev <= 2 * sv_ + c->grad_rel * gm,
                      "%s: gradient errors %.3e %.3e %.3e > 2 x standard's (%.3e %.3e %.3e) + %.2g x max|ref| %.3g",
                      fa_algo_name(a), eq, ek, ev, sq_, sk_, sv_, c->grad_rel, gm);
        } else {
            t_check_err("dq", a, c->dt, eq, sq_, gm, 1, c->relax);
            t_check_err("dk", a, c->dt, ek, sk_, gm, 1, c->relax);
            t_check_err("dv", a, c->dt, ev, sv_, gm, 1, c->relax);
        }
        printf(" %s %.1e/%.1e/%.1e", fa_algo_name(a), eq, ek, ev);
    }
    printf(" (max|dq,dk,dv| %.2f %.2f %.2f)\n", mq, mk, mv);
    check_unchanged(&q, q0, "q"), check_unchanged(&k, k0, "k"), check_unchanged(&v, v0, "v");
    check_unchanged(&dout, do0, "dout");

    free(rdq), free(rdk), free(rdv), free(lse);
    t_buf_free(&q), t_buf_free(&k), t_buf_free(&v), t_buf_free(&o);
    t_buf_free(&dout), t_buf_free(&dq), t_buf_free(&dk), t_buf_free(&dv);
    t_case_label[0] = 0;
    return t_failures - fails0;
}

t_case t_case_random(int max_seqlen, int max_d, int allow_bcast) {
    static const int seqlens[] = {1, 2, 3, 5, 8, 17, 31, 64, 65, 113, 128, 239};
    static const int dims[] = {1, 2, 8, 16, 31, 32, 63, 64, 80, 96, 128, 256};
    static const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    int ns = 0, nd = 0;
    while (ns < (int)(sizeof seqlens / sizeof seqlens[0]) && seqlens[ns] <= max_seqlen) ns++;
    while (nd < (int)(sizeof dims / sizeof dims[0]) && dims[nd] <= max_d) nd++;
    int64_t hk = t_randint(1, 2), group = 1 << t_randint(0, 2);
    t_case c = t_case_make(t_randint(1, 3), seqlens[t_randint(0, ns - 1)], seqlens[t_randint(0, ns - 1)], hk * group,
                           hk, dims[t_randint(0, nd - 1)], dts[t_randint(0, 2)]);
    c.lay_q = (t_layout)t_randint(0, 2);
    c.lay_kv = (t_layout)t_randint(0, allow_bcast ? 3 : 2);
    c.lay_o = (t_layout)t_randint(0, 2);
    c.opts.causal = t_randint(0, 2) == 0;
    if (t_randint(0, 3) == 0) c.opts.window_left = t_randint(0, 20);
    if (t_randint(0, 3) == 0) c.opts.window_right = t_randint(0, 20);
    if (t_randint(0, 3) == 0) c.opts.softcap = (float)t_randint(5, 50);
    if (t_randint(0, 1)) c.opts.block_q = t_randint(1, 70), c.opts.block_k = t_randint(1, 70);
    /* an explicit scale around the default 1/sqrt(d), sometimes negative (logits stay O(1..10): the f32 bound of
     * 1e-5 assumes scores that fp32 represents to ~1e-6) */
    if (t_randint(0, 4) == 0) c.opts.scale = (float)((t_randint(0, 3) ? 1 : -1) * (0.3 + t_uniform()) / sqrt((double)c.d));
    c.sigma = t_randint(0, 2) ? 1 : 2;
    return c;
}
