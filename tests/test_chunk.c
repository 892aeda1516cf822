/* attention_chunk (Llama 4's chunked local attention: a query sees only the keys of its diagonal's chunk) on the CPU:
 * every algorithm's forward and backward against the float64 oracle — alone and with causal and sliding windows,
 * seqlen_q ≠ seqlen_k (negative diagonals: rows that see nothing), chunks of 1 key, chunks longer than the
 * sequence, GQA, tiles that straddle chunk ends, packed batches with seqused —, KV-cache decoding (contiguous and
 * paged, with append and rotary), the oracle's chunk rule against a plain loop, and the argument checks. */
#include "testlib.h"
#include "kvcase.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static t_rng R;

/* The oracle's rule written once more: key j of a (sq, sk) sequence is visible to row i iff j lies in the chunk of
 * diagonal i + sk − sq (floor division) and the window allows it — checked on every pair of a few shapes through
 * the oracle's LSE (a row that sees nothing has LSE −inf; v = 1 makes out 1 where a row sees any key). */
static void oracle_rule(void) {
    snprintf(t_case_label, sizeof t_case_label, "oracle chunk rule");
    static const int shapes[][3] = {{7, 7, 3}, {5, 12, 4}, {12, 5, 4}, {9, 9, 1}, {4, 30, 64}};
    for (int s = 0; s < 5; s++) {
        const int sq = shapes[s][0], sk = shapes[s][1], c = shapes[s][2];
        t_buf q = t_buf_new(FA_DTYPE_F32, 1, sq, 1, 1, T_BSHD), k = t_buf_new(FA_DTYPE_F32, 1, sk, 1, 1, T_BSHD);
        t_buf v = t_buf_new(FA_DTYPE_F32, 1, sk, 1, 1, T_BSHD);
        for (int i = 0; i < sq; i++) t_set(&q.t, 0, i, 0, 0, 0);
        for (int j = 0; j < sk; j++) t_set(&k.t, 0, j, 0, 0, 0), t_set(&v.t, 0, j, 0, 0, 1);
        fa_attn_opts o = fa_attn_opts_default();
        o.attention_chunk = c;
        double out[64], lse[64];
        CHECK_STATUS(t_oracle_forward(&o, &q.t, &k.t, &v.t, out, lse), FA_OK);
        for (int i = 0; i < sq; i++) {
            int n = 0;
            for (int j = 0; j < sk; j++) {
                const int diag = i + sk - sq;
                const int cd = (int)floor((double)diag / c), cj = j / c;
                n += cd == cj;
            }
            const double want = n ? log((double)n) : -INFINITY;
            CHECK_MSG(n ? fabs(lse[i] - want) < 1e-12 : isinf(lse[i]) && lse[i] < 0,
                      "sq %d sk %d chunk %d row %d: lse %g, want %g (%d keys)", sq, sk, c, i, lse[i], want, n);
        }
        t_buf_free(&q), t_buf_free(&k), t_buf_free(&v);
    }
}

static void plain(fa_context *ctx) {
    /* {b, sq, sk, hq, hk, d, dtype, causal, wl, wr, chunk, block_q, block_k} */
    static const int cs[][13] = {
        {2, 64, 64, 2, 1, 32, FA_DTYPE_F32, 0, -1, -1, 16, 0, 0},   {1, 113, 113, 4, 2, 64, FA_DTYPE_F32, 1, -1, -1, 40, 0, 0},
        {1, 239, 239, 2, 2, 16, FA_DTYPE_BF16, 1, -1, -1, 64, 0, 0}, {2, 39, 71, 2, 1, 8, FA_DTYPE_F16, 0, -1, -1, 7, 0, 0},
        {1, 71, 39, 2, 1, 8, FA_DTYPE_F32, 1, -1, -1, 9, 0, 0},     {1, 50, 50, 1, 1, 24, FA_DTYPE_F32, 1, 5, -1, 12, 0, 0},
        {1, 60, 90, 2, 2, 40, FA_DTYPE_F32, 0, 6, 3, 13, 0, 0},     {1, 33, 33, 1, 1, 8, FA_DTYPE_F32, 1, -1, -1, 1, 0, 0},
        {1, 40, 40, 1, 1, 8, FA_DTYPE_F32, 1, -1, -1, 1000, 0, 0},  {1, 113, 239, 4, 2, 64, FA_DTYPE_F32, 1, -1, -1, 24, 16, 32},
        {2, 39, 41, 2, 1, 8, FA_DTYPE_F16, 0, 6, -1, 5, 7, 5},      {1, 200, 180, 3, 1, 40, FA_DTYPE_F32, 1, -1, -1, 30, 8, 24},
        {1, 1, 100, 2, 1, 64, FA_DTYPE_BF16, 1, -1, -1, 32, 0, 0},  {1, 300, 300, 2, 1, 128, FA_DTYPE_BF16, 1, -1, -1, 100, 0, 0},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const int *x = cs[i];
        t_case c = t_case_laid(x[0], x[1], x[2], x[3], x[4], x[5], (fa_dtype)x[6], i % 3 ? T_BSHD : T_STRIDED,
                               i % 2 ? T_BHSD : T_BSHD, T_BSHD);
        c.opts.causal = x[7], c.opts.window_left = x[8], c.opts.window_right = x[9], c.opts.attention_chunk = x[10];
        c.opts.block_q = x[11], c.opts.block_k = x[12];
        t_run_forward(ctx, &c, T_ALL_ALGOS);
        t_run_backward(ctx, &c, T_ALL_ALGOS);
    }
    /* random cases: every option drawn, chunk on all of them */
    const t_space sp = {239, 128, 1, 1, 0, 20, 2e6, 20, 100, 0};
    int n = 12;
    const char *env = getenv("FA_TEST_RANDOM");
    if (env) n = atoi(env);
    for (int i = 0; i < n; i++) {
        t_case c = t_case_draw(&R, &sp);
        t_case_bind(&c);
        if (i % 2) t_run_backward(ctx, &c, T_ALL_ALGOS);
        else t_run_forward(ctx, &c, T_ALL_ALGOS);
    }
}

