/* AVX-512 tile kernels (fp32 FMA, bf16 vdpbf16ps). Built with -mavx512f -mavx512bw -mavx512vl -mavx512dq
 * -mavx512bf16 -mfma (src/cpu/sources.cmake); only reached through fa_cpu_kernels_select() after a CPUID check.
 * docs/cpu-kernels.md explains the blocking and the exp2.
 *
 * Register blocking: C tiles of MR = 6 rows × NV = 4 zmm (64 columns) = 24 accumulators; per k step
 * NV vector loads of a B row, MR broadcasts of A, MR·NV FMAs. A is addressed as A[i·rsa + p·csa], so the same
 * kernel serves A·B (rsa = lda, csa = 1: broadcast along a row of A) and Aᵀ·B (rsa = 1, csa = lda). A·Bᵀ packs Bᵀ
 * into a k × 64 panel with a 16 × 16 in-register transpose and reuses it. The last zmm of a row is masked, so any
 * n works without padding. */
#include "cpu/simd/kernels.h"
#include "cpu/simd/kvcache.h"
#include "cpu/simd/portable.h"

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define AI static inline __attribute__((always_inline))

/* ---- fp32 GEMM micro-kernel ---- */

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


/* C[MR][16·NV] (=|+=) Σ_p A(i, p) · B[p][·]; the last vector of each row uses mask `tail`. */
AI void ukr(const int MR, const int NV, int k, const float *restrict A, ptrdiff_t rsa, ptrdiff_t csa,
            const float *restrict B, ptrdiff_t ldb, float *restrict C, ptrdiff_t ldc, int acc, __mmask16 tail) {
    __m512 c[6][4];
    acc_load(MR, NV, C, ldc, acc, tail, c);
    for (int p = 0; p < k; p++) {
        __m512 b[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            __mmask16 mk = v == NV - 1 ? tail : (__mmask16)0xffff;
            b[v] = _mm512_maskz_loadu_ps(mk, B + 16 * v);
        }
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            __m512 a = _mm512_set1_ps(A[i * rsa]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) c[i][v] = _mm512_fmadd_ps(a, b[v], c[i][v]);
        }
        A += csa;
        B += ldb;
    }
    acc_store(MR, NV, C, ldc, tail, c);
}

#define UKR_CASE(MR, NV) \
    case (MR)*8 + (NV): ukr(MR, NV, k, A, rsa, csa, B, ldb, C, ldc, acc, tail); break;
#define UKR_ROW(MR) UKR_CASE(MR, 1) UKR_CASE(MR, 2) UKR_CASE(MR, 3) UKR_CASE(MR, 4)

static void ukr_any(int mr, int nv, int k, const float *A, ptrdiff_t rsa, ptrdiff_t csa, const float *B, ptrdiff_t ldb,
                    float *C, ptrdiff_t ldc, int acc, __mmask16 tail) {
    switch (mr * 8 + nv) {
        UKR_ROW(1) UKR_ROW(2) UKR_ROW(3) UKR_ROW(4) UKR_ROW(5) UKR_ROW(6)
    default: break;
    }
}

