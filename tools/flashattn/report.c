/* flashattn report: measure the FlashAttention claims on this machine and write report/index.md with plots.
 *
 * Every number comes from the code paths of `flashattn bench` (bench_run_args) and `flashattn io` (io_run) called
 * with argument strings; each data file's commands are written to reproduce.txt, so `flashattn bench ARGS --csv`
 * gives the same rows (tools/test_report.sh checks this). Every verdict of the claims table is computed from the
 * rows below, none is written in advance. */
#include "peak.h"
#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double load_avg(void) {
    FILE *f = fopen("/proc/loadavg", "r");
    double l = -1;
    if (f) {
        if (fscanf(f, "%lf", &l) != 1) l = -1;
        fclose(f);
    }
    return l;
}

/* ---------------------------------------------------------------------------------------------------------
 * Running bench / io with argument strings
 * ------------------------------------------------------------------------------------------------------- */
typedef struct run_ctx {
    report *R;
    rows_t *dst;
    FILE *csv;
    double work_per_group;
    char label[96];
} run_ctx;

static void on_group(const bench_config *c, void *user) {
    run_ctx *x = user;
    report_point_begin(x->R);
    char what[128];
    snprintf(what, sizeof what, "%s %s d=%lld N=%lld %s%s", x->label, fa_backend_name(c->dev), (long long)c->head_dim,
             (long long)c->seqlen_q, c->backward ? "bwd" : "fwd", c->causal ? " causal" : "");
    report_progress(x->R, what);
}

static void on_row(const bench_row *r, void *user) {
    run_ctx *x = user;
    const int n0 = x->dst->n;
    rows_push(x->dst, r, -1);
    if (x->dst->n > n0) report_window_row(x->R, x->dst, n0, NULL);
    if (x->csv) {
        bench_csv_row(x->csv, r, 1);
        fflush(x->csv);
    }
    x->R->work_done += x->work_per_group;
}

/* Split a command line on spaces (no quoting needed: our arguments have none). */
static int split_args(char *s, char **argv, int max) {
    int n = 0;
    for (char *t = strtok(s, " "); t && n < max; t = strtok(NULL, " ")) argv[n++] = t;
    return n;
}

/* Run `flashattn bench ARGS` (printf-style) into dst and csv; est = estimated work units of the whole command,
 * spread over its rows. */
static void report_bench(report *R, rows_t *dst, FILE *csv, const char *csvname, const char *label, double est, int n_rows,
                  const char *fmt, ...) {
    char args[2048], buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    if (R->threads > 0 && strstr(args, "--device cpu")) {
        size_t l = strlen(args);
        snprintf(args + l, sizeof args - l, " --threads %d", R->threads);
    }
    if (R->repro) fprintf(R->repro, "%s\tbench %s\n", csvname, args);
    snprintf(buf, sizeof buf, "%s", args);
    char *argv[128];
    int argc = split_args(buf, argv, 128);
    run_ctx x = {R, dst, csv, n_rows > 0 ? est / n_rows : 0, ""};
    snprintf(x.label, sizeof x.label, "%s", label);
    bench_sink sink = {NULL, on_group, on_row, NULL, &x};
    double before = R->work_done;
    if (dst->probe_to == 0) dst->probe_from = R->probe.n; /* the reading before its first point */
    int rc = bench_run_args(argc, argv, &sink);
    dst->probe_to = R->probe.n + 1; /* and the next one, after its last point */
    if (rc == CLI_EXIT_USAGE) fprintf(stderr, "flashattn report: internal: bad bench arguments: %s\n", args);
    R->work_done = before + est;
    report_progress(R, label);
}

