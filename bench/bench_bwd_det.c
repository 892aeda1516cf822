/* The cost of the deterministic backward (opts.deterministic) against the default, for FLASH2 (dQ by a second kernel
 * instead of fp32 bulk reduce-adds) and FLASH3 (the key blocks add dQ in a fixed order), at protocol shapes (bf16,
 * model dim 2048, B·S = 16k). Median of 10 after a warm-up, CUDA events. Benchmark only; run by
 * scripts/bench-gpu.sh. `bench_bwd_det flash3` (or flash2): that algorithm only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "flashattn.h"

static int cmp(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    fa_context *ctx;
    if (fa_context_create(&ctx, FA_BACKEND_CUDA, 0) != FA_OK) {
        fprintf(stderr, "no CUDA context: %s\n", fa_create_error());
        return 1;
    }
    printf("| algo | d | causal | seqlen | bwd ms (default) | bwd ms (deterministic) | deterministic / default speed |\n"
           "|---|---|---|---|---|---|---|\n");
    const int dims[3] = {64, 128, 256}, seqlens[4] = {1024, 2048, 4096, 8192};
    const fa_algo algos[2] = {FA_ALGO_FLASH2, FA_ALGO_FLASH3};
    const int only = argc > 1 ? (strcmp(argv[1], "flash3") == 0 ? 2 : strcmp(argv[1], "flash2") == 0 ? 1 : 0) : 0;
    for (int ad = only == 2 ? 3 : 0; ad < (only == 1 ? 3 : 6); ++ad) /* (algorithm, head dim) */
        for (int si = 0; si < 4; ++si)
            for (int causal = 0; causal < 2; ++causal) {
                const fa_algo algo = algos[ad / 3];
                const int d = dims[ad % 3], s = seqlens[si], h = 2048 / d, b = 16384 / s;
                const size_t n = (size_t)b * s * h * d;
                unsigned short *host = malloc(n * 2);
                for (size_t i = 0; i < n; ++i) host[i] = (unsigned short)(0x3c00 + (rand() & 0x3ff) - 0x200); /* bf16 ~U(0.5, 2)·±... */
                void *buf[8];
                for (int i = 0; i < 8; ++i) {
                    CK(cudaMalloc(&buf[i], n * 2));
                    CK(cudaMemcpy(buf[i], host, n * 2, cudaMemcpyHostToDevice));
                }
                float *lse;
                CK(cudaMalloc((void **)&lse, (size_t)b * h * s * 4));
                fa_tensor t[8];
                for (int i = 0; i < 8; ++i) t[i] = fa_tensor_bshd(buf[i], FA_DTYPE_BF16, b, s, h, d);
                fa_attn_opts o = fa_attn_opts_default();
                o.algo = algo;
                o.causal = causal;
                if (fa_forward(ctx, &o, &t[0], &t[1], &t[2], &t[3], lse) != FA_OK) {
                    fprintf(stderr, "forward: %s\n", fa_context_last_error(ctx));
                    return 1;
                }
                float med[2];
                for (int det = 0; det < 2; ++det) {
                    o.deterministic = det;
                    float ms[10];
                    cudaEvent_t e0, e1;
                    CK(cudaEventCreate(&e0));
                    CK(cudaEventCreate(&e1));
                    for (int r = -2; r < 10; ++r) {
                        CK(cudaEventRecord(e0, 0));
                        if (fa_backward(ctx, &o, &t[0], &t[1], &t[2], &t[3], lse, &t[4], &t[5], &t[6], &t[7]) != FA_OK) {
                            fprintf(stderr, "backward: %s\n", fa_context_last_error(ctx));
                            return 1;
                        }
                        CK(cudaEventRecord(e1, 0));
                        CK(cudaEventSynchronize(e1));
                        if (r >= 0) CK(cudaEventElapsedTime(&ms[r], e0, e1));
                    }
                    qsort(ms, 10, sizeof ms[0], cmp);
                    med[det] = 0.5f * (ms[4] + ms[5]);
                    cudaEventDestroy(e0);
                    cudaEventDestroy(e1);
                }
                printf("| %s | %d | %d | %d | %.3f | %.3f | %.2f |\n", fa_algo_name(algo), d, causal, s, med[0], med[1],
                       med[0] / med[1]);
                for (int i = 0; i < 8; ++i) cudaFree(buf[i]);
                cudaFree(lse);
                free(host);
            }
    fa_context_destroy(ctx);
    return 0;
}
