/* Runtime choice of the CPU tile-kernel table. Built with the baseline flags (no -mavx*): it runs before we know
 * what the CPU supports. Called once per context from fa_cpu_init; no state is kept here. */
#include "cpu/simd/kernels.h"

#include <stdlib.h>
#include <string.h>

const fa_cpu_kernels *fa_cpu_kernels_select(void) {
    /* FA_CPU_ISA caps the choice (tests run every table on one machine); unknown values are ignored. */
    const char *cap = getenv("FA_CPU_ISA");
    int max_level = 2; /* 0 scalar, 1 avx2, 2 avx512 */
    if (cap) {
        if (!strcmp(cap, "scalar")) max_level = 0;
        else if (!strcmp(cap, "avx2")) max_level = 1;
    }
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
    if (max_level >= 2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("fma"))
        return &fa_cpu_kernels_avx512;
    if (max_level >= 1 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return &fa_cpu_kernels_avx2;
#else
    (void)max_level;
#endif
    return &fa_cpu_kernels_scalar;
}
