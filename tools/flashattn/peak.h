/* The machine's matmul ceilings, measured with our own micro-kernel (and the system BLAS when linked), so that a
 * benchmark table can show "% of peak". Used by `flashattn bench --peak` and the kernel lab (bench/cpu_kernels.c). */
#ifndef FA_TOOLS_PEAK_H
#define FA_TOOLS_PEAK_H

typedef struct fa_cpu_peak {
    const char *isa;   /* the kernel table that ran */
    int threads;
    double fp32;       /* GFLOP/s of the fp32 register-blocked micro-kernel on all threads (60x64, k = 128, in L1/L2) */
    double fp32_1t;    /* the same on one thread */
    double bf16;       /* bf16 dot-product kernel on all threads, 0 when the CPU has none */
    double blas;       /* system sgemm 4096³, 0 when no BLAS is linked */
} fa_cpu_peak;

/* Runs for about 4 · seconds (plus the BLAS GEMM). threads <= 0: all. */
void fa_cpu_measure_peak(int threads, double seconds, fa_cpu_peak *out);

/* Seconds on the monotonic clock: the one timer of the peak measurement, the kernel lab and the CLI. */
double fa_cpu_seconds(void);

#endif
