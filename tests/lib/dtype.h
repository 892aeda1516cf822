/* Test-side element access: fp32, fp16 and bf16 read exactly into double and written with one round-to-nearest-even
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

static inline double t_load(const void *base, fa_dtype dt, int64_t i) {
    switch (dt) {
    case FA_DTYPE_F32: return ((const float *)base)[i];
    case FA_DTYPE_F16: return t_decode_bits(((const uint16_t *)base)[i], 11, 5, -14);
    default: return t_decode_bits(((const uint16_t *)base)[i], 8, 8, -126);
    }
}

static inline void t_store(void *base, fa_dtype dt, int64_t i, double x) {
    switch (dt) {
    case FA_DTYPE_F32: ((float *)base)[i] = (float)x; break;
    case FA_DTYPE_F16: ((uint16_t *)base)[i] = (uint16_t)t_encode_bits(x, 11, 5, -14); break;
    default: ((uint16_t *)base)[i] = (uint16_t)t_encode_bits(x, 8, 8, -126); break;
    }
}

/* The quiet NaN every poisoned element holds (f32 0x7fc00000, f16 0x7e00, bf16 0x7fc0). */
static inline void t_store_nan(void *p, fa_dtype dt) {
    if (dt == FA_DTYPE_F32) {
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
