/* flashattn bench --mode kvcache: fa_forward_kvcache timed on a cache larger than the last-level cache (docs/kvcache.md).
 * Reports GB/s of K+V read (the keys each sequence has, K and V, every K/V head once), and in the same command the
 * memcpy bandwidth (bytes read + written per second, the STREAM Copy convention) and a read-only pass over a buffer
 * of the cache's size, so the figure has its anchor beside it (CPU: one of each after every timed call, medians over
 * the same reps; their 64 MB or more also leave the LLC cold for the next call). Comma lists expand to a Cartesian
 * product. */
#include "common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef FA_TOOLS_CUDA
#include <cuda_runtime.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

typedef struct kv_args {
    int_list dev, batch, seqlen_k, page, heads, heads_k, seqlen, dtype, splits, d, kv_dtype, sinks;
    int64_t threads, reps, warmup, split_size, ragged, append, warm_table, huge_pages;
    double until_ci_pct, max_seconds; /* as in the attention mode */
    int csv, flush_read, bhsd, pages_in_order;
} kv_args;

void bench_kvcache_help(void) {
    printf("flashattn bench --mode kvcache [options]    (comma lists expand to their Cartesian product)\n"
           "\n"
           "Times fa_forward_kvcache (decoding against a KV cache) on a cache larger than the last-level cache: GB/s of\n"
           "K+V read, with memcpy and a read-only pass of the cache's size measured beside it (docs/kvcache.md).\n"
           "The flags the attention mode has keep its spelling; the old spellings in brackets are still accepted.\n"
           "\n"
           "  --device LIST      cpu, cuda                                  (default cpu)\n"
           "  --dtype LIST       bf16, f16, f32                             (default bf16)\n"
           "  --kv-dtype LIST    the cache's: same (as --dtype) or e4m3 (FP8, descales 1; the innermost list,\n"
           "                     so `same,e4m3` alternates the two)          (default same)\n"
           "  --d LIST           head_dim, 1..256 [--head-dim]              (default 128)\n"
           "  --batch LIST       sequences                                  (default 1)\n"
           "  --seqlen LIST      new query rows per sequence [--seqlen-new] (default 1)\n"
           "  --seqlen-k LIST    keys of each sequence, the new rows included [--cache]  (default 32768)\n"
           "  --heads LIST       query heads [--heads-q]                    (default 32)\n"
           "  --heads-k LIST     K/V heads (must divide --heads)            (default 8)\n"
           "  --page LIST        page size, 0 = contiguous                  (default 0)\n"
           "  --splits LIST      num_splits, 0 = the heuristic              (default 0)\n"
           "  --sinks LIST       0, 1: learnable sinks, a random fp32 vector [heads] on the device  (default 0)\n"
           "  --split-size N     fixed split size in keys (batch-invariant mode; default off)\n"
           "  --ragged 0|1       1: lengths drawn in [seqlen-k/2, seqlen-k] instead of all equal\n"
           "  --append 0|1       1: the call appends the new rows (k_new, v_new; default); 0: the cache already\n"
           "                     holds every key and nothing is appended (as PyTorch's SDPA is timed)\n"
           "  --flush read|write CUDA: evict the L2 between calls by reading 256 MB (default: no dirty lines left\n"
           "                     to write back during the timed call) or by writing it\n"
           "  --layout bshd|bhsd the cache (and its pages): [.., seq, heads, d] as flash-attn (default) or\n"
           "                     [.., heads, seq, d] as PyTorch's SDPA\n"
           "  --page-order shuffled|in-order   paged: pages in a shuffled order, as an allocator hands them out\n"
           "                     (default), or page i of the cache at block-table entry i\n"
           "  --warm-table 0|1   CUDA: 1 reads the lengths and the block table back into the L2 after each flush\n"
           "                     (what a paged call's first lookups cost; default 0)\n"
           "  --huge-pages 0|1   CPU: 1 allocates the cache and the anchors' buffers in transparent huge pages\n"
           "                     (madvise; 4 KB pages stay where THP is off)  (default 0)\n"
           "  --threads N        CPU threads, 0 = all                       (default 0)\n"
           "  --reps N           timed repetitions                          (default 20)\n"
           "  --warmup N         warm-up calls                              (default 3)\n"
           "  --until-ci PCT     after --reps, repeat until the 95%% confidence interval of the median is at most\n"
           "                     PCT %% of it (at most %d calls; 0 = off)   (default 0)\n"
           "  --max-seconds S    with --until-ci: stop repeating after S seconds of timed calls\n"
           "  --csv              CSV with the columns\n"
           "                     device,dtype,batch,cache,page,heads_q,heads_k,seqlen_new,head_dim,splits,kernel,ms,\n"
           "                     kv_gbs,memcpy_gbs,read_gbs,status,host_ms,append,flush,layout,page_order,warm_table,\n"
           "                     reps,ms_ci_lo,ms_ci_hi,kv_dtype,sinks,huge_pages\n",
           BENCH_TIMES_MAX);
}

