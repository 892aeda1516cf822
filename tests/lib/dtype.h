/* Test-side element access: fp32, fp16, bf16 and E4M3 read exactly into double and written with one round-to-nearest-even
 * from double. Written independently of the library's own conversions (src/core/half.h), so a bug there cannot
 * hide itself in the oracle's inputs or in the comparison of outputs. */
#ifndef FA_TESTLIB_DTYPE_H
#define FA_TESTLIB_DTYPE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "flashattn.h"

/* A binary format with p significand bits (the implicit one included), ebits exponent bits and minimum normal
 * exponent emin: fp16 is (11, 5, -14), bf16 is (8, 8, -126). */
static inline double t_decode_bits(uint32_t u, int p, int ebits, int emin) {
    uint32_t frac = u & ((1u << (p - 1)) - 1), bexp = (u >> (p - 1)) & ((1u << ebits) - 1);
    double v;
    if (bexp == (1u << ebits) - 1) v = frac ? NAN : INFINITY;
    else if (bexp == 0) v = ldexp((double)frac, emin - (p - 1));
    else v = ldexp((double)(frac | (1u << (p - 1))), (int)bexp - 1 + emin - (p - 1));
    return (u >> (p - 1 + ebits)) & 1u ? -v : v;
}

static inline uint32_t t_encode_bits(double x, int p, int ebits, int emin) {
    const int emax = (1 << (ebits - 1)) - 1;
    const uint32_t sign = signbit(x) ? 1u << (p - 1 + ebits) : 0, inf = ((1u << ebits) - 1) << (p - 1);
    if (isnan(x)) return sign | inf | (1u << (p - 2));
    double a = fabs(x);
    if (isinf(a)) return sign | inf;
    int e;
    frexp(a, &e);                             /* a in [2^(e-1), 2^e) */
    int ex = e - 1 < emin ? emin : e - 1;     /* exponent of the leading place; subnormals share emin */
    double m = nearbyint(ldexp(a, p - 1 - ex)); /* significand in units of the last place, rounded to even */
    if (m >= ldexp(1.0, p)) m = ldexp(1.0, p - 1), ex++; /* the rounding carried into the next binade */
    if (ex > emax) return sign | inf;
    if (m < ldexp(1.0, p - 1)) return sign | (uint32_t)m; /* subnormal or zero */
    return sign | ((uint32_t)(ex - emin + 1) << (p - 1)) | ((uint32_t)m - (1u << (p - 1)));
}

/* E4M3 "fn" (FA_DTYPE_F8_E4M3): bias 7, no infinities, exponent 15 holds normal numbers but 0x7f/0xff are NaN. */
static inline double t_decode_e4m3(uint8_t u) {
    if ((u & 0x7f) == 0x7f) return NAN;
    const int e = (u >> 3) & 15, m = u & 7;
    const double v = e ? ldexp(8.0 + m, e - 10) : ldexp((double)m, -9);
    return (u & 0x80) ? -v : v;
}

static inline double t_load(const void *base, fa_dtype dt, int64_t i) {
    switch (dt) {
    case FA_DTYPE_F32: return ((const float *)base)[i];
    case FA_DTYPE_F8_E4M3: return t_decode_e4m3(((const uint8_t *)base)[i]);
    case FA_DTYPE_F16: return t_decode_bits(((const uint16_t *)base)[i], 11, 5, -14);
    default: return t_decode_bits(((const uint16_t *)base)[i], 8, 8, -126);
    }
}

/* x to E4M3 "fn" rounded to nearest even, saturating at ±448 (as fa_quantize_fp8); NaN is 0x7f with x's sign. Rounds
 * in the binade of x, then re-reads the binade of the rounded value (a carry may move it up one). */
static inline uint8_t t_encode_e4m3(double x) {
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return (uint8_t)(sign | 0x7f);
    if (fabs(x) >= 448) return (uint8_t)(sign | 0x7e);
    double a = fabs(x);
    int e;
    frexp(a, &e);
    const int ex = e - 1 < -6 ? -6 : e - 1;
    double m = nearbyint(ldexp(a, 3 - ex)); /* units of the last place of a's binade */
    const double v = ldexp(m, ex - 3);      /* the rounded value, maybe 2^(ex+1) */
    if (v >= 448) return (uint8_t)(sign | 0x7e);
    frexp(v, &e);
    if (v == 0) return sign;
    const int ev = e - 1 < -6 ? -6 : e - 1;
    const int mm = (int)ldexp(v, 3 - ev); /* 8..15 normal, 1..7 subnormal */
    return (uint8_t)(sign | (mm >= 8 ? ((ev + 7) << 3) | (mm - 8) : mm));
}

static inline void t_store(void *base, fa_dtype dt, int64_t i, double x) {
    switch (dt) {
    case FA_DTYPE_F32: ((float *)base)[i] = (float)x; break;
    case FA_DTYPE_F8_E4M3: ((uint8_t *)base)[i] = t_encode_e4m3(x); break;
    case FA_DTYPE_F16: ((uint16_t *)base)[i] = (uint16_t)t_encode_bits(x, 11, 5, -14); break;
    default: ((uint16_t *)base)[i] = (uint16_t)t_encode_bits(x, 8, 8, -126); break;
    }
}

/* The quiet NaN every poisoned element holds (f32 0x7fc00000, f16 0x7e00, bf16 0x7fc0, e4m3 0x7f). */
static inline void t_store_nan(void *p, fa_dtype dt) {
    if (dt == FA_DTYPE_F8_E4M3) {
        *(uint8_t *)p = 0x7f;
    } else if (dt == FA_DTYPE_F32) {
        uint32_t u = 0x7fc00000u;
        memcpy(p, &u, 4);
    } else {
        uint16_t u = dt == FA_DTYPE_F16 ? 0x7e00u : 0x7fc0u;
        memcpy(p, &u, 2);
    }
}

static inline float t_nanf(void) {
    float f;
    t_store_nan(&f, FA_DTYPE_F32);
    return f;
}

#endif
