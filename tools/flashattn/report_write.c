/* flashattn report: index.md (the claims table, every verdict computed from the rows, and the tables behind the
 * plots of report_plots.c) and the summary on stdout. */
#include "report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------------------
 * index.md
 * ------------------------------------------------------------------------------------------------------- */
static void md_speed_table(FILE *f, const rows_t *rs, int cuda) {
    const char *u = cuda ? "TFLOP/s" : "GFLOP/s";
    double ys = cuda ? 1e-3 : 1;
    fprintf(f, "| d | causal | pass | B×H | N | standard %s | flash1 %s | flash2 %s | V2/V1 (95 %% interval) | "
               "V1/std | V2/std |\n", u, u, u);
    fprintf(f, "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < rs->n; i++) {
        const bench_row *s = &rs->v[i];
        if (s->algo != FA_ALGO_STANDARD) continue;
        const bench_config *c = &s->cfg;
        const bench_row *r[4] = {NULL, s,
                                 find_row(rs, FA_ALGO_FLASH1, c->head_dim, c->seqlen_q, c->causal, c->backward, c->heads, -1, -1),
                                 find_row(rs, FA_ALGO_FLASH2, c->head_dim, c->seqlen_q, c->causal, c->backward, c->heads, -1, -1)};
        fprintf(f, "| %lld | %s | %s | %lld×%lld | %lld |", (long long)c->head_dim, c->causal ? "yes" : "no",
                c->backward ? "bwd" : "fwd", (long long)c->batch, (long long)c->heads, (long long)c->seqlen_q);
        for (int a = 1; a <= 3; a++) {
            if (r[a] && r[a]->ok) fprintf(f, " %.2f |", r[a]->gflops * ys);
            else fprintf(f, " %s |", r[a] ? r[a]->status : "-");
        }
        /* time ratios rep by rep (the algorithms ran interleaved), with the 95 % interval of their median */
        const int pairs[3][2] = {{2, 3}, {1, 2}, {1, 3}};
        for (int k = 0; k < 3; k++) {
            const bench_row *a = r[pairs[k][0]], *b = r[pairs[k][1]];
            double x, lo, hi;
            if (a && b && paired_ratio(a, b, &x, &lo, &hi)) fprintf(f, " %.2f× (%.2f–%.2f) |", x, lo, hi);
            else fprintf(f, " - |");
        }
        fprintf(f, "\n");
    }
}

static void md_rows(FILE *f, const rows_t *rs, int cuda) {
    fprintf(f, "| algo | B×H | N | Br×Bc | ms (median) | 95 %% interval | reps | %s | extra MB | read MB | write MB | "
               "kernel |\n", cuda ? "TFLOP/s" : "GFLOP/s");
    fprintf(f, "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (int i = 0; i < rs->n; i++) {
        const bench_row *r = &rs->v[i];
        const bench_config *c = &r->cfg;
        fprintf(f, "| %s%s | %lld×%lld | %lld | ", fa_algo_name(r->algo), c->backward ? " bwd" : "", (long long)c->batch,
                (long long)c->heads, (long long)c->seqlen_q);
        if (!r->ok) {
            fprintf(f, "- | %s | | | | | | | %s |\n", r->status, r->note);
            continue;
        }
        fprintf(f, "%d×%d | %.3f | %.3f–%.3f | %d | %.2f | %.3f | %.2f | %.2f | %s |\n", r->block_q, r->block_k, r->ms,
                r->ci_lo, r->ci_hi, r->reps_run, cuda ? r->gflops / 1e3 : r->gflops, (double)r->extra_bytes / 1e6,
                (double)r->read_bytes / 1e6, (double)r->write_bytes / 1e6, r->kernel);
    }
}

