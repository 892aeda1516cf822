/* AVX2 + FMA tile kernels (x86-64 CPUs without AVX-512). Built with -mavx2 -mfma (src/cpu/sources.cmake); only
 * reached through fa_cpu_kernels_select() after a CPUID check. The design of avx512.c on 16 ymm registers
 * (docs/cpu-kernels.md, "AVX2"): C blocks of MR = 6 rows × NV = 2 ymm (16 columns) = 12 accumulators + 2 B vectors
 * + 1 broadcast; the FLASH2 forward's Sᵀ = Kj Qiᵀ fused with the online softmax in registers; exp2 by a degree-5
 * polynomial with the exponent built in integer lanes (AVX2 has no vscalefps). Full vectors load unmasked, only a
 * row's last partial vector is masked. The bf16 entries and ds_rows come from simd/portable.h. */
#include "cpu/simd/kernels.h"
#include "cpu/simd/kvcache.h"
#include "cpu/simd/portable.h"

#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

AI __m256i tail_mask(int rem) { /* lanes < rem */
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(rem), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Vector v of NV from p: the last one masked when TAIL (a compile-time constant in every caller). */
AI __m256 ld(const int TAIL, int v, int NV, const float *p, __m256i mk) {
    return TAIL && v == NV - 1 ? _mm256_maskload_ps(p, mk) : _mm256_loadu_ps(p);
}
AI void st(const int TAIL, int v, int NV, float *p, __m256i mk, __m256 x) {
    if (TAIL && v == NV - 1) _mm256_maskstore_ps(p, mk, x);
    else _mm256_storeu_ps(p, x);
}

/* ---- fp32 GEMM micro-kernel ---- */

/* C[MR][8·NV] (=|+=) Σ_p A(i, p) · B[p][·]. */
AI void ukr(const int MR, const int NV, const int TAIL, int k, const float *restrict A, ptrdiff_t rsa, ptrdiff_t csa,
            const float *restrict B, ptrdiff_t ldb, float *restrict C, ptrdiff_t ldc, int acc, __m256i mk) {
    __m256 c[6][2];
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) c[i][v] = acc ? ld(TAIL, v, NV, C + i * ldc + 8 * v, mk) : _mm256_setzero_ps();
    for (int p = 0; p < k; p++) {
        __m256 b[2];
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) b[v] = ld(TAIL, v, NV, B + 8 * v, mk);
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            __m256 a = _mm256_broadcast_ss(A + i * rsa);
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++) c[i][v] = _mm256_fmadd_ps(a, b[v], c[i][v]);
        }
        A += csa;
        B += ldb;
    }
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) st(TAIL, v, NV, C + i * ldc + 8 * v, mk, c[i][v]);
}

#define UKR_CASE(MR, NV, T) \
    case ((MR)*4 + (NV)) * 2 + (T): ukr(MR, NV, T, k, A, rsa, csa, B, ldb, C, ldc, acc, mk); break;
#define UKR_ROW(MR) UKR_CASE(MR, 1, 0) UKR_CASE(MR, 2, 0) UKR_CASE(MR, 1, 1) UKR_CASE(MR, 2, 1)

static void ukr_any(int mr, int nv, int tail, int k, const float *A, ptrdiff_t rsa, ptrdiff_t csa, const float *B,
                    ptrdiff_t ldb, float *C, ptrdiff_t ldc, int acc, __m256i mk) {
    switch ((mr * 4 + nv) * 2 + tail) {
        UKR_ROW(1) UKR_ROW(2) UKR_ROW(3) UKR_ROW(4) UKR_ROW(5) UKR_ROW(6)
    default: break;
    }
}

