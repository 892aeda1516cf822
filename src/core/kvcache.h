/* What the backends' KV-cache paths (src/cpu/algo/kvcache.c, src/cuda/kvcache/) share with the entry file above them
 * (kvcache.c): the validated fa_kv_problem, the plan's aux slots, and the helpers below both (the split heuristic,
 * kv_split.c; the index checks, kv_indices.c). Backends receive a validated problem, plan it and run it.
 * docs/kvcache.md describes the whole path. */
#ifndef FA_CORE_KVCACHE_H
#define FA_CORE_KVCACHE_H

#ifdef __cplusplus
extern "C" {
#endif
#include "core/internal.h"

/* A validated fa_forward_kvcache call. */
typedef struct fa_kv_problem {
    fa_dtype dtype;            /* q's, out's, k_new's and v_new's */
    fa_dtype cdtype;           /* the cache's k and v: dtype, or FA_DTYPE_F8_E4M3 */
    const float *k_descale, *v_descale; /* FP8 cache: fp32 [batch][hk] on the call's device, or NULL = 1 */
    int64_t batch, sq;         /* sequences, query rows per sequence (S; varlen: the longest) */
    int64_t sn;                /* new key rows per sequence (N; varlen: the longest; 0 without append) */
    const int32_t *cu_q, *cu_new; /* varlen queries / new keys: [batch + 1] offsets into the packed q / k_new (host) */
    const int32_t *leftpad;    /* kv_opts.cache_leftpad [batch] or NULL (host) */
    int64_t hq, hk, d;         /* d: the head_dim of q, the cache's k and k_new (dqk) */
    int64_t d_v;               /* the head_dim of the cache's v, v_new and out (dv) */
    float scale, softcap;      /* scale resolved (never 0); softcap 0 = off */
    int wl, wr;                /* window, -1 = unbounded; causal folded in as wr = 0 */
    int chunk;                 /* attention_chunk, 0 = off (core/visible.h) */
    fa_tensor q, o;            /* q, out */
    fa_tensor kc, vc;          /* the cache tensors (contiguous rows or pages) */
    int paged;
    int64_t page_size;         /* paged: kc.seqlen; contiguous: the capacity */
    int64_t num_pages;         /* paged: kc.batch */
    int64_t capacity;          /* keys per sequence the cache can hold */
    int64_t cache_rows;        /* contiguous: kc.batch; paged: block-table rows */
    const int32_t *seqlens, *block_table, *batch_idx; /* host (CPU) or device (CUDA) */
    int64_t bt_stride;
    const fa_tensor *k_new, *v_new; /* NULL = no append */
    fa_tensor kn, vn;          /* copies when appending */
    int append;
    const float *rot_cos, *rot_sin; /* NULL = no rotary */
    int64_t rot_seqlen;
    int rot_dim, rot_interleaved;
    int num_splits, split_size;/* as given (0 = heuristic / off) */
    float *lse;                /* may be NULL */
    const float *sinks;        /* fp32 [hq] on the call's device, or NULL (core/sink.h): joined once per row */
    void *workspace;           /* caller's, or NULL */
    size_t workspace_bytes;
    int check_indices;
} fa_kv_problem;

/* Whether query row i rotates at its own position seqlens[b] + i (1) or every row at seqlens[b] (0). flash-attn
 * (mha_fwd_kvcache) rotates q row by row only in a causal or local call — a window of the cache's capacity or more
 * counts as none, as there — and otherwise every query row at seqlens[b]: the rows see the same keys, so one position
 * serves them all. Its k rows always rotate at seqlens[b] + i. docs/kvcache.md ("Rotary"). */
static inline int fa_kv_rotary_q_rows(const fa_kv_problem *p) {
    return (p->wl >= 0 && p->wl < p->capacity) || (p->wr >= 0 && p->wr < p->capacity) ||
           (p->chunk > 0 && p->chunk < p->capacity);
}
/* The rotary position of query row i of a sequence of len keys before the append. */
static inline int64_t fa_kv_rotary_q_pos(const fa_kv_problem *p, int64_t len, int64_t i) {
    return fa_kv_rotary_q_rows(p) ? len + i : len;
}

/* Per sequence (host arrays only): query rows, new key rows, the first key (leftpad), and the element offset of query
 * row 0 of head h in q / out, of new row 0 of K/V head h in k_new / v_new. */
static inline int64_t fa_kv_sq(const fa_kv_problem *p, int64_t b) {
    return p->cu_q ? (int64_t)p->cu_q[b + 1] - p->cu_q[b] : p->sq;
}
static inline int64_t fa_kv_sn(const fa_kv_problem *p, int64_t b) {
    if (!p->append) return 0;
    return p->cu_new ? (int64_t)p->cu_new[b + 1] - p->cu_new[b] : p->sn;
}
static inline int64_t fa_kv_lp(const fa_kv_problem *p, int64_t b) { return p->leftpad ? p->leftpad[b] : 0; }
static inline int64_t fa_kv_qrow0(const fa_kv_problem *p, const fa_tensor *t, int64_t b, int64_t h) {
    return (p->cu_q ? (int64_t)p->cu_q[b] * t->stride_seq : b * t->stride_batch) + h * t->stride_head;
}
static inline int64_t fa_kv_nrow0(const fa_kv_problem *p, const fa_tensor *t, int64_t b, int64_t h) {
    return (p->cu_new ? (int64_t)p->cu_new[b] * t->stride_seq : b * t->stride_batch) + h * t->stride_head;
}
/* Index of LSE[b, h, 0] (the row of (b, h) is contiguous): [batch, hq, S], or [1, hq, total_q] for varlen queries. */
static inline int64_t fa_kv_lse0(const fa_kv_problem *p, int64_t b, int64_t h) {
    return p->cu_q ? h * p->q.seqlen + p->cu_q[b] : (b * p->hq + h) * p->sq;
}
/* Keys [*lo, *hi) (cache positions) that query row i of sequence b sees among its L keys after the append: the mask
 * over the keys from leftpad on (core/visible.h). */
static inline void fa_kv_visible(const fa_kv_problem *p, int64_t b, int64_t i, int64_t L, int64_t *lo, int64_t *hi) {
    const int64_t lp = fa_kv_lp(p, b);
    fa_visible_keys(i, fa_kv_sq(p, b), L - lp, p->wl, p->wr, p->chunk, lo, hi);
    *lo += lp, *hi += lp;
}

/* The descale of sequence b, K/V head h (1 without one). Host arrays only. */
static inline float fa_kv_descale(const fa_kv_problem *p, const float *ds, int64_t b, int64_t h) {
    return ds ? ds[b * p->hk + h] : 1.0f;
}

/* Cache row of sequence b (batch_idx or b). Host arrays only. */
static inline int64_t fa_kv_row(const fa_kv_problem *p, int64_t b) { return p->batch_idx ? p->batch_idx[b] : b; }

/* The split count: with `items` independent work items (sequence x K/V head) on `workers` SMs or threads, each
 * over `blocks` key blocks, the fewest splits (<= max_splits) whose waves of items x splits fill the workers within
 * `fill` of the best efficiency (counts that give each split as many blocks as the count before are skipped); 1 when
 * the items alone fill 80 % of the workers. Each backend passes its own fill. docs/kvcache.md. */
int fa_kv_split_heuristic(int64_t items, int workers, int64_t blocks, int max_splits, double fill);

/* The cache validation of the CPU, on host copies of the index arrays (CUDA's check_indices uses it too). */
fa_status fa_kv_check_indices(fa_context *ctx, const fa_kv_problem *p, const int32_t *seqlens,
                              const int32_t *block_table, const int32_t *batch_idx);

/* A validated fa_merge_states call. */
typedef struct fa_merge_problem {
    int n;
    const fa_tensor *outs;
    const float *const *lses;
    fa_tensor o;
    float *lse;
} fa_merge_problem;

/* ---- Backends ----
 * kv_plan fills plan (kernel name, the choices below in aux[], workspace, modelled traffic); kv_run executes it.
 * merge runs fa_merge_states. Entries from 3 on are a backend's own (the CPU keeps its heads per work item in
 * aux[3]). */
enum {
    FA_KV_AUX_SPLITS = 0,  /* splits of the grid */
    FA_KV_AUX_CHUNK = 1,   /* keys per split in the fixed-split mode */
    FA_KV_AUX_FIXED = 2,   /* the fixed-split mode (split_size) */
    FA_KV_AUX_CLUSTER = 3, /* CUDA: the splits of a row tile merge in a thread-block cluster */
    FA_KV_AUX_PLAIN = 4,   /* CUDA: the kernel instance without rotary q, softcap and tiles that span pages */
    FA_KV_AUX_PAIR = 5     /* CUDA: entry is a row of the pair kernel's table (dv != d), not of the d kernel's */
};

fa_status fa_cpu_kv_plan(const fa_context *ctx, const fa_kv_problem *p, fa_plan *plan, char *why, size_t why_len);
fa_status fa_cpu_kv_run(fa_context *ctx, const fa_kv_problem *p, const fa_plan *plan, fa_stats *st);
fa_status fa_cpu_merge(fa_context *ctx, const fa_merge_problem *m);

fa_status fa_cuda_kv_plan(const fa_context *ctx, const fa_kv_problem *p, fa_plan *plan, char *why, size_t why_len);
fa_status fa_cuda_kv_run(fa_context *ctx, const fa_kv_problem *p, const fa_plan *plan, fa_stats *st);
fa_status fa_cuda_merge(fa_context *ctx, const fa_merge_problem *m);
/* fa_kvcache_check on a CUDA context: the device's fault record read (after the stream drains) and cleared. */
fa_status fa_cuda_kv_check(fa_context *ctx);

#ifdef __cplusplus
}
#endif
#endif
