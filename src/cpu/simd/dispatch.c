/* Runtime choice of the CPU kernel level. Built with the baseline flags (no -mavx*): it runs before we know what the
 * CPU supports. Called once per context from fa_cpu_init; no state is kept here (the AMX permission is the kernel's
 * per-process state: asking again is a cheap no-op). docs/cpu-kernels.md, "Runtime dispatch". */
#if defined(__linux__)
#define _GNU_SOURCE /* syscall */
#endif
#include "cpu/simd/kernels.h"

#include <stdio.h>
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

int fa_cpu_amx_usable(const char **lack) {
    unsigned a, b, c, d;
    *lack = "the OS does not enable the extended state (no OSXSAVE)";
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE: xgetbv is allowed */
    *lack = "AMX-TILE and AMX-BF16 (CPUID)";
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    if (!(d & (1u << 22)) || !(d & (1u << 24))) return 0; /* AMX-BF16, AMX-TILE */
    *lack = "the OS's tile state (XCR0 bits 17-18)";
    if ((xcr0() & (3ull << 17)) != (3ull << 17)) return 0; /* XTILECFG, XTILEDATA enabled by the OS */
#if defined(__linux__) && defined(SYS_arch_prctl)
    /* Linux ≥ 5.16 hands out the 8 KiB tile state per process on request; without it the first tile instruction
     * faults. A kernel that refuses (or predates the call) leaves the avx512bf16 table. */
    *lack = "Linux's permission to use the tile data (arch_prctl ARCH_REQ_XCOMP_PERM refused)";
    unsigned long perm = 0;
    if (syscall(SYS_arch_prctl, FA_ARCH_GET_XCOMP_PERM, &perm) == 0 && (perm & (1ul << FA_XFEATURE_XTILEDATA)))
        return 1;
    if (syscall(SYS_arch_prctl, FA_ARCH_REQ_XCOMP_PERM, FA_XFEATURE_XTILEDATA) != 0) return 0;
    perm = 0;
    return syscall(SYS_arch_prctl, FA_ARCH_GET_XCOMP_PERM, &perm) == 0 && (perm & (1ul << FA_XFEATURE_XTILEDATA));
#else
    *lack = "an OS that grants the tile data (Linux >= 5.16)";
    return 0;
#endif
}
#endif

static const char *const level_names[FA_CPU_ISA_COUNT] = FA_CPU_ISA_NAMES("");

