/* Tile sizes from the cache sizes, transposed-score post-processing and the fast backward tile step. */
#include "cpu/fast.h"

#include <string.h>
#include <unistd.h>

/* Cache sizes of this CPU (bytes), read at run time; conservative defaults where the OS does not say. */
static void cache_sizes(long *l1, long *l2) {
    long a = -1, b = -1;
#if defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE)
    a = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    b = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    *l1 = a > 0 ? a : 32 * 1024;
    *l2 = b > 0 ? b : 512 * 1024;
}

/* The one tile table of the CPU backend. Changes speed, never results.
 *
 *   Br = 64 query rows: one 6x64 register block spans the 64 queries of a transposed score tile (4 zmm), and
 *        the PV product runs 6-row blocks down them; K/V re-reads cost 8·N·d bytes per Br queries (CPU_NOTES §2).
 *   Bc = the largest of 256/128/64 keys whose fp32 score tile Br·Bc·4 fits in half the L1 (the softmax passes
 *        re-read it) and whose forward working set Qᵢᵀ, Oᵢ (2·Br·d·4) + Kⱼ, Vⱼ (2·Bc·d·4) + S fits in half the L2.
 *   Backward: Bc = 64 (six K/V-sized tiles stay in L2: Kⱼ, Vⱼ, Kⱼᵀ, Vⱼᵀ, dKⱼ, dVⱼ).
 *
 * Measured on the 2-core Zen 4 VM (32 KiB L1d, 1 MiB L2), FLASH2 forward fp32, bench/cpu_attn: see
 * scripts/bench-cpu.sh for the sweep; 64 x 64 was within noise of the best at d = 64 and d = 128. */
void fa_cpu_tiles(const fa_problem *p, int *br, int *bc) {
    long l1, l2;
    cache_sizes(&l1, &l2);
    const long d = p->d;
    int q = 64, k = 64;
    if (!p->is_backward) {
        static const int cand[] = {256, 128, 64};
        for (int i = 0; i < 3; i++) {
            long s = (long)q * cand[i] * 4, set = 2L * q * d * 4 + 2L * cand[i] * d * 4 + s;
            if (s <= l1 / 2 && set <= l2 / 2) { k = cand[i]; break; }
        }
    }
    if (p->block_q) q = p->block_q;
    if (p->block_k) k = p->block_k;
    if (q > p->sq_max && p->sq_max > 0) q = (int)p->sq_max;
    if (k > p->sk_max && p->sk_max > 0) k = (int)p->sk_max;
    *br = q < 1 ? 1 : q;
    *bc = k < 1 ? 1 : k;
}

int fa_cpu_tile_needs_mask(const fa_problem *p, int64_t sq, int64_t sk, int64_t i0, int rows, int64_t j0, int cols) {
    /* both ends of a row's key range are non-decreasing in the row index */
    int64_t lo_last, hi_last, lo_first, hi_first;
    fa_key_range(p, sq, sk, i0 + rows - 1, &lo_last, &hi_last);
    fa_key_range(p, sq, sk, i0, &lo_first, &hi_first);
    return !(lo_last <= j0 && hi_first >= j0 + cols);
}

int64_t fa_cpu_scores_t(const fa_problem *p, float *ST, int ld, int rows, int cols, int64_t i0, int64_t j0, int64_t sq,
                        int64_t sk) {
    int64_t visible = 0;
    if (p->softcap > 0) {
        const float cap = p->softcap, s_in = fabsf(p->scale) / cap;
        for (int c = 0; c < cols; c++)
            for (int r = 0; r < rows; r++) ST[(int64_t)c * ld + r] = cap * tanhf(ST[(int64_t)c * ld + r] * s_in);
    }
    for (int r = 0; r < rows; r++) {
        int64_t lo, hi;
        fa_key_range(p, sq, sk, i0 + r, &lo, &hi);
        int c0 = lo - j0 < 0 ? 0 : (lo - j0 > cols ? cols : (int)(lo - j0));
        int c1 = hi - j0 < 0 ? 0 : (hi - j0 > cols ? cols : (int)(hi - j0));
        if (c1 < c0) c1 = c0;
        for (int c = 0; c < c0; c++) ST[(int64_t)c * ld + r] = -INFINITY;
        for (int c = c1; c < cols; c++) ST[(int64_t)c * ld + r] = -INFINITY;
        visible += c1 - c0;
    }
    return visible;
}

void fa_cpu_bwd_tile_fast(const fa_problem *p, const fa_cpu_kernels *kr, int rows, int cols, int64_t i0, int64_t j0,
                          int64_t sq, int64_t sk, const float *Qi, const float *dOi, const float *lse_i,
                          const float *D_i, const float *Kj, const float *KjT, const float *VjT,
                          int ldt, float *S, float *dP, float *dQacc, int ld_dq, float *dKj, float *dVj) {
    const int d = (int)p->d;
    float sub[512];
    kr->gemm_nn(rows, cols, d, Qi, d, 1, KjT, ldt, S, ldt, 0);                 /* S = Qi Kjᵀ (raw) */
    if (fa_cpu_tile_needs_mask(p, sq, sk, i0, rows, j0, cols)) {
        int64_t vis = 0;
        for (int r = 0; r < rows; r++) {
            int64_t lo, hi;
            fa_key_range(p, sq, sk, i0 + r, &lo, &hi);
            int c0 = lo - j0 < 0 ? 0 : (lo - j0 > cols ? cols : (int)(lo - j0));
            int c1 = hi - j0 < 0 ? 0 : (hi - j0 > cols ? cols : (int)(hi - j0));
            if (c1 < c0) c1 = c0;
            float *s = S + (int64_t)r * ldt;
            for (int c = 0; c < c0; c++) s[c] = -INFINITY;
            for (int c = c1; c < cols; c++) s[c] = -INFINITY;
            vis += c1 - c0;
        }
        if (vis == 0) return;
    }
    for (int r0 = 0; r0 < rows; r0 += 512) {                                 /* P = exp(scale·S − LSE) */
        const int n = rows - r0 < 512 ? rows - r0 : 512;
        for (int r = 0; r < n; r++) /* a row that sees no key has LSE = −∞: P = 0 there */
            sub[r] = lse_i[r0 + r] == -INFINITY ? INFINITY : lse_i[r0 + r];
        kr->exp_rows(n, cols, S + (int64_t)r0 * ldt, ldt, p->scale, sub);
    }
    kr->gemm_nn(cols, d, rows, S, 1, ldt, dOi, d, dVj, d, 1);                 /* dVj += Pᵀ dOi */
    kr->gemm_nn(rows, cols, d, dOi, d, 1, VjT, ldt, dP, ldt, 0);              /* dP = dOi Vjᵀ */
    kr->ds_rows(rows, cols, S, ldt, dP, ldt, D_i, p->scale);                  /* dS = scale·P ∘ (dP − Di) */
    kr->gemm_nn(rows, d, cols, dP, ldt, 1, Kj, d, dQacc, ld_dq, 1);           /* dQi += dS Kj */
    kr->gemm_nn(cols, d, rows, dP, 1, ldt, Qi, d, dKj, d, 1);                 /* dKj += dSᵀ Qi */
}
