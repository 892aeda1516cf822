/* The report's speed-probe decision (tools/flashattn/probe.c): readings in, verdict kind out. A claim whose
 * measurements saw the reference move by more than the bound must read not settled, with the reason; one where it
 * stayed within keeps its kind and states the reference; a lone slow reading, readings taken while other processes
 * were busy, and readings outside the claim's stretch do not count. No timing: the readings are given. */
#include "report.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int failures;
#define CHECK(cond)                                                                                                   \
    do {                                                                                                              \
        if (!(cond)) {                                                                                                \
            printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                                                    \
            failures++;                                                                                               \
        }                                                                                                             \
    } while (0)
#define CHECK_KIND(got, want)                                                                                         \
    do {                                                                                                              \
        const verdict_kind g_ = (got), w_ = (want);                                                                   \
        if (g_ != w_) {                                                                                               \
            printf("FAIL %s:%d: %s is '%s', expected '%s'\n", __FILE__, __LINE__, #got, verdict_word(g_),             \
                   verdict_word(w_));                                                                                 \
            failures++;                                                                                               \
        }                                                                                                             \
    } while (0)

/* verdict_word lives in report_claims.c, which this test does not link */
const char *verdict_word(verdict_kind k) {
    static const char *const w[] = {"not measured", "does not hold", "partly", "depends", "holds", "not settled"};
    return w[k];
}

/* A probe holding the readings ms[0..n), busy[i] != 0 marking one taken while other processes kept the CPUs busy. */
static void fill(speed_probe *p, const double *ms, const int *busy, int n) {
    memset(p, 0, sizeof *p);
    p->bound = FA_PROBE_BOUND;
    for (int i = 0; i < n; i++) {
        const int k = probe_add(p, ms[i]);
        p->others[k] = busy && busy[i] ? 1.5 : 0.0;
    }
}

/* The kind a claim of kind k gets from the readings [from, to) of p, as the report decides it (quiet = 0.3 cores). */
static verdict_kind decide(const speed_probe *p, int from, int to, verdict_kind k, claim *c) {
    probe_span s;
    probe_range(p, from, to, 0.3, &s);
    memset(c, 0, sizeof *c);
    c->kind = k;
    snprintf(c->verdict, sizeof c->verdict, "**holds here** (median 1.62×)");
    probe_verdict(c, &s, p->bound);
    CHECK(probe_kind(k, &s, p->bound) == c->kind); /* the text and the kind agree */
    return c->kind;
}

