/* The plan's modelled slow-memory traffic: each algorithm's loop structure without the mask (every tile pair
 * visited) and without FLASH2's K/V packing. The run replaces it with the bytes the tile transfers count, which
 * tests/test_stats.c checks against the exact per-algorithm formulas. */
#include "cpu/cpu.h"

/* Bytes of one sequence (sq queries, sk keys), per query head (forward) or per K/V head (backward). */
static void sequence(const fa_problem *p, const fa_plan *pl, double sq, double sk, double *r, double *w) {
    const double d = (double)p->d, e = (double)fa_dtype_size(p->dtype), g = (double)(p->hq / p->hk);
    const double tr = ceil(sq / pl->block_q), tc = ceil(sk / pl->block_k), f32 = p->dtype == FA_DTYPE_F32;
    const double lse = p->lse ? 4 * sq : 0, conv = f32 ? 0 : 1;
    switch (pl->entry) {
    case FA_CPU_STANDARD:
    case FA_CPU_STANDARD_BLAS:
        if (!p->is_backward) { /* S tile by tile, softmax S -> P, O = P V: K and V once per Q block */
            *r = sq * d * e + 2 * tr * sk * d * e + 8 * sq * sk;
            *w = 8 * sq * sk + sq * d * e + lse;
        } else { /* S, dP, P, dS materialised; dV, dK accumulated per K block; dQ = dS K */
            *r = g * (3 * sq * d * e + 3 * tr * sk * d * e + 2 * tc * sq * d * e + 4 * sq + 20 * sq * sk + 8 * sk * d) +
                 8 * sk * d;
            *w = 8 * sk * d + 2 * sk * d * e + g * (16 * sq * sk + 8 * sk * d + sq * d * e);
        }
        return;
    case FA_CPU_FLASH1:
        if (!p->is_backward) { /* O, ℓ, m read and written back at every (K/V block, Q block) step */
            *r = 2 * sk * d * e + tc * sq * (d * e + 4 * d + 8) + conv * 4 * sq * d + (lse ? 8 * sq : 0);
            *w = 4 * sq * d + 8 * sq + tc * (4 * sq * d + 8 * sq) + conv * sq * d * e + lse;
        } else { /* Qi, Oi, dOi, LSEi, dQi read and dQi written per step */
            *r = 2 * sk * d * e + tc * g * sq * (3 * d * e + 4 + 4 * d) + conv * g * 4 * sq * d;
            *w = g * 4 * sq * d + tc * g * 4 * sq * d + 2 * sk * d * e + conv * g * sq * d * e;
        }
        return;
    default:
        if (!p->is_backward) { /* Qi and Oi once, Kj and Vj once per (Q block, K/V block) */
            *r = sq * d * e + 2 * tr * sk * d * e;
            *w = sq * d * e + lse;
        } else if (pl->aux[FA_CPU_AUX_SPLIT] > 1) { /* the D pre-pass, then Qi, dOi, LSEi, Di, dQi read and dQi
                                                       written per step */
            *r = g * 2 * sq * d * e + 2 * sk * d * e + tc * g * sq * (2 * d * e + 8 + 4 * d) + conv * g * 4 * sq * d;
            *w = g * (4 * sq + 4 * sq * d) + tc * g * 4 * sq * d + 2 * sk * d * e + conv * g * sq * d * e;
        } else { /* Qi, dOi, LSEi per step; the first K/V block of a Q block reads Oi (D computed, stored for the
                    others) and starts dQi at 0, the others read Di and dQi; dQi written per step */
            *r = 2 * sk * d * e + g * sq * (tc * (2 * d * e + 4) + (tc - 1) * (4 * d + 4) + d * e) +
                 conv * g * 4 * sq * d;
            *w = tc * g * 4 * sq * d + (tc > 1 ? g * 4 * sq : 0) + 2 * sk * d * e + conv * g * sq * d * e;
        }
        return;
    }
}

void fa_cpu_plan_traffic(const fa_problem *p, fa_plan *pl) {
    const double heads = (double)(p->is_backward ? p->hk : p->hq);
    double r = 0, w = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        double rb, wb;
        sequence(p, pl, (double)fa_seqlen_q(p, b), (double)fa_seqlen_k(p, b), &rb, &wb);
        r += rb, w += wb;
    }
    pl->read_bytes = heads * r;
    pl->write_bytes = heads * w;
}
