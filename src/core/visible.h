/* Which keys a query row sees: the one derivation of the mask (causal bottom-right, sliding window), compiled by
 * the C backends and by nvcc alike. The float64 oracle of the tests keeps its own plain loops on purpose, so that the
 * tests compare two independent derivations. docs/numerics.md states the rule. */
#ifndef FA_VISIBLE_H
#define FA_VISIBLE_H

#include <stdint.h>

#if defined(__CUDACC__)
#define FA_HD static __host__ __device__ __forceinline__
#else
#define FA_HD static inline
#endif

/* Keys [*lo, *hi) visible to query row i of a sequence of sq queries and sk keys (empty when *hi == *lo).
 * The diagonal of row i is key i + sk - sq (bottom-right aligned, as flash-attn >= 2.1); key j is visible iff
 * diag - wl <= j <= diag + wr, each bound dropped when its window is -1 (causal is wr = 0). */
FA_HD void fa_visible_keys(int64_t i, int64_t sq, int64_t sk, int wl, int wr, int64_t *lo, int64_t *hi) {
    const int64_t diag = i + sk - sq;
    int64_t l = 0, h = sk;
    if (wl >= 0 && diag - wl > l) l = diag - wl;
    if (wr >= 0 && diag + wr + 1 < h) h = diag + wr + 1;
    *lo = l;
    *hi = h > l ? h : l;
}

/* The same in 32-bit arithmetic, for kernels whose sequences are below 2^30 rows (the CUDA plan checks it). */
FA_HD void fa_visible_keys32(int i, int sq, int sk, int wl, int wr, int *lo, int *hi) {
    const int diag = i + sk - sq;
    int l = 0, h = sk;
    if (wl >= 0 && diag - wl > l) l = diag - wl;
    if (wr >= 0 && diag + wr + 1 < h) h = diag + wr + 1;
    *lo = l;
    *hi = h > l ? h : l;
}

/* Keys [*lo, *hi) visible to any of the query rows [i0, i1), i0 < i1: both ends of a row's range are
 * non-decreasing in the row index, so the block's range runs from row i0's start to row i1 - 1's end. */
FA_HD void fa_visible_block(int64_t i0, int64_t i1, int64_t sq, int64_t sk, int wl, int wr, int64_t *lo, int64_t *hi) {
    int64_t l0, h0, l1, h1;
    fa_visible_keys(i0, sq, sk, wl, wr, &l0, &h0);
    fa_visible_keys(i1 - 1, sq, sk, wl, wr, &l1, &h1);
    *lo = l0;
    *hi = h1 > l0 ? h1 : l0;
}
FA_HD void fa_visible_block32(int i0, int i1, int sq, int sk, int wl, int wr, int *lo, int *hi) {
    int l0, h0, l1, h1;
    fa_visible_keys32(i0, sq, sk, wl, wr, &l0, &h0);
    fa_visible_keys32(i1 - 1, sq, sk, wl, wr, &l1, &h1);
    *lo = l0;
    *hi = h1 > l0 ? h1 : l0;
}

/* The inverse: query rows [*lo, *hi) that see any key of [k0, k1), k0 < k1 <= sk (the backward's walk over the
 * query blocks of one key block): row i sees a key of the block iff diag(i) + wr >= k0 and diag(i) - wl <= k1 - 1. */
FA_HD void fa_visible_queries32(int k0, int k1, int sq, int sk, int wl, int wr, int *lo, int *hi) {
    int l = 0, h = sq;
    if (wr >= 0 && k0 - wr - (sk - sq) > l) l = k0 - wr - (sk - sq);
    if (wl >= 0 && k1 + wl - (sk - sq) < h) h = k1 + wl - (sk - sq);
    *lo = l;
    *hi = h > l ? h : l;
}

#endif
