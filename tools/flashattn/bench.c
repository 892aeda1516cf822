/* flashattn bench: the protocol of docs/benchmarks.md (llama-bench style).
 * Comma lists expand to a Cartesian product; within one configuration the algorithms share their inputs and are
 * interleaved rep by rep, the order rotating (the VM drifts 10–20 % over minutes, interleaving keeps the comparison
 * fair). */
#include "common.h"
#include "peak.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------------------
 * One configuration
 * ------------------------------------------------------------------------------------------------------- */
static fa_attn_opts make_opts(const bench_config *c, fa_algo algo) {
    fa_attn_opts o = fa_attn_opts_default();
    o.algo = algo;
    o.causal = c->causal;
    if (c->window >= 0) {
        o.window_left = c->window;
        o.window_right = c->window;
    }
    o.block_q = c->block_q;
    o.block_k = c->block_k;
    return o;
}

static void row_fail(bench_row *r, fa_status st, const char *msg) {
    r->ok = 0;
    snprintf(r->status, sizeof r->status, "%s",
             st == FA_ERR_OUT_OF_MEMORY                                     ? "oom"
             : st == FA_ERR_UNSUPPORTED || st == FA_ERR_BACKEND_UNAVAILABLE ? "skip"
                                                                            : "error");
    snprintf(r->note, sizeof r->note, "%s: %s", fa_status_string(st), msg && *msg ? msg : "(no message)");
}

typedef struct group_bufs {
    dev_buf q, k, v, dout, dq, dk, dv, sinks, d_sinks;
    dev_buf out[8], lse[8];
} group_bufs;

static void free_bufs(group_bufs *g) {
    dev_buf *all[] = {&g->q, &g->k, &g->v, &g->dout, &g->dq, &g->dk, &g->dv, &g->sinks, &g->d_sinks};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dev_free(all[i]);
    for (int i = 0; i < 8; i++) {
        dev_free(&g->out[i]);
        dev_free(&g->lse[i]);
    }
}

/* Allocate and fill one buffer with random values (host staging, then upload). */
static int alloc_random(dev_buf *b, fa_backend dev, fa_dtype dt, int64_t n, uint64_t *rng) {
    size_t bytes = (size_t)n * fa_dtype_size(dt);
    if (dev_alloc(b, dev, bytes)) return -1;
    if (dev == FA_BACKEND_CPU) {
        fill_random(b->ptr, dt, n, rng, 1.0f);
        return 0;
    }
    void *h = malloc(bytes ? bytes : 1);
    if (!h) return -1;
    fill_random(h, dt, n, rng, 1.0f);
    int rc = dev_upload(b, h, bytes);
    free(h);
    return rc;
}

/* out's dtype: the inputs' but after FP8 (e4m3) inputs, bf16 (FP8 is an input type of the forward only) */
static fa_dtype out_dtype(fa_dtype dt) { return dt == FA_DTYPE_F8_E4M3 ? FA_DTYPE_BF16 : dt; }

/* Slot a's sinks flag (bench_config.sinks_alt). */
static int slot_sinks(const bench_config *c, int a) { return c->sinks_alt ? a % 2 : c->sinks; }

static fa_status call_algo(fa_context *ctx, const bench_config *c, fa_algo algo, group_bufs *g, int slot,
                           int backward) {
    fa_attn_opts o = make_opts(c, algo);
    if (c->backward && !backward) o.block_q = o.block_k = 0; /* the forward behind a bwd row: default tiles */
    const int sinks = slot_sinks(c, slot);
    o.sinks = sinks ? (const float *)g->sinks.ptr : NULL;
    if (backward && sinks) o.d_sinks = (float *)g->d_sinks.ptr;
    const int64_t dv_ = c->head_dim_v;
    fa_tensor q = fa_tensor_bshd(g->q.ptr, c->dtype, c->batch, c->seqlen_q, c->heads, c->head_dim);
    fa_tensor k = fa_tensor_bshd(g->k.ptr, c->dtype, c->batch, c->seqlen_k, c->heads_k, c->head_dim);
    fa_tensor v = fa_tensor_bshd(g->v.ptr, c->dtype, c->batch, c->seqlen_k, c->heads_k, dv_);
    fa_tensor out = fa_tensor_bshd(g->out[slot].ptr, out_dtype(c->dtype), c->batch, c->seqlen_q, c->heads, dv_);
    if (!backward) return fa_forward(ctx, &o, &q, &k, &v, &out, (float *)g->lse[slot].ptr);
    fa_tensor dout = fa_tensor_bshd(g->dout.ptr, c->dtype, c->batch, c->seqlen_q, c->heads, dv_);
    fa_tensor dq = fa_tensor_bshd(g->dq.ptr, c->dtype, c->batch, c->seqlen_q, c->heads, c->head_dim);
    fa_tensor dk = fa_tensor_bshd(g->dk.ptr, c->dtype, c->batch, c->seqlen_k, c->heads_k, c->head_dim);
    fa_tensor dv = fa_tensor_bshd(g->dv.ptr, c->dtype, c->batch, c->seqlen_k, c->heads_k, dv_);
    return fa_backward(ctx, &o, &q, &k, &v, &out, (const float *)g->lse[slot].ptr, &dout, &dq, &dk, &dv);
}

/* Whether the rounds may stop after `reps` of them (at least c->reps ran): without until_ci always; else when every
 * live algorithm's median is known to within until_ci of it, or max_seconds have passed since t0. */
static int rounds_done(const bench_config *c, const int *live, int n_algo, const double *times, int cap, int reps,
                       double t0) {
    if (c->until_ci <= 0) return 1;
    if (c->max_seconds > 0 && now_ms() - t0 >= 1e3 * c->max_seconds) return 1;
    for (int a = 0; a < n_algo; a++)
        if (live[a] && !median_settled(times + a * cap, reps, c->until_ci)) return 0;
    return 1;
}

