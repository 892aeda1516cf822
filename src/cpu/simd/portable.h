/* Portable C versions of the tile-kernel entries (simd/kernels.h), written so that gcc -O3 vectorises the inner
 * loops for whatever ISA flags the including file is built with: the scalar table (baseline x86-64 / any
 * CPU) and the AVX2 table include this header. Same sums, same exp2 polynomial as the AVX-512 table. */
#ifndef FA_CPU_SIMD_PORTABLE_H
#define FA_CPU_SIMD_PORTABLE_H

#include "cpu/simd/kernels.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* 2^x: n = round(x), f = x − n, degree-5 fit of 2^f on [−½, ½] (max rel. error 2.5e-7; the constant term is exactly 1, so 2^0 = 1 exactly); x < −126 gives 0
 * (covers −∞; such weights are below 2^−126 of the row maximum). */
static inline float fa_port_exp2(float x) {
    float y = x > -126.0f ? x : -126.0f;
    y = y < 127.0f ? y : 127.0f;
    float n = (y + 12582912.0f) - 12582912.0f; /* round to nearest (1.5·2^23 shifter) */
    float f = y - n;
    float p = 1.338130212e-03f;
    p = p * f + 9.666368365e-03f;
    p = p * f + 5.550381169e-02f;
    p = p * f + 2.402234972e-01f;
    p = p * f + 6.931471825e-01f;
    p = p * f + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &e, 4);
    return x > -126.0f ? p * s : 0.0f;
}