/* 1 if the value of --mode names this mode (kvcache, or its former name decode). */
int bench_mode_is_kvcache(const char *v) { return !strcmp(v, "kvcache") || !strcmp(v, "decode"); }

static int parse(int argc, char **argv, kv_args *a) {
    const char *S = "bench";
    memset(a, 0, sizeof *a);
    a->dev = (int_list){1, {FA_BACKEND_CPU}};
    a->batch = (int_list){1, {1}};
    a->seqlen_k = (int_list){1, {32768}};
    a->page = (int_list){1, {0}};
    a->heads = (int_list){1, {32}};
    a->heads_k = (int_list){1, {8}};
    a->seqlen = (int_list){1, {1}};
    a->dtype = (int_list){1, {FA_DTYPE_BF16}};
    a->splits = (int_list){1, {0}};
    a->d = (int_list){1, {128}};
    a->kv_dtype = (int_list){1, {0}};
    a->sinks = (int_list){1, {0}};
    a->reps = 20, a->warmup = 3, a->append = 1, a->flush_read = 1;
    for (int i = 0; i < argc; i++) {
        const char *x = argv[i], *v, *nm;
/* NAME, or its former spelling ALIAS (NULL: none); the message names the spelling given */
#define MATCH(name, alias) (nm = opt_is(x, name) ? name : (alias) && opt_is(x, alias) ? (const char *)(alias) : NULL)
#define LIST(name, alias, field, lo, hi)                                                                          \
    if (MATCH(name, alias)) {                                                                                     \
        if (!(v = opt_value(S, argc, argv, &i, nm)) || parse_int_list(S, nm, v, lo, hi, &a->field)) return -1;    \
        continue;                                                                                                 \
    }
#define ONE(name, field, lo, hi)                                                                                  \
    if (opt_is(x, name)) {                                                                                        \
        if (!(v = opt_value(S, argc, argv, &i, name)) || parse_int(S, name, v, lo, hi, &a->field)) return -1;    \
        continue;                                                                                                 \
    }
#define CHOICE(name, no, yes, field)                                                                               \
    if (opt_is(x, name)) { /* field = 1 for `yes`, 0 for `no` */                                                  \
        if (!(v = opt_value(S, argc, argv, &i, name))) return -1;                                                 \
        if (strcmp(v, no) && strcmp(v, yes)) return cli_usage_error(S, name ": '%s' (" no " or " yes ")", v), -1; \
        a->field = !strcmp(v, yes);                                                                               \
        continue;                                                                                                 \
    }
        if (!strcmp(x, "--help") || !strcmp(x, "-h")) {
            bench_kvcache_help();
            return 1;
        }
        if (opt_is(x, "--mode")) {
            if (!(v = opt_value(S, argc, argv, &i, "--mode"))) return -1;
            if (!bench_mode_is_kvcache(v)) return cli_usage_error(S, "--mode: '%s' (attention or kvcache)", v), -1;
            continue;
        }
        if (opt_is(x, "--device")) {
            if (!(v = opt_value(S, argc, argv, &i, "--device")) || parse_device_list(S, "--device", v, &a->dev)) return -1;
            continue;
        }
        if (opt_is(x, "--dtype")) {
            if (!(v = opt_value(S, argc, argv, &i, "--dtype")) || parse_dtype_list(S, "--dtype", v, &a->dtype, 0)) return -1;
            continue;
        }
        if (opt_is(x, "--kv-dtype")) {
            if (!(v = opt_value(S, argc, argv, &i, "--kv-dtype")) || parse_kv_dtype_list(S, "--kv-dtype", v, &a->kv_dtype))
                return -1;
            continue;
        }
        CHOICE("--flush", "write", "read", flush_read)
        CHOICE("--layout", "bshd", "bhsd", bhsd)
        CHOICE("--page-order", "shuffled", "in-order", pages_in_order)
        if (!strcmp(x, "--csv")) {
            a->csv = 1;
            continue;
        }
        LIST("--d", "--head-dim", d, 1, 256)
        LIST("--batch", NULL, batch, 1, 1 << 16)
        LIST("--sinks", NULL, sinks, 0, 1)
        LIST("--seqlen", "--seqlen-new", seqlen, 1, 4096)
        LIST("--seqlen-k", "--cache", seqlen_k, 1, (int64_t)1 << 30)
        LIST("--heads", "--heads-q", heads, 1, 1024)
        LIST("--heads-k", NULL, heads_k, 1, 1024)
        LIST("--page", NULL, page, 0, 1 << 20)
        LIST("--splits", NULL, splits, 0, 1024)
        ONE("--split-size", split_size, 0, 1 << 30)
        ONE("--ragged", ragged, 0, 1)
        ONE("--append", append, 0, 1)
        ONE("--warm-table", warm_table, 0, 1)
        ONE("--huge-pages", huge_pages, 0, 1)
        ONE("--threads", threads, 0, 1024)
        ONE("--reps", reps, 1, 100000)
        ONE("--warmup", warmup, 0, 1000)
        const int rep = opt_repeat(S, argc, argv, &i, &a->until_ci_pct, &a->max_seconds);
        if (rep < 0) return -1;
        if (rep) continue;
#undef MATCH
#undef LIST
#undef ONE
#undef CHOICE
        return cli_usage_error(S, "unknown argument '%s' for --mode kvcache", x), -1;
    }
    return 0;
}