/* C[m][n] (acc ? += : =) Σ_p A[i·rsa + p·csa] · B[p·ldb + j]. */
static void gemm_nn(int m, int n, int k, const float *A, ptrdiff_t rsa, ptrdiff_t csa, const float *B, int ldb, float *C,
                    int ldc, int acc) {
    for (int j0 = 0; j0 < n; j0 += 64) {
        int nc = n - j0 < 64 ? n - j0 : 64;
        int nv = (nc + 15) / 16;
        int rem = nc - 16 * (nv - 1);
        __mmask16 tail = (__mmask16)((1u << rem) - 1u);
        for (int i0 = 0; i0 < m; i0 += 6) {
            int mr = m - i0 < 6 ? m - i0 : 6;
            ukr_any(mr, nv, k, A + i0 * rsa, rsa, csa, B + j0, ldb, C + (ptrdiff_t)i0 * ldc + j0, ldc, acc, tail);
        }
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

/* dst[c·ldd + r] = mul · src[r·lds + c], r < rows, c < cols. */
static void pack_t(int rows, int cols, const float *src, int lds, float *dst, int ldd, float mul) {
    __m512 vm = _mm512_set1_ps(mul);
    for (int r0 = 0; r0 < rows; r0 += 16) {
        int nr = rows - r0 < 16 ? rows - r0 : 16;
        __mmask16 mrow = (__mmask16)((1u << nr) - 1u);
        for (int c0 = 0; c0 < cols; c0 += 16) {
            int nc = cols - c0 < 16 ? cols - c0 : 16;
            __mmask16 mcol = (__mmask16)((1u << nc) - 1u);
            __m512 t[16];
            for (int i = 0; i < 16; i++)
                t[i] = i < nr ? _mm512_maskz_loadu_ps(mcol, src + (ptrdiff_t)(r0 + i) * lds + c0) : _mm512_setzero_ps();
            transpose16(t);
            for (int j = 0; j < nc; j++)
                _mm512_mask_storeu_ps(dst + (ptrdiff_t)(c0 + j) * ldd + r0, mrow, _mm512_mul_ps(t[j], vm));
        }
    }
}

/* C = A·Bᵀ: Bᵀ is packed 64 columns × 256 k at a time (64 KiB on the stack, L1/L2 resident). */
#define ABT_KC 256
static void gemm_abt(int m, int n, int k, const float *A, int lda, const float *B, int ldb, float *C, int ldc) {
    float panel[ABT_KC * 64] __attribute__((aligned(64)));
    if (k <= 0) {
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) C[(ptrdiff_t)i * ldc + j] = 0;
        return;
    }
    for (int j0 = 0; j0 < n; j0 += 64) {
        int nc = n - j0 < 64 ? n - j0 : 64;
        for (int p0 = 0; p0 < k; p0 += ABT_KC) {
            int kc = k - p0 < ABT_KC ? k - p0 : ABT_KC;
            pack_t(nc, kc, B + (ptrdiff_t)j0 * ldb + p0, ldb, panel, 64, 1.0f);
            gemm_nn(m, nc, kc, A + p0, lda, 1, panel, 64, C + j0, ldc, p0 > 0);
        }
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

/* Masked loads and stores where the columns end mid-vector, plain ones elsewhere (masked ones cost Zen 5 up to 1.9x
 * in these loops, even with every lane set). */
AI __m512 ld_cols(int FULL, __mmask16 mk, __m512 src, const float *p) {
    return FULL ? _mm512_loadu_ps(p) : _mm512_mask_loadu_ps(src, mk, p);
}
AI void st_cols(int FULL, __mmask16 mk, float *p, __m512 x) {
    if (FULL) _mm512_storeu_ps(p, x);
    else _mm512_mask_storeu_ps(p, mk, x);
}

/* Online-softmax step on 16 (FULL) or fewer query columns q0.. of a transposed score tile (keys × queries). */
AI void softmax_cols(const int FULL, int nk, int nq, int q0, float *S, int lds, float c, float *m, float *l,
                     float *alpha) {
    const __m512 vc = _mm512_set1_ps(c), ninf = _mm512_set1_ps(-INFINITY), z = _mm512_setzero_ps();
    const __mmask16 mq = FULL ? (__mmask16)0xffff : (__mmask16)((1u << (nq - q0)) - 1u);
    __m512 mold = ld_cols(FULL, mq, ninf, m + q0);
    __m512 mx0 = mold, mx1 = ninf, mx2 = ninf, mx3 = ninf;
    float *s = S + q0;
    int r = 0;
    for (; r + 4 <= nk; r += 4) {
        mx0 = _mm512_max_ps(mx0, ld_cols(FULL, mq, ninf, s + (ptrdiff_t)r * lds));
        mx1 = _mm512_max_ps(mx1, ld_cols(FULL, mq, ninf, s + (ptrdiff_t)(r + 1) * lds));
        mx2 = _mm512_max_ps(mx2, ld_cols(FULL, mq, ninf, s + (ptrdiff_t)(r + 2) * lds));
        mx3 = _mm512_max_ps(mx3, ld_cols(FULL, mq, ninf, s + (ptrdiff_t)(r + 3) * lds));
    }
    for (; r < nk; r++) mx0 = _mm512_max_ps(mx0, ld_cols(FULL, mq, ninf, s + (ptrdiff_t)r * lds));
    __m512 mnew = _mm512_max_ps(_mm512_max_ps(mx0, mx1), _mm512_max_ps(mx2, mx3));
    /* a column that has seen only −∞ subtracts 0 (−∞ − −∞ would be NaN) */
    __mmask16 fin = _mm512_cmp_ps_mask(mnew, ninf, _CMP_NEQ_OQ);
    __m512 ms = _mm512_maskz_mov_ps(fin, mnew);
    /* 2^(c·(s − m)): s − m is exact near the maximum, where P matters */
    __m512 al = exp2_ps(_mm512_mul_ps(_mm512_sub_ps(mold, ms), vc));
    __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
    r = 0;
    for (; r + 2 <= nk; r += 2) {
        float *p0 = s + (ptrdiff_t)r * lds, *p1 = p0 + lds;
        __m512 e0 = exp2_ps(_mm512_mul_ps(_mm512_sub_ps(ld_cols(FULL, mq, z, p0), ms), vc));
        __m512 e1 = exp2_ps(_mm512_mul_ps(_mm512_sub_ps(ld_cols(FULL, mq, z, p1), ms), vc));
        st_cols(FULL, mq, p0, e0);
        st_cols(FULL, mq, p1, e1);
        sum0 = _mm512_add_ps(sum0, e0);
        sum1 = _mm512_add_ps(sum1, e1);
    }
    if (r < nk) {
        float *p0 = s + (ptrdiff_t)r * lds;
        __m512 e0 = exp2_ps(_mm512_mul_ps(_mm512_sub_ps(ld_cols(FULL, mq, z, p0), ms), vc));
        st_cols(FULL, mq, p0, e0);
        sum0 = _mm512_add_ps(sum0, e0);
    }
    __m512 lv = ld_cols(FULL, mq, z, l + q0);
    lv = _mm512_fmadd_ps(lv, al, _mm512_add_ps(sum0, sum1));
    st_cols(FULL, mq, l + q0, lv);
    st_cols(FULL, mq, m + q0, mnew);
    st_cols(FULL, mq, alpha + q0, al);
}

/* Online-softmax step on a transposed score tile (keys × queries), see kernels.h. */
static void softmax_step_t(int nk, int nq, float *S, int lds, float c, float *m, float *l, float *alpha) {
    int q0 = 0;
    for (; q0 + 16 <= nq; q0 += 16) softmax_cols(1, nk, nq, q0, S, lds, c, m, l, alpha);
    if (q0 < nq) softmax_cols(0, nk, nq, q0, S, lds, c, m, l, alpha);
}

/* ---- S = Kj Qiᵀ fused with the online softmax (FLASH2 forward, unmasked blocks; see kernels.h) ----
 * Each MR-key × 16·NV-query accumulator block is turned into P = 2^(c·S − c·m) while it is in registers: no
 * max pass and no exp pass over the score tile in memory. m is the running reference maximum and is raised
 * only when a score exceeds it by more than FA_SOFTMAX_SLACK/c (P ≤ 2^SLACK meanwhile: a lazy rescale),
 * so the caller rescales O only when that happened. */

/* Lanes `up` of queries q0..q0+15 saw a score mx above m + SLACK/c: m = mx there; ℓ, alpha and the r0 rows of P
 * this block already wrote for them are scaled by 2^(c·(m_old − mx)) (0 when m_old = −∞). Rare: off the hot path. */
static __attribute__((noinline)) void raise_max(__mmask16 up, __m512 mx, int r0, float *S, ptrdiff_t lds, float c,
                                                float *m, float *l, float *alpha) {
    const __m512 mold = _mm512_maskz_loadu_ps(up, m);
    const __m512 a = exp2_ps(_mm512_mul_ps(_mm512_sub_ps(mold, mx), _mm512_set1_ps(c)));
    _mm512_mask_storeu_ps(m, up, mx);
    _mm512_mask_storeu_ps(l, up, _mm512_mul_ps(_mm512_maskz_loadu_ps(up, l), a));
    _mm512_mask_storeu_ps(alpha, up, _mm512_mul_ps(_mm512_maskz_loadu_ps(up, alpha), a));
    for (int r = 0; r < r0; r++) {
        float *s = S + (ptrdiff_t)r * lds;
        _mm512_mask_storeu_ps(s, up, _mm512_mul_ps(_mm512_maskz_loadu_ps(up, s), a));
    }
}

/* One MR × NV block: acc = K[MR rows] · QT[·][16·NV columns] over d, then P, ℓ in place. Returns whether m rose. */
AI int qk_softmax_ukr(const int MR, const int NV, int d, const float *restrict K, ptrdiff_t ldk,
                      const float *restrict QT, ptrdiff_t ldqt, float *restrict S, ptrdiff_t lds, int r0, float c,
                      float *m, float *l, float *alpha, __mmask16 tail) {
    __m512 acc[6][4];
    acc_load(MR, NV, NULL, 0, 0, tail, acc);
    for (int p = 0; p < d; p++) {
        __m512 b[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) b[v] = _mm512_maskz_loadu_ps(v == NV - 1 ? tail : (__mmask16)0xffff, QT + 16 * v);
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            __m512 a = _mm512_set1_ps(K[i * ldk + p]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[i][v] = _mm512_fmadd_ps(a, b[v], acc[i][v]);
        }
        QT += ldqt;
    }
    const __m512 vc = _mm512_set1_ps(c), slack = _mm512_set1_ps(FA_SOFTMAX_SLACK);
    int rose = 0;
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) {
        const __mmask16 mk = v == NV - 1 ? tail : (__mmask16)0xffff;
        __m512 mx = acc[0][v];
#pragma GCC unroll 6
        for (int i = 1; i < MR; i++) mx = _mm512_max_ps(mx, acc[i][v]);
        __m512 cm = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, m + 16 * v), vc);
        __mmask16 up = _mm512_mask_cmp_ps_mask(mk, _mm512_fmsub_ps(mx, vc, cm), slack, _CMP_GT_OQ);
        if (__builtin_expect(up != 0, 0)) {
            raise_max(up, mx, r0, S + 16 * v - (ptrdiff_t)r0 * lds, lds, c, m + 16 * v, l + 16 * v, alpha + 16 * v);
            cm = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, m + 16 * v), vc);
            rose = 1;
        }
        __m512 sum = _mm512_setzero_ps();
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            __m512 e = exp2_finite(_mm512_fmsub_ps(acc[i][v], vc, cm));
            _mm512_mask_storeu_ps(S + i * lds + 16 * v, mk, e);
            sum = _mm512_add_ps(sum, e);
        }
        _mm512_mask_storeu_ps(l + 16 * v, mk, _mm512_add_ps(_mm512_maskz_loadu_ps(mk, l + 16 * v), sum));
    }
    return rose;
}

