/* flashattn report: the claims table. Every verdict is computed from the measured rows; none is written in advance. */
#include "report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------------------
 * Looking rows up
 * ------------------------------------------------------------------------------------------------------- */
const bench_row *find_row(const rows_t *rs, fa_algo a, int64_t d, int64_t n, int causal, int bwd, int64_t heads,
                          int bq, int bk) {
    for (int i = 0; i < rs->n; i++) {
        const bench_row *r = &rs->v[i];
        const bench_config *c = &r->cfg;
        if (r->algo == a && (d < 0 || c->head_dim == d) && (n < 0 || c->seqlen_q == n) &&
            (causal < 0 || c->causal == causal) && (bwd < 0 || c->backward == bwd) && (heads < 0 || c->heads == heads) &&
            (bq < 0 || c->block_q == bq) && (bk < 0 || c->block_k == bk))
            return r;
    }
    return NULL;
}

typedef struct ratio_set {
    int n;
    double r[512];
    int64_t d[512], seqlen[512], bh[512];
    int causal[512], bwd[512];
} ratio_set;

/* ms(slow)/ms(fast) for every configuration of rs where both ran. */
static void collect(const rows_t *rs, fa_algo slow, fa_algo fast, ratio_set *out) {
    out->n = 0;
    for (int i = 0; i < rs->n && out->n < 512; i++) {
        const bench_row *f = &rs->v[i];
        if (f->algo != fast || !f->ok) continue;
        const bench_config *c = &f->cfg;
        const bench_row *s = find_row(rs, slow, c->head_dim, c->seqlen_q, c->causal, c->backward, c->heads, c->block_q,
                                  c->block_k);
        if (!s || !s->ok) continue;
        int k = out->n++;
        out->r[k] = s->ms / f->ms;
        out->d[k] = c->head_dim;
        out->seqlen[k] = c->seqlen_q;
        out->bh[k] = c->batch * c->heads;
        out->causal[k] = c->causal;
        out->bwd[k] = c->backward;
    }
}

double median_n(const double *x, int n) { return n > 0 ? median_of(x, n) : NAN; }

static void minmax(const double *x, int n, double *lo, double *hi) {
    *lo = INFINITY, *hi = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (x[i] < *lo) *lo = x[i];
        if (x[i] > *hi) *hi = x[i];
    }
}

/* Which setting explains the spread of the ratios: the dimension whose per-value medians differ most. */
static void explain(const ratio_set *s, char *buf, size_t len) {
    const char *names[5] = {"pass", "causal", "head_dim", "seqlen", "batch×heads"};
    double best = 0;
    buf[0] = 0;
    for (int dim = 0; dim < 5; dim++) {
        int64_t vals[32];
        int nv = 0;
        for (int i = 0; i < s->n; i++) {
            int64_t v = dim == 0 ? s->bwd[i] : dim == 1 ? s->causal[i] : dim == 2 ? s->d[i] : dim == 3 ? s->seqlen[i] : s->bh[i];
            int seen = 0;
            for (int j = 0; j < nv; j++) seen |= vals[j] == v;
            if (!seen && nv < 32) vals[nv++] = v;
        }
        if (nv < 2) continue;
        for (int a = 1; a < nv; a++) /* ascending, so the text reads in order */
            for (int b = a; b > 0 && vals[b] < vals[b - 1]; b--) {
                int64_t t = vals[b];
                vals[b] = vals[b - 1];
                vals[b - 1] = t;
            }
        double med[32], lo = INFINITY, hi = -INFINITY;
        for (int j = 0; j < nv; j++) {
            double x[512];
            int m = 0;
            for (int i = 0; i < s->n; i++) {
                int64_t v = dim == 0 ? s->bwd[i] : dim == 1 ? s->causal[i] : dim == 2 ? s->d[i] : dim == 3 ? s->seqlen[i] : s->bh[i];
                if (v == vals[j]) x[m++] = s->r[i];
            }
            med[j] = median_n(x, m);
            if (med[j] < lo) lo = med[j];
            if (med[j] > hi) hi = med[j];
        }
        if (hi - lo > best) {
            best = hi - lo;
            size_t o = (size_t)snprintf(buf, len, "%s (", names[dim]);
            for (int j = 0; j < nv && o < len; j++) {
                char v[32];
                if (dim == 0) snprintf(v, sizeof v, "%s", vals[j] ? "bwd" : "fwd");
                else if (dim == 1) snprintf(v, sizeof v, "%s", vals[j] ? "causal" : "not causal");
                else snprintf(v, sizeof v, "%lld", (long long)vals[j]);
                o += (size_t)snprintf(buf + o, len - o, "%s%s: %.2f×", j ? ", " : "", v, med[j]);
            }
            if (o < len) snprintf(buf + o, len - o, ")");
        }
    }
}


