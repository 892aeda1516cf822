/* flashattn report: what its parts share. report.c drives them; calls go one way (report.c -> report_gpu.c,
 * report_kvcache.c, report_write.c -> report_plots.c, report_claims.c -> report_kvcache.c), and every part uses
 * report_util.c and quiet.c, which call none of them. */
#ifndef FA_CLI_REPORT_H
#define FA_CLI_REPORT_H

#include "common.h"

typedef struct rows_t {
    bench_row *v;
    double *others; /* per row: other processes' CPU use (cores) in the window it was measured in (quiet.c), -1
                       unknown */
    int n, cap;
    int probe_from, probe_to; /* the speed probe's readings taken while these rows were measured: [from, to) */
} rows_t;

typedef struct io_rows_t {
    io_row *v;
    int n, cap;
} io_rows_t;

/* ---- quiet.c: other processes' CPU use ---- */
typedef struct cpu_clock {
    double wall, busy, self; /* seconds: the wall clock, busy time of all CPUs (-1 unknown), this process's CPU time */
} cpu_clock;
void cpu_clock_now(cpu_clock *c);
/* Cores other processes kept busy between a and b (-1 unknown). */
double cpu_others(const cpu_clock *a, const cpu_clock *b);
/* The most other processes may use for the machine to count as quiet: 0.1 core + 10 % of the cores. */
double quiet_threshold(void);
/* Waits in windows of 0.25 s until other processes use at most quiet_threshold() (at least one window, at most
 * max_wait_s); returns their use in the last window (-1 unknown) and the seconds waited. */
double quiet_wait(double max_wait_s, double *waited_s);
/* A measured row is disturbed when other processes kept the CPUs busier than quiet_threshold() while it ran: the
 * claims leave it out (and are not settled when too few rows remain). */
int row_disturbed(double others);

/* A verdict's kind: what two runs of the report must agree on. A verdict is settled when the kind is the same at
 * both ends of the measurements' 95 % intervals; otherwise it is NOT_SETTLED, whatever the point estimates say. */
typedef enum verdict_kind { V_NOT_MEASURED, V_DOES_NOT_HOLD, V_PARTLY, V_DEPENDS, V_HOLDS, V_NOT_SETTLED } verdict_kind;

/* ---- probe.c: the machine's speed state ---- */
/* A shared VM changes speed on its own (docs/benchmarks.md, "The report"): a fixed reference is timed before every
 * point, and a claim whose measurements saw the reference move by more than FA_PROBE_BOUND reads not settled. */
enum { FA_PROBE_MAX = 512 };
#define FA_PROBE_BOUND 0.10
typedef struct speed_probe {
    fa_context *ctx; /* NULL: no probe (not opened, or it failed) */
    float *buf;      /* q, k, v, out */
    int heads;
    char what[128];            /* the reference in words */
    double bound;              /* the most the reference may move within a claim's measurements (fraction) */
    double t0;                 /* now_ms() when it was opened */
    double ms[FA_PROBE_MAX];     /* the readings, in order */
    double at[FA_PROBE_MAX];     /* when each was taken: seconds after t0 */
    double others[FA_PROBE_MAX]; /* other processes' CPU use in each reading's window (quiet.c), -1 unknown */
    int n;
} speed_probe;
/* The readings of [from, to) taken on a quiet machine (others <= quiet), each as the median of it and its two
 * neighbours (a lone slow reading is an interruption, not a state): how many, their range and median, the first,
 * and the one furthest from it. */
typedef struct probe_span {
    int n;
    double lo, hi, med, first, far;
} probe_span;
int probe_open(speed_probe *p, int threads); /* 0, or -1 (no probe: the report runs without) */
void probe_close(speed_probe *p);
double probe_time(speed_probe *p);          /* one reading (ms), NAN without a probe */
int probe_add(speed_probe *p, double ms);   /* its index, or -1 (full, or not a time) */
int probe_range(const speed_probe *p, int from, int to, double quiet, probe_span *s);
int probe_write_csv(const speed_probe *p, const char *path); /* the readings: 0, or -1 (errno) */
/* The decision: a timed claim of kind k keeps it while the reference stayed within (1 + bound) of its lowest
 * reading; otherwise it is NOT_SETTLED (fewer than 2 readings: k, as nothing can be told). */
verdict_kind probe_kind(verdict_kind k, const probe_span *s, double bound);
struct claim;
/* A timed claim's verdict with the probe: NOT_SETTLED with the reason ("the machine's speed changed during these
 * measurements: reference X ms → Y ms") when it moved, the verdict read alone kept after it; otherwise the verdict
 * as it was, with the reference's value appended, so that two reports can be compared. */
void probe_verdict(struct claim *c, const probe_span *s, double bound);

/* What one preset (--smoke, --quick, --full) measures. */
typedef struct preset {
    char name[16];
    int reps;           /* the least repetitions of a timed point ... */
    double until_ci;    /* ... then more until each median's 95 % interval is within this fraction of it ... */
    double max_seconds; /* ... or the point's timed calls took this long (bench --until-ci, --max-seconds) */
    double max_wait;    /* seconds the whole run may wait for other processes to leave the CPUs */
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
    double others; /* as rows_t.others */
} kv_row;

