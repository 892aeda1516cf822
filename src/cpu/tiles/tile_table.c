/* The CPU tile table (Br x Bc per algorithm and pass) and the FLASH2 forward K/V packing. Read by the plan only;
 * changes speed, never results. docs/cpu-kernels.md has the measurements behind the rows. */
#include "cpu/cpu.h"

#include <unistd.h>

enum { ANY_PASS = -1, FWD = 0, BWD = 1 };
#define ALGO(a) (1u << (a))
#define FLASH (ALGO(FA_ALGO_FLASH1) | ALGO(FA_ALGO_FLASH2))

/* The first row that matches the call gives (Br, Bc). fit_l2: only if the working set fits in the L2 — forward:
 * Qiᵀ, Oi (2·Br·d·4) + Kj, Vj (2·Bc·d·4) + Sᵀ (Br·Bc·4) in all of it; backward: Kj, Vj, their transposes, dKj,
 * dVj (6·Bc·d·4) + Qi, dOi, dQi (3·Br·d·4) + P, dS (2·Br·Bc·4) in all of it. unmasked: only without a causal or
 * window mask. */
static const struct tile_row {
    unsigned algos;
    int pass;
    int fit_l2, unmasked;
    int br, bc;
    const char *why;
} tile_table[] = {
    {FLASH, FWD, 1, 1, 256, 128, "a large Br divides FLASH2's K/V re-reads; the 6x64 kernels keep full speed with "
                                 "their B panel in L2, so S need not fit in L1. FLASH1 takes the same tiles, so "
                                 "the two compare loop orders, not tile sizes"},
    {FLASH, FWD, 1, 0, 128, 128, "masked: the diagonal Q block wastes ~Br/N of the work on masked scores; Br = 128 "
                                 "halves that"},
    {FLASH, FWD, 1, 0, 128, 64, "d = 256 on a 512 KiB L2 (Zen 3: 1.19x 64 x 64)"},
    {FLASH, FWD, 0, 0, 64, 64, "the floor, whatever the L2"},
    {FLASH, BWD, 1, 0, 128, 128, "twice the rows and keys of 64 x 64 per step: the five products run on larger "
                                 "operands and Qi, dOi, dQi move half as often (d <= 128 on a 1 MiB L2)"},
    {FLASH, BWD, 0, 0, 64, 64, "the floor: Kj, Vj, their transposes, dKj, dVj and Qi, dOi, dQi, P, dS stay in L2"},
    {ALGO(FA_ALGO_STANDARD), ANY_PASS, 0, 0, 64, 64, "S/P tiles of 16 KiB in L1; the N x N matrices are in slow "
                                                     "memory whatever the tile"},
};

/* L2 size of this CPU (bytes), read at run time; a conservative default where the OS does not say. */
static long l2_bytes(void) {
    long b = -1;
#if defined(_SC_LEVEL2_CACHE_SIZE)
    b = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    return b > 0 ? b : 512 * 1024;
}

/* d: q/k's head_dim, dv: v/out's (the formulas above with d for the q/k-side tiles, dv for the v/o-side ones) */
static int fits_l2(int backward, long br, long bc, long d, long dv, long l2) {
    if (backward) return 3 * bc * (d + dv) * 4 + br * (2 * d + dv) * 4 + 2 * br * bc * 4 <= l2;
    return br * (d + dv) * 4 + bc * (d + dv) * 4 + br * bc * 4 <= l2;
}

void fa_cpu_tiles(const fa_problem *p, int *br, int *bc) {
    const long l2 = l2_bytes();
    const int masked = fa_problem_masked(p);
    int q = 64, k = 64;
    for (size_t i = 0; i < sizeof tile_table / sizeof tile_table[0]; i++) {
        const struct tile_row *t = &tile_table[i];
        if (!(t->algos & ALGO(p->algo)) || (t->pass != ANY_PASS && t->pass != p->is_backward)) continue;
        if (t->unmasked && masked) continue;
        if (t->fit_l2 && !fits_l2(p->is_backward, t->br, t->bc, (long)p->d, (long)p->d_v, l2)) continue;
        q = t->br;
        k = t->bc;
        break;
    }
    if (p->block_q) q = p->block_q;
    if (p->block_k) k = p->block_k;
    if (q > p->sq_max && p->sq_max > 0) q = (int)p->sq_max;
    if (k > p->sk_max && p->sk_max > 0) k = (int)p->sk_max;
    *br = q < 1 ? 1 : q;
    *bc = k < 1 ? 1 : k;
}

/* A work item is `group` Q blocks of one head sharing one packed fp32 copy of their K/V rows: strided BSHD rows
 * cost a TLB miss each when copied per block. group <= 16, and at least 16 items and 8 per thread to balance (with
 * 16 items on 16 threads one slow item holds up the call; 16-core Xeon, N 4096: 8 per thread ran 1.06-1.11x 4 per
 * thread at B 1 in 7 of 8 rows, 0.97-1.14x at B 4, the extra packs included). K + V packed take at most 2 MiB per thread on up to 4
 * threads, so the workspace stays flat in N (the report's memory claim), and 512 KiB per thread beyond, up to 8 MiB
 * at 16 threads: the per-block copies cost more when many cores share the memory system (16-core Xeon, N 4096, d 128:
 * a whole head packed ran 1.01-1.13x the 2 MiB pack; 2 threads: the same within the noise). */
#define FA_PACK_MIN ((int64_t)2 << 20)
#define FA_PACK_PER_THREAD ((int64_t)512 << 10)
#define FA_PACK_MAX ((int64_t)8 << 20)
void fa_cpu_kv_pack(const fa_problem *p, int64_t tr, int bc, int threads, int *group, int *seg) {
    const int64_t blocks = p->batch * p->hq * tr, items = 8 * (int64_t)threads > 16 ? 8 * (int64_t)threads : 16;
    int64_t g = blocks / items;
    *group = (int)(g < 1 ? 1 : g > 16 ? 16 : g);
    int64_t bytes = FA_PACK_PER_THREAD * threads;
    bytes = bytes < FA_PACK_MIN ? FA_PACK_MIN : bytes > FA_PACK_MAX ? FA_PACK_MAX : bytes;
    const int64_t keys = bytes / ((p->d + p->d_v) * 4) / bc * bc;
    *seg = *group > 1 ? (int)(keys < bc ? bc : keys) : 0;
}
