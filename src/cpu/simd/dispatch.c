/* Runtime choice of the CPU tile-kernel table. Built with the baseline flags (no -mavx*): it runs before we know
 * what the CPU supports. Called once per context from fa_cpu_init; no state is kept here (the AMX permission is
 * the kernel's per-process state: asking again is a cheap no-op). docs/cpu-kernels.md, "Dispatch". */
#if defined(__linux__)
#define _GNU_SOURCE /* syscall */
#endif
#include "cpu/simd/kernels.h"

#include <stdlib.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* Linux arch_prctl codes for dynamically enabled state (arch/x86/include/uapi/asm/prctl.h) and the tile-data
 * feature number (XCR0 bit 18). */
#define FA_ARCH_GET_XCOMP_PERM 0x1022
#define FA_ARCH_REQ_XCOMP_PERM 0x1023
#define FA_XFEATURE_XTILEDATA 18

static unsigned long long xcr0(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

int fa_cpu_amx_usable(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE: xgetbv is allowed */
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    if (!(d & (1u << 22)) || !(d & (1u << 24))) return 0;               /* AMX-BF16, AMX-TILE */
    if ((xcr0() & (3ull << 17)) != (3ull << 17)) return 0;               /* XTILECFG, XTILEDATA enabled by the OS */
#if defined(__linux__) && defined(SYS_arch_prctl)
    /* Linux ≥ 5.16 hands out the 8 KiB tile state per process on request; without it the first tile instruction
     * faults. A kernel that refuses (or predates the call) leaves the avx512 table. */
    unsigned long perm = 0;
    if (syscall(SYS_arch_prctl, FA_ARCH_GET_XCOMP_PERM, &perm) == 0 && (perm & (1ul << FA_XFEATURE_XTILEDATA)))
        return 1;
    if (syscall(SYS_arch_prctl, FA_ARCH_REQ_XCOMP_PERM, FA_XFEATURE_XTILEDATA) != 0) return 0;
    perm = 0;
    return syscall(SYS_arch_prctl, FA_ARCH_GET_XCOMP_PERM, &perm) == 0 && (perm & (1ul << FA_XFEATURE_XTILEDATA));
#else
    return 0;
#endif
}
#endif

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
static int has_f16c(void) { /* CPUID.1:ECX bit 29 */
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

const fa_cpu_kernels *fa_cpu_kernels_select(void) {
    /* FA_CPU_ISA caps the choice (tests run every table on one machine); unknown values are ignored. */
    const char *cap = getenv("FA_CPU_ISA");
    int max_level = 3; /* 0 scalar, 1 avx2, 2 avx512, 3 amx */
    if (cap) {
        if (!strcmp(cap, "scalar")) max_level = 0;
        else if (!strcmp(cap, "avx2")) max_level = 1;
        else if (!strcmp(cap, "avx512")) max_level = 2;
    }
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
    const int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                       __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("fma");
    if (max_level >= 3 && avx512 && fa_cpu_amx_usable()) return &fa_cpu_kernels_amx;
    if (max_level >= 2 && avx512) return &fa_cpu_kernels_avx512;
    if (max_level >= 1 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c())
        return &fa_cpu_kernels_avx2; /* the avx2 kvcache kernel converts f16 with F16C (every AVX2 CPU has it) */
#else
    (void)max_level;
#endif
    return &fa_cpu_kernels_scalar;
}