/* The sum of n bytes as 64-bit words: eight independent 16-byte accumulators (the width every x86-64 has, so the
 * generic build keeps them in registers), so that the loop is bound by the loads (one scalar sum is bound by its
 * adds: about 28 GB/s on two Zen 4 cores, below what they read). */
typedef uint64_t fa_v2u64 __attribute__((vector_size(16)));
static uint64_t read_sum(const char *p, size_t n) {
    fa_v2u64 s[8] = {{0}}, x;
    size_t i = 0;
    for (; i + 128 <= n; i += 128)
        for (int k = 0; k < 8; k++) memcpy(&x, p + i + 16 * k, 16), s[k] += x;
    for (int k = 1; k < 8; k++) s[0] += s[k];
    uint64_t t = s[0][0] + s[0][1];
    for (; i < n; i++) t += (unsigned char)p[i];
    return t;
}

/* Where thread t's share of n bytes begins (t = threads: n). */
static size_t share(size_t n, int threads, int t) { return t == threads ? n : n / (size_t)threads * (size_t)t; }

/* The CPU anchors: memcpy (read + write bytes / s, between two buffers of n bytes) and a read-only sum over n bytes,
 * one of each after every timed call, so that the call and its anchors see the same machine (a shared VM's memory
 * bandwidth moves between runs by up to 2x). */
typedef struct cpu_anchors {
    char *a, *b;
    size_t n;
    int threads;
    double *tc, *tr; /* per rep, ms */
    uint64_t sink;
} cpu_anchors;

static int cpu_anchors_init(cpu_anchors *c, size_t n, int threads, int64_t reps, int huge) {
    memset(c, 0, sizeof *c);
    c->a = host_alloc(n, huge), c->b = host_alloc(n, huge), c->tc = malloc(sizeof(double) * 2 * (size_t)reps);
    if (!c->a || !c->b || !c->tc) return free(c->a), free(c->b), free(c->tc), memset(c, 0, sizeof *c), 0;
    c->tr = c->tc + reps, c->n = n, c->threads = threads;
    memset(c->a, 1, n), memset(c->b, 2, n);
    return 1;
}

