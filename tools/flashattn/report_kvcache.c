/* flashattn report: the decoding section (docs/kvcache.md). Measures fa_forward_kvcache on one device with the
 * calls of `flashattn bench --mode kvcache` (kv_bench_*), the shapes of a claim interleaved, for two claims: split-KV
 * (FlashDecoding) pays off when the batch leaves the processors idle, and a paged cache (PagedAttention) keeps the
 * speed of a contiguous one while a contiguous max-length allocation wastes memory on ragged lengths. */
#include "report.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The shapes of one device: the batch that leaves workers idle (1) and one that fills them; cache lengths by preset. */
static void kvcache_plan(const report *R, fa_backend dev, int threads, int64_t *cache, int64_t batch[2], int64_t *hq,
                        int64_t *hk) {
    const int cuda = dev == FA_BACKEND_CUDA, smoke = strcmp(R->p.name, "smoke") == 0, full = strcmp(R->p.name, "full") == 0;
    *cache = smoke ? 1024 : cuda || full ? 32768 : 8192;
    batch[0] = 1;
    batch[1] = cuda ? 64 : 2 * (threads > 1 ? threads : 1); /* CPU: one work item per sequence and split */
    *hq = cuda ? 32 : 8;
    *hk = 8;
}

static void push(dev_data *D, const kv_shape *s, const kv_result *r, double others) {
    if (D->n_kv >= (int)(sizeof D->kv / sizeof D->kv[0])) return;
    D->kv[D->n_kv].s = *s;
    D->kv[D->n_kv].r = *r;
    D->kv[D->n_kv].others = others;
    D->n_kv++;
}

/* The shapes of one claim measured together (at most KV_GROUP): every round calls each of them once, the order
 * rotating, so that a ratio between two of them is taken round by round (paired) and the memory bandwidth's drift
 * (a shared VM's moves between runs) cancels. The group is set up anew `allocs` times (at most 8), since where a
 * cache's pages land moves a memory-bound call's speed too (pages of 16 read 0.80–0.94× the contiguous speed over six
 * allocations on a Zen 4 VM), and the times of the allocations pool: res[i].times hold shape i's calls in round order
 * (round k of every shape ran together), alloc_end where each allocation's rounds end, res[i].ms and its interval
 * their median. A failed call ends that shape (its status in res[i]). */
