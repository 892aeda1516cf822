/* The sinks' gradient on the CPU, for every algorithm alike: d sinks[h] = −Σ_{b,i} exp(sinks[h] − LSE_bhi) · D_bhi
 * with D = rowsum(dO ∘ O), from the forward's out and LSE (which includes the sink). One more read of out, dout and
 * LSE, counted in fa_stats; the gradients of q, k and v need nothing new, since P = exp(S − LSE) already leaves the
 * sink's share out of every row. docs/numerics.md ("Attention sinks"). */
#include "cpu/cpu.h"
#include "core/half.h"

void fa_cpu_sinks_grad(const fa_problem *p, int threads, fa_io *io) {
    const int64_t d = p->d_v, es = (int64_t)fa_dtype_size(p->dtype); /* out's and dout's head_dim */
    int64_t rows = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) reduction(+ : rows)
    for (int64_t h = 0; h < p->hq; h++) {
        const double sink = p->sinks[h];
        double g = 0; /* in float64, in a fixed order: the same sum on any thread count */
        for (int64_t b = 0; b < p->batch; b++) {
            fa_head hd;
            fa_cpu_head(p, b, h, &hd);
            rows += hd.sq;
            for (int64_t i = 0; i < hd.sq && sink != -INFINITY; i++) { /* a sink of −inf: no sink, no gradient */
                double D = 0;
                for (int64_t x = 0; x < d; x++)
                    D += (double)fa_load_elem(hd.dout, (int)p->dtype, i * hd.lddo + x) *
                         fa_load_elem(hd.o, (int)p->dtype, i * hd.ldo + x);
                g -= exp(sink - (double)hd.lse[i]) * D;
            }
        }
        p->d_sinks[h] = (float)g;
    }
    io->read += rows * (2 * d * es + 4) + p->hq * 4;
    io->written += p->hq * 4;
}