static void md_io(FILE *f, const io_rows_t *rs) {
    fprintf(f, "| algo | N | Br×Bc | M (KiB) | read MB | write MB | total MB | paper bound | bound MB | counted/bound | "
               "algorithm model MB | counted/model |\n");
    fprintf(f, "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|\n");
    for (int i = 0; i < rs->n; i++) {
        const io_row *r = &rs->v[i];
        if (!r->ok) {
            fprintf(f, "| %s | %lld | %s |\n", fa_algo_name(r->algo), (long long)r->seqlen, r->note);
            continue;
        }
        double tot = (double)(r->read_bytes + r->write_bytes);
        fprintf(f, "| %s | %lld | %d×%d | %.1f | %.3f | %.3f | %.3f | %s | %.3f | %.2f | %.3f | %.3f |\n",
                fa_algo_name(r->algo), (long long)r->seqlen, r->block_q, r->block_k, (double)r->sram_bytes / 1024,
                (double)r->read_bytes / 1e6, (double)r->write_bytes / 1e6, tot / 1e6, r->formula, r->paper_bytes / 1e6,
                tot / r->paper_bytes, r->model_bytes / 1e6, tot / r->model_bytes);
    }
}

static void md_claims(FILE *f, const claim *cl, int n, const char *dev) {
    fprintf(f, "| # | claim | measurement (%s) | result | verdict |\n|---|---|---|---|---|\n", dev);
    for (int i = 0; i < n; i++)
        fprintf(f, "| %d | %s | %s | %s | %s |\n", i + 1, cl[i].claim, cl[i].measured, cl[i].result, cl[i].verdict);
}

static void md_device(report *R, FILE *f, const dev_data *D, const char *pngs_prefix) {
    int cuda = D->dev == FA_BACKEND_CUDA;
    const char *dn = fa_backend_name(D->dev);
    (void)pngs_prefix;
    fprintf(f, "\n## Speed vs sequence length (%s)\n\n", dn);
    fprintf(f, "Like the FlashAttention-2 paper's figures: %s, heads × d = %s, batch = tokens / N, medians (the repetition "
               "rule above), the three algorithms interleaved on the same inputs; the ratios are taken rep by rep, with "
               "the 95 %% interval of their median.\n\n",
            cuda ? "bf16" : "fp32", cuda ? "2048 (protocol)" : "the preset's model dim");
    if (R->gnuplot) fprintf(f, "![forward](speed_%s_fwd.png)\n![backward](speed_%s_bwd.png)\n\n", dn, dn);
    fprintf(f, "Data: [speed_%s.csv](speed_%s.csv)\n\n", dn, dn);
    md_speed_table(f, &D->speed, cuda);
    fprintf(f, "\n## Speed vs batch × heads (%s)\n\nFLASH1 parallelises over batch × heads only; FLASH2 also over query "
               "blocks. With batch 1 and few heads, FLASH1 leaves %s idle.\n\n",
            dn, cuda ? "most SMs" : "threads");
    if (R->gnuplot) fprintf(f, "![parallel](parallel_%s.png)\n\n", dn);
    fprintf(f, "Data: [parallel_%s.csv](parallel_%s.csv)\n\n", dn, dn);
    md_speed_table(f, &D->par, cuda);
    fprintf(f, "\n## Speed vs tile size (%s)\n\n", dn);
    if (R->gnuplot) fprintf(f, "![blocks](blocks_%s.png)\n\n", dn);
    fprintf(f, "Data: [blocks_%s.csv](blocks_%s.csv)\n\n", dn, dn);
    md_rows(f, &D->blocks, cuda);
    fprintf(f, "\n## Peak extra memory vs sequence length (%s)\n\nMemory the call needed beyond its inputs and outputs "
               "(fa_last_stats extra_bytes): STANDARD materialises S/P, the flash algorithms keep tiles and O(N) state.\n\n",
            dn);
    if (R->gnuplot) fprintf(f, "![memory](memory_%s.png)\n\n", dn);
    fprintf(f, "Data: [memory_%s.csv](memory_%s.csv)\n\n", dn, dn);
    md_rows(f, &D->mem, cuda);
    if (D->probe_n)
        fprintf(f, "\nThe last STANDARD row is the first power-of-two length at which its fitted extra memory (%.1f GB) "
                   "exceeds the %.1f GB this run may use; the flash algorithms are not timed there in this preset.\n",
                D->probe_need / 1e9, D->probe_limit / 1e9);
    report_md_kvcache(f, D);
    if (D->n_kv) fprintf(f, "\nData: [kvcache_%s.csv](kvcache_%s.csv)\n", dn, dn);
}