enum { KV_GROUP = 3 };
static void measure_group(report *R, fa_context *ctx, const kv_shape *shapes, int n, int allocs, kv_result *res,
                          double *others) {
    const double until = R->p.until_ci / 2; /* the claims divide two of these medians */
    const int per = BENCH_TIMES_MAX / allocs, reps = shapes[0].reps;
    int nt = 0;
    double busy[KV_GROUP][8];
    memset(res, 0, (size_t)n * sizeof *res); /* status FA_OK until a call fails */
    for (int i = 0; i < n; i++) others[i] = -1;
    for (int a = 0; a < allocs; a++) {
        kv_bench kb[KV_GROUP];
        int ok[KV_GROUP];
        for (int i = 0; i < n; i++) {
            kv_result open;
            const int opened = kv_bench_open(ctx, &shapes[i], &kb[i], &open) == 0;
            if (a == 0 || !opened) { /* the key and row counts; or why it could not be set up */
                const fa_status st = res[i].status;
                memcpy(res[i].paged_rows, open.paged_rows, sizeof open.paged_rows);
                res[i].keys = open.keys, res[i].contiguous_rows = open.contiguous_rows;
                res[i].status = opened ? st : open.status;
                if (!opened) snprintf(res[i].error, sizeof res[i].error, "%s", open.error);
            }
            ok[i] = opened && res[i].status == FA_OK;
        }
        report_point_begin(R);
        for (int w = 0; w <= shapes[0].warmup; w++) /* warm-up; the last call names the kernel, or the failure */
            for (int i = 0; i < n; i++) {
                if (!ok[i]) continue;
                const fa_status st = kv_bench_call(ctx, &kb[i], NULL, NULL);
                fa_stats stats;
                if (st != FA_OK) {
                    ok[i] = 0, res[i].status = st;
                    snprintf(res[i].error, sizeof res[i].error, "%s", fa_context_last_error(ctx));
                } else if (w == shapes[0].warmup && fa_last_stats(ctx, &stats) == FA_OK && stats.kernel) {
                    snprintf(res[i].kernel, sizeof res[i].kernel, "%s", stats.kernel);
                }
            }
        const double t0 = now_ms();
        for (int r = 0; r < per; r++) {
            int enough = r >= reps;
            for (int i = 0; i < n && enough && until > 0; i++)
                enough = !ok[i] || median_settled(res[i].times + nt - r, r, until);
            if (enough && (until <= 0 || r >= reps)) break;
            if (r >= reps && R->p.max_seconds > 0 && now_ms() - t0 >= 1e3 * R->p.max_seconds) break;
            for (int k = 0; k < n; k++) {
                const int i = (k + r) % n;
                double ms = NAN;
                if (ok[i] && kv_bench_call(ctx, &kb[i], &ms, NULL) != FA_OK) {
                    ok[i] = 0, res[i].status = FA_ERR_INTERNAL;
                    snprintf(res[i].error, sizeof res[i].error, "%s", fa_context_last_error(ctx));
                }
                res[i].times[nt] = ms;
            }
            nt++;
        }
        for (int i = 0; i < n; i++) {
            busy[i][a] = -1;
            report_window_row(R, NULL, 0, &busy[i][a]);
        }
        report_window_close(R); /* the busy[] slots live here */
        for (int i = 0; i < n; i++) {
            if (busy[i][a] > others[i]) others[i] = busy[i][a];
            res[i].kv_bytes = kb[i].kv_bytes;
            res[i].alloc_end[a] = nt, res[i].n_allocs = a + 1;
            kv_bench_close(&kb[i]);
        }
    }
    for (int i = 0; i < n; i++) {
        kv_result *x = &res[i];
        x->n_times = x->reps_run = nt;
        if (x->status != FA_OK || nt == 0) continue;
        x->ms = median_of(x->times, nt);
        median_ci(x->times, nt, &x->ci_lo, &x->ci_hi);
        x->gbs = x->kv_bytes / (x->ms * 1e6);
        x->host_ms = x->ms;
    }
}

void report_measure_kvcache(report *R, fa_backend dev, dev_data *D) {
    const int cuda = dev == FA_BACKEND_CUDA;
    char name[64];
    fa_context *ctx = NULL;
    if (fa_context_create(&ctx, dev, cuda ? 0 : R->threads) != FA_OK) return;
    const int threads = cuda ? 0 : fa_context_threads(ctx);
    int64_t cache, batch[2], hq, hk;
    kvcache_plan(R, dev, threads, &cache, batch, &hq, &hk);
    snprintf(name, sizeof name, "kvcache_%s.csv", fa_backend_name(dev));
    FILE *csv = report_csv(R, name, 3);
    const int smoke = strcmp(R->p.name, "smoke") == 0, reps = smoke ? 3 : R->p.reps;
    /* the groups of the two claims: split vs none at batch 1, and at the batch that fills the workers (contiguous,
     * equal lengths); contiguous vs pages of 16 and 256 on ragged lengths at the larger batch */
    kv_shape g[3][KV_GROUP];
    int gn[3] = {2, 2, 3};
    for (int b = 0; b < 2; b++)
        for (int k = 0; k < 2; k++)
            g[b][k] = (kv_shape){dev, FA_DTYPE_BF16, batch[b], cache, 0, hq, hk, 1, 1 - k, 128, 0, 0, reps, 2, 0, 0, 1, 0, 0,
                                 0, 0, 0, 0, 0, 0};
    for (int p = 0; p < 3; p++)
        g[2][p] = (kv_shape){dev, FA_DTYPE_BF16, batch[1], cache, p == 0 ? 0 : p == 1 ? 16 : 256, hq, hk, 1, 0, 128,
                             0, 1, reps, 2, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < 3; j++) {
        char what[96];
        snprintf(what, sizeof what, "kvcache b=%lld cache=%lld %s", (long long)g[j][0].b, (long long)cache,
                 j < 2 ? "splits" : "pages");
        report_progress(R, what);
        kv_result res[KV_GROUP];
        double others[KV_GROUP];
        /* the paged claim's ratio moves most with the allocation (and sits near its 0.9 on some machines): more of them */
        measure_group(R, ctx, g[j], gn[j], smoke ? 1 : j == 2 ? 6 : 2, res, others);
        for (int i = 0; i < gn[j]; i++) {
            const kv_shape *s = &g[j][i];
            push(D, s, &res[i], others[i]);
            if (R->repro)
                fprintf(R->repro, "%s\tbench --mode kvcache --device %s --dtype bf16 --d 128 --batch %lld --seqlen-k %lld "
                                  "--page %lld --heads %lld --heads-k %lld --splits %lld --ragged %d --reps %d --threads %d\n",
                        name, fa_backend_name(dev), (long long)s->b, (long long)s->cache, (long long)s->page,
                        (long long)s->hq, (long long)s->hk, (long long)s->ns, s->ragged, res[i].reps_run, threads);
            if (csv) bench_kvcache_csv_row(csv, s, &res[i]);
        }
        R->work_done += 0.6;
    }
    if (csv) fclose(csv);
    fa_context_destroy(ctx);
}