/* Run `flashattn io ARGS` (without --csv) into dst and csv. */
static void report_io(report *R, io_rows_t *dst, FILE *csv, const char *csvname, double est, const char *fmt, ...) {
    char args[1024], buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    if (R->threads > 0) {
        size_t l = strlen(args);
        snprintf(args + l, sizeof args - l, " --threads %d", R->threads);
    }
    if (R->repro) fprintf(R->repro, "%s\tio %s\n", csvname, args);
    snprintf(buf, sizeof buf, "%s", args);
    char *argv[64];
    int argc = split_args(buf, argv, 64);
    io_config c;
    int_list algos;
    int dummy;
    if (io_parse_args(argc, argv, &c, &algos, &dummy) != 0) {
        fprintf(stderr, "flashattn report: internal: bad io arguments: %s\n", args);
        return;
    }
    fa_context *ctx = NULL;
    if (fa_context_create(&ctx, FA_BACKEND_CPU, (int)c.threads) != FA_OK) return;
    for (int a = 0; a < algos.n; a++) {
        char what[96];
        snprintf(what, sizeof what, "io N=%lld d=%lld %s", (long long)c.seqlen, (long long)c.head_dim,
                 fa_algo_name((fa_algo)algos.v[a]));
        report_progress(R, what);
        io_row r;
        io_run(ctx, &c, (fa_algo)algos.v[a], &r);
        if (io_rows_push(dst, &r)) break;
        if (csv) io_csv_row(csv, &r);
        R->work_done += est / algos.n;
    }
    if (csv) fflush(csv);
    fa_context_destroy(ctx);
}

/* ---------------------------------------------------------------------------------------------------------
 * The plan: what each preset measures
 * ------------------------------------------------------------------------------------------------------- */
static const char *dev_name(fa_backend d) { return fa_backend_name(d); }

/* Rough seconds of a bench command, for the progress bar only. */
static double est_cost(report *R, fa_backend dev, double flops_per_call, int calls) {
    if (dev == FA_BACKEND_CUDA) return 0.03 * calls + flops_per_call * calls / 50e12; /* launch + setup dominate */
    return flops_per_call * calls / R->cpu_rate + 0.002 * calls;
}