static inline float fa_port_bf16(float x) { /* round to nearest even, as vcvtne2ps2bf16 (NaN not expected) */
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

static inline void port_gemm_nn(int m, int n, int k, const float *A, ptrdiff_t rsa, ptrdiff_t csa, const float *B, int ldb,
                         float *C, int ldc, int acc) {
    for (int i = 0; i < m; i++) {
        float *restrict c = C + (ptrdiff_t)i * ldc;
        if (!acc)
            for (int j = 0; j < n; j++) c[j] = 0;
        for (int p = 0; p < k; p++) {
            float a = A[i * rsa + p * csa];
            const float *restrict b = B + (ptrdiff_t)p * ldb;
            for (int j = 0; j < n; j++) c[j] = fmaf(a, b[j], c[j]); /* the FMA chain of the SIMD tables */
        }
    }
}

static inline void port_pack_t(int rows, int cols, const float *src, int lds, float *dst, int ldd, float mul) {
    for (int c = 0; c < cols; c++)
        for (int r = 0; r < rows; r++) dst[(ptrdiff_t)c * ldd + r] = mul * src[(ptrdiff_t)r * lds + c];
}

static inline void port_softmax_step_t(int nk, int nq, float *S, int lds, float c, float *m, float *l, float *alpha) {
    float *restrict mx = alpha; /* alpha holds the new maxima until the end */
    for (int q = 0; q < nq; q++) mx[q] = m[q];
    for (int r = 0; r < nk; r++) {
        const float *restrict s = S + (ptrdiff_t)r * lds;
        for (int q = 0; q < nq; q++) mx[q] = s[q] > mx[q] ? s[q] : mx[q];
    }
    float sub[64], sum[64];
    for (int q0 = 0; q0 < nq; q0 += 64) {
        int nb = nq - q0 < 64 ? nq - q0 : 64;
        for (int q = 0; q < nb; q++) {
            sub[q] = mx[q0 + q] == -INFINITY ? 0.0f : mx[q0 + q];
            sum[q] = 0;
        }
        for (int r = 0; r < nk; r++) {
            float *restrict s = S + (ptrdiff_t)r * lds + q0;
            for (int q = 0; q < nb; q++) {
                float e = fa_port_exp2((s[q] - sub[q]) * c);
                s[q] = e;
                sum[q] += e;
            }
        }
        for (int q = 0; q < nb; q++) {
            float a = fa_port_exp2((m[q0 + q] - sub[q]) * c);
            m[q0 + q] = mx[q0 + q];
            l[q0 + q] = l[q0 + q] * a + sum[q];
            alpha[q0 + q] = a;
        }
    }
}

static inline void port_exp_rows(int rows, int cols, float *S, int lds, float c, const float *sub) {
    for (int r = 0; r < rows; r++) {
        float *restrict s = S + (ptrdiff_t)r * lds;
        float o = sub[r];
        for (int j = 0; j < cols; j++) s[j] = fa_port_exp2(fmaf(s[j], c, -o) * 1.44269504088896340736f);
    }
}

static inline void port_ds_rows(int rows, int cols, const float *P, int ldp, float *dP, int ldd, const float *D, float scale) {
    for (int r = 0; r < rows; r++) {
        const float *restrict p = P + (ptrdiff_t)r * ldp;
        float *restrict d = dP + (ptrdiff_t)r * ldd;
        float dr = D[r];
        for (int j = 0; j < cols; j++) d[j] = p[j] * scale * (d[j] - dr);
    }
}

static inline void port_scale_rows(int rows, int cols, float *O, int ldo, const float *alpha) {
    for (int r = 0; r < rows; r++) {
        float *restrict o = O + (ptrdiff_t)r * ldo;
        float a = alpha[r];
        for (int j = 0; j < cols; j++) o[j] *= a;
    }
}

static inline float fa_port_lo(uint32_t w) { uint32_t u = w << 16; float f; memcpy(&f, &u, 4); return f; }
static inline float fa_port_hi(uint32_t w) { uint32_t u = w & 0xffff0000u; float f; memcpy(&f, &u, 4); return f; }

static inline void port_gemm_bf16(int m, int n, int kp, const uint32_t *A, ptrdiff_t rsa, ptrdiff_t csa, const uint32_t *B,
                           int ldb, float *C, int ldc, int acc) {
    for (int i = 0; i < m; i++) {
        float *restrict c = C + (ptrdiff_t)i * ldc;
        if (!acc)
            for (int j = 0; j < n; j++) c[j] = 0;
        for (int p = 0; p < kp; p++) {
            uint32_t a = A[i * rsa + p * csa];
            float a0 = fa_port_lo(a), a1 = fa_port_hi(a);
            const uint32_t *restrict b = B + (ptrdiff_t)p * ldb;
            for (int j = 0; j < n; j++) c[j] = (c[j] + a0 * fa_port_lo(b[j])) + a1 * fa_port_hi(b[j]);
        }
    }
}

static inline void port_pack_t32(int rows, int cols, const uint32_t *src, int lds, uint32_t *dst, int ldd) {
    for (int c = 0; c < cols; c++)
        for (int r = 0; r < rows; r++) dst[(ptrdiff_t)c * ldd + r] = src[(ptrdiff_t)r * lds + c];
}

static inline void port_pairs_f32_bf16(int nk, int n, const float *src, int lds, uint32_t *dst, int ldd) {
    for (int w = 0; 2 * w < nk; w++)
        for (int j = 0; j < n; j++) {
            uint32_t lo, hi = 0;
            float x0 = fa_port_bf16(src[(ptrdiff_t)(2 * w) * lds + j]);
            memcpy(&lo, &x0, 4);
            if (2 * w + 1 < nk) {
                float x1 = fa_port_bf16(src[(ptrdiff_t)(2 * w + 1) * lds + j]);
                memcpy(&hi, &x1, 4);
            }
            dst[(ptrdiff_t)w * ldd + j] = (lo >> 16) | (hi & 0xffff0000u);
        }
}

static inline void port_pairs_bf16(int nk, int n, const uint16_t *src, int lds, uint32_t *dst, int ldd) {
    for (int w = 0; 2 * w < nk; w++)
        for (int j = 0; j < n; j++) {
            uint32_t lo = src[(ptrdiff_t)(2 * w) * lds + j];
            uint32_t hi = 2 * w + 1 < nk ? src[(ptrdiff_t)(2 * w + 1) * lds + j] : 0u;
            dst[(ptrdiff_t)w * ldd + j] = lo | (hi << 16);
        }
}

static inline void port_softmax_rows_bf16(int rows, int cols, const float *S, int lds, float c, float *m, float *l,
                                          float *alpha, uint32_t *P, int ldp) {
    for (int r = 0; r < rows; r++) {
        const float *restrict s = S + (ptrdiff_t)r * lds;
        uint32_t *restrict pw = P + (ptrdiff_t)r * ldp;
        float mx = m[r];
        for (int j = 0; j < cols; j++) mx = s[j] > mx ? s[j] : mx;
        const float sub = mx == -INFINITY ? 0.0f : mx, cm = c * sub;
        float sum = 0;
        for (int j = 0; j < cols; j += 2) {
            float e0 = fa_port_exp2(fmaf(s[j], c, -cm)), e1 = j + 1 < cols ? fa_port_exp2(fmaf(s[j + 1], c, -cm)) : 0.0f;
            sum += e0 + e1;
            float b0 = fa_port_bf16(e0), b1 = fa_port_bf16(e1);
            uint32_t u0, u1;
            memcpy(&u0, &b0, 4);
            memcpy(&u1, &b1, 4);
            pw[j / 2] = (u0 >> 16) | (u1 & 0xffff0000u);
        }
        const float a = m[r] == -INFINITY ? 0.0f : fa_port_exp2(c * (m[r] - sub));
        alpha[r] = a;
        l[r] = l[r] * a + sum;
        m[r] = mx;
    }
}

static inline void port_rows_f32_bf16(int rows, int cols, const float *src, int lds, uint32_t *dst, int ldd) {
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j += 2) {
            float b0 = fa_port_bf16(src[(ptrdiff_t)r * lds + j]);
            float b1 = j + 1 < cols ? fa_port_bf16(src[(ptrdiff_t)r * lds + j + 1]) : 0.0f;
            uint32_t u0, u1;
            memcpy(&u0, &b0, 4);
            memcpy(&u1, &b1, 4);
            dst[(ptrdiff_t)r * ldd + j / 2] = (u0 >> 16) | (u1 & 0xffff0000u);
        }
}