static void cpu_anchors_rep(cpu_anchors *c, int64_t r) {
    const size_t n = c->n;
    const int threads = c->threads;
    double t0 = now_ms();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < threads; t++) {
        const size_t lo = share(n, threads, t), hi = share(n, threads, t + 1);
        memcpy(c->b + lo, c->a + lo, hi - lo);
    }
    c->tc[r] = now_ms() - t0;
    t0 = now_ms();
    uint64_t total = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : total)
    for (int t = 0; t < threads; t++) {
        const size_t lo = share(n, threads, t), hi = share(n, threads, t + 1);
        total += read_sum(c->a + lo, hi - lo);
    }
    c->tr[r] = now_ms() - t0;
    c->sink += total;
}

/* GB/s of the medians; the buffers freed. */
static void cpu_anchors_done(cpu_anchors *c, int64_t reps, double *copy_gbs, double *read_gbs) {
    if (c->tc && reps > 0) {
        *copy_gbs = 2.0 * (double)c->n / (median_of(c->tc, (int)reps) * 1e6);
        *read_gbs = (double)c->n / (median_of(c->tr, (int)reps) * 1e6);
    }
    volatile uint64_t sink = c->sink;
    (void)sink;
    free(c->a), free(c->b), free(c->tc);
    memset(c, 0, sizeof *c);
}

/* Between timed calls: on CUDA the L2 evicted by writing 256 MB, or by reading it (s->flush_read: no dirty lines
 * left to write back while the next call runs); on the CPU a synchronisation only (the cache is beyond the LLC). */
static void flush_caches(const kv_shape *s, dev_buf *flush, dev_buf *sink) {
    if (!flush->ptr) dev_sync(s->dev);
    else if (s->flush_read) dev_read(flush, sink);
    else dev_fill_nan(flush);
}

/* Whether n timed calls are enough: without until_ci always; else when the median's 95 % interval is at most
 * until_ci of it or max_seconds have passed since t0 (the rule of bench.c's rounds). */
static int enough(const kv_shape *s, const double *ms, int n, double t0) {
    if (s->until_ci <= 0 || (s->max_seconds > 0 && now_ms() - t0 >= 1e3 * s->max_seconds)) return 1;
    return median_settled(ms, n, s->until_ci);
}

