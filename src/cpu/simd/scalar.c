/* The portable table (any CPU, baseline flags): the floor of the runtime dispatch. The SIMD tables in avx2.c and
 * avx512.c compute the same sums. */
#include "cpu/simd/kernels.h"
#include "cpu/simd/kvcache.h"
#include "cpu/simd/portable.h"

static void gemm_abt(int m, int n, int k, const float *restrict A, int lda, const float *restrict B, int ldb,
                     float *restrict C, int ldc) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float s = 0;
            for (int p = 0; p < k; p++) s += A[i * lda + p] * B[j * ldb + p];
            C[i * ldc + j] = s;
        }
}

const fa_cpu_kernels fa_cpu_kernels_scalar = {
    .isa = "scalar",
    .id = FA_CPU_ISA_SCALAR,
    .gemm_nn = port_gemm_nn,
    .gemm_abt = gemm_abt,
    .bf16_dot = 0,
    FA_PORTABLE_ENTRIES,
    .kvcache = &fa_kv_kernel_scalar,
};
