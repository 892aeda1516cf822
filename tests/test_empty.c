/* Zero extents are valid calls (docs/api.md, "Empty calls"): batch 0, seqlen_q 0, seqlen_k 0, packed batches
 * without keys or without sequences; KV-cache calls without sequences, without new rows, over a cache of no keys or
 * no pages; merges of no rows. Each writes exactly the outputs it defines — out = 0 and LSE = -inf for query rows
 * without keys, zero gradients — and nothing else, and a tensor of zero elements may have a NULL data pointer (as
 * PyTorch gives it). Built twice from this file: for the CPU (ctest) and, with FA_TEST_CUDA, for CUDA
 * (tests/gpu/CMakeLists.txt, run by `make test-gpu`). */
#include "testlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend_mem.h"

#ifdef FA_TEST_CUDA
#define NAME "test_gpu_empty"
#else
#define NAME "test_empty"
#endif

enum { HQ = 4, HK = 2, D = 64, PAD = 8 }; /* D: a head dim every CUDA path builds */

/* A [b, s, h, D] view with PAD elements after every row (so writes outside the view show), in memory of the backend
 * filled with 0xFF bytes (NaN in every dtype); zero elements: no memory, a NULL data pointer. */
typedef struct view {
    fa_tensor t;
    size_t bytes;
    unsigned char *host; /* the expected or fetched contents */
} view;

static view mk(fa_dtype dt, int64_t b, int64_t s, int64_t h) {
    view v;
    const int64_t ss = h * (D + PAD);
    v.t = (fa_tensor){NULL, dt, b, s, h, D, s * ss, ss, D + PAD};
    v.bytes = (size_t)(b * s * ss) * fa_dtype_size(dt);
    v.host = malloc(v.bytes ? v.bytes : 1);
    memset(v.host, 0xFF, v.bytes);
    v.t.data = dev_alloc(v.bytes);
    put(v.t.data, v.host, v.bytes);
    return v;
}
static void rm(view *v) { dev_free(v->t.data), free(v->host); }

/* An input: random-ish bytes (finite values), kept on the host to compare with afterwards. */
static view mk_in(fa_dtype dt, int64_t b, int64_t s, int64_t h) {
    view v = mk(dt, b, s, h);
    for (size_t i = 0; i < v.bytes; i++) v.host[i] = (unsigned char)(i * 7 % 61);
    put(v.t.data, v.host, v.bytes);
    return v;
}

/* Every element of the view zero, every padding byte still 0xFF. */
static void check_zero(const view *v, const char *name) {
    unsigned char *m = malloc(v->bytes ? v->bytes : 1);
    get(m, v->t.data, v->bytes);
    const size_t es = fa_dtype_size(v->t.dtype);
    int64_t bad = 0;
    for (size_t e = 0; e < v->bytes / es; e++) {
        const int in_view = (int64_t)(e % (size_t)(D + PAD)) < D;
        for (size_t k = 0; k < es; k++) bad += m[e * es + k] != (in_view ? 0 : 0xFF);
    }
    CHECK_MSG(bad == 0, "%s: %lld bytes differ from zeros in the view and 0xFF around it", name, (long long)bad);
    free(m);
}
/* Unchanged since mk/mk_in. */
static void check_same(const view *v, const char *name) {
    unsigned char *m = malloc(v->bytes ? v->bytes : 1);
    get(m, v->t.data, v->bytes);
    CHECK_MSG(memcmp(m, v->host, v->bytes) == 0, "%s changed", name);
    free(m);
}

/* n floats of the backend's memory (NULL for n = 0), each -0.0 bits flipped to a poison value first. */
static float *mk_f32(int64_t n) {
    float *d = dev_alloc((size_t)n * sizeof(float));
    float *h = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) h[i] = 12345.f;
    put(d, h, (size_t)n * sizeof(float));
    free(h);
    return d;
}
static void check_ninf(const float *d, int64_t n, const char *name) {
    float *h = malloc((size_t)(n ? n : 1) * sizeof(float));
    get(h, d, (size_t)n * sizeof(float));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += !(isinf(h[i]) && h[i] < 0);
    CHECK_MSG(bad == 0, "%s: %lld of %lld entries are not -inf", name, (long long)bad, (long long)n);
    free(h);
}
static int32_t *mk_i32(const int32_t *h, int64_t n) {
    int32_t *d = dev_alloc((size_t)n * sizeof(int32_t));
    put(d, h, (size_t)n * sizeof(int32_t));
    return d;
}

static void check_stats(fa_context *ctx) {
    fa_stats s;
    CHECK_STATUS(fa_last_stats(ctx, &s), FA_OK);
    CHECK_STR_CONTAINS(s.kernel, "zero_fill");
    CHECK(s.flops == 0);
}

static const fa_algo algos[] = {FA_ALGO_AUTO, FA_ALGO_STANDARD, FA_ALGO_FLASH1, FA_ALGO_FLASH2};
static const fa_dtype dtypes[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};