int kv_bench_open(fa_context *ctx, const kv_shape *s, kv_bench *kb, kv_result *res) {
    const int64_t d = s->d, es = (int64_t)fa_dtype_size(s->dt), B = s->b, cap = s->cache;
    const fa_dtype cdt = s->fp8 ? FA_DTYPE_F8_E4M3 : s->dt; /* the cache's dtype */
    const int64_t ces = (int64_t)fa_dtype_size(cdt);
    memset(kb, 0, sizeof *kb);
    memset(res, 0, sizeof *res);
    kb->s = *s;
    (void)ctx;
    uint64_t rng = 12345;
    int32_t *lens = malloc(sizeof(int32_t) * (size_t)B);
    for (int64_t b = 0; b < B; b++) {
        lens[b] = (int32_t)(s->ragged ? cap / 2 + rng_int(&rng, 0, (int)(cap - cap / 2 - s->sq)) : cap - s->sq);
        if (s->no_append) lens[b] += (int32_t)s->sq; /* the same keys, all already in the cache */
        const int64_t keys = lens[b] + (s->no_append ? 0 : s->sq);
        kb->kv_bytes += 2.0 * (double)keys * (double)s->hk * (double)d * (double)ces;
        res->keys += keys;
        res->paged_rows[0] += (keys + 15) / 16 * 16;
        res->paged_rows[1] += (keys + 255) / 256 * 256;
    }
    res->contiguous_rows = B * cap;
    const int64_t pages_per = s->page ? (cap + s->page - 1) / s->page : 0, npages = B * pages_per;
    const int64_t n_cache = s->page ? npages * s->page * s->hk * d : B * cap * s->hk * d;
    int32_t *bt = NULL;
    if (s->page) { /* pages in a shuffled order, as a paged allocator hands them out (or in order: --page-order) */
        bt = malloc(sizeof(int32_t) * (size_t)npages);
        for (int64_t i = 0; i < npages; i++) bt[i] = (int32_t)i;
        for (int64_t i = npages - 1; i > 0 && !s->pages_in_order; i--) {
            int64_t j = rng_int(&rng, 0, (int)i);
            int32_t t = bt[i];
            bt[i] = bt[j], bt[j] = t;
        }
    }
    /* K and V in one allocation, so the read-only anchor passes over both in one launch */
    dev_buf kc, vc;
    kb->flush = (dev_buf){s->dev, NULL, 0}, kb->sink = (dev_buf){s->dev, NULL, 0};
    int fail = dev_alloc_pages(&kb->kv, s->dev, (size_t)(2 * n_cache * ces), s->huge_pages) ||
               dev_alloc(&kb->q, s->dev, (size_t)(B * s->sq * s->hq * d * es)) ||
               dev_alloc(&kb->kn, s->dev, (size_t)(B * s->sq * s->hk * d * es)) ||
               dev_alloc(&kb->vn, s->dev, (size_t)(B * s->sq * s->hk * d * es)) ||
               dev_alloc(&kb->o, s->dev, (size_t)(B * s->sq * s->hq * d * es)) ||
               dev_alloc(&kb->dl, s->dev, sizeof(int32_t) * (size_t)B) ||
               (s->sinks && dev_alloc(&kb->sinks, s->dev, sizeof(float) * (size_t)s->hq)) ||
               dev_alloc(&kb->dbt, s->dev, sizeof(int32_t) * (size_t)(npages ? npages : 1));
    if (fail) {
        fprintf(stderr, "bench kvcache: cannot allocate the cache (%.2f GB)\n", 2e-9 * (double)(n_cache * ces));
        free(lens), free(bt);
        kv_bench_close(kb);
        res->status = FA_ERR_OUT_OF_MEMORY;
        snprintf(res->error, sizeof res->error, "cannot allocate the cache");
        return -1;
    }
    kc = kb->kv, vc = kb->kv;
    kc.bytes = vc.bytes = (size_t)(n_cache * ces);
    vc.ptr = (char *)kb->kv.ptr + kc.bytes;
    {
        /* the cache: copies of a random block of up to 32 MB (the speed does not depend on the values; a host
         * buffer and a random fill of a many-GB cache would take longer than the measurement) */
        const int64_t nq = B * s->sq * s->hq * d, nblk = n_cache < ((int64_t)32 << 20) / ces ? n_cache : ((int64_t)32 << 20) / ces;
        void *h = malloc((size_t)((nblk * ces > nq * es ? nblk * ces : nq * es)));
        fill_random(h, cdt, nblk, &rng, 1.0f);
        dev_upload_tiled(&kc, h, (size_t)(nblk * ces));
        fill_random(h, cdt, nblk, &rng, 1.0f);
        dev_upload_tiled(&vc, h, (size_t)(nblk * ces));
        fill_random(h, s->dt, nq, &rng, 1.0f);
        dev_upload(&kb->q, h, (size_t)(B * s->sq * s->hq * d * es));
        fill_random(h, s->dt, B * s->sq * s->hk * d, &rng, 1.0f);
        dev_upload(&kb->kn, h, kb->kn.bytes), dev_upload(&kb->vn, h, kb->vn.bytes);
        if (s->sinks) { /* one logit per query head, of the logits' scale */
            float *sk = malloc(sizeof(float) * (size_t)s->hq);
            fill_random(sk, FA_DTYPE_F32, s->hq, &rng, 1.0f);
            dev_upload(&kb->sinks, sk, sizeof(float) * (size_t)s->hq);
            free(sk);
        }
        free(h);
    }
    dev_upload(&kb->dl, lens, kb->dl.bytes);
    if (bt) dev_upload(&kb->dbt, bt, sizeof(int32_t) * (size_t)npages);
    free(lens), free(bt);
    if (s->dev == FA_BACKEND_CUDA) /* several times the H200's L2 */
        dev_alloc(&kb->flush, s->dev, (size_t)256 << 20), dev_alloc(&kb->sink, s->dev, 64);
    fa_kvcache *cache = &kb->cache;
    memset(cache, 0, sizeof *cache);
    const int64_t rows = s->page ? npages : B, keys = s->page ? s->page : cap;
    cache->k = s->bhsd ? fa_tensor_bhsd(kc.ptr, cdt, rows, s->hk, keys, d) : fa_tensor_bshd(kc.ptr, cdt, rows, keys, s->hk, d);
    cache->v = cache->k;
    cache->v.data = vc.ptr;
    cache->seqlens = kb->dl.ptr;
    cache->block_table = s->page ? kb->dbt.ptr : NULL;
    cache->max_pages = pages_per;
    kb->tq = fa_tensor_bshd(kb->q.ptr, s->dt, B, s->sq, s->hq, d), kb->to = fa_tensor_bshd(kb->o.ptr, s->dt, B, s->sq, s->hq, d);
    kb->tkn = fa_tensor_bshd(kb->kn.ptr, s->dt, B, s->sq, s->hk, d), kb->tvn = fa_tensor_bshd(kb->vn.ptr, s->dt, B, s->sq, s->hk, d);
    kb->opts = fa_attn_opts_default();
    kb->opts.causal = 1;
    kb->opts.sinks = s->sinks ? (const float *)kb->sinks.ptr : NULL;
    kb->ko = fa_kv_opts_default();
    kb->ko.num_splits = (int)s->ns;
    kb->ko.split_size = (int)s->split_size;
    if (kb->ko.split_size) kb->ko.num_splits = 0;
    kb->tm = dev_timer_create(s->dev);
    return 0;
}

