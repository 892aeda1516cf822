/* What the standalone lab timers share: a monotonic clock in seconds and a qsort order for medians. */
#ifndef FA_LAB_TIME_H
#define FA_LAB_TIME_H

#include <time.h>

static inline double lab_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static inline int lab_by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#endif
