/* flashattn CLI: argument parsing, timing, random data. */
#include "common.h"

#include "peak.h"
#include "core/half.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

int cli_usage_error(const char *sub, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "flashattn%s%s: error: ", sub ? " " : "", sub ? sub : "");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry 'flashattn %s%s--help'.\n", sub ? sub : "", sub ? " " : "");
    return CLI_EXIT_USAGE;
}

int opt_is(const char *arg, const char *name) {
    size_t n = strlen(name);
    return strncmp(arg, name, n) == 0 && (arg[n] == 0 || arg[n] == '=');
}

int opt_repeat(const char *sub, int argc, char **argv, int *i, double *until_ci_pct, double *max_seconds) {
    const char *x = argv[*i], *v;
    if (opt_is(x, "--until-ci"))
        return (v = opt_value(sub, argc, argv, i, "--until-ci")) && !parse_double(sub, "--until-ci", v, 0, 1000, until_ci_pct) ? 1 : -1;
    if (opt_is(x, "--max-seconds"))
        return (v = opt_value(sub, argc, argv, i, "--max-seconds")) && !parse_double(sub, "--max-seconds", v, 0, 1e6, max_seconds) ? 1 : -1;
    return 0;
}

const char *opt_value(const char *sub, int argc, char **argv, int *i, const char *name) {
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (a[n] == '=') return a + n + 1;
    if (*i + 1 >= argc) {
        cli_usage_error(sub, "%s needs a value", name);
        return NULL;
    }
    *i += 1;
    return argv[*i];
}

static int parse_i64(const char *s, int64_t *v) {
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || end == s || *end) return -1;
    *v = (int64_t)x;
    return 0;
}

int parse_int(const char *sub, const char *opt, const char *arg, int64_t lo, int64_t hi, int64_t *out) {
    int64_t v;
    if (!arg || parse_i64(arg, &v)) {
        cli_usage_error(sub, "%s: '%s' is not an integer", opt, arg ? arg : "");
        return -1;
    }
    if (v < lo || v > hi) {
        cli_usage_error(sub, "%s: %lld is out of range [%lld, %lld]", opt, (long long)v, (long long)lo, (long long)hi);
        return -1;
    }
    *out = v;
    return 0;
}