fa_status kv_bench_call(fa_context *ctx, kv_bench *kb, double *ms, double *host_ms) {
    const kv_shape *s = &kb->s;
    /* CUDA: the L2 flush is queued and not waited for, so the call is enqueued while it runs (as the PyTorch
     * script does): the time is the GPU's; host_ms gives the enqueueing on its own */
    flush_caches(s, &kb->flush, &kb->sink);
    if (s->warm_table && kb->flush.ptr) {
        dev_read(&kb->dl, &kb->sink);
        if (kb->cache.block_table) dev_read(&kb->dbt, &kb->sink);
    }
    dev_timer_start(kb->tm);
    const double h0 = now_ms();
    const fa_status st = fa_forward_kvcache(ctx, &kb->opts, &kb->ko, &kb->tq, &kb->cache, s->no_append ? NULL : &kb->tkn,
                                            s->no_append ? NULL : &kb->tvn, &kb->to, NULL);
    const double h1 = now_ms(), t = dev_timer_stop(kb->tm);
    if (ms) *ms = t;
    if (host_ms) *host_ms = h1 - h0;
    return st;
}

void kv_bench_close(kv_bench *kb) {
    if (kb->tm) dev_timer_destroy(kb->tm);
    kb->tm = NULL;
    dev_buf *all[] = {&kb->kv, &kb->q, &kb->kn, &kb->vn, &kb->o, &kb->dl, &kb->dbt, &kb->flush, &kb->sink, &kb->sinks};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dev_free(all[i]);
}

