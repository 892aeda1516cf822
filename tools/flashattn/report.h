/* flashattn report: what its parts share. report.c drives them; calls go one way (report.c -> report_gpu.c,
 * report_kvcache.c, report_write.c -> report_claims.c -> report_kvcache.c), and every part uses report_util.c,
 * which calls none of them. */
#ifndef FA_CLI_REPORT_H
#define FA_CLI_REPORT_H

#include "common.h"

typedef struct rows_t {
    bench_row *v;
    int n, cap;
} rows_t;

typedef struct io_rows_t {
    io_row *v;
    int n, cap;
} io_rows_t;

/* What one preset (--smoke, --quick, --full) measures. */
typedef struct preset {
    char name[16];
    int reps;
    int64_t model_dim, tokens;
    int64_t seqlens[8];
    int n_seqlens;
    char seqlen_list[128], gpu_seqlen_list[128];
    int par_seqlen, par_max_heads;
    char par_heads_list[64];
    int blk_seqlen, blk_heads;
    int blk_q[8], n_blk_q;
    char blk_k_list[64];
    int n_blk_k;
    int64_t mem_seqlens[8];
    int n_mem_seqlens;
    int64_t io_seqlens[8];
    int n_io_seqlens;
    int64_t io_sram_seqlen;
    int64_t srams[8];
    int n_srams;
} preset;

typedef struct kv_row {
    kv_shape s;
    kv_result r;
} kv_row;

typedef struct dev_data {
    fa_backend dev;
    int present;
    rows_t speed, par, blocks, mem;
    kv_row kv[8]; /* the decoding section (report_kvcache.c) */
    int n_kv;
    int64_t probe_n;       /* the length at which STANDARD was predicted not to fit (0 = not probed) */
    double probe_need, probe_limit;
} dev_data;

typedef struct ncu_row {
    char algo[16], kernel[64], note[200];
    int64_t b, h, n, d;
    int ok, kernels;
    double dram_read, dram_write, model_read, model_write, compulsory;
} ncu_row;

typedef struct torch_row {
    char name[24];
    int64_t b, h, n, d;
    int causal, bwd;
    double ms, tflops;
} torch_row;

typedef struct report {
    char out[960];
    preset p;
    int tty, gnuplot, cuda;
    char gp_term[16]; /* pngcairo, or png where gnuplot lacks cairo */
    int threads; /* CPU threads passed to every bench/io command (0 = all) */
    double t0, seconds, cpu_rate;
    int cpu_scale; /* the quick preset's CPU sizes times this (preset_size_cpu), 1 = as written */
    double load_start, load_end; /* 1-minute load average (Linux), -1 if unknown */
    double work_total, work_done;
    char last_section[128];
    FILE *repro;
    dev_data cpu, gpu;
    io_rows_t io_seqlen, io_sram;
    ncu_row ncu[8];
    int n_ncu;
    char ncu_status[300];
    torch_row torch[256];
    int n_torch;
    char torch_status[300];
} report;

/* ---- report_util.c ---- */
void rows_push(rows_t *r, const bench_row *x);            /* dropped when out of memory */
int io_rows_push(io_rows_t *r, const io_row *x);          /* 0, or -1 when out of memory */
/* `flashattn bench ARGV` into rows (no CSV, no progress). */
void report_bench_rows(int argc, char **argv, rows_t *rows);
/* DIR/name opened for writing with the header of its kind: 0 bench columns, 1 io columns, 2 ncu columns,
 * 3 kvcache columns. NULL (after a message) when it cannot be written. */
FILE *report_csv(report *R, const char *name, int kind);
/* The progress bar (stderr: one line redrawn on a terminal, else a line per section). */
void report_progress(report *R, const char *what);

/* GPU extras (report_gpu.c): ncu DRAM bytes and the PyTorch SDPA reference; each sets its *_status line. */
void report_ncu(report *R);
void report_torch(report *R);
typedef struct claim {
    const char *claim;
    char measured[512];
    char result[1024];
    char verdict[512];
} claim;

/* report_claims.c: the claims of one device (at most 10) from its rows; returns how many. */
int build_claims(report *R, const dev_data *D, claim *cl, int *ncl);
/* The first row of rs matching (negative / -1 = any). */
const bench_row *find_row(const rows_t *rs, fa_algo a, int64_t d, int64_t n, int causal, int bwd, int64_t heads, int bq,
                          int bk);
double median_n(const double *x, int n);
/* Fast-memory working set of one FLASH2 step (fp32): Qi, Kj, Vj, S/P, Oi. */
double tile_bytes(int br, int bc, int d);

/* report_kvcache.c: the decoding measurements of one device, its two claims (written into cl[0..1]; returns how
 * many), and its markdown section. */
void report_measure_kvcache(report *R, fa_backend dev, dev_data *D);
int report_kvcache_claims(const dev_data *D, claim *cl);
void report_md_kvcache(FILE *f, const dev_data *D);

/* Writes index.md, the plots, and prints the summary. Returns the exit status. */
int report_write(report *R);

#endif