static void gemm_nn(int m, int n, int k, const float *A, ptrdiff_t rsa, ptrdiff_t csa, const float *B, int ldb, float *C,
                    int ldc, int acc) {
    for (int j0 = 0; j0 < n; j0 += 16) {
        const int nc = n - j0 < 16 ? n - j0 : 16, nv = (nc + 7) / 8, rem = nc - 8 * (nv - 1);
        const __m256i mk = tail_mask(rem);
        for (int i0 = 0; i0 < m; i0 += 6) {
            int mr = m - i0 < 6 ? m - i0 : 6;
            ukr_any(mr, nv, rem < 8, k, A + i0 * rsa, rsa, csa, B + j0, ldb, C + (ptrdiff_t)i0 * ldc + j0, ldc, acc, mk);
        }
    }
}

/* ---- 8 × 8 transpose (3 stages: unpack, shuffle, 128-bit permute) ---- */

AI void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 8; g += 4) {
        u[g + 0] = _mm256_shuffle_ps(t[g], t[g + 2], 0x44);
        u[g + 1] = _mm256_shuffle_ps(t[g], t[g + 2], 0xee);
        u[g + 2] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0x44);
        u[g + 3] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0xee);
    }
    for (int j = 0; j < 4; j++) {
        r[j] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x20);
        r[j + 4] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x31);
    }
}

/* dst[c·ldd + r] = mul · src[r·lds + c], r < rows, c < cols. */
static void pack_t(int rows, int cols, const float *src, int lds, float *dst, int ldd, float mul) {
    const __m256 vm = _mm256_set1_ps(mul);
    for (int r0 = 0; r0 < rows; r0 += 8) {
        const int nr = rows - r0 < 8 ? rows - r0 : 8;
        const __m256i mrow = tail_mask(nr);
        for (int c0 = 0; c0 < cols; c0 += 8) {
            const int nc = cols - c0 < 8 ? cols - c0 : 8;
            const __m256i mcol = tail_mask(nc);
            __m256 t[8];
            for (int i = 0; i < 8; i++)
                t[i] = i >= nr ? _mm256_setzero_ps()
                       : nc == 8 ? _mm256_loadu_ps(src + (ptrdiff_t)(r0 + i) * lds + c0)
                                 : _mm256_maskload_ps(src + (ptrdiff_t)(r0 + i) * lds + c0, mcol);
            transpose8(t);
            for (int j = 0; j < nc; j++) {
                float *o = dst + (ptrdiff_t)(c0 + j) * ldd + r0;
                if (nr == 8) _mm256_storeu_ps(o, _mm256_mul_ps(t[j], vm));
                else _mm256_maskstore_ps(o, mrow, _mm256_mul_ps(t[j], vm));
            }
        }
    }
}

/* C = A·Bᵀ: Bᵀ packed 16 columns × 512 k at a time (32 KiB on the stack), reused by every row block. */
#define ABT_KC 512
static void gemm_abt(int m, int n, int k, const float *A, int lda, const float *B, int ldb, float *C, int ldc) {
    float panel[ABT_KC * 16] __attribute__((aligned(32)));
    if (k <= 0) {
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) C[(ptrdiff_t)i * ldc + j] = 0;
        return;
    }
    for (int j0 = 0; j0 < n; j0 += 16) {
        int nc = n - j0 < 16 ? n - j0 : 16;
        for (int p0 = 0; p0 < k; p0 += ABT_KC) {
            int kc = k - p0 < ABT_KC ? k - p0 : ABT_KC;
            pack_t(nc, kc, B + (ptrdiff_t)j0 * ldb + p0, ldb, panel, 16, 1.0f);
            gemm_nn(m, nc, kc, A + p0, lda, 1, panel, 16, C + j0, ldc, p0 > 0);
        }
    }
}

/* ---- exp2: the polynomial of simd/portable.h (fa_port_exp2), 8 lanes; x < −126 (−∞ included) gives 0 ---- */

AI __m256 exp2_ps(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-126.0f);
    const __m256 y = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(127.0f));
    const __m256 n = _mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(y, n);
    __m256 p = _mm256_set1_ps(1.338130212e-03f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.666368365e-03f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550381169e-02f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402234972e-01f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931471825e-01f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), _mm256_cmp_ps(x, lo, _CMP_GT_OQ));
}