#define QKS_CASE(MR, NV) \
    case (MR)*8 + (NV): return qk_softmax_ukr(MR, NV, d, K, ldk, QT, ldqt, S, lds, r0, c, m, l, alpha, tail);
#define QKS_ROW(MR) QKS_CASE(MR, 1) QKS_CASE(MR, 2) QKS_CASE(MR, 3) QKS_CASE(MR, 4)

static int qk_softmax_any(int mr, int nv, int d, const float *K, ptrdiff_t ldk, const float *QT, ptrdiff_t ldqt,
                          float *S, ptrdiff_t lds, int r0, float c, float *m, float *l, float *alpha, __mmask16 tail) {
    switch (mr * 8 + nv) {
        QKS_ROW(1) QKS_ROW(2) QKS_ROW(3) QKS_ROW(4) QKS_ROW(5) QKS_ROW(6)
    default: return 0;
    }
}

static int qk_softmax_t(int nk, int nq, int d, const float *K, int ldk, const float *QT, int ldqt, float *S, int lds,
                        float c, float *m, float *l, float *alpha) {
    int rose = 0;
    for (int q = 0; q < nq; q++) alpha[q] = 1.0f;
    for (int j0 = 0; j0 < nq; j0 += 64) {
        int nc = nq - j0 < 64 ? nq - j0 : 64;
        int nv = (nc + 15) / 16;
        __mmask16 tail = (__mmask16)((1u << (nc - 16 * (nv - 1))) - 1u);
        for (int i0 = 0; i0 < nk; i0 += 6) {
            int mr = nk - i0 < 6 ? nk - i0 : 6;
            rose |= qk_softmax_any(mr, nv, d, K + (ptrdiff_t)i0 * ldk, ldk, QT + j0, ldqt, S + (ptrdiff_t)i0 * lds + j0,
                                   lds, i0, c, m + j0, l + j0, alpha + j0, tail);
        }
    }
    return rose;
}