static void measure_device(report *R, fa_backend dev, dev_data *D) {
    const preset *P = &R->p;
    int cuda = dev == FA_BACKEND_CUDA;
    const char *dn = dev_name(dev);
    const char *dt = cuda ? "bf16" : "f32";
    char name[64];
    D->dev = dev;
    D->present = 1;

    /* 1. speed vs seqlen: STANDARD, FLASH1, FLASH2 (and FLASH3 on CUDA: rows it refuses, off Hopper, are skipped),
     * fwd and bwd, d 64 and 128, causal and not */
    snprintf(name, sizeof name, "speed_%s.csv", dn);
    FILE *f = report_csv(R, name, 0);
    for (int di = 0; di < 2; di++) {
        int d = di ? 128 : 64;
        int heads = (int)(cuda ? 2048 / d : P->model_dim / d);
        if (heads < 1) heads = 1;
        double fl = 0;
        for (int s = 0; s < P->n_seqlens; s++) fl += 4.0 * (double)P->tokens * P->seqlens[s] * heads * d;
        double est = est_cost(R, dev, fl * 1.5 /*causal half*/ * 3.5 /*fwd + bwd + the bwd's fwd*/, (P->reps + 1) * 3);
        report_bench(R, &D->speed, f, name, "speed", est, P->n_seqlens * (cuda ? 16 : 12),
                     "--device %s --dtype %s --algo standard,flash1,flash2%s --d %d --heads %d --tokens %lld "
                     "--seqlen %s --causal 0,1 --pass fwd,bwd %s",
                     dn, dt, cuda ? ",flash3" : "", d, heads, (long long)(cuda ? 16384 : P->tokens), cuda ? P->gpu_seqlen_list : P->seqlen_list,
                     R->rule);
    }
    if (f) fclose(f);

    /* 2. speed vs batch × heads at a fixed long seqlen (V1 parallelises over batch × heads only) */
    snprintf(name, sizeof name, "parallel_%s.csv", dn);
    f = report_csv(R, name, 0);
    {
        int n = cuda ? 8192 : P->par_seqlen;
        double fl = 0;
        for (int h = 1; h <= P->par_max_heads; h *= 2) fl += 4.0 * n * n * 64 * h;
        report_bench(R, &D->par, f, name, "batch×heads", est_cost(R, dev, fl * 3.5, (P->reps + 1) * 3), 0,
                     "--device %s --dtype %s --algo standard,flash1,flash2 --d 64 --batch 1 --heads %s --seqlen %d "
                     "--pass fwd,bwd %s",
                     dn, dt, cuda ? "1,2,4,8,16,32,64,128" : P->par_heads_list, n, R->rule);
    }
    if (f) fclose(f);

    /* 3. speed (and counted bytes) vs block sizes */
    snprintf(name, sizeof name, "blocks_%s.csv", dn);
    f = report_csv(R, name, 0);
    {
        int n = cuda ? 4096 : P->blk_seqlen;
        int heads = cuda ? 32 : P->blk_heads;
        double fl = 4.0 * n * n * 64 * heads;
        for (int i = 0; i < P->n_blk_q; i++)
            report_bench(R, &D->blocks, f, name, "blocks", est_cost(R, dev, fl, (P->reps + 1) * 2 * P->n_blk_k), 0,
                         "--device %s --dtype %s --algo flash1,flash2 --d 64 --batch 1 --heads %d --seqlen %d "
                         "--block-q %d --block-k %s %s",
                         dn, dt, heads, n, P->blk_q[i], P->blk_k_list, R->rule);
    }
    if (f) fclose(f);

    /* 4. peak extra memory vs seqlen, up to the length where STANDARD no longer fits */
    snprintf(name, sizeof name, "memory_%s.csv", dn);
    f = report_csv(R, name, 0);
    for (int s = 0; s < P->n_mem_seqlens; s++) {
        int64_t n = P->mem_seqlens[s];
        report_bench(R, &D->mem, f, name, "memory", est_cost(R, dev, 4.0 * n * n * 64, 2 * 3), 0,
                     "--device %s --dtype %s --algo standard,flash1,flash2 --d 64 --batch 1 --heads 1 --seqlen %lld "
                     "--reps 1 --warmup 0",
                     dn, dt, (long long)n);
    }
    /* The first power-of-two length at which STANDARD's extra memory (c·N², fitted) exceeds what is available:
     * asking for it must fail cleanly (it fails at allocation, before any work). */
    double c2 = 0;
    int64_t nmax = 0;
    for (int i = 0; i < D->mem.n; i++) {
        const bench_row *r = &D->mem.v[i];
        if (r->ok && r->algo == FA_ALGO_STANDARD && r->cfg.seqlen_q > nmax) {
            nmax = r->cfg.seqlen_q;
            c2 = (double)r->extra_bytes / ((double)nmax * (double)nmax);
        }
    }
    int64_t limit = cuda ? cuda_mem_free() : bench_default_mem_limit();
    if (c2 > 0 && limit > 0) {
        int64_t n = nmax;
        while (c2 * (double)n * (double)n <= (double)limit && n < ((int64_t)1 << 22)) n *= 2;
        int already = 0; /* a preset that asked for this length already has STANDARD's row */
        for (int i = 0; i < D->mem.n; i++)
            already |= D->mem.v[i].algo == FA_ALGO_STANDARD && D->mem.v[i].cfg.seqlen_q == n;
        if (n > nmax) {
            D->probe_n = n;
            D->probe_need = c2 * (double)n * (double)n;
            D->probe_limit = (double)limit;
        }
        if (n > nmax && !already) {
            report_bench(R, &D->mem, f, name, "memory (does STANDARD fit?)", 0.5, 0,
                         "--device %s --dtype %s --algo standard --d 64 --batch 1 --heads 1 --seqlen %lld --reps 1 "
                         "--warmup 0",
                         dn, dt, (long long)n);
        }
    }
    if (f) fclose(f);
}

static void measure_io(report *R) {
    const preset *P = &R->p;
    FILE *f = report_csv(R, "io_seqlen.csv", 1);
    for (int s = 0; s < P->n_io_seqlens; s++) {
        double n = (double)P->io_seqlens[s];
        report_io(R, &R->io_seqlen, f, "io_seqlen.csv", est_cost(R, FA_BACKEND_CPU, 4 * n * n * 64, 6),
                  "--seqlen %lld --d 64", (long long)P->io_seqlens[s]);
    }
    if (f) fclose(f);
    f = report_csv(R, "io_sram.csv", 1);
    double n = (double)P->io_sram_seqlen;
    for (int s = 0; s < P->n_srams; s++)
        report_io(R, &R->io_sram, f, "io_sram.csv", est_cost(R, FA_BACKEND_CPU, 4 * n * n * 64, 4),
                  "--seqlen %lld --d 64 --sram %lld --algo flash1,flash2", (long long)P->io_sram_seqlen,
                  (long long)P->srams[s]);
    if (f) fclose(f);
}

