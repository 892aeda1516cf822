/* FP8 E4M3 ("fn": no infinities, NaN = 0x7f/0xff, largest finite 448) conversions and the sign/rotation rules that
 * fa_quantize_fp8 uses, written once for the host and the CUDA kernels (FA_FP8_FN) so that both give the same bits:
 * every step is float64 additions, subtractions, one multiplication or one division, rounded by IEEE rules, with no
 * expression nvcc could contract into an FMA. docs/numerics.md ("FP8"). */
#ifndef FA_CORE_FP8_H
#define FA_CORE_FP8_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define FA_FP8_FN static __host__ __device__ __forceinline__
#else
#define FA_FP8_FN static inline
#endif

#define FA_FP8_MAX 448.0

/* The exact value of an E4M3 byte (NaN for 0x7f and 0xff). */
FA_FP8_FN double fa_e4m3_to_f64(uint8_t b) {
    const int e = (b >> 3) & 15, m = b & 7;
    double v;
    if (e == 15 && m == 7) return NAN;
    if (e == 0) v = ldexp((double)m, -9);              /* subnormal: m · 2^-9 */
    else v = ldexp((double)(8 + m), e - 10);           /* (1 + m/8) · 2^(e-7) */
    return (b & 0x80) ? -v : v;
}

/* The same value in fp32 from its bits (exact: 4 significant bits), without the float64 of fa_e4m3_to_f64: what
 * decoding from an FP8 KV cache converts each element with. */
FA_FP8_FN float fa_e4m3_to_f32(uint8_t b) {
    const uint32_t e = (b >> 3) & 15, m = b & 7, sign = (uint32_t)(b & 0x80) << 24;
    if (e == 15 && m == 7) return (b & 0x80) ? -NAN : NAN;
    if (e == 0) return (b & 0x80) ? -(float)m * 0x1p-9f : (float)m * 0x1p-9f; /* subnormal: m · 2^-9 */
    const uint32_t bits = sign | (e + 120) << 23 | m << 20;                    /* rebias 7 -> 127 */
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* x rounded to nearest-even in E4M3, saturating: |x| >= 448 (inf included) gives ±448, NaN gives 0x7f with x's sign. */
FA_FP8_FN uint8_t fa_f64_to_e4m3(double x) {
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return (uint8_t)(sign | 0x7f);
    const double a = fabs(x);
    if (a >= FA_FP8_MAX) return (uint8_t)(sign | 0x7e);
    if (a < 0x1p-6) return (uint8_t)(sign | (uint8_t)rint(a * 0x1p9)); /* subnormal; 8 carries into 2^-6 exactly */
    int ex;
    frexp(a, &ex);
    ex -= 1;                                        /* a in [2^ex, 2^(ex+1)), ex in -6..8 */
    double m = rint(ldexp(a, 3 - ex));              /* 8..16: the significand in units of the last place */
    if (m == 16.0) m = 8.0, ex += 1;                /* rounding carried into the next binade (a < 448: ex stays <= 8) */
    return (uint8_t)(sign | ((ex + 7) << 3) | ((int)m - 8));
}

/* The random sign of column j for a seed (splitmix64 of seed and j): the same on every device and for q and k. */
FA_FP8_FN double fa_hadamard_sign(uint64_t seed, int64_t j) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (uint64_t)(j + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (z & 1) ? -1.0 : 1.0;
}

/* In place on n (a power of two) doubles: x ← H·diag(s)·x / sqrt(n), the butterflies in one fixed order. */
FA_FP8_FN void fa_hadamard_row(double *x, int64_t n, uint64_t seed) {
    for (int64_t j = 0; j < n; j++) x[j] = x[j] * fa_hadamard_sign(seed, j);
    for (int64_t h = 1; h < n; h *= 2)
        for (int64_t i = 0; i < n; i += 2 * h)
            for (int64_t j = i; j < i + h; j++) {
                const double a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    const double norm = 1.0 / sqrt((double)n);
    for (int64_t j = 0; j < n; j++) x[j] = x[j] * norm;
}

/* The descale of a block from its amax over finite values, first rounded to fp32 (so that a per-tensor amax, the
 * maximum of the blocks' fp32 amaxes, gives the same bits on every device): amax / 448 in fp32, 1 where that is 0 (an
 * all-zero or all-NaN block, or an amax so small the quotient underflows). */
FA_FP8_FN float fa_fp8_descale(float amax) {
    const float d = (float)((double)amax / FA_FP8_MAX);
    return d > 0 ? d : 1.0f;
}

#endif
