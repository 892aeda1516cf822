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

const char *verdict_word(verdict_kind k) {
    static const char *const w[] = {"not measured", "does not hold", "partly", "depends", "holds", "not settled"};
    return w[k];
}

/* The kind both ends of the intervals give, or NOT_SETTLED (the verdict rules are monotone in the measurements,
 * so their lower and their upper ends give the two extreme kinds). */
static verdict_kind settle(verdict_kind at_lo, verdict_kind at_hi) { return at_lo == at_hi ? at_lo : V_NOT_SETTLED; }

/* "**not settled**: between *A* and *B* within the 95 % intervals (why)" */
static void unsettled(claim *c, verdict_kind a, verdict_kind b, const char *why) {
    snprintf(c->verdict, sizeof c->verdict, "**not settled**: *%s* or *%s* within the measurements' 95 %% intervals (%s)",
             verdict_word(a), verdict_word(b), why);
}

int paired_ratio(const bench_row *slow, const bench_row *fast, double *r, double *lo, double *hi) {
    const int n = slow->n_times < fast->n_times ? slow->n_times : fast->n_times;
    if (!slow->ok || !fast->ok || n <= 0) return 0;
    double x[BENCH_TIMES_MAX];
    for (int k = 0; k < n; k++) x[k] = slow->times[k] / fast->times[k];
    *r = median_of(x, n);
    median_ci(x, n, lo, hi);
    return 1;
}

typedef struct ratio_set {
    int n;
    double r[512], lo[512], hi[512];
    int64_t d[512], seqlen[512], bh[512];
    int causal[512], bwd[512];
    int busy[512]; /* either row was measured while other processes kept the CPUs busy (row_disturbed) */
} ratio_set;

