/* KV-cache decoding on CUDA against the float64 oracle (tests/lib/kvcase.h): contiguous and paged caches (page
 * sizes 1, 3, 16, 64, 256), ragged lengths with 0 and the capacity, seqlen_new 1, 4, 17, GQA 1, 4, 8 and 32/8, the
 * mask options, append with and without rotary, batch_idx, splits 1..many (beyond 128) and the fixed-split mode;
 * the append's and the split counters' paths (aligned and unaligned new rows, the context's counters and a caller's
 * workspace, 4 and 8 warps per CTA); the numerics contract against the CPU; check_indices
 * rejecting a bad length with nothing written; indices out of range without it (a length past the capacity, a full
 * cache plus a new key, a negative length, block-table entries and batch_idx outside the cache, rotary positions past
 * the tables): clamped on the device, nothing out of bounds (memcheck), the faulty sequence's append skipped, the
 * other sequence's result unchanged, fa_kvcache_check naming the argument — also after a graph replay — and no
 * fault recorded by any valid case; fa_merge_states; a CUDA graph captured once and replayed at a different cache
 * length; v with a head dim of its own ((576, 512), (192, 128); other pairs refused); FP8 (E4M3) caches with device
 * descales (the same paths, the contract against the CPU, bad descales); head dims 96 and 80. Run by
 * scripts/test-gpu.sh. FA_GPU_TEST_SMALL=1 keeps the shapes small (sanitizers); FA_GPU_TEST_ONLY=fp8 runs the FP8 and
 * d = 96 / 80 suites alone. */
#include "testlib.h"
#include "dtype.h"
#include "kvcase.h"

#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static t_rng R;

#define CU(call)                                                                                                   \
    do {                                                                                                           \
        cudaError_t e_ = (call);                                                                                   \
        if (e_ != cudaSuccess) {                                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));                 \
            exit(2);                                                                                               \
        }                                                                                                          \
    } while (0)

static void *dup_dev(const void *h, size_t n) {
    if (!h || !n) return NULL;
    void *d = NULL;
    CU(cudaMalloc(&d, n));
    CU(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}

/* Device copies of a case's arrays. */
typedef struct dev_case {
    void *kc, *vc, *q, *kn, *vn, *out;
    int32_t *seqlens, *bt, *bidx;
    float *cos, *sin, *lse, *sinks;
    float *kds, *vds; /* an FP8 case's descales */
    fa_tensor qt, knt, vnt, outt;
} dev_case;

static fa_tensor moved(const fa_tensor *t, const void *host_mem, void *dev_mem) {
    fa_tensor r = *t;
    r.data = (char *)dev_mem + ((const char *)t->data - (const char *)host_mem);
    return r;
}

static dev_case to_dev(const t_kv_case *c) {
    dev_case d;
    memset(&d, 0, sizeof d);
    const t_kv_spec *s = &c->s;
    d.kc = dup_dev(c->kc, c->cache_bytes), d.vc = dup_dev(c->vc, c->v_bytes);
    d.q = dup_dev(c->q.mem, c->q.mem_bytes), d.out = dup_dev(c->out.mem, c->out.mem_bytes);
    d.qt = moved(&c->q.t, c->q.mem, d.q), d.outt = moved(&c->out.t, c->out.mem, d.out);
    if (s->append) {
        d.kn = dup_dev(c->kn.mem, c->kn.mem_bytes), d.vn = dup_dev(c->vn.mem, c->vn.mem_bytes);
        d.knt = moved(&c->kn.t, c->kn.mem, d.kn), d.vnt = moved(&c->vn.t, c->vn.mem, d.vn);
    }
    d.seqlens = dup_dev(c->seqlens, sizeof(int32_t) * (size_t)s->batch);
    if (c->block_table) d.bt = dup_dev(c->block_table, sizeof(int32_t) * (size_t)(c->rows * c->max_pages));
    if (c->batch_idx) d.bidx = dup_dev(c->batch_idx, sizeof(int32_t) * (size_t)s->batch);
    if (c->cos) {
        const size_t n = sizeof(float) * (size_t)(c->rot_len * c->s.rot_dim / 2);
        d.cos = dup_dev(c->cos, n), d.sin = dup_dev(c->sin, n);
    }
    d.lse = dup_dev(c->lse, sizeof(float) * (size_t)(s->batch * s->hq * s->sq));
    d.sinks = dup_dev(s->opts.sinks, sizeof(float) * (size_t)s->hq); /* NULL without sinks */
    d.kds = dup_dev(c->k_descale, sizeof(float) * (size_t)(s->batch * s->hk)); /* NULL without FP8 */
    d.vds = dup_dev(c->v_descale, sizeof(float) * (size_t)(s->batch * s->hk));
    return d;
}

static void free_dev(dev_case *d) {
    void *ps[] = {d->kc, d->vc, d->q, d->kn, d->vn, d->out, d->seqlens, d->bt, d->bidx, d->cos, d->sin, d->lse,
                  d->sinks, d->kds, d->vds};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) cudaFree(ps[i]);
}

static fa_status call(fa_context *ctx, const t_kv_case *c, dev_case *d, const fa_kv_opts *extra) {
    fa_kvcache kc = t_kv_cache(c, d->kc, d->vc, d->seqlens, d->bt, d->bidx);
    fa_kv_opts ko = t_kv_opts(c, d->cos, d->sin);
    ko.k_descale = d->kds, ko.v_descale = d->vds; /* the device copies (NULL without FP8) */
    if (extra) ko.workspace = extra->workspace, ko.workspace_bytes = extra->workspace_bytes, ko.check_indices = extra->check_indices;
    fa_attn_opts o = c->s.opts;
    o.sinks = d->sinks; /* the device copy; the oracle reads the host's */
    return fa_forward_kvcache(ctx, &o, &ko, &d->qt, &kc, c->s.append ? &d->knt : NULL,
                              c->s.append ? &d->vnt : NULL, &d->outt, d->lse);
}

