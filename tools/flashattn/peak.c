/* Matmul ceilings of this machine (see peak.h): the micro-kernel repeated on a tile that stays in cache, one copy per
 * thread, timed between two barriers. Test and benchmark code: it reads the library's internal kernel table. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "peak.h"

#include "cpu/blas.h"
#include "cpu/simd/kernels.h"

#include <math.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef FA_HAVE_CBLAS
#include <cblas.h>
#endif

double fa_cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* GFLOP/s of C[m][n] += A[m][k]·B[k][n] (fp32) or its bf16-pair form (k/2 words) on nt threads. */
static double gemm_rate(const fa_cpu_kernels *K, int nt, int bf16, double seconds) {
    const int m = 60, n = 64, k = 128, kp = k / 2;
    double t0 = 0, t1 = 0;
    long total = 0;
    int failed = 0;
#pragma omp parallel num_threads(nt) reduction(+ : total) reduction(| : failed)
    {
        float *A = calloc((size_t)m * k, 4), *B = calloc((size_t)k * n, 4), *C = calloc((size_t)m * n, 4);
        long reps = 0;
        failed = !A || !B || !C;
#pragma omp barrier
#pragma omp master
        t0 = fa_cpu_seconds();
#pragma omp barrier
        double end = t0 + seconds;
        if (!failed)
            while (fa_cpu_seconds() < end) {
                for (int r = 0; r < 16; r++) {
                    if (bf16)
                        K->gemm_bf16(m, n, kp, (const uint32_t *)A, kp, 1, (const uint32_t *)B, n, C, n, 1);
                    else
                        K->gemm_nn(m, n, k, A, k, 1, B, n, C, n, 1);
                }
                reps += 16;
            }
#pragma omp barrier
#pragma omp master
        t1 = fa_cpu_seconds();
        total = reps;
        free(A);
        free(B);
        free(C);
    }
    if (failed || t1 <= t0) return 0;
    return 2.0 * m * n * k * (double)total / (t1 - t0) * 1e-9;
}

#ifdef FA_HAVE_CBLAS
static double blas_rate(void) {
    const int n = 4096;
    float *A = calloc((size_t)n * n, 4), *B = calloc((size_t)n * n, 4), *C = calloc((size_t)n * n, 4);
    double best = 0;
    if (A && B && C)
        for (int r = 0; r < 3; r++) { /* the first call warms up */
            double t0 = fa_cpu_seconds();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
            double g = 2.0 * n * n * (double)n / (fa_cpu_seconds() - t0) * 1e-9;
            if (r > 0 && g > best) best = g;
        }
    free(A);
    free(B);
    free(C);
    return best;
}
#endif

/* GHz of this core: 8 dependent register-register adds per iteration retire in 8 cycles on every x86-64 core
 * (adds of an immediate would not do: recent Intel cores fold chains of them at rename, which read 6.3 GHz). */
static double clock_ghz(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    const long iters = 20 * 1000 * 1000;
    long x = 0, one = 1;
    double best = 0;
    for (int trial = 0; trial < 3; trial++) {
        double t0 = fa_cpu_seconds();
        for (long i = 0; i < iters; i++)
            __asm__ volatile("add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
                             "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0" : "+r"(x) : "r"(one));
        double g = 8.0 * (double)iters / (fa_cpu_seconds() - t0) * 1e-9;
        if (g > best) best = g;
    }
    return best;
#else
    return 0;
#endif
}

/* GFLOP/s of register-only FMAs on one thread: 12 independent accumulators (more than latency x units on every
 * x86-64 core), no loads, so the rate is the core's FMA throughput x clock. 0 where the ISA has no FMA. */
