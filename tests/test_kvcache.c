/* KV-cache decoding on the CPU (fa_forward_kvcache, fa_merge_states) against the float64 oracle: contiguous and
 * paged caches (page sizes 1, 3, 16, 64, 256), ragged lengths with 0 and the capacity, seqlen_new 1, 4, 17, GQA 1,
 * 4, 8 and 32/8, head dims that the vector widths divide in different ways, every mask option, append with and without rotary (both layouts), batch_idx, splits 1..many against
 * no split, the fixed-split mode bitwise invariant under the batch's composition, the merge of partial FLASH2 calls
 * equal to the whole, and bad arguments (nothing written, neither out nor the cache). FA_TEST_RANDOM sets the
 * number of random cases. */
#include "testlib.h"
#include "kvcase.h"

#include "core/kvcache.h" /* the split heuristic, an internal of the static library */

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static t_rng R;

static const char *mask_name(const fa_attn_opts *o) {
    if (o->softcap > 0) return "softcap";
    if (o->window_left >= 0 || o->window_right >= 0) return o->causal ? "causal+window" : "window";
    return o->causal ? "causal" : "none";
}

static void run(fa_context *ctx, const t_kv_spec *s, const char *what) {
    t_kv_case *c = t_kv_new(s, &R);
    snprintf(t_case_label, sizeof t_case_label,
             "%s: %s b%d sq%d hq%d hk%d d%d cap%d page%d append%d rotary%d bidx%d mask %s splits %d/%d", what,
             fa_dtype_name(s->dt), s->batch, s->sq, s->hq, s->hk, s->d, s->capacity, s->page_size, s->append, s->rotary,
             s->batch_idx, mask_name(&s->opts), s->kv.num_splits, s->kv.split_size);
    t_kv_run_cpu(ctx, c);
    t_kv_free(c);
}

/* The grid: every page size x seqlen_new x GQA, the other options drawn. */
static void grid(fa_context *ctx) {
    static const int pages[] = {0, 1, 3, 16, 64, 256}, sqs[] = {1, 4, 17};
    static const int gqa[][2] = {{4, 4}, {4, 1}, {8, 1}, {32, 8}};
    static const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    int n = 0;
    for (int pi = 0; pi < 6; pi++)
        for (int si = 0; si < 3; si++)
            for (int gi = 0; gi < 4; gi++, n++) {
                const int d = (int[]){64, 32, 128, 40}[n % 4];
                t_kv_spec s = t_kv_spec_of(dts[n % 3], 3 + n % 2, sqs[si], gqa[gi][0], gqa[gi][1], d, 200 + 57 * (n % 5),
                                   pages[pi]);
                s.append = n % 3 != 2;
                s.rotary = s.append ? n % 3 : 0;
                s.rot_dim = s.rotary && n % 2 ? d / 2 : 0;
                s.batch_idx = n % 5 == 1;
                t_kv_set_mask(&s, n % 5);
                run(ctx, &s, "grid");
            }
}

/* Head dims that a vector width divides in different ways (the kernels' bf16 lane groups are 16 or 32 elements, PV's
 * pieces 1 to 8 vectors), each dtype, with 1, 2, 3, 4 and 8 query rows per K/V head (the row groups 4, 2, 1). */
static void widths(fa_context *ctx) {
    static const int ds[] = {16, 48, 80, 96, 144, 176, 256}, rows[][2] = {{1, 1}, {2, 1}, {3, 1}, {4, 1}, {4, 2}};
    int n = 0;
    for (int di = 0; di < 7; di++)
        for (int ri = 0; ri < 5; ri++, n++) {
            t_kv_spec s = t_kv_spec_of((fa_dtype)(n % 3), 2, rows[ri][1], 2 * rows[ri][0], 2, ds[di], 150 + 37 * (n % 4),
                               n % 2 ? 16 : 0);
            s.append = n % 3 == 0;
            run(ctx, &s, "widths");
        }
}