int bench_kvcache_one(fa_context *ctx, const kv_shape *s, kv_result *res) {
    const int threads = s->dev == FA_BACKEND_CPU ? fa_context_threads(ctx) : 0;
    kv_bench kb;
    if (kv_bench_open(ctx, s, &kb, res)) return -1;
    /* the first s->reps calls always; with until_ci more, as `flashattn bench` does (bench.c, rounds_done) */
    const int64_t most = s->until_ci > 0 && s->reps < BENCH_TIMES_MAX ? BENCH_TIMES_MAX : s->reps;
    double *ms = malloc(sizeof(double) * 2 * (size_t)most), *host = ms + most;
    fa_status st = FA_OK;
    cpu_anchors anc = {0};
    if (s->anchors && s->dev == FA_BACKEND_CPU)
        cpu_anchors_init(&anc, (size_t)(kb.kv_bytes > 64e6 ? kb.kv_bytes : 64e6), threads, most, s->huge_pages);
    int64_t reps = s->reps;
    double t0 = 0;
    for (int64_t r = -s->warmup; r < reps && st == FA_OK; r++) {
        if (r == 0) t0 = now_ms();
        double t, h;
        st = kv_bench_call(ctx, &kb, &t, &h);
        if (r >= 0) ms[r] = t, host[r] = h;
        if (anc.a) cpu_anchors_rep(&anc, r >= 0 ? r : 0); /* warm-up too: every timed call follows an anchor */
        if (r == reps - 1 && reps < most && !enough(s, ms, (int)reps, t0)) reps++; /* one call more */
    }
    fa_stats stats;
    memset(&stats, 0, sizeof stats);
    if (st == FA_OK) fa_last_stats(ctx, &stats);
    const double med = st == FA_OK ? median_of(ms, (int)reps) : NAN, gbs = kb.kv_bytes / (med * 1e6);
    const double host_med = st == FA_OK ? median_of(host, (int)reps) : NAN; /* the call's own time (on CUDA: enqueueing) */
    if (st == FA_OK) median_ci(ms, (int)reps, &res->ci_lo, &res->ci_hi);
    res->reps_run = (int)reps;
    res->n_times = st == FA_OK ? (int)(reps < BENCH_TIMES_MAX ? reps : BENCH_TIMES_MAX) : 0;
    memcpy(res->times, ms, (size_t)res->n_times * sizeof *ms);
    double copy = 0, rd = 0;
    cpu_anchors_done(&anc, st == FA_OK ? reps : 0, &copy, &rd);
    if (s->anchors && s->dev == FA_BACKEND_CUDA && st == FA_OK) { /* the cache read once, after the same flush */
        for (int64_t r = 0; r < reps; r++) {
            flush_caches(s, &kb.flush, &kb.sink);
            dev_timer_start(kb.tm);
            dev_read(&kb.kv, &kb.sink);
            ms[r] = dev_timer_stop(kb.tm);
        }
        rd = (double)kb.kv.bytes / (median_of(ms, (int)reps) * 1e6);
    }
    res->status = st;
    res->ms = med, res->gbs = gbs, res->host_ms = host_med, res->memcpy_gbs = copy, res->read_gbs = rd;
    snprintf(res->kernel, sizeof res->kernel, "%s", st == FA_OK && stats.kernel ? stats.kernel : "-");
    snprintf(res->error, sizeof res->error, "%s", st == FA_OK ? "" : fa_context_last_error(ctx));
    free(ms);
    kv_bench_close(&kb);
    return st == FA_OK ? 0 : -1;
}

void bench_kvcache_csv_header(FILE *f) {
    fprintf(f, "device,dtype,batch,cache,page,heads_q,heads_k,seqlen_new,head_dim,splits,kernel,ms,kv_gbs,memcpy_gbs,"
               "read_gbs,status,host_ms,append,flush,layout,page_order,warm_table,reps,ms_ci_lo,ms_ci_hi,kv_dtype,sinks,"
               "huge_pages\n");
}

void bench_kvcache_csv_row(FILE *f, const kv_shape *s, const kv_result *r) {
    fprintf(f, "%s,%s,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%s,%.4f,%.2f,%.2f,%.2f,%s,%.4f,%d,%s,%s,%s,%d,", fa_backend_name(s->dev),
            fa_dtype_name(s->dt), (long long)s->b, (long long)s->cache, (long long)s->page, (long long)s->hq,
            (long long)s->hk, (long long)s->sq, (long long)s->d, (long long)s->ns, r->kernel, r->ms, r->gbs,
            r->memcpy_gbs, r->read_gbs, r->status == FA_OK ? "ok" : fa_status_string(r->status), r->host_ms,
            !s->no_append, s->dev == FA_BACKEND_CPU ? "-" : s->flush_read ? "read" : "write", s->bhsd ? "bhsd" : "bshd",
            s->pages_in_order ? "in-order" : "shuffled", s->warm_table);
    if (r->status == FA_OK) fprintf(f, "%d,%.4f,%.4f,", r->reps_run, r->ci_lo, r->ci_hi);
    else fprintf(f, ",,,");
    fprintf(f, "%s,%d,%d\n", fa_dtype_name(s->fp8 ? FA_DTYPE_F8_E4M3 : s->dt), s->sinks, s->huge_pages);
}

