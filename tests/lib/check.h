/* A tiny test harness: no framework. Checks are non-fatal (a test keeps going and reports every failure);
 * each prints the file:line, both sides, and the case being run (t_case_label). main() starts with
 * `t_init("name")` and ends with `return t_finish();`, which prints a summary and returns 1 if anything failed. */
#ifndef FA_TESTLIB_CHECK_H
#define FA_TESTLIB_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "flashattn.h"

extern int t_failures;
extern int t_checks;
extern char t_case_label[512];

void t_fail_at(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int t_finish(void);
/* FA_TEST_TRACE=1: print t_case_label to stderr as a case starts (which case a hung or crashed run was in) */
void t_trace_case(void);
/* Seeds the default random stream from FA_TEST_SEED or the clock, and prints "name: seed S (replay:
 * FA_TEST_SEED=S)". */
uint64_t t_init(const char *name);
/* A CPU context with FA_TEST_THREADS threads (default 2); exits the test if that fails: with status 77 (ctest's
 * SKIP_RETURN_CODE of the per-level cases) when FA_CPU_ISA names a level this CPU cannot run, else 1. */
fa_context *t_cpu_ctx(void);
/* Under FA_CPU_ISA=<level> (the per-level ctest cases), a failed check unless `kernel` (fa_stats.kernel of a CPU
 * call) belongs to that level: its name ends in ".<level>" (the amx level's KV-cache kernel is avx512bf16's). So a
 * case named for one level cannot pass while another level's kernels run. */
void t_check_cpu_level(const char *kernel);

#define CHECK(cond)                                                                                            \
    do {                                                                                                       \
        t_checks++;                                                                                            \
        if (!(cond)) t_fail_at(__FILE__, __LINE__, "CHECK(%s)", #cond);                                        \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                                   \
    do {                                                                                                       \
        t_checks++;                                                                                            \
        if (!(cond)) t_fail_at(__FILE__, __LINE__, __VA_ARGS__);                                               \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                                     \
    do {                                                                                                       \
        long long t_a_ = (long long)(a), t_b_ = (long long)(b);                                                \
        t_checks++;                                                                                            \
        if (t_a_ != t_b_) t_fail_at(__FILE__, __LINE__, "%s == %s: %lld vs %lld", #a, #b, t_a_, t_b_);         \
    } while (0)

/* a <= b for doubles (NaN fails). */
#define CHECK_LE(a, b)                                                                                         \
    do {                                                                                                       \
        double t_a_ = (double)(a), t_b_ = (double)(b);                                                         \
        t_checks++;                                                                                            \
        if (!(t_a_ <= t_b_)) t_fail_at(__FILE__, __LINE__, "%s <= %s: %.6g vs %.6g", #a, #b, t_a_, t_b_);      \
    } while (0)

#define CHECK_STATUS(got, want)                                                                                \
    do {                                                                                                       \
        fa_status t_g_ = (got), t_w_ = (want);                                                                 \
        t_checks++;                                                                                            \
        if (t_g_ != t_w_)                                                                                      \
            t_fail_at(__FILE__, __LINE__, "%s: got %s, want %s", #got, fa_status_string(t_g_),                 \
                      fa_status_string(t_w_));                                                                 \
    } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                                                        \
    do {                                                                                                       \
        const char *t_h_ = (hay), *t_n_ = (needle);                                                            \
        t_checks++;                                                                                            \
        if (!t_h_ || !strstr(t_h_, t_n_))                                                                      \
            t_fail_at(__FILE__, __LINE__, "\"%s\" should contain \"%s\"", t_h_ ? t_h_ : "(null)", t_n_);       \
    } while (0)

#endif