/* Every mask option on a paged and a contiguous cache, with and without append. */
static void masks(fa_context *ctx) {
    for (int m = 0; m < 5; m++)
        for (int page = 0; page <= 16; page += 16)
            for (int app = 0; app < 2; app++) {
                t_kv_spec s = t_kv_spec_of(FA_DTYPE_BF16, 4, 4, 8, 2, 64, 333, page);
                s.append = app;
                t_kv_set_mask(&s, m);
                run(ctx, &s, "mask");
            }
}

/* Splits 1..many against no split: each passes the oracle, and they agree with each other. */
/* The split heuristic (fewest splits within `fill` of the best wave; counts that give each split as many key blocks
 * as the count before are skipped, and the best is taken over the counts it considers). */
static void heuristic(void) {
    snprintf(t_case_label, sizeof t_case_label, "split heuristic");
    /* one item on 3 threads over 4 blocks: 3 splits fill the threads but give 2 blocks each, as 2 do */
    CHECK_MSG(fa_kv_split_heuristic(1, 3, 4, 64, 0.85) == 2, "1 item, 3 workers, 4 blocks: %d splits, want 2",
              fa_kv_split_heuristic(1, 3, 4, 64, 0.85));
    CHECK_MSG(fa_kv_split_heuristic(1, 2, 128, 64, 0.85) == 2, "1 item on 2 threads: %d splits, want 2",
              fa_kv_split_heuristic(1, 2, 128, 64, 0.85));
    CHECK_MSG(fa_kv_split_heuristic(4, 4, 128, 64, 0.85) == 1, "items filling the workers: %d splits, want 1",
              fa_kv_split_heuristic(4, 4, 128, 64, 0.85));
    /* 8 items on 264 CTA slots over 512 blocks: 33 splits (one wave) give 16 blocks each, as 32 do */
    CHECK_MSG(fa_kv_split_heuristic(8, 264, 512, 128, 0.97) == 32, "8 items, 264 workers: %d splits, want 32",
              fa_kv_split_heuristic(8, 264, 512, 128, 0.97));
}

static void splits(fa_context *ctx) {
    static const int ns[] = {1, 2, 3, 7, 64, 1024};
    for (int page = 0; page <= 3; page += 3) {
        const int lens[2] = {1500, 777};
        t_kv_spec s = t_kv_spec_of(FA_DTYPE_F32, 2, 2, 4, 1, 64, 1600, page);
        s.lens = lens;
        s.append = 1;
        s.opts.causal = 1;
        t_kv_case *c = t_kv_new(&s, &R);
        const size_t ob = c->out.mem_bytes;
        unsigned char *first = malloc(ob);
        for (int i = 0; i < 6; i++) {
            c->s.kv.num_splits = ns[i];
            snprintf(t_case_label, sizeof t_case_label, "splits %d page %d", ns[i], page);
            t_kv_run_cpu(ctx, c);
            if (i == 0) {
                memcpy(first, c->out.mem, ob);
                continue;
            }
            double diff = 0, ref = 0;
            for (int64_t b = 0; b < 2; b++)
                for (int64_t q = 0; q < 2; q++)
                    for (int64_t h = 0; h < 4; h++)
                        for (int64_t e = 0; e < 64; e++) {
                            const int64_t o = ((b * 2 + q) * 4 + h) * 64 + e;
                            diff = fmax(diff, fabs(((float *)c->out.mem)[o] - ((float *)first)[o]));
                            ref = fmax(ref, fabs(((float *)first)[o]));
                        }
            /* a reordered f32 weighted mean of N(0,1) values: its rounding is a few ulps of max|v| (about 4),
               not of the mean, so the bound is absolute; a wrong merge is off by 1e-2 or more */
            CHECK_MSG(diff <= 4e-6, "splits %d vs none: max diff %.3e (max|out| %.3e)", ns[i], diff, ref);
        }
        free(first);
        t_kv_free(c);
    }
    for (int split_size = 16; split_size <= 4096; split_size *= 16) { /* fixed splits against the oracle */
        t_kv_spec s = t_kv_spec_of(FA_DTYPE_BF16, 3, 1, 8, 8, 128, 1111, split_size == 256 ? 16 : 0);
        s.append = 1;
        s.kv.split_size = split_size;
        run(ctx, &s, "fixed split");
    }
}