/* Packed batches: chunks align to each sequence's own ends, also with seqused (used lengths inside the spans; NaN and
 * ±inf in the padding). */
static void packed(fa_context *ctx) {
    static const int lq[4] = {40, 0, 17, 64}, lk[4] = {55, 9, 17, 30}, uq[4] = {33, 0, 17, 50}, uk[4] = {50, 9, 0, 30};
    int32_t cuq[5] = {0}, cuk[5] = {0}, used_q[4], used_k[4];
    for (int s = 0; s < 4; s++) cuq[s + 1] = cuq[s] + lq[s], cuk[s + 1] = cuk[s] + lk[s], used_q[s] = uq[s], used_k[s] = uk[s];
    for (int v = 0; v < 4; v++) {
        t_case c = t_case_make(1, cuq[4], cuk[4], 4, 2, 32, v % 2 ? FA_DTYPE_BF16 : FA_DTYPE_F32);
        c.opts.cu_seqlens_q = cuq, c.opts.cu_seqlens_k = cuk, c.opts.n_seqs = 4;
        c.opts.causal = v != 1;
        c.opts.attention_chunk = v == 3 ? 3 : 16;
        if (v >= 2) c.opts.seqused_q = used_q, c.opts.seqused_k = used_k, c.nonfinite_padding = 1;
        t_run_forward(ctx, &c, T_ALL_ALGOS);
        t_run_backward(ctx, &c, T_ALL_ALGOS);
    }
}

/* KV-cache decoding: the chunks of the sequence after the append (diagonal L − S + i); with rotary, chunk counts as
 * a local call (query rows rotate at their own positions). */
static void kvcache(fa_context *ctx) {
    static const int pages[] = {0, 16, 3}, chunks[] = {8, 64, 5, 1000};
    int n = 0;
    for (int pi = 0; pi < 3; pi++)
        for (int ci = 0; ci < 4; ci++, n++) {
            t_kv_spec s;
            memset(&s, 0, sizeof s);
            s.dt = (fa_dtype)(n % 3), s.batch = 3, s.sq = (int[]){1, 4, 17}[n % 3], s.hq = 4, s.hk = 2, s.d = 64;
            s.capacity = 230, s.page_size = pages[pi];
            s.opts = fa_attn_opts_default();
            s.kv = fa_kv_opts_default();
            s.append = n % 2 == 0;
            s.rotary = s.append && n % 4 == 0 ? 1 : 0;
            s.opts.causal = n % 3 != 1;
            s.opts.window_left = n % 5 == 2 ? 40 : -1;
            s.opts.attention_chunk = chunks[ci];
            s.kv.num_splits = n % 2 ? 3 : 0;
            snprintf(t_case_label, sizeof t_case_label, "kvcache chunk %d page %d sq %d%s%s", chunks[ci], pages[pi],
                     s.sq, s.append ? " append" : "", s.rotary ? " rotary" : "");
            t_kv_case *c = t_kv_new(&s, &R);
            t_kv_run_cpu(ctx, c);
            t_kv_free(c);
        }
}

static void errors(fa_context *ctx) {
    snprintf(t_case_label, sizeof t_case_label, "attention_chunk < 0");
    t_buf q = t_buf_new(FA_DTYPE_F32, 1, 4, 1, 8, T_BSHD), o = t_buf_new(FA_DTYPE_F32, 1, 4, 1, 8, T_BSHD);
    t_buf_randn(&q, 1);
    t_buf_poison(&o);
    fa_attn_opts op = fa_attn_opts_default();
    op.attention_chunk = -1;
    CHECK_STATUS(fa_forward(ctx, &op, &q.t, &q.t, &q.t, &o.t, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(fa_context_last_error(ctx), "attention_chunk") != NULL, "message: %s", fa_context_last_error(ctx));
    CHECK_MSG(t_buf_check_written(&o) == o.t.batch * o.t.seqlen * o.t.heads * o.t.head_dim, "out written on error");
    t_buf_free(&q), t_buf_free(&o);
}

int main(void) {
    t_rng_seed(&R, t_init("test_chunk"));
    fa_context *ctx = t_cpu_ctx();
    oracle_rule();
    plain(ctx);
    packed(ctx);
    kvcache(ctx);
    errors(ctx);
    fa_context_destroy(ctx);
    return t_finish();
}
