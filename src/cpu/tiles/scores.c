/* Score post-processing on a tile in fast memory: scale, softcap and the mask, for row-major and transposed tiles. */
#include "cpu/tiles/tiles.h"

int fa_cpu_tile_needs_mask(const fa_problem *p, int64_t sq, int64_t sk, int64_t i0, int rows, int64_t j0, int cols) {
    /* both ends of a row's key range are non-decreasing in the row index */
    int64_t lo_last, hi_last, lo_first, hi_first;
    fa_key_range(p, sq, sk, i0 + rows - 1, &lo_last, &hi_last);
    fa_key_range(p, sq, sk, i0, &lo_first, &hi_first);
    return !(lo_last <= j0 && hi_first >= j0 + cols);
}

/* cs is a compile-time 1 for row-major tiles (the passes vectorise) and the leading dimension for transposed ones. */
static inline __attribute__((always_inline)) int64_t scores(const fa_problem *p, float *S, ptrdiff_t rs, ptrdiff_t cs,
                                                            int rows, int cols, int64_t i0, int64_t j0, int64_t sq,
                                                            int64_t sk, float mul, float inv_cap) {
    const float cap = p->softcap;
    int64_t visible = 0;
    for (int r = 0; r < rows; r++) {
        float *s = S + r * rs;
        int64_t lo, hi;
        int c0, c1;
        fa_key_range(p, sq, sk, i0 + r, &lo, &hi);
        fa_cpu_tile_cols(lo, hi, j0, cols, &c0, &c1);
        for (int c = 0; c < c0; c++) s[c * cs] = -INFINITY;
        if (cap > 0)
            for (int c = c0; c < c1; c++) s[c * cs] = cap * tanhf(s[c * cs] * mul * inv_cap);
        else if (mul != 1.0f)
            for (int c = c0; c < c1; c++) s[c * cs] *= mul;
        for (int c = c1; c < cols; c++) s[c * cs] = -INFINITY;
        visible += c1 - c0;
    }
    return visible;
}

int64_t fa_cpu_scores(const fa_problem *p, float *S, ptrdiff_t rs, ptrdiff_t cs, int rows, int cols, int64_t i0,
                      int64_t j0, int64_t sq, int64_t sk, float mul, float inv_cap) {
    if (cs == 1) return scores(p, S, rs, 1, rows, cols, i0, j0, sq, sk, mul, inv_cap);
    return scores(p, S, rs, cs, rows, cols, i0, j0, sq, sk, mul, inv_cap);
}
