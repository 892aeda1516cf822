/* Two builds of libflashattn.so in one process, decoding from one cache: A and B alternate call by call (ABBA), each
 * call after a read pass over another buffer of the cache's size (the LLC cold, as in `flashattn bench --mode
 * kvcache`), and after each pair the memcpy and read-only anchors of that bench. On a VM whose memory bandwidth moves
 * between states within seconds, separate processes per build (kvcache-anchors.sh with OLD_BUILD) measure the states
 * as much as the builds; here every pair of calls sees the same state, and the ratio B/A is taken per pair.
 * Prints GB/s of K+V read, median (min-max), the median of the per-pair B/A, and each build against the anchors.
 *
 *   kvcache_ab LIB_A LIB_B [heads_q=32] [heads_k=8] [cache=32768] [pairs=15] [threads=0: all] [huge_pages=0]
 *
 * bf16 cache, batch 1, d 128, one new query row, nothing appended. Not a test; built on demand
 * (`cmake --build <dir> --target kvcache_ab`). */
#define _GNU_SOURCE /* madvise, RTLD_* */
#include "flashattn.h"
#include "lab_time.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef fa_status (*ctx_create_fn)(fa_context **, fa_backend, int);
typedef fa_status (*kv_fn)(fa_context *, const fa_attn_opts *, const fa_kv_opts *, const fa_tensor *, const fa_kvcache *,
                           const fa_tensor *, const fa_tensor *, const fa_tensor *, float *);
typedef const char *(*err_fn)(const fa_context *);
typedef int (*threads_fn)(const fa_context *);
typedef fa_status (*opts_fn)(fa_attn_opts *, size_t);
typedef fa_tensor (*bshd_fn)(void *, fa_dtype, int64_t, int64_t, int64_t, int64_t);
typedef struct build {
    const char *path;
    fa_context *ctx;
    kv_fn run;
    err_fn err;
    threads_fn threads;
    bshd_fn bshd;
    opts_fn opts;
} build;

static double median(const double *x, int n, double *lo, double *hi) {
    double *y = malloc(sizeof *y * (size_t)n);
    memcpy(y, x, sizeof *y * (size_t)n);
    qsort(y, (size_t)n, sizeof *y, lab_by_value);
    const double m = n % 2 ? y[n / 2] : (y[n / 2 - 1] + y[n / 2]) / 2;
    if (lo) *lo = y[0], *hi = y[n - 1];
    free(y);
    return m;
}
/* n bytes, touched; with huge, 2 MB aligned and advised as transparent huge pages (the bench's --huge-pages 1) */
static char *buffer(size_t n, int huge) {
    const size_t hp = (size_t)2 << 20, sz = huge ? (n + hp - 1) / hp * hp : (n + 63) / 64 * 64;
    char *p = aligned_alloc(huge ? hp : 64, sz);
    if (p && huge) madvise(p, sz, MADV_HUGEPAGE);
    if (p) memset(p, 0x3c, sz); /* bf16 1.15625: finite, and every page present */
    return p;
}
/* The bench's read-only anchor (tools/flashattn/bench_kvcache.c, read_sum): 16-byte loads, eight accumulators. */
typedef uint64_t v2u64 __attribute__((vector_size(16)));
static uint64_t read_sum(const char *p, size_t n) {
    v2u64 s[8] = {{0}}, x;
    for (size_t i = 0; i + 128 <= n; i += 128)
        for (int k = 0; k < 8; k++) memcpy(&x, p + i + 16 * k, 16), s[k] += x;
    for (int k = 1; k < 8; k++) s[0] += s[k];
    return s[0][0] + s[0][1];
}
static volatile uint64_t sink;
static double read_pass(const char *p, size_t n, int threads) {
    const double t0 = lab_now();
    uint64_t s = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : s)
    for (int t = 0; t < threads; t++) s += read_sum(p + n / (size_t)threads * (size_t)t, n / (size_t)threads);
    sink += s;
    return lab_now() - t0;
}
static double copy_pass(char *dst, const char *src, size_t n, int threads) {
    const double t0 = lab_now();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < threads; t++) {
        const size_t lo = n / (size_t)threads * (size_t)t, hi = t == threads - 1 ? n : lo + n / (size_t)threads;
        memcpy(dst + lo, src + lo, hi - lo);
    }
    return lab_now() - t0;
}

