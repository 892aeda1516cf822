/* flashattn CLI: shared helpers (argument parsing, device buffers, timing, random data) and the interfaces the
 * subcommands share. bench.c and io.c export the measurement functions that report.c reuses, so the report's numbers
 * come from the same code as `flashattn bench` and `flashattn io`. */
#ifndef FA_CLI_COMMON_H
#define FA_CLI_COMMON_H

#include "flashattn.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CLI_EXIT_USAGE 2
#define CLI_MAX_LIST 64

/* ---- argument parsing: every error names the argument and returns -1 (the caller exits with status 2) ---- */
typedef struct int_list {
    int n;
    int64_t v[CLI_MAX_LIST];
} int_list;

/* Print "flashattn SUB: error: ..." and a hint to stderr. Returns CLI_EXIT_USAGE. */
int cli_usage_error(const char *sub, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "64,128" -> list; every value in [lo, hi]. */
int parse_int_list(const char *sub, const char *opt, const char *arg, int64_t lo, int64_t hi, int_list *out);
int parse_int(const char *sub, const char *opt, const char *arg, int64_t lo, int64_t hi, int64_t *out);
int parse_double(const char *sub, const char *opt, const char *arg, double lo, double hi, double *out);
/* Lists of names; results stored as ints in out->v. */
int parse_algo_list(const char *sub, const char *opt, const char *arg, int_list *out);
int parse_dtype_list(const char *sub, const char *opt, const char *arg, int_list *out, int fp8);
int parse_kv_dtype_list(const char *sub, const char *opt, const char *arg, int_list *out); /* same: 0, e4m3: 1 */
int parse_device_list(const char *sub, const char *opt, const char *arg, int_list *out);
int parse_pass_list(const char *sub, const char *opt, const char *arg, int_list *out); /* 0 fwd, 1 bwd */
/* The value of option argv[*i] ("--x V" or "--x=V"); advances *i. NULL (after an error message) if missing. */
const char *opt_value(const char *sub, int argc, char **argv, int *i, const char *name);
/* 1 if argv[i] is "--name" or starts with "--name=". */
int opt_is(const char *arg, const char *name);
/* --until-ci PCT / --max-seconds S, the repetition options every bench mode takes: 1 when argv[*i] was one of them
 * (stored, *i advanced), 0 when it is neither, -1 after an error message. */
int opt_repeat(const char *sub, int argc, char **argv, int *i, double *until_ci_pct, double *max_seconds);

/* ---- device buffers: host memory for the CPU backend, device memory (cudart) for CUDA ---- */
typedef struct dev_buf {
    fa_backend dev;
    void *ptr;        /* host or device pointer */
    size_t bytes;
} dev_buf;
/* 0 on success; -1 when the allocation failed (nothing printed). */
int dev_alloc(dev_buf *b, fa_backend dev, size_t bytes);
/* Host memory of n bytes (NULL on failure; free() releases it): with huge, 2 MB aligned and advised as transparent
 * huge pages (MADV_HUGEPAGE: taken where /sys/kernel/mm/transparent_hugepage/enabled is always or madvise). */
void *host_alloc(size_t n, int huge);
/* dev_alloc; on the CPU, with huge, in host_alloc's huge pages. */
int dev_alloc_pages(dev_buf *b, fa_backend dev, size_t bytes, int huge);
void dev_free(dev_buf *b);
int dev_upload(dev_buf *b, const void *host, size_t bytes);
/* Fill all of b->bytes with copies of a host block of `block` bytes (large random caches without a host
 * buffer of their size). */
int dev_upload_tiled(dev_buf *b, const void *host, size_t block);
int dev_download(const dev_buf *b, void *host, size_t bytes);
int dev_fill_nan(dev_buf *b);   /* poison (0xFF bytes: NaN in f32, f16 and bf16) */
/* CUDA: read every byte of b once (queued on the default stream; device_read.cu). -1 on the CPU. */
int dev_read(const dev_buf *b, dev_buf *sink);
int dev_sync(fa_backend dev);
int cuda_tools_built(void);
#define BENCH_TIMES_MAX 64 /* the repetitions a row keeps (the adaptive ones stop there) */

/* ---- one KV-cache measurement (`flashattn bench --mode kvcache`, bench_kvcache.c; also the report's decoding section) */
typedef struct kv_shape {
    fa_backend dev;
    fa_dtype dt;
    int64_t b, cache, page, hq, hk, sq, ns, d, split_size; /* ns: num_splits (0 = heuristic); page 0 = contiguous */
    int ragged, reps, warmup;
    int anchors; /* CPU: measure memcpy and a read-only pass beside it */
    int no_append; /* 1: no k_new / v_new (the cache already holds every key), as PyTorch's SDPA is timed */
    int flush_read; /* CUDA: evict the L2 between calls by reading 256 MB (clean lines; else by writing it) */
    int bhsd;       /* the cache's layout: 0 [.., seq, heads, d] (flash-attn's), 1 [.., heads, seq, d] (PyTorch's) */
    int pages_in_order; /* paged: block table i -> page i (else a shuffled order, as an allocator hands pages out) */
    int warm_table;     /* CUDA: the lengths and the block table read back into the L2 after each flush */
    double until_ci, max_seconds; /* after reps, repeat until the median's 95 % interval is at most until_ci of it
                                     or max_seconds of calls have run (0: off), at most BENCH_TIMES_MAX calls */
    int fp8;            /* 1: the cache is FA_DTYPE_F8_E4M3 (q, out and the new rows stay dt), descales 1 */
    int sinks;          /* 1: a random fp32 sinks vector [hq] on the device (opts.sinks) */
    int huge_pages;     /* CPU: the cache and the anchors' buffers in transparent huge pages (host_alloc) */
} kv_shape;
typedef struct kv_result {
    fa_status status;
    double ms, gbs, host_ms, memcpy_gbs, read_gbs;
    double ci_lo, ci_hi; /* the 95 % confidence interval of the median ms (median_ci) */
    int reps_run;
    double kv_bytes;     /* K and V bytes one call reads */
    int n_allocs, alloc_end[8]; /* the report's rounds: times[alloc_end[a-1] .. alloc_end[a]) ran on allocation a */
    int n_times;         /* the first timed calls' ms (up to BENCH_TIMES_MAX) */
    double times[BENCH_TIMES_MAX];
    int64_t keys, contiguous_rows, paged_rows[2]; /* cache rows used; allocated contiguous / in pages of 16, 256 */
    char kernel[64], error[256];
} kv_result;
/* 0 on success; the figures in *res (res->status and res->error on failure). */
int bench_kvcache_one(fa_context *ctx, const kv_shape *s, kv_result *res);
/* bench_kvcache_one in parts, so that calls of several shapes can be interleaved (the report pairs them): a shape's
 * cache, inputs and call arguments set up (its key counts in *res; -1 after a message when they cannot be
 * allocated), one timed call (ms; host_ms: the call's own time on the host; either may be NULL), and the buffers
 * freed. */
typedef struct kv_bench {
    kv_shape s;
    dev_buf kv, q, kn, vn, o, dl, dbt, flush, sink, sinks;
    fa_kvcache cache;
    fa_tensor tq, to, tkn, tvn;
    fa_attn_opts opts;
    fa_kv_opts ko;
    struct dev_timer *tm;
    double kv_bytes; /* K and V bytes one call reads */
} kv_bench;
int kv_bench_open(fa_context *ctx, const kv_shape *s, kv_bench *kb, kv_result *res);
fa_status kv_bench_call(fa_context *ctx, kv_bench *kb, double *ms, double *host_ms);
void kv_bench_close(kv_bench *kb);
/* Its CSV (the columns of `flashattn bench --mode kvcache --csv`). */
void bench_kvcache_csv_header(FILE *f);
void bench_kvcache_csv_row(FILE *f, const kv_shape *s, const kv_result *r);
/* Device description ("AMD EPYC, 2 threads" / "NVIDIA H200 (132 SMs)"). */
void device_describe(fa_backend dev, int threads, char *buf, size_t len);
/* Bytes of fast memory per core/SM this device has: L1d, L2 (CPU); shared memory per SM (CUDA). 0 if unknown. */
int64_t cpu_cache_bytes(int level);
int64_t cuda_smem_per_sm(void);
/* Available host memory in bytes (MemAvailable), or a large number if unknown. */
int64_t host_mem_available(void);
/* Device memory free on CUDA (0 if unknown). */
int64_t cuda_mem_free(void);

/* ---- GPU event timing: wall time of the work queued between start and stop (ms) ---- */
typedef struct dev_timer dev_timer;
dev_timer *dev_timer_create(fa_backend dev);
void dev_timer_start(dev_timer *t);
double dev_timer_stop(dev_timer *t); /* ms; synchronises */
void dev_timer_destroy(dev_timer *t);

/* ---- misc ---- */
double now_ms(void);
double median_of(const double *x, int n); /* does not modify x */
/* The distribution-free 95 % confidence interval [lo, hi] of the median of x[0..n) (order statistics; below 6 values
 * it is [min, max], which covers less). Does not modify x. */
void median_ci(const double *x, int n, double *lo, double *hi);
/* The stop rule of repeated timings: 1 when the 95 % interval of x's median is at most until_ci of the median. */
int median_settled(const double *x, int n, double until_ci);
uint64_t rng_next(uint64_t *s);           /* splitmix64 */
double rng_uniform(uint64_t *s);          /* [0, 1) */
int rng_int(uint64_t *s, int lo, int hi); /* [lo, hi] */
/* n elements of dtype uniformly in [-amp, amp], written to host memory. */
void fill_random(void *host, fa_dtype dt, int64_t n, uint64_t *rng, float amp);

/* ---- bench (bench.c): one configuration, all requested algorithms interleaved ---- */
typedef struct bench_config {
    fa_backend dev;
    fa_dtype dtype;
    int64_t batch, heads, heads_k, seqlen_q, seqlen_k, head_dim;
    int64_t head_dim_v;   /* v's and out's head_dim (dv; q and k have head_dim) */
    int sinks;            /* 1: a random fp32 sinks vector [heads] (opts.sinks), and the backward asks for d_sinks */
    int sinks_alt;        /* 1: bench_run_group's slots alternate without / with sinks (slot a: sinks = a % 2), so
                             that the same call with and without sinks is timed interleaved (--sinks 0,1) */
    int causal, window;   /* window: -1 none; else window_left = window_right = window (causal adds right = 0) */
    int backward;
    int threads;          /* CPU threads (0 = all) */
    int block_q, block_k; /* 0 = default */
    int reps, warmup;     /* reps: the timed repetitions, or the least of them with until_ci */
    double until_ci;      /* > 0: repeat until each median's 95 % interval is at most this fraction of it ... */
    double max_seconds;   /* ... or the configuration's timed calls took this long (0: no limit), at most
                             BENCH_TIMES_MAX repetitions */
} bench_config;


typedef struct bench_row {
    bench_config cfg;
    fa_algo algo;
    int ok;               /* 1: measured */
    char status[16];      /* "ok", "skip", "oom", "error" */
    char note[200];       /* the reason when !ok */
    char kernel[64];
    int block_q, block_k, threads;
    double ms, ms_min, ms_max, spread_pct; /* median, min, max of reps; spread = (max-min)/median */
    double ci_lo, ci_hi;  /* the 95 % confidence interval of the median (median_ci) */
    int reps_run;         /* repetitions timed */
    int n_times;          /* times[0..n_times): the first of them, rep r of every algorithm of the group in one
                             round (their ratios are paired) */
    double times[BENCH_TIMES_MAX];
    double flops, gflops;
    int64_t extra_bytes, read_bytes, write_bytes;
    double speedup;       /* ms(STANDARD)/ms in the same group, 0 if STANDARD is not measured */
} bench_row;

/* Run one configuration for algos[0..n_algo): inputs allocated once, warm-up, then reps interleaved over the
 * algorithms; rows[i] filled for algos[i]. ctx is a context on cfg->dev (threads as cfg->threads). Never exits.
 * mem_limit: bytes the run may allocate on the host (inputs + estimated library workspace); rows that would exceed
 * it are skipped with status "oom". */
void bench_run_group(fa_context *ctx, const bench_config *cfg, const fa_algo *algos, int n_algo, int64_t mem_limit,
                     bench_row *rows);
/* CSV: the fixed columns of docs/benchmarks.md (with_extra adds block_q,block_k,threads,kernel,status). */
void bench_csv_header(FILE *f, int with_extra);
void bench_csv_row(FILE *f, const bench_row *r, int with_extra);
int cmd_bench(int argc, char **argv);
/* flashattn bench --mode kvcache (bench_kvcache.c); its options (printed under bench --help too); 1 if a --mode
 * value names it (kvcache, or its former name decode) */
int cmd_bench_kvcache(int argc, char **argv);
void bench_kvcache_help(void);
int bench_mode_is_kvcache(const char *mode);
/* `flashattn bench ARGS` without the printing: the same parsing and product; the sink sees every device, every
 * configuration before it runs, and every row. Returns 0, 1 (no row measured) or CLI_EXIT_USAGE. */
typedef struct bench_sink {
    void (*on_device)(fa_backend dev, int threads, const char *desc, void *user); /* threads < 0: unavailable */
    void (*on_group)(const bench_config *c, void *user);
    void (*on_row)(const bench_row *r, void *user);
    void (*on_device_end)(fa_backend dev, void *user);
    void *user;
} bench_sink;
int bench_run_args(int argc, char **argv, const bench_sink *sink);
/* Default host memory limit for a run: 90 % of MemAvailable. */
int64_t bench_default_mem_limit(void);
/* CPU-only runs: cap the address space at what is mapped now + limit (+ slack), so a workspace that does not fit
 * fails with FA_ERR_OUT_OF_MEMORY instead of waking the OOM killer. */
void cli_limit_address_space(int64_t limit);

/* ---- io (io.c): counted slow-memory bytes next to the paper's formulas ---- */
typedef struct io_row {
    fa_algo algo;
    int ok;
    char note[200];
    int64_t batch, heads, seqlen, head_dim;
    int causal, backward;
    int block_q, block_k;    /* used (from fa_last_stats) */
    int64_t sram_bytes;      /* M in bytes as given (--sram) or implied by the blocks: 4·Bc·d elements · 4 bytes */
    int64_t read_bytes, write_bytes;
    double paper_bytes;      /* Θ formula with constant 1, in bytes: (Nd + N²)·4 or N²d²/M·4, times batch·heads */
    double model_bytes;      /* the algorithm as written in the papers, counted transfer by transfer */
    char formula[32];
} io_row;

typedef struct io_config {
    int64_t batch, heads, seqlen, head_dim;
    int causal, backward, threads;
    int block_q, block_k;   /* 0 = default (or derived from sram) */
    int64_t sram_bytes;     /* 0 = not given */
} io_config;

/* Paper blocks from SRAM size M (bytes, fp32 elements): Bc = ceil(M/(4d)), Br = min(Bc, d), in elements. */
void io_blocks_from_sram(int64_t sram_bytes, int64_t d, int *br, int *bc);
/* Run algo once on the CPU with fp32 and fill row. */
void io_run(fa_context *ctx, const io_config *cfg, fa_algo algo, io_row *row);
void io_csv_header(FILE *f);
void io_csv_row(FILE *f, const io_row *r);
int cmd_io(int argc, char **argv);
/* Parse `flashattn io` arguments (shared with the report). 0 ok, 1 help printed, -1 error printed. */
int io_parse_args(int argc, char **argv, io_config *c, int_list *algos, int *csv);

int cmd_check(int argc, char **argv);
int cmd_report(int argc, char **argv);

#endif