int main(void) {
    speed_probe p;
    claim c;
    /* the lead's two states on a 2-core Zen 4 VM: the reference at 1.70 ms (fast) and 2.31 ms (slow) */
    const double steady[] = {1.70, 1.72, 1.69, 1.74, 1.70};
    fill(&p, steady, NULL, 5);
    CHECK_KIND(decide(&p, 0, 5, V_HOLDS, &c), V_HOLDS);
    CHECK(strstr(c.verdict, "**holds here**") == c.verdict);
    CHECK(strstr(c.verdict, "measured with the reference at 1.70 ms (1.70–1.72)") != NULL);
    CHECK_KIND(decide(&p, 0, 5, V_DOES_NOT_HOLD, &c), V_DOES_NOT_HOLD);

    /* fast, then slow within one claim: not settled, whatever the measurements alone said */
    const double change[] = {1.70, 1.71, 1.69, 2.31, 2.35, 2.30};
    fill(&p, change, NULL, 6);
    CHECK_KIND(decide(&p, 0, 6, V_HOLDS, &c), V_NOT_SETTLED);
    CHECK(strstr(c.verdict, "**not settled**: the machine's speed changed during these measurements: reference 1.70 ms "
                            "→ 2.31 ms") == c.verdict);
    CHECK(strstr(c.verdict, "read alone they gave: **holds here** (median 1.62×)") != NULL);
    CHECK_KIND(decide(&p, 0, 6, V_DOES_NOT_HOLD, &c), V_NOT_SETTLED);
    CHECK_KIND(decide(&p, 0, 6, V_NOT_SETTLED, &c), V_NOT_SETTLED); /* one the intervals did not settle: the change too */
    CHECK(strstr(c.verdict, "**not settled**: the machine's speed changed") == c.verdict);
    /* a claim measured before the change, or after it, stands */
    CHECK_KIND(decide(&p, 0, 3, V_HOLDS, &c), V_HOLDS);
    CHECK_KIND(decide(&p, 3, 6, V_DEPENDS, &c), V_DEPENDS);
    /* a change seen in two readings at the end of a stretch counts; seen in one it may be an interruption */
    CHECK_KIND(decide(&p, 1, 5, V_HOLDS, &c), V_NOT_SETTLED);
    CHECK_KIND(decide(&p, 1, 4, V_HOLDS, &c), V_HOLDS);

    /* slow, back to fast: the first and the furthest reading are named */
    const double back[] = {2.30, 2.32, 1.72, 1.70};
    fill(&p, back, NULL, 4);
    CHECK_KIND(decide(&p, 0, 4, V_PARTLY, &c), V_NOT_SETTLED);
    CHECK(strstr(c.verdict, "reference 2.30 ms → 1.72 ms") != NULL);

    /* the bound: 0.9 of it apart stands, 1.1 of it does not */
    const double near[] = {2.00, 2.00 * (1 + 0.9 * FA_PROBE_BOUND)}, over[] = {2.00, 2.00 * (1 + 1.1 * FA_PROBE_BOUND)};
    fill(&p, near, NULL, 2);
    CHECK_KIND(decide(&p, 0, 2, V_HOLDS, &c), V_HOLDS);
    fill(&p, over, NULL, 2);
    CHECK_KIND(decide(&p, 0, 2, V_HOLDS, &c), V_NOT_SETTLED);

    /* a lone slow reading is an interruption, not a state */
    const double spike[] = {1.70, 3.90, 1.71, 1.72};
    fill(&p, spike, NULL, 4);
    CHECK_KIND(decide(&p, 0, 4, V_HOLDS, &c), V_HOLDS);
    /* two in a row are a state, unless other processes were busy while they were taken (their work, left out) */
    const double slow2[] = {1.70, 1.71, 3.90, 3.80, 1.72, 1.71};
    const int busy[] = {0, 0, 1, 1, 0, 0};
    fill(&p, slow2, NULL, 6);
    CHECK_KIND(decide(&p, 0, 6, V_HOLDS, &c), V_NOT_SETTLED);
    fill(&p, slow2, busy, 6);
    CHECK_KIND(decide(&p, 0, 6, V_HOLDS, &c), V_HOLDS);

    /* nothing to tell: one reading, none, no probe, or a claim not measured: the kind stays, the text too */
    fill(&p, change, NULL, 6);
    CHECK_KIND(decide(&p, 3, 4, V_HOLDS, &c), V_HOLDS);
    CHECK_KIND(decide(&p, 6, 9, V_HOLDS, &c), V_HOLDS);
    CHECK(strcmp(c.verdict, "**holds here** (median 1.62×)") == 0);
    CHECK_KIND(decide(&p, 0, 6, V_NOT_MEASURED, &c), V_NOT_MEASURED);
    fill(&p, NULL, NULL, 0);
    CHECK_KIND(decide(&p, 0, 10, V_DOES_NOT_HOLD, &c), V_DOES_NOT_HOLD);

    /* readings that are not times are refused; a full probe takes no more */
    fill(&p, NULL, NULL, 0);
    CHECK(probe_add(&p, 0.0) == -1 && probe_add(&p, -1.0) == -1 && probe_add(&p, NAN) == -1 && p.n == 0);
    for (int i = 0; i < FA_PROBE_MAX; i++) probe_add(&p, 1.0);
    CHECK(probe_add(&p, 1.0) == -1 && p.n == FA_PROBE_MAX);

    /* a long verdict is cut, never overflowed, and the reason comes first */
    fill(&p, change, NULL, 6);
    memset(&c, 0, sizeof c);
    c.kind = V_HOLDS;
    memset(c.verdict, 'x', sizeof c.verdict - 1);
    probe_span s;
    probe_range(&p, 0, 6, 0.3, &s);
    probe_verdict(&c, &s, p.bound);
    CHECK(c.kind == V_NOT_SETTLED && strlen(c.verdict) == sizeof c.verdict - 1);
    CHECK(strstr(c.verdict, "**not settled**: the machine's speed changed") == c.verdict);

    if (failures) return 1;
    printf("PASS\n");
    return 0;
}