static int open_build(build *b, const char *path, int threads) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) return fprintf(stderr, "%s\n", dlerror()), -1;
    ctx_create_fn create = (ctx_create_fn)dlsym(h, "fa_context_create");
    b->run = (kv_fn)dlsym(h, "fa_forward_kvcache");
    b->err = (err_fn)dlsym(h, "fa_context_last_error");
    b->threads = (threads_fn)dlsym(h, "fa_context_threads");
    b->bshd = (bshd_fn)dlsym(h, "fa_tensor_bshd");
    b->opts = (opts_fn)dlsym(h, "fa_attn_opts_init");
    b->path = path;
    if (!create || !b->run || !b->err || !b->threads || !b->bshd || !b->opts || create(&b->ctx, FA_BACKEND_CPU, threads) != FA_OK)
        return fprintf(stderr, "%s: no CPU context\n", path), -1;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s LIB_A LIB_B [heads_q=32] [heads_k=8] [cache=32768] [pairs=15] [threads=0] [huge_pages=0]\n",
                argv[0]);
        return 2;
    }
    const int64_t hq = argc > 3 ? atoll(argv[3]) : 32, hk = argc > 4 ? atoll(argv[4]) : 8, N = argc > 5 ? atoll(argv[5]) : 32768;
    const int pairs = argc > 6 ? atoi(argv[6]) : 15, huge = argc > 8 ? atoi(argv[8]) : 0, d = 128;
    int threads = argc > 7 ? atoi(argv[7]) : 0;
    if (hq < 1 || hk < 1 || hq % hk || N < 1 || pairs < 1 || threads < 0) return fprintf(stderr, "bad sizes\n"), 2;
    build B[2];
    if (open_build(&B[0], argv[1], threads) || open_build(&B[1], argv[2], threads)) return 1;
    if (!threads) threads = B[0].threads(B[0].ctx);
    const size_t kvb = (size_t)(N * hk * d) * 2, anc = 2 * kvb > ((size_t)64 << 20) ? 2 * kvb : (size_t)64 << 20;
    char *kv = buffer(2 * kvb, huge), *fl = buffer(anc, huge), *cp = buffer(anc, huge);
    uint16_t *q = calloc((size_t)(hq * d), 2), *o = calloc((size_t)(hq * d), 2);
    if (!kv || !fl || !cp || !q || !o) return fprintf(stderr, "out of memory\n"), 1;
    for (int64_t i = 0; i < hq * d; i++) q[i] = (uint16_t)(0x3c00 + (i * 37 % 128)); /* bf16 in [0.0078, 0.016) */
    int32_t len = (int32_t)N;
    fa_kvcache c;
    memset(&c, 0, sizeof c);
    c.k = B[0].bshd(kv, FA_DTYPE_BF16, 1, N, hk, d), c.v = B[0].bshd(kv + kvb, FA_DTYPE_BF16, 1, N, hk, d);
    c.seqlens = &len;
    const fa_tensor tq = B[0].bshd(q, FA_DTYPE_BF16, 1, 1, hq, d), to = B[0].bshd(o, FA_DTYPE_BF16, 1, 1, hq, d);
    fa_attn_opts opts;
    B[0].opts(&opts, sizeof opts);
    double *g[4], *ratio = malloc(sizeof(double) * (size_t)pairs); /* GB/s of A, B, memcpy, read per pair */
    for (int k = 0; k < 4; k++) g[k] = malloc(sizeof(double) * (size_t)pairs);
    for (int r = -2; r < pairs; r++) { /* two warm-up pairs */
        double t[2];
        for (int k = 0; k < 2; k++) {
            const int w = (r & 1) ? 1 - k : k; /* ABBA */
            read_pass(fl, anc, threads);
            const double t0 = lab_now();
            if (B[w].run(B[w].ctx, &opts, NULL, &tq, &c, NULL, NULL, &to, NULL) != FA_OK)
                return fprintf(stderr, "%s: %s\n", B[w].path, B[w].err(B[w].ctx)), 1;
            t[w] = lab_now() - t0;
        }
        const double tc = copy_pass(cp, fl, anc, threads), tr = read_pass(fl, anc, threads);
        if (r < 0) continue;
        g[0][r] = 2.0 * (double)kvb / t[0] * 1e-9, g[1][r] = 2.0 * (double)kvb / t[1] * 1e-9;
        g[2][r] = 2.0 * (double)anc / tc * 1e-9, g[3][r] = (double)anc / tr * 1e-9;
        ratio[r] = t[0] / t[1];
    }
    printf("bf16 cache, batch 1, d %d, %lld keys, heads %lld/%lld, %d threads, %s pages, %d pairs (ABBA)\n", d,
           (long long)N, (long long)hq, (long long)hk, threads, huge ? "huge" : "4 KB", pairs);
    const char *name[4] = {"A", "B", "memcpy", "read"};
    for (int k = 0; k < 4; k++) {
        double lo, hi;
        const double m = median(g[k], pairs, &lo, &hi);
        printf("%-6s %6.1f GB/s (%.1f-%.1f)%s%s\n", name[k], m, lo, hi, k < 2 ? "  " : "", k < 2 ? argv[1 + k] : "");
    }
    double pa[2][2]; /* per pair: A and B over memcpy, over read */
    for (int w = 0; w < 2; w++) {
        double x[2][pairs];
        for (int r = 0; r < pairs; r++) x[0][r] = g[w][r] / g[2][r], x[1][r] = g[w][r] / g[3][r];
        pa[w][0] = median(x[0], pairs, NULL, NULL), pa[w][1] = median(x[1], pairs, NULL, NULL);
    }
    double lo, hi;
    const double m = median(ratio, pairs, &lo, &hi);
    printf("B/A per pair: %.3f (%.3f-%.3f); per pair over memcpy: A %.2f B %.2f; over read: A %.2f B %.2f\n", m, lo,
           hi, pa[0][0], pa[1][0], pa[0][1], pa[1][1]);
    return 0;
}
