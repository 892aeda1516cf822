/* The CPU KV-cache kernel's compute rate: fa_forward_kvcache called back to back on the same contiguous cache, no
 * flush and no anchors in between, so a cache that fits the L2/L3 is read from there and the time is the kernel's
 * arithmetic. Prints the median call and the time per K/V head and key (per thread: threads x time / (batch x
 * cache x heads_k)), the figure to set against the FMAs a head and key costs, and that time for the fastest call (on a
 * machine that others share, the call least slowed by them). Compare figures of one binary only: where the linker
 * places the kernel moves them (MHA 8/8 on a Zen 4: 15.1 ns linked statically, 12.1 against libflashattn.so).
 * Usage: kvcache_loop <bf16|f16|f32|e4m3> <batch> <cache> <heads_q> <heads_k> <threads> <reps>  (head_dim 128;
 * e4m3: an FP8 cache, descales 1, against bf16 q) */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "flashattn.h"
#include "lab_time.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* x in (-0.5, 0.5) stored as the dtype */
static void fill(void *p, fa_dtype dt, size_t n, uint32_t *seed) {
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        const float x = (float)(*seed >> 8) / 16777216.0f - 0.5f;
        if (dt == FA_DTYPE_F32) {
            ((float *)p)[i] = x;
        } else if (dt == FA_DTYPE_BF16) {
            uint32_t u;
            memcpy(&u, &x, 4);
            ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
        } else if (dt == FA_DTYPE_F8_E4M3) { /* |x| < 0.5: the exponent 6 - e, the top 3 mantissa bits (normal only) */
            uint32_t u;
            memcpy(&u, &x, 4);
            const int e = (int)(u >> 23 & 0xff) - 127 + 7;
            ((uint8_t *)p)[i] = (uint8_t)((u >> 24 & 0x80) | (e <= 0 ? 0 : e << 3 | (u >> 20 & 7)));
        } else { /* f16 of |x| < 0.5 by its bits: sign, exponent 14 - e, 10 mantissa bits (normal numbers only) */
            uint32_t u;
            memcpy(&u, &x, 4);
            const int e = (int)(u >> 23 & 0xff) - 127 + 15;
            ((uint16_t *)p)[i] = e <= 0 ? (uint16_t)(u >> 16 & 0x8000) : (uint16_t)((u >> 16 & 0x8000) | e << 10 | (u >> 13 & 0x3ff));
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: %s <bf16|f16|f32|e4m3> <batch> <cache> <heads_q> <heads_k> <threads> <reps>\n", argv[0]);
        return 2;
    }
    const fa_dtype cdt = !strcmp(argv[1], "f32") ? FA_DTYPE_F32 : !strcmp(argv[1], "f16") ? FA_DTYPE_F16
                         : !strcmp(argv[1], "e4m3") ? FA_DTYPE_F8_E4M3 : FA_DTYPE_BF16; /* the cache's */
    const fa_dtype dt = cdt == FA_DTYPE_F8_E4M3 ? FA_DTYPE_BF16 : cdt; /* q's and out's */
    const int64_t B = atoll(argv[2]), N = atoll(argv[3]), hq = atoll(argv[4]), hk = atoll(argv[5]), d = 128;
    const int threads = atoi(argv[6]), reps = atoi(argv[7]);
    if (B < 1 || N < 1 || hq < 1 || hk < 1 || threads < 1 || reps < 1) {
        fprintf(stderr, "%s: every size must be positive\n", argv[0]);
        return 2;
    }
    const size_t es = fa_dtype_size(dt), ces = fa_dtype_size(cdt), nkv = (size_t)(B * N * hk * d), nq = (size_t)(B * hq * d);
    /* 64-byte aligned as `flashattn bench` allocates: malloc's 16-byte offset puts every row across a line boundary
     * (MHA 8/8 from L3, avx512f, one binary: 14.5 ns per K/V head and key against 12.1 aligned) */
    const size_t kvs = (nkv * ces + 63) / 64 * 64;
    void *k = aligned_alloc(64, kvs), *v = aligned_alloc(64, kvs), *q = malloc(nq * es), *o = malloc(nq * es);
    int32_t *lens = malloc(sizeof(int32_t) * (size_t)B);
    double *t = malloc(sizeof(double) * (size_t)reps);
    fa_context *ctx = NULL;
    int rc = 1;
    if (!k || !v || !q || !o || !lens || !t) {
        fprintf(stderr, "out of memory\n");
        goto done;
    }
    uint32_t seed = 1;
    fill(k, cdt, nkv, &seed), fill(v, cdt, nkv, &seed), fill(q, dt, nq, &seed);
    for (int64_t b = 0; b < B; b++) lens[b] = (int32_t)N;
    if (fa_context_create(&ctx, FA_BACKEND_CPU, threads) != FA_OK) {
        fprintf(stderr, "context: %s\n", fa_create_error());
        goto done;
    }
    fa_kvcache cache = {0};
    cache.k = fa_tensor_bshd(k, cdt, B, N, hk, d);
    cache.v = fa_tensor_bshd(v, cdt, B, N, hk, d);
    cache.seqlens = lens;
    const fa_tensor tq = fa_tensor_bshd(q, dt, B, 1, hq, d), to = fa_tensor_bshd(o, dt, B, 1, hq, d);
    const fa_attn_opts opts = fa_attn_opts_default();
    for (int r = -3; r < reps; r++) { /* three warm-up calls */
        const double t0 = lab_now();
        if (fa_forward_kvcache(ctx, &opts, NULL, &tq, &cache, NULL, NULL, &to, NULL) != FA_OK) {
            fprintf(stderr, "fa_forward_kvcache: %s\n", fa_context_last_error(ctx));
            goto done;
        }
        if (r >= 0) t[r] = lab_now() - t0;
    }
    qsort(t, (size_t)reps, sizeof(double), lab_by_value);
    const double med = t[reps / 2];
    printf("%s batch %lld cache %lld hq/hk %lld/%lld threads %d: %.1f us, %.2f GB/s K+V, %.1f ns per K/V head and key "
           "per thread (fastest call: %.1f)\n",
           argv[1], (long long)B, (long long)N, (long long)hq, (long long)hk, threads, med * 1e6,
           2.0 * (double)(nkv * ces) / med / 1e9, med * 1e9 * threads / (double)(B * N * hk),
           t[0] * 1e9 * threads / (double)(B * N * hk));
    rc = 0;
done:
    fa_context_destroy(ctx);
    free(k), free(v), free(q), free(o), free(lens), free(t);
    return rc;
}
