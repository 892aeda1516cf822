/* CPU tile micro-kernels: the three small matrix products every algorithm is built from, on fp32 tiles in fast
 * memory (row-major, leading dimensions in floats). One table per ISA, picked once at context creation by
 * fa_cpu_kernels_select() (runtime CPUID dispatch: one binary runs on any x86-64). Results never depend on the
 * ISA beyond fp32 rounding order. */
#ifndef FA_CPU_KERNELS_H
#define FA_CPU_KERNELS_H

#include <stdint.h>

typedef struct fa_cpu_kernels {
    const char *isa; /* "scalar", "avx2", "avx512" */
    /* C[m][n] = A[m][k] · B[n][k]ᵀ          (S = Qi Kjᵀ, dP = dOi Vjᵀ) */
    void (*gemm_abt)(int m, int n, int k, const float *A, int lda, const float *B, int ldb, float *C, int ldc);
    /* C[m][n] += A[m][k] · B[k][n]          (O += P Vj, dQ += dS Kj) */
    void (*gemm_ab_acc)(int m, int n, int k, const float *A, int lda, const float *B, int ldb, float *C, int ldc);
    /* C[m][n] += A[k][m]ᵀ · B[k][n]         (dV += Pᵀ dO, dK += dSᵀ Q) */
    void (*gemm_atb_acc)(int m, int n, int k, const float *A, int lda, const float *B, int ldb, float *C, int ldc);
} fa_cpu_kernels;

/* The best table this CPU supports. FA_CPU_ISA=scalar|avx2|avx512 in the environment caps it (for tests). */
const fa_cpu_kernels *fa_cpu_kernels_select(void);
extern const fa_cpu_kernels fa_cpu_kernels_scalar;

#endif
