/* What the lab's ggml anchors (ggml_fa.c, ggml_kvcache.c) share: timing one ggml_flash_attn_ext node — its graph
 * built, one warm-up run, then the median of `reps` runs, in seconds. */
#ifndef FA_LAB_GGML_H
#define FA_LAB_GGML_H
#include "ggml-cpu.h"
#include "ggml.h"

#include <stdlib.h>
#include <time.h>

static inline double lab_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static inline int lab_cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median time of computing node o (and what it depends on) with `threads` threads. */
static inline double lab_ggml_median(struct ggml_context *ctx, struct ggml_tensor *o, int threads, int reps) {
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, o);
    ggml_graph_compute_with_ctx(ctx, gf, threads); /* warm-up */
    double *t = malloc(sizeof(double) * (size_t)reps);
    if (!t) return -1;
    for (int r = 0; r < reps; r++) {
        const double t0 = lab_now();
        ggml_graph_compute_with_ctx(ctx, gf, threads);
        t[r] = lab_now() - t0;
    }
    qsort(t, (size_t)reps, sizeof(double), lab_cmp_double);
    const double med = t[reps / 2];
    free(t);
    return med;
}
#endif