/* Copy the results back into the case's host buffers and verify them against the oracle. */
static int fetch_verify(const t_kv_case *c, dev_case *d, fa_context *cpu) {
    t_kv_case *h = (t_kv_case *)c;
    void *k = malloc(c->cache_bytes), *v = malloc(c->v_bytes);
    CU(cudaMemcpy(k, d->kc, c->cache_bytes, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(v, d->vc, c->v_bytes, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(h->out.mem, d->out, c->out.mem_bytes, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(h->lse, d->lse, sizeof(float) * (size_t)(c->s.batch * c->s.hq * c->s.sq), cudaMemcpyDeviceToHost));
    const int f = t_kv_verify(c, &c->out, c->lse, k, v, cpu, 0);
    free(k), free(v);
    return f;
}

static void run(fa_context *ctx, fa_context *cpu, const t_kv_spec *s, const char *what) {
    t_kv_case *c = t_kv_new(s, &R);
    snprintf(t_case_label, sizeof t_case_label,
             "%s: %s%s b%d sq%d hq%d hk%d d%d cap%d page%d append%d rotary%d bidx%d causal%d window(%d,%d) softcap%g "
             "sinks%d splits %d/%d", what, fa_dtype_name(s->dt), s->fp8 ? " e4m3 cache" : "", s->batch, s->sq, s->hq,
             s->hk, s->d, s->capacity, s->page_size, s->append, s->rotary, s->batch_idx, s->opts.causal,
             s->opts.window_left, s->opts.window_right, s->opts.softcap, s->opts.sinks != NULL, s->kv.num_splits,
             s->kv.split_size);
    t_trace_case();
    dev_case d = to_dev(c);
    const fa_status st = call(ctx, c, &d, NULL);
    CHECK_MSG(st == FA_OK, "%s: %s: %s", t_case_label, fa_status_string(st), fa_context_last_error(ctx));
    CU(cudaDeviceSynchronize());
    if (st == FA_OK) fetch_verify(c, &d, cpu);
    /* valid indices record no fault (the speculated block-table reads past a sequence's end, -1 here, included) */
    CHECK_MSG(fa_kvcache_check(ctx) == FA_OK, "%s: a fault was recorded: %s", t_case_label, fa_context_last_error(ctx));
    free_dev(&d);
    t_kv_free(c);
}

/* attention_chunk: chunks of the sequence after the append (a query row sees its diagonal's chunk only), with causal
 * and a window, contiguous and paged, append with rotary (chunk rotates q rows as a local call), splits. */
static void chunks(fa_context *ctx, fa_context *cpu, int small) {
    static const int pages[] = {0, 16, 3}, sizes[] = {8, 100, 33, 5000};
    int n = 0;
    for (int pi = 0; pi < 3; pi++)
        for (int ci = 0; ci < 4; ci++, n++) {
            if (small && n % 3) continue;
            t_kv_spec s = t_kv_spec_of(n % 2 ? FA_DTYPE_F16 : FA_DTYPE_BF16, 3, (int[]){1, 4, 17}[n % 3], 8, 2,
                               n % 2 ? 64 : 128, 700, pages[pi]);
            s.append = n % 2 == 0;
            s.rotary = s.append && n % 4 == 0;
            s.opts.causal = n % 3 != 1;
            s.opts.window_left = n % 5 == 2 ? 40 : -1;
            s.opts.attention_chunk = sizes[ci];
            if (n % 4 == 1) s.kv.num_splits = 5;
            run(ctx, cpu, &s, "chunk");
        }
}

static void grid(fa_context *ctx, fa_context *cpu, int small) {
    static const int pages[] = {0, 1, 3, 16, 64, 256}, sqs[] = {1, 4, 17};
    static const int gqa[][2] = {{4, 4}, {4, 1}, {8, 1}, {32, 8}};
    int n = 0;
    for (int pi = 0; pi < 6; pi++)
        for (int si = 0; si < 3; si++)
            for (int gi = 0; gi < 4; gi++, n++) {
                if (small && n % 4) continue;
                const int d = (int[]){128, 64, 128, 256}[n % 4];
                t_kv_spec s = t_kv_spec_of(n % 2 ? FA_DTYPE_F16 : FA_DTYPE_BF16, 3 + n % 2, sqs[si], gqa[gi][0], gqa[gi][1], d,
                                   small ? 300 : 700 + 111 * (n % 5), pages[pi]);
                s.append = n % 3 != 2;
                s.rotary = s.append ? n % 3 : 0;
                s.batch_idx = n % 5 == 1;
                switch (n % 5) {
                case 1: s.opts.causal = 1; break;
                case 2: s.opts.window_left = 37, s.opts.window_right = 2; break;
                case 3: s.opts.causal = 1, s.opts.window_left = 50; break;
                case 4: s.opts.softcap = 3.5f, s.opts.causal = 1; break;
                default: break;
                }
                if (n % 7 == 3) s.kv.num_splits = 1 + n % 13;
                if (n % 7 == 5) s.kv.split_size = 64 << (n % 3);
                run(ctx, cpu, &s, "grid");
            }
}

static void splits(fa_context *ctx, fa_context *cpu, int small) {
    static const int ns[] = {0, 1, 2, 5, 33, 128};
    for (int i = 0; i < 6; i++) {
        t_kv_spec s = t_kv_spec_of(FA_DTYPE_BF16, 1, 1, 32, 8, 128, small ? 2000 : 16384, i % 2 ? 16 : 0);
        s.append = 1;
        s.kv.num_splits = ns[i];
        run(ctx, cpu, &s, "splits");
    }
}

/* Learnable sinks (opts.sinks): the sink joins each row once — at the row's finish with one split, after the merge
 * with several — in every merge path: a cluster (2-16 splits), the last CTA's register merge (fixed splits, no
 * cluster) and its tile merge (more than 16 splits); contiguous and paged, GQA, masks and softcap, sequences without
 * keys (O = 0, LSE = the sink), a head without a sink (-inf), every head dim. The numerics contract with sinks:
 * contract(). */
static void sinks(fa_context *ctx, fa_context *cpu, int small) {
    static float sk[32];
    for (int h = 0; h < 32; h++) sk[h] = (float)(-2 + 6 * t_rng_uniform(&R));
    sk[5] = -INFINITY;
    static const int ns[] = {1, 0, 4, 33, 1, 0, 16, 3};
    for (int i = 0; i < 16; i++) {
        if (small && i % 2) continue;
        const int d = (int[]){128, 64, 256}[i % 3], lens[3] = {0, 1 + i * 37, small ? 697 : 1897};
        t_kv_spec s = t_kv_spec_of(i % 2 ? FA_DTYPE_F16 : FA_DTYPE_BF16, 3, (int[]){1, 4, 1, 2}[i % 4], i % 4 < 2 ? 32 : 8,
                           8, d, small ? 701 : 1901, (int[]){0, 16, 3, 0}[i / 4]);
        s.lens = i % 3 == 2 ? NULL : lens;
        s.append = i % 3 != 1;
        s.opts.sinks = sk;
        s.opts.causal = i % 2;
        if (i % 5 == 4) s.opts.softcap = 5;
        if (i % 7 == 3) s.opts.window_left = 60;
        if (i < 8) s.kv.num_splits = ns[i];
        else if (i % 2) s.kv.split_size = i < 12 ? 256 : 64; /* no cluster: the last CTA's merge (64: > 16 splits) */
        run(ctx, cpu, &s, "sinks");
    }
}

/* A device copy of the new rows one element past a 16-byte boundary (the first kernel's element-wise append). */
static void misalign(void **dev, fa_tensor *t, const t_buf *host) {
    char *m = NULL;
    CU(cudaMalloc((void **)&m, host->mem_bytes + 16));
    CU(cudaMemcpy(m + 2, host->mem, host->mem_bytes, cudaMemcpyHostToDevice));
    cudaFree(*dev);
    *dev = m;
    *t = moved(&host->t, host->mem, m + 2);
}

/* The append's paths and the split counters': aligned new rows (16 bytes a thread) and unaligned ones (element by
 * element); the context's counters (zero between calls) and a caller's workspace filled with 0xff (the first
 * kernel zeroes its counters); 4 warps (contiguous) and 8 (paged, 512 keys or more a split) per CTA, one split and
 * several (the 8-warp merge). */
static void paths(fa_context *ctx, fa_context *cpu, int small) {
    for (int i = 0; i < 12; i++) {
        const int unaligned = i & 1, user_ws = (i >> 1) & 1;
        t_kv_spec s = t_kv_spec_of(i % 2 ? FA_DTYPE_F16 : FA_DTYPE_BF16, 2, i % 4 < 2 ? 1 : 4, 32, 8, i % 3 ? 128 : 64,
                           small ? 2048 : 4096, (int[]){0, 16, 3}[i / 4]);
        s.append = 1;
        s.opts.causal = 1;
        s.kv.num_splits = i % 3 == 2 ? 1 : 4;
        t_kv_case *c = t_kv_new(&s, &R);
        snprintf(t_case_label, sizeof t_case_label, "paths: page %d d%d sq%d splits %d, new rows %s, %s",
                 s.page_size, s.d, s.sq, s.kv.num_splits, unaligned ? "unaligned" : "aligned",
                 user_ws ? "caller's workspace" : "context's counters");
        dev_case d = to_dev(c);
        if (unaligned) misalign(&d.kn, &d.knt, &c->kn), misalign(&d.vn, &d.vnt, &c->vn);
        fa_kv_opts wo = fa_kv_opts_default();
        if (user_ws) {
            fa_kvcache kc = t_kv_cache(c, d.kc, d.vc, d.seqlens, d.bt, d.bidx);
            fa_kv_opts ko = t_kv_opts(c, d.cos, d.sin);
            CHECK_STATUS(fa_kvcache_workspace_size(ctx, &c->s.opts, &ko, &d.qt, &kc, &d.knt, &wo.workspace_bytes),
                         FA_OK);
            if (wo.workspace_bytes) {
                CU(cudaMalloc(&wo.workspace, wo.workspace_bytes));
                CU(cudaMemset(wo.workspace, 0xff, wo.workspace_bytes));
            }
        }
        const fa_status st = call(ctx, c, &d, &wo);
        CHECK_MSG(st == FA_OK, "%s: %s: %s", t_case_label, fa_status_string(st), fa_context_last_error(ctx));
        CU(cudaDeviceSynchronize());
        if (st == FA_OK) fetch_verify(c, &d, cpu);
        cudaFree(wo.workspace);
        free_dev(&d);
        t_kv_free(c);
    }
}

/* More splits than the last CTA's merge holds at once (fixed splits of 16 keys: 150-256 splits), and the merge's
 * thread layouts: 1, 3 and 16 rows per tile at d 64, 128, 256. */
static void many_splits(fa_context *ctx, fa_context *cpu, int small) {
    static const int shapes[][3] = {{8, 8, 64}, {32, 8, 128}, {3, 1, 128}, {16, 1, 256}, {16, 1, 64}, {8, 8, 256}};
    for (int i = 0; i < 6; i++) {
        t_kv_spec s = t_kv_spec_of(i % 2 ? FA_DTYPE_F16 : FA_DTYPE_BF16, 2, 1, shapes[i][0], shapes[i][1], shapes[i][2],
                           small ? 2400 : 4096, i % 3 == 1 ? 16 : 0);
        s.append = i % 2;
        s.kv.split_size = 16;
        run(ctx, cpu, &s, "many splits");
    }
}

/* The contract cases' comparison (2 sequences x 3 rows x 8 heads, d 128): case c on the device, then on the CPU
 * over the host copies (its append writes the host cache the device copy was taken from; an FP8 cache's descales
 * are the host ones): out and LSE NaN where the CPU's are, the same infinities, the finite values within bf16's
 * rounding. Counts the CPU's NaN and finite rows; frees c. */
static void against_cpu(fa_context *ctx, fa_context *cpu, const t_kv_spec *s, t_kv_case *c, int *nan_rows,
                    int *fin_rows) {
    const int64_t nq = 2 * 3 * 8 * 128, nl = 2 * 8 * 3;
    t_trace_case();
    dev_case d = to_dev(c);
    CHECK_STATUS(call(ctx, c, &d, NULL), FA_OK);
    CU(cudaDeviceSynchronize());
    double *go = malloc(sizeof(double) * (size_t)nq);
    float glse[48];
    CU(cudaMemcpy(c->out.mem, d.out, c->out.mem_bytes, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(glse, d.lse, sizeof(float) * nl, cudaMemcpyDeviceToHost));
    int64_t n = 0;
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 3; i++)
            for (int h = 0; h < 8; h++)
                for (int e = 0; e < 128; e++) go[n++] = t_get(&c->out.t, b, i, h, e);
    t_buf_poison(&c->out);
    fa_kvcache kc = t_kv_cache(c, c->kc, c->vc, c->seqlens, c->block_table, c->batch_idx);
    const fa_kv_opts ko = t_kv_opts(c, NULL, NULL);
    CHECK_STATUS(fa_forward_kvcache(cpu, &s->opts, &ko, &c->q.t, &kc, &c->kn.t, &c->vn.t, &c->out.t, c->lse),
                 FA_OK);
    int bad = 0;
    *nan_rows = *fin_rows = 0;
    n = 0;
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 3; i++)
            for (int h = 0; h < 8; h++) {
                const int64_t r = (b * 8 + h) * 3 + i;
                const double lc = c->lse[r], lg = glse[r];
                int row_nan = isnan(lc); /* a NaN in v leaves the LSE finite: the row's out is NaN */
                if (isnan(lc) != isnan(lg) || (!isnan(lc) && fabs(lg - lc) > 1e-3 * fmax(1.0, fabs(lc)))) {
                    if (bad++ < 4) fprintf(stderr, "%s: row b%d i%d h%d: lse %g vs cpu %g\n", t_case_label, b, i, h, lg, lc);
                }
                for (int e = 0; e < 128; e++, n++) {
                    const double oc = t_get(&c->out.t, b, i, h, e), og = go[n];
                    row_nan |= isnan(oc);
                    const int ok = isnan(oc) ? isnan(og)
                                   : isinf(oc) ? og == oc
                                               : isfinite(og) && fabs(og - oc) <= 1.6e-2 * fmax(1e-30, fabs(oc)) + 1e-2;
                    if (!ok && bad++ < 4)
                        fprintf(stderr, "%s: b%d i%d h%d col %d: %g vs cpu %g\n", t_case_label, b, i, h, e, og, oc);
                }
                if (row_nan) ++*nan_rows;
                else ++*fin_rows;
            }
    CHECK_MSG(bad == 0, "%s: %d values differ from the CPU's", t_case_label, bad);
    free(go);
    free_dev(&d);
    t_kv_free(c);
}

/* The numerics contract (docs/numerics.md) against the CPU backend, which holds to it: NaN in a cached key, inf in
 * a cached value, NaN in a q row, every input scaled by 1e37 (q·k beyond fp32), scale/softcap beyond fp32. NaN
 * where the CPU has NaN, the same infinities, the finite values within the dtype's rounding; one and several splits,
 * contiguous and paged. */
static void contract(fa_context *ctx, fa_context *cpu) {
    static const float scales[6][2] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}, {1e30f, 1e-30f}, {FLT_MAX, 0.5f}};
    static const float sk[8] = {0.5f, -1, 2, -INFINITY, 3, 0, 1.5f, -0.25f};
    for (int x = 0; x < 24; x++) { /* 12..23: the same with sinks (their join after the float64 recompute) */
        const int kind = x % 6;
        t_kv_spec s = t_kv_spec_of(FA_DTYPE_BF16, 2, 3, 8, 2, 128, 300, x / 6 % 2 ? 16 : 0);
        s.opts.sinks = x < 12 ? NULL : sk;
        const int lens[2] = {250, 120};
        s.lens = lens;
        s.append = 1, s.opts.causal = 1;
        s.kv.num_splits = x % 2 ? 3 : 1;
        s.opts.scale = scales[kind][0], s.opts.softcap = scales[kind][1];
        t_kv_case *c = t_kv_new(&s, &R);
        if (kind == 0) t_store(c->kc, s.dt, t_kv_key_off(c, 0, 1, 40) + 5, NAN);
        if (kind == 1) t_store(c->vc, s.dt, t_kv_val_off(c, 1, 0, 100) + 7, INFINITY);
        if (kind == 2) t_set(&c->q.t, 1, 2, 3, 9, NAN);
        if (kind == 3) {
            for (int b = 0; b < 2; b++)
                for (int h = 0; h < 2; h++)
                    for (int t = 0; t < lens[b]; t++)
                        for (int e = 0; e < 128; e++) {
                            const int64_t o = t_kv_key_off(c, b, h, t) + e;
                            t_store(c->kc, s.dt, o, t_load(c->kc, s.dt, o) * 1e37);
                        }
            for (int b = 0; b < 2; b++)
                for (int i = 0; i < 3; i++)
                    for (int h = 0; h < 8; h++)
                        for (int e = 0; e < 128; e++) {
                            t_set(&c->q.t, b, i, h, e, t_get(&c->q.t, b, i, h, e) * 1e37);
                            if (h < 2) t_set(&c->kn.t, b, i, h, e, t_get(&c->kn.t, b, i, h, e) * 1e37);
                        }
        }
        snprintf(t_case_label, sizeof t_case_label, "contract %d: splits %d page %d scale %g softcap %g sinks %d", kind,
                 s.kv.num_splits, s.page_size, s.opts.scale, s.opts.softcap, s.opts.sinks != NULL);
        int nan_rows, fin_rows;
        against_cpu(ctx, cpu, &s, c, &nan_rows, &fin_rows);
        /* the poisoned input reaches some rows and only those: the test can see both kinds */
        CHECK_MSG(kind == 0 || kind == 2 ? nan_rows > 0 && fin_rows > 0 : nan_rows == 0, "%s: %d NaN rows, %d finite",
                  t_case_label, nan_rows, fin_rows);
    }
}