static void md_cpu(report *R, FILE *f) {
    md_device(R, f, &R->cpu, "");
    fprintf(f, "\n## Slow-memory traffic (CPU, counted)\n\nBytes each algorithm moved between slow memory (the caller's "
               "tensors and the workspace) and fast-memory tiles, counted by the CPU backend's tile transfers and reported "
               "by fa_last_stats, next to the FlashAttention paper's bounds (Theorem 2: standard Θ(Nd + N²), flash "
               "Θ(N²d²/M); constant 1, fp32 elements, M in elements) and to each algorithm's transfers as its paper "
               "writes them.\n\n");
    if (R->gnuplot) fprintf(f, "![io vs N](io_seqlen.png)\n![io vs M](io_sram.png)\n\n");
    fprintf(f, "Library blocks, N varies. Data: [io_seqlen.csv](io_seqlen.csv)\n\n");
    md_io(f, &R->io_seqlen);
    fprintf(f, "\nThe paper's blocks from M (Bc = ceil(M/4d), Br = min(Bc, d)), N = %lld. Data: [io_sram.csv](io_sram.csv)\n\n",
            (long long)R->p.io_sram_seqlen);
    md_io(f, &R->io_sram);

    /* tile sizes on this machine */
    {
        int64_t l1 = cpu_cache_bytes(1), l2 = cpu_cache_bytes(2);
        int br1, bc1, br2, bc2;
        io_blocks_from_sram(l1 > 0 ? l1 : 32768, 64, &br1, &bc1);
        io_blocks_from_sram(l2 > 0 ? l2 : 1 << 20, 64, &br2, &bc2);
        const bench_row *def = find_row(&R->cpu.speed, FA_ALGO_FLASH2, 64, -1, 0, 0, -1, -1, -1);
        const bench_row *best = NULL;
        for (int i = 0; i < R->cpu.blocks.n; i++) {
            const bench_row *r = &R->cpu.blocks.v[i];
            if (r->ok && r->algo == FA_ALGO_FLASH2 && (!best || r->gflops > best->gflops)) best = r;
        }
        fprintf(f, "\n## Tile sizes on this machine\n\n");
        fprintf(f, "- The paper's rule with M = L1d (%lld KiB) at d = 64 gives Bc = %d, Br = %d; with M = L2 (%lld KiB): "
                   "Bc = %d, Br = %d.\n",
                (long long)l1 / 1024, bc1, br1, (long long)l2 / 1024, bc2, br2);
        if (def)
            fprintf(f, "- The library's default FLASH2 tile on the CPU: Br × Bc = %d × %d (working set %.0f KiB at d = 64: "
                       "Qi, Oi, Kj, Vj and S in fp32).\n",
                    def->block_q, def->block_k, tile_bytes(def->block_q, def->block_k, 64) / 1024);
        if (best)
            fprintf(f, "- Fastest measured FLASH2 tile in the sweep: %d × %d at %.1f GFLOP/s (working set %.0f KiB).\n",
                    best->block_q, best->block_k, best->gflops, tile_bytes(best->block_q, best->block_k, 64) / 1024);
        fprintf(f, "- Why: a step of FLASH2 touches Qi (Br·d), Kj and Vj (2·Bc·d), S/P (Br·Bc) and the accumulator Oi (Br·d); "
                   "that set must stay in L1/L2 for the tile products to run at cache speed, while larger tiles re-read "
                   "K/V fewer times (traffic ∝ 1/Br for FLASH2, ∝ 1/Bc for FLASH1).\n");
        if (R->cuda && cuda_smem_per_sm() > 0) {
            int brg, bcg;
            io_blocks_from_sram(cuda_smem_per_sm(), 64, &brg, &bcg);
            fprintf(f, "- GPU: %lld KiB shared memory per SM; the paper's rule at d = 64 gives Bc = %d, Br = %d (fp32 "
                       "elements; bf16 tiles hold twice as many).\n",
                    (long long)cuda_smem_per_sm() / 1024, bcg, brg);
        }
    }

}