/* fa_forward and fa_backward with (batch, sq, sk) extents, one of them 0; varlen: cu_seqlens of n_seqs (given here
 * on the host, passed in the backend's memory with the longest lengths as max_seqlen_q/k, as a CUDA call needs). */
static void attention(fa_context *ctx, fa_dtype dt, fa_algo algo, int64_t b, int64_t sq, int64_t sk,
                      const int32_t *cu_q, const int32_t *cu_k, int64_t n_seqs) {
    snprintf(t_case_label, sizeof t_case_label, "attention %s %s b%lld sq%lld sk%lld%s", fa_dtype_name(dt),
             fa_algo_name(algo), (long long)b, (long long)sq, (long long)sk, cu_q ? " varlen" : "");
    fa_attn_opts o = fa_attn_opts_default();
    o.algo = algo;
    o.causal = sq == 3; /* a mask changes nothing without keys */
    int32_t *cu = NULL;
    if (cu_q) {
        const size_t n = (size_t)n_seqs + 1;
        cu = dev_alloc(2 * n * sizeof(int32_t));
        put(cu, cu_q, n * sizeof(int32_t)), put(cu + n, cu_k, n * sizeof(int32_t));
        o.cu_seqlens_q = cu, o.cu_seqlens_k = cu + n, o.n_seqs = n_seqs;
        for (size_t i = 0; i + 1 < n; i++) {
            if (cu_q[i + 1] - cu_q[i] > o.max_seqlen_q) o.max_seqlen_q = cu_q[i + 1] - cu_q[i];
            if (cu_k[i + 1] - cu_k[i] > o.max_seqlen_k) o.max_seqlen_k = cu_k[i + 1] - cu_k[i];
        }
    }
    view q = mk_in(dt, b, sq, HQ), k = mk_in(dt, b, sk, HK), v = mk_in(dt, b, sk, HK), out = mk(dt, b, sq, HQ);
    const int64_t nl = b * HQ * sq;
    float *lse = mk_f32(nl);
    CHECK_STATUS(fa_forward(ctx, &o, &q.t, &k.t, &v.t, &out.t, lse), FA_OK);
    if (!fa_context_last_error(ctx)[0]) check_stats(ctx);
    check_zero(&out, "out");
    check_ninf(lse, nl, "lse");
    check_same(&q, "q"), check_same(&k, "k"), check_same(&v, "v");
    /* backward: zero gradients; lse may be NULL when it has no element */
    view dout = mk_in(dt, b, sq, HQ), dq = mk(dt, b, sq, HQ), dk = mk(dt, b, sk, HK), dv = mk(dt, b, sk, HK);
    CHECK_STATUS(fa_backward(ctx, &o, &q.t, &k.t, &v.t, &out.t, nl ? lse : NULL, &dout.t, &dq.t, &dk.t, &dv.t), FA_OK);
    if (!fa_context_last_error(ctx)[0]) check_stats(ctx);
    check_zero(&dq, "dq"), check_zero(&dk, "dk"), check_zero(&dv, "dv");
    check_same(&q, "q"), check_same(&k, "k"), check_same(&v, "v"), check_same(&dout, "dout");
    rm(&q), rm(&k), rm(&v), rm(&out), rm(&dout), rm(&dq), rm(&dk), rm(&dv);
    dev_free(lse);
    dev_free(cu);
}

static void attention_all(fa_context *ctx) {
    static const int32_t none[3] = {0, 0, 0}, q3[3] = {0, 2, 3}, k5[3] = {0, 4, 5};
    for (int di = 0; di < 3; di++)
        for (int ai = 0; ai < 4; ai++) {
            const fa_dtype dt = dtypes[di];
            const fa_algo a = algos[ai];
            attention(ctx, dt, a, 0, 3, 5, NULL, NULL, 0);  /* no sequence */
            attention(ctx, dt, a, 2, 0, 5, NULL, NULL, 0);  /* no query row: dk = dv = 0 */
            attention(ctx, dt, a, 2, 3, 0, NULL, NULL, 0);  /* no key: out = 0, lse = -inf, dq = 0 */
            attention(ctx, dt, a, 0, 0, 0, NULL, NULL, 0);
            attention(ctx, dt, a, 1, 3, 0, q3, none, 2);    /* packed: every key sequence empty (total_k = 0) */
            attention(ctx, dt, a, 1, 0, 5, none, k5, 2);    /* packed: every query sequence empty */
            attention(ctx, dt, a, 1, 0, 0, none, none, 0);  /* packed: no sequence (cu_seqlens = {0}) */
        }
}

