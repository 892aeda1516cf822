/* KV-cache test cases for fa_forward_kvcache (tests/test_kvcache.c, tests/gpu/test_gpu_kvcache.c): a random cache,
 * contiguous or paged (pages shuffled, unused block-table entries -1, every key past a sequence's length NaN so a
 * read of it shows), and the checks of one call — out and LSE against the float64 oracle on each sequence's
 * gathered keys, every out element written, the cache byte-identical outside the appended rows, the appended rows
 * equal to k_new / v_new (rotated by a plain float64 rotary; an FP8 cache's quantised with its descales: the oracle
 * decodes it with them). */
#ifndef FA_TESTLIB_KVCASE_H
#define FA_TESTLIB_KVCASE_H

#include "flashattn.h"
#include "rng.h"
#include "tensor.h"

typedef struct t_kv_spec {
    fa_dtype dt;
    int batch, sq, hq, hk, d; /* d: q's and the cache's k head_dim */
    int dv;              /* the cache's v (v_new's, out's) head_dim; 0 = d (MLA decoding: 576 / 512) */
    int capacity;        /* keys per sequence */
    int page_size;       /* 0 = contiguous */
    int append;          /* 1: k_new / v_new */
    int rotary;          /* 0 off, 1 half-split, 2 interleaved (needs append) */
    int rot_dim;         /* 0 = d */
    int batch_idx;       /* 1: sequences reach their rows through a shuffled batch_idx over batch + 2 rows */
    int fp8;             /* 1: the cache is FA_DTYPE_F8_E4M3 with random kv.k_descale / v_descale (case's) */
    const int *lens;     /* lengths before the append, or NULL = random in 0..capacity - append·sq, both ends drawn */
    fa_attn_opts opts;
    fa_kv_opts kv;
} t_kv_spec;

typedef struct t_kv_case {
    t_kv_spec s;
    int32_t *seqlens, *block_table, *batch_idx; /* host */
    int64_t rows, max_pages, num_pages;
    size_t cache_bytes, v_bytes;                /* of k, of v */
    void *kc, *vc;                              /* host cache, as before the call */
    fa_tensor kct, vct;                         /* views of kc, vc */
    t_buf q, kn, vn, out;
    float *cos, *sin, *lse;                     /* rotary tables [capacity + 8, rot_dim / 2], lse [b, hq, sq] */
    float *k_descale, *v_descale;               /* fp8: [batch][hk] (host), else NULL */
    int64_t rot_len;
} t_kv_case;

/* A spec with these sizes, default options, contiguous (page 0) or paged, nothing else set. */
t_kv_spec t_kv_spec_of(fa_dtype dt, int batch, int sq, int hq, int hk, int d, int cap, int page);
/* Mask m of the suites: 0 none, 1 causal, 2 window (37, 2), 3 causal + window 50, 4 causal + softcap 3.5. */
void t_kv_set_mask(t_kv_spec *s, int m);
/* A random spec of the suites' random cases: dtype, sizes, page size, append, rotary, batch_idx, mask and splits
 * drawn; with sinks (non-NULL, hq entries or more) a quarter of them use it. */
t_kv_spec t_kv_spec_random(t_rng *r, const float *sinks);
t_kv_case *t_kv_new(const t_kv_spec *spec, t_rng *r);
void t_kv_free(t_kv_case *c);
/* Element offset of key t, K/V head h of sequence b in the case's k cache (kc), and in its v cache (vc). */
int64_t t_kv_key_off(const t_kv_case *c, int64_t b, int64_t h, int64_t t);
int64_t t_kv_val_off(const t_kv_case *c, int64_t b, int64_t h, int64_t t);
/* The cache descriptor over the given k/v data and index arrays (host or device copies of the case's). */
fa_kvcache t_kv_cache(const t_kv_case *c, void *k, void *v, const int32_t *seqlens, const int32_t *block_table,
                      const int32_t *batch_idx);
/* The case's kv_opts with its rotary tables (host or device copies); an FP8 case's descales (host). */
fa_kv_opts t_kv_opts(const t_kv_case *c, const float *cos, const float *sin);
/* The cache's dtype: the case's, or E4M3. */
fa_dtype t_kv_cache_dtype(const t_kv_case *c);
/* Checks of one call's results: out (its poisoned view, written), lse, and the cache after the call (k, v host
 * copies). std_ctx: a CPU context for the same-dtype STANDARD baseline of the pass rule (NULL: the ceiling only).
 * relax as t_ceiling. Returns the number of failures. */
int t_kv_verify(const t_kv_case *c, const t_buf *out, const float *lse, const void *k_after, const void *v_after,
                fa_context *std_ctx, double relax);
/* Run the case on a CPU context and verify it. */
int t_kv_run_cpu(fa_context *ctx, const t_kv_case *c);

#endif
