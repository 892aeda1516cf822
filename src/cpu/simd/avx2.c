/* AVX2 + FMA tile kernels (x86-64 CPUs without AVX-512). Built with -mavx2 -mfma (src/cpu/sources.cmake); only
 * reached through fa_cpu_kernels_select() after a CPUID check. 16 ymm registers: C blocks of 6 rows × 2 ymm
 * (16 columns) = 12 accumulators + 2 B vectors + 1 broadcast. The elementwise entries come from simd/portable.h,
 * vectorised by the compiler for this file's flags. docs/cpu-kernels.md has the register blocking. */
#include "cpu/simd/kernels.h"
#include "cpu/simd/portable.h"

#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

AI __m256i tail_mask(int rem) { /* lanes < rem */
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(rem), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* C[MR][8·NV] (=|+=) Σ_p A(i, p) · B[p][·]; the last vector of each row is masked by mk. */
AI void ukr(const int MR, const int NV, int k, const float *restrict A, ptrdiff_t rsa, ptrdiff_t csa,
            const float *restrict B, ptrdiff_t ldb, float *restrict C, ptrdiff_t ldc, int acc, __m256i mk) {
    __m256 c[6][2];
    const __m256i full = _mm256_set1_epi32(-1);
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++)
            c[i][v] = acc ? _mm256_maskload_ps(C + i * ldc + 8 * v, v == NV - 1 ? mk : full) : _mm256_setzero_ps();
    for (int p = 0; p < k; p++) {
        __m256 b[2];
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) b[v] = _mm256_maskload_ps(B + 8 * v, v == NV - 1 ? mk : full);
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            __m256 a = _mm256_broadcast_ss(A + i * rsa);
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++) c[i][v] = _mm256_fmadd_ps(a, b[v], c[i][v]);
        }
        A += csa;
        B += ldb;
    }
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) _mm256_maskstore_ps(C + i * ldc + 8 * v, v == NV - 1 ? mk : full, c[i][v]);
}

#define UKR_CASE(MR, NV) \
    case (MR)*4 + (NV): ukr(MR, NV, k, A, rsa, csa, B, ldb, C, ldc, acc, mk); break;
#define UKR_ROW(MR) UKR_CASE(MR, 1) UKR_CASE(MR, 2)

static void ukr_any(int mr, int nv, int k, const float *A, ptrdiff_t rsa, ptrdiff_t csa, const float *B, ptrdiff_t ldb,
                    float *C, ptrdiff_t ldc, int acc, __m256i mk) {
    switch (mr * 4 + nv) {
        UKR_ROW(1) UKR_ROW(2) UKR_ROW(3) UKR_ROW(4) UKR_ROW(5) UKR_ROW(6)
    default: break;
    }
}

static void gemm_nn(int m, int n, int k, const float *A, ptrdiff_t rsa, ptrdiff_t csa, const float *B, int ldb, float *C,
                    int ldc, int acc) {
    for (int j0 = 0; j0 < n; j0 += 16) {
        int nc = n - j0 < 16 ? n - j0 : 16;
        int nv = (nc + 7) / 8;
        __m256i mk = tail_mask(nc - 8 * (nv - 1));
        for (int i0 = 0; i0 < m; i0 += 6) {
            int mr = m - i0 < 6 ? m - i0 : 6;
            ukr_any(mr, nv, k, A + i0 * rsa, rsa, csa, B + j0, ldb, C + (ptrdiff_t)i0 * ldc + j0, ldc, acc, mk);
        }
    }
}

#define ABT_KC 256
static void gemm_abt(int m, int n, int k, const float *A, int lda, const float *B, int ldb, float *C, int ldc) {
    float panel[ABT_KC * 64] __attribute__((aligned(64)));
    if (k <= 0) {
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) C[(ptrdiff_t)i * ldc + j] = 0;
        return;
    }
    for (int j0 = 0; j0 < n; j0 += 64) {
        int nc = n - j0 < 64 ? n - j0 : 64;
        for (int p0 = 0; p0 < k; p0 += ABT_KC) {
            int kc = k - p0 < ABT_KC ? k - p0 : ABT_KC;
            port_pack_t(nc, kc, B + (ptrdiff_t)j0 * ldb + p0, ldb, panel, 64, 1.0f);
            gemm_nn(m, nc, kc, A + p0, lda, 1, panel, 64, C + j0, ldc, p0 > 0);
        }
    }
}

const fa_cpu_kernels fa_cpu_kernels_avx2 = {
    .isa = "avx2",
    .id = FA_CPU_ISA_AVX2,
    .gemm_nn = gemm_nn,
    .gemm_abt = gemm_abt,
    .bf16_dot = 0,
    FA_PORTABLE_ENTRIES,
};