int report_write(report *R) {
    char path[2048];
    snprintf(path, sizeof path, "%s/index.md", R->out);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "flashattn report: cannot write %s\n", path);
        return 1;
    }
    claim cpu_cl[FA_REPORT_MAX_CLAIMS], gpu_cl[FA_REPORT_MAX_CLAIMS];
    int n_cpu = 0, n_gpu = 0;
    if (R->cpu.present) build_claims(R, &R->cpu, cpu_cl, &n_cpu);
    if (R->cuda) build_claims(R, &R->gpu, gpu_cl, &n_gpu);
    int n_names = 0;
    char names[16][64];
    const int n_png = report_plots(R, names, &n_names);

    char desc[512];
    int threads = R->cpu.speed.n ? R->cpu.speed.v[0].threads : 0;
    device_describe(FA_BACKEND_CPU, threads, desc, sizeof desc);
    time_t now = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    fprintf(f, "# flashattn report: standard vs FlashAttention-1 vs FlashAttention-2, and KV-cache decoding, on this machine\n\n");
    fprintf(f, "- flashattn %s, `flashattn report --%s`, %s, %.0f s\n", fa_version_string(), R->p.name, date, R->seconds);
    fprintf(f, "- CPU: %s; L1d %lld KiB, L2 %lld KiB, L3 %lld KiB (per the OS)\n", desc,
            (long long)cpu_cache_bytes(1) / 1024, (long long)cpu_cache_bytes(2) / 1024, (long long)cpu_cache_bytes(3) / 1024);
    if (R->cuda) {
        device_describe(FA_BACKEND_CUDA, 0, desc, sizeof desc);
        fprintf(f, "- GPU: %s\n", desc);
    } else {
        fprintf(f, "- GPU: none used (%s)\n", fa_backend_available(FA_BACKEND_CUDA)
                                                  ? "--no-gpu"
                                                  : "this build has no CUDA backend or no CUDA device is present");
    }
    fprintf(f, "- preset `%s`: %s; MB = 10^6 bytes\n", R->p.name,
            strcmp(R->p.name, "full") == 0 ? "the docs/benchmarks.md protocol sizes (model dim 2048, 16384 tokens)"
                                            : "reduced sizes so the run stays short (use --full for the protocol sizes)");
    if (R->p.until_ci > 0)
        fprintf(f, "- every timing is a median after a warm-up, the algorithms of a point interleaved: at least %d "
                   "repetitions, then more until each median's 95 %% interval is within %g %% of it or the point's calls "
                   "took %g s (at most %d); every ratio and verdict carries its interval, and a verdict that differs "
                   "between the ends of its intervals reads **not settled**\n",
                R->p.reps, 100 * R->p.until_ci, R->p.max_seconds, BENCH_TIMES_MAX);
    else
        fprintf(f, "- every timing is the median of %d repetitions after a warm-up, the algorithms of a point "
                   "interleaved; every ratio and verdict carries its 95 %% interval, and a verdict that differs between "
                   "the ends of its intervals reads **not settled**\n",
                R->p.reps);
    if (R->cpu_scale > 1)
        fprintf(f, "- CPU sizes scaled to this machine: batch·seqlen %lld (the preset's times %d, from the measured "
                   "micro-kernel peak; `flashattn report` help)\n", (long long)R->p.tokens, R->cpu_scale);
    /* other processes' CPU use (quiet.c): the 1-minute load average lags and counts our own threads */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    const double quiet = quiet_threshold();
    const int busy = R->busy_windows > 0;
    if (R->others_start >= 0)
        fprintf(f, "- other processes used %.2f of the %ld cores before the first measurement and %.2f on average "
                   "while measuring (%.2f in the busiest of %d windows of ≥ 0.5 s; %d above the %.2f counted as quiet); "
                   "%.1f s waited for a quiet machine (at most %g); load average %.2f at the start, %.2f at the end%s\n",
                R->others_start, ncpu, R->others_mean, R->others_max, R->windows, R->busy_windows, quiet, R->waited,
                R->p.max_wait, R->load_start, R->load_end,
                busy ? ". **Other work shared the CPUs**: the claims leave out what was measured in the busy windows, "
                       "and a claim left with too little reads not settled (counted bytes and memory are not affected); "
                       "run again on a quiet machine"
                     : "");
    /* the machine's own speed (probe.c): a shared VM changes it without other processes */
    probe_span run = {0};
    if (R->cpu.present && R->probe.n > 0) {
        snprintf(path, sizeof path, "%s/probe_cpu.csv", R->out);
        const char *csv = probe_write_csv(&R->probe, path) == 0 ? " ([probe_cpu.csv](probe_cpu.csv))" : "";
        fprintf(f, "- the machine's speed: a fixed reference (%s) read before every timed CPU point, %d readings%s",
                R->probe.what, R->probe.n, csv);
        if (probe_range(&R->probe, 0, R->probe.n, quiet, &run) > 0) {
            const int moved = probe_kind(V_HOLDS, &run, R->probe.bound) == V_NOT_SETTLED;
            fprintf(f, ": %.2f–%.2f ms (median %.2f; each reading the median of it and its neighbours)%s. A timed "
                       "claim whose measurements saw it move by more than %.0f %% reads not settled; the others state "
                       "it, so that two reports can be compared\n",
                    run.lo, run.hi, run.med, moved ? ". **The machine's speed changed during this run**" : "",
                    100 * R->probe.bound);
        } else
            fprintf(f, ", all taken while other processes kept the CPUs busy: they tell nothing of its own speed\n");
    }
    if (!R->gnuplot)
        fprintf(f, "- **no plots**: gnuplot was not found (or --no-plots). Install it (`apt-get install gnuplot-nox`) "
                   "and run again, or run `gnuplot NAME.gp` in this directory: the scripts are written.\n");

    fprintf(f, "\n## Claims\n\nEach verdict below is computed from the measurements in this report.\n\n");
    if (n_cpu) md_claims(f, cpu_cl, n_cpu, "CPU");
    if (R->cuda) {
        fprintf(f, "\n");
        md_claims(f, gpu_cl, n_gpu, "GPU");
    }
    if (R->cpu.present) md_cpu(R, f);

    if (R->cuda) {
        fprintf(f, "\n# GPU\n");
        md_device(R, f, &R->gpu, "");
        fprintf(f, "\nOn CUDA the slow-memory bytes are modelled from the kernels' tiling (fa_last_stats).\n");
    }
    if (!R->cuda) {
        fprintf(f, "\n## GPU\n\nNo CUDA device was used (%s), so there are no GPU plots, no measured DRAM bytes (ncu) "
                   "and no PyTorch SDPA reference line. On a machine with an NVIDIA GPU and a CUDA build of flashattn, the "
                   "same command adds them.\n",
                fa_backend_available(FA_BACKEND_CUDA) ? "--no-gpu" : "no CUDA backend in this build or no device");
    } else {
        fprintf(f, "\n## Measured DRAM bytes (GPU)\n\n%s.\n\n", R->ncu_status);
        if (R->n_ncu) {
            fprintf(f, "| algo | B×H×N×d | kernels | DRAM read MB | DRAM write MB | modelled read MB | modelled write MB | "
                       "compulsory Q+K+V+O MB | measured / compulsory |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
            for (int i = 0; i < R->n_ncu; i++) {
                const ncu_row *r = &R->ncu[i];
                fprintf(f, "| %s | %lld×%lld×%lld×%lld | ", r->algo, (long long)r->b, (long long)r->h, (long long)r->n,
                        (long long)r->d);
                if (!r->ok) fprintf(f, "%s |\n", r->note);
                else
                    fprintf(f, "%d | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f |\n", r->kernels, r->dram_read / 1e6,
                            r->dram_write / 1e6, r->model_read / 1e6, r->model_write / 1e6, r->compulsory / 1e6,
                            (r->dram_read + r->dram_write) / r->compulsory);
            }
            fprintf(f, "\nThe paper's HBM model has no cache; on a GPU with a large L2 the K/V re-reads of the tiled loop "
                       "can hit L2, so measured DRAM bytes may sit near the compulsory traffic while the model counts every "
                       "tile transfer. Data: [ncu_cuda.csv](ncu_cuda.csv)\n");
        }
        fprintf(f, "\n## PyTorch SDPA (GPU)\n\n%s.\n\n", R->torch_status);
        if (R->n_torch) {
            fprintf(f, "| backend | B×H | N | d | causal | pass | ms | TFLOP/s | flashattn FLASH2 TFLOP/s |\n"
                       "|---|---|---|---|---|---|---:|---:|---:|\n");
            for (int i = 0; i < R->n_torch; i++) {
                const torch_row *t = &R->torch[i];
                const bench_row *o = find_row(&R->gpu.speed, FA_ALGO_FLASH2, t->d, t->n, t->causal, t->bwd, t->h, -1, -1);
                char ours[32] = "-";
                if (o && o->ok) snprintf(ours, sizeof ours, "%.1f", o->gflops / 1e3);
                fprintf(f, "| %s | %lld×%lld | %lld | %lld | %s | %s | %.3f | %.1f | %s |\n", t->name, (long long)t->b,
                        (long long)t->h, (long long)t->n, (long long)t->d, t->causal ? "yes" : "no",
                        t->bwd ? "bwd" : "fwd", t->ms, t->tflops, ours);
            }
        }
    }

    fprintf(f, "\n## Reproduce\n\nEvery CSV row above comes from one of these commands (see "
               "[reproduce.txt](reproduce.txt)); append `--csv` to get the same rows: `flashattn bench ...` for speed "
               "and memory, `flashattn io ...` for traffic.\n\n```\n");
    snprintf(path, sizeof path, "%s/reproduce.txt", R->out);
    FILE *rp = fopen(path, "r");
    if (rp) {
        char line[2100];
        while (fgets(line, sizeof line, rp)) {
            if (line[0] == '#') continue;
            char *tab = strchr(line, '\t');
            fprintf(f, "flashattn %s", tab ? tab + 1 : line);
        }
        fclose(rp);
    }
    fprintf(f, "```\n\nPlots: %d PNG files written%s; gnuplot scripts (`*.gp`) and data (`*.csv`) beside them.\n", n_png,
            R->gnuplot ? "" : " (gnuplot missing)");
    fclose(f);

    /* summary on stdout */
    printf("flashattn report (%s, %.0f s): %s/index.md, %d plots%s\n\n", R->p.name, R->seconds, R->out, n_png,
           R->gnuplot ? "" : " (gnuplot not found: tables only; apt-get install gnuplot-nox)");
    if (R->others_start >= 0)
        printf("other processes: %.2f cores before measuring, %.2f on average while measuring (%d of %d windows above "
               "%.2f); waited %.1f s for a quiet machine%s\n", R->others_start, R->others_mean, R->busy_windows,
               R->windows, quiet, R->waited, busy ? ": the claims leave out what was measured while busy" : "");
    if (R->cpu.present && run.n > 0)
        printf("speed reference (%s): %.2f–%.2f ms over %d readings, median %.2f%s\n", R->probe.what, run.lo, run.hi,
               R->probe.n, run.med,
               probe_kind(V_HOLDS, &run, R->probe.bound) == V_NOT_SETTLED ? ": the machine's speed changed" : "");
    for (int i = 0; i < n_cpu; i++) printf("cpu %d. %s: %s\n", i + 1, cpu_cl[i].claim, cpu_cl[i].verdict);
    for (int i = 0; i < n_gpu; i++) printf("gpu %d. %s: %s\n", i + 1, gpu_cl[i].claim, gpu_cl[i].verdict);
    return 0;
}