/* What each level needs, as the messages say it. */
static const char *const level_needs[FA_CPU_ISA_COUNT] = {
    "nothing", "AVX2, FMA and F16C", "AVX-512 F/BW/VL/DQ and FMA", "AVX-512 F/BW/VL/DQ, FMA and AVX512_BF16",
    "AVX-512 F/BW/VL/DQ, FMA, AVX512_BF16 and AMX-TILE/AMX-BF16"};

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
static int has_f16c(void) { /* CPUID.1:ECX bit 29 */
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

/* A level's feature test: on a miss, say which feature and fail. */
#define NEED(has, said)                                                                                        \
    do {                                                                                                       \
        if (!(has)) {                                                                                          \
            *lack = said;                                                                                      \
            return 0;                                                                                          \
        }                                                                                                      \
    } while (0)

/* 1 if this process can run level l; else 0 with *lack naming the first piece missing (each level includes the one
 * below it, checked first). __builtin_cpu_supports reports AVX and AVX-512 only where the OS saves their registers
 * (XCR0), so an OS without AVX-512 state gives the level below. */
static int level_ok(fa_cpu_isa l, const char **lack) {
    *lack = "";
    if (l == FA_CPU_ISA_SCALAR) return 1;
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
    if (!level_ok((fa_cpu_isa)(l - 1), lack)) return 0;
    switch (l) {
    case FA_CPU_ISA_AVX2:
        NEED(__builtin_cpu_supports("avx2"), "AVX2");
        NEED(__builtin_cpu_supports("fma"), "FMA");
        NEED(has_f16c(), "F16C"); /* the avx2 KV-cache kernel converts f16 with it (every AVX2 CPU has it) */
        return 1;
    case FA_CPU_ISA_AVX512F:
        NEED(__builtin_cpu_supports("avx512f"), "AVX-512 F");
        NEED(__builtin_cpu_supports("avx512bw"), "AVX-512 BW");
        NEED(__builtin_cpu_supports("avx512vl"), "AVX-512 VL");
        NEED(__builtin_cpu_supports("avx512dq"), "AVX-512 DQ");
        return 1;
    case FA_CPU_ISA_AVX512BF16: NEED(__builtin_cpu_supports("avx512bf16"), "AVX512_BF16"); return 1;
    case FA_CPU_ISA_AMX: return fa_cpu_amx_usable(lack);
    default: return 0;
    }
#else
    *lack = "an x86-64 build (this one has the portable kernels only)";
    return 0;
#endif
}

const fa_cpu_kernels *fa_cpu_kernels_level(fa_cpu_isa l, const char **lack) {
    if (!level_ok(l, lack)) return NULL;
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    switch (l) {
    case FA_CPU_ISA_AVX2: return &fa_cpu_kernels_avx2;
    case FA_CPU_ISA_AVX512F: return &fa_cpu_kernels_avx512f;
    case FA_CPU_ISA_AVX512BF16: return &fa_cpu_kernels_avx512bf16;
    case FA_CPU_ISA_AMX: return &fa_cpu_kernels_amx;
    default: break;
    }
#endif
    return &fa_cpu_kernels_scalar;
}

fa_status fa_cpu_kernels_select(const fa_cpu_kernels **out, char *why, size_t why_len) {
    *out = NULL;
    /* the highest level this process can run, and what the one above it lacks */
    fa_cpu_isa best = FA_CPU_ISA_SCALAR;
    const char *above = "", *lack;
    for (int l = FA_CPU_ISA_COUNT - 1; l > FA_CPU_ISA_SCALAR; l--) {
        if (level_ok((fa_cpu_isa)l, &lack)) {
            best = (fa_cpu_isa)l;
            break;
        }
        above = lack;
    }
    const char *pin = getenv("FA_CPU_ISA");
    if (!pin || !*pin) {
        if (best == FA_CPU_ISA_COUNT - 1)
            snprintf(why, why_len, "%s: the highest level; this CPU has %s", level_names[best], level_needs[best]);
        else
            snprintf(why, why_len, "%s: this CPU has %s; not %s: no %s", level_names[best], level_needs[best],
                     level_names[best + 1], above);
        *out = fa_cpu_kernels_level(best, &lack);
        return FA_OK;
    }
    int l = 0;
    while (l < FA_CPU_ISA_COUNT && strcmp(pin, level_names[l])) l++;
    if (l == FA_CPU_ISA_COUNT) {
        snprintf(why, why_len,
                 "FA_CPU_ISA=%s is not a CPU kernel level: scalar, avx2, avx512f (AVX-512 F/BW/VL/DQ), avx512bf16 "
                 "(and AVX512_BF16) or amx (and AMX-BF16 tiles)%s",
                 pin, strcmp(pin, "avx512") ? "" : "; avx512 is now avx512f or avx512bf16");
        return FA_ERR_INVALID_ARGUMENT;
    }
    *out = fa_cpu_kernels_level((fa_cpu_isa)l, &lack);
    if (!*out) {
        snprintf(why, why_len, "FA_CPU_ISA=%s: this CPU cannot run that level: no %s (the highest level it has is %s)",
                 pin, lack, level_names[best]);
        return FA_ERR_UNSUPPORTED;
    }
    snprintf(why, why_len, "%s: pinned by FA_CPU_ISA (the highest level this CPU has is %s)", level_names[l],
             level_names[best]);
    return FA_OK;
}