/* "A is X–Y× faster than B": ratios ms(B)/ms(A). */
static void speed_claim(claim *c, const ratio_set *s, double lo_claim, double hi_claim, const char *fast,
                        const char *slow, const char *where) {
    if (s->n == 0) {
        snprintf(c->result, sizeof c->result, "no configuration where both %s and %s ran", fast, slow);
        snprintf(c->verdict, sizeof c->verdict, "not measured here");
        return;
    }
    double med = median_n(s->r, s->n), lo, hi;
    minmax(s->r, s->n, &lo, &hi);
    int in = 0, above = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->r[i] >= lo_claim) in++;
        if (s->r[i] > hi_claim) above++;
    }
    char why[400];
    explain(s, why, sizeof why);
    snprintf(c->result, sizeof c->result,
             "%s/%s speed ratio over %d settings (%s): median %.2f×, range %.2f–%.2f×; ≥ %.1f× in %d of %d%s%s",
             fast, slow, s->n, where, med, lo, hi, lo_claim, in, s->n, why[0] ? "; by " : "", why);
    if (med >= lo_claim)
        snprintf(c->verdict, sizeof c->verdict, "**holds here** (median %.2f×%s)", med,
                 med > hi_claim ? ", above the claimed range" : "");
    else if (4 * in >= s->n)
        snprintf(c->verdict, sizeof c->verdict, "**depends** on %s: ≥ %.1f× in %d of %d settings", why[0] ? why : "the setting",
                 lo_claim, in, s->n);
    else if (in > 0) {
        char where_ok[200] = "";
        size_t o = 0;
        for (int i = 0, k = 0; i < s->n && k < 3; i++)
            if (s->r[i] >= lo_claim)
                o += (size_t)snprintf(where_ok + o, sizeof where_ok - o, "%sd=%lld N=%lld B×H=%lld %s%s: %.2f×",
                                      k++ ? "; " : "", (long long)s->d[i], (long long)s->seqlen[i], (long long)s->bh[i],
                                      s->bwd[i] ? "bwd" : "fwd", s->causal[i] ? " causal" : "", s->r[i]);
        snprintf(c->verdict, sizeof c->verdict,
                 "**does not hold here** in general (median %.2f×): ≥ %.1f× only in %d of %d settings (%s)", med,
                 lo_claim, in, s->n, where_ok);
    }
    else if (med >= 1.05)
        snprintf(c->verdict, sizeof c->verdict, "**does not hold here**: %s is faster, but by %.2f× (median), not %.1f–%.0f×",
                 fast, med, lo_claim, hi_claim);
    else
        snprintf(c->verdict, sizeof c->verdict, "**does not hold here**: %s is not faster than %s (median %.2f×)", fast,
                 slow, med);
    (void)above;
}

/* Least-squares slope of log(y) vs log(x). */
static double loglog_slope(const double *x, const double *y, int n) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (!(x[i] > 0 && y[i] > 0)) continue;
        double a = log(x[i]), b = log(y[i]);
        sx += a, sy += b, sxx += a * a, sxy += a * b, m++;
    }
    if (m < 2) return NAN;
    double den = m * sxx - sx * sx;
    return den != 0 ? (m * sxy - sx * sy) / den : NAN;
}

static double mem_slope(const rows_t *mem, fa_algo a, double *last_mb, int64_t *last_n) {
    double x[16], y[16];
    int n = 0;
    *last_mb = NAN;
    *last_n = 0;
    for (int i = 0; i < mem->n && n < 16; i++) {
        const bench_row *r = &mem->v[i];
        if (r->algo != a || !r->ok) continue;
        x[n] = (double)r->cfg.seqlen_q;
        y[n] = r->extra_bytes > 0 ? (double)r->extra_bytes : 1.0; /* none at all: a constant (slope 0) */
        *last_mb = (double)r->extra_bytes / 1e6;
        *last_n = r->cfg.seqlen_q;
        n++;
    }
    /* the largest three lengths: small ones carry constant overheads */
    int first = n > 3 ? n - 3 : 0;
    return loglog_slope(x + first, y + first, n - first);
}

