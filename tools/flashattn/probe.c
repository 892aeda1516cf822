/* flashattn report: the machine's speed state. A shared VM alternates on its own between a fast and a slow state
 * (seconds to minutes each) that /proc/stat does not show; the cache-bound algorithm slows most, so a claim measured
 * across a change compares two machines (docs/benchmarks.md, "The report"). The reference is a small fixed FLASH1
 * forward on the report's threads, timed before every point. It calls only the library, never a part of the report. */
#include "report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The reference: FLASH1, fp32, batch 1, 512 rows, d 64, two heads per thread (at least 4), about 2 ms on 2 cores.
 * On the 2-core VM this call on both threads moved with the slow state (1.76 -> 2.57 ms) where a one-thread call did
 * not (docs/benchmarks.md). */
#define PROBE_SEQLEN 512
#define PROBE_D 64
#define PROBE_CALLS 5 /* timed calls per reading; their minimum, since other work only ever adds time */

int probe_open(speed_probe *p, int threads) {
    p->n = 0;
    p->bound = FA_PROBE_BOUND;
    if (fa_context_create(&p->ctx, FA_BACKEND_CPU, threads) != FA_OK) return -1;
    const int t = fa_context_threads(p->ctx);
    p->heads = 2 * t > 4 ? 2 * t : 4;
    snprintf(p->what, sizeof p->what, "FLASH1 forward, fp32, N %d, %d heads, d %d, %d thread%s; the least of %d calls",
             PROBE_SEQLEN, p->heads, PROBE_D, t, t == 1 ? "" : "s", PROBE_CALLS);
    p->t0 = now_ms();
    const size_t n = (size_t)PROBE_SEQLEN * (size_t)p->heads * PROBE_D;
    p->buf = malloc(4 * n * sizeof *p->buf);
    if (!p->buf) {
        probe_close(p);
        return -1;
    }
    uint64_t s = 1;
    for (size_t i = 0; i < 3 * n; i++) p->buf[i] = (float)((double)(rng_next(&s) >> 11) * 0x1p-53 - 0.5);
    return 0;
}

void probe_close(speed_probe *p) {
    fa_context_destroy(p->ctx);
    free(p->buf);
    p->ctx = NULL;
    p->buf = NULL;
}

double probe_time(speed_probe *p) {
    if (!p->ctx) return NAN;
    const size_t n = (size_t)PROBE_SEQLEN * (size_t)p->heads * PROBE_D;
    const fa_tensor q = fa_tensor_bshd(p->buf, FA_DTYPE_F32, 1, PROBE_SEQLEN, p->heads, PROBE_D),
                    k = fa_tensor_bshd(p->buf + n, FA_DTYPE_F32, 1, PROBE_SEQLEN, p->heads, PROBE_D),
                    v = fa_tensor_bshd(p->buf + 2 * n, FA_DTYPE_F32, 1, PROBE_SEQLEN, p->heads, PROBE_D),
                    o = fa_tensor_bshd(p->buf + 3 * n, FA_DTYPE_F32, 1, PROBE_SEQLEN, p->heads, PROBE_D);
    fa_attn_opts opts = fa_attn_opts_default();
    opts.algo = FA_ALGO_FLASH1;
    double best = INFINITY;
    for (int c = 0; c <= PROBE_CALLS; c++) { /* call 0 brings the inputs back into the caches */
        const double t0 = now_ms();
        if (fa_forward(p->ctx, &opts, &q, &k, &v, &o, NULL) != FA_OK) return NAN;
        const double ms = now_ms() - t0;
        if (c > 0 && ms < best) best = ms;
    }
    return best;
}

int probe_add(speed_probe *p, double ms) {
    if (p->n >= FA_PROBE_MAX || !(ms > 0)) return -1;
    p->ms[p->n] = ms;
    p->at[p->n] = (now_ms() - p->t0) / 1e3;
    p->others[p->n] = -1;
    return p->n++;
}

/* Median of three. */
static double med3(double a, double b, double c) {
    const double lo = a < b ? a : b, hi = a < b ? b : a;
    return c < lo ? lo : c > hi ? hi : c;
}

int probe_range(const speed_probe *p, int from, int to, double quiet, probe_span *s) {
    double x[FA_PROBE_MAX];
    int m = 0;
    s->n = 0;
    s->lo = s->hi = s->med = s->first = s->far = NAN;
    if (to > p->n) to = p->n;
    for (int i = from < 0 ? 0 : from; i < to; i++)
        if (p->others[i] <= quiet) x[m++] = p->ms[i]; /* busy: other processes' work, not the machine's state */
    /* each reading as the median of three neighbours: a state lasts seconds (several readings), while a single
     * slow reading is an interruption (up to 2× the others on the 2-core VM) */
    for (int i = 0; i < m; i++) {
        const int j = m < 3 ? -1 : i < 1 ? 0 : i > m - 2 ? m - 3 : i - 1;
        const double t = j < 0 ? x[i] : med3(x[j], x[j + 1], x[j + 2]);
        if (s->n++ == 0) s->lo = s->hi = s->first = s->far = t;
        if (t < s->lo) s->lo = t;
        if (t > s->hi) s->hi = t;
        if (fabs(t - s->first) > fabs(s->far - s->first)) s->far = t;
    }
    if (m) s->med = median_of(x, m);
    return s->n;
}

int probe_write_csv(const speed_probe *p, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "reading,seconds,ms,others_cores\n");
    for (int i = 0; i < p->n; i++) fprintf(f, "%d,%.3f,%.4f,%.2f\n", i, p->at[i], p->ms[i], p->others[i]);
    return fclose(f) == 0 ? 0 : -1;
}

/* The reference moved by more than bound within the span. */
static int moved(const probe_span *s, double bound) { return s->n >= 2 && s->hi > s->lo * (1 + bound); }

verdict_kind probe_kind(verdict_kind k, const probe_span *s, double bound) {
    return k != V_NOT_MEASURED && moved(s, bound) ? V_NOT_SETTLED : k;
}

void probe_verdict(claim *c, const probe_span *s, double bound) {
    if (c->kind == V_NOT_MEASURED || s->n == 0) return;
    char note[256];
    if (!moved(s, bound)) { /* the verdict stands; the reference's value lets two reports be compared */
        const size_t l = strlen(c->verdict);
        snprintf(note, sizeof note, "; measured with the reference at %.2f ms (%.2f–%.2f)", s->med, s->lo, s->hi);
        if (l + strlen(note) < sizeof c->verdict) memcpy(c->verdict + l, note, strlen(note) + 1);
        return;
    }
    /* the reason first; the verdict the measurements gave read alone after it (cut to fit) */
    const int w = snprintf(note, sizeof note,
                           "**not settled**: the machine's speed changed during these measurements: reference %.2f ms → "
                           "%.2f ms (%.2f–%.2f over %d readings, more than %.0f %% apart); read alone they gave: ",
                           s->first, s->far, s->lo, s->hi, s->n, 100 * bound);
    const size_t nl = w > 0 && (size_t)w < sizeof note ? (size_t)w : strlen(note);
    const size_t keep = sizeof c->verdict - 1 - nl;
    memmove(c->verdict + nl, c->verdict, keep);
    c->verdict[nl + keep] = 0;
    memcpy(c->verdict, note, nl);
    c->kind = V_NOT_SETTLED; /* even one the intervals had not settled: the change is the first reason */
}