/* More K/V heads than the grid's 8: one work item of up to 32 adjacent heads (all 24 of hk 24; hk 64 in two), whose
 * wide key rows the kernel walks in chunks of 16 keys; each dtype, contiguous and paged, split. */
static void many_heads(fa_context *ctx) {
    static const int hks[] = {32, 24, 64};
    for (int n = 0; n < 6; n++) {
        const int hk = hks[n % 3];
        t_kv_spec s = t_kv_spec_of((fa_dtype)(n % 3), 1 + n % 2, 1, hk * (n == 4 ? 2 : 1), hk, n % 2 ? 64 : 128,
                                   300 + 41 * n, n >= 3 ? 16 : 0);
        s.append = n % 2;
        s.kv.num_splits = n % 3 == 1 ? 3 : 0;
        run(ctx, &s, "many heads");
    }
}

/* Fixed-split mode: a sequence's out and LSE are the same bits alone as in any batch. */
static void batch_invariance(fa_context *ctx) {
    for (int page = 0; page <= 16; page += 16) {
        t_kv_spec s = t_kv_spec_of(FA_DTYPE_BF16, 5, 2, 8, 2, 64, 900, page);
        s.batch_idx = 1;
        s.kv.split_size = 128;
        s.opts.causal = 1;
        t_kv_case *c = t_kv_new(&s, &R);
        snprintf(t_case_label, sizeof t_case_label, "batch invariance page %d", page);
        t_kv_run_cpu(ctx, c);
        const int64_t row = 2 * 8 * 64; /* one sequence's out, in elements */
        uint16_t *whole = malloc((size_t)(5 * row) * 2);
        float *whole_lse = malloc(sizeof(float) * 5 * 16);
        memcpy(whole, c->out.t.data, (size_t)(5 * row) * 2);
        memcpy(whole_lse, c->lse, sizeof(float) * 5 * 16);
        fa_kv_opts ko = t_kv_opts(c, NULL, NULL);
        for (int64_t b = 0; b < 5; b++) {
            /* sequence b alone, then b with the one after it */
            for (int with = 1; with <= 2 && b + with <= 5; with++) {
                fa_tensor q = c->q.t, o = c->out.t;
                q.data = (uint16_t *)q.data + b * row, q.batch = with;
                o.data = (uint16_t *)o.data + b * row, o.batch = with;
                fa_kvcache kc = t_kv_cache(c, c->kc, c->vc, c->seqlens + b, c->block_table, c->batch_idx + b);
                float lse[32];
                memset(o.data, 0xff, (size_t)(with * row) * 2);
                CHECK_STATUS(fa_forward_kvcache(ctx, &c->s.opts, &ko, &q, &kc, NULL, NULL, &o, lse), FA_OK);
                CHECK_MSG(!memcmp(o.data, whole + b * row, (size_t)(with * row) * 2) &&
                              !memcmp(lse, whole_lse + b * 16, sizeof(float) * 16 * (size_t)with),
                          "fixed split, page %d: sequence %lld (with %d) differs from the whole batch's", page,
                          (long long)b, with);
            }
        }
        free(whole), free(whole_lse);
        t_kv_free(c);
    }
}

