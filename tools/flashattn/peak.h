/* The machine's matmul ceilings, measured with our own micro-kernel (and the system BLAS when linked), so that a
 * benchmark table can show "% of peak". Used by `flashattn bench --peak` and the kernel lab (bench/cpu_kernels.c). */
#ifndef FA_TOOLS_PEAK_H
#define FA_TOOLS_PEAK_H

typedef struct fa_cpu_peak {
    const char *isa;   /* the kernel level that ran; NULL when the selector refused (FA_CPU_ISA), with `why` */
    char why[256];     /* the selector's sentence: what it picked and why, or why it refused */
    int threads;
    double fp32;       /* GFLOP/s of the fp32 register-blocked micro-kernel on all threads (60x64, k = 128, in L1/L2) */
    double fp32_1t;    /* the same on one thread */
    double bf16;       /* bf16 dot-product kernel on all threads, 0 when the CPU has none */
    double blas;       /* system sgemm 4096³, 0 when no BLAS is linked */
    /* The theoretical ceiling the rates are read against: clock (GHz, a chain of dependent integer adds on one
     * core, under load), fp32 lanes of the table's vectors, FMA units per core (the whole number nearest the rate of
     * register-only FMAs on one thread / (2 · lanes · clock): measured, not looked up; without such a loop, the
     * 1-thread micro-kernel rate), and the products of these. */
    double ghz;
    double fma_1t;       /* GFLOP/s of register-only FMAs of the table's width, one thread (0: not measured) */
    int lanes, fma_units;
    double fp32_theory;  /* 2 · lanes · units · ghz · threads */
    double bf16_theory;  /* bf16 at twice the fp32 rate (vdpbf16ps), 1024 flop/cycle/core with AMX tiles; 0 = none */
    char blas_info[160]; /* which BLAS, which build, how many threads (cpu/blas.h) */
} fa_cpu_peak;

/* Runs for about 4 · seconds (plus the BLAS GEMM). threads <= 0: all. */
void fa_cpu_measure_peak(int threads, double seconds, fa_cpu_peak *out);

/* Seconds on the monotonic clock: the one timer of the peak measurement, the kernel lab and the CLI. */
double fa_cpu_seconds(void);

#endif