typedef struct dev_data {
    fa_backend dev;
    int present;
    rows_t speed, par, blocks, mem;
    kv_row kv[8]; /* the decoding section (report_kvcache.c) */
    int n_kv;
    int kv_probe_from, kv_probe_to; /* the speed probe's readings while the decoding section ran (as rows_t's) */
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
    char rule[96]; /* the repetition options of every timed bench command: --reps N [--until-ci PCT --max-seconds S] */
    int tty, gnuplot, cuda;
    char gp_term[16]; /* pngcairo, or png where gnuplot lacks cairo */
    int threads; /* CPU threads passed to every bench/io command (0 = all) */
    double t0, seconds, cpu_rate;
    int cpu_scale; /* the quick preset's CPU sizes times this (preset_size_cpu), 1 = as written */
    double load_start, load_end; /* 1-minute load average (Linux), -1 if unknown */
    /* Other processes' CPU use (quiet.c), in cores: before the first measurement (after waiting up to
     * half of max_wait for it to fall), and while measuring (time-weighted mean and worst group) */
    double others_start, others_mean, others_max;
    double waited;            /* seconds spent waiting for a quiet machine */
    double others_weight;     /* the measured seconds behind others_mean */
    int busy_windows, windows; /* measuring windows (quiet.c) in which others used more than quiet_threshold() */
    cpu_clock window;         /* when the current window began (wall < 0: none open) */
    struct {                  /* the rows measured in it: rows->others[i], or *slot */
        rows_t *rows;
        int i;
        double *slot;
    } pending[256];
    int n_pending;
    double work_total, work_done;
    char last_section[128];
    FILE *repro;
    speed_probe probe; /* the CPU's speed reference (probe.c), read before every point */
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
void rows_push(rows_t *r, const bench_row *x, double others); /* dropped when out of memory */
int io_rows_push(io_rows_t *r, const io_row *x);          /* 0, or -1 when out of memory */
/* `flashattn bench ARGV` into rows (no CSV, no progress). */
void report_bench_rows(int argc, char **argv, rows_t *rows);
/* DIR/name opened for writing with the header of its kind: 0 bench columns, 1 io columns, 2 ncu columns,
 * 3 kvcache columns. NULL (after a message) when it cannot be written. */
FILE *report_csv(report *R, const char *name, int kind);
/* The progress bar (stderr: one line redrawn on a terminal, else a line per section). */
void report_progress(report *R, const char *what);

/* quiet.c: measuring windows. Other processes' CPU use is read over windows of at least half a second (the
 * kernel's busy time comes in 10 ms ticks: a shorter window would misread it) and given to every row measured in
 * the window (report_window_row; rows is NULL for a slot of its own). report_point_begin, before each timed point,
 * closes a window that is long enough and, if it was busy, waits for the machine to be quiet again (within the
 * preset's allowance); report_window_close closes the last one when the measurements end. */
void report_point_begin(report *R);
/* One reading of the speed probe (when open), tagged with its window's other processes' use; report_point_begin
 * takes one before every point, and the report one after the last. */
void report_probe_reading(report *R);
void report_window_row(report *R, rows_t *rows, int i, double *slot);
void report_window_close(report *R);

/* GPU extras (report_gpu.c): ncu DRAM bytes and the PyTorch SDPA reference; each sets its *_status line. */
void report_ncu(report *R);
void report_torch(report *R);
const char *verdict_word(verdict_kind k); /* "holds", "does not hold", ... (report_claims.c) */

typedef struct claim { /* (probe.c: probe_verdict) */
    const char *claim;
    char measured[512];
    char result[1024];
    char verdict[640];
    verdict_kind kind;
} claim;

/* report_util.c: a / b for two medians measured apart (not paired), each with its 95 % interval: the intervals'
 * relative half-widths add in quadrature (independent estimates), giving the ratio's [lo, hi]. */
double cross_ratio(double a, double a_lo, double a_hi, double b, double b_lo, double b_hi, double *lo, double *hi);
/* report_util.c: the verdict of a claim whose measurements were too often disturbed (row_disturbed) to settle it. */
void claim_disturbed(claim *c, int busy, int total);
/* report_claims.c: the claims of one device (at most FA_REPORT_MAX_CLAIMS) from its rows; returns how many. */
enum { FA_REPORT_MAX_CLAIMS = 12 };
int build_claims(report *R, const dev_data *D, claim *cl, int *ncl);
/* The first row of rs matching (negative / -1 = any). */
const bench_row *find_row(const rows_t *rs, fa_algo a, int64_t d, int64_t n, int causal, int bwd, int64_t heads, int bq,
                          int bk);
double median_n(const double *x, int n);
/* The ratio ms(slow)/ms(fast) of two rows of one bench group, rep by rep (each rep of both ran in one round): its
 * median and the 95 % interval of that median. 0 when either row has no times. */
int paired_ratio(const bench_row *slow, const bench_row *fast, double *r, double *lo, double *hi);
/* Fast-memory working set of one FLASH2 step (fp32): Qi, Kj, Vj, S/P, Oi. */
double tile_bytes(int br, int bc, int d);

/* report_kvcache.c: the decoding measurements of one device, its two claims (written into cl[0..1]; returns how
 * many), and its markdown section. */
void report_measure_kvcache(report *R, fa_backend dev, dev_data *D);
int report_kvcache_claims(const dev_data *D, claim *cl);
void report_md_kvcache(FILE *f, const dev_data *D);

/* report_plots.c: the gnuplot scripts of the measured sections (and their PNGs when gnuplot is there); their names
 * in names[*n_names..]; returns how many PNGs were rendered. */
int report_plots(report *R, char names[][64], int *n_names);

/* Writes index.md, the plots, and prints the summary. Returns the exit status. */
int report_write(report *R);

#endif