/* fa_merge_states of FLASH2 calls over key chunks equals the FLASH2 call over all keys (and the oracle). */
static void merge(fa_context *ctx) {
    static const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_BF16};
    for (int di = 0; di < 2; di++) {
        const fa_dtype dt = dts[di];
        const int B = 2, Sq = 5, Sk = 300, H = 4, D = 64, n = 3;
        const int cuts[4] = {0, 101, 102, 300}; /* a chunk of one key */
        snprintf(t_case_label, sizeof t_case_label, "merge %s", fa_dtype_name(dt));
        t_buf q = t_buf_new_r(&R, dt, B, Sq, H, D, T_BSHD), k = t_buf_new_r(&R, dt, B, Sk, H, D, T_BSHD);
        t_buf v = t_buf_new_r(&R, dt, B, Sk, H, D, T_BSHD), whole = t_buf_new_r(&R, dt, B, Sq, H, D, T_BSHD);
        t_buf_randn_r(&R, &q, 1), t_buf_randn_r(&R, &k, 1), t_buf_randn_r(&R, &v, 1);
        fa_attn_opts o = fa_attn_opts_default();
        o.algo = FA_ALGO_FLASH2;
        float lw[B * H * Sq], ls[3][B * H * Sq], lm[B * H * Sq];
        CHECK_STATUS(fa_forward(ctx, &o, &q.t, &k.t, &v.t, &whole.t, lw), FA_OK);
        t_buf parts[3];
        fa_tensor pt[3];
        const float *lp[3];
        for (int i = 0; i < n; i++) {
            parts[i] = t_buf_new_r(&R, FA_DTYPE_F32, B, Sq, H, D, T_BSHD); /* partial states kept in fp32 */
            fa_tensor kk = k.t, vv = v.t;
            kk.data = (char *)kk.data + cuts[i] * kk.stride_seq * (int64_t)fa_dtype_size(dt), kk.seqlen = cuts[i + 1] - cuts[i];
            vv.data = (char *)vv.data + cuts[i] * vv.stride_seq * (int64_t)fa_dtype_size(dt), vv.seqlen = cuts[i + 1] - cuts[i];
            if (dt == FA_DTYPE_F32) {
                CHECK_STATUS(fa_forward(ctx, &o, &q.t, &kk, &vv, &parts[i].t, ls[i]), FA_OK);
            } else { /* a bf16 partial, widened exactly */
                t_buf tmp = t_buf_new_r(&R, dt, B, Sq, H, D, T_BSHD);
                CHECK_STATUS(fa_forward(ctx, &o, &q.t, &kk, &vv, &tmp.t, ls[i]), FA_OK);
                for (int64_t b = 0; b < B; b++)
                    for (int64_t s = 0; s < Sq; s++)
                        for (int64_t h = 0; h < H; h++)
                            for (int64_t e = 0; e < D; e++) t_set(&parts[i].t, b, s, h, e, t_get(&tmp.t, b, s, h, e));
                t_buf_free(&tmp);
            }
            pt[i] = parts[i].t;
            lp[i] = ls[i];
        }
        t_buf merged = t_buf_new_r(&R, FA_DTYPE_F32, B, Sq, H, D, T_BSHD);
        CHECK_STATUS(fa_merge_states(ctx, n, pt, lp, &merged.t, lm), FA_OK);
        CHECK_EQ_INT(t_buf_check_written(&merged), 0);
        double *ref = malloc(sizeof(double) * B * Sq * H * D), *rl = malloc(sizeof(double) * B * H * Sq);
        CHECK_STATUS(t_oracle_forward(&o, &q.t, &k.t, &v.t, ref, rl), FA_OK);
        const double refmax = t_max_abs(ref, B * Sq * H * D);
        const double err_m = t_max_diff(&merged.t, ref), err_w = t_max_diff(&whole.t, ref);
        /* the merged fp32 state is at least as close as the whole call rounded to its dtype */
        CHECK_MSG(err_m <= 2 * err_w + t_atol(dt, refmax), "merge %s: err %.3e vs the whole call's %.3e", fa_dtype_name(dt),
                  err_m, err_w);
        CHECK_LE(t_max_diff_f(lm, rl, B * H * Sq), 2 * t_max_diff_f(lw, rl, B * H * Sq) + 1e-5);
        /* in place: out = outs[0], lse = lses[0] */
        CHECK_STATUS(fa_merge_states(ctx, n, pt, lp, &pt[0], ls[0]), FA_OK);
        CHECK_LE(t_max_diff(&pt[0], ref), err_m * 1.0000001 + 1e-7);
        /* a state with lse -inf only (an empty key set) changes nothing; all empty gives 0 / -inf */
        float empty_l[B * H * Sq];
        for (int i = 0; i < B * H * Sq; i++) empty_l[i] = -INFINITY;
        fa_tensor two[2] = {merged.t, parts[1].t};
        const float *two_l[2] = {lm, empty_l};
        t_buf m2 = t_buf_new_r(&R, FA_DTYPE_F32, B, Sq, H, D, T_BSHD);
        float l2[B * H * Sq];
        CHECK_STATUS(fa_merge_states(ctx, 2, two, two_l, &m2.t, l2), FA_OK);
        CHECK(!memcmp(m2.t.data, merged.t.data, sizeof(float) * B * Sq * H * D) && !memcmp(l2, lm, sizeof l2));
        const float *none_l[2] = {empty_l, empty_l};
        CHECK_STATUS(fa_merge_states(ctx, 2, two, none_l, &m2.t, l2), FA_OK);
        int zero = 1;
        for (int i = 0; i < B * Sq * H * D; i++) zero &= ((float *)m2.t.data)[i] == 0;
        for (int i = 0; i < B * H * Sq; i++) zero &= isinf(l2[i]) && l2[i] < 0;
        CHECK(zero);
        t_buf_free(&m2);
        free(ref), free(rl);
        for (int i = 0; i < n; i++) t_buf_free(&parts[i]);
        t_buf_free(&merged), t_buf_free(&q), t_buf_free(&k), t_buf_free(&v), t_buf_free(&whole);
    }
}

