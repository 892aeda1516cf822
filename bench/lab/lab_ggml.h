/* What the lab's ggml anchors (ggml_fa.c, ggml_kvcache.c) share: timing one ggml_flash_attn_ext node — its graph
 * built, one warm-up run, then the median of `reps` runs, in seconds. */
#ifndef FA_LAB_GGML_H
#define FA_LAB_GGML_H
#include "ggml-cpu.h"
#include "ggml.h"

#include <stdlib.h>

#include "lab_time.h"

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
    qsort(t, (size_t)reps, sizeof(double), lab_by_value);
    const double med = t[reps / 2];
    free(t);
    return med;
}
#endif
