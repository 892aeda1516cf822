/* The plan's modelled slow-memory traffic: each algorithm's loop structure without the mask (every tile pair
 * visited) and without FLASH2's K/V packing. The run replaces it with the bytes the tile transfers count, which
 * tests/test_stats.c checks against the exact per-algorithm formulas. */
#include "cpu/cpu.h"

/* Bytes of one sequence (sq queries, sk keys), per query head (forward) or per K/V head (backward). */
static void sequence(const fa_problem *p, const fa_plan *pl, double sq, double sk, double *r, double *w) {
    /* d: the q/k-side rows (q, k, dq, dk), v: the v/o-side rows (v, out, dout, dv) */
    const double d = (double)p->d, v = (double)p->d_v, e = (double)fa_dtype_size(p->dtype), g = (double)(p->hq / p->hk);
    const double tr = ceil(sq / pl->block_q), tc = ceil(sk / pl->block_k), f32 = p->dtype == FA_DTYPE_F32;
    const double lse = p->lse ? 4 * sq : 0, conv = f32 ? 0 : 1;
    switch (pl->entry) {
    case FA_CPU_STANDARD:
    case FA_CPU_STANDARD_BLAS:
        if (!p->is_backward) { /* S tile by tile, softmax S -> P, O = P V: K and V once per Q block */
            *r = sq * d * e + tr * sk * (d + v) * e + 8 * sq * sk;
            *w = 8 * sq * sk + sq * v * e + lse;
        } else { /* S, dP, P, dS materialised; dV, dK accumulated per K block; dQ = dS K */
            *r = g * (sq * (d + 2 * v) * e + tr * sk * (2 * d + v) * e + tc * sq * (d + v) * e + 4 * sq + 20 * sq * sk +
                      4 * sk * (d + v)) +
                 4 * sk * (d + v);
            *w = 4 * sk * (d + v) + sk * (d + v) * e + g * (16 * sq * sk + 4 * sk * (d + v) + sq * d * e);
        }
        return;
    case FA_CPU_FLASH1:
        if (!p->is_backward) { /* O, ℓ, m read and written back at every (K/V block, Q block) step */
            *r = sk * (d + v) * e + tc * sq * (d * e + 4 * v + 8) + conv * 4 * sq * v + (lse ? 8 * sq : 0);
            *w = 4 * sq * v + 8 * sq + tc * (4 * sq * v + 8 * sq) + conv * sq * v * e + lse;
        } else { /* Qi, Oi, dOi, LSEi, dQi read and dQi written per step */
            *r = sk * (d + v) * e + tc * g * sq * ((d + 2 * v) * e + 4 + 4 * d) + conv * g * 4 * sq * d;
            *w = g * 4 * sq * d + tc * g * 4 * sq * d + sk * (d + v) * e + conv * g * sq * d * e;
        }
        return;
    default:
        if (!p->is_backward) { /* Qi and Oi once, Kj and Vj once per (Q block, K/V block) */
            *r = sq * d * e + tr * sk * (d + v) * e;
            *w = sq * v * e + lse;
        } else if (pl->aux[FA_CPU_AUX_SPLIT] > 1) { /* the D pre-pass, then Qi, dOi, LSEi, Di, dQi read and dQi
                                                       written per step */
            *r = g * 2 * sq * v * e + sk * (d + v) * e + tc * g * sq * ((d + v) * e + 8 + 4 * d) + conv * g * 4 * sq * d;
            *w = g * (4 * sq + 4 * sq * d) + tc * g * 4 * sq * d + sk * (d + v) * e + conv * g * sq * d * e;
        } else { /* Qi, dOi, LSEi per step; the first K/V block of a Q block reads Oi (D computed, stored for the
                    others) and starts dQi at 0, the others read Di and dQi; dQi written per step */
            *r = sk * (d + v) * e + g * sq * (tc * ((d + v) * e + 4) + (tc - 1) * (4 * d + 4) + v * e) +
                 conv * g * 4 * sq * d;
            *w = tc * g * 4 * sq * d + (tc > 1 ? g * 4 * sq : 0) + sk * (d + v) * e + conv * g * sq * d * e;
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
