/* Gradients of STANDARD, FLASH1 and FLASH2 (each backward fed by its own forward's out and LSE) against the
 * float64 reference gradient: shapes, GQA (dK/dV summed over the query heads of a group), layouts, masks,
 * softcap, forced tiles, deterministic mode, f32/f16/bf16; then a random sweep of small cases. */
#include "testlib.h"

#include <stdlib.h>

#define ALL (T_ALL_ALGOS | T_ALGO_BIT(FA_ALGO_AUTO))

int main(void) {
    t_init("test_backward");
    fa_context *ctx = t_cpu_ctx();
    const fa_dtype F32 = FA_DTYPE_F32, F16 = FA_DTYPE_F16, BF16 = FA_DTYPE_BF16;
    t_case c;

    c = t_case_laid(1, 1, 1, 1, 1, 1, F32, T_BSHD, T_BSHD, T_BSHD);
    t_run_backward(ctx, &c, ALL);
    c = t_case_laid(2, 3, 3, 4, 2, 8, F32, T_BHSD, T_BSHD, T_STRIDED);
    t_run_backward(ctx, &c, ALL);
    c = t_case_laid(1, 1, 239, 2, 1, 64, F32, T_BSHD, T_BSHD, T_BSHD);
    t_run_backward(ctx, &c, ALL);
    c = t_case_laid(1, 239, 1, 2, 2, 16, F16, T_BSHD, T_BSHD, T_BSHD);
    t_run_backward(ctx, &c, ALL);

    /* head_dims, both seqlen orders */
    static const int dims[] = {1, 8, 63, 64, 80, 128, 256};
    static const fa_dtype dts[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int i = 0; i < 7; i++) {
        int64_t sq = (i & 1) ? 113 : 77, sk = (i & 1) ? 77 : 113;
        c = t_case_laid(1, sq, sk, 2, 1, dims[i], dts[i % 3], (t_layout)((i + 2) % 3), (t_layout)(i % 3), (t_layout)((i + 1) % 3));
        c.opts.causal = (i / 2) % 2;
        t_run_backward(ctx, &c, ALL);
    }
    /* GQA 1, 4, 8 */
    c = t_case_laid(2, 113, 113, 4, 4, 64, F32, T_BSHD, T_BSHD, T_BSHD);
    c.opts.causal = 1;
    t_run_backward(ctx, &c, ALL);
    c = t_case_laid(1, 113, 239, 8, 2, 32, BF16, T_STRIDED, T_BHSD, T_BSHD);
    t_run_backward(ctx, &c, ALL);
    c = t_case_laid(1, 239, 113, 8, 1, 32, F16, T_BSHD, T_STRIDED, T_BHSD);
    c.opts.causal = 1; /* sq > sk: 126 rows see no key and contribute nothing */
    t_run_backward(ctx, &c, ALL);

    /* masks and score modifiers */
    c = t_case_laid(1, 239, 239, 2, 1, 32, F32, T_BSHD, T_BSHD, T_BSHD);
    c.opts.window_left = 24, c.opts.window_right = 4;
    t_run_backward(ctx, &c, ALL);
    c = t_case_laid(1, 113, 113, 2, 2, 64, F16, T_BSHD, T_BSHD, T_BSHD);
    c.opts.softcap = 20, c.sigma = 3;
    t_run_backward(ctx, &c, ALL);
    c = t_case_laid(1, 113, 77, 2, 1, 64, F32, T_BHSD, T_BHSD, T_BHSD);
    c.opts.softcap = 5, c.opts.causal = 1, c.opts.window_left = 30, c.sigma = 2;
    t_run_backward(ctx, &c, ALL);
    c = t_case_laid(2, 65, 77, 2, 2, 16, BF16, T_BSHD, T_BSHD, T_BSHD);
    c.opts.scale = 0.4f;
    t_run_backward(ctx, &c, ALL);
    c = t_case_laid(1, 70, 111, 4, 1, 8, F32, T_BSHD, T_BSHD, T_BSHD);
    c.opts.scale = -0.2f, c.opts.causal = 1; /* a negative scale under a mask: masked scores must stay masked */
    t_run_backward(ctx, &c, ALL);

    /* forced tiles and deterministic mode */
    c = t_case_laid(1, 113, 239, 4, 2, 64, F32, T_BSHD, T_BSHD, T_BSHD);
    c.opts.block_q = 16, c.opts.block_k = 32, c.opts.causal = 1;
    t_run_backward(ctx, &c, ALL);
    c = t_case_laid(2, 39, 41, 2, 1, 8, F16, T_STRIDED, T_STRIDED, T_STRIDED);
    c.opts.block_q = 7, c.opts.block_k = 5, c.opts.window_left = 6;
    t_run_backward(ctx, &c, ALL);
    c = t_case_laid(1, 9, 6, 2, 2, 3, F32, T_BSHD, T_BSHD, T_BSHD);
    c.opts.block_q = 1, c.opts.block_k = 1, c.opts.causal = 1;
    t_run_backward(ctx, &c, ALL);
    c = t_case_laid(1, 113, 113, 4, 1, 64, F32, T_BSHD, T_BSHD, T_BSHD);
    c.opts.deterministic = 1, c.opts.block_q = 32, c.opts.block_k = 16;
    t_run_backward(ctx, &c, ALL);
    /* one K/V head, many K/V blocks: fewer work items than threads, so FLASH2 may split a head's K/V blocks over
     * threads (dQ partials summed afterwards) */
    c = t_case_laid(1, 97, 239, 2, 1, 32, F32, T_BSHD, T_BSHD, T_BSHD);
    c.opts.block_q = 16, c.opts.block_k = 8;
    t_run_backward(ctx, &c, ALL);
    c = t_case_laid(1, 239, 239, 1, 1, 16, BF16, T_BSHD, T_BSHD, T_STRIDED);
    c.opts.block_q = 32, c.opts.block_k = 8, c.opts.causal = 1;
    t_run_backward(ctx, &c, ALL);

    /* the larger ones: few */
    c = t_case_laid(1, 1023, 1023, 1, 1, 32, F32, T_BSHD, T_BSHD, T_BSHD);
    c.opts.causal = 1;
    t_run_backward(ctx, &c, T_ALL_ALGOS);
    c = t_case_laid(1, 239, 239, 1, 1, 256, BF16, T_BSHD, T_BSHD, T_BSHD);
    t_run_backward(ctx, &c, T_ALL_ALGOS);

    int n = 16;
    const char *env = getenv("FA_TEST_RANDOM");
    if (env) n = atoi(env);
    for (int i = 0; i < n; i++) {
        c = t_case_random(128, 128, 0);
        t_run_backward(ctx, &c, ALL);
    }

    fa_context_destroy(ctx);
    return t_finish();
}
