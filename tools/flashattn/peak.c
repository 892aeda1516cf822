/* Matmul ceilings of this machine (see peak.h): the micro-kernel repeated on a tile that stays in cache, one copy per
 * thread, timed between two barriers. Test and benchmark code: it reads the library's internal kernel table. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "peak.h"

#include "cpu/blas.h"
#include "cpu/simd/kernels.h"

#include <math.h>
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

/* GHz of this core: 8 dependent integer adds per iteration retire in 8 cycles on every x86-64 core. */
static double clock_ghz(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    const long iters = 20 * 1000 * 1000;
    long x = 0;
    double best = 0;
    for (int trial = 0; trial < 3; trial++) {
        double t0 = fa_cpu_seconds();
        for (long i = 0; i < iters; i++)
            __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
                             "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
        double g = 8.0 * (double)iters / (fa_cpu_seconds() - t0) * 1e-9;
        if (g > best) best = g;
    }
    return best;
#else
    return 0;
#endif
}

void fa_cpu_measure_peak(int threads, double seconds, fa_cpu_peak *out) {
    const fa_cpu_kernels *K = fa_cpu_kernels_select();
    int nt = threads;
#ifdef _OPENMP
    if (nt <= 0) nt = omp_get_max_threads();
#else
    nt = 1;
#endif
    memset(out, 0, sizeof *out);
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
    out->lanes = K->id >= FA_CPU_ISA_AVX512 ? 16 : K->id == FA_CPU_ISA_AVX2 ? 8 : 1;
    if (out->ghz > 0) {
        const long u = lround(out->fp32_1t / (2.0 * out->lanes * out->ghz));
        out->fma_units = u < 1 ? 1 : (int)u;
        out->fp32_theory = 2.0 * out->lanes * out->fma_units * out->ghz * nt;
        out->bf16_theory = K->bf16_tiles ? 1024.0 * out->ghz * nt : K->bf16_dot ? 2 * out->fp32_theory : 0;
    }
}