/* One bad argument: the status, a message naming it, and nothing written (out poisoned, cache unchanged). */
static void expect_error(fa_context *ctx, t_kv_case *c, fa_kvcache *kc, const fa_kv_opts *ko, const fa_attn_opts *o,
                         int append, fa_status want, const char *needle) {
    void *k0 = malloc(c->cache_bytes), *v0 = malloc(c->v_bytes);
    memcpy(k0, kc->k.data, c->cache_bytes), memcpy(v0, kc->v.data, c->v_bytes);
    t_buf_poison(&c->out);
    fa_status st = fa_forward_kvcache(ctx, o, ko, &c->q.t, kc, append ? &c->kn.t : NULL, append ? &c->vn.t : NULL,
                                      &c->out.t, c->lse);
    CHECK_MSG(st == want, "error case '%s': got %s, want %s (%s)", needle, fa_status_string(st), fa_status_string(want),
              fa_context_last_error(ctx));
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), needle);
    CHECK_MSG(!memcmp(k0, kc->k.data, c->cache_bytes) && !memcmp(v0, kc->v.data, c->v_bytes),
              "error case '%s': the cache was written", needle);
    int64_t written = 0;
    for (size_t i = 0; i < c->out.mem_bytes / 2; i++) written += ((uint16_t *)c->out.mem)[i] != 0x7fc0;
    CHECK_MSG(written == 0, "error case '%s': out was written", needle);
    free(k0), free(v0);
}

