/* flashattn io: the slow-memory bytes each algorithm moved (counted by the CPU backend's tile transfers and
 * reported by fa_last_stats) next to the FlashAttention paper's formulas (Theorem 2: standard Θ(Nd + N²),
 * flash Θ(N²d²/M)) and next to each algorithm's transfers as the papers write them.
 *
 * Units: elements are fp32 (4 bytes); N = seqlen, d = head_dim, M = fast memory (SRAM) in ELEMENTS = bytes / 4.
 * The paper's blocks from M: Bc = ceil(M / (4d)), Br = min(Bc, d) (elements = rows). Without --sram, M is the one
 * the blocks imply: M = 4·Bc·d elements. Formulas are per (batch, head), multiplied by batch·heads. */
#include "common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void io_blocks_from_sram(int64_t sram_bytes, int64_t d, int *br, int *bc) {
    int64_t m = sram_bytes / 4;
    int64_t c = (m + 4 * d - 1) / (4 * d);
    if (c < 1) c = 1;
    *bc = (int)c;
    *br = (int)(c < d ? c : d);
}

/* Transfers of each algorithm as its paper writes it (forward; elements), per (batch, head). */
static void paper_model(fa_algo algo, double n, double d, double br, double bc, double *rd, double *wr) {
    double tr = ceil(n / br), tc = ceil(n / bc);
    switch (algo) {
    case FA_ALGO_STANDARD: /* Algorithm 0: read Q,K; write S; read S, write P; read P,V; write O */
        *rd = 2 * n * d + n * n + n * n + n * d;
        *wr = n * n + n * n + n * d;
        break;
    case FA_ALGO_FLASH1: /* Algorithm 1: init O,l,m; per K/V block j: Kj,Vj once; per i: read Qi,Oi,li,mi, write Oi,li,mi */
        *rd = 2 * n * d + tc * (2 * n * d + 2 * n);
        *wr = n * d + 2 * n + tc * (n * d + 2 * n);
        break;
    default: /* FLASH2: per Q block: read Qi once, all Kj,Vj; write Oi and LSEi once */
        *rd = n * d + tr * 2 * n * d;
        *wr = n * d + n;
        break;
    }
}

void io_run(fa_context *ctx, const io_config *c, fa_algo algo, io_row *r) {
    memset(r, 0, sizeof *r);
    r->algo = algo;
    r->batch = c->batch;
    r->heads = c->heads;
    r->seqlen = c->seqlen;
    r->head_dim = c->head_dim;
    r->causal = c->causal;
    r->backward = c->backward;
    bench_config bc;
    memset(&bc, 0, sizeof bc);
    bc.dev = FA_BACKEND_CPU;
    bc.dtype = FA_DTYPE_F32;
    bc.batch = c->batch;
    bc.heads = bc.heads_k = c->heads;
    bc.seqlen_q = bc.seqlen_k = c->seqlen;
    bc.head_dim = bc.head_dim_v = c->head_dim;
    bc.causal = c->causal;
    bc.window = -1;
    bc.backward = c->backward;
    bc.threads = c->threads;
    bc.block_q = c->block_q;
    bc.block_k = c->block_k;
    if (c->sram_bytes > 0 && algo != FA_ALGO_STANDARD)
        io_blocks_from_sram(c->sram_bytes, c->head_dim, &bc.block_q, &bc.block_k);
    bc.reps = 1;
    bc.warmup = 0;
    /* Counted bytes come from the same measurement function as `flashattn bench` (one call, no timing needed). */
    bench_row row;
    bench_run_group(ctx, &bc, &algo, 1, bench_default_mem_limit(), &row);
    if (!row.ok) {
        snprintf(r->note, sizeof r->note, "%s: %.180s", row.status, row.note);
        return;
    }
    r->ok = 1;
    r->block_q = row.block_q;
    r->block_k = row.block_k;
    r->read_bytes = row.read_bytes;
    r->write_bytes = row.write_bytes;
    double n = (double)c->seqlen, d = (double)c->head_dim, bh = (double)(c->batch * c->heads);
    double m_elems = c->sram_bytes > 0 ? (double)c->sram_bytes / 4.0 : 4.0 * (double)r->block_k * d;
    r->sram_bytes = (int64_t)(m_elems * 4.0);
    if (algo == FA_ALGO_STANDARD) {
        snprintf(r->formula, sizeof r->formula, "Nd + N^2");
        r->paper_bytes = 4.0 * bh * (n * d + n * n);
    } else {
        snprintf(r->formula, sizeof r->formula, "N^2 d^2 / M");
        r->paper_bytes = 4.0 * bh * (n * n * d * d / m_elems);
    }
    if (!c->backward && !c->causal) {
        double rd, wr;
        paper_model(algo, n, d, r->block_q, r->block_k, &rd, &wr);
        r->model_bytes = 4.0 * bh * (rd + wr);
    } else {
        r->model_bytes = NAN;
    }
}