/* kernels.h's rowdots: 8 rows' chains interleaved, so that they overlap (one chain waits an FMA's latency per
 * element); fmaf is one instruction where the table's flags have FMA, a libm call in the baseline build. */
static inline void port_rowdots(int rows, int n, const float *a, int lda, const float *b, int ldb, float *D) {
    int r = 0;
    for (; r + 8 <= rows; r += 8) {
        float s[8] = {0};
        for (int x = 0; x < n; x++)
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) s[i] = fmaf(a[(ptrdiff_t)(r + i) * lda + x], b[(ptrdiff_t)(r + i) * ldb + x], s[i]);
        for (int i = 0; i < 8; i++) D[r + i] = s[i];
    }
    for (; r < rows; r++) {
        float s = 0;
        for (int x = 0; x < n; x++) s = fmaf(a[(ptrdiff_t)r * lda + x], b[(ptrdiff_t)r * ldb + x], s);
        D[r] = s;
    }
}

/* Initialiser lines for the entries a table takes from this header: the bf16 ones, and all. */
#define FA_PORTABLE_BF16_ENTRIES                                                                              \
    .gemm_bf16 = port_gemm_bf16, .pack_t32 = port_pack_t32, .pairs_f32_bf16 = port_pairs_f32_bf16,          \
    .pairs_bf16 = port_pairs_bf16, .softmax_rows_bf16 = port_softmax_rows_bf16,                              \
    .rows_f32_bf16 = port_rows_f32_bf16
#define FA_PORTABLE_ENTRIES                                                                                   \
    .pack_t = port_pack_t, .softmax_step_t = port_softmax_step_t, .exp_rows = port_exp_rows,               \
    .ds_rows = port_ds_rows, .scale_rows = port_scale_rows, .rowdots = port_rowdots, FA_PORTABLE_BF16_ENTRIES

#endif