/* ---- online softmax on a transposed tile (kernels.h, softmax_step_t), 8 query columns per vector ---- */

static void softmax_step_t(int nk, int nq, float *S, int lds, float c, float *m, float *l, float *alpha) {
    const __m256 vc = _mm256_set1_ps(c), ninf = _mm256_set1_ps(-INFINITY);
    for (int q0 = 0; q0 < nq; q0 += 8) {
        const int nb = nq - q0 < 8 ? nq - q0 : 8;
        const __m256i mq = tail_mask(nb);
        float *s = S + q0;
        const __m256 mold = _mm256_blendv_ps(ninf, _mm256_maskload_ps(m + q0, mq), _mm256_castsi256_ps(mq));
        __m256 mx0 = mold, mx1 = ninf;
        int r = 0;
        for (; r + 2 <= nk; r += 2) {
            mx0 = _mm256_max_ps(mx0, _mm256_maskload_ps(s + (ptrdiff_t)r * lds, mq));
            mx1 = _mm256_max_ps(mx1, _mm256_maskload_ps(s + (ptrdiff_t)(r + 1) * lds, mq));
        }
        if (r < nk) mx0 = _mm256_max_ps(mx0, _mm256_maskload_ps(s + (ptrdiff_t)r * lds, mq));
        /* masked-off lanes load 0: harmless, they are never stored */
        const __m256 mnew = _mm256_max_ps(mx0, mx1);
        /* a column that has seen only −∞ subtracts 0 (−∞ − −∞ would be NaN) */
        const __m256 ms = _mm256_and_ps(mnew, _mm256_cmp_ps(mnew, ninf, _CMP_NEQ_OQ));
        const __m256 al = exp2_ps(_mm256_mul_ps(_mm256_sub_ps(mold, ms), vc));
        __m256 sum0 = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps();
        for (r = 0; r + 2 <= nk; r += 2) {
            float *p0 = s + (ptrdiff_t)r * lds, *p1 = p0 + lds;
            __m256 e0 = exp2_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_maskload_ps(p0, mq), ms), vc));
            __m256 e1 = exp2_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_maskload_ps(p1, mq), ms), vc));
            _mm256_maskstore_ps(p0, mq, e0);
            _mm256_maskstore_ps(p1, mq, e1);
            sum0 = _mm256_add_ps(sum0, e0);
            sum1 = _mm256_add_ps(sum1, e1);
        }
        if (r < nk) {
            float *p0 = s + (ptrdiff_t)r * lds;
            __m256 e0 = exp2_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_maskload_ps(p0, mq), ms), vc));
            _mm256_maskstore_ps(p0, mq, e0);
            sum0 = _mm256_add_ps(sum0, e0);
        }
        __m256 lv = _mm256_maskload_ps(l + q0, mq);
        lv = _mm256_fmadd_ps(lv, al, _mm256_add_ps(sum0, sum1));
        _mm256_maskstore_ps(l + q0, mq, lv);
        _mm256_maskstore_ps(m + q0, mq, mnew);
        _mm256_maskstore_ps(alpha + q0, mq, al);
    }
}

/* ---- Sᵀ = Kj Qiᵀ fused with the online softmax (kernels.h, qk_softmax_t; the scheme of avx512.c) ---- */

/* Lanes `up` (all-ones lanes) of 8 queries saw a score mx above m + SLACK/c: m = mx there; ℓ, alpha and the r0
 * rows of P this block already wrote for them are scaled by 2^(c·(m_old − mx)). Rare: off the hot path. */