/* kv_ratio before its floor. */
static double kv_ratio_measured(const kv_row *a, const kv_row *b, double *lo, double *hi) {
    const int n = a->r.n_times, na = a->r.n_allocs;
    if (n <= 0 || n != b->r.n_times || na != b->r.n_allocs)
        return cross_ratio(a->r.ms, a->r.ci_lo, a->r.ci_hi, b->r.ms, b->r.ci_lo, b->r.ci_hi, lo, hi);
    double x[BENCH_TIMES_MAX], m[8];
    for (int k = 0; k < n; k++) x[k] = a->r.times[k] / b->r.times[k];
    median_ci(x, n, lo, hi);
    for (int j = 0, k0 = 0; j < na; k0 = a->r.alloc_end[j++]) m[j] = median_of(x + k0, a->r.alloc_end[j] - k0);
    if (na > 1) {
        double mlo, mhi;
        median_ci(m, na, &mlo, &mhi);
        if (mlo < *lo) *lo = mlo;
        if (mhi > *hi) *hi = mhi;
    }
    return median_of(x, n);
}

/* The least half-width of a decoding ratio's interval, relative: how far one shape's speed moves between allocations,
 * which six of them in one run do not always show (pages of 16 read 0.80–0.94× the contiguous speed over six
 * allocations on the 2-core Zen 4 VM, while another run's six all fell in 0.83–0.88×). */
#define KV_FLOOR 0.08

/* ms(a)/ms(b) of two decoding rows of one group, round by round (paired: measure_group): the median ratio, and an
 * interval that holds the 95 % interval of that median, the one over the allocations' own medians (the allocation,
 * not the call, is what varies most) and ±KV_FLOOR; rows measured apart divide their medians (cross_ratio). */
static double kv_ratio(const kv_row *a, const kv_row *b, double *lo, double *hi) {
    const double r = kv_ratio_measured(a, b, lo, hi);
    if (*lo > r * (1 - KV_FLOOR)) *lo = r * (1 - KV_FLOOR);
    if (*hi < r * (1 + KV_FLOOR)) *hi = r * (1 + KV_FLOOR);
    return r;
}

static const kv_row *find_kv(const dev_data *D, int64_t b, int64_t page, int64_t ns, int ragged) {
    for (int i = 0; i < D->n_kv; i++) {
        const kv_row *x = &D->kv[i];
        if (x->s.b == b && x->s.page == page && x->s.ns == ns && x->s.ragged == ragged && x->r.status == FA_OK) return x;
    }
    return NULL;
}