/* ---------------------------------------------------------------------------------------------------------
 * Presets
 * ------------------------------------------------------------------------------------------------------- */
static void set_list(char *dst, size_t len, const int64_t *v, int n) {
    size_t o = 0;
    dst[0] = 0;
    for (int i = 0; i < n && o < len; i++) o += (size_t)snprintf(dst + o, len - o, "%s%lld", i ? "," : "", (long long)v[i]);
}

static void preset_init(preset *P, const char *mode) {
    memset(P, 0, sizeof *P);
    snprintf(P->name, sizeof P->name, "%s", mode);
    static const int64_t sq_quick[] = {128, 256, 512, 1024}, sq_full[] = {512, 1024, 2048, 4096},
                         sq_smoke[] = {64, 128};
    static const int64_t gpu_sq[] = {512, 1024, 2048, 4096, 8192, 16384};
    static const int64_t mem_quick[] = {1024, 2048, 4096, 8192},
                         mem_full[] = {1024, 2048, 4096, 8192, 16384, 32768, 65536}, mem_smoke[] = {128, 256, 512};
    static const int64_t io_quick[] = {256, 512, 1024, 2048, 4096}, io_full[] = {256, 512, 1024, 2048, 4096, 8192, 16384},
                         io_smoke[] = {64, 128, 256};
    static const int64_t sram_q[] = {8192, 16384, 32768, 65536, 131072, 262144, 524288},
                         sram_smoke[] = {4096, 8192, 16384};
    /* The repetition rule: at least `reps` per point, then (quick, full) more until each median's 95 % interval is
     * within until_ci of it or the point's calls took max_seconds; the quick preset's numbers keep `make demo`
     * near its old length on a 2-core machine while the verdicts settle (docs/benchmarks.md, "The report"). smoke
     * (the tests) keeps a fixed count and never waits for a quiet machine. */
    P->reps = 10;
    if (strcmp(mode, "quick") == 0) P->reps = 6, P->until_ci = 0.05, P->max_seconds = 0.5, P->max_wait = 16;
    if (strcmp(mode, "full") == 0) P->until_ci = 0.03, P->max_seconds = 10, P->max_wait = 300;
    if (strcmp(mode, "smoke") == 0) {
        P->model_dim = 128;
        P->tokens = 256;
        memcpy(P->seqlens, sq_smoke, sizeof sq_smoke), P->n_seqlens = 2;
        P->par_seqlen = 128;
        snprintf(P->par_heads_list, sizeof P->par_heads_list, "1,2");
        P->par_max_heads = 2;
        P->blk_seqlen = 128, P->blk_heads = 2;
        P->blk_q[0] = 16, P->blk_q[1] = 32, P->n_blk_q = 2;
        snprintf(P->blk_k_list, sizeof P->blk_k_list, "16,64");
        P->n_blk_k = 2;
        memcpy(P->mem_seqlens, mem_smoke, sizeof mem_smoke), P->n_mem_seqlens = 3;
        memcpy(P->io_seqlens, io_smoke, sizeof io_smoke), P->n_io_seqlens = 3;
        P->io_sram_seqlen = 128;
        memcpy(P->srams, sram_smoke, sizeof sram_smoke), P->n_srams = 3;
    } else if (strcmp(mode, "full") == 0) {
        P->model_dim = 2048;
        P->tokens = 16384;
        memcpy(P->seqlens, sq_full, sizeof sq_full), P->n_seqlens = 4;
        P->par_seqlen = 4096;
        snprintf(P->par_heads_list, sizeof P->par_heads_list, "1,2,4,8,16,32");
        P->par_max_heads = 32;
        P->blk_seqlen = 4096, P->blk_heads = 8;
        int64_t bq[] = {16, 32, 64, 128, 256};
        for (int i = 0; i < 5; i++) P->blk_q[i] = (int)bq[i];
        P->n_blk_q = 5;
        snprintf(P->blk_k_list, sizeof P->blk_k_list, "16,32,64,128,256,512,1024");
        P->n_blk_k = 7;
        memcpy(P->mem_seqlens, mem_full, sizeof mem_full), P->n_mem_seqlens = 7;
        memcpy(P->io_seqlens, io_full, sizeof io_full), P->n_io_seqlens = 7;
        P->io_sram_seqlen = 4096;
        memcpy(P->srams, sram_q, sizeof sram_q), P->n_srams = 7;
    } else { /* quick */
        P->model_dim = 256;
        P->tokens = 2048;
        memcpy(P->seqlens, sq_quick, sizeof sq_quick), P->n_seqlens = 4;
        P->par_seqlen = 1024;
        snprintf(P->par_heads_list, sizeof P->par_heads_list, "1,2,4,8");
        P->par_max_heads = 8;
        P->blk_seqlen = 1024, P->blk_heads = 4;
        int64_t bq[] = {16, 64, 256};
        for (int i = 0; i < 3; i++) P->blk_q[i] = (int)bq[i];
        P->n_blk_q = 3;
        snprintf(P->blk_k_list, sizeof P->blk_k_list, "16,32,64,128,256,512,1024");
        P->n_blk_k = 7;
        memcpy(P->mem_seqlens, mem_quick, sizeof mem_quick), P->n_mem_seqlens = 4;
        memcpy(P->io_seqlens, io_quick, sizeof io_quick), P->n_io_seqlens = 5;
        P->io_sram_seqlen = 2048;
        memcpy(P->srams, sram_q, sizeof sram_q), P->n_srams = 7;
    }
    set_list(P->seqlen_list, sizeof P->seqlen_list, P->seqlens, P->n_seqlens);
    set_list(P->gpu_seqlen_list, sizeof P->gpu_seqlen_list, gpu_sq, 6);
}

