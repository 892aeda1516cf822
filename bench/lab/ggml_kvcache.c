/* The ggml anchor of `flashattn bench --mode kvcache` on the CPU: times ggml's ggml_flash_attn_ext with one query row
 * per sequence against a K/V cache of `cache` keys, in llama.cpp's cache layout ([seq, heads_k, d] per sequence, seen
 * through a permuted view), GQA through ggml's head broadcast, f32 accumulation (GGML_PREC_F32), and prints GB/s of
 * K+V read with the byte count flashattn bench uses (every key of every K/V head once, K and V). No mask: the causal
 * mask of the one new row hides nothing. f16 is ggml's usual cache type; bf16 runs its generic per-row path.
 * Not built by default: it needs a ggml build (bench/lab/README.md; bench/lab/kvcache-anchors.sh builds it).
 *
 *   ggml_kvcache <f16|bf16> <batch> <cache> <heads_q> <heads_k> <reps> [threads] [head_dim] */
#define _POSIX_C_SOURCE 200809L
#include "ggml-cpu.h"
#include "ggml.h"
#include "lab_ggml.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


/* n values uniform in [-1, 1) as f16 or bf16 (the distribution flashattn bench fills its cache with) */
static void fill(void *dst, enum ggml_type t, size_t n, unsigned *s) {
    for (size_t i = 0; i < n; i++) {
        *s = *s * 1664525u + 1013904223u;
        const float x = (float)(*s >> 8) / 8388608.0f - 1.0f;
        if (t == GGML_TYPE_F16) ((ggml_fp16_t *)dst)[i] = ggml_fp32_to_fp16(x);
        else ((ggml_bf16_t *)dst)[i] = ggml_fp32_to_bf16(x);
    }
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s f16|bf16 batch cache heads_q heads_k reps [threads] [head_dim]\n", argv[0]);
        return 2;
    }
    const enum ggml_type kt = strcmp(argv[1], "bf16") ? GGML_TYPE_F16 : GGML_TYPE_BF16;
    const int B = atoi(argv[2]), N = atoi(argv[3]), HQ = atoi(argv[4]), HK = atoi(argv[5]), reps = atoi(argv[6]);
    const int threads = argc > 7 ? atoi(argv[7]) : 2, d = argc > 8 ? atoi(argv[8]) : 128;
    if (B < 1 || N < 1 || HK < 1 || HQ % HK || reps < 1 || threads < 1 || d < 1) {
        fprintf(stderr, "%s: bad arguments\n", argv[0]);
        return 2;
    }
    const size_t n_kv = (size_t)B * N * HK * d, n_q = (size_t)B * HQ * d;
    const size_t mem = 2 * n_kv * 2 + 2 * n_q * 4 + ((size_t)64 << 20);
    ggml_cpu_init();
    struct ggml_init_params ip = {mem, NULL, false};
    struct ggml_context *ctx = ggml_init(ip);
    if (!ctx) {
        fprintf(stderr, "%s: cannot allocate %.2f GB\n", argv[0], 1e-9 * (double)mem);
        return 1;
    }
    /* the cache as llama.cpp keeps it, [d, heads_k, cache, batch], seen as [d, cache, heads_k, batch] */
    struct ggml_tensor *kc = ggml_new_tensor_4d(ctx, kt, d, HK, N, B);
    struct ggml_tensor *vc = ggml_new_tensor_4d(ctx, kt, d, HK, N, B);
    struct ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, 1, HQ, B);
    unsigned s = 12345;
    fill(kc->data, kt, n_kv, &s);
    fill(vc->data, kt, n_kv, &s);
    for (size_t i = 0; i < n_q; i++) {
        s = s * 1664525u + 1013904223u;
        ((float *)q->data)[i] = (float)(s >> 8) / 8388608.0f - 1.0f;
    }
    struct ggml_tensor *k = ggml_permute(ctx, kc, 0, 2, 1, 3), *v = ggml_permute(ctx, vc, 0, 2, 1, 3);
    struct ggml_tensor *o = ggml_flash_attn_ext(ctx, q, k, v, NULL, 1.0f / sqrtf((float)d), 0.0f, 0.0f);
    ggml_flash_attn_ext_set_prec(o, GGML_PREC_F32);
    const double med = lab_ggml_median(ctx, o, threads, reps), bytes = 2.0 * (double)n_kv * 2.0;
    float check = 0;
    for (int64_t i = 0; i < ggml_nelements(o); i++) check += ((const float *)o->data)[i];
    printf("ggml_flash_attn_ext %s b=%d cache=%d hq/hk=%d/%d d=%d threads=%d: %.3f ms, %.2f GB/s K+V (sum %.3g)\n",
           argv[1], B, N, HQ, HK, d, threads, med * 1e3, bytes / med * 1e-9, (double)check);
    ggml_free(ctx);
    return 0;
}