static int run_one(const kv_args *A, const kv_shape *s, fa_context *ctx) {
    kv_result r;
    const int rc = bench_kvcache_one(ctx, s, &r);
    const int ok = r.status == FA_OK;
    if (A->csv) {
        bench_kvcache_csv_row(stdout, s, &r);
    } else if (ok) {
        printf("%-4s %-4s%s b=%-3lld seqlen_k=%-6lld page=%-4lld heads=%lld/%lld seqlen=%lld d=%lld splits=%-3lld  %9.3f ms  "
               "%7.2f GB/s K+V%s%s%s", fa_backend_name(s->dev), fa_dtype_name(s->dt), s->fp8 ? " kv=e4m3" : "",
               (long long)s->b, (long long)s->cache,
               (long long)s->page, (long long)s->hq, (long long)s->hk, (long long)s->sq, (long long)s->d,
               (long long)s->ns, r.ms, r.gbs, s->no_append ? " (no append)" : "", s->sinks ? " sinks" : "",
               s->huge_pages ? " (huge pages)" : "");
        if (s->dev == FA_BACKEND_CPU)
            printf("  | memcpy %.2f GB/s (%.0f %%), read %.2f GB/s (%.0f %%)", r.memcpy_gbs, 100 * r.gbs / r.memcpy_gbs,
                   r.read_gbs, 100 * r.gbs / r.read_gbs);
        else if (r.read_gbs > 0)
            printf("  | read %.2f GB/s (%.0f %%)", r.read_gbs, 100 * r.gbs / r.read_gbs);
        printf("  [%s]\n", r.kernel);
    } else {
        printf("%-4s b=%lld seqlen_k=%lld page=%lld: %s: %s\n", fa_backend_name(s->dev), (long long)s->b,
               (long long)s->cache, (long long)s->page, fa_status_string(r.status), r.error);
    }
    fflush(stdout);
    return rc;
}

int cmd_bench_kvcache(int argc, char **argv) {
    kv_args A;
    int rc = parse(argc, argv, &A);
    if (rc) return rc > 0 ? 0 : CLI_EXIT_USAGE;
    if (A.csv) bench_kvcache_csv_header(stdout);
    int failures = 0;
    for (int di = 0; di < A.dev.n; di++) {
        const fa_backend dev = (fa_backend)A.dev.v[di];
        fa_context *ctx = NULL;
        if (fa_context_create(&ctx, dev, dev == FA_BACKEND_CPU ? (int)A.threads : 0) != FA_OK) {
            fprintf(stderr, "bench kvcache: %s: %s\n", fa_backend_name(dev), fa_create_error());
            failures++;
            continue;
        }
        const int threads = dev == FA_BACKEND_CPU ? fa_context_threads(ctx) : 0;
        char desc[512];
        device_describe(dev, threads, desc, sizeof desc);
        if (!A.csv) printf("device: %s; build %s\n", desc, fa_version_string());
        for (int a = 0; a < A.dtype.n; a++)
        for (int e = 0; e < A.d.n; e++)
        for (int b = 0; b < A.batch.n; b++)
        for (int c = 0; c < A.seqlen_k.n; c++)
        for (int p = 0; p < A.page.n; p++)
        for (int h = 0; h < A.heads.n; h++)
        for (int k = 0; k < A.heads_k.n; k++)
        for (int s = 0; s < A.seqlen.n; s++)
        for (int n = 0; n < A.splits.n; n++)
        for (int f = 0; f < A.kv_dtype.n; f++)
        for (int z = 0; z < A.sinks.n; z++) {
            const kv_shape sh = {dev, (fa_dtype)A.dtype.v[a], A.batch.v[b], A.seqlen_k.v[c], A.page.v[p], A.heads.v[h],
                                 A.heads_k.v[k], A.seqlen.v[s], A.splits.v[n], A.d.v[e], A.split_size, (int)A.ragged,
                                 (int)A.reps, (int)A.warmup, 1, !A.append, A.flush_read, A.bhsd, A.pages_in_order,
                                 (int)A.warm_table, A.until_ci_pct / 100, A.max_seconds, (int)A.kv_dtype.v[f],
                                 (int)A.sinks.v[z], (int)A.huge_pages};
            if (sh.sq > sh.cache || sh.hq % sh.hk) continue;
            failures += run_one(&A, &sh, ctx) != 0;
        }
        fa_context_destroy(ctx);
    }
    return failures ? 1 : 0;
}