static void errors(fa_context *ctx) {
    for (int page = 0; page <= 8; page += 8) {
        t_kv_spec s = t_kv_spec_of(FA_DTYPE_BF16, 3, 2, 4, 2, 32, 64, page);
        s.append = 1;
        s.batch_idx = 1;
        t_kv_case *c = t_kv_new(&s, &R);
        snprintf(t_case_label, sizeof t_case_label, "errors page %d", page);
        void *k = malloc(c->cache_bytes), *v = malloc(c->v_bytes);
        memcpy(k, c->kc, c->cache_bytes), memcpy(v, c->vc, c->v_bytes);
        int32_t lens[3], bidx[3], *bt = NULL;
        memcpy(lens, c->seqlens, sizeof lens), memcpy(bidx, c->batch_idx, sizeof bidx);
        if (page) {
            bt = malloc(sizeof(int32_t) * (size_t)(c->rows * c->max_pages));
            memcpy(bt, c->block_table, sizeof(int32_t) * (size_t)(c->rows * c->max_pages));
        }
        fa_kvcache kc = t_kv_cache(c, k, v, lens, bt, bidx);
        fa_kv_opts ko = fa_kv_opts_default();
        fa_attn_opts o = fa_attn_opts_default();
        lens[1] = -1;
        expect_error(ctx, c, &kc, &ko, &o, 1, FA_ERR_INVALID_ARGUMENT, "cache.seqlens[1]");
        lens[1] = 63; /* 63 + 2 new > 64 */
        expect_error(ctx, c, &kc, &ko, &o, 1, FA_ERR_INVALID_ARGUMENT, "cache.seqlens[1]");
        lens[1] = c->seqlens[1];
        bidx[2] = 5;
        expect_error(ctx, c, &kc, &ko, &o, 1, FA_ERR_INVALID_ARGUMENT, "cache.batch_idx[2]");
        bidx[2] = -1;
        expect_error(ctx, c, &kc, &ko, &o, 1, FA_ERR_INVALID_ARGUMENT, "cache.batch_idx[2]");
        bidx[2] = c->batch_idx[2];
        if (page) {
            const int64_t r0 = c->batch_idx[0];
            const int32_t keep = bt[r0 * c->max_pages];
            bt[r0 * c->max_pages] = (int32_t)c->num_pages;
            expect_error(ctx, c, &kc, &ko, &o, 1, FA_ERR_INVALID_ARGUMENT, "cache.block_table[");
            bt[r0 * c->max_pages] = keep;
        }
        ko.num_splits = 2, ko.split_size = 16;
        expect_error(ctx, c, &kc, &ko, &o, 1, FA_ERR_INVALID_ARGUMENT, "kv_opts.split_size");
        ko = fa_kv_opts_default();
        float tab[64];
        for (int i = 0; i < 64; i++) tab[i] = 0;
        ko.rotary_cos = ko.rotary_sin = tab, ko.rotary_dim = 32, ko.rotary_seqlen = 1;
        expect_error(ctx, c, &kc, &ko, &o, 0, FA_ERR_INVALID_ARGUMENT, "kv_opts.rotary_cos");
        expect_error(ctx, c, &kc, &ko, &o, 1, FA_ERR_INVALID_ARGUMENT, "kv_opts.rotary_seqlen");
        ko.rotary_dim = 3;
        expect_error(ctx, c, &kc, &ko, &o, 1, FA_ERR_INVALID_ARGUMENT, "kv_opts.rotary_dim");
        ko = fa_kv_opts_default();
        static _Alignas(256) unsigned char small_ws[256];
        ko.workspace = small_ws, ko.workspace_bytes = sizeof small_ws;
        expect_error(ctx, c, &kc, &ko, &o, 1, FA_ERR_INVALID_ARGUMENT, "kv_opts.workspace_bytes");
        ko = fa_kv_opts_default();
        o.algo = FA_ALGO_FLASH1;
        expect_error(ctx, c, &kc, &ko, &o, 1, FA_ERR_INVALID_ARGUMENT, "opts.algo");
        o = fa_attn_opts_default();
        o.max_seqlen_q = 3;
        expect_error(ctx, c, &kc, &ko, &o, 1, FA_ERR_INVALID_ARGUMENT, "max_seqlen_q");
        o = fa_attn_opts_default();
        kc.seqlens = NULL;
        expect_error(ctx, c, &kc, &ko, &o, 1, FA_ERR_INVALID_ARGUMENT, "cache.seqlens");
        kc.seqlens = lens;
        /* shape mismatches name the argument, the field and the argument it must match (smaller views: in bounds) */
        c->kn.t.heads -= 1;
        expect_error(ctx, c, &kc, &ko, &o, 1, FA_ERR_INVALID_ARGUMENT,
                     "k_new: heads = 1 does not match cache.k.heads = 2");
        c->kn.t.heads += 1, c->vn.t.seqlen -= 1;
        expect_error(ctx, c, &kc, &ko, &o, 1, FA_ERR_INVALID_ARGUMENT,
                     "v_new: seqlen = 1 does not match k_new.seqlen = 2");
        c->vn.t.seqlen += 1;
        fa_kvcache bad = kc;
        bad.v.heads = 1;
        expect_error(ctx, c, &bad, &ko, &o, 1, FA_ERR_INVALID_ARGUMENT, "cache.v");
        /* workspace query and a caller workspace */
        size_t need = 0;
        CHECK_STATUS(fa_kvcache_workspace_size(ctx, &o, &ko, &c->q.t, &kc, &c->kn.t, &need), FA_OK);
        CHECK(need > 0);
        void *ws = NULL;
        CHECK(posix_memalign(&ws, 256, need) == 0);
        ko.workspace = ws, ko.workspace_bytes = need;
        t_buf_poison(&c->out);
        CHECK_STATUS(fa_forward_kvcache(ctx, &o, &ko, &c->q.t, &kc, &c->kn.t, &c->vn.t, &c->out.t, c->lse), FA_OK);
        fa_stats st;
        CHECK_STATUS(fa_last_stats(ctx, &st), FA_OK);
        CHECK_STR_CONTAINS(st.kernel, "cpu.kvcache.");
        t_check_cpu_level(st.kernel);
        CHECK(st.slow_read_bytes > 0 && st.flops > 0);
        CHECK_EQ_INT(t_buf_check_written(&c->out), 0);
        CHECK(t_kv_verify(c, &c->out, c->lse, k, v, ctx, 0) == 0);
        free(ws);
        free(k), free(v), free(bt);
        t_kv_free(c);
    }
}