/* NULL data stays invalid for a tensor with elements, and so does a NULL lse of a backward with rows. */
static void still_invalid(fa_context *ctx) {
    snprintf(t_case_label, sizeof t_case_label, "NULL data with elements");
    view q = mk_in(FA_DTYPE_F16, 2, 3, HQ), k = mk_in(FA_DTYPE_F16, 2, 0, HK), out = mk(FA_DTYPE_F16, 2, 3, HQ);
    fa_tensor qn = q.t;
    qn.data = NULL;
    CHECK_STATUS(fa_forward(ctx, NULL, &qn, &k.t, &k.t, &out.t, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "q: data is NULL");
    check_same(&out, "out");
    view dq = mk(FA_DTYPE_F16, 2, 3, HQ);
    CHECK_STATUS(fa_backward(ctx, NULL, &q.t, &k.t, &k.t, &q.t, NULL, &q.t, &dq.t, &k.t, &k.t),
                 FA_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "lse");
    check_same(&dq, "dq");
    fa_tensor neg = k.t;
    neg.seqlen = -1;
    CHECK_STATUS(fa_forward(ctx, NULL, &q.t, &neg, &neg, &out.t, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "k: seqlen = -1");
    fa_tensor h0 = k.t;
    h0.heads = 0;
    CHECK_STATUS(fa_forward(ctx, NULL, &q.t, &h0, &h0, &out.t, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(fa_context_last_error(ctx), "k: heads = 0");
    rm(&q), rm(&k), rm(&out), rm(&dq);
}

/* fa_forward_kvcache over a cache of `cap` keys per sequence (paged: `pages` pages of 16 keys, max_pages 2). */
static void kvcache(fa_context *ctx, fa_dtype dt, int64_t b, int64_t sq, int paged, int64_t rows_or_pages,
                    int64_t cap, const int32_t *lens, int append) {
    snprintf(t_case_label, sizeof t_case_label, "kvcache %s b%lld sq%lld %s rows/pages %lld cap %lld append %d",
             fa_dtype_name(dt), (long long)b, (long long)sq, paged ? "paged" : "contiguous", (long long)rows_or_pages,
             (long long)cap, append);
    view q = mk_in(dt, b, sq, HQ), out = mk(dt, b, sq, HQ), kn = mk_in(dt, b, sq, HK), vn = mk_in(dt, b, sq, HK);
    view kc = mk_in(dt, rows_or_pages, paged ? 16 : cap, HK), vc = mk_in(dt, rows_or_pages, paged ? 16 : cap, HK);
    static const int32_t table[4] = {0, 0, 0, 0};
    int32_t *dl = mk_i32(lens, b), *bt = paged ? mk_i32(table, 4) : NULL;
    float *lse = mk_f32(b * HQ * sq);
    fa_kvcache c = {kc.t, vc.t, dl, bt, paged ? 2 : 0, 0, NULL, paged ? 2 : 0};
    CHECK_STATUS(fa_forward_kvcache(ctx, NULL, NULL, &q.t, &c, append ? &kn.t : NULL, append ? &vn.t : NULL,
                                    &out.t, lse),
                 FA_OK);
    const char *msg = fa_context_last_error(ctx);
    CHECK_MSG(!msg[0], "message \"%s\"", msg);
    check_zero(&out, "out");
    check_ninf(lse, b * HQ * sq, "lse");
    check_same(&kc, "cache.k"), check_same(&vc, "cache.v"), check_same(&q, "q");
    rm(&q), rm(&out), rm(&kn), rm(&vn), rm(&kc), rm(&vc);
    dev_free(dl), dev_free(bt), dev_free(lse);
}

static void kvcache_all(fa_context *ctx) {
    static const int32_t zeros[2] = {0, 0}, some[2] = {3, 1};
    for (int di = BACKEND == FA_BACKEND_CUDA ? 1 : 0; di < 3; di++) { /* CUDA decodes f16 / bf16 */
        const fa_dtype dt = dtypes[di];
        kvcache(ctx, dt, 0, 1, 0, 2, 8, NULL, 1);    /* no sequence: seqlens may be NULL */
        kvcache(ctx, dt, 0, 1, 1, 2, 32, NULL, 0);
        kvcache(ctx, dt, 2, 0, 0, 2, 8, some, 1);    /* no new row: nothing appended, nothing attended */
        kvcache(ctx, dt, 2, 0, 1, 2, 32, some, 0);
        kvcache(ctx, dt, 2, 1, 0, 2, 0, zeros, 0);   /* a cache of capacity 0: out = 0, lse = -inf */
        kvcache(ctx, dt, 2, 2, 1, 0, 32, zeros, 0);  /* a paged cache without pages */
    }
    snprintf(t_case_label, sizeof t_case_label, "merge of no rows");
    view o0 = mk(FA_DTYPE_F16, 0, 3, HQ), out = mk(FA_DTYPE_F16, 0, 3, HQ);
    const float *lses[1] = {NULL};
    CHECK_STATUS(fa_merge_states(ctx, 1, &o0.t, lses, &out.t, NULL), FA_OK);
    rm(&o0), rm(&out);
}

int main(void) {
    t_init(NAME);
    fa_context *ctx = t_backend_ctx();
    attention_all(ctx);
    still_invalid(ctx);
    kvcache_all(ctx);
    fa_context_destroy(ctx);
    return t_finish();
}
