/* AVX-512 bf16 entries on AVX512_BF16 (vdpbf16ps products, vcvtne2ps2bf16 rounding), for the avx512bf16 and amx
 * tables (defined in simd/avx512.c with its fp32 entries). Built with the avx512f flags and -mavx512bf16
 * (src/cpu/sources.cmake); only reached through fa_cpu_kernels_select() after a CPUID check. */
#include "cpu/simd/avx512_inl.h"
#include "cpu/simd/kernels.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* ---- bf16 (AVX512_BF16): operands are dwords holding a pair of bf16 along the reduction dim;
 * vdpbf16ps adds both products of a pair into an fp32 lane. Same MR × NV blocking as the fp32 kernel. ---- */

AI void ukr_bf16(const int MR, const int NV, int kp, const uint32_t *restrict A, ptrdiff_t rsa, ptrdiff_t csa,
                 const uint32_t *restrict B, ptrdiff_t ldb, float *restrict C, ptrdiff_t ldc, int acc, __mmask16 tail) {
    __m512 c[6][4];
    acc_load(MR, NV, C, ldc, acc, tail, c);
    for (int p = 0; p < kp; p++) {
        __m512i b[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            __mmask16 mk = v == NV - 1 ? tail : (__mmask16)0xffff;
            b[v] = _mm512_maskz_loadu_epi32(mk, B + 16 * v);
        }
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            __m512i a = _mm512_set1_epi32((int)A[i * rsa]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) c[i][v] = _mm512_dpbf16_ps(c[i][v], (__m512bh)a, (__m512bh)b[v]);
        }
        A += csa;
        B += ldb;
    }
    acc_store(MR, NV, C, ldc, tail, c);
}

#define UKB_CASE(MR, NV) \
    case (MR)*8 + (NV): ukr_bf16(MR, NV, kp, A, rsa, csa, B, ldb, C, ldc, acc, tail); break;
#define UKB_ROW(MR) UKB_CASE(MR, 1) UKB_CASE(MR, 2) UKB_CASE(MR, 3) UKB_CASE(MR, 4)

static void ukb_any(int mr, int nv, int kp, const uint32_t *A, ptrdiff_t rsa, ptrdiff_t csa, const uint32_t *B,
                    ptrdiff_t ldb, float *C, ptrdiff_t ldc, int acc, __mmask16 tail) {
    switch (mr * 8 + nv) {
        UKB_ROW(1) UKB_ROW(2) UKB_ROW(3) UKB_ROW(4) UKB_ROW(5) UKB_ROW(6)
    default: break;
    }
}

/* C[m][n] (acc ? += : =) Σ_p dot2(A[i·rsa + p·csa], B[p·ldb + j]) over kp dword pairs. */
void fa_avx512bf16_gemm_bf16(int m, int n, int kp, const uint32_t *A, ptrdiff_t rsa, ptrdiff_t csa, const uint32_t *B,
                             int ldb, float *C, int ldc, int acc) {
    for (int j0 = 0; j0 < n; j0 += 64) {
        int nc = n - j0 < 64 ? n - j0 : 64;
        int nv = (nc + 15) / 16;
        int rem = nc - 16 * (nv - 1);
        __mmask16 tail = (__mmask16)((1u << rem) - 1u);
        for (int i0 = 0; i0 < m; i0 += 6) {
            int mr = m - i0 < 6 ? m - i0 : 6;
            ukb_any(mr, nv, kp, A + i0 * rsa, rsa, csa, B + j0, ldb, C + (ptrdiff_t)i0 * ldc + j0, ldc, acc, tail);
        }
    }
}

/* dst[w·ldd + j] = (bf16(src[2w][j]), bf16(src[2w + 1][j])), an odd last row paired with 0. */
void fa_avx512bf16_pairs_f32_bf16(int nk, int n, const float *src, int lds, uint32_t *dst, int ldd) {
    const __m512i idx = pair_index();
    for (int w = 0; 2 * w < nk; w++) {
        const float *r0 = src + (ptrdiff_t)(2 * w) * lds;
        const float *r1 = 2 * w + 1 < nk ? r0 + lds : NULL;
        for (int j = 0; j < n; j += 16) {
            __mmask16 mk = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
            __m512 x0 = _mm512_maskz_loadu_ps(mk, r0 + j);
            __m512 x1 = r1 ? _mm512_maskz_loadu_ps(mk, r1 + j) : _mm512_setzero_ps();
            __m512i h = (__m512i)_mm512_cvtne2ps_pbh(x1, x0); /* low 16 words: x0, high 16: x1 */
            _mm512_mask_storeu_epi32(dst + (ptrdiff_t)w * ldd + j, mk, _mm512_permutexvar_epi16(idx, h));
        }
    }
}