/* Size the CPU measurements to this machine: the quick preset's sizes were chosen on a 2-core CPU (fp32 micro-kernel
 * ≈ 200 GFLOP/s); on a machine k times faster its batch·seqlen grows by the power of two nearest k, so each call
 * keeps its few milliseconds (on 16 cores the fixed sizes take microseconds and the verdicts would measure
 * overhead). The measured peak also sets the progress bar's rate. */
#define REPORT_REF_PEAK 200e9
static void preset_size_cpu(report *R, const char *mode) {
    fa_cpu_peak pk;
    fa_cpu_measure_peak(R->threads, 0.05, &pk);
    if (pk.fp32 <= 0) return;
    R->cpu_rate = 0.6 * pk.fp32; /* a rough attention rate: the progress bar only */
    if (strcmp(mode, "quick") != 0) return;
    /* the 1-thread rate is the best of 4 windows (peak.c), which other processes only slow down: times the threads
     * it is the more stable estimate, so that a busy moment does not change the sizes between two runs */
    const double rate = pk.fp32_1t * pk.threads > pk.fp32 ? pk.fp32_1t * pk.threads : pk.fp32;
    int64_t k = 1;
    while (k < 32 && (double)(2 * k) <= rate / REPORT_REF_PEAK * 1.41) k *= 2;
    R->p.tokens *= k;
    R->p.blk_heads *= (int)k;
    R->cpu_scale = (int)k;
}

/* ---------------------------------------------------------------------------------------------------------
 * The command
 * ------------------------------------------------------------------------------------------------------- */