/* P[r][j] = e^(S[r][j]·c − sub[r]) in place: one rounding of the (small) exponent, then ·log2 e and exp2. */
static void exp_rows(int rows, int cols, float *S, int lds, float c, const float *sub) {
    const __m512 vc = _mm512_set1_ps(c), l2e = _mm512_set1_ps(1.44269504088896340736f);
    for (int r = 0; r < rows; r++) {
        float *s = S + (ptrdiff_t)r * lds;
        __m512 vs = _mm512_set1_ps(sub[r]);
        int j = 0;
        for (; j + 16 <= cols; j += 16)
            _mm512_storeu_ps(s + j, exp2_ps(_mm512_mul_ps(_mm512_fmsub_ps(_mm512_loadu_ps(s + j), vc, vs), l2e)));
        if (j < cols) {
            __mmask16 mk = (__mmask16)((1u << (cols - j)) - 1u);
            __m512 x = _mm512_mul_ps(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(mk, s + j), vc, vs), l2e);
            _mm512_mask_storeu_ps(s + j, mk, exp2_ps(x));
        }
    }
}

/* dP[r][c] = scale · P[r][c] · (dP[r][c] − D[r]) in place. */
static void ds_rows(int rows, int cols, const float *P, int ldp, float *dP, int ldd, const float *D, float scale) {
    const __m512 vsc = _mm512_set1_ps(scale);
    for (int r = 0; r < rows; r++) {
        const float *p = P + (ptrdiff_t)r * ldp;
        float *d = dP + (ptrdiff_t)r * ldd;
        __m512 vd = _mm512_set1_ps(D[r]);
        int j = 0;
        for (; j + 16 <= cols; j += 16) {
            __m512 t = _mm512_mul_ps(_mm512_loadu_ps(p + j), vsc);
            _mm512_storeu_ps(d + j, _mm512_mul_ps(t, _mm512_sub_ps(_mm512_loadu_ps(d + j), vd)));
        }
        if (j < cols) {
            __mmask16 mk = (__mmask16)((1u << (cols - j)) - 1u);
            __m512 t = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, p + j), vsc);
            _mm512_mask_storeu_ps(d + j, mk, _mm512_mul_ps(t, _mm512_sub_ps(_mm512_maskz_loadu_ps(mk, d + j), vd)));
        }
    }
}