#if defined(__x86_64__) && defined(__GNUC__)
#define FMA12(T, SET, FMA, CONS)                                                                                       \
    T a0 = SET(1), a1 = SET(2), a2 = SET(3), a3 = SET(4), a4 = SET(5), a5 = SET(6), a6 = SET(7), a7 = SET(8),          \
      a8 = SET(9), a9 = SET(10), a10 = SET(11), a11 = SET(12), b = SET(0.999f), c = SET(1e-7f);                        \
    const double t0 = fa_cpu_seconds();                                                                               \
    for (long i = 0; i < iters; i++) {                                                                                \
        a0 = FMA(a0, b, c), a1 = FMA(a1, b, c), a2 = FMA(a2, b, c), a3 = FMA(a3, b, c), a4 = FMA(a4, b, c);            \
        a5 = FMA(a5, b, c), a6 = FMA(a6, b, c), a7 = FMA(a7, b, c), a8 = FMA(a8, b, c), a9 = FMA(a9, b, c);            \
        a10 = FMA(a10, b, c), a11 = FMA(a11, b, c);                                                                    \
        __asm__ volatile("" : CONS(a0), CONS(a1), CONS(a2), CONS(a3), CONS(a4), CONS(a5), CONS(a6), CONS(a7),          \
                         CONS(a8), CONS(a9), CONS(a10), CONS(a11)); /* kept apart: no chain is merged or dropped */  \
    }                                                                                                                 \
    return 12.0 * 2 * (sizeof(T) / 4) * (double)iters / (fa_cpu_seconds() - t0) * 1e-9
#define CONS_X(v) "+x"(v)
#define CONS_V(v) "+v"(v)
__attribute__((target("avx2,fma"))) static double fma_rate_avx2(long iters) {
    FMA12(__m256, _mm256_set1_ps, _mm256_fmadd_ps, CONS_X);
}
__attribute__((target("avx512f"))) static double fma_rate_avx512(long iters) {
    FMA12(__m512, _mm512_set1_ps, _mm512_fmadd_ps, CONS_V);
}
#endif
static double fma_rate(fa_cpu_isa id) {
    double best = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    for (int trial = 0; trial < 3; trial++) {
        const double g = id >= FA_CPU_ISA_AVX512F ? fma_rate_avx512(20 * 1000 * 1000)
                         : id == FA_CPU_ISA_AVX2 ? fma_rate_avx2(20 * 1000 * 1000) : 0;
        if (g > best) best = g;
    }
#else
    (void)id;
#endif
    return best;
}

void fa_cpu_measure_peak(int threads, double seconds, fa_cpu_peak *out) {
    memset(out, 0, sizeof *out);
    const fa_cpu_kernels *K = NULL;
    if (fa_cpu_kernels_select(&K, out->why, sizeof out->why) != FA_OK) return; /* rates stay 0, isa NULL */
    int nt = threads;
#ifdef _OPENMP
    if (nt <= 0) nt = omp_get_max_threads();
#else
    nt = 1;
#endif
    out->isa = K->isa;
    out->threads = nt;
    gemm_rate(K, nt, 0, seconds / 4); /* warm-up: clocks, pages */
    for (int w = 0; w < 4; w++) { /* the best of 4 windows: a shared machine's other jobs only slow a window down */
        const double g = gemm_rate(K, 1, 0, seconds / 4);
        if (g > out->fp32_1t) out->fp32_1t = g;
    }
    out->fp32 = gemm_rate(K, nt, 0, seconds);
    if (K->bf16_dot) out->bf16 = gemm_rate(K, nt, 1, seconds);
#ifdef FA_HAVE_CBLAS
    out->blas = blas_rate();
#endif
    fa_cpu_blas_describe(out->blas_info, sizeof out->blas_info);
    out->ghz = clock_ghz();
    out->fma_1t = fma_rate(K->id);
    out->lanes = K->id >= FA_CPU_ISA_AVX512F ? 16 : K->id == FA_CPU_ISA_AVX2 ? 8 : 1;
    if (out->ghz > 0) {
        const long u = lround((out->fma_1t > 0 ? out->fma_1t : out->fp32_1t) / (2.0 * out->lanes * out->ghz));
        out->fma_units = u < 1 ? 1 : (int)u;
        out->fp32_theory = 2.0 * out->lanes * out->fma_units * out->ghz * nt;
        out->bf16_theory = K->bf16_tiles ? 1024.0 * out->ghz * nt : K->bf16_dot ? 2 * out->fp32_theory : 0;
    }
}
