/* Always-inline AVX-512 F helpers shared by the AVX-512 table files (simd/avx512.c, simd/avx512bf16.c): each file
 * compiles them with its own flags, so the avx512f level's code never meets an AVX512_BF16 instruction. Include
 * only from files built with at least -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma. */
#ifndef FA_CPU_SIMD_AVX512_INL_H
#define FA_CPU_SIMD_AVX512_INL_H

#include <immintrin.h>
#include <stddef.h>

#define AI static inline __attribute__((always_inline))

/* ---- the accumulator block of the register-blocked micro-kernels ---- */

/* The MR × NV accumulator block of a micro-kernel: loaded from C (acc) or zeroed, and stored back; the last vector
 * of each row uses mask `tail`. Shared by the fp32 and the bf16 kernels. */
AI void acc_load(const int MR, const int NV, const float *restrict C, ptrdiff_t ldc, int acc, __mmask16 tail,
                 __m512 c[6][4]) {
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            __mmask16 mk = v == NV - 1 ? tail : (__mmask16)0xffff;
            c[i][v] = acc ? _mm512_maskz_loadu_ps(mk, C + i * ldc + 16 * v) : _mm512_setzero_ps();
        }
}

AI void acc_store(const int MR, const int NV, float *restrict C, ptrdiff_t ldc, __mmask16 tail, __m512 c[6][4]) {
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            __mmask16 mk = v == NV - 1 ? tail : (__mmask16)0xffff;
            _mm512_mask_storeu_ps(C + i * ldc + 16 * v, mk, c[i][v]);
        }
}


/* ---- 16 × 16 transpose (4 stages of 16 shuffles) ---- */

AI void transpose16(__m512 r[16]) {
    __m512 a[16], b[16];
    for (int i = 0; i < 16; i += 2) {
        a[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        a[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 4; g++) { /* rows 4g..4g+3: b[4g + j] holds columns j, j+4, j+8, j+12 */
        __m512d x0 = _mm512_castps_pd(a[4 * g]), x1 = _mm512_castps_pd(a[4 * g + 1]);
        __m512d x2 = _mm512_castps_pd(a[4 * g + 2]), x3 = _mm512_castps_pd(a[4 * g + 3]);
        b[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(x0, x2));
        b[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x0, x2));
        b[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(x1, x3));
        b[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(x1, x3));
    }
    for (int j = 0; j < 4; j++) {
        __m512 clo = _mm512_shuffle_f32x4(b[j], b[4 + j], 0x88), chi = _mm512_shuffle_f32x4(b[j], b[4 + j], 0xdd);
        __m512 dlo = _mm512_shuffle_f32x4(b[8 + j], b[12 + j], 0x88), dhi = _mm512_shuffle_f32x4(b[8 + j], b[12 + j], 0xdd);
        r[j] = _mm512_shuffle_f32x4(clo, dlo, 0x88);
        r[j + 8] = _mm512_shuffle_f32x4(clo, dlo, 0xdd);
        r[j + 4] = _mm512_shuffle_f32x4(chi, dhi, 0x88);
        r[j + 12] = _mm512_shuffle_f32x4(chi, dhi, 0xdd);
    }
}

/* ---- exp2: n = round(x), f = x − n ∈ [−½, ½], 2^f by a degree-5 fit at Chebyshev nodes
 * (max rel. error 2.5e-7; the constant term is exactly 1, so 2^0 = 1 exactly), result = p · 2ⁿ by vscalefps. x is clamped at −160 so −∞ gives exactly 0. ---- */

/* 2^x for finite x (no clamp: vscalefps takes exponents far below −126 to 0). */
AI __m512 exp2_finite(__m512 x) {
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.338130212e-03f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.666368365e-03f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550381169e-02f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402234972e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931471825e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

AI __m512 exp2_ps(__m512 x) { return exp2_finite(_mm512_max_ps(x, _mm512_set1_ps(-160.0f))); }

/* Word permutation interleaving the low 16 words (row 2w) with the high 16 (row 2w + 1): dword q = (lo[q], hi[q]). */
AI __m512i pair_index(void) {
    return _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                            23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
}

#endif