/* O[r][·] *= alpha[r]. */
static void scale_rows(int rows, int cols, float *O, int ldo, const float *alpha) {
    for (int r = 0; r < rows; r++) {
        if (alpha[r] == 1.0f) continue; /* exact either way; in a long row most blocks leave the max where it was */
        float *o = O + (ptrdiff_t)r * ldo;
        __m512 a = _mm512_set1_ps(alpha[r]);
        int j = 0;
        for (; j + 16 <= cols; j += 16) _mm512_storeu_ps(o + j, _mm512_mul_ps(_mm512_loadu_ps(o + j), a));
        if (j < cols) {
            __mmask16 mk = (__mmask16)((1u << (cols - j)) - 1u);
            _mm512_mask_storeu_ps(o + j, mk, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, o + j), a));
        }
    }
}

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
static void gemm_bf16(int m, int n, int kp, const uint32_t *A, ptrdiff_t rsa, ptrdiff_t csa, const uint32_t *B, int ldb,
                      float *C, int ldc, int acc) {
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

/* dst[c·ldd + r] = src[r·lds + c] on 32-bit words. */
static void pack_t32(int rows, int cols, const uint32_t *src, int lds, uint32_t *dst, int ldd) {
    for (int r0 = 0; r0 < rows; r0 += 16) {
        int nr = rows - r0 < 16 ? rows - r0 : 16;
        __mmask16 mrow = (__mmask16)((1u << nr) - 1u);
        for (int c0 = 0; c0 < cols; c0 += 16) {
            int nc = cols - c0 < 16 ? cols - c0 : 16;
            __mmask16 mcol = (__mmask16)((1u << nc) - 1u);
            __m512 t[16];
            for (int i = 0; i < 16; i++)
                t[i] = i < nr ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(mcol, src + (ptrdiff_t)(r0 + i) * lds + c0))
                              : _mm512_setzero_ps();
            transpose16(t);
            for (int j = 0; j < nc; j++)
                _mm512_mask_storeu_epi32(dst + (ptrdiff_t)(c0 + j) * ldd + r0, mrow, _mm512_castps_si512(t[j]));
        }
    }
}