void bench_run_group(fa_context *ctx, const bench_config *c, const fa_algo *algos, int n_algo, int64_t mem_limit,
                     bench_row *rows) {
    if (n_algo > 8) n_algo = 8;
    for (int a = 0; a < n_algo; a++) {
        memset(&rows[a], 0, sizeof rows[a]);
        rows[a].cfg = *c;
        rows[a].cfg.sinks = slot_sinks(c, a), rows[a].cfg.sinks_alt = 0;
        rows[a].algo = algos[a];
        snprintf(rows[a].status, sizeof rows[a].status, "error");
    }
    size_t es = fa_dtype_size(c->dtype), oes = fa_dtype_size(out_dtype(c->dtype));
    int64_t nq = c->batch * c->seqlen_q * c->heads * c->head_dim;
    int64_t nk = c->batch * c->seqlen_k * c->heads_k * c->head_dim;
    int64_t nqv = c->batch * c->seqlen_q * c->heads * c->head_dim_v; /* out, dout: dv wide */
    int64_t nkv = c->batch * c->seqlen_k * c->heads_k * c->head_dim_v; /* v, dv */
    int64_t nl = c->batch * c->heads * c->seqlen_q;
    /* Our own allocations: q, k, v, one out + lse per algorithm, and for backward dout, dq, dk, dv. */
    double need = (double)es * (double)(nq + nk + nkv) + (double)oes * (double)(n_algo * nqv) +
                  4.0 * (double)(n_algo * nl + 2 * c->heads);
    if (c->backward) need += (double)es * (double)(nqv + nq + nk + nkv);
    if (need > (double)mem_limit) {
        for (int a = 0; a < n_algo; a++) {
            rows[a].ok = 0;
            snprintf(rows[a].status, sizeof rows[a].status, "oom");
            snprintf(rows[a].note, sizeof rows[a].note, "inputs and outputs need %.0f MB, more than the %.0f MB allowed",
                     need / 1e6, (double)mem_limit / 1e6);
        }
        return;
    }
    group_bufs g;
    memset(&g, 0, sizeof g);
    uint64_t rng = 0x5eed0000ull + (uint64_t)c->seqlen_q * 131 + (uint64_t)c->head_dim;
    int bad = alloc_random(&g.q, c->dev, c->dtype, nq, &rng) || alloc_random(&g.k, c->dev, c->dtype, nk, &rng) ||
              alloc_random(&g.v, c->dev, c->dtype, nkv, &rng);
    for (int a = 0; a < n_algo && !bad; a++)
        bad = dev_alloc(&g.out[a], c->dev, (size_t)nqv * oes) || dev_alloc(&g.lse[a], c->dev, (size_t)nl * 4);
    if (!bad && (c->sinks || c->sinks_alt)) /* sinks of the logits' scale, on the call's device; d_sinks for the backward */
        bad = alloc_random(&g.sinks, c->dev, FA_DTYPE_F32, c->heads, &rng) ||
              dev_alloc(&g.d_sinks, c->dev, (size_t)c->heads * 4);
    if (!bad && c->backward)
        bad = alloc_random(&g.dout, c->dev, c->dtype, nqv, &rng) || dev_alloc(&g.dq, c->dev, (size_t)nq * es) ||
              dev_alloc(&g.dk, c->dev, (size_t)nk * es) || dev_alloc(&g.dv, c->dev, (size_t)nkv * es);
    if (bad) {
        for (int a = 0; a < n_algo; a++) {
            snprintf(rows[a].status, sizeof rows[a].status, "oom");
            snprintf(rows[a].note, sizeof rows[a].note, "cannot allocate the inputs/outputs (%.0f MB) on %s",
                     need / 1e6, fa_backend_name(c->dev));
        }
        free_bufs(&g);
        return;
    }

    /* Backward needs out and lse: the same algorithm's forward, once. Then warm-up; stats from the last call. */
    int live[8] = {0};
    for (int a = 0; a < n_algo; a++) {
        fa_status st = FA_OK;
        if (c->backward) st = call_algo(ctx, c, algos[a], &g, a, 0);
        for (int w = 0; w < (c->warmup > 0 ? c->warmup : 1) && st == FA_OK; w++)
            st = call_algo(ctx, c, algos[a], &g, a, c->backward);
        if (st == FA_OK && dev_sync(c->dev)) st = FA_ERR_DEVICE;
        if (st != FA_OK) {
            row_fail(&rows[a], st, fa_context_last_error(ctx));
            continue;
        }
        fa_stats s;
        fa_last_stats(ctx, &s);
        bench_row *r = &rows[a];
        live[a] = 1;
        snprintf(r->kernel, sizeof r->kernel, "%s", s.kernel ? s.kernel : "?");
        r->block_q = s.block_q;
        r->block_k = s.block_k;
        r->threads = s.threads;
        r->flops = s.flops;
        r->extra_bytes = s.extra_bytes;
        r->read_bytes = s.slow_read_bytes;
        r->write_bytes = s.slow_write_bytes;
    }

    /* Rounds of one call per algorithm: the first c->reps always; with until_ci more, until every median is known
     * to within until_ci (its 95 % interval) or max_seconds of rounds have run (noise, and a busy machine, widen the
     * interval: such a configuration gets more repetitions instead of a median that shifts from run to run). */
    const int min_reps = c->reps > 0 ? c->reps : 1;
    const int cap = c->until_ci > 0 && min_reps < BENCH_TIMES_MAX ? BENCH_TIMES_MAX : min_reps;
    double *times = calloc((size_t)cap * (size_t)(n_algo > 0 ? n_algo : 1), sizeof *times);
    dev_timer *tm = dev_timer_create(c->dev);
    if (!times || !tm) {
        for (int a = 0; a < n_algo; a++)
            if (live[a]) {
                live[a] = 0;
                snprintf(rows[a].status, sizeof rows[a].status, "oom");
                snprintf(rows[a].note, sizeof rows[a].note, "cannot allocate the timer");
            }
    }
    const double t0 = now_ms();
    int reps = 0;
    while (reps < cap && !(reps >= min_reps && rounds_done(c, live, n_algo, times, cap, reps, t0))) {
        const int r = reps++;
        for (int k = 0; k < n_algo; k++) {
            /* each rep starts one algorithm later: the one that always runs last can measure slower (up to 8 %),
             * a bias of its place in the order, not of the algorithm */
            const int a = (k + r) % n_algo;
            if (!live[a]) continue;
            dev_timer_start(tm);
            fa_status st = call_algo(ctx, c, algos[a], &g, a, c->backward);
            double ms = dev_timer_stop(tm);
            if (st != FA_OK) {
                live[a] = 0;
                row_fail(&rows[a], st, fa_context_last_error(ctx));
                continue;
            }
            times[a * cap + r] = ms;
        }
    }
    for (int a = 0; a < n_algo; a++) {
        if (!live[a]) continue;
        bench_row *rw = &rows[a];
        const double *t = times + a * cap;
        rw->ok = 1;
        snprintf(rw->status, sizeof rw->status, "ok");
        rw->ms = median_of(t, reps);
        median_ci(t, reps, &rw->ci_lo, &rw->ci_hi);
        rw->ms_min = rw->ms_max = t[0];
        for (int r = 1; r < reps; r++) {
            if (t[r] < rw->ms_min) rw->ms_min = t[r];
            if (t[r] > rw->ms_max) rw->ms_max = t[r];
        }
        rw->spread_pct = rw->ms > 0 ? 100.0 * (rw->ms_max - rw->ms_min) / rw->ms : 0;
        rw->gflops = rw->ms > 0 ? rw->flops / (rw->ms * 1e6) : 0;
        rw->reps_run = reps;
        rw->n_times = reps < BENCH_TIMES_MAX ? reps : BENCH_TIMES_MAX;
        memcpy(rw->times, t, (size_t)rw->n_times * sizeof *t);
    }
    for (int a = 0; a < n_algo; a++)
        if (rows[a].ok && algos[a] == FA_ALGO_STANDARD)
            for (int b = 0; b < n_algo; b++)
                if (rows[b].ok && slot_sinks(c, b) == slot_sinks(c, a)) rows[b].speedup = rows[a].ms / rows[b].ms;
    free(times);
    dev_timer_destroy(tm);
    free_bufs(&g);
}

