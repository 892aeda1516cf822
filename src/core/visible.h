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

/* The chunk of chunked local attention (attention_chunk c > 0, Llama 4) that holds diagonal diag: keys
 * [*c0, *c0 + c), c0 = floor(diag / c) · c (rounded down for a negative diag too). Both ends are non-decreasing in
 * diag, as the window's are, so every range helper below stays a range. */
FA_HD int64_t fa_chunk_start(int64_t diag, int64_t c) {
    const int64_t r = diag % c;
    return diag - (r < 0 ? r + c : r);
}
FA_HD int fa_chunk_start32(int diag, int c) {
    const int r = diag % c;
    return diag - (r < 0 ? r + c : r);
}

/* Keys [*lo, *hi) visible to query row i of a sequence of sq queries and sk keys (empty when *hi == *lo).
 * The diagonal of row i is key i + sk - sq (bottom-right aligned, as flash-attn >= 2.1); key j is visible iff
 * diag - wl <= j <= diag + wr, each bound dropped when its window is -1 (causal is wr = 0), and, with chunk > 0,
 * j is in diag's chunk (fa_chunk_start). */
FA_HD void fa_visible_keys(int64_t i, int64_t sq, int64_t sk, int wl, int wr, int chunk, int64_t *lo, int64_t *hi) {
    const int64_t diag = i + sk - sq;
    int64_t l = 0, h = sk;
    if (wl >= 0 && diag - wl > l) l = diag - wl;
    if (wr >= 0 && diag + wr + 1 < h) h = diag + wr + 1;
    if (chunk > 0) {
        const int64_t c0 = fa_chunk_start(diag, chunk);
        if (c0 > l) l = c0;
        if (c0 + chunk < h) h = c0 + chunk;
    }
    *lo = l;
    *hi = h > l ? h : l;
}

/* The same in 32-bit arithmetic, for kernels whose sequences are below 2^30 rows (the CUDA plan checks it); without
 * attention_chunk: fa_chunk_keys32 narrows a range to the chunk. */
FA_HD void fa_visible_keys32(int i, int sq, int sk, int wl, int wr, int *lo, int *hi) {
    const int diag = i + sk - sq;
    int l = 0, h = sk;
    if (wl >= 0 && diag - wl > l) l = diag - wl;
    if (wr >= 0 && diag + wr + 1 < h) h = diag + wr + 1;
    *lo = l;
    *hi = h > l ? h : l;
}
/* [*lo, *hi) of rows with diagonals diag0 <= diag1 (one row: diag0 = diag1) narrowed to the keys of their chunks
 * (chunk > 0; 0 leaves it): from diag0's chunk start to the end of diag1's chunk. */
FA_HD void fa_chunk_keys32(int diag0, int diag1, int chunk, int *lo, int *hi) {
    if (chunk <= 0) return;
    const int c0 = fa_chunk_start32(diag0, chunk), c1 = fa_chunk_start32(diag1, chunk) + chunk;
    if (c0 > *lo) *lo = c0;
    if (c1 < *hi) *hi = c1;
    if (*hi < *lo) *hi = *lo;
}

/* Keys [*lo, *hi) visible to any of the query rows [i0, i1), i0 < i1: both ends of a row's range are
 * non-decreasing in the row index, so the block's range runs from row i0's start to row i1 - 1's end. */
FA_HD void fa_visible_block(int64_t i0, int64_t i1, int64_t sq, int64_t sk, int wl, int wr, int chunk, int64_t *lo,
                            int64_t *hi) {
    int64_t l0, h0, l1, h1;
    fa_visible_keys(i0, sq, sk, wl, wr, chunk, &l0, &h0);
    fa_visible_keys(i1 - 1, sq, sk, wl, wr, chunk, &l1, &h1);
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
/* ... narrowed by attention_chunk (chunk > 0; 0 leaves it): a row sees a key of [k0, k1) only if its chunk reaches
 * past k0 and starts before k1, i.e. its diagonal is in [chunk_start(k0), chunk_start(k1 - 1) + chunk). */
FA_HD void fa_chunk_queries32(int k0, int k1, int sq, int sk, int chunk, int *lo, int *hi) {
    if (chunk <= 0) return;
    const int d0 = fa_chunk_start32(k0, chunk), d1 = fa_chunk_start32(k1 - 1, chunk) + chunk;
    if (d0 - (sk - sq) > *lo) *lo = d0 - (sk - sq);
    if (d1 - (sk - sq) < *hi) *hi = d1 - (sk - sq);
    if (*hi < *lo) *hi = *lo;
}

#endif