int report_kvcache_claims(const dev_data *D, claim *cl) {
    if (!D->n_kv) return 0;
    /* the batches as measured: the first row's (1) and the last row's (the one that fills the workers) */
    const kv_shape *s0 = &D->kv[0].s;
    const int64_t batch[2] = {s0->b, D->kv[D->n_kv - 1].s.b};
    const char *dn = fa_backend_name(D->dev);

    /* split-KV */
    cl[0].claim = "split-KV (FlashDecoding) speeds up decoding when the batch leaves the processors idle";
    snprintf(cl[0].measured, sizeof cl[0].measured,
             "fa_forward_kvcache, bf16, d 128, %lld/%lld heads, %lld-key cache, one new row: no split vs the split "
             "heuristic, batch %lld and %lld (%s)",
             (long long)s0->hq, (long long)s0->hk, (long long)s0->cache, (long long)batch[0], (long long)batch[1], dn);
    const kv_row *a1 = find_kv(D, batch[0], 0, 1, 0), *a0 = find_kv(D, batch[0], 0, 0, 0),
                  *b1 = find_kv(D, batch[1], 0, 1, 0), *b0 = find_kv(D, batch[1], 0, 0, 0);
    if (a1 && a0 && b1 && b0) {
        double s_lo, s_hi, l_lo, l_hi;
        const double small = kv_ratio(a1, a0, &s_lo, &s_hi), large = kv_ratio(b1, b0, &l_lo, &l_hi);
        snprintf(cl[0].result, sizeof cl[0].result,
                 "batch %lld: %.2f → %.2f GB/s of K+V with splits (%.2f×, 95 %% interval %.2f–%.2f×); batch %lld: "
                 "%.2f → %.2f GB/s (%.2f×, %.2f–%.2f×)",
                 (long long)batch[0], a1->r.gbs, a0->r.gbs, small, s_lo, s_hi, (long long)batch[1], b1->r.gbs,
                 b0->r.gbs, large, l_lo, l_hi);
        /* it holds when splitting pays at least 1.3× at batch 1 */
        const verdict_kind k_lo = s_lo >= 1.3 ? V_HOLDS : V_DOES_NOT_HOLD, k_hi = s_hi >= 1.3 ? V_HOLDS : V_DOES_NOT_HOLD;
        cl[0].kind = k_lo == k_hi ? k_lo : V_NOT_SETTLED;
        const int busy = row_disturbed(a1->others) + row_disturbed(a0->others);
        if (busy)
            claim_disturbed(&cl[0], busy, 2);
        else if (cl[0].kind == V_NOT_SETTLED)
            snprintf(cl[0].verdict, sizeof cl[0].verdict,
                     "**not settled**: *does not hold* or *holds* within the measurements' 95 %% intervals (splitting "
                     "gives %.2f–%.2f× at batch %lld; it holds from 1.3×)", s_lo, s_hi, (long long)batch[0]);
        else if (small >= 1.3 && large < 1.15 && large > 0.85 && cl[0].kind == V_HOLDS)
            snprintf(cl[0].verdict, sizeof cl[0].verdict,
                     "**holds here**: splitting pays %.2f× at batch %lld; at batch %lld the heuristic leaves it alone "
                     "(%.2f×)", small, (long long)batch[0], (long long)batch[1], large);
        else if (cl[0].kind == V_HOLDS)
            snprintf(cl[0].verdict, sizeof cl[0].verdict, "**holds here** at batch %lld (%.2f×, 95 %% interval %.2f–%.2f×); "
                     "batch %lld: %.2f×", (long long)batch[0], small, s_lo, s_hi, (long long)batch[1], large);
        else
            snprintf(cl[0].verdict, sizeof cl[0].verdict,
                     "**does not hold here** (%.2f× at batch %lld, 95 %% interval %.2f–%.2f×): one sequence already "
                     "fills this device", small, (long long)batch[0], s_lo, s_hi);
    } else {
        cl[0].kind = V_NOT_MEASURED;
        snprintf(cl[0].result, sizeof cl[0].result, "-");
        snprintf(cl[0].verdict, sizeof cl[0].verdict, "not measured (a fa_forward_kvcache call failed)");
    }

    /* paged cache */
    cl[1].claim = "a paged KV cache (PagedAttention) keeps the speed of a contiguous one and saves the memory a "
                  "max-length allocation wastes on ragged lengths";
    snprintf(cl[1].measured, sizeof cl[1].measured,
             "the same call at batch %lld, lengths drawn in [%lld/2, %lld]: pages of 16 and 256 vs contiguous; cache "
             "rows allocated vs used (%s)",
             (long long)batch[1], (long long)s0->cache, (long long)s0->cache, dn);
    const kv_row *c = find_kv(D, batch[1], 0, 0, 1), *p16 = find_kv(D, batch[1], 16, 0, 1),
                  *p256 = find_kv(D, batch[1], 256, 0, 1);
    if (c && p16 && p256) {
        double lo16, hi16, lo256, hi256;
        const double r16 = kv_ratio(c, p16, &lo16, &hi16), r256 = kv_ratio(c, p256, &lo256, &hi256), used = (double)c->r.keys;
        const double w_c = 1 - used / (double)c->r.contiguous_rows, w16 = 1 - used / (double)c->r.paged_rows[0],
                     w256 = 1 - used / (double)c->r.paged_rows[1];
        snprintf(cl[1].result, sizeof cl[1].result,
                 "speed vs contiguous: pages of 16 %.2f× (95 %% interval %.2f–%.2f×), of 256 %.2f× (%.2f–%.2f×); "
                 "memory not holding a key: contiguous max-length %.1f %%, pages of 16 %.2f %%, of 256 %.1f %%",
                 r16, lo16, hi16, r256, lo256, hi256, 100 * w_c, 100 * w16, 100 * w256);
        /* the memory is saved either way (counted); it holds when both page sizes keep 0.9× the contiguous speed */
        const verdict_kind k_lo = lo16 >= 0.9 && lo256 >= 0.9 ? V_HOLDS : V_PARTLY,
                           k_hi = hi16 >= 0.9 && hi256 >= 0.9 ? V_HOLDS : V_PARTLY;
        cl[1].kind = k_lo == k_hi ? k_lo : V_NOT_SETTLED;
        const int busy = row_disturbed(c->others) + row_disturbed(p16->others) + row_disturbed(p256->others);
        if (busy)
            claim_disturbed(&cl[1], busy, 3);
        else if (cl[1].kind == V_NOT_SETTLED)
            snprintf(cl[1].verdict, sizeof cl[1].verdict,
                     "**not settled**: *partly* or *holds* within the measurements' 95 %% intervals (pages of 16: "
                     "%.2f–%.2f×, of 256: %.2f–%.2f× the contiguous speed; it holds from 0.9×)", lo16, hi16, lo256,
                     hi256);
        else if (cl[1].kind == V_HOLDS)
            snprintf(cl[1].verdict, sizeof cl[1].verdict,
                     "**holds here**: ≥ %.2f× the contiguous speed, %.1f %% of a max-length allocation saved",
                     r16 < r256 ? r16 : r256, 100 * (w_c - w16));
        else
            snprintf(cl[1].verdict, sizeof cl[1].verdict,
                     "**partly**: the memory is saved (%.1f %%), but pages cost speed here (%.2f× / %.2f×)",
                     100 * (w_c - w16), r16, r256);
    } else {
        cl[1].kind = V_NOT_MEASURED;
        snprintf(cl[1].result, sizeof cl[1].result, "-");
        snprintf(cl[1].verdict, sizeof cl[1].verdict, "not measured (a fa_forward_kvcache call failed)");
    }
    return 2;
}

