/* Kernel selection for builds without the SIMD kernel files (src/cpu/sources.cmake absent): scalar only. */
#include "cpu/kernels.h"

const fa_cpu_kernels *fa_cpu_kernels_select(void) { return &fa_cpu_kernels_scalar; }
