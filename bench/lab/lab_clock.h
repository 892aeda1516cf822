/* Timing helpers of the lab's stand-alone anchors (ggml_fa.c, ggml_decode.c): a monotonic clock in seconds and the
 * qsort comparison of doubles their medians use. */
#ifndef FA_LAB_CLOCK_H
#define FA_LAB_CLOCK_H
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
#endif