static __attribute__((noinline)) void raise_max(__m256 up, __m256 mx, int r0, float *S, ptrdiff_t lds, float c,
                                                float *m, float *l, float *alpha, __m256i mk) {
    const __m256 mold = _mm256_maskload_ps(m, mk);
    const __m256 a = _mm256_blendv_ps(_mm256_set1_ps(1.0f), exp2_ps(_mm256_mul_ps(_mm256_sub_ps(mold, mx), _mm256_set1_ps(c))), up);
    _mm256_maskstore_ps(m, mk, _mm256_blendv_ps(mold, mx, up));
    _mm256_maskstore_ps(l, mk, _mm256_mul_ps(_mm256_maskload_ps(l, mk), a));
    _mm256_maskstore_ps(alpha, mk, _mm256_mul_ps(_mm256_maskload_ps(alpha, mk), a));
    for (int r = 0; r < r0; r++) {
        float *s = S + (ptrdiff_t)r * lds;
        _mm256_maskstore_ps(s, mk, _mm256_mul_ps(_mm256_maskload_ps(s, mk), a));
    }
}

/* One MR × NV block: acc = K[MR rows] · QT[·][8·NV columns] over d, then P, ℓ in place. Returns whether m rose. */
AI int qk_softmax_ukr(const int MR, const int NV, const int TAIL, int d, const float *restrict K, ptrdiff_t ldk,
                      const float *restrict QT, ptrdiff_t ldqt, float *restrict S, ptrdiff_t lds, int r0, float c,
                      float *m, float *l, float *alpha, __m256i mk) {
    __m256 acc[6][2];
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) acc[i][v] = _mm256_setzero_ps();
    for (int p = 0; p < d; p++) {
        __m256 b[2];
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) b[v] = ld(TAIL, v, NV, QT + 8 * v, mk);
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            __m256 a = _mm256_broadcast_ss(K + i * ldk + p);
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++) acc[i][v] = _mm256_fmadd_ps(a, b[v], acc[i][v]);
        }
        QT += ldqt;
    }
    const __m256 vc = _mm256_set1_ps(c), slack = _mm256_set1_ps(FA_SOFTMAX_SLACK);
    const __m256i full = _mm256_set1_epi32(-1);
    int rose = 0;
#pragma GCC unroll 2
    for (int v = 0; v < NV; v++) {
        const __m256i vk = TAIL && v == NV - 1 ? mk : full;
        __m256 mx = acc[0][v];
#pragma GCC unroll 6
        for (int i = 1; i < MR; i++) mx = _mm256_max_ps(mx, acc[i][v]);
        __m256 cm = _mm256_mul_ps(ld(TAIL, v, NV, m + 8 * v, mk), vc);
        __m256 up = _mm256_and_ps(_mm256_cmp_ps(_mm256_fmsub_ps(mx, vc, cm), slack, _CMP_GT_OQ), _mm256_castsi256_ps(vk));
        if (__builtin_expect(!_mm256_testz_ps(up, up), 0)) {
            raise_max(up, mx, r0, S + 8 * v - (ptrdiff_t)r0 * lds, lds, c, m + 8 * v, l + 8 * v, alpha + 8 * v, vk);
            cm = _mm256_mul_ps(ld(TAIL, v, NV, m + 8 * v, mk), vc);
            rose = 1;
        }
        __m256 sum = _mm256_setzero_ps();
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            __m256 e = exp2_ps(_mm256_fmsub_ps(acc[i][v], vc, cm));
            st(TAIL, v, NV, S + i * lds + 8 * v, mk, e);
            sum = _mm256_add_ps(sum, e);
        }
        st(TAIL, v, NV, l + 8 * v, mk, _mm256_add_ps(ld(TAIL, v, NV, l + 8 * v, mk), sum));
    }
    return rose;
}

#define QKS_CASE(MR, NV, T)                                                                                 \
    case ((MR)*4 + (NV)) * 2 + (T):                                                                         \
        return qk_softmax_ukr(MR, NV, T, d, K, ldk, QT, ldqt, S, lds, r0, c, m, l, alpha, mk);
#define QKS_ROW(MR) QKS_CASE(MR, 1, 0) QKS_CASE(MR, 2, 0) QKS_CASE(MR, 1, 1) QKS_CASE(MR, 2, 1)