void io_csv_header(FILE *f) {
    fprintf(f, "algo,batch,heads,seqlen,head_dim,causal,pass,block_q,block_k,sram_bytes,slow_read_bytes,"
               "slow_write_bytes,total_bytes,formula,formula_bytes,model_bytes\n");
}

void io_csv_row(FILE *f, const io_row *r) {
    fprintf(f, "%s,%lld,%lld,%lld,%lld,%d,%s,", fa_algo_name(r->algo), (long long)r->batch, (long long)r->heads,
            (long long)r->seqlen, (long long)r->head_dim, r->causal, r->backward ? "bwd" : "fwd");
    if (!r->ok) {
        fprintf(f, ",,,,,,,,\n");
        return;
    }
    fprintf(f, "%d,%d,%lld,%lld,%lld,%lld,%s,%.0f,", r->block_q, r->block_k, (long long)r->sram_bytes,
            (long long)r->read_bytes, (long long)r->write_bytes, (long long)(r->read_bytes + r->write_bytes),
            r->formula, r->paper_bytes);
    if (isnan(r->model_bytes)) fprintf(f, "\n");
    else fprintf(f, "%.0f\n", r->model_bytes);
}

static void io_help(void) {
    printf("usage: flashattn io --seqlen N --d D [--block-q Br --block-k Bc | --sram BYTES] [options]\n"
           "\n"
           "Runs each algorithm once on the CPU (fp32) and prints the slow-memory bytes it moved (counted by the\n"
           "library's tile transfers, fa_last_stats) next to the FlashAttention paper's bounds (Theorem 2):\n"
           "standard Θ(Nd + N²), flash Θ(N²d²/M), and next to the algorithm's transfers as the paper writes them.\n"
           "(FLASH3 runs on CUDA only; KV-cache decoding's bytes are in `flashattn bench --mode kvcache`.)\n"
           "\n"
           "  --seqlen N        sequence length (queries = keys)            (required)\n"
           "  --d D             head_dim, 1..256                            (required)\n"
           "  --block-q Br      query block rows (FLASH1/FLASH2)            (default: the library's)\n"
           "  --block-k Bc      key block rows                              (default: the library's)\n"
           "  --sram BYTES      fast-memory size M: blocks as the paper, Bc = ceil(M/4d), Br = min(Bc, d)\n"
           "                    (M in fp32 elements = BYTES/4; accepts K/M suffixes, e.g. 96K)\n"
           "  --algo LIST       standard, flash1, flash2                    (default all three)\n"
           "  --batch B         (default 1)   --heads H (default 1)\n"
           "  --causal 0|1      (default 0)   --pass fwd|bwd (default fwd)   --threads T (default 0 = all)\n"
           "  --csv             CSV (bytes, exact)\n"
           "\n"
           "Units: elements are fp32 (4 bytes); formula bytes = 4 × formula × batch × heads with the Θ constant 1;\n"
           "without --sram, M is the fast memory the blocks imply (M = 4·Bc·d elements). MB = 10^6 bytes.\n");
}

static int parse_bytes(const char *S, const char *opt, const char *arg, int64_t *out) {
    if (!arg || !*arg) return cli_usage_error(S, "%s: empty value", opt), -1;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", arg);
    size_t n = strlen(buf);
    int64_t mul = 1;
    if (n > 0 && (buf[n - 1] == 'K' || buf[n - 1] == 'k')) mul = 1024, buf[n - 1] = 0;
    else if (n > 0 && (buf[n - 1] == 'M' || buf[n - 1] == 'm')) mul = 1024 * 1024, buf[n - 1] = 0;
    int64_t v;
    if (parse_int(S, opt, buf, 1, ((int64_t)1 << 40) / mul, &v)) return -1;
    if (v * mul < 16) return cli_usage_error(S, "%s: %lld bytes is too small (at least 16)", opt, (long long)(v * mul)), -1;
    *out = v * mul;
    return 0;
}