int parse_double(const char *sub, const char *opt, const char *arg, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = arg ? strtod(arg, &end) : 0;
    if (!arg || errno || end == arg || *end || !isfinite(v)) {
        cli_usage_error(sub, "%s: '%s' is not a number", opt, arg ? arg : "");
        return -1;
    }
    if (v < lo || v > hi) {
        cli_usage_error(sub, "%s: %g is out of range [%g, %g]", opt, v, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* Split a comma list; calls one(item) for each. */
typedef int (*item_fn)(const char *sub, const char *opt, const char *item, int64_t *v, const void *ctx);

static int parse_list(const char *sub, const char *opt, const char *arg, int_list *out, item_fn fn, const void *ctx) {
    if (!arg || !*arg) {
        cli_usage_error(sub, "%s: empty list", opt);
        return -1;
    }
    out->n = 0;
    const char *p = arg;
    for (;;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        char item[64];
        if (len == 0 || len >= sizeof item) {
            cli_usage_error(sub, "%s: bad list '%s' (items are separated by single commas)", opt, arg);
            return -1;
        }
        if (out->n >= CLI_MAX_LIST) {
            cli_usage_error(sub, "%s: more than %d values", opt, CLI_MAX_LIST);
            return -1;
        }
        memcpy(item, p, len);
        item[len] = 0;
        if (fn(sub, opt, item, &out->v[out->n], ctx)) return -1;
        out->n++;
        if (!c) break;
        p = c + 1;
    }
    return 0;
}

typedef struct { int64_t lo, hi; } range;
static int int_item(const char *sub, const char *opt, const char *item, int64_t *v, const void *ctx) {
    const range *r = ctx;
    return parse_int(sub, opt, item, r->lo, r->hi, v);
}

int parse_int_list(const char *sub, const char *opt, const char *arg, int64_t lo, int64_t hi, int_list *out) {
    range r = {lo, hi};
    return parse_list(sub, opt, arg, out, int_item, &r);
}

typedef struct { const char *name; int value; } name_value;
typedef struct { const name_value *tab; const char *what, *expected; } name_table;

static int name_item(const char *sub, const char *opt, const char *item, int64_t *v, const void *ctx) {
    const name_table *t = ctx;
    for (const name_value *e = t->tab; e->name; e++)
        if (strcmp(e->name, item) == 0) {
            *v = e->value;
            return 0;
        }
    cli_usage_error(sub, "%s: unknown %s '%s' (expected %s)", opt, t->what, item, t->expected);
    return -1;
}

int parse_algo_list(const char *sub, const char *opt, const char *arg, int_list *out) {
    static const name_value tab[] = {{"standard", FA_ALGO_STANDARD}, {"flash1", FA_ALGO_FLASH1},
                                     {"flash2", FA_ALGO_FLASH2},     {"flash3", FA_ALGO_FLASH3},
                                     {"auto", FA_ALGO_AUTO},
                                     {"std", FA_ALGO_STANDARD},      {NULL, 0}};
    name_table t = {tab, "algorithm", "standard, flash1, flash2, flash3 or auto"};
    return parse_list(sub, opt, arg, out, name_item, &t);
}

int parse_dtype_list(const char *sub, const char *opt, const char *arg, int_list *out, int fp8) {
#define FA_DTYPE_NAMES {"f32", FA_DTYPE_F32}, {"f16", FA_DTYPE_F16}, {"bf16", FA_DTYPE_BF16}, {"fp32", FA_DTYPE_F32}, \
                       {"fp16", FA_DTYPE_F16}
    static const name_value tab[] = {FA_DTYPE_NAMES, {NULL, 0}};
    static const name_value tab8[] = {FA_DTYPE_NAMES, {"f8_e4m3", FA_DTYPE_F8_E4M3}, {"e4m3", FA_DTYPE_F8_E4M3}, {NULL, 0}};
#undef FA_DTYPE_NAMES
    name_table t = {fp8 ? tab8 : tab, "dtype", fp8 ? "f32, f16, bf16 or f8_e4m3" : "f32, f16 or bf16"};
    return parse_list(sub, opt, arg, out, name_item, &t);
}

int parse_kv_dtype_list(const char *sub, const char *opt, const char *arg, int_list *out) {
    static const name_value tab[] = {{"same", 0}, {"e4m3", 1}, {"f8_e4m3", 1}, {NULL, 0}};
    name_table t = {tab, "cache dtype", "same or e4m3"};
    return parse_list(sub, opt, arg, out, name_item, &t);
}

int parse_device_list(const char *sub, const char *opt, const char *arg, int_list *out) {
    static const name_value tab[] = {{"cpu", FA_BACKEND_CPU}, {"cuda", FA_BACKEND_CUDA}, {"gpu", FA_BACKEND_CUDA},
                                     {NULL, 0}};
    name_table t = {tab, "device", "cpu or cuda"};
    return parse_list(sub, opt, arg, out, name_item, &t);
}

int parse_pass_list(const char *sub, const char *opt, const char *arg, int_list *out) {
    static const name_value tab[] = {{"fwd", 0}, {"bwd", 1}, {"forward", 0}, {"backward", 1}, {NULL, 0}};
    name_table t = {tab, "pass", "fwd or bwd"};
    return parse_list(sub, opt, arg, out, name_item, &t);
}

double now_ms(void) { return fa_cpu_seconds() * 1e3; }

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double median_of(const double *x, int n) {
    if (n <= 0) return NAN;
    double *t = malloc((size_t)n * sizeof *t);
    if (!t) return x[0];
    memcpy(t, x, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    double m = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    free(t);
    return m;
}

int median_settled(const double *x, int n, double until_ci) {
    double lo, hi;
    median_ci(x, n, &lo, &hi);
    return hi - lo <= until_ci * median_of(x, n);
}

void median_ci(const double *x, int n, double *lo, double *hi) {
    *lo = *hi = NAN;
    if (n <= 0) return;
    double *t = malloc((size_t)n * sizeof *t);
    if (!t) return;
    memcpy(t, x, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    /* the largest k with P(Binomial(n, 1/2) <= k - 1) <= 2.5 %: [x_(k), x_(n+1-k)] then covers the median with
     * probability >= 95 %, whatever the distribution (k = 1, the extremes, below n = 6) */
    double pj = ldexp(1.0, -n), cum = pj; /* P(B = j), P(B <= j) at j = k - 1 = 0 */
    int k = 1;
    while (2 * k < n) {
        pj *= (double)(n - k + 1) / k; /* P(B = k) */
        if (cum + pj > 0.025) break;
        cum += pj;
        k++;
    }
    *lo = t[k - 1];
    *hi = t[n - k];
    free(t);
}

uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double rng_uniform(uint64_t *s) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

int rng_int(uint64_t *s, int lo, int hi) { return lo + (int)(rng_next(s) % (uint64_t)(hi - lo + 1)); }

void fill_random(void *host, fa_dtype dt, int64_t n, uint64_t *rng, float amp) {
    for (int64_t i = 0; i < n; i++) {
        float x = (float)((2.0 * rng_uniform(rng) - 1.0) * amp);
        fa_store_elem(host, (int)dt, i, x);
    }
}

int64_t host_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return INT64_MAX / 4;
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb > 0 ? (int64_t)kb * 1024 : INT64_MAX / 4;
}

int64_t cpu_cache_bytes(int level) {
    /* sysfs: index0 = L1d, index2 = L2, index3 = L3 on x86 */
    for (int idx = 0; idx < 8; idx++) {
        char path[128], buf[64];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", idx);
        FILE *f = fopen(path, "r");
        if (!f) break;
        int lv = 0;
        if (fscanf(f, "%d", &lv) != 1) lv = 0;
        fclose(f);
        if (lv != level) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", idx);
        f = fopen(path, "r");
        if (f) {
            if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
            fclose(f);
            if (strncmp(buf, "Instruction", 11) == 0) continue;
        }
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", idx);
        f = fopen(path, "r");
        if (!f) continue;
        long long sz = 0;
        char unit = 0;
        int got = fscanf(f, "%lld%c", &sz, &unit);
        fclose(f);
        if (got < 1) continue;
        if (unit == 'K') sz *= 1024;
        else if (unit == 'M') sz *= 1024 * 1024;
        return (int64_t)sz;
    }
    return 0;
}

void cli_limit_address_space(int64_t limit) {
#if defined(__SANITIZE_ADDRESS__)
    (void)limit; /* AddressSanitizer reserves terabytes of shadow address space: no cap (tests set
                  * ASAN_OPTIONS=allocator_may_return_null=1 so a failed allocation still returns NULL) */
    return;
#endif
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %lld kB", &kb) == 1) break;
    fclose(f);
    if (kb <= 0) return;
    /* slack: thread stacks and malloc arenas reserve address space they never touch */
    double cap = (double)kb * 1024.0 + (double)limit + 4e9;
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) != 0) return;
    if (rl.rlim_cur != RLIM_INFINITY && (double)rl.rlim_cur < cap) return;
    rl.rlim_cur = (rlim_t)cap;
    setrlimit(RLIMIT_AS, &rl);
}
