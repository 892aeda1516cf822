/* The BLAS's own thread control, found at run time (dlsym), so that STANDARD through BLAS never oversubscribes the
 * cores with our OpenMP team and either OpenBLAS build (pthread or OpenMP) runs the thread count asked for.
 * Without such a BLAS (or its symbols) the calls do nothing. docs/cpu-kernels.md, "BLAS threads". */
#ifndef FA_CPU_BLAS_H
#define FA_CPU_BLAS_H

#include <stddef.h>

/* Set the BLAS's process-wide thread count (OpenBLAS pthread build); returns the previous one, or 0 when there is
 * none to set (no such BLAS; the OpenMP build, which follows the calling task's nthreads-var instead). */
int fa_cpu_blas_set_threads(int n);
/* "OpenBLAS 0.3.21 ... (pthread build, 2 threads)", or "none" when no BLAS with that API is loaded. */
void fa_cpu_blas_describe(char *buf, size_t n);

#endif
