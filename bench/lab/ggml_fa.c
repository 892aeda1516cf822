/* The ggml anchor of the CPU benchmark: times ggml's CPU ggml_flash_attn_ext (f32 Q/K/V, the tiled path) on the
 * FA protocol shapes, prints GFLOP/s with the same FLOP formula as flashattn bench (4·B·H·S²·d, halved causal).
 * Not built by default: it needs a ggml build (scripts/bench-cpu.sh builds it when GGML_DIR points at a ggml source
 * tree, e.g. the one vendored by the ggml-python sdist).
 *
 *   ggml_fa <d> <seqlen> <causal 0|1> <reps> [threads]   (batch·seqlen = 16384, heads = 2048/d) */
#define _POSIX_C_SOURCE 200809L
#include "ggml-cpu.h"
#include "ggml.h"
#include "lab_ggml.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s d seqlen causal reps [threads]\n", argv[0]);
        return 2;
    }
    const int d = atoi(argv[1]), S = atoi(argv[2]), causal = atoi(argv[3]), reps = atoi(argv[4]);
    const int threads = argc > 5 ? atoi(argv[5]) : 2;
    const int H = 2048 / d, B = 16384 / S > 0 ? 16384 / S : 1;
    const size_t n = (size_t)d * S * H * B;
    const size_t mem = 5 * n * 4 + (size_t)S * S * 2 * 2 + ((size_t)512 << 20);
    ggml_cpu_init();
    struct ggml_init_params ip = {mem, NULL, false};
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, S, H, B);
    struct ggml_tensor *k = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, S, H, B);
    struct ggml_tensor *v = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, S, H, B);
    struct ggml_tensor *mask = NULL;
    float *qd = q->data, *kd = k->data, *vd = v->data;
    unsigned s = 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u, qd[i] = (float)(s >> 8) / 16777216.0f - 0.5f;
        s = s * 1664525u + 1013904223u, kd[i] = (float)(s >> 8) / 16777216.0f - 0.5f;
        s = s * 1664525u + 1013904223u, vd[i] = (float)(s >> 8) / 16777216.0f - 0.5f;
    }
    if (causal) { /* f16 mask [n_kv, n_q padded]: 0 where visible, −∞ above the diagonal */
        const int sp = S;
        mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, S, sp);
        ggml_fp16_t *md = mask->data, zero = ggml_fp32_to_fp16(0.0f), ninf = ggml_fp32_to_fp16(-INFINITY);
        for (int i = 0; i < sp; i++)
            for (int j = 0; j < S; j++) md[(size_t)i * S + j] = j <= i ? zero : ninf;
    }
    struct ggml_tensor *o = ggml_flash_attn_ext(ctx, q, k, v, mask, 1.0f / sqrtf((float)d), 0.0f, 0.0f);
    ggml_flash_attn_ext_set_prec(o, GGML_PREC_F32);
    const double med = lab_ggml_median(ctx, o, threads, reps);
    const double flops = 4.0 * B * H * (double)S * S * d * (causal ? 0.5 : 1.0);
    printf("ggml_flash_attn_ext f32 B=%d H=%d S=%d d=%d causal=%d threads=%d: %.1f ms, %.1f GFLOP/s\n", B, H, S, d,
           causal, threads, med * 1e3, flops / med * 1e-9);
    ggml_free(ctx);
    return 0;
}