/* flash-attn's test_flash_attn_kvcache_paged_block_table_bounds: a block table of one column of 16..256 keys with
 * a length one past its capacity, or a full cache plus an appended key, is an error naming the length (the CPU
 * checks every index before it runs: nothing written); fa_kvcache_check has nothing to report on the CPU. */
static void block_table_bounds(fa_context *ctx) {
    static const int pages[] = {16, 64, 256};
    for (int pi = 0; pi < 3; pi++)
        for (int full = 0; full < 2; full++) {
            const int page = pages[pi];
            t_kv_spec s = t_kv_spec_of(FA_DTYPE_BF16, 2, 1, 4, 2, 32, page, page); /* one page per sequence: max_pages 1 */
            s.append = full;
            t_kv_case *c = t_kv_new(&s, &R);
            snprintf(t_case_label, sizeof t_case_label, "block-table bounds: page %d, %s", page,
                     full ? "a full cache plus one new key" : "a length one past the capacity");
            CHECK_EQ_INT(c->max_pages, 1);
            int32_t lens[2] = {c->seqlens[0], page + !full};
            fa_kvcache kc = t_kv_cache(c, c->kc, c->vc, lens, c->block_table, c->batch_idx);
            fa_kv_opts ko = fa_kv_opts_default();
            fa_attn_opts o = fa_attn_opts_default();
            expect_error(ctx, c, &kc, &ko, &o, full, FA_ERR_INVALID_ARGUMENT, "cache.seqlens[1]");
            CHECK_STATUS(fa_kvcache_check(ctx), FA_OK);
            t_kv_free(c);
        }
    CHECK_STATUS(fa_kvcache_check(NULL), FA_ERR_INVALID_ARGUMENT);
}