/* ---------------------------------------------------------------------------------------------------------
 * Output
 * ------------------------------------------------------------------------------------------------------- */
void bench_csv_header(FILE *f, int with_extra) {
    fprintf(f, "device,algo,dtype,batch,heads,seqlen_q,seqlen_k,head_dim,causal,pass,ms,gflops,peak_extra_mb,"
               "slow_read_mb,slow_write_mb,head_dim_v,sinks");
    if (with_extra) fprintf(f, ",heads_k,window,block_q,block_k,threads,reps,kernel,status,ms_ci_lo,ms_ci_hi");
    fprintf(f, "\n");
}

void bench_csv_row(FILE *f, const bench_row *r, int with_extra) {
    const bench_config *c = &r->cfg;
    fprintf(f, "%s,%s,%s,%lld,%lld,%lld,%lld,%lld,%d,%s,", fa_backend_name(c->dev), fa_algo_name(r->algo),
            fa_dtype_name(c->dtype), (long long)c->batch, (long long)c->heads, (long long)c->seqlen_q,
            (long long)c->seqlen_k, (long long)c->head_dim, c->causal, c->backward ? "bwd" : "fwd");
    /* MB = 10^6 bytes; 6 decimals keep counted bytes exact. */
    if (r->ok)
        fprintf(f, "%.4f,%.3f,%.6f,%.6f,%.6f", r->ms, r->gflops, (double)r->extra_bytes / 1e6,
                (double)r->read_bytes / 1e6, (double)r->write_bytes / 1e6);
    else
        fprintf(f, "%s,,,,", r->status);
    fprintf(f, ",%lld,%d", (long long)c->head_dim_v, c->sinks);
    if (with_extra) {
        fprintf(f, ",%lld,%d,%d,%d,%d,%d,%s,%s", (long long)c->heads_k, c->window, r->block_q, r->block_k, r->threads,
                r->ok ? r->reps_run : c->reps, r->kernel[0] ? r->kernel : "-", r->status);
        if (r->ok) fprintf(f, ",%.4f,%.4f", r->ci_lo, r->ci_hi);
        else fprintf(f, ",,");
    }
    fprintf(f, "\n");
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

static void bench_json_row(FILE *f, const bench_row *r, int first) {
    const bench_config *c = &r->cfg;
    fprintf(f, "%s  {\"device\": \"%s\", \"algo\": \"%s\", \"dtype\": \"%s\", \"batch\": %lld, \"heads\": %lld, "
               "\"heads_k\": %lld, \"seqlen_q\": %lld, \"seqlen_k\": %lld, \"head_dim\": %lld, \"head_dim_v\": %lld, "
               "\"sinks\": %d, \"causal\": %d, \"window\": %d, \"pass\": \"%s\", \"threads\": %d, \"reps\": %d, \"status\": \"%s\", \"kernel\": ",
            first ? "" : ",\n", fa_backend_name(c->dev), fa_algo_name(r->algo), fa_dtype_name(c->dtype),
            (long long)c->batch, (long long)c->heads, (long long)c->heads_k, (long long)c->seqlen_q,
            (long long)c->seqlen_k, (long long)c->head_dim, (long long)c->head_dim_v, c->sinks, c->causal, c->window,
            c->backward ? "bwd" : "fwd",
            r->threads, r->ok ? r->reps_run : c->reps, r->status);
    json_str(f, r->kernel);
    if (r->ok)
        fprintf(f, ", \"block_q\": %d, \"block_k\": %d, \"ms\": %.4f, \"ms_min\": %.4f, \"ms_max\": %.4f, "
                   "\"ms_ci_lo\": %.4f, \"ms_ci_hi\": %.4f, "
                   "\"gflops\": %.3f, \"flops\": %.0f, \"speedup_vs_standard\": %.3f, \"peak_extra_bytes\": %lld, "
                   "\"slow_read_bytes\": %lld, \"slow_write_bytes\": %lld}",
                r->block_q, r->block_k, r->ms, r->ms_min, r->ms_max, r->ci_lo, r->ci_hi, r->gflops, r->flops, r->speedup,
                (long long)r->extra_bytes, (long long)r->read_bytes, (long long)r->write_bytes);
    else {
        fprintf(f, ", \"note\": ");
        json_str(f, r->note);
        fprintf(f, "}");
    }
}

static void table_header(FILE *f, fa_backend dev, double peak) {
    fprintf(f, "| %-8s | %-28s | %-4s | %5s | %4s | %6s | %6s | %7s | %4s | %6s | %4s | %9s | %6s | %8s | %7s | %9s | "
               "%9s | %9s |%s\n",
            "algo", "kernel", "type", "B", "H", "Sq", "Sk", "d(/dv)", "sink", "causal", "pass", "ms", "spread",
            dev == FA_BACKEND_CUDA ? "TFLOP/s" : "GFLOP/s", "vs std", "extra MB", "read MB", "write MB",
            peak > 0 ? " % peak |" : "");
    fprintf(f, "|----------|------------------------------|------|------:|-----:|-------:|-------:|--------:|------|-------:|"
               "------|"
               "----------:|-------:|---------:|--------:|----------:|----------:|----------:|%s\n",
            peak > 0 ? "-------:|" : "");
}

/* peak: fp32 and bf16 GFLOP/s of the CPU micro-kernels (0 = not measured); a row is shown against its dtype's */
static void table_row(FILE *f, const bench_row *r, const double peak[2]) {
    const bench_config *c = &r->cfg;
    char causal[16];
    if (c->window >= 0) snprintf(causal, sizeof causal, "%s w%d", c->causal ? "yes" : "no", c->window);
    else snprintf(causal, sizeof causal, "%s", c->causal ? "yes" : "no");
    char heads[24];
    if (c->heads_k != c->heads) snprintf(heads, sizeof heads, "%lld/%lld", (long long)c->heads, (long long)c->heads_k);
    else snprintf(heads, sizeof heads, "%lld", (long long)c->heads);
    char dims[24]; /* d, or d/dv when v has its own head_dim */
    if (c->head_dim_v != c->head_dim)
        snprintf(dims, sizeof dims, "%lld/%lld", (long long)c->head_dim, (long long)c->head_dim_v);
    else snprintf(dims, sizeof dims, "%lld", (long long)c->head_dim);
    fprintf(f, "| %-8s | %-28s | %-4s | %5lld | %4s | %6lld | %6lld | %7s | %4s | %6s | %4s | ", fa_algo_name(r->algo),
            r->ok ? r->kernel : "-", fa_dtype_name(c->dtype), (long long)c->batch, heads, (long long)c->seqlen_q,
            (long long)c->seqlen_k, dims, c->sinks ? "yes" : "no", causal, c->backward ? "bwd" : "fwd");
    if (!r->ok) {
        fprintf(f, "%s: %s |\n", r->status, r->note);
        return;
    }
    double rate = c->dev == FA_BACKEND_CUDA ? r->gflops / 1e3 : r->gflops;
    char sp[16] = "";
    if (r->speedup > 0) snprintf(sp, sizeof sp, "%.2fx", r->speedup);
    fprintf(f, r->spread_pct < 100 ? "%9.3f | %5.1f%% | %8.2f | %7s | %9.2f | %9.2f | %9.2f |"
                                    : "%9.3f | %5.0f%% | %8.2f | %7s | %9.2f | %9.2f | %9.2f |",
            r->ms, r->spread_pct, rate, sp,
            (double)r->extra_bytes / 1e6, (double)r->read_bytes / 1e6, (double)r->write_bytes / 1e6);
    const double pk = c->dtype == FA_DTYPE_BF16 && peak[1] > 0 ? peak[1] : peak[0];
    if (peak[0] > 0 && c->dev == FA_BACKEND_CPU) fprintf(f, " %5.1f%% |", 100.0 * r->gflops / pk);
    else if (peak[0] > 0) fprintf(f, "      - |");
    fprintf(f, "\n");
}

/* ---------------------------------------------------------------------------------------------------------
 * The command
 * ------------------------------------------------------------------------------------------------------- */
static void bench_help(void) {
    printf(
        "usage: flashattn bench [--mode attention|kvcache] [options]    (comma lists expand to their Cartesian product)\n"
        "\n"
        "  --mode attention  (the default) fa_forward / fa_backward of every algorithm, the options below\n"
        "  --mode kvcache    fa_forward_kvcache, KV-cache decoding (also --mode decode): its options further below\n"
        "\n"
        "flashattn bench [--mode attention] [options]\n"
        "\n"
        "Times attention with the protocol of docs/benchmarks.md: model dim 2048 (heads = 2048/d), batch*seqlen = --tokens,\n"
        "warm-up, then the median of --reps runs; the algorithms of one configuration run interleaved.\n"
        "\n"
        "  --device LIST     cpu, cuda                                   (default cpu)\n"
        "  --algo LIST       standard, flash1, flash2, flash3, auto      (default standard,flash1,flash2; CUDA +flash3)\n"
        "  --d LIST          head_dim of q and k, 1..256 (also --head-dim) (default 64)\n"
        "  --dv LIST         head_dim of v and out (dv), 1..256           (default = d)\n"
        "  --sinks LIST      0, 1: learnable sinks, a random fp32 vector [heads] on the device (bwd: and d_sinks);\n"
        "                    0,1 times each algorithm without and with them interleaved   (default 0)\n"
        "  --seqlen LIST     query length                                (default 1024)\n"
        "  --seqlen-k LIST   key length                                  (default = seqlen)\n"
        "  --causal LIST     0, 1                                        (default 0)\n"
        "  --window LIST     sliding window W (keys within W of the diagonal; -1 = none)  (default -1)\n"
        "  --gqa LIST        query heads per K/V head (must divide heads) (default 1)\n"
        "  --dtype LIST      f32, f16, bf16, f8_e4m3 (forward; out bf16)   (default f32 on cpu, bf16 on cuda)\n"
        "  --pass LIST       fwd, bwd (bwd times fa_backward only)       (default fwd)\n"
        "  --tokens N        batch*seqlen when --batch is not given      (default 16384)\n"
        "  --batch LIST      batch size (overrides --tokens)\n"
        "  --heads LIST      query heads (overrides 2048/d)\n"
        "  --threads LIST    CPU threads, 0 = all                        (default 0)\n"
        "  --block-q LIST    Br, 0 = default (bwd rows: the bwd's tiles) (default 0)\n"
        "  --block-k LIST    Bc, 0 = library default                     (default 0)\n"
        "  --reps N          timed repetitions (protocol: >= 10)         (default 10)\n"
        "  --warmup N        warm-up calls per algorithm                 (default 1)\n"
        "  --until-ci PCT    after --reps, repeat until the 95%% confidence interval of every median is at most\n"
        "                    PCT %% of it (at most %d repetitions; 0 = off)   (default 0)\n"
        "  --max-seconds S   with --until-ci: stop repeating a configuration after S seconds of timed calls\n"
        "  --mem-limit MB    host memory the run may use (default: 90%% of MemAvailable)\n"
        "  --csv             CSV with the columns\n"
        "                    device,algo,dtype,batch,heads,seqlen_q,seqlen_k,head_dim,causal,pass,ms,gflops,\n"
        "                    peak_extra_mb,slow_read_mb,slow_write_mb,head_dim_v,sinks\n"
        "  --json            JSON array (all fields, the kernel and failure reasons)\n"
        "  --peak            first measure this CPU's matmul ceilings (our fp32 micro-kernel, bf16 dot product, BLAS\n"
        "                    sgemm when linked); the table then shows each CPU row's GFLOP/s as %% of its dtype's\n"
        "                    peak (bf16 rows: the bf16 dot-product kernel when the CPU has one, else fp32)\n"
        "\n"
        "ms is the median; spread = (max-min)/median; ms_ci_lo/ms_ci_hi (JSON, the report's CSV) the 95%% interval of\n"
        "the median from order statistics. MB = 10^6 bytes. gflops = fa_last_stats flops / median time\n"
        "(2*B*H*Sq*Sk_visible*(d+dv): d for QK^T, dv for PV; x2.5 for bwd). peak_extra_mb = memory the call needed beyond its inputs and outputs.\n"
        "A configuration that cannot run prints a row with the reason (skip / oom / error) and the run continues;\n"
        "in CSV the ms field holds that status and the reason goes to stderr.\n\n",
        BENCH_TIMES_MAX);
    bench_kvcache_help();
}

typedef struct bench_args {
    int_list dev, algo, d, dv, sinks, seqlen, seqlen_k, causal, window, gqa, dtype, pass, batch, heads, threads, bq, bk;
    int have_dv, have_seqlen_k, have_batch, have_heads, have_dtype, have_algo;
    int64_t tokens, reps, warmup;
    double until_ci_pct, max_seconds; /* --until-ci, --max-seconds (0: off) */
    double mem_limit_mb;
    int csv, json;
    int peak; /* --peak: measure the machine's matmul ceilings first; the table shows % of peak */
} bench_args;

static int bench_parse(int argc, char **argv, bench_args *a) {
    const char *S = "bench";
    memset(a, 0, sizeof *a);
    a->dev.n = 1; a->dev.v[0] = FA_BACKEND_CPU;
    a->algo.n = 3; a->algo.v[0] = FA_ALGO_STANDARD; a->algo.v[1] = FA_ALGO_FLASH1; a->algo.v[2] = FA_ALGO_FLASH2;
    a->d.n = 1; a->d.v[0] = 64;
    a->seqlen.n = 1; a->seqlen.v[0] = 1024;
    a->causal.n = 1; a->causal.v[0] = 0;
    a->sinks.n = 1; a->sinks.v[0] = 0;
    a->window.n = 1; a->window.v[0] = -1;
    a->gqa.n = 1; a->gqa.v[0] = 1;
    a->pass.n = 1; a->pass.v[0] = 0;
    a->threads.n = 1; a->threads.v[0] = 0;
    a->bq.n = 1; a->bq.v[0] = 0;
    a->bk.n = 1; a->bk.v[0] = 0;
    a->tokens = 16384;
    a->reps = 10;
    a->warmup = 1;
    a->mem_limit_mb = 0;
    for (int i = 0; i < argc; i++) {
        const char *x = argv[i], *v;
        int rc = 0;
#define LISTOPT(name, fn, ...)                                                                                         \
    if (opt_is(x, name)) {                                                                                             \
        if (!(v = opt_value(S, argc, argv, &i, name))) return -1;                                                      \
        rc = fn(S, name, v, __VA_ARGS__);                                                                              \
        if (rc) return -1;                                                                                             \
        continue;                                                                                                      \
    }
        if (strcmp(x, "--help") == 0 || strcmp(x, "-h") == 0) {
            bench_help();
            return 1;
        }
        if (opt_is(x, "--mode")) { /* cmd_bench sent any other mode to its own parser */
            if (!(v = opt_value(S, argc, argv, &i, "--mode"))) return -1;
            if (strcmp(v, "attention")) return cli_usage_error(S, "--mode: '%s' (attention or kvcache)", v), -1;
            continue;
        }
        if (strcmp(x, "--csv") == 0) { a->csv = 1; continue; }
        if (strcmp(x, "--peak") == 0) { a->peak = 1; continue; }
        if (strcmp(x, "--json") == 0) { a->json = 1; continue; }
        LISTOPT("--device", parse_device_list, &a->dev)
        if (opt_is(x, "--algo")) a->have_algo = 1;
        LISTOPT("--algo", parse_algo_list, &a->algo)
        LISTOPT("--d", parse_int_list, 1, 256, &a->d)
        LISTOPT("--head-dim", parse_int_list, 1, 256, &a->d)
        if (opt_is(x, "--dv")) {
            if (!(v = opt_value(S, argc, argv, &i, "--dv")) || parse_int_list(S, "--dv", v, 1, 256, &a->dv)) return -1;
            a->have_dv = 1;
            continue;
        }
        LISTOPT("--sinks", parse_int_list, 0, 1, &a->sinks)
        LISTOPT("--seqlen", parse_int_list, 1, 1 << 24, &a->seqlen)
        if (opt_is(x, "--seqlen-k")) {
            if (!(v = opt_value(S, argc, argv, &i, "--seqlen-k")) || parse_int_list(S, "--seqlen-k", v, 1, 1 << 24, &a->seqlen_k))
                return -1;
            a->have_seqlen_k = 1;
            continue;
        }
        LISTOPT("--causal", parse_int_list, 0, 1, &a->causal)
        LISTOPT("--window", parse_int_list, -1, 1 << 24, &a->window)
        LISTOPT("--gqa", parse_int_list, 1, 1 << 16, &a->gqa)
        if (opt_is(x, "--dtype")) {
            if (!(v = opt_value(S, argc, argv, &i, "--dtype")) || parse_dtype_list(S, "--dtype", v, &a->dtype, 1)) return -1;
            a->have_dtype = 1;
            continue;
        }
        LISTOPT("--pass", parse_pass_list, &a->pass)
        if (opt_is(x, "--batch")) {
            if (!(v = opt_value(S, argc, argv, &i, "--batch")) || parse_int_list(S, "--batch", v, 1, 1 << 24, &a->batch))
                return -1;
            a->have_batch = 1;
            continue;
        }
        if (opt_is(x, "--heads")) {
            if (!(v = opt_value(S, argc, argv, &i, "--heads")) || parse_int_list(S, "--heads", v, 1, 1 << 16, &a->heads))
                return -1;
            a->have_heads = 1;
            continue;
        }
        LISTOPT("--threads", parse_int_list, 0, 1024, &a->threads)
        LISTOPT("--block-q", parse_int_list, 0, 1 << 16, &a->bq)
        LISTOPT("--block-k", parse_int_list, 0, 1 << 16, &a->bk)
        if (opt_is(x, "--tokens")) {
            if (!(v = opt_value(S, argc, argv, &i, "--tokens")) || parse_int(S, "--tokens", v, 1, (int64_t)1 << 40, &a->tokens))
                return -1;
            continue;
        }
        if (opt_is(x, "--reps")) {
            if (!(v = opt_value(S, argc, argv, &i, "--reps")) || parse_int(S, "--reps", v, 1, 100000, &a->reps)) return -1;
            continue;
        }
        if (opt_is(x, "--warmup")) {
            if (!(v = opt_value(S, argc, argv, &i, "--warmup")) || parse_int(S, "--warmup", v, 0, 1000, &a->warmup))
                return -1;
            continue;
        }
        const int rep = opt_repeat(S, argc, argv, &i, &a->until_ci_pct, &a->max_seconds);
        if (rep < 0) return -1;
        if (rep) continue;
        if (opt_is(x, "--mem-limit")) {
            if (!(v = opt_value(S, argc, argv, &i, "--mem-limit")) ||
                parse_double(S, "--mem-limit", v, 1, 1e12, &a->mem_limit_mb))
                return -1;
            continue;
        }
#undef LISTOPT
        cli_usage_error(S, "unknown argument '%s'", x);
        return -1;
    }
    if (a->csv && a->json) {
        cli_usage_error(S, "--csv and --json are exclusive");
        return -1;
    }
    return 0;
}

int64_t bench_default_mem_limit(void) { return (int64_t)((double)host_mem_available() * 0.9); }

/* The product of A, one configuration group at a time; sink gets each device and each row. */
static int bench_run_parsed(const bench_args *A, const bench_sink *sink) {
    int64_t mem_limit = A->mem_limit_mb > 0 ? (int64_t)(A->mem_limit_mb * 1e6) : bench_default_mem_limit();
    int cuda_used = 0;
    for (int i = 0; i < A->dev.n; i++) cuda_used |= A->dev.v[i] == FA_BACKEND_CUDA;
    if (!cuda_used) cli_limit_address_space(mem_limit);
    int any_ok = 0, any_row = 0;
    fa_algo algos[8];
    int n_algo = A->algo.n > 8 ? 8 : A->algo.n;
    for (int i = 0; i < n_algo; i++) algos[i] = (fa_algo)A->algo.v[i];

    for (int di = 0; di < A->dev.n; di++) {
        fa_backend dev = (fa_backend)A->dev.v[di];
        /* the default list: STANDARD, FLASH1, FLASH2, and FLASH3 where it exists (CUDA) */
        n_algo = A->algo.n > 8 ? 8 : A->algo.n;
        if (!A->have_algo && dev == FA_BACKEND_CUDA) algos[n_algo++] = FA_ALGO_FLASH3;
        /* --sinks 0,1: each algorithm twice in one group, without and with sinks, timed interleaved (the ratio of
         * the two is the cost of the sinks); with more than 4 algorithms the two are groups of their own */
        const int alt = A->sinks.n == 2 && A->sinks.v[0] != A->sinks.v[1] && 2 * n_algo <= 8;
        fa_algo slots[8];
        const int n_slot = alt ? 2 * n_algo : n_algo;
        for (int a = 0; a < n_slot; a++) slots[a] = alt ? algos[a / 2] : algos[a];
        int_list dtypes = A->dtype;
        if (!A->have_dtype) {
            dtypes.n = 1;
            dtypes.v[0] = dev == FA_BACKEND_CUDA ? FA_DTYPE_BF16 : FA_DTYPE_F32;
        }
        for (int ti = 0; ti < A->threads.n; ti++) {
            int threads = (int)A->threads.v[ti];
            fa_context *ctx = NULL;
            fa_status st = fa_context_create(&ctx, dev, dev == FA_BACKEND_CPU ? threads : 0);
            if (st != FA_OK) {
                char why[300];
                snprintf(why, sizeof why, "%s: %s", fa_status_string(st), fa_create_error());
                if (sink->on_device) sink->on_device(dev, -1, why, sink->user);
                continue;
            }
            if (sink->on_device) {
                char desc[512];
                device_describe(dev, fa_context_threads(ctx), desc, sizeof desc);
                sink->on_device(dev, fa_context_threads(ctx), desc, sink->user);
            }
            for (int ty = 0; ty < dtypes.n; ty++)
            for (int dd = 0; dd < A->d.n; dd++)
            for (int dvi = 0; dvi < (A->have_dv ? A->dv.n : 1); dvi++)
            for (int ki = 0; ki < (alt ? 1 : A->sinks.n); ki++)
            for (int si = 0; si < A->seqlen.n; si++)
            for (int ski = 0; ski < (A->have_seqlen_k ? A->seqlen_k.n : 1); ski++)
            for (int ci = 0; ci < A->causal.n; ci++)
            for (int wi = 0; wi < A->window.n; wi++)
            for (int gi = 0; gi < A->gqa.n; gi++)
            for (int pi = 0; pi < A->pass.n; pi++)
            for (int bqi = 0; bqi < A->bq.n; bqi++)
            for (int bki = 0; bki < A->bk.n; bki++)
            for (int bi = 0; bi < (A->have_batch ? A->batch.n : 1); bi++)
            for (int hi = 0; hi < (A->have_heads ? A->heads.n : 1); hi++) {
                bench_config c;
                memset(&c, 0, sizeof c);
                c.dev = dev;
                c.dtype = (fa_dtype)dtypes.v[ty];
                c.head_dim = A->d.v[dd];
                c.head_dim_v = A->have_dv ? A->dv.v[dvi] : c.head_dim;
                c.sinks = alt ? 0 : (int)A->sinks.v[ki];
                c.sinks_alt = alt;
                c.seqlen_q = A->seqlen.v[si];
                c.seqlen_k = A->have_seqlen_k ? A->seqlen_k.v[ski] : c.seqlen_q;
                c.causal = (int)A->causal.v[ci];
                c.window = (int)A->window.v[wi];
                c.backward = (int)A->pass.v[pi];
                c.block_q = (int)A->bq.v[bqi];
                c.block_k = (int)A->bk.v[bki];
                c.threads = threads;
                c.reps = (int)A->reps;
                c.warmup = (int)A->warmup;
                c.until_ci = A->until_ci_pct / 100;
                c.max_seconds = A->max_seconds;
                c.heads = A->have_heads ? A->heads.v[hi] : (2048 / c.head_dim > 0 ? 2048 / c.head_dim : 1);
                c.batch = A->have_batch ? A->batch.v[bi] : (A->tokens / c.seqlen_q > 0 ? A->tokens / c.seqlen_q : 1);
                int64_t g = A->gqa.v[gi];
                bench_row rows[8];
                if (sink->on_group) sink->on_group(&c, sink->user);
                if (c.heads % g != 0) {
                    c.heads_k = c.heads;
                    for (int a = 0; a < n_slot; a++) {
                        memset(&rows[a], 0, sizeof rows[a]);
                        rows[a].cfg = c;
                        rows[a].cfg.sinks = alt ? a % 2 : c.sinks, rows[a].cfg.sinks_alt = 0;
                        rows[a].algo = slots[a];
                        snprintf(rows[a].status, sizeof rows[a].status, "skip");
                        snprintf(rows[a].note, sizeof rows[a].note, "--gqa %lld does not divide heads %lld",
                                 (long long)g, (long long)c.heads);
                    }
                } else {
                    c.heads_k = c.heads / g;
                    bench_run_group(ctx, &c, slots, n_slot, mem_limit, rows);
                }
                for (int a = 0; a < n_slot; a++) {
                    any_row = 1;
                    any_ok |= rows[a].ok;
                    if (sink->on_row) sink->on_row(&rows[a], sink->user);
                }
            }
            if (sink->on_device_end) sink->on_device_end(dev, sink->user);
            fa_context_destroy(ctx);
        }
    }
    if (!any_row) return 1;
    return any_ok ? 0 : 1;
}

int bench_run_args(int argc, char **argv, const bench_sink *sink) {
    bench_args A;
    int rc = bench_parse(argc, argv, &A);
    if (rc) return rc > 0 ? 0 : CLI_EXIT_USAGE;
    return bench_run_parsed(&A, sink);
}

/* ---- the printing sink of `flashattn bench` ---- */
typedef struct print_state {
    const bench_args *A;
    int first_json;
    double peak[2]; /* fp32, bf16 GFLOP/s of the micro-kernels on the CPU, 0 = not measured */
} print_state;

static void print_device(fa_backend dev, int threads, const char *desc, void *user) {
    print_state *p = user;
    if (threads < 0) {
        fprintf(stderr, "flashattn bench: device %s: %s (rows skipped)\n", fa_backend_name(dev), desc);
        if (!p->A->csv && !p->A->json) printf("device %s: skip (%s)\n\n", fa_backend_name(dev), desc);
        return;
    }
    if (p->A->csv || p->A->json) return;
    printf("flashattn %s — device %s: %s — reps %lld (median), warm-up %lld\n\n", fa_version_string(),
           fa_backend_name(dev), desc, (long long)p->A->reps, (long long)p->A->warmup);
    table_header(stdout, dev, p->peak[0]);
}

static void print_device_end(fa_backend dev, void *user) {
    print_state *p = user;
    (void)dev;
    if (!p->A->csv && !p->A->json) printf("\n");
}

static void print_row(const bench_row *r, void *user) {
    print_state *p = user;
    if (p->A->csv) {
        bench_csv_row(stdout, r, 0);
        if (!r->ok)
            fprintf(stderr, "flashattn bench: %s %s d=%lld seqlen=%lld %s: %s\n", fa_algo_name(r->algo),
                    fa_backend_name(r->cfg.dev), (long long)r->cfg.head_dim, (long long)r->cfg.seqlen_q, r->status,
                    r->note);
    } else if (p->A->json) {
        bench_json_row(stdout, r, p->first_json);
        p->first_json = 0;
    } else {
        table_row(stdout, r, p->peak);
    }
    fflush(stdout);
}

int cmd_bench(int argc, char **argv) {
    for (int i = 0; i < argc; i++) /* --mode kvcache has its own options (bench_kvcache.c) */
        if (opt_is(argv[i], "--mode")) {
            const char *v = opt_value("bench", argc, argv, &i, "--mode");
            if (!v) return CLI_EXIT_USAGE;
            if (bench_mode_is_kvcache(v)) return cmd_bench_kvcache(argc, argv);
            if (strcmp(v, "attention")) return cli_usage_error("bench", "--mode: '%s' (attention or kvcache)", v);
        }
    bench_args A;
    int rc = bench_parse(argc, argv, &A);
    if (rc) return rc > 0 ? 0 : CLI_EXIT_USAGE;
    print_state ps = {&A, 1, {0, 0}};
    if (A.peak) {
        fa_cpu_peak pk;
        fa_cpu_measure_peak(A.threads.v[0], 0.5, &pk);
        ps.peak[0] = pk.fp32;
        ps.peak[1] = pk.bf16;
        FILE *f = A.csv || A.json ? stderr : stdout; /* keep CSV/JSON clean */
        if (!pk.isa) { /* the selector refused FA_CPU_ISA: the rows below say so too */
            fprintf(stderr, "flashattn bench: --peak: %s\n", pk.why);
            return 1;
        }
        fprintf(f, "peak (cpu, kernels %s, %d threads): fp32 micro-kernel %.1f GFLOP/s (%.1f on 1 thread)", pk.isa,
                pk.threads, pk.fp32, pk.fp32_1t);
        if (pk.bf16 > 0) fprintf(f, ", bf16 %s %.1f", pk.isa && !strcmp(pk.isa, "amx") ? "tiles" : "dot", pk.bf16);
        if (pk.blas > 0) fprintf(f, ", BLAS sgemm 4096^3 %.1f", pk.blas);
        else fprintf(f, ", BLAS: not linked");
        fprintf(f, "\nceiling assumed: %d fp32 lanes x %d FMA units (register-only FMAs: %.1f GFLOP/s on 1 thread) x 2 "
                   "x %.2f GHz (dependent adds) x %d threads = %.1f GFLOP/s fp32", pk.lanes, pk.fma_units, pk.fma_1t,
                pk.ghz, pk.threads, pk.fp32_theory);
        if (pk.bf16_theory > 0) fprintf(f, ", %.1f bf16", pk.bf16_theory);
        if (pk.fp32_theory > 0) fprintf(f, "; micro-kernel at %.0f%% of it", 100.0 * pk.fp32 / pk.fp32_theory);
        fprintf(f, "\nBLAS: %s\n\n", pk.blas_info);
    }
    bench_sink sink = {print_device, NULL, print_row, print_device_end, &ps};
    if (A.csv) bench_csv_header(stdout, 0);
    if (A.json) printf("[\n");
    rc = bench_run_parsed(&A, &sink);
    if (A.json) printf("\n]\n");
    return rc;
}
