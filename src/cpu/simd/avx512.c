/* AVX-512 tile kernels on fp32 FMA: the avx512f table, and the fp32 entries of the avx512bf16 and amx tables. Built
 * with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma and no AVX512_BF16 (src/cpu/sources.cmake), so every entry
 * of the avx512f table runs on AVX-512 CPUs without it (Skylake-X, Cascade Lake, Ice Lake); the bf16 entries of
 * the levels above are simd/avx512bf16.c's. Only reached through fa_cpu_kernels_select() after a CPUID check.
 * docs/cpu-kernels.md explains the blocking and the exp2.
 *
 * Register blocking: C tiles of MR = 6 rows × NV = 4 zmm (64 columns) = 24 accumulators; per k step
 * NV vector loads of a B row, MR broadcasts of A, MR·NV FMAs. A is addressed as A[i·rsa + p·csa], so the same
 * kernel serves A·B (rsa = lda, csa = 1: broadcast along a row of A) and Aᵀ·B (rsa = 1, csa = lda). A·Bᵀ packs Bᵀ
 * into a k × 64 panel with a 16 × 16 in-register transpose and reuses it. The last zmm of a row is masked, so any
 * n works without padding. */
#include "cpu/simd/avx512_inl.h"
#include "cpu/simd/kernels.h"
#include "cpu/simd/kvcache.h"
#include "cpu/simd/portable.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* ---- fp32 GEMM micro-kernel ---- */

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

/* ---- 32-bit and 16-bit moves of the bf16 layouts (F/BW only, so here) ---- */

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

/* The fp32 entries every AVX-512 table shares. */
#define AVX512_F32_ENTRIES                                                                                      \
    .gemm_nn = gemm_nn, .gemm_abt = gemm_abt, .pack_t = pack_t, .softmax_step_t = softmax_step_t,             \
    .qk_softmax_t = qk_softmax_t, .exp_rows = exp_rows, .ds_rows = ds_rows, .scale_rows = scale_rows,         \
    .rowdots = port_rowdots

/* AVX-512 without AVX512_BF16: bf16 storage takes the fp32 path (bf16_dot = 0: its tiles are widened to fp32 as
 * they are loaded) and the bf16 entries are the portable ones, which no algorithm calls at this level. */
const fa_cpu_kernels fa_cpu_kernels_avx512f = {
    .isa = "avx512f",
    .id = FA_CPU_ISA_AVX512F,
    AVX512_F32_ENTRIES,
    .bf16_dot = 0,
    FA_PORTABLE_BF16_ENTRIES,
    .bf16_tiles = 0,
    .kvcache = &fa_kv_kernel_avx512f,
};

/* The bf16 entries on AVX512_BF16 (simd/avx512bf16.c); the amx table differs in its product only. */
#define AVX512BF16_ENTRIES                                                                                      \
    AVX512_F32_ENTRIES, .bf16_dot = 1, .pack_t32 = pack_t32, .pairs_f32_bf16 = fa_avx512bf16_pairs_f32_bf16,   \
    .pairs_bf16 = pairs_bf16, .softmax_rows_bf16 = fa_avx512bf16_softmax_rows_bf16,                             \
    .rows_f32_bf16 = fa_avx512bf16_rows_f32_bf16, .kvcache = &fa_kv_kernel_avx512bf16

const fa_cpu_kernels fa_cpu_kernels_avx512bf16 = {
    .isa = "avx512bf16",
    .id = FA_CPU_ISA_AVX512BF16,
    AVX512BF16_ENTRIES,
    .gemm_bf16 = fa_avx512bf16_gemm_bf16,
    .bf16_tiles = 0,
};

const fa_cpu_kernels fa_cpu_kernels_amx = {
    .isa = "amx",
    .id = FA_CPU_ISA_AMX,
    AVX512BF16_ENTRIES,
    .gemm_bf16 = fa_amx_gemm_bf16,
    .bf16_tiles = 1,
};