int io_parse_args(int argc, char **argv, io_config *out, int_list *algos_out, int *csv_out) {
    const char *S = "io";
    io_config c;
    memset(&c, 0, sizeof c);
    c.batch = c.heads = 1;
    int_list algos = {3, {FA_ALGO_STANDARD, FA_ALGO_FLASH1, FA_ALGO_FLASH2}};
    int csv = 0, have_n = 0, have_d = 0;
    for (int i = 0; i < argc; i++) {
        const char *x = argv[i], *v;
        int64_t t;
        if (strcmp(x, "--help") == 0 || strcmp(x, "-h") == 0) {
            io_help();
            return 1;
        }
        if (strcmp(x, "--csv") == 0) { csv = 1; continue; }
#define INTOPT(name, lo, hi, dst)                                                                                      \
    if (opt_is(x, name)) {                                                                                             \
        if (!(v = opt_value(S, argc, argv, &i, name)) || parse_int(S, name, v, lo, hi, &t)) return -1;                 \
        dst = t;                                                                                                       \
        continue;                                                                                                      \
    }
        if (opt_is(x, "--seqlen")) have_n = 1;
        if (opt_is(x, "--d")) have_d = 1;
        INTOPT("--seqlen", 1, 1 << 24, c.seqlen)
        INTOPT("--d", 1, 256, c.head_dim)
        INTOPT("--block-q", 1, 1 << 16, c.block_q)
        INTOPT("--block-k", 1, 1 << 16, c.block_k)
        INTOPT("--batch", 1, 1 << 20, c.batch)
        INTOPT("--heads", 1, 1 << 16, c.heads)
        INTOPT("--causal", 0, 1, c.causal)
        INTOPT("--threads", 0, 1024, c.threads)
#undef INTOPT
        if (opt_is(x, "--sram")) {
            if (!(v = opt_value(S, argc, argv, &i, "--sram")) || parse_bytes(S, "--sram", v, &c.sram_bytes)) return -1;
            continue;
        }
        if (opt_is(x, "--algo")) {
            if (!(v = opt_value(S, argc, argv, &i, "--algo")) || parse_algo_list(S, "--algo", v, &algos)) return -1;
            continue;
        }
        if (opt_is(x, "--pass")) {
            int_list p;
            if (!(v = opt_value(S, argc, argv, &i, "--pass")) || parse_pass_list(S, "--pass", v, &p)) return -1;
            if (p.n != 1) return cli_usage_error(S, "--pass: give one of fwd, bwd"), -1;
            c.backward = (int)p.v[0];
            continue;
        }
        return cli_usage_error(S, "unknown argument '%s'", x), -1;
    }
    if (!have_n) return cli_usage_error(S, "--seqlen is required"), -1;
    if (!have_d) return cli_usage_error(S, "--d is required"), -1;
    if (c.sram_bytes && (c.block_q || c.block_k))
        return cli_usage_error(S, "--sram derives the blocks; do not combine it with --block-q/--block-k"), -1;
    if (c.sram_bytes && c.sram_bytes / 4 < 4 * c.head_dim)
        fprintf(stderr, "flashattn io: note: --sram %lld bytes holds fewer than 4·d fp32 elements; Bc = 1\n",
                (long long)c.sram_bytes);
    *out = c;
    *algos_out = algos;
    *csv_out = csv;
    return 0;
}

