/* 2^x on the FMA pipe, for the part of the FLASH3 backward's Pᵀ = exp2(…) (and the forward's P) not given to MUFU (16
 * ex2 per clock per SM, against 128 FMA): Cody–Waite, x = n + f with n = floor(x), f in [0, 1]; 2^f by a degree-3
 * polynomial in Horner form; 2^n built from n's bits and multiplied in. C and CUDA: tests/test_exp2_poly.c checks this
 * same code on the host against exp2 in double (max relative error 8.6e-5 = 2^-13.5, below f16's rounding of Pᵀ,
 * 2^-11). What MUFU's ex2.approx.ftz gives, it gives for x <= 0: 2^x normal down to x = −126, +0 below it (its
 * denormals flushed) and for −inf, NaN for NaN; x > 0, which Pᵀ only reaches by rounding, is taken as 0 (1, not 2^x). */
#ifndef FA_WGMMA_EXP2_POLY_H
#define FA_WGMMA_EXP2_POLY_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define FA_EXP2_HD __host__ __device__ __forceinline__
#else
#define FA_EXP2_HD static inline
#endif

/* p(f) = 1 + c1 f + c2 f² + c3 f³: minimax in the relative error on [0, 1] with p(0) = 1 held, so that integers are
 * exact (Remez exchange, bench/lab/exp2_poly_fit.py). */
#define FA_EXP2_C1 0.695116758f
#define FA_EXP2_C2 0.227644995f
#define FA_EXP2_C3 0.0770670399f
/* 1.5·2^23 + 127: x + M lands where a float's unit is 1, so its low mantissa bits are floor(x) + 127, the biased
 * exponent of 2^floor(x) */
#define FA_EXP2_M 12583039.0f

/* x clamped to [−127, 0], NaN kept (fminf / fmaxf would drop it): on the device one max.NaN and one min.NaN. */
FA_EXP2_HD float fa3_exp2_clamp(float x) {
#ifdef __CUDA_ARCH__
    float y;
    asm("max.NaN.f32 %0, %1, 0fC2FE0000;\n\tmin.NaN.f32 %0, %0, 0f00000000;\n" : "=f"(y) : "f"(x)); /* −127, 0 */
    return y;
#else
    return x != x ? x : fminf(fmaxf(x, -127.f), 0.f);
#endif
}

FA_EXP2_HD float fa3_exp2_poly(float x) {
    x = fa3_exp2_clamp(x);
    /* t = M + floor(x), exactly. The device rounds the add down (an FMA-pipe add; floorf would take FRND, which
     * runs at MUFU's rate); the host's floorf then adds exactly: the same t. */
#ifdef __CUDA_ARCH__
    const float t = __fadd_rd(x, FA_EXP2_M);
#else
    const float t = floorf(x) + FA_EXP2_M;
#endif
    const float f = x - (t - FA_EXP2_M); /* in [0, 1]: exact, or 1 where x rounds up to floor(x) + 1 */
    const float p = fmaf(fmaf(fmaf(FA_EXP2_C3, f, FA_EXP2_C2), f, FA_EXP2_C1), f, 1.f);
    /* 2^n as a float: its biased exponent n + 127 is t's low 9 bits, shifted up. n = −127 (x < −126) gives the bits
     * of +0, so p·2^n flushes to 0 as ex2.approx.ftz does; p·2^n is exact otherwise; a NaN p stays NaN. */
    uint32_t tb;
    memcpy(&tb, &t, 4);
    tb <<= 23;
    float s;
    memcpy(&s, &tb, 4);
    return p * s;
}

/* Whether accumulator register i takes exp2 on the FMA pipe (fa3_exp2_poly) when POLY of every 8 do: ranked so that
 * each row's pass through a group (registers 0, 1, 4, 5, then 2, 3, 6, 7) mixes both pipes. */
#ifdef __CUDACC__
__host__ __device__ constexpr bool fa3_poly_reg(int i, int POLY) {
    constexpr int rank[8] = {4, 0, 7, 3, 6, 2, 5, 1}; /* POLY = 2: registers 1, 7; 4: 1, 3, 5, 7 */
    return rank[i % 8] < POLY;
}
#endif

#endif
