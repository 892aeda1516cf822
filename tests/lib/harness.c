/* The check.h harness: failure reporting, the summary line, the seed and the CPU context of a test. */
#include "check.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rng.h"

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

void t_trace_case(void) {
    static int on = -1;
    if (on < 0) on = getenv("FA_TEST_TRACE") && *getenv("FA_TEST_TRACE") && strcmp(getenv("FA_TEST_TRACE"), "0");
    if (on) fprintf(stderr, "trace: %s\n", t_case_label);
}

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
    t_rng_seed(&t_default_rng, seed);
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
        const char *isa = getenv("FA_CPU_ISA");
        const int skip = st == FA_ERR_UNSUPPORTED && isa && *isa;
        fprintf(stderr, "%s: %s a CPU context: %s (%s)\n", t_name, skip ? "skipped: no" : "cannot create",
                fa_status_string(st), fa_create_error());
        exit(skip ? 77 : 1);
    }
    return ctx;
}

void t_check_cpu_level(const char *kernel) {
    const char *isa = getenv("FA_CPU_ISA");
    if (!isa || !*isa) return;
    const int kv_on_amx = kernel && !strncmp(kernel, "cpu.kvcache.", 12) && !strcmp(isa, "amx");
    const char *want = kv_on_amx ? "avx512bf16" : isa, *dot = kernel ? strrchr(kernel, '.') : NULL;
    CHECK_MSG(dot && !strcmp(dot + 1, want), "kernel %s ran under FA_CPU_ISA=%s (a kernel of level %s was expected)",
              kernel ? kernel : "(none)", isa, want);
}