/* Word permutation interleaving the low 16 words (row 2w) with the high 16 (row 2w + 1): dword q = (lo[q], hi[q]). */
AI __m512i pair_index(void) {
    return _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                            23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
}

/* dst[w·ldd + j] = (bf16(src[2w][j]), bf16(src[2w + 1][j])), an odd last row paired with 0. */
static void pairs_f32_bf16(int nk, int n, const float *src, int lds, uint32_t *dst, int ldd) {
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

/* The same pairing for rows already in bf16. */
static void pairs_bf16(int nk, int n, const uint16_t *src, int lds, uint32_t *dst, int ldd) {
    const __m512i idx = pair_index();
    for (int w = 0; 2 * w < nk; w++) {
        const uint16_t *r0 = src + (ptrdiff_t)(2 * w) * lds;
        const uint16_t *r1 = 2 * w + 1 < nk ? r0 + lds : NULL;
        for (int j = 0; j < n; j += 16) {
            __mmask16 mk = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
            __m256i x0 = _mm256_maskz_loadu_epi16(mk, r0 + j);
            __m256i x1 = r1 ? _mm256_maskz_loadu_epi16(mk, r1 + j) : _mm256_setzero_si256();
            __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(x0), x1, 1);
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
static void softmax_rows_bf16(int rows, int cols, const float *S, int lds, float c, float *m, float *l, float *alpha,
                              uint32_t *P, int ldp) {
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
static void rows_f32_bf16(int rows, int cols, const float *src, int lds, uint32_t *dst, int ldd) {
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

/* The entries both AVX-512 tables share (the amx table differs in its bf16 product only). */
#define AVX512_ENTRIES                                                                                          \
    .gemm_nn = gemm_nn, .gemm_abt = gemm_abt, .pack_t = pack_t, .softmax_step_t = softmax_step_t,             \
    .qk_softmax_t = qk_softmax_t, .exp_rows = exp_rows, .ds_rows = ds_rows, .scale_rows = scale_rows,         \
    .rowdots = port_rowdots,                                                                                  \
    .bf16_dot = 1, .pack_t32 = pack_t32, .pairs_f32_bf16 = pairs_f32_bf16, .pairs_bf16 = pairs_bf16,          \
    .softmax_rows_bf16 = softmax_rows_bf16, .rows_f32_bf16 = rows_f32_bf16, .kvcache = &fa_kv_kernel_avx512

const fa_cpu_kernels fa_cpu_kernels_avx512 = {
    .isa = "avx512",
    .id = FA_CPU_ISA_AVX512,
    AVX512_ENTRIES,
    .gemm_bf16 = gemm_bf16,
    .bf16_tiles = 0,
};

const fa_cpu_kernels fa_cpu_kernels_amx = {
    .isa = "amx",
    .id = FA_CPU_ISA_AMX,
    AVX512_ENTRIES,
    .gemm_bf16 = fa_amx_gemm_bf16,
    .bf16_tiles = 1,
};