static void report_help(void) {
    printf("usage: flashattn report [--quick | --full] [--out DIR] [--threads T] [--no-plots] [--no-gpu] [--no-cpu]\n"
           "\n"
           "Measures the FlashAttention claims on this machine (CPU; the CUDA device too when present): STANDARD,\n"
           "FLASH1 and FLASH2 forward and backward, and KV-cache decoding (split-KV, paged caches); FLASH3 is timed by\n"
           "`flashattn bench --device cuda`. Writes DIR/index.md (default DIR = report) with PNG plots (gnuplot), the\n"
           "CSV behind each plot, reproduce.txt (the `flashattn bench`/`flashattn io` command behind every CSV row) and\n"
           "a claims table whose verdicts are computed from the measurements. A progress bar goes to stderr; a summary\n"
           "to stdout.\n"
           "\n"
           "Each timed point is repeated until its median's 95%% confidence interval is within a few %% (or its time\n"
           "budget ends), the algorithms interleaved; every verdict carries its interval, and one that the intervals\n"
           "do not settle reads 'not settled'. The run first waits (a bounded time) while other processes keep the\n"
           "CPUs busy, and reports how busy they were while it measured. A small fixed FLASH1 call is timed\n"
           "before every CPU point: a timed claim during whose measurements it moved by more than 10%% (a shared\n"
           "VM changes speed by itself) reads 'not settled'.\n"
           "\n"
           "  --quick      small problems (model dim 256, 2048 tokens), points to 5%%: about 40 s on a 2-core CPU\n"
           "               (default); on a faster CPU the tokens grow with its measured peak, so that calls stay\n"
           "               milliseconds\n"
           "  --full       the docs/benchmarks.md protocol sizes (model dim 2048, 16384 tokens), points to 3%%: an hour\n"
           "               or more on a 2-core CPU\n"
           "  --smoke      tiny problems, a fixed 10 repetitions, no waiting: seconds (for tests)\n"
           "  --out DIR    output directory (created)\n"
           "  --threads T  CPU threads for every measurement (default 0 = all cores)\n"
           "  --no-plots   do not call gnuplot (tables only)\n"
           "  --no-gpu     CPU only even when a CUDA device is present\n"
           "  --no-cpu     skip the CPU measurements (GPU only; the CPU claims then say 'not measured')\n");
}