/* One row's max over its cols as a vector (masked-off lanes read −∞). */
AI __m512 row_max_vec(const float *s, int cols) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 mx0 = ninf, mx1 = ninf;
    int j = 0;
    for (; j + 32 <= cols; j += 32) {
        mx0 = _mm512_max_ps(mx0, _mm512_loadu_ps(s + j));
        mx1 = _mm512_max_ps(mx1, _mm512_loadu_ps(s + j + 16));
    }
    for (; j < cols; j += 16) {
        __mmask16 mk = cols - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (cols - j)) - 1u);
        mx0 = _mm512_max_ps(mx0, _mm512_mask_loadu_ps(ninf, mk, s + j));
    }
    return _mm512_max_ps(mx0, mx1);
}

/* P = 2^(S·c − cm) of one row, 32 keys at a time, rounded by vcvtne2ps2bf16 (low 16 words: the first 16 keys, so
 * word w holds keys 2w, 2w + 1 as the pair layout wants); returns the fp32 sum of P by lane. Whole vectors go
 * without masks (the masked loads and stores cost Zen 5 1.9x on this loop). */
AI __m512 row_exp_pairs(const float *s, int cols, __m512 vc, __m512 cm, uint32_t *pw) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
    int j = 0;
    for (; j + 32 <= cols; j += 32) { /* whole vectors: no masks */
        __m512 e0 = exp2_ps(_mm512_fmsub_ps(_mm512_loadu_ps(s + j), vc, cm));
        __m512 e1 = exp2_ps(_mm512_fmsub_ps(_mm512_loadu_ps(s + j + 16), vc, cm));
        sum0 = _mm512_add_ps(sum0, e0);
        sum1 = _mm512_add_ps(sum1, e1);
        _mm512_storeu_si512(pw + j / 2, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
    }
    for (; j < cols; j += 32) {
        const int n0 = cols - j < 16 ? cols - j : 16, n1 = cols - j - 16 < 0 ? 0 : cols - j - 16 < 16 ? cols - j - 16 : 16;
        const __mmask16 k0 = (__mmask16)((1u << n0) - 1u), k1 = (__mmask16)((1u << n1) - 1u);
        /* masked-off lanes read −∞ and give P = 0 */
        __m512 e0 = exp2_ps(_mm512_fmsub_ps(_mm512_mask_loadu_ps(ninf, k0, s + j), vc, cm));
        __m512 e1 = exp2_ps(_mm512_fmsub_ps(_mm512_mask_loadu_ps(ninf, k1, s + j + 16), vc, cm));
        sum0 = _mm512_add_ps(sum0, e0);
        sum1 = _mm512_add_ps(sum1, e1);
        __m512i h = (__m512i)_mm512_cvtne2ps_pbh(e1, e0);
        const int nw = (n0 + n1 + 1) / 2;
        _mm512_mask_storeu_epi32(pw + j / 2, (__mmask16)((1u << nw) - 1u), h);
    }
    return _mm512_add_ps(sum0, sum1);
}

/* Sixteen lane reductions at once: lane r of the result is OP over the lanes of x[r] (15 OPs and 30 shuffles,
 * where one reduction at a time is a serial chain of 4 shuffles and 4 OPs per row). */
#define REDUCE16(x, OP, out)                                                                                           \
    do {                                                                                                               \
        __m512 t_[8], u_[4], v_[2];                                                                                    \
        for (int k_ = 0; k_ < 8; k_++)                                                                                 \
            t_[k_] = OP(_mm512_unpacklo_ps(x[2 * k_], x[2 * k_ + 1]), _mm512_unpackhi_ps(x[2 * k_], x[2 * k_ + 1]));  \
        for (int k_ = 0; k_ < 4; k_++)                                                                                 \
            u_[k_] = OP(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t_[2 * k_]), _mm512_castps_pd(t_[2 * k_ + 1]))), \
                        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t_[2 * k_]), _mm512_castps_pd(t_[2 * k_ + 1])))); \
        for (int k_ = 0; k_ < 2; k_++)                                                                                 \
            v_[k_] = OP(_mm512_shuffle_f32x4(u_[2 * k_], u_[2 * k_ + 1], 0x88),                                       \
                        _mm512_shuffle_f32x4(u_[2 * k_], u_[2 * k_ + 1], 0xdd));                                      \
        out = OP(_mm512_shuffle_f32x4(v_[0], v_[1], 0x88), _mm512_shuffle_f32x4(v_[0], v_[1], 0xdd));                \
    } while (0)