/* check_indices: a bad length is reported, nothing is written. */
static void check_indices(fa_context *ctx) {
    t_kv_spec s = t_kv_spec_of(FA_DTYPE_BF16, 2, 1, 8, 2, 128, 100, 16);
    s.append = 1;
    t_kv_case *c = t_kv_new(&s, &R);
    snprintf(t_case_label, sizeof t_case_label, "check_indices");
    c->seqlens[1] = (int32_t)(c->max_pages * s.page_size); /* the paged capacity (7 pages of 16): + 1 new key > it */
    dev_case d = to_dev(c);
    fa_kv_opts ko = fa_kv_opts_default();
    ko.check_indices = 1;
    CHECK_STATUS(call(ctx, c, &d, &ko), FA_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "cache.seqlens[1]");
    unsigned char *k = malloc(c->cache_bytes), *o = malloc(c->out.mem_bytes);
    CU(cudaMemcpy(k, d.kc, c->cache_bytes, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(o, d.out, c->out.mem_bytes, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(k, c->kc, c->cache_bytes) && !memcmp(o, c->out.mem, c->out.mem_bytes));
    /* trusted (no check): the bad length is clamped, the call writes nothing out of bounds (memcheck sees it), and
     * the fault is recorded */
    CHECK_STATUS(call(ctx, c, &d, NULL), FA_OK);
    CHECK_STATUS(fa_kvcache_check(ctx), FA_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "cache.seqlens[1]");
    free(k), free(o);
    free_dev(&d);
    t_kv_free(c);
}

/* The byte range of the cache that sequence b's keys live in: its row, or its one page (a table of one column). */
static void seq_region(const t_kv_case *c, int b, size_t *lo, size_t *n) {
    const int64_t row = c->batch_idx ? c->batch_idx[b] : b;
    const int64_t unit = c->s.page_size ? c->block_table[row * c->max_pages] : row;
    *n = (size_t)c->kct.stride_batch * (c->s.dt == FA_DTYPE_F32 ? 4 : 2);
    *lo = (size_t)unit * *n;
}

/* Indices out of range without check_indices (docs/kvcache.md, "Indices out of range"), in sequence 1 of 2: the
 * kernels clamp them — nothing read or written out of bounds (memcheck runs this), sequence 1 appends nothing,
 * sequence 0's out is the bits of the call without the fault (one split: no sequence's sums depend on another's) —
 * and record the first; fa_kvcache_check names it and clears it. With check_indices the call is refused first. */
enum { OOR_PAST, OOR_FULL_APPEND, OOR_NEGATIVE, OOR_PAGE_HIGH, OOR_PAGE_NEG, OOR_ROW, OOR_ROTARY, OOR_KINDS };
static const char *const oor_name[OOR_KINDS] = {"length past the capacity", "full cache + a new key", "negative length",
                                                "block-table entry = num_pages", "block-table entry -1",
                                                "batch_idx = rows", "rotary positions past the tables"};
static const char *const oor_arg[OOR_KINDS] = {"cache.seqlens[1]", "cache.seqlens[1]", "cache.seqlens[1]",
                                               "cache.block_table", "cache.block_table", "cache.batch_idx[1]",
                                               "kv_opts.rotary_seqlen"};

static fa_status call_rot(fa_context *ctx, const t_kv_case *c, dev_case *d, int64_t rot_seqlen, int check) {
    fa_kvcache kc = t_kv_cache(c, d->kc, d->vc, d->seqlens, d->bt, d->bidx);
    fa_kv_opts ko = t_kv_opts(c, d->cos, d->sin);
    if (rot_seqlen) ko.rotary_seqlen = rot_seqlen;
    ko.num_splits = 1, ko.check_indices = check;
    return fa_forward_kvcache(ctx, &c->s.opts, &ko, &d->qt, &kc, c->s.append ? &d->knt : NULL,
                              c->s.append ? &d->vnt : NULL, &d->outt, d->lse);
}

static void out_of_range(fa_context *ctx) {
    for (int page = 0; page <= 16; page += 16)
        for (int kind = 0; kind < OOR_KINDS; kind++) {
            if (!page && (kind == OOR_PAGE_HIGH || kind == OOR_PAGE_NEG)) continue;
            /* paged: a block table of one column of 16 keys (flash-attn's bounds test) */
            t_kv_spec s = t_kv_spec_of(FA_DTYPE_BF16, 2, 1, 8, 2, 128, page ? 16 : 40, page);
            int lens[2] = {5, 7};
            s.lens = lens;
            s.append = kind == OOR_FULL_APPEND || kind == OOR_ROTARY;
            s.rotary = kind == OOR_ROTARY;
            s.batch_idx = kind == OOR_ROW;
            t_kv_case *c = t_kv_new(&s, &R);
            snprintf(t_case_label, sizeof t_case_label, "out of range (%s): %s", page ? "paged, one column" :
                     "contiguous", oor_name[kind]);
            dev_case d = to_dev(c);
            const size_t ob = c->out.mem_bytes;
            unsigned char *good = malloc(ob), *got = malloc(ob), *k = malloc(c->cache_bytes);
            CHECK_STATUS(call_rot(ctx, c, &d, 0, 0), FA_OK);
            CU(cudaMemcpy(good, d.out, ob, cudaMemcpyDeviceToHost));
            CHECK_STATUS(fa_kvcache_check(ctx), FA_OK);
            /* the fault, in sequence 1, on a fresh cache and a poisoned out */
            CU(cudaMemcpy(d.kc, c->kc, c->cache_bytes, cudaMemcpyHostToDevice));
            CU(cudaMemcpy(d.out, c->out.mem, ob, cudaMemcpyHostToDevice));
            int32_t bad = 0;
            int64_t rot = 0;
            switch (kind) {
            case OOR_PAST: bad = s.capacity + 1; break;
            case OOR_FULL_APPEND: bad = s.capacity; break;
            case OOR_NEGATIVE: bad = -3; break;
            case OOR_ROTARY: bad = 6, rot = 6; break; /* 6 + 1 new key > 6 positions */
            default: break;
            }
            if (kind <= OOR_NEGATIVE || kind == OOR_ROTARY)
                CU(cudaMemcpy(d.seqlens + 1, &bad, 4, cudaMemcpyHostToDevice));
            if (kind == OOR_PAGE_HIGH || kind == OOR_PAGE_NEG) {
                bad = kind == OOR_PAGE_HIGH ? (int32_t)c->num_pages : -1;
                CU(cudaMemcpy(d.bt + 1 * c->max_pages, &bad, 4, cudaMemcpyHostToDevice));
            }
            if (kind == OOR_ROW) {
                bad = (int32_t)c->rows;
                CU(cudaMemcpy(d.bidx + 1, &bad, 4, cudaMemcpyHostToDevice));
            }
            /* check_indices refuses it first, writing nothing */
            CHECK_STATUS(call_rot(ctx, c, &d, rot, 1), FA_ERR_INVALID_ARGUMENT);
            CU(cudaMemcpy(got, d.out, ob, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(k, d.kc, c->cache_bytes, cudaMemcpyDeviceToHost));
            CHECK_MSG(!memcmp(got, c->out.mem, ob) && !memcmp(k, c->kc, c->cache_bytes),
                      "%s: check_indices wrote", t_case_label);
            /* trusted: runs, clamps, records */
            CHECK_STATUS(call_rot(ctx, c, &d, rot, 0), FA_OK);
            CU(cudaDeviceSynchronize());
            CHECK_STATUS(fa_kvcache_check(ctx), FA_ERR_INVALID_ARGUMENT);
            CHECK_STR_CONTAINS(fa_context_last_error(ctx), oor_arg[kind]);
            CHECK_STATUS(fa_kvcache_check(ctx), FA_OK); /* cleared */
            CU(cudaMemcpy(got, d.out, ob, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(k, d.kc, c->cache_bytes, cudaMemcpyDeviceToHost));
            const fa_tensor *ot = &c->out.t; /* sequence 0's rows, element by element (the view may be strided) */
            const size_t base = (size_t)((const unsigned char *)ot->data - c->out.mem);
            int64_t diff = 0;
            for (int64_t h = 0; h < ot->heads; h++)
                for (int64_t e = 0; e < ot->head_dim; e++) {
                    const size_t at = base + (size_t)(h * ot->stride_head + e) * 2;
                    diff += memcmp(got + at, good + at, 2) != 0;
                }
            CHECK_MSG(diff == 0, "%s: %lld elements of sequence 0's out changed", t_case_label, (long long)diff);
            if (kind != OOR_ROW && kind != OOR_PAGE_HIGH && kind != OOR_PAGE_NEG) {
                size_t lo, n; /* sequence 1 appended nothing: its row or page is as before */
                seq_region(c, 1, &lo, &n);
                CHECK_MSG(!memcmp(k + lo, (unsigned char *)c->kc + lo, n), "%s: sequence 1 appended", t_case_label);
            }
            free(good), free(got), free(k);
            free_dev(&d);
            t_kv_free(c);
        }
}

/* A fault inside a graph replay: captured with valid lengths, replayed after one is set past the capacity. */
static void graph_fault(fa_context *ctx) {
    t_kv_spec s = t_kv_spec_of(FA_DTYPE_F16, 2, 1, 8, 2, 64, 64, 16);
    s.append = 1;
    t_kv_case *c = t_kv_new(&s, &R);
    snprintf(t_case_label, sizeof t_case_label, "fault in a graph replay");
    dev_case d = to_dev(c);
    cudaStream_t st;
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CHECK_STATUS(fa_context_set_stream(ctx, st), FA_OK);
    CHECK_STATUS(call_rot(ctx, c, &d, 0, 0), FA_OK); /* grows what the call needs before the capture */
    CHECK_STATUS(fa_kvcache_check(ctx), FA_OK);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    const fa_status rc = call_rot(ctx, c, &d, 0, 0);
    CU(cudaStreamEndCapture(st, &g));
    CHECK_STATUS(rc, FA_OK);
    CU(cudaGraphInstantiate(&ge, g, 0));
    const int32_t bad = 64; /* a full cache + the new key */
    CU(cudaMemcpy(d.seqlens, &bad, 4, cudaMemcpyHostToDevice));
    CU(cudaGraphLaunch(ge, st));
    CHECK_STATUS(fa_kvcache_check(ctx), FA_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "cache.seqlens[0] = 64");
    CHECK_STATUS(fa_kvcache_check(ctx), FA_OK);
    CU(cudaGraphExecDestroy(ge));
    CU(cudaGraphDestroy(g));
    CHECK_STATUS(fa_context_set_stream(ctx, NULL), FA_OK);
    CU(cudaStreamDestroy(st));
    free_dev(&d);
    t_kv_free(c);
}

/* One graph captured at one set of lengths, replayed after the device lengths change. */
static void graph(fa_context *ctx, fa_context *cpu, int small) {
    for (int page = 0; page <= 16; page += 16) {
        const int cap = small ? 600 : 4096;
        int big[3] = {cap - 2, cap / 2, cap / 3 + 5}, little[3] = {7, cap / 3, cap / 3}; /* pages cover big */
        t_kv_spec s = t_kv_spec_of(FA_DTYPE_BF16, 3, 2, 16, 2, 128, cap, page);
        s.append = 1;
        s.opts.causal = 1;
        s.lens = big;
        t_kv_case *c = t_kv_new(&s, &R); /* the cache holds keys up to the longer lengths */
        snprintf(t_case_label, sizeof t_case_label, "graph replay page %d", page);
        dev_case d = to_dev(c);
        cudaStream_t st;
        CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        CHECK_STATUS(fa_context_set_stream(ctx, st), FA_OK);
        fa_kvcache kc = t_kv_cache(c, d.kc, d.vc, d.seqlens, d.bt, d.bidx);
        fa_kv_opts ko = t_kv_opts(c, d.cos, d.sin);
        size_t need = 0;
        CHECK_STATUS(fa_kvcache_workspace_size(ctx, &c->s.opts, &ko, &d.qt, &kc, &d.knt, &need), FA_OK);
        void *ws = NULL;
        if (need) CU(cudaMalloc(&ws, need));
        fa_kv_opts wo = fa_kv_opts_default();
        wo.workspace = ws, wo.workspace_bytes = need;
        /* capture at the short lengths */
        CU(cudaMemcpy(d.seqlens, little, sizeof little, cudaMemcpyHostToDevice));
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        const fa_status rc = call(ctx, c, &d, &wo);
        CU(cudaStreamEndCapture(st, &g));
        CHECK_MSG(rc == FA_OK, "capture: %s: %s", fa_status_string(rc), fa_context_last_error(ctx));
        CU(cudaGraphInstantiate(&ge, g, 0));
        CU(cudaGraphLaunch(ge, st));
        CU(cudaStreamSynchronize(st));
        t_kv_case view = *c;
        view.seqlens = little;
        snprintf(t_case_label, sizeof t_case_label, "graph replay page %d: short lengths", page);
        fetch_verify(&view, &d, cpu);
        /* replay at the long lengths on a fresh copy of the cache and a poisoned out */
        CU(cudaMemcpy(d.kc, c->kc, c->cache_bytes, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(d.vc, c->vc, c->cache_bytes, cudaMemcpyHostToDevice));
        t_buf_poison(&c->out);
        CU(cudaMemcpy(d.out, c->out.mem, c->out.mem_bytes, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(d.seqlens, big, sizeof big, cudaMemcpyHostToDevice));
        CU(cudaGraphLaunch(ge, st));
        CU(cudaStreamSynchronize(st));
        snprintf(t_case_label, sizeof t_case_label, "graph replay page %d: long lengths", page);
        fetch_verify(c, &d, cpu);
        CU(cudaGraphExecDestroy(ge));
        CU(cudaGraphDestroy(g));
        CHECK_STATUS(fa_context_set_stream(ctx, NULL), FA_OK);
        CU(cudaStreamDestroy(st));
        cudaFree(ws);
        free_dev(&d);
        t_kv_free(c);
    }
}

static void merge(fa_context *ctx) {
    const int B = 2, S = 3, H = 4, D = 128, n = 3, rows = B * S * H;
    snprintf(t_case_label, sizeof t_case_label, "merge");
    float *h[3], *l[3], *dh[3], *dl[3];
    fa_tensor t[3];
    const float *lp[3];
    for (int i = 0; i < n; i++) {
        h[i] = malloc(sizeof(float) * rows * D), l[i] = malloc(sizeof(float) * rows);
        for (int j = 0; j < rows * D; j++) h[i][j] = (float)t_rng_randn(&R);
        for (int j = 0; j < rows; j++) l[i][j] = (float)(3 * t_rng_randn(&R));
        l[i][5] = -INFINITY;
        dh[i] = dup_dev(h[i], sizeof(float) * rows * D), dl[i] = dup_dev(l[i], sizeof(float) * rows);
        t[i] = fa_tensor_bshd(dh[i], FA_DTYPE_F32, B, S, H, D);
        lp[i] = dl[i];
    }
    float *dout = NULL, *dlse = NULL;
    CU(cudaMalloc((void **)&dout, sizeof(float) * rows * D));
    CU(cudaMalloc((void **)&dlse, sizeof(float) * rows));
    fa_tensor o = fa_tensor_bshd(dout, FA_DTYPE_F32, B, S, H, D);
    CHECK_STATUS(fa_merge_states(ctx, n, t, lp, &o, dlse), FA_OK);
    float *out = malloc(sizeof(float) * rows * D), lse[24];
    CU(cudaMemcpy(out, dout, sizeof(float) * rows * D, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(lse, dlse, sizeof lse, cudaMemcpyDeviceToHost));
    double err = 0, lerr = 0;
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++)
            for (int hh = 0; hh < H; hh++) {
                const int r = (b * H + hh) * S + s, orow = (b * S + s) * H + hh; /* lse [b, h, s]; out [b, s, h] */
                double M = -INFINITY, sum = 0;
                for (int i = 0; i < n; i++) M = fmax(M, l[i][r]);
                for (int i = 0; i < n; i++) sum += exp(l[i][r] - M);
                lerr = fmax(lerr, fabs(lse[r] - (M + log(sum))));
                for (int e = 0; e < D; e++) {
                    double x = 0;
                    for (int i = 0; i < n; i++) x += exp(l[i][r] - M) / sum * h[i][orow * D + e];
                    err = fmax(err, fabs(out[orow * D + e] - x));
                }
            }
    CHECK_LE(err, 1e-5);
    CHECK_LE(lerr, 1e-5);
    for (int i = 0; i < n; i++) free(h[i]), free(l[i]), cudaFree(dh[i]), cudaFree(dl[i]);
    free(out);
    cudaFree(dout), cudaFree(dlse);
}

/* A cache whose v has its own head dim (the pair kernel, pair.cu): MLA's latent (576, 512) — one K/V head for the 16
 * to 64 query rows of 16 heads — and (192, 128) with GQA 4; contiguous and paged (a page of 3 keys splits the
 * kernel's 32-key blocks), append with and without rotary, batch_idx, one split, the last CTA's register merge (2-16
 * splits), its tile merge (33) and the fixed-split mode; causal, a window, softcap, sinks. */
static void vdim(fa_context *ctx, fa_context *cpu, int small) {
    static const int pairs[2][2] = {{576, 512}, {192, 128}}, ns[6] = {0, 4, 33, 1, 0, 16};
    static float sk[16];
    for (int h = 0; h < 16; h++) sk[h] = (float)(-1 + 4 * t_rng_uniform(&R));
    for (int i = 0; i < 12; i++) {
        if (small && i % 3) continue;
        const int pr = i % 2, cap = small ? 300 : pr ? 1500 : 1100;
        t_kv_spec s = t_kv_spec_of(i % 4 < 2 ? FA_DTYPE_BF16 : FA_DTYPE_F16, 3, (int[]){1, 2, 1, 4}[i / 2 % 4], pr ? 8 : 16,
                           pr ? 2 : 1, pairs[pr][0], cap, (int[]){0, 16, 3, 64}[i / 3 % 4]);
        s.dv = pairs[pr][1];
        s.append = i % 3 != 2;
        s.rotary = s.append && i % 4 == 1;
        s.batch_idx = i % 5 == 2;
        s.opts.causal = i % 2 == 0;
        if (i % 5 == 3) s.opts.window_left = 50;
        if (i % 6 == 4) s.opts.softcap = 5;
        if (i % 4 == 3) s.opts.sinks = sk;
        if (i == 7) s.kv.split_size = 64; /* the split size, not a count: the two are exclusive */
        else s.kv.num_splits = ns[i % 6];
        run(ctx, cpu, &s, "vdim");
    }
}

/* A cache whose v has a head dim of its own that no pair row builds ((128, 64), (576, 128)): FA_ERR_UNSUPPORTED
 * naming cache.v and both dims, before anything is written. */
static void vdim_refusal(fa_context *ctx) {
    static const int pairs[2][2] = {{576, 128}, {128, 64}};
    for (int i = 0; i < 2; i++) {
        t_kv_spec s = t_kv_spec_of(FA_DTYPE_BF16, 2, 1, 16, 1, pairs[i][0], 64, 16);
        s.dv = pairs[i][1], s.append = i;
        t_kv_case *c = t_kv_new(&s, &R);
        snprintf(t_case_label, sizeof t_case_label, "decode d %d dv %d refused", pairs[i][0], pairs[i][1]);
        dev_case d = to_dev(c);
        CHECK_STATUS(call(ctx, c, &d, NULL), FA_ERR_UNSUPPORTED);
        char want[96];
        snprintf(want, sizeof want, "cache.v: head_dim %d differs from q's %d", pairs[i][1], pairs[i][0]);
        CHECK_STR_CONTAINS(fa_context_last_error(ctx), want);
        free_dev(&d);
        t_kv_free(c);
    }
}

/* FP8 (E4M3) caches with device descales (random per sequence and K/V head), against the float64 oracle on the
 * cache decoded with them, outputs poisoned: contiguous and paged (pages of 16, 3 and 64 keys: whole tiles, tiles
 * over pages, several tiles a page), GQA 4, 1, 8 and 32/8, d 128, 64, 256, 1, 4 and 17 new rows, odd capacities and
 * lengths, append (quantised with the descales: the bytes must equal core/fp8.h's rounding, as the CPU's) with and
 * without rotary, batch_idx, every mask option and softcap, sinks, one split, the cluster merge, the last CTA's
 * register merge (fixed splits) and tile merge (> 16 splits); then long sequences (8 warps a CTA, many splits). */
static void fp8(fa_context *ctx, fa_context *cpu, int small) {
    static float sk[32];
    for (int h = 0; h < 32; h++) sk[h] = (float)(-1 + 4 * t_rng_uniform(&R));
    static const int pages[] = {0, 16, 3, 64}, sqs[] = {1, 4, 17}, dims[] = {128, 64, 256};
    static const int gqa[][2] = {{8, 2}, {4, 4}, {8, 1}, {32, 8}};
    for (int n = 0; n < 36; n++) {
        if (small && n % 3) continue;
        t_kv_spec s = t_kv_spec_of(n % 2 ? FA_DTYPE_F16 : FA_DTYPE_BF16, 2 + n % 3, sqs[n / 3 % 3], gqa[n % 4][0],
                                   gqa[n % 4][1], dims[n % 3], small ? 333 : 777 + 131 * (n % 4), pages[n / 9]);
        s.fp8 = 1;
        s.append = n % 4 != 3;
        s.rotary = s.append && n % 5 == 1 ? 1 + n / 5 % 2 : 0;
        s.batch_idx = n % 7 == 2;
        t_kv_set_mask(&s, n % 5);
        if (n % 6 == 5) s.opts.sinks = sk;
        switch (n % 8) {
        case 1: s.kv.num_splits = 4; break;  /* a cluster (or the register merge) */
        case 3: s.kv.num_splits = 33; break; /* the tile merge */
        case 5: s.kv.split_size = 64; break; /* fixed splits: the register or tile merge */
        case 6: s.kv.num_splits = 1; break;
        default: break;                      /* the plan's choice */
        }
        run(ctx, cpu, &s, "fp8");
    }
    for (int i = 0; i < 4; i++) {
        t_kv_spec s = t_kv_spec_of(i % 2 ? FA_DTYPE_F16 : FA_DTYPE_BF16, 1, 1, 32, 8, i < 2 ? 128 : 64,
                                   small ? 3001 : 9001, i % 2 ? 16 : 0);
        s.fp8 = 1, s.append = 1, s.opts.causal = i % 2;
        s.kv.num_splits = (int[]){0, 2, 16, 128}[i];
        run(ctx, cpu, &s, "fp8 long");
    }
}

/* Head dims 96 and 80 (tile rows padded to 128 elements in shared memory, copies of 12 or 10 chunks a row, E4M3's 6
 * or 5; d = 80's float64 recompute with lanes past the row): 16-bit and E4M3 caches, contiguous and paged (16 and 3
 * keys a page), GQA 1, 4 and 32/8, 1 and 5 new rows, append with and without rotary, masks and softcap, sinks, one
 * split, a cluster or register merge, the tile merge, fixed splits. */
static void padded_dims(fa_context *ctx, fa_context *cpu, int small) {
    static float sk[32];
    for (int h = 0; h < 32; h++) sk[h] = (float)(-1 + 4 * t_rng_uniform(&R));
    static const int gqa[][2] = {{8, 2}, {4, 4}, {32, 8}};
    for (int n = 0; n < 24; n++) {
        if (small && n % 2) continue;
        t_kv_spec s = t_kv_spec_of(n % 2 ? FA_DTYPE_F16 : FA_DTYPE_BF16, 2 + n % 2, n % 3 ? 1 : 5, gqa[n % 3][0],
                                   gqa[n % 3][1], n < 12 ? 96 : 80, small ? 401 : 1201 + 77 * n,
                                   (int[]){0, 16, 3}[n / 4 % 3]);
        s.fp8 = n / 2 % 2;
        s.append = n % 4 != 3;
        s.rotary = s.append && n % 5 == 2;
        t_kv_set_mask(&s, n % 5);
        if (n % 6 == 1) s.opts.sinks = sk;
        s.kv.num_splits = (int[]){0, 1, 4, 33, 0, 2}[n % 6];
        if (n % 12 == 10) s.kv.num_splits = 0, s.kv.split_size = 128;
        run(ctx, cpu, &s, "padded d");
    }
}

/* The numerics contract on an FP8 cache against the CPU: a NaN byte (0x7f) in a cached key, in a cached value, NaN
 * in a q row, one and several splits, contiguous and paged: NaN where the CPU has NaN (some rows, not all), the
 * finite values within bf16's rounding. */
static void fp8_contract(fa_context *ctx, fa_context *cpu) {
    for (int x = 0; x < 12; x++) {
        const int kind = x % 3;
        t_kv_spec s = t_kv_spec_of(FA_DTYPE_BF16, 2, 3, 8, 2, 128, 300, x / 3 % 2 ? 16 : 0);
        const int lens[2] = {250, 120};
        s.lens = lens;
        s.fp8 = 1, s.append = 1, s.opts.causal = 1;
        s.kv.num_splits = x / 6 ? 3 : 1;
        t_kv_case *c = t_kv_new(&s, &R);
        if (kind == 0) ((uint8_t *)c->kc)[t_kv_key_off(c, 0, 1, 40) + 5] = 0x7f;
        if (kind == 1) ((uint8_t *)c->vc)[t_kv_val_off(c, 1, 0, 100) + 7] = 0xff;
        if (kind == 2) t_set(&c->q.t, 1, 2, 3, 9, NAN);
        snprintf(t_case_label, sizeof t_case_label, "fp8 contract %d: splits %d page %d", kind, s.kv.num_splits,
                 s.page_size);
        int nan_rows, fin_rows;
        against_cpu(ctx, cpu, &s, c, &nan_rows, &fin_rows); /* the CPU takes the host descales */
        CHECK_MSG(nan_rows > 0 && fin_rows > 0, "%s: %d NaN rows, %d finite", t_case_label, nan_rows, fin_rows);
    }
}

/* An FP8 cache's bad descales and the shapes CUDA does not decode from one: a NaN or zero descale with check_indices
 * is FA_ERR_INVALID_ARGUMENT naming the entry, with the cache and out untouched; without it the call runs and
 * fa_kvcache_check names the entry; v of its own head dim (the pair kernel) is FA_ERR_UNSUPPORTED naming the
 * dtype. */
static void fp8_errors(fa_context *ctx) {
    for (int i = 0; i < 3; i++) {
        t_kv_spec s = t_kv_spec_of(FA_DTYPE_BF16, 2, 1, 8, 2, i == 2 ? 192 : 128, 64, 0);
        if (i == 2) s.dv = 128;
        s.fp8 = 1, s.append = 1;
        t_kv_case *c = t_kv_new(&s, &R);
        snprintf(t_case_label, sizeof t_case_label, "fp8 errors %d", i);
        t_trace_case();
        if (i < 2) c->v_descale[2] = i ? 0.f : NAN; /* [1][0] */
        dev_case d = to_dev(c);
        fa_kv_opts check = fa_kv_opts_default();
        check.check_indices = 1;
        if (i < 2) {
            CHECK_STATUS(call(ctx, c, &d, &check), FA_ERR_INVALID_ARGUMENT);
            CHECK_STR_CONTAINS(fa_context_last_error(ctx), "kv_opts.v_descale[1][0]");
        } else {
            CHECK_STATUS(call(ctx, c, &d, NULL), FA_ERR_UNSUPPORTED);
            CHECK_STR_CONTAINS(fa_context_last_error(ctx), "f8_e4m3");
        }
        void *k = malloc(c->cache_bytes), *o = malloc(c->out.mem_bytes);
        CU(cudaMemcpy(k, d.kc, c->cache_bytes, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(o, d.out, c->out.mem_bytes, cudaMemcpyDeviceToHost));
        CHECK(memcmp(k, c->kc, c->cache_bytes) == 0);
        CHECK(memcmp(o, c->out.mem, c->out.mem_bytes) == 0);
        free(k), free(o);
        if (i < 2) { /* without the check: the fault record names it */
            CHECK_STATUS(call(ctx, c, &d, NULL), FA_OK);
            CHECK_STATUS(fa_kvcache_check(ctx), FA_ERR_INVALID_ARGUMENT);
            CHECK_STR_CONTAINS(fa_context_last_error(ctx), "kv_opts.v_descale[1][0]");
            CHECK_STATUS(fa_kvcache_check(ctx), FA_OK); /* read and cleared */
        }
        free_dev(&d);
        t_kv_free(c);
    }
}

int main(void) {
    t_rng_seed(&R, t_init("test_gpu_kvcache"));
    const int small = getenv("FA_GPU_TEST_SMALL") && atoi(getenv("FA_GPU_TEST_SMALL"));
    fa_context *ctx = NULL;
    if (fa_context_create(&ctx, FA_BACKEND_CUDA, 0) != FA_OK) {
        fprintf(stderr, "test_gpu_kvcache: no CUDA context: %s\n", fa_create_error());
        return 1;
    }
    fa_context *cpu = t_cpu_ctx();
    /* FA_GPU_TEST_ONLY=fp8: the FP8-cache suites and head dims 96 and 80 alone */
    const int only_fp8 = getenv("FA_GPU_TEST_ONLY") && !strcmp(getenv("FA_GPU_TEST_ONLY"), "fp8");
    if (!only_fp8) {
        check_indices(ctx);
        out_of_range(ctx);
        graph_fault(ctx);
        grid(ctx, cpu, small);
        chunks(ctx, cpu, small);
        splits(ctx, cpu, small);
        paths(ctx, cpu, small);
        many_splits(ctx, cpu, small);
        sinks(ctx, cpu, small);
        contract(ctx, cpu);
        graph(ctx, cpu, small);
        merge(ctx);
        vdim(ctx, cpu, small);
        vdim_refusal(ctx);
    }
    fp8(ctx, cpu, small);
    fp8_contract(ctx, cpu);
    fp8_errors(ctx);
    padded_dims(ctx, cpu, small);
    fa_context_destroy(ctx);
    fa_context_destroy(cpu);
    return t_finish();
}