int cmd_report(int argc, char **argv) {
    const char *S = "report", *mode = "quick";
    report R;
    memset(&R, 0, sizeof R);
    snprintf(R.out, sizeof R.out, "report");
    int no_plots = 0, no_gpu = 0, no_cpu = 0;
    int64_t threads = 0;
    for (int i = 0; i < argc; i++) {
        const char *x = argv[i], *v;
        if (strcmp(x, "--help") == 0 || strcmp(x, "-h") == 0) {
            report_help();
            return 0;
        }
        if (strcmp(x, "--quick") == 0) mode = "quick";
        else if (strcmp(x, "--full") == 0) mode = "full";
        else if (strcmp(x, "--smoke") == 0) mode = "smoke";
        else if (strcmp(x, "--no-plots") == 0) no_plots = 1;
        else if (strcmp(x, "--no-gpu") == 0) no_gpu = 1;
        else if (strcmp(x, "--no-cpu") == 0) no_cpu = 1;
        else if (opt_is(x, "--threads")) {
            if (!(v = opt_value(S, argc, argv, &i, "--threads")) || parse_int(S, "--threads", v, 0, 1024, &threads))
                return CLI_EXIT_USAGE;
        } else if (opt_is(x, "--out")) {
            if (!(v = opt_value(S, argc, argv, &i, "--out"))) return CLI_EXIT_USAGE;
            if (!*v || strlen(v) > 900 || strchr(v, '\'')) return cli_usage_error(S, "--out: bad directory '%s'", v);
            snprintf(R.out, sizeof R.out, "%s", v);
        } else
            return cli_usage_error(S, "unknown argument '%s'", x);
    }
    if (mkdir(R.out, 0777) != 0 && errno != EEXIST)
        return cli_usage_error(S, "--out: cannot create '%s': %s", R.out, strerror(errno));
    preset_init(&R.p, mode);
    if (R.p.until_ci > 0)
        snprintf(R.rule, sizeof R.rule, "--reps %d --until-ci %g --max-seconds %g", R.p.reps, 100 * R.p.until_ci,
                 R.p.max_seconds);
    else
        snprintf(R.rule, sizeof R.rule, "--reps %d", R.p.reps);
    R.window.wall = -1;
    R.threads = (int)threads;
    /* before anything is timed (the peak measurement below sizes the points): wait, up to half the allowance, for
     * other processes to leave the CPUs, and say how busy they were */
    R.others_start = quiet_wait(R.p.max_wait / 2, &R.waited);
    if (!no_cpu) preset_size_cpu(&R, mode);
    R.tty = isatty(2);
    R.t0 = now_ms();
    if (R.cpu_rate <= 0) R.cpu_rate = 25e9;
    R.gnuplot = !no_plots && system("command -v gnuplot >/dev/null 2>&1") == 0;
    snprintf(R.gp_term, sizeof R.gp_term, "%s",
             R.gnuplot && system("gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1") != 0 ? "png" : "pngcairo");
    R.cuda = !no_gpu && fa_backend_available(FA_BACKEND_CUDA);
    char path[2048];
    snprintf(path, sizeof path, "%s/reproduce.txt", R.out);
    R.repro = fopen(path, "w");
    if (!R.repro) {
        fprintf(stderr, "flashattn report: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    fprintf(R.repro, "# data file<TAB>flashattn arguments (append --csv; rows come out in the same order)\n");

    /* Work estimate for the progress bar (seconds at the assumed rates). */
    {
        const preset *P = &R.p;
        double w = 0, fl = 0;
        for (int s = 0; s < P->n_seqlens; s++) fl += 4.0 * (double)P->tokens * P->seqlens[s] * P->model_dim;
        w += 2 * est_cost(&R, FA_BACKEND_CPU, fl * 1.5 * 3.5, (P->reps + 1) * 3);
        fl = 0;
        for (int h = 1; h <= P->par_max_heads; h *= 2) fl += 4.0 * P->par_seqlen * (double)P->par_seqlen * 64 * h;
        w += est_cost(&R, FA_BACKEND_CPU, fl * 3.5, (P->reps + 1) * 3);
        w += P->n_blk_q * est_cost(&R, FA_BACKEND_CPU, 4.0 * P->blk_seqlen * (double)P->blk_seqlen * 64 * P->blk_heads,
                                   (P->reps + 1) * 2 * P->n_blk_k);
        for (int s = 0; s < P->n_mem_seqlens; s++)
            w += est_cost(&R, FA_BACKEND_CPU, 4.0 * (double)P->mem_seqlens[s] * (double)P->mem_seqlens[s] * 64, 6) + 0.5 / P->n_mem_seqlens;
        for (int s = 0; s < P->n_io_seqlens; s++)
            w += est_cost(&R, FA_BACKEND_CPU, 4.0 * (double)P->io_seqlens[s] * (double)P->io_seqlens[s] * 64, 6);
        w += P->n_srams * est_cost(&R, FA_BACKEND_CPU, 4.0 * P->io_sram_seqlen * (double)P->io_sram_seqlen * 64, 4);
        w += 7 * 0.2; /* the decoding section */
        R.work_total = (no_cpu ? 0 : w) + (R.cuda ? 150 : 0);
    }
    R.load_start = load_avg();
    report_progress(&R, "start");
    if (!no_cpu) {
        if (probe_open(&R.probe, R.threads) != 0)
            fprintf(stderr, "flashattn report: no speed probe (%s): verdicts cannot tell a change of the machine's speed\n",
                    fa_create_error()[0] ? fa_create_error() : "out of memory");
        measure_device(&R, FA_BACKEND_CPU, &R.cpu);
        R.cpu.kv_probe_from = R.probe.n;
        report_measure_kvcache(&R, FA_BACKEND_CPU, &R.cpu);
        report_point_begin(&R); /* a reading after the last timed CPU point, in a window of its own */
        report_window_close(&R);
        R.cpu.kv_probe_to = R.probe.n;
        probe_close(&R.probe);
        measure_io(&R);
    }
    if (R.cuda) {
        measure_device(&R, FA_BACKEND_CUDA, &R.gpu);
        report_measure_kvcache(&R, FA_BACKEND_CUDA, &R.gpu);
        report_progress(&R, "ncu DRAM bytes");
        report_ncu(&R);
        report_progress(&R, "PyTorch SDPA");
        report_torch(&R);
    }
    report_window_close(&R);
    fclose(R.repro);
    R.work_done = R.work_total;
    report_progress(&R, "writing the report");
    if (R.tty) fprintf(stderr, "\n");
    R.seconds = (now_ms() - R.t0) / 1e3;
    R.load_end = load_avg();
    int rc = report_write(&R);
    rows_t *all[] = {&R.cpu.speed, &R.cpu.par, &R.cpu.blocks, &R.cpu.mem,
                     &R.gpu.speed, &R.gpu.par, &R.gpu.blocks, &R.gpu.mem};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]->v), free(all[i]->others);
    free(R.io_seqlen.v), free(R.io_sram.v);
    return rc;
}