/* The paired ms(slow)/ms(fast) ratio, with its 95 % interval, of every configuration of rs where both ran. */
static void collect(const rows_t *rs, fa_algo slow, fa_algo fast, ratio_set *out) {
    out->n = 0;
    for (int i = 0; i < rs->n && out->n < 512; i++) {
        const bench_row *f = &rs->v[i];
        if (f->algo != fast || !f->ok) continue;
        const bench_config *c = &f->cfg;
        const bench_row *s = find_row(rs, slow, c->head_dim, c->seqlen_q, c->causal, c->backward, c->heads, c->block_q,
                                  c->block_k);
        if (!s || !s->ok) continue;
        int k = out->n;
        if (!paired_ratio(s, f, &out->r[k], &out->lo[k], &out->hi[k])) continue;
        out->busy[k] = row_disturbed(rs->others[i]) || row_disturbed(rs->others[s - rs->v]);
        out->n++;
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

/* The value of setting dimension dim (pass, causal, head_dim, seqlen, batch × heads) of ratio i. */
static int64_t dim_value(const ratio_set *s, int dim, int i) {
    return dim == 0 ? s->bwd[i] : dim == 1 ? s->causal[i] : dim == 2 ? s->d[i] : dim == 3 ? s->seqlen[i] : s->bh[i];
}

/* The groups a claim may depend on: the settings that share one value of a dimension, at least a quarter of them
 * (and 4), so that a group's median is as steady as the whole's. The largest group median of x (the ratios, or
 * their intervals' lower or upper ends); its group named in what ("pass fwd"). NAN when no group qualifies. */
static double best_group(const ratio_set *s, const double *x, char *what, size_t len) {
    static const char *const names[5] = {"pass", "causal", "head_dim", "seqlen", "batch×heads"};
    const int least = s->n / 4 > 4 ? (s->n + 3) / 4 : 4;
    double best = NAN;
    if (what) what[0] = 0;
    for (int dim = 0; dim < 5; dim++)
        for (int i = 0; i < s->n; i++) {
            const int64_t v = dim_value(s, dim, i);
            int first = 1;
            for (int j = 0; j < i && first; j++) first = dim_value(s, dim, j) != v;
            if (!first) continue; /* each value once, at its first setting */
            double g[512];
            int m = 0;
            for (int j = 0; j < s->n; j++)
                if (dim_value(s, dim, j) == v) g[m++] = x[j];
            if (m < least || m == s->n) continue;
            const double med = median_n(g, m);
            if (isnan(best) || med > best) {
                best = med;
                if (what) {
                    if (dim == 0) snprintf(what, len, "pass %s", v ? "bwd" : "fwd");
                    else if (dim == 1) snprintf(what, len, "%s", v ? "causal" : "not causal");
                    else snprintf(what, len, "%s %lld", names[dim], (long long)v);
                }
            }
        }
    return best;
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


/* The kind of a speed claim "at least T×" from the median ratio over all settings and the largest median of a group
 * of them (best_group): the median at T or above holds; else a group at T makes it depend on that setting. Medians,
 * not a count of settings at T: a count near its threshold would flip with every run. */
static verdict_kind speed_kind(double med, double group, double t) {
    return med >= t ? V_HOLDS : group >= t ? V_DEPENDS : V_DOES_NOT_HOLD;
}

/* The settings of `all` measured on a quiet machine; how many were not. */
static int quiet_only(const ratio_set *all, ratio_set *out) {
    int busy = 0;
    out->n = 0;
    for (int i = 0; i < all->n; i++) {
        if (all->busy[i]) {
            busy++;
            continue;
        }
        const int k = out->n++;
        out->r[k] = all->r[i], out->lo[k] = all->lo[i], out->hi[k] = all->hi[i], out->d[k] = all->d[i];
        out->seqlen[k] = all->seqlen[i], out->bh[k] = all->bh[i], out->causal[k] = all->causal[i];
        out->bwd[k] = all->bwd[i], out->busy[k] = 0;
    }
    return busy;
}

/* "A is X–Y× faster than B": ratios ms(B)/ms(A), each with its 95 % interval, over the settings measured on a quiet
 * machine (not settled when more than a quarter were not). */
static void speed_claim(claim *c, const ratio_set *all, double lo_claim, double hi_claim, const char *fast,
                        const char *slow, const char *where) {
    ratio_set q;
    const int busy = quiet_only(all, &q);
    const ratio_set *s = &q;
    if (busy && 4 * busy > all->n) {
        snprintf(c->result, sizeof c->result, "%d of %d settings measured while other processes kept the CPUs busy",
                 busy, all->n);
        claim_disturbed(c, busy, all->n);
        return;
    }
    if (s->n == 0) {
        snprintf(c->result, sizeof c->result, "no configuration where both %s and %s ran", fast, slow);
        snprintf(c->verdict, sizeof c->verdict, "not measured here");
        c->kind = V_NOT_MEASURED;
        return;
    }
    /* the median over the settings at the intervals' lower ends, at the point estimates and at the upper ends */
    const double med = median_n(s->r, s->n), med_lo = median_n(s->lo, s->n), med_hi = median_n(s->hi, s->n);
    double lo, hi;
    minmax(s->r, s->n, &lo, &hi);
    int in = 0, in_lo = 0, in_hi = 0;
    for (int i = 0; i < s->n; i++) in += s->r[i] >= lo_claim, in_lo += s->lo[i] >= lo_claim, in_hi += s->hi[i] >= lo_claim;
    char why[400];
    explain(s, why, sizeof why);
    char count[64];
    if (in_lo == in_hi) snprintf(count, sizeof count, "%d", in);
    else snprintf(count, sizeof count, "%d (%d–%d within the intervals)", in, in_lo, in_hi);
    snprintf(c->result, sizeof c->result,
             "%s/%s speed ratio over %d settings (%s): median %.2f× (95 %% interval %.2f–%.2f×), range %.2f–%.2f×; "
             "≥ %.1f× in %s of %d%s%s",
             fast, slow, s->n, where, med, med_lo, med_hi, lo, hi, lo_claim, count, s->n, why[0] ? "; by " : "", why);
    if (busy) {
        const size_t l = strlen(c->result);
        snprintf(c->result + l, sizeof c->result - l, " (%d more left out: measured while other processes were busy)",
                 busy);
    }
    char grp[64], grp_lo[64], grp_hi[64];
    const double g = best_group(s, s->r, grp, sizeof grp), g_lo = best_group(s, s->lo, grp_lo, sizeof grp_lo),
                 g_hi = best_group(s, s->hi, grp_hi, sizeof grp_hi);
    if (!isnan(g)) {
        const size_t l = strlen(c->result);
        snprintf(c->result + l, sizeof c->result - l, "; the fastest group of settings: %s, median %.2f× (%.2f–%.2f×)",
                 grp, g, g_lo, g_hi);
    }
    const verdict_kind k_lo = speed_kind(med_lo, g_lo, lo_claim), k_hi = speed_kind(med_hi, g_hi, lo_claim);
    c->kind = settle(k_lo, k_hi);
    char spread[96];
    snprintf(spread, sizeof spread, "median %.2f×, 95 %% interval %.2f–%.2f×", med, med_lo, med_hi);
    if (c->kind == V_NOT_SETTLED) {
        char d[300];
        if (med_lo < lo_claim && med_hi >= lo_claim)
            snprintf(d, sizeof d, "%s, around the claimed %.1f×", spread, lo_claim);
        else
            snprintf(d, sizeof d, "%s; the best group of settings, %s, at %.2f× (%.2f–%.2f×), around the claimed %.1f×",
                     spread, grp, g, g_lo, g_hi, lo_claim);
        unsettled(c, k_lo, k_hi, d);
    } else if (c->kind == V_HOLDS)
        snprintf(c->verdict, sizeof c->verdict, "**holds here** (%s%s)", spread,
                 med_lo > hi_claim ? ", above the claimed range" : "");
    else if (c->kind == V_DEPENDS)
        snprintf(c->verdict, sizeof c->verdict,
                 "**depends** on the setting: %s reaches it (median %.2f×, 95 %% interval %.2f–%.2f×), all %d settings "
                 "do not (%s)", grp, g, g_lo, g_hi, s->n, spread);
    else if (in > 0) {
        char where_ok[200] = "";
        size_t o = 0;
        for (int i = 0, k = 0; i < s->n && k < 3; i++)
            if (s->r[i] >= lo_claim)
                o += (size_t)snprintf(where_ok + o, sizeof where_ok - o, "%sd=%lld N=%lld B×H=%lld %s%s: %.2f×",
                                      k++ ? "; " : "", (long long)s->d[i], (long long)s->seqlen[i], (long long)s->bh[i],
                                      s->bwd[i] ? "bwd" : "fwd", s->causal[i] ? " causal" : "", s->r[i]);
        snprintf(c->verdict, sizeof c->verdict,
                 "**does not hold here** in general (%s): ≥ %.1f× only in %s of %d settings (%s)", spread, lo_claim,
                 count, s->n, where_ok);
    } else if (med >= 1.05)
        snprintf(c->verdict, sizeof c->verdict, "**does not hold here**: %s is faster, but by %.2f× (%s), not %.1f–%.0f×",
                 fast, med, spread, lo_claim, hi_claim);
    else
        snprintf(c->verdict, sizeof c->verdict, "**does not hold here**: %s is not faster than %s (%s)", fast, slow,
                 spread);
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

/* The kind of the tile claim at a speed ratio sp (the fastest overflowing tile over the fastest fitting one):
 * counted traffic that does not fall as 1/M fails it; otherwise an overflowing tile below 0.9× is slower (holds),
 * above 1.1× faster (the speed is not bounded by the fast memory: depends), in between as fast (partly). */
static verdict_kind tile_kind(int fit, int big, int have_io, int io_ok, double sp) {
    if (!fit) return V_NOT_MEASURED;
    if (have_io && !io_ok) return V_DOES_NOT_HOLD;
    if (!big || (sp >= 0.9 && sp <= 1.1)) return V_PARTLY;
    return sp < 0.9 ? V_HOLDS : V_DEPENDS;
}

/* How much faster STANDARD must be than the faster flash algorithm to count as faster (claim 6). */
#define SHORT_WIN 1.05

/* The kind of "standard may be faster at short sequences" when it won `wins` of `tot` settings. */
static verdict_kind short_kind(int wins, int tot) {
    return !tot ? V_NOT_MEASURED : wins == tot ? V_HOLDS : wins > 0 ? V_DEPENDS : V_DOES_NOT_HOLD;
}

/* The kind of "FLASH2's sequence parallelism matters at small batch × heads" from its advantage at the fewest (small)
 * and the most (large) heads: it holds when the first exceeds 1.2× and 1.2× the second. */
static verdict_kind par_kind(double small, double large) {
    return small > 1.2 * large && small > 1.2 ? V_HOLDS : V_DOES_NOT_HOLD;
}

/* A timed CPU claim whose measurements ran while the speed probe took readings [from, to): probe_verdict (probe.c).
 * The probe reads the CPU only, so GPU claims keep their verdicts. */
static void with_probe(const report *R, const dev_data *D, claim *c, int from, int to) {
    if (D->dev != FA_BACKEND_CPU) return;
    probe_span sp;
    probe_range(&R->probe, from, to, quiet_threshold(), &sp);
    probe_verdict(c, &sp, R->probe.bound);
}

/* Fast-memory working set of one FLASH2 step (fp32): Qi, Kj, Vj, S/P, Oi. */
double tile_bytes(int br, int bc, int d) { return 4.0 * ((double)br * d * 2 + 2.0 * bc * d + (double)br * bc); }

int build_claims(report *R, const dev_data *D, claim *cl, int *ncl) {
    int n = 0;
    ratio_set s;
    const char *dn = fa_backend_name(D->dev);
    memset(cl, 0, FA_REPORT_MAX_CLAIMS * sizeof *cl);
    char where[128];
    snprintf(where, sizeof where, "%s, speed vs seqlen and batch×heads", dn);

    /* 1. V2 is 1.5–2× V1 */
    rows_t both = {0};
    for (int i = 0; i < D->speed.n; i++) rows_push(&both, &D->speed.v[i], D->speed.others[i]);
    for (int i = 0; i < D->par.n; i++) rows_push(&both, &D->par.v[i], D->par.others[i]);
    cl[n].claim = "FlashAttention-2 is 1.5–2× faster than FlashAttention-1";
    snprintf(cl[n].measured, sizeof cl[n].measured, "median time of FLASH1 / FLASH2, same inputs, interleaved (%s)", dn);
    collect(&both, FA_ALGO_FLASH1, FA_ALGO_FLASH2, &s);
    speed_claim(&cl[n], &s, 1.5, 2.0, "FLASH2", "FLASH1", where);
    with_probe(R, D, &cl[n], D->speed.probe_from, D->par.probe_to); /* speed, then par: one stretch */
    n++;

    /* 2. V1 is 2–4× standard */
    cl[n].claim = "FlashAttention(-1) is 2–4× faster than standard attention";
    snprintf(cl[n].measured, sizeof cl[n].measured, "median time of STANDARD / FLASH1 (%s)", dn);
    collect(&both, FA_ALGO_STANDARD, FA_ALGO_FLASH1, &s);
    speed_claim(&cl[n], &s, 2.0, 4.0, "FLASH1", "STANDARD", where);
    with_probe(R, D, &cl[n], D->speed.probe_from, D->par.probe_to);
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
        /* counted bytes: exact, so the verdict needs no interval */
        int quad = sl[1] >= 1.7, lin = sl[2] <= 1.2 && sl[3] <= 1.2;
        cl[n].kind = isnan(sl[1]) || isnan(sl[3]) ? V_NOT_MEASURED : quad && lin ? V_HOLDS : lin ? V_PARTLY : V_DOES_NOT_HOLD;
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
        cl[n].kind = m == 0 ? V_NOT_MEASURED : med >= 1.8 ? V_HOLDS : med > 1.05 ? V_PARTLY : V_DOES_NOT_HOLD;
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
        const double mm0 = m ? median_n(meas, m) : 0;
        cl[n].kind = !m ? V_NOT_MEASURED : mm0 >= 1.8 ? V_HOLDS : mm0 > 1.05 ? V_PARTLY : V_DOES_NOT_HOLD;
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
        /* the fastest FLASH2 tile (by median) whose working set fits the fast memory, and the fastest that does not */
        const bench_row *fit = NULL, *big = NULL;
        int n_unsup = 0, n_tiles = 0, n_busy = 0;
        for (int i = 0; i < D->blocks.n; i++) {
            const bench_row *r = &D->blocks.v[i];
            if (r->algo != FA_ALGO_FLASH2) continue;
            if (!r->ok) {
                n_unsup++;
                continue;
            }
            n_tiles++;
            if (row_disturbed(D->blocks.others[i])) { /* left out: measured while other processes were busy */
                n_busy++;
                continue;
            }
            const bench_row **slot = tile_bytes(r->block_q, r->block_k, 64) <= fast ? &fit : &big;
            if (!*slot || r->gflops > (*slot)->gflops) *slot = r;
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
                 "FLASH2 speed vs (Br, Bc), d 64 (%s): the fastest tile that fits the %s against the fastest that "
                 "does not; FLASH1 counted bytes vs M with the paper's blocks",
                 dn, fname);
        const int cuda = D->dev == FA_BACKEND_CUDA;
        const char *unit = cuda ? "TFLOP/s" : "GFLOP/s";
        const double us = cuda ? 1e-3 : 1;
        size_t o = 0;
        /* speed of the fastest overflowing tile over the fastest fitting one, with its interval (different commands:
         * cross_ratio) */
        double sp = NAN, sp_lo = NAN, sp_hi = NAN;
        if (fit)
            o += (size_t)snprintf(cl[n].result + o, sizeof cl[n].result - o,
                                  "fastest tile that fits the %s (%.0f KiB): Br×Bc = %d×%d, %.1f %s (working set %.0f KiB)",
                                  fname, fast / 1024, fit->block_q, fit->block_k, fit->gflops * us, unit,
                                  tile_bytes(fit->block_q, fit->block_k, 64) / 1024);
        if (big)
            o += (size_t)snprintf(cl[n].result + o, sizeof cl[n].result - o,
                                  "%sfastest that overflows it: %d×%d, %.1f %s (%.0f KiB)", o ? "; " : "", big->block_q,
                                  big->block_k, big->gflops * us, unit, tile_bytes(big->block_q, big->block_k, 64) / 1024);
        if (fit && big) {
            sp = cross_ratio(fit->ms, fit->ci_lo, fit->ci_hi, big->ms, big->ci_lo, big->ci_hi, &sp_lo, &sp_hi);
            o += (size_t)snprintf(cl[n].result + o, sizeof cl[n].result - o,
                                  ", %.2f× the fitting one's speed (95 %% interval %.2f–%.2f×)", sp, sp_lo, sp_hi);
        }
        if (n_unsup && o < sizeof cl[n].result)
            o += (size_t)snprintf(cl[n].result + o, sizeof cl[n].result - o, "; %d tile shapes refused by the backend",
                                  n_unsup);
        if (!isnan(slope) && o < sizeof cl[n].result)
            snprintf(cl[n].result + o, sizeof cl[n].result - o, "; CPU FLASH1 bytes ∝ M^%.2f (paper: M^-1)", slope);
        const int have_io = !isnan(slope), io_ok = have_io && slope < -0.7 && slope > -1.3;
        /* the counted traffic is exact; the speed comparison has an interval: the overflowing tile below 0.9× of the
         * fitting one's speed is slower (holds), above 1.1× faster (the speed is not bounded by it), between as fast */
        const verdict_kind k_lo = tile_kind(fit != NULL, big != NULL, have_io, io_ok, sp_lo),
                           k_hi = tile_kind(fit != NULL, big != NULL, have_io, io_ok, sp_hi);
        cl[n].kind = settle(k_lo, k_hi);
        char spread[96] = "";
        if (fit && big) snprintf(spread, sizeof spread, " (%.2f×, 95 %% interval %.2f–%.2f×)", sp, sp_lo, sp_hi);
        if (n_busy && 4 * n_busy > n_tiles)
            claim_disturbed(&cl[n], n_busy, n_tiles);
        else if (cl[n].kind == V_NOT_SETTLED) {
            char d[200];
            snprintf(d, sizeof d, "the fastest overflowing tile runs at %.2f–%.2f× the fastest fitting one's speed; "
                                  "below 0.9× it is slower, above 1.1× faster", sp_lo, sp_hi);
            unsettled(&cl[n], k_lo, k_hi, d);
        } else if (cl[n].kind == V_NOT_MEASURED)
            snprintf(cl[n].verdict, sizeof cl[n].verdict, "not measured (no FLASH2 tile that fits the %s ran)", fname);
        else if (cl[n].kind == V_DOES_NOT_HOLD)
            snprintf(cl[n].verdict, sizeof cl[n].verdict, "**does not hold here** as measured: traffic ∝ M^%.2f", slope);
        else if (cl[n].kind == V_HOLDS)
            snprintf(cl[n].verdict, sizeof cl[n].verdict, "**holds here**: %stiles that overflow the %s run slower%s",
                     io_ok ? "traffic falls as 1/M, and " : "", fname, spread);
        else if (cl[n].kind == V_DEPENDS)
            snprintf(cl[n].verdict, sizeof cl[n].verdict,
                     "**depends**: %sbut speed is not limited by the %s here: a tile that overflows it is faster%s",
                     io_ok ? "traffic falls as 1/M, " : "", fname, spread);
        else
            snprintf(cl[n].verdict, sizeof cl[n].verdict, "**partly**: %s%s%s", io_ok ? "traffic falls as 1/M; " : "",
                     big ? "tiles that overflow the fast memory were as fast here"
                     : n_unsup ? "the backend builds no tile that overflows it (larger ones are refused)"
                               : "no swept tile overflowed it",
                     spread);
    }
    with_probe(R, D, &cl[n], D->blocks.probe_from, D->blocks.probe_to);
    n++;

    /* 6. at 512 tokens standard may be faster */
    cl[n].claim = "at short sequences (≤ 512) standard attention may be faster";
    snprintf(cl[n].measured, sizeof cl[n].measured, "STANDARD vs the faster of FLASH1/FLASH2 at N ≤ 512 (%s)", dn);
    {
        /* per setting the paired ratio flash/STANDARD (> 1: STANDARD faster) with its interval: a win when STANDARD
         * is faster by more than 5 % (a tie is no win, and cannot unsettle the verdict), a loss, or either within the
         * interval */
        int tot = 0, wins = 0, wins_lo = 0, wins_hi = 0, n_busy = 0;
        double best_ratio = 0, worst_ratio = INFINITY;
        char list[256] = "";
        size_t o = 0;
        for (int i = 0; i < D->speed.n; i++) {
            const bench_row *s = &D->speed.v[i];
            if (s->algo != FA_ALGO_STANDARD || !s->ok || s->cfg.seqlen_q > 512) continue;
            const bench_config *c = &s->cfg;
            const bench_row *f1 = find_row(&D->speed, FA_ALGO_FLASH1, c->head_dim, c->seqlen_q, c->causal, c->backward, c->heads, -1, -1);
            const bench_row *f2 = find_row(&D->speed, FA_ALGO_FLASH2, c->head_dim, c->seqlen_q, c->causal, c->backward, c->heads, -1, -1);
            const bench_row *f = f1 && f1->ok && (!f2 || !f2->ok || f1->ms < f2->ms) ? f1 : f2 && f2->ok ? f2 : NULL;
            double r, lo, hi;
            if (!f || !paired_ratio(f, s, &r, &lo, &hi)) continue;
            if (row_disturbed(D->speed.others[i]) || row_disturbed(D->speed.others[f - D->speed.v])) {
                n_busy++; /* left out: measured while other processes were busy */
                continue;
            }
            tot++;
            if (r > best_ratio) best_ratio = r;
            if (r < worst_ratio) worst_ratio = r;
            wins_lo += lo > SHORT_WIN, wins_hi += hi > SHORT_WIN;
            if (r > SHORT_WIN) {
                wins++;
                if (o < sizeof list - 64)
                    o += (size_t)snprintf(list + o, sizeof list - o, "%sd=%lld N=%lld %s%s: %.2f×", wins > 1 ? "; " : "",
                                          (long long)c->head_dim, (long long)c->seqlen_q, c->backward ? "bwd" : "fwd",
                                          c->causal ? " causal" : "", r);
            }
        }
        snprintf(cl[n].result, sizeof cl[n].result,
                 "STANDARD was the fastest, by more than 5 %%, in %d of %d settings with N ≤ 512 (%d–%d within the 95 %% "
                 "intervals)%s%s%s; "
                 "its time relative to the best flash: %.2f–%.2f×",
                 wins, tot, wins_lo, wins_hi, wins ? " (" : "", list, wins ? ")" : "",
                 worst_ratio > 0 ? 1 / best_ratio : NAN, 1 / worst_ratio);
        const verdict_kind k_lo = short_kind(wins_lo, tot), k_hi = short_kind(wins_hi, tot);
        cl[n].kind = settle(k_lo, k_hi);
        if (n_busy && 4 * n_busy > n_busy + tot)
            claim_disturbed(&cl[n], n_busy, n_busy + tot);
        else if (cl[n].kind == V_NOT_SETTLED) {
            char d[160];
            snprintf(d, sizeof d, "STANDARD faster in %d–%d of %d settings", wins_lo, wins_hi, tot);
            unsettled(&cl[n], k_lo, k_hi, d);
        } else if (!tot) snprintf(cl[n].verdict, sizeof cl[n].verdict, "not measured (no N ≤ 512 in this preset)");
        else if (cl[n].kind == V_HOLDS) snprintf(cl[n].verdict, sizeof cl[n].verdict, "**holds here** in every short setting");
        else if (cl[n].kind == V_DEPENDS)
            snprintf(cl[n].verdict, sizeof cl[n].verdict, "**depends**: in %d of %d settings (%d–%d within the intervals)",
                     wins, tot, wins_lo, wins_hi);
        else
            snprintf(cl[n].verdict, sizeof cl[n].verdict,
                     "**does not hold here**: STANDARD was not faster by more than 5 %% in any of the %d, beyond the "
                     "95 %% intervals", tot);
    }
    with_probe(R, D, &cl[n], D->speed.probe_from, D->speed.probe_to);
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
        /* forward only for the headline: the smallest and the largest batch × heads */
        int is = -1, il = -1;
        for (int i = 0; i < s.n; i++)
            if (s.bwd[i] == 0) {
                if (is < 0 || s.bh[i] < s.bh[is]) is = i;
                if (il < 0 || s.bh[i] > s.bh[il]) il = i;
            }
        char why[400];
        explain(&s, why, sizeof why);
        if (is < 0 || il < 0) {
            snprintf(cl[n].result, sizeof cl[n].result, "-");
            snprintf(cl[n].verdict, sizeof cl[n].verdict, "not measured");
            cl[n].kind = V_NOT_MEASURED;
        } else {
            const double small = s.r[is], large = s.r[il];
            snprintf(cl[n].result, sizeof cl[n].result,
                     "forward: FLASH2 is %.2f× FLASH1 (95 %% interval %.2f–%.2f×) at batch×heads = %lld, %.2f× "
                     "(%.2f–%.2f×) at %lld%s%s",
                     small, s.lo[is], s.hi[is], (long long)s.bh[is], large, s.lo[il], s.hi[il], (long long)s.bh[il],
                     why[0] ? "; by " : "", why);
            const verdict_kind k_lo = par_kind(s.lo[is], s.hi[il]), k_hi = par_kind(s.hi[is], s.lo[il]);
            cl[n].kind = settle(k_lo, k_hi);
            if (s.busy[is] || s.busy[il])
                claim_disturbed(&cl[n], s.busy[is] + s.busy[il], 2);
            else if (cl[n].kind == V_NOT_SETTLED) {
                char d[200];
                snprintf(d, sizeof d, "%.2f–%.2f× at %lld head(s) against %.2f–%.2f× at %lld; it holds beyond 1.2× the "
                                      "latter", s.lo[is], s.hi[is], (long long)s.bh[is], s.lo[il], s.hi[il],
                         (long long)s.bh[il]);
                unsettled(&cl[n], k_lo, k_hi, d);
            } else if (cl[n].kind == V_HOLDS)
                snprintf(cl[n].verdict, sizeof cl[n].verdict,
                         "**holds here**: FLASH2's advantage is %.2f× (95 %% interval %.2f–%.2f×) at %lld head(s), "
                         "%.2f× (%.2f–%.2f×) at %lld",
                         small, s.lo[is], s.hi[is], (long long)s.bh[is], large, s.lo[il], s.hi[il], (long long)s.bh[il]);
            else
                snprintf(cl[n].verdict, sizeof cl[n].verdict,
                         "**does not hold here** (%.2f× vs %.2f×; 95 %% intervals %.2f–%.2f× and %.2f–%.2f×)", small,
                         large, s.lo[is], s.hi[is], s.lo[il], s.hi[il]);
        }
    }
    with_probe(R, D, &cl[n], D->par.probe_from, D->par.probe_to);
    n++;
    /* 8, 9. decoding: split-KV and the paged cache */
    for (int k = report_kvcache_claims(D, cl + n); k > 0; k--, n++)
        with_probe(R, D, &cl[n], D->kv_probe_from, D->kv_probe_to);

    /* 10 (GPU). V3: the FlashAttention-3 paper reports 1.5–2.0× FlashAttention-2 on an H100 (forward; 1.5–1.75×
     * backward), from Hopper's asynchrony (TMA, wgmma, warp specialisation) */
    if (D->dev == FA_BACKEND_CUDA) {
        cl[n].claim = "FlashAttention-3 is 1.5–2× faster than FlashAttention-2 on Hopper";
        snprintf(cl[n].measured, sizeof cl[n].measured,
                 "median time of FLASH2 / FLASH3, same inputs, interleaved, forward and backward, bf16 (%s)", dn);
        collect(&D->speed, FA_ALGO_FLASH2, FA_ALGO_FLASH3, &s);
        speed_claim(&cl[n], &s, 1.5, 2.0, "FLASH3", "FLASH2", where);
        n++;
    }
    free(both.v);
    free(both.others);
    *ncl = n;
    return n;
}