void report_md_kvcache(FILE *f, const dev_data *D) {
    if (!D->n_kv) return;
    fprintf(f, "\n## KV-cache decoding (%s)\n\n`fa_forward_kvcache` as `flashattn bench --mode kvcache` measures it (the call "
               "includes the append of the new row; GB/s counts K and V once per K/V head; docs/kvcache.md). splits "
               "1 = no split, auto = the heuristic; ragged: lengths drawn in [seqlen_k/2, seqlen_k].\n\n",
            fa_backend_name(D->dev));
    fprintf(f, "| batch | seqlen_k | heads q/k | page | splits | ragged | ms | GB/s K+V | kernel |\n"
               "|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < D->n_kv; i++) {
        const kv_row *x = &D->kv[i];
        if (x->r.status != FA_OK) {
            fprintf(f, "| %lld | %lld | %lld/%lld | %lld | %s | %d | - | - | %s |\n", (long long)x->s.b,
                    (long long)x->s.cache, (long long)x->s.hq, (long long)x->s.hk, (long long)x->s.page,
                    x->s.ns ? "1" : "auto", x->s.ragged, fa_status_string(x->r.status));
            continue;
        }
        fprintf(f, "| %lld | %lld | %lld/%lld | %lld | %s | %d | %.3f | %.2f | %s |\n", (long long)x->s.b,
                (long long)x->s.cache, (long long)x->s.hq, (long long)x->s.hk, (long long)x->s.page,
                x->s.ns ? "1" : "auto", x->s.ragged, x->r.ms, x->r.gbs, x->r.kernel);
    }
}
