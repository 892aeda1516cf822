/* Portable tile products (any CPU). The SIMD tables in kernels_avx*.c compute the same sums. */
#include "cpu/kernels.h"
#include "cpu/kernels_portable.h"

static void gemm_abt(int m, int n, int k, const float *restrict A, int lda, const float *restrict B, int ldb,
                     float *restrict C, int ldc) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float s = 0;
            for (int p = 0; p < k; p++) s += A[i * lda + p] * B[j * ldb + p];
            C[i * ldc + j] = s;
        }
}

static void gemm_ab_acc(int m, int n, int k, const float *restrict A, int lda, const float *restrict B, int ldb,
                        float *restrict C, int ldc) {
    for (int i = 0; i < m; i++)
        for (int p = 0; p < k; p++) {
            float a = A[i * lda + p];
            if (a == 0) continue;
            for (int j = 0; j < n; j++) C[i * ldc + j] += a * B[p * ldb + j];
        }
}

static void gemm_atb_acc(int m, int n, int k, const float *restrict A, int lda, const float *restrict B, int ldb,
                         float *restrict C, int ldc) {
    for (int p = 0; p < k; p++)
        for (int i = 0; i < m; i++) {
            float a = A[p * lda + i];
            if (a == 0) continue;
            for (int j = 0; j < n; j++) C[i * ldc + j] += a * B[p * ldb + j];
        }
}

const fa_cpu_kernels fa_cpu_kernels_scalar = {
    .isa = "scalar",
    .gemm_abt = gemm_abt,
    .gemm_ab_acc = gemm_ab_acc,
    .gemm_atb_acc = gemm_atb_acc,
    .gemm_nn = port_gemm_nn,
    .bf16_dot = 0,
    FA_PORTABLE_EXT_ENTRIES,
};