int cmd_io(int argc, char **argv) {
    io_config c;
    int_list algos;
    int csv;
    int rc = io_parse_args(argc, argv, &c, &algos, &csv);
    if (rc) return rc > 0 ? 0 : CLI_EXIT_USAGE;
    cli_limit_address_space(bench_default_mem_limit());

    fa_context *ctx = NULL;
    fa_status st = fa_context_create(&ctx, FA_BACKEND_CPU, (int)c.threads);
    if (st != FA_OK) {
        fprintf(stderr, "flashattn io: %s: %s\n", fa_status_string(st), fa_create_error());
        return 1;
    }
    io_row rows[CLI_MAX_LIST];
    int n = algos.n, any_fail = 0;
    for (int a = 0; a < n; a++) {
        io_run(ctx, &c, (fa_algo)algos.v[a], &rows[a]);
        any_fail |= !rows[a].ok;
    }
    fa_context_destroy(ctx);

    if (csv) {
        io_csv_header(stdout);
        for (int a = 0; a < n; a++) io_csv_row(stdout, &rows[a]);
        return any_fail;
    }
    printf("flashattn io — N = %lld, d = %lld, batch %lld × heads %lld, fp32, %s%s\n", (long long)c.seqlen,
           (long long)c.head_dim, (long long)c.batch, (long long)c.heads, c.backward ? "backward" : "forward",
           c.causal ? ", causal" : "");
    if (c.sram_bytes) {
        int br, bc;
        io_blocks_from_sram(c.sram_bytes, c.head_dim, &br, &bc);
        printf("M = %lld bytes = %lld fp32 elements → Bc = ceil(M/4d) = %d, Br = min(Bc, d) = %d (paper, Algorithm 1)\n",
               (long long)c.sram_bytes, (long long)(c.sram_bytes / 4), bc, br);
    } else {
        printf("blocks: %s; M implied by the blocks: 4·Bc·d elements\n",
               c.block_q || c.block_k ? "as given" : "library defaults");
    }
    printf("\n| %-8s | %4s | %4s | %10s | %12s | %12s | %12s | %-12s | %12s | %9s | %12s | %13s |\n", "algo", "Br",
           "Bc", "M (KiB)", "read MB", "write MB", "total MB", "paper bound", "formula MB", "counted/Θ", "model MB",
           "counted/model");
    printf("|----------|-----:|-----:|-----------:|-------------:|-------------:|-------------:|--------------|"
           "-------------:|----------:|-------------:|--------------:|\n");
    for (int a = 0; a < n; a++) {
        const io_row *r = &rows[a];
        if (!r->ok) {
            printf("| %-8s | %s |\n", fa_algo_name(r->algo), r->note);
            continue;
        }
        double tot = (double)(r->read_bytes + r->write_bytes);
        char bq[16] = "-", bk[16] = "-", m[24] = "-", model[24] = "-", mratio[16] = "-";
        if (r->algo != FA_ALGO_STANDARD) {
            snprintf(bq, sizeof bq, "%d", r->block_q);
            snprintf(bk, sizeof bk, "%d", r->block_k);
            snprintf(m, sizeof m, "%.1f", (double)r->sram_bytes / 1024.0);
        }
        if (!isnan(r->model_bytes)) {
            snprintf(model, sizeof model, "%.3f", r->model_bytes / 1e6);
            snprintf(mratio, sizeof mratio, "%.3f", tot / r->model_bytes);
        }
        printf("| %-8s | %4s | %4s | %10s | %12.3f | %12.3f | %12.3f | %-12s | %12.3f | %9.3f | %12s | %13s |\n",
               fa_algo_name(r->algo), bq, bk, m, (double)r->read_bytes / 1e6, (double)r->write_bytes / 1e6, tot / 1e6,
               r->formula, r->paper_bytes / 1e6, tot / r->paper_bytes, model, mratio);
    }
    /* The comparisons the paper makes, from the counts. */
    const io_row *by[4] = {NULL, NULL, NULL, NULL};
    for (int a = 0; a < n; a++)
        if (rows[a].ok && rows[a].algo >= FA_ALGO_STANDARD && rows[a].algo <= FA_ALGO_FLASH2) by[rows[a].algo] = &rows[a];
#define TOT(r) ((double)((r)->read_bytes + (r)->write_bytes))
    printf("\n");
    if (by[FA_ALGO_STANDARD] && by[FA_ALGO_FLASH1])
        printf("STANDARD moves %.2f× the bytes of FLASH1\n", TOT(by[FA_ALGO_STANDARD]) / TOT(by[FA_ALGO_FLASH1]));
    if (by[FA_ALGO_STANDARD] && by[FA_ALGO_FLASH2])
        printf("STANDARD moves %.2f× the bytes of FLASH2\n", TOT(by[FA_ALGO_STANDARD]) / TOT(by[FA_ALGO_FLASH2]));
    if (by[FA_ALGO_FLASH1] && by[FA_ALGO_FLASH2])
        printf("FLASH1 moves %.2f× the bytes of FLASH2 (reads %.2f×, writes %.2f×)\n",
               TOT(by[FA_ALGO_FLASH1]) / TOT(by[FA_ALGO_FLASH2]),
               (double)by[FA_ALGO_FLASH1]->read_bytes / (double)by[FA_ALGO_FLASH2]->read_bytes,
               (double)by[FA_ALGO_FLASH1]->write_bytes / (double)by[FA_ALGO_FLASH2]->write_bytes);
#undef TOT
    printf("\ncounted = fa_last_stats slow_read_bytes + slow_write_bytes (exact for the CPU code); paper Θ = the\n"
           "Theorem 2 bound with constant 1; model = the algorithm's own transfers as written in the paper (forward,\n"
           "non-causal).\n");
    return any_fail;
}