static int qk_softmax_any(int mr, int nv, int tail, int d, const float *K, ptrdiff_t ldk, const float *QT,
                          ptrdiff_t ldqt, float *S, ptrdiff_t lds, int r0, float c, float *m, float *l, float *alpha,
                          __m256i mk) {
    switch ((mr * 4 + nv) * 2 + tail) {
        QKS_ROW(1) QKS_ROW(2) QKS_ROW(3) QKS_ROW(4) QKS_ROW(5) QKS_ROW(6)
    default: return 0;
    }
}

static int qk_softmax_t(int nk, int nq, int d, const float *K, int ldk, const float *QT, int ldqt, float *S, int lds,
                        float c, float *m, float *l, float *alpha) {
    int rose = 0;
    for (int q = 0; q < nq; q++) alpha[q] = 1.0f;
    for (int j0 = 0; j0 < nq; j0 += 16) {
        const int nc = nq - j0 < 16 ? nq - j0 : 16, nv = (nc + 7) / 8, rem = nc - 8 * (nv - 1);
        const __m256i mk = tail_mask(rem);
        for (int i0 = 0; i0 < nk; i0 += 6) {
            const int mr = nk - i0 < 6 ? nk - i0 : 6;
            rose |= qk_softmax_any(mr, nv, rem < 8, d, K + (ptrdiff_t)i0 * ldk, ldk, QT + j0, ldqt,
                                   S + (ptrdiff_t)i0 * lds + j0, lds, i0, c, m + j0, l + j0, alpha + j0, mk);
        }
    }
    return rose;
}

/* P[r][j] = e^(S[r][j]·c − sub[r]) in place (backward): one rounding of the exponent, then ·log2 e and exp2. */
static void exp_rows(int rows, int cols, float *S, int lds, float c, const float *sub) {
    const __m256 vc = _mm256_set1_ps(c), l2e = _mm256_set1_ps(1.44269504088896340736f);
    for (int r = 0; r < rows; r++) {
        float *s = S + (ptrdiff_t)r * lds;
        const __m256 vs = _mm256_set1_ps(sub[r]);
        int j = 0;
        for (; j + 8 <= cols; j += 8)
            _mm256_storeu_ps(s + j, exp2_ps(_mm256_mul_ps(_mm256_fmsub_ps(_mm256_loadu_ps(s + j), vc, vs), l2e)));
        if (j < cols) {
            const __m256i mk = tail_mask(cols - j);
            __m256 x = _mm256_mul_ps(_mm256_fmsub_ps(_mm256_maskload_ps(s + j, mk), vc, vs), l2e);
            _mm256_maskstore_ps(s + j, mk, exp2_ps(x));
        }
    }
}

/* O[r][·] *= alpha[r]. */
static void scale_rows(int rows, int cols, float *O, int ldo, const float *alpha) {
    for (int r = 0; r < rows; r++) {
        if (alpha[r] == 1.0f) continue; /* exact either way; in a long row most blocks leave the max where it was */
        float *o = O + (ptrdiff_t)r * ldo;
        const __m256 a = _mm256_set1_ps(alpha[r]);
        int j = 0;
        for (; j + 8 <= cols; j += 8) _mm256_storeu_ps(o + j, _mm256_mul_ps(_mm256_loadu_ps(o + j), a));
        if (j < cols) {
            const __m256i mk = tail_mask(cols - j);
            _mm256_maskstore_ps(o + j, mk, _mm256_mul_ps(_mm256_maskload_ps(o + j, mk), a));
        }
    }
}

const fa_cpu_kernels fa_cpu_kernels_avx2 = {
    .isa = "avx2",
    .id = FA_CPU_ISA_AVX2,
    .gemm_nn = gemm_nn,
    .gemm_abt = gemm_abt,
    .pack_t = pack_t,
    .softmax_step_t = softmax_step_t,
    .qk_softmax_t = qk_softmax_t,
    .exp_rows = exp_rows,
    .scale_rows = scale_rows,
    .ds_rows = port_ds_rows,
    .rowdots = port_rowdots,
    .bf16_dot = 0,
    FA_PORTABLE_BF16_ENTRIES,
    .kvcache = &fa_kv_kernel_avx2,
};