/* Row-major online softmax with P written as bf16 key pairs (kernels.h, softmax_rows_bf16). Rows go 16 at a time:
 * their maxima, α and the sums of P come out as one vector each (REDUCE16), with no scalar exp2f or per-row
 * reduction chain in between; the rest row by row (docs/cpu-kernels.md, "AMX", has the timings). */
void fa_avx512bf16_softmax_rows_bf16(int rows, int cols, const float *S, int lds, float c, float *m, float *l,
                                     float *alpha, uint32_t *P, int ldp) {
    const __m512 vc = _mm512_set1_ps(c), ninf = _mm512_set1_ps(-INFINITY);
    int r0 = 0;
    for (; r0 + 16 <= rows; r0 += 16) {
        __m512 x[16], rmax, rsum;
        for (int i = 0; i < 16; i++) x[i] = row_max_vec(S + (ptrdiff_t)(r0 + i) * lds, cols);
        REDUCE16(x, _mm512_max_ps, rmax);
        const __m512 mold = _mm512_loadu_ps(m + r0);
        const __m512 mnew = _mm512_max_ps(rmax, mold); /* a NaN row max keeps m, as fmaxf does */
        /* a row that has seen only −∞ subtracts 0 (−∞ − −∞ would be NaN) */
        const __m512 sub = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(mnew, ninf, _CMP_NEQ_OQ), mnew);
        float cm[16] __attribute__((aligned(64)));
        _mm512_store_ps(cm, _mm512_mul_ps(vc, sub));
        /* α = 2^(c·(m − sub)): exp2_ps takes an m of −∞ to exactly 0 */
        const __m512 al = exp2_ps(_mm512_mul_ps(vc, _mm512_sub_ps(mold, sub)));
        for (int i = 0; i < 16; i++)
            x[i] = row_exp_pairs(S + (ptrdiff_t)(r0 + i) * lds, cols, vc, _mm512_set1_ps(cm[i]),
                                 P + (ptrdiff_t)(r0 + i) * ldp);
        REDUCE16(x, _mm512_add_ps, rsum);
        _mm512_storeu_ps(alpha + r0, al);
        _mm512_storeu_ps(l + r0, _mm512_fmadd_ps(_mm512_loadu_ps(l + r0), al, rsum));
        _mm512_storeu_ps(m + r0, mnew);
    }
    for (int r = r0; r < rows; r++) {
        const float *s = S + (ptrdiff_t)r * lds;
        const float mnew = fmaxf(m[r], _mm512_reduce_max_ps(row_max_vec(s, cols)));
        const float sub = mnew == -INFINITY ? 0.0f : mnew;
        const __m512 sum = row_exp_pairs(s, cols, vc, _mm512_set1_ps(c * sub), P + (ptrdiff_t)r * ldp);
        const float al = m[r] == -INFINITY ? 0.0f : exp2f(c * (m[r] - sub));
        alpha[r] = al;
        l[r] = l[r] * al + _mm512_reduce_add_ps(sum);
        m[r] = mnew;
    }
}

/* dst[r][w] = (bf16 src[r][2w], bf16 src[r][2w + 1]): 32 floats -> 16 words per vcvtne2ps2bf16. */
void fa_avx512bf16_rows_f32_bf16(int rows, int cols, const float *src, int lds, uint32_t *dst, int ldd) {
    for (int r = 0; r < rows; r++) {
        const float *s = src + (ptrdiff_t)r * lds;
        uint32_t *o = dst + (ptrdiff_t)r * ldd;
        for (int j = 0; j < cols; j += 32) {
            const int n0 = cols - j < 16 ? cols - j : 16, n1 = cols - j - 16 < 0 ? 0 : cols - j - 16 < 16 ? cols - j - 16 : 16;
            const __m512 x0 = _mm512_maskz_loadu_ps((__mmask16)((1u << n0) - 1u), s + j);
            const __m512 x1 = _mm512_maskz_loadu_ps((__mmask16)((1u << n1) - 1u), s + j + 16);
            const int nw = (n0 + n1 + 1) / 2;
            _mm512_mask_storeu_epi32(o + j / 2, (__mmask16)((1u << nw) - 1u), (__m512i)_mm512_cvtne2ps_pbh(x1, x0));
        }
    }
}
