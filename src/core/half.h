/* fp16 / bf16 <-> fp32 conversions (FP8 E4M3: core/fp8.h) (round to nearest even), portable C. Internal; also used by tests and tools. */
#ifndef FA_HALF_H
#define FA_HALF_H

#include "core/fp8.h"

#include <stdint.h>
#include <string.h>

static inline float fa_bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t fa_f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float fa_bf16_to_f32(uint16_t h) { return fa_bits_to_f32((uint32_t)h << 16); }
static inline uint16_t fa_f32_to_bf16(float f) {
    uint32_t u = fa_f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float fa_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return fa_bits_to_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) { /* zero or subnormal: man * 2^-24 */
        float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    return fa_bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}
static inline uint16_t fa_f32_to_f16(float f) {
    uint32_t u = fa_f32_to_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);          /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);         /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {                                          /* below 2^-14: subnormal or zero */
        float m = fa_bits_to_f32(a) * 16777216.0f;                   /* exact: value in units of 2^-24 */
        uint32_t r = (uint32_t)m; float frac = m - (float)r;
        if (frac > 0.5f || (frac == 0.5f && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    a += 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | ((a - 0x38000000u) >> 13));
}

/* Element i of a tensor's data as float / double, and storing a float. */
static inline float fa_load_elem(const void *base, int dtype, int64_t i) {
    switch (dtype) {
    case 0: return ((const float *)base)[i];
    case 1: return fa_f16_to_f32(((const uint16_t *)base)[i]);
    case 3: return (float)fa_e4m3_to_f64(((const uint8_t *)base)[i]); /* exact */
    default: return fa_bf16_to_f32(((const uint16_t *)base)[i]);
    }
}
static inline void fa_store_elem(void *base, int dtype, int64_t i, float x) {
    switch (dtype) {
    case 0: ((float *)base)[i] = x; break;
    case 1: ((uint16_t *)base)[i] = fa_f32_to_f16(x); break;
    case 3: ((uint8_t *)base)[i] = fa_f64_to_e4m3(x); break;
    default: ((uint16_t *)base)[i] = fa_f32_to_bf16(x); break;
    }
}
#endif
