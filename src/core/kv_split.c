/* The split-KV heuristic both decoding backends plan with (each with its own workers and fill): below them, so that
 * the entry file is not a backend's dependency. docs/kvcache.md. */
#include "core/kvcache.h"

int fa_kv_split_heuristic(int64_t items, int workers, int64_t blocks, int max_splits, double fill) {
    if (items <= 0 || workers <= 0 || blocks <= 1) return 1;
    if ((double)items >= 0.8 * workers) return 1;
    if (max_splits > blocks) max_splits = (int)blocks;
    if (max_splits > 1024) max_splits = 1024;
    double eff[1025] = {0}, best = 0;
    for (int n = 1; n <= max_splits; n++) {
        /* a count that gives each split as many blocks as the one before it is no better: skip it */
        if (n > 1 && (blocks + n - 1) / n == (blocks + n - 2) / (n - 1)) continue;
        const double waves = (double)items * n / workers;
        eff[n] = waves / ceil(waves);
        if (eff[n] > best) best = eff[n];
    }
    for (int n = 1; n <= max_splits; n++)
        if (eff[n] > 0 && eff[n] >= fill * best) return n;
    return 1;
}
