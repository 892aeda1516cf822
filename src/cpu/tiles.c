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
 *   Forward (FLASH2, and FLASH1 with the same tiles so that the two compare loop orders, not tile sizes): the first
 *   (Br, Bc) of 256x128, 128x128, 128x64, 64x64 whose working set Qᵢᵀ, Oᵢ (2·Br·d·4) + Kⱼ, Vⱼ (2·Bc·d·4) + Sᵀ
 *   (Br·Bc·4) fits in half the L2: the 6x64 kernels run at full speed with their B panel in L2 (CPU_NOTES §1), so
 *   the score tile need not fit in L1; a large Br divides FLASH2's K/V re-reads (8·N²·d/Br bytes per head).
 *   d = 64 and 128 -> 256 x 128 on a 1 MiB L2; d = 256 -> 128 x 64.
 *   Measured (FLASH2 fwd, f32, 1 thread, 4 heads x 2048, flashattn bench --threads 1 --block-q --block-k; Zen 4 VM,
 *   32 KiB L1d, 1 MiB L2, 2026-11-30; the VM was shared, ±15 %), GFLOP/s:
 *       d = 64 : 64x64 77, 64x128 91, 128x64 93, 128x128 93-95, 128x256 92-97, 256x128 94, 256x256 96
 *       d = 128: 64x64 95, 64x128 96, 128x64 97, 128x128 94-96, 128x256 88-100, 256x128 76-92
 *   i.e. everything from 128 x 128 up is within the noise; 64 x 64 loses 15 % at d = 64.
 *   Backward: Br = Bc = 64 (Kⱼ, Vⱼ, Kⱼᵀ, Vⱼᵀ, dKⱼ, dVⱼ and Qᵢ, dOᵢ, dQᵢ, P, dS stay in L2). */
void fa_cpu_tiles(const fa_problem *p, int *br, int *bc) {
    long l1, l2;
    cache_sizes(&l1, &l2);
    (void)l1;
    const long d = p->d;
    int q = 64, k = 64;
    if (!p->is_backward) {
        static const int cand[][2] = {{256, 128}, {128, 128}, {128, 64}, {64, 64}};
        for (int i = 0; i < 4; i++) {
            const long bq = cand[i][0], bk = cand[i][1];
            if (2 * bq * d * 4 + 2 * bk * d * 4 + bq * bk * 4 <= l2 / 2 || i == 3) {
                q = (int)bq;
                k = (int)bk;
                break;
            }
        }
    }
    /* Under a causal or window mask the diagonal Q block computes ~Br²/2 masked scores: Br/N of the work is wasted,
     * 12 % at N = 2048 with Br = 256. Br = 128 halves that (measured, causal d = 64/128, N = 2048, 8 x 16/32 heads:
     * 158/173 GFLOP/s at 256 x 128 -> 164-170/172-184 at 128 x 128). */
    if (!p->is_backward && (p->wl >= 0 || p->wr >= 0) && q > 128) q = 128;
    if (p->block_q) q = p->block_q;
    if (p->block_k) k = p->block_k;
    if (q > p->sq_max && p->sq_max > 0) q = (int)p->sq_max;
    if (k > p->sk_max && p->sk_max > 0) k = (int)p->sk_max;
    *br = q < 1 ? 1 : q;
    *bc = k < 1 ? 1 : k;
}

/* FLASH2 forward: a work item is `group` Q blocks of one head sharing one packed copy of their K/V rows (fp32,
 * contiguous), when those fit in seg keys. Per-block copies from a BSHD tensor cost ~8 % at d = 128 (a TLB miss per
 * row: rows are heads·d·4 = 8 KiB apart; skipping them entirely gave +5-9 %, 1 thread, 2026-11-30). group = 16
 * (a whole head at N = 2048 with the causal Br = 128, where two packs per head cost ~5 %) amortises the pack while
 * keeping >= 16 items to balance (fewer blocks -> smaller groups; 1 = no pack); K + V packed take at most 2 MiB per
 * thread (d = 128: 2048 keys, d = 64: 4096 — the protocol's 2k rows pack at both). 4 MiB packed one head at 8k,
 * d = 64, too: 8 MiB of workspace on 2 threads there but not at 4k, a step that made the report's memory claim read
 * as N^1.75 for FLASH2; at 2 MiB the workspace stays flat over the report's lengths. */
void fa_cpu_kv_pack(const fa_problem *p, int64_t tr, int bc, int *group, int *seg) {
    const int64_t blocks = p->batch * p->hq * tr;
    int64_t g = blocks / 16;
    *group = (int)(g < 1 ? 1 : g > 16 ? 16 : g);
    const int64_t keys = ((int64_t)2 << 20) / (2 * p->d * 4) / bc * bc;
    *seg = *group > 1 ? (int)(keys < bc ? bc : keys) : 0;
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
        int c0, c1;
        fa_key_range(p, sq, sk, i0 + r, &lo, &hi);
        fa_cpu_tile_cols(lo, hi, j0, cols, &c0, &c1);
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
        const float masked = p->scale < 0 ? INFINITY : -INFINITY; /* scale·masked = −∞ */
        int64_t vis = 0;
        for (int r = 0; r < rows; r++) {
            int64_t lo, hi;
            int c0, c1;
            fa_key_range(p, sq, sk, i0 + r, &lo, &hi);
            fa_cpu_tile_cols(lo, hi, j0, cols, &c0, &c1);
            float *s = S + (int64_t)r * ldt;
            for (int c = 0; c < c0; c++) s[c] = masked;
            for (int c = c1; c < cols; c++) s[c] = masked;
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
