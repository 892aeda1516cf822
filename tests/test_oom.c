/* A call that fails with FA_ERR_OUT_OF_MEMORY writes no output, also when it is the numerics contract's float64
 * recompute (docs/numerics.md) whose workspace does not fit: NaN in q, K and V broadcast (stride_seq 0) over enough
 * keys that the recompute's per-thread scratch of a 256-thread context passes the workspace limit (80 % of the
 * machine's memory). Every CPU algorithm, forward and backward; out, LSE, dQ, dK, dV must keep their poison. */
#include "testlib.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { THREADS = 256 };

static const float POISON = 12345.f;

static int untouched(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (x[i] != POISON) return 0;
    return 1;
}

/* Keys for which the recompute needs more than the limit: bytes_per_key per thread (forward: a logit and a flag;
 * backward: a logit and dK, dV rows, head_dim 1). 0 if that many keys do not fit the CPU's int32 cu_seqlens range. */
static int64_t keys_past_limit(double bytes_per_key) {
    const double mem = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    const double sk = 0.8 * mem / (THREADS * bytes_per_key) + 4096;
    return sk < (double)(INT32_MAX / 2) ? (int64_t)sk : 0;
}

static fa_tensor broadcast_keys(float *one, int64_t sk) {
    fa_tensor t = fa_tensor_bshd(one, FA_DTYPE_F32, 1, sk, 1, 1);
    t.stride_seq = 0, t.stride_batch = 0;
    return t;
}

static void forward(fa_context *ctx, fa_algo a) {
    snprintf(t_case_label, sizeof t_case_label, "forward, recompute out of memory, %s", fa_algo_name(a));
    const int64_t sk = keys_past_limit(9.0);
    if (!sk) return;
    float q = NAN, k = 1, v = 1, o = POISON, lse = POISON;
    fa_tensor tq = fa_tensor_bshd(&q, FA_DTYPE_F32, 1, 1, 1, 1), to = fa_tensor_bshd(&o, FA_DTYPE_F32, 1, 1, 1, 1);
    fa_tensor tk = broadcast_keys(&k, sk), tv = broadcast_keys(&v, sk);
    fa_attn_opts opts = fa_attn_opts_default();
    opts.algo = a;
    CHECK_STATUS(fa_forward(ctx, &opts, &tq, &tk, &tv, &to, &lse), FA_ERR_OUT_OF_MEMORY);
    CHECK_MSG(o == POISON && lse == POISON, "a failed call wrote out %g, LSE %g", o, lse);
}

static void backward(fa_context *ctx, fa_algo a) {
    snprintf(t_case_label, sizeof t_case_label, "backward, recompute out of memory, %s", fa_algo_name(a));
    const int64_t sk = keys_past_limit(24.0);
    if (!sk) return;
    float q = NAN, k = 1, v = 1, o = 1, dout = 1, lse = 0, dq = POISON;
    float *dk = malloc(sizeof(float) * (size_t)sk), *dv = malloc(sizeof(float) * (size_t)sk);
    CHECK(dk && dv);
    if (!dk || !dv) {
        free(dk), free(dv);
        return;
    }
    for (int64_t j = 0; j < sk; j++) dk[j] = dv[j] = POISON;
    fa_tensor tq = fa_tensor_bshd(&q, FA_DTYPE_F32, 1, 1, 1, 1), to = fa_tensor_bshd(&o, FA_DTYPE_F32, 1, 1, 1, 1);
    fa_tensor tdo = fa_tensor_bshd(&dout, FA_DTYPE_F32, 1, 1, 1, 1), tdq = fa_tensor_bshd(&dq, FA_DTYPE_F32, 1, 1, 1, 1);
    fa_tensor tk = broadcast_keys(&k, sk), tv = broadcast_keys(&v, sk);
    fa_tensor tdk = fa_tensor_bshd(dk, FA_DTYPE_F32, 1, sk, 1, 1), tdv = fa_tensor_bshd(dv, FA_DTYPE_F32, 1, sk, 1, 1);
    fa_attn_opts opts = fa_attn_opts_default();
    opts.algo = a;
    CHECK_STATUS(fa_backward(ctx, &opts, &tq, &tk, &tv, &to, &lse, &tdo, &tdq, &tdk, &tdv), FA_ERR_OUT_OF_MEMORY);
    CHECK_MSG(dq == POISON && untouched(dk, sk) && untouched(dv, sk), "a failed call wrote a gradient");
    free(dk), free(dv);
}

int main(void) {
    t_init("test_oom");
    fa_context *ctx = NULL;
    CHECK_STATUS(fa_context_create(&ctx, FA_BACKEND_CPU, THREADS), FA_OK);
    static const fa_algo algos[] = {FA_ALGO_STANDARD, FA_ALGO_FLASH1, FA_ALGO_FLASH2};
    for (int a = 0; a < 3; a++) forward(ctx, algos[a]), backward(ctx, algos[a]);
    fa_context_destroy(ctx);
    return t_finish();
}