/* Fast-memory working set of one FLASH2 step (fp32): Qi, Kj, Vj, S/P, Oi. */
double tile_bytes(int br, int bc, int d) { return 4.0 * ((double)br * d * 2 + 2.0 * bc * d + (double)br * bc); }

int build_claims(report *R, const dev_data *D, claim *cl, int *ncl) {
    int n = 0;
    ratio_set s;
    const char *dn = fa_backend_name(D->dev);
    memset(cl, 0, 10 * sizeof *cl);
    char where[128];
    snprintf(where, sizeof where, "%s, speed vs seqlen and batch×heads", dn);

    /* 1. V2 is 1.5–2× V1 */
    rows_t both = {0};
    for (int i = 0; i < D->speed.n; i++) rows_push(&both, &D->speed.v[i]);
    for (int i = 0; i < D->par.n; i++) rows_push(&both, &D->par.v[i]);
    cl[n].claim = "FlashAttention-2 is 1.5–2× faster than FlashAttention-1";
    snprintf(cl[n].measured, sizeof cl[n].measured, "median time of FLASH1 / FLASH2, same inputs, interleaved (%s)", dn);
    collect(&both, FA_ALGO_FLASH1, FA_ALGO_FLASH2, &s);
    speed_claim(&cl[n], &s, 1.5, 2.0, "FLASH2", "FLASH1", where);
    n++;

    /* 2. V1 is 2–4× standard */
    cl[n].claim = "FlashAttention(-1) is 2–4× faster than standard attention";
    snprintf(cl[n].measured, sizeof cl[n].measured, "median time of STANDARD / FLASH1 (%s)", dn);
    collect(&both, FA_ALGO_STANDARD, FA_ALGO_FLASH1, &s);
    speed_claim(&cl[n], &s, 2.0, 4.0, "FLASH1", "STANDARD", where);
    n++;

    /* 3. memory linear instead of quadratic */
    cl[n].claim = "memory is linear in sequence length instead of quadratic";
    snprintf(cl[n].measured, sizeof cl[n].measured,
             "peak extra memory (fa_last_stats extra_bytes) vs N, batch 1, 1 head, d 64; log-log slope (%s)", dn);
    {
        double mb[4];
        int64_t ln[4];
        double sl[4];
        for (int a = 1; a <= 3; a++) sl[a] = mem_slope(&D->mem, (fa_algo)a, &mb[a], &ln[a]);
        size_t o = (size_t)snprintf(cl[n].result, sizeof cl[n].result,
                                    "extra memory grows as N^%.2f (STANDARD), N^%.2f (FLASH1), N^%.2f (FLASH2) over the 3 longest N; at N = %lld: "
                                    "%.2f MB vs %.3f MB vs %.3f MB",
                                    sl[1], sl[2], sl[3], (long long)ln[1], mb[1], mb[2], mb[3]);
        const bench_row *probe = D->probe_n ? find_row(&D->mem, FA_ALGO_STANDARD, 64, D->probe_n, 0, 0, 1, -1, -1) : NULL;
        if (probe)
            snprintf(cl[n].result + o, sizeof cl[n].result - o,
                     "; at N = %lld STANDARD would need ≈ %.1f GB beyond its inputs (%.1f GB available): %s",
                     (long long)D->probe_n, D->probe_need / 1e9, D->probe_limit / 1e9,
                     probe->ok ? "it still ran" : probe->status);
        int quad = sl[1] >= 1.7, lin = sl[2] <= 1.2 && sl[3] <= 1.2;
        if (isnan(sl[1]) || isnan(sl[3]))
            snprintf(cl[n].verdict, sizeof cl[n].verdict, "not measured here");
        else if (quad && lin)
            snprintf(cl[n].verdict, sizeof cl[n].verdict,
                     "**holds here**: STANDARD's extra memory is quadratic (slope %.2f), FLASH1/FLASH2's at most linear "
                     "(%.2f, %.2f)%s",
                     sl[1], sl[2], sl[3], probe && !probe->ok ? "; STANDARD stops fitting in memory where predicted" : "");
        else if (lin)
            snprintf(cl[n].verdict, sizeof cl[n].verdict,
                     "**partly**: FLASH1/FLASH2 need at most linear extra memory (slopes %.2f, %.2f), but STANDARD's grew "
                     "as N^%.2f over these lengths, not yet quadratic", sl[2], sl[3], sl[1]);
        else
            snprintf(cl[n].verdict, sizeof cl[n].verdict, "**does not hold here** as stated: slopes %.2f / %.2f / %.2f",
                     sl[1], sl[2], sl[3]);
    }
    n++;

    /* 4. V2 halves slow-memory reads/writes (counted, CPU) */
    if (D->dev == FA_BACKEND_CPU) {
        cl[n].claim = "FlashAttention-2 halves the HBM (slow-memory) reads/writes of FlashAttention-1";
        snprintf(cl[n].measured, sizeof cl[n].measured,
                 "counted slow-memory bytes (fa_last_stats), forward, d 64, library blocks (io_seqlen) and paper blocks "
                 "from M (io_sram)");
        double rt[32], rr[32], rw[32];
        int m = 0;
        for (int i = 0; i < R->io_seqlen.n; i++) {
            const io_row *a = &R->io_seqlen.v[i];
            if (a->algo != FA_ALGO_FLASH1 || !a->ok) continue;
            for (int j = 0; j < R->io_seqlen.n; j++) {
                const io_row *b = &R->io_seqlen.v[j];
                if (b->algo == FA_ALGO_FLASH2 && b->ok && b->seqlen == a->seqlen && m < 32) {
                    rt[m] = (double)(a->read_bytes + a->write_bytes) / (double)(b->read_bytes + b->write_bytes);
                    rr[m] = (double)a->read_bytes / (double)b->read_bytes;
                    rw[m] = (double)a->write_bytes / (double)b->write_bytes;
                    m++;
                }
            }
        }
        double ms[32], m_at[32];
        int k = 0;
        for (int i = 0; i < R->io_sram.n; i++) {
            const io_row *a = &R->io_sram.v[i];
            if (a->algo != FA_ALGO_FLASH1 || !a->ok) continue;
            for (int j = 0; j < R->io_sram.n; j++) {
                const io_row *b = &R->io_sram.v[j];
                if (b->algo == FA_ALGO_FLASH2 && b->ok && b->sram_bytes == a->sram_bytes && k < 32) {
                    m_at[k] = (double)a->sram_bytes;
                    ms[k++] = (double)(a->read_bytes + a->write_bytes) / (double)(b->read_bytes + b->write_bytes);
                }
            }
        }
        double lo, hi, slo = NAN, shi = NAN;
        minmax(rt, m, &lo, &hi);
        if (k) minmax(ms, k, &slo, &shi);
        double med = median_n(rt, m);
        snprintf(cl[n].result, sizeof cl[n].result,
                 "FLASH1/FLASH2 total bytes: median %.2f× (range %.2f–%.2f×) over %d lengths; reads %.2f×, writes "
                 "%.1f× (medians); with the paper's blocks from M: %.2f–%.2f×",
                 med, lo, hi, m, median_n(rr, m), median_n(rw, m), slo, shi);
        {
            /* where FLASH2 moves MORE than FLASH1 with the paper's blocks (Br = min(Bc, d) re-reads K/V N/Br times) */
            double worse_hi = 0;
            for (int i = 0; i < k; i++)
                if (ms[i] < 1 && m_at[i] > worse_hi) worse_hi = m_at[i];
            size_t o = strlen(cl[n].result);
            if (worse_hi > 0 && o < sizeof cl[n].result)
                snprintf(cl[n].result + o, sizeof cl[n].result - o,
                         " — FLASH2 moves more than FLASH1 for M ≤ %.0f KiB, where Br = min(Bc, d) is small", worse_hi / 1024);
        }
        if (m == 0) snprintf(cl[n].verdict, sizeof cl[n].verdict, "not measured");
        else if (med >= 1.8)
            snprintf(cl[n].verdict, sizeof cl[n].verdict, "**holds here**: FLASH2 moves %.0f%% of FLASH1's bytes",
                     100 / med);
        else if (med > 1.05)
            snprintf(cl[n].verdict, sizeof cl[n].verdict,
                     "**partly**: FLASH2 moves %.0f%% of FLASH1's bytes — it writes O once instead of once per K/V block "
                     "(%.0f× fewer writes) but reads about as much (%.2f×)",
                     100 / med, median_n(rw, m), median_n(rr, m));
        else
            snprintf(cl[n].verdict, sizeof cl[n].verdict, "**does not hold here** (FLASH1/FLASH2 = %.2f×)", med);
        n++;
    }

    /* 4 (GPU). the same claim from DRAM bytes measured by ncu, next to the backend's model */
    if (D->dev == FA_BACKEND_CUDA) {
        cl[n].claim = "FlashAttention-2 halves the HBM (slow-memory) reads/writes of FlashAttention-1";
        snprintf(cl[n].measured, sizeof cl[n].measured, "DRAM bytes of one forward measured by ncu, and the backend's model "
                                                        "(fa_last_stats), bf16");
        size_t o = 0;
        double meas[8], model[8];
        int m = 0;
        for (int i = 0; i < R->n_ncu; i++) {
            const ncu_row *a = &R->ncu[i];
            if (strcmp(a->algo, "flash1") != 0 || !a->ok) continue;
            for (int j = 0; j < R->n_ncu; j++) {
                const ncu_row *b = &R->ncu[j];
                if (strcmp(b->algo, "flash2") != 0 || !b->ok || b->n != a->n || b->d != a->d || b->b != a->b) continue;
                meas[m] = (a->dram_read + a->dram_write) / (b->dram_read + b->dram_write);
                model[m] = (a->model_read + a->model_write) / (b->model_read + b->model_write);
                if (o < sizeof cl[n].result - 200)
                    o += (size_t)snprintf(cl[n].result + o, sizeof cl[n].result - o,
                                          "%sB×H×N×d = %lld×%lld×%lld×%lld: measured FLASH1/FLASH2 %.1f× (%.0f vs %.0f MB), "
                                          "modelled %.2f×",
                                          m ? "; " : "", (long long)a->b, (long long)a->h, (long long)a->n, (long long)a->d,
                                          meas[m], (a->dram_read + a->dram_write) / 1e6,
                                          (b->dram_read + b->dram_write) / 1e6, model[m]);
                m++;
            }
        }
        if (!m) {
            snprintf(cl[n].result, sizeof cl[n].result, "%s", R->ncu_status[0] ? R->ncu_status : "no ncu data");
            snprintf(cl[n].verdict, sizeof cl[n].verdict, "not measured on the GPU (no DRAM counters)");
        } else {
            double mm = median_n(meas, m), md = median_n(model, m);
            if (mm >= 1.8)
                snprintf(cl[n].verdict, sizeof cl[n].verdict,
                         "**holds here** (measured DRAM %.1f× less%s)", mm,
                         md < 1.8 ? "; the tile model alone says otherwise: the K/V re-reads it counts hit the L2" : "");
            else if (mm > 1.05)
                snprintf(cl[n].verdict, sizeof cl[n].verdict, "**partly**: FLASH2 moves %.0f%% of FLASH1's DRAM bytes",
                         100 / mm);
            else
                snprintf(cl[n].verdict, sizeof cl[n].verdict, "**does not hold here** (measured %.2f×)", mm);
        }
        n++;
    }

    /* 5. tile size bounded by fast memory */
    cl[n].claim = "the tile size is bounded by the fast memory (SRAM), and traffic falls as Θ(N²d²/M)";
    {
        double fast = D->dev == FA_BACKEND_CUDA ? (double)cuda_smem_per_sm() : (double)cpu_cache_bytes(2);
        const char *fname = D->dev == FA_BACKEND_CUDA ? "shared memory per SM" : "L2 per core";
        const bench_row *best = NULL;
        for (int i = 0; i < D->blocks.n; i++) {
            const bench_row *r = &D->blocks.v[i];
            if (r->ok && r->algo == FA_ALGO_FLASH2 && (!best || r->gflops > best->gflops)) best = r;
        }
        double worst_big = INFINITY;
        int n_big = 0, n_unsup = 0;
        for (int i = 0; i < D->blocks.n; i++) {
            const bench_row *r = &D->blocks.v[i];
            if (r->algo != FA_ALGO_FLASH2) continue;
            if (!r->ok) {
                n_unsup++;
                continue;
            }
            if (tile_bytes(r->block_q, r->block_k, 64) > fast) {
                n_big++;
                if (r->gflops < worst_big) worst_big = r->gflops;
            }
        }
        double x[16], y[16];
        int m = 0;
        for (int i = 0; i < R->io_sram.n && m < 16; i++)
            if (R->io_sram.v[i].algo == FA_ALGO_FLASH1 && R->io_sram.v[i].ok) {
                x[m] = (double)R->io_sram.v[i].sram_bytes;
                y[m] = (double)(R->io_sram.v[i].read_bytes + R->io_sram.v[i].write_bytes);
                m++;
            }
        double slope = loglog_slope(x, y, m);
        snprintf(cl[n].measured, sizeof cl[n].measured,
                 "FLASH2 speed vs (Br, Bc), d 64 (%s); FLASH1 counted bytes vs M with the paper's blocks", dn);
        size_t o = 0;
        if (best)
            o = (size_t)snprintf(cl[n].result, sizeof cl[n].result,
                                 "fastest FLASH2 tile Br×Bc = %d×%d (%.1f %s), working set %.0f KiB vs %s %.0f KiB",
                                 best->block_q, best->block_k, D->dev == FA_BACKEND_CUDA ? best->gflops / 1e3 : best->gflops,
                                 D->dev == FA_BACKEND_CUDA ? "TFLOP/s" : "GFLOP/s",
                                 tile_bytes(best->block_q, best->block_k, 64) / 1024, fname, fast / 1024);
        if (n_big && best)
            o += (size_t)snprintf(cl[n].result + o, sizeof cl[n].result - o,
                                  "; %d tile%s larger than the %s: down to %.0f%% of the best", n_big, n_big == 1 ? "" : "s", fname,
                                  100 * worst_big / best->gflops);
        if (n_unsup)
            o += (size_t)snprintf(cl[n].result + o, sizeof cl[n].result - o, "; %d tile shapes refused by the backend",
                                  n_unsup);
        if (!isnan(slope) && o < sizeof cl[n].result)
            snprintf(cl[n].result + o, sizeof cl[n].result - o, "; CPU FLASH1 bytes ∝ M^%.2f (paper: M^-1)", slope);
        int have_io = !isnan(slope), io_ok = have_io && slope < -0.7 && slope > -1.3;
        int fits = best && fast > 0 && tile_bytes(best->block_q, best->block_k, 64) <= fast;
        int overflow_slower = n_big > 0 && best && worst_big < 0.9 * best->gflops;
        if (!best)
            snprintf(cl[n].verdict, sizeof cl[n].verdict, "not measured");
        else if (fits && overflow_slower && (!have_io || io_ok))
            snprintf(cl[n].verdict, sizeof cl[n].verdict, "**holds here**: %stiles that overflow the %s run slower",
                     io_ok ? "traffic falls as 1/M, and " : "", fname);
        else if (fits && (!have_io || io_ok))
            snprintf(cl[n].verdict, sizeof cl[n].verdict, "**partly**: %sthe fastest tile fits the %s; %s",
                     io_ok ? "traffic falls as 1/M and " : "", fname,
                     n_big ? "tiles that overflow it were not slower here"
                     : n_unsup ? "the backend builds no tile that overflows it (larger ones are refused)"
                               : "no swept tile overflowed it");
        else if (io_ok)
            snprintf(cl[n].verdict, sizeof cl[n].verdict,
                     "**depends**: traffic falls as 1/M, but speed is not limited by the %s here (best tile %.0f KiB)",
                     fname, tile_bytes(best->block_q, best->block_k, 64) / 1024);
        else
            snprintf(cl[n].verdict, sizeof cl[n].verdict, "**does not hold here** as measured");
    }
    n++;

    /* 6. at 512 tokens standard may be faster */
    cl[n].claim = "at short sequences (≤ 512) standard attention may be faster";
    snprintf(cl[n].measured, sizeof cl[n].measured, "STANDARD vs the faster of FLASH1/FLASH2 at N ≤ 512 (%s)", dn);
    {
        int tot = 0, wins = 0;
        double best_ratio = 0, worst_ratio = INFINITY;
        char list[256] = "";
        size_t o = 0;
        for (int i = 0; i < D->speed.n; i++) {
            const bench_row *s = &D->speed.v[i];
            if (s->algo != FA_ALGO_STANDARD || !s->ok || s->cfg.seqlen_q > 512) continue;
            const bench_config *c = &s->cfg;
            const bench_row *f1 = find_row(&D->speed, FA_ALGO_FLASH1, c->head_dim, c->seqlen_q, c->causal, c->backward, c->heads, -1, -1);
            const bench_row *f2 = find_row(&D->speed, FA_ALGO_FLASH2, c->head_dim, c->seqlen_q, c->causal, c->backward, c->heads, -1, -1);
            double fm = INFINITY;
            if (f1 && f1->ok && f1->ms < fm) fm = f1->ms;
            if (f2 && f2->ok && f2->ms < fm) fm = f2->ms;
            if (!isfinite(fm)) continue;
            tot++;
            double r = fm / s->ms; /* > 1: standard faster */
            if (r > best_ratio) best_ratio = r;
            if (r < worst_ratio) worst_ratio = r;
            if (r > 1) {
                wins++;
                if (o < sizeof list - 64)
                    o += (size_t)snprintf(list + o, sizeof list - o, "%sd=%lld N=%lld %s%s", wins > 1 ? "; " : "",
                                          (long long)c->head_dim, (long long)c->seqlen_q, c->backward ? "bwd" : "fwd",
                                          c->causal ? " causal" : "");
            }
        }
        snprintf(cl[n].result, sizeof cl[n].result,
                 "STANDARD was the fastest in %d of %d settings with N ≤ 512%s%s%s; its time relative to the best flash: "
                 "%.2f–%.2f×",
                 wins, tot, wins ? " (" : "", list, wins ? ")" : "", worst_ratio > 0 ? 1 / best_ratio : NAN,
                 1 / worst_ratio);
        if (!tot) snprintf(cl[n].verdict, sizeof cl[n].verdict, "not measured (no N ≤ 512 in this preset)");
        else if (wins == tot) snprintf(cl[n].verdict, sizeof cl[n].verdict, "**holds here** in every short setting");
        else if (wins) snprintf(cl[n].verdict, sizeof cl[n].verdict, "**depends**: in %d of %d settings", wins, tot);
        else snprintf(cl[n].verdict, sizeof cl[n].verdict, "**does not hold here**: a flash algorithm was faster in all %d", tot);
    }
    n++;

    /* 7. V2's sequence parallelism matters when batch × heads is small */
    cl[n].claim = "FlashAttention-2's parallelism over the sequence matters when batch × heads is small";
    if (D->dev == FA_BACKEND_CPU)
        snprintf(cl[n].measured, sizeof cl[n].measured, "FLASH1/FLASH2 time ratio vs batch×heads, batch 1 (%s, %d threads)",
                 dn, D->par.n ? D->par.v[0].threads : 0);
    else
        snprintf(cl[n].measured, sizeof cl[n].measured, "FLASH1/FLASH2 time ratio vs batch×heads, batch 1 (%s)", dn);
    {
        collect(&D->par, FA_ALGO_FLASH1, FA_ALGO_FLASH2, &s);
        double small = NAN, large = NAN;
        int64_t bs = INT64_MAX, bl = 0;
        for (int p = 0; p < 2; p++) {
            /* forward only for the headline */
            for (int i = 0; i < s.n; i++)
                if (s.bwd[i] == 0) {
                    if (s.bh[i] < bs) bs = s.bh[i], small = s.r[i];
                    if (s.bh[i] > bl) bl = s.bh[i], large = s.r[i];
                }
        }
        char why[400];
        explain(&s, why, sizeof why);
        snprintf(cl[n].result, sizeof cl[n].result, "forward: FLASH2 is %.2f× FLASH1 at batch×heads = %lld, %.2f× at %lld%s%s",
                 small, (long long)bs, large, (long long)bl, why[0] ? "; by " : "", why);
        if (isnan(small) || isnan(large)) snprintf(cl[n].verdict, sizeof cl[n].verdict, "not measured");
        else if (small > 1.2 * large && small > 1.2)
            snprintf(cl[n].verdict, sizeof cl[n].verdict, "**holds here**: FLASH2's advantage is %.2f× at %lld head(s), %.2f× at %lld",
                     small, (long long)bs, large, (long long)bl);
        else
            snprintf(cl[n].verdict, sizeof cl[n].verdict, "**does not show here** (%.2f× vs %.2f×)", small, large);
    }
    n++;
    /* 8, 9. decoding: split-KV and the paged cache */
    n += report_kvcache_claims(D, cl + n);
    free(both.v);
    *ncl = n;
    return n;
}