/* The numerics contract: NaN in one cached key makes exactly the rows of its K/V head NaN; finite elsewhere. */
static void nonfinite(fa_context *ctx) {
    t_kv_spec s = t_kv_spec_of(FA_DTYPE_F32, 1, 1, 4, 2, 32, 100, 0);
    const int lens[1] = {90};
    s.lens = lens;
    t_kv_case *c = t_kv_new(&s, &R);
    ((float *)c->kc)[(40 * 2 + 1) * 32 + 5] = t_nanf(); /* key 40, K/V head 1 */
    snprintf(t_case_label, sizeof t_case_label, "nonfinite");
    fa_kvcache kc = t_kv_cache(c, c->kc, c->vc, c->seqlens, NULL, NULL);
    CHECK_STATUS(fa_forward_kvcache(ctx, NULL, NULL, &c->q.t, &kc, NULL, NULL, &c->out.t, c->lse), FA_OK);
    for (int h = 0; h < 4; h++) {
        const float *o = (const float *)c->out.t.data + h * 32;
        CHECK_MSG(h >= 2 ? isnan(o[0]) && isnan(c->lse[h]) : isfinite(o[0]) && isfinite(c->lse[h]),
                  "head %d: out %g lse %g", h, o[0], c->lse[h]);
    }
    t_kv_free(c);
}

/* The numerics contract for finite inputs that overflow the fp32 loop: q·k beyond FLT_MAX (values ~1e37), and
 * scale/softcap beyond FLT_MAX (scale 1e30 with softcap 1e-30; scale FLT_MAX with softcap 0.5). Every output and
 * LSE is finite (logits saturate); paged, GQA, splits. */
static void extremes(fa_context *ctx) {
    static const float scales[3][2] = {{0, 0}, {1e30f, 1e-30f}, {FLT_MAX, 0.5f}};
    for (int x = 0; x < 3; x++) {
        t_kv_spec s = t_kv_spec_of(FA_DTYPE_F32, 2, 3, 4, 2, 32, 100, 16);
        s.append = 1, s.opts.causal = 1, s.kv.num_splits = 3;
        s.opts.scale = scales[x][0], s.opts.softcap = scales[x][1];
        t_kv_case *c = t_kv_new(&s, &R);
        if (x == 0) {
            float *bufs[4] = {(float *)c->q.t.data, (float *)c->kc, (float *)c->kn.t.data, (float *)c->vc};
            const size_t n[4] = {(size_t)(2 * 3 * 4 * 32), c->cache_bytes / 4, (size_t)(2 * 3 * 2 * 32), c->v_bytes / 4};
            for (int b = 0; b < 4; b++)
                for (size_t i = 0; i < n[b]; i++) bufs[b][i] *= 1e37f;
        }
        snprintf(t_case_label, sizeof t_case_label, "extremes %d: scale %g softcap %g", x, s.opts.scale, s.opts.softcap);
        fa_kvcache kc = t_kv_cache(c, c->kc, c->vc, c->seqlens, c->block_table, NULL);
        const fa_kv_opts ko = t_kv_opts(c, NULL, NULL);
        CHECK_STATUS(fa_forward_kvcache(ctx, &s.opts, &ko, &c->q.t, &kc, &c->kn.t, &c->vn.t, &c->out.t, c->lse), FA_OK);
        int bad = 0;
        for (int64_t i = 0; i < 2 * 3 * 4; i++) {
            bad += !isfinite(c->lse[i]);
            for (int e = 0; e < 32; e++) bad += !isfinite(((const float *)c->out.t.data)[i * 32 + e]);
        }
        CHECK_MSG(bad == 0, "%d non-finite values in out/lse", bad);
        t_kv_free(c);
    }
}

static void randoms(fa_context *ctx) {
    const char *env = getenv("FA_TEST_RANDOM");
    const int n = env && *env ? atoi(env) : 24;
    for (int i = 0; i < n; i++) {
        const t_kv_spec s = t_kv_spec_random(&R, NULL);
        run(ctx, &s, "random");
    }
}

int main(void) {
    t_rng_seed(&R, t_init("test_kvcache"));
    heuristic();
    fa_context *ctx = t_cpu_ctx();
    errors(ctx);
    block_table_bounds(ctx);
    nonfinite(ctx);
    extremes(ctx);
    grid(ctx);
    widths(ctx);
    masks(ctx);
    splits(ctx);
    many_heads(ctx);
    batch_invariance(ctx);
    merge(ctx);
    randoms(ctx);
    fa_context_destroy(ctx);
    return t_finish();
}
