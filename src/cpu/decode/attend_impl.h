/* The body of the CPU decode kernel (attend.h), written with GCC vector types of 16 floats so that each ISA file
 * that includes it (with its -m flags and -ffp-contract=fast) gets full-width loads and FMAs. Define
 * FA_DEC_ATTEND_NAME before including. */
#include "cpu/decode/attend.h"

#include "core/half.h"
#include "cpu/simd/portable.h"

#include <math.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));

#define LD(p) (*(const v16f *)(p))
#define ST(p, x) (*(v16f *)(p) = (x))

static inline float hsum16(v16f x) {
    x += __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    x += __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    x += __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    x += __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    return x[0];
}

/* 16 fp16 / bf16 bit patterns -> fp32 (exact; fp16 subnormals and inf/NaN included) */
static inline v16f bf16x16(const uint16_t *s) {
#ifdef __AVX512F__
    /* one vpmovzxwd zmm, m256 and a shift (the generic form below compiles to half-width moves and inserts) */
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)s)), 16));
#endif
    v16h h;
    memcpy(&h, s, 32);
    v16u u = __builtin_convertvector(h, v16u) << 16;
    v16f f;
    memcpy(&f, &u, 64);
    return f;
}
static inline v16f f16x16(const uint16_t *s) {
    v16h h;
    memcpy(&h, s, 32);
    v16u u = __builtin_convertvector(h, v16u);
    v16u em = u & 0x7fffu, bits = em << 13;
    v16f f;
    memcpy(&f, &bits, 64);
    f *= 0x1p112f; /* rebias the exponent; subnormals come out exact */
    v16u fb;
    memcpy(&fb, &f, 64);
    v16u special = (v16u)(em >= 0x7c00u); /* inf / NaN: all exponent bits set, mantissa kept */
    fb = (fb & ~special) | ((bits | 0x7f800000u) & special);
    fb |= (u & 0x8000u) << 16;
    memcpy(&f, &fb, 64);
    return f;
}

/* One key row of d elements -> fp32 dst[dp] (zero-padded); returns 0, or NaN if the row has a NaN/inf. */
static inline float row_to_f32(float *restrict dst, const char *src, fa_dtype dt, int d, int dp) {
    int i = 0;
    v16f bad = {0};
    if (dt == FA_DTYPE_F32) {
        const float *s = (const float *)src;
        for (; i + 16 <= d; i += 16) {
            v16f x;
            memcpy(&x, s + i, 64);
            ST(dst + i, x);
            bad += x * 0.0f;
        }
    } else if (dt == FA_DTYPE_BF16) {
        for (; i + 16 <= d; i += 16) {
            v16f x = bf16x16((const uint16_t *)src + i);
            ST(dst + i, x);
            bad += x * 0.0f;
        }
    } else {
        for (; i + 16 <= d; i += 16) {
            v16f x = f16x16((const uint16_t *)src + i);
            ST(dst + i, x);
            bad += x * 0.0f;
        }
    }
    float tail = 0;
    for (; i < d; i++) {
        dst[i] = fa_load_elem(src, (int)dt, i);
        tail += dst[i] * 0.0f;
    }
    for (; i < dp; i++) dst[i] = 0;
    return hsum16(bad) + tail;
}

#define FA_DEC_SAT 0x1p126f /* scores saturate here (the numerics contract: finite inputs never give NaN) */

#define AI static inline __attribute__((always_inline))

static inline v16f vsel(v16i m, v16f a, v16f b) { /* m ? a : b, lane by lane (m all ones or zero) */
    v16i x;
    memcpy(&x, &a, 64);
    v16i y;
    memcpy(&y, &b, 64);
    x = (x & m) | (y & ~m);
    v16f r;
    memcpy(&r, &x, 64);
    return r;
}

/* 2^x lane by lane: fa_port_exp2's reduction and polynomial (simd/portable.h), so every ISA gets the same values. */
static inline v16f vexp2(v16f x) {
    const v16f z = {0}, lo = z - 126.0f, hi = z + 127.0f;
    v16f y = vsel(x > -126.0f, x, lo);
    y = vsel(y < 127.0f, y, hi);
    const v16f n = (y + 12582912.0f) - 12582912.0f;
    const v16f f = y - n;
    v16f p = f * 1.338130212e-03f + 9.666368365e-03f;
    p = p * f + 5.550381169e-02f;
    p = p * f + 2.402234972e-01f;
    p = p * f + 6.931471825e-01f;
    p = p * f + 1.0f;
    const v16i e = (__builtin_convertvector(n, v16i) + 127) << 23;
    v16f sc;
    memcpy(&sc, &e, 64);
    return vsel(x > -126.0f, p * sc, z);
}

static inline float hmax16(v16f x) { /* a shuffle tree (a NaN lane may or may not win: the row is NaN anyway) */
    v16f y = __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    x = vsel(x > y, x, y);
    y = __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    x = vsel(x > y, x, y);
    y = __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    x = vsel(x > y, x, y);
    return x[0] > x[1] ? x[0] : x[1];
}

/* (Σ a, ·, ·, ·, Σ b, ·, ·, ·, Σ c, ·, ·, ·, Σ d, ·, ·, ·): four lane sums in 13 shuffles and adds. */
static inline v16f reduce4(v16f a, v16f b, v16f c, v16f d) {
#define FA_LO8 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define FA_HI8 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
    const v16f x = __builtin_shufflevector(a, b, FA_LO8) + __builtin_shufflevector(a, b, FA_HI8);
    const v16f y = __builtin_shufflevector(c, d, FA_LO8) + __builtin_shufflevector(c, d, FA_HI8);
    v16f w = __builtin_shufflevector(x, y, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
             __builtin_shufflevector(x, y, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    w += __builtin_shufflevector(w, w, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    w += __builtin_shufflevector(w, w, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    return w;
#undef FA_LO8
#undef FA_HI8
}

/* NV vectors of one key row in fp32 (zero-padded past d). Rows whose d is a multiple of 16 convert in registers;
 * others go through tmp. */
AI void row_regs(v16f *x, const char *src, fa_dtype dt, int d, float *tmp, const int NV) {
    if ((d & 15) == 0) {
#pragma GCC unroll 16
        for (int i = 0; i < NV; i++) {
            if (dt == FA_DTYPE_BF16) x[i] = bf16x16((const uint16_t *)src + 16 * i);
            else if (dt == FA_DTYPE_F16) x[i] = f16x16((const uint16_t *)src + 16 * i);
            else memcpy(&x[i], (const float *)src + 16 * i, 64);
        }
        return;
    }
    (void)row_to_f32(tmp, src, dt, d, 16 * NV);
#pragma GCC unroll 16
    for (int i = 0; i < NV; i++) x[i] = LD(tmp + 16 * i);
}

/* One chunk of n <= 16 keys from j0 with NV = dp / 16 vectors per row (a compile-time constant after inlining). Kj
 * is read in key order — key t's rows of every head of the item, which are adjacent in the [.., seq, heads, d]
 * layouts — and converted in registers, so the cache streams in address order (which the hardware prefetcher
 * follows) and nothing is expanded into a buffer; Vj's rows are prefetched in that same order and read head by head
 * once they are in cache. */
AI void chunk(const fa_dec_args *a, int64_t j0, int n, const char *const *kr, const char *const *vr, const int NV) {
    const int R = a->R, nh = a->nh, dp = a->dp, d = a->d, rows = R * nh;
    const int row_bytes = d * (int)fa_dtype_size(a->dtype);
    float *S = a->S; /* rows x 16: the row's scores, then P */
    _Alignas(64) float tmp[256];
    const v16f z = {0};
    /* S = Qi Kjᵀ: the raw dots of every row (a NaN/inf in the key row adds NaN), four rows reduced together */
    for (int jj = 0; jj < n; jj++) {
        for (int hh = 0; hh < nh; hh++) {
            v16f k[16] = {{0}};
            row_regs(k, kr[jj] + hh * a->k_sh, a->dtype, d, tmp, NV);
            for (int c = 0; c < row_bytes; c += 64) __builtin_prefetch(vr[jj] + hh * a->v_sh + c, 0, 3);
            v16f bad = k[0] * 0.0f;
#pragma GCC unroll 16
            for (int i = 1; i < NV; i++) bad += k[i] * 0.0f;
            const float *q = a->qs + (size_t)hh * R * dp;
            float *s = S + (size_t)hh * R * 16 + jj;
            int r = 0;
            for (; r + 4 <= R; r += 4, q += 4 * dp, s += 64) {
                v16f x0 = bad + LD(q) * k[0], x1 = bad + LD(q + dp) * k[0];
                v16f x2 = bad + LD(q + 2 * dp) * k[0], x3 = bad + LD(q + 3 * dp) * k[0];
#pragma GCC unroll 16
                for (int i = 1; i < NV; i++) {
                    x0 += LD(q + 16 * i) * k[i];
                    x1 += LD(q + dp + 16 * i) * k[i];
                    x2 += LD(q + 2 * dp + 16 * i) * k[i];
                    x3 += LD(q + 3 * dp + 16 * i) * k[i];
                }
                const v16f w = reduce4(x0, x1, x2, x3);
                s[0] = w[0], s[16] = w[4], s[32] = w[8], s[48] = w[12];
            }
            for (; r < R; r++, q += dp, s += 16) {
                v16f x = bad + LD(q) * k[0];
#pragma GCC unroll 16
                for (int i = 1; i < NV; i++) x += LD(q + 16 * i) * k[i];
                s[0] = hsum16(x);
            }
        }
    }
    /* per row, on its 16 scores at once: softcap, saturation, q's NaN flag, the keys it does not see to −inf; then
     * the online softmax: m_new = max(m, rowmax(S)); P = 2^(S − m_new); l = 2^(m − m_new) l + rowsum(P);
     * O = 2^(m − m_new) O */
    const v16i lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    for (int row = 0; row < rows; row++) {
        const int r = row % R;
        const int64_t lo = a->lo[r] > j0 ? a->lo[r] : j0, hi = a->hi[r] < j0 + n ? a->hi[r] : j0 + n;
        if (hi <= lo) continue;
        v16f Sv = LD(S + 16 * row);
        if (a->softcap_mul != 0)
            for (int jj = 0; jj < 16; jj++) Sv[jj] = a->softcap_mul * tanhf(Sv[jj]);
        Sv = vsel(Sv > FA_DEC_SAT, z + FA_DEC_SAT, vsel(Sv < -FA_DEC_SAT, z - FA_DEC_SAT, Sv)) + a->qbad[row];
        const v16i vis = (lane >= (int)(lo - j0)) & (lane < (int)(hi - j0));
        /* a NaN among the visible scores makes l, and so the row, NaN */
        const v16f nan = vsel(vis, Sv * 0.0f, z);
        Sv = vsel(vis, Sv, z - INFINITY);
        float mx = hmax16(Sv);
        if (mx > a->m[row]) {
            const float alpha = fa_port_exp2(a->m[row] - mx);
            a->l[row] *= alpha;
            float *o = a->O + (size_t)row * dp;
#pragma GCC unroll 16
            for (int i = 0; i < NV; i++) ST(o + 16 * i, LD(o + 16 * i) * alpha);
            a->m[row] = mx;
        }
        const v16f P = vexp2(Sv - a->m[row]);
        a->l[row] += hsum16(P + nan);
        ST(S + 16 * row, P);
    }
    /* O += P Vj, head by head (Vj was prefetched in key order during the K pass), two rows at a time with their O
     * in registers; a row adds only the keys it sees (P = 0 elsewhere, but a NaN in v must not reach it) */
    for (int hh = 0; hh < nh; hh++)
        for (int r = 0; r < R; r += 2) {
            const int two = r + 1 < R, row = hh * R + r;
            const int64_t lo = a->lo[r] < (two ? a->lo[r + 1] : a->lo[r]) ? a->lo[r] : a->lo[r + two];
            const int64_t hi = a->hi[r] > (two ? a->hi[r + 1] : a->hi[r]) ? a->hi[r] : a->hi[r + two];
            const int ja = (int)(lo > j0 ? lo - j0 : 0), jb = (int)(hi < j0 + n ? hi - j0 : n);
            if (jb <= ja) continue;
            float *o0 = a->O + (size_t)row * dp, *o1 = o0 + (two ? dp : 0);
            v16f A[16] = {{0}}, B[16] = {{0}};
#pragma GCC unroll 16
            for (int i = 0; i < NV; i++) A[i] = LD(o0 + 16 * i), B[i] = LD(o1 + 16 * i);
            for (int jj = ja; jj < jb; jj++) {
                const int64_t t = j0 + jj;
                const int see0 = t >= a->lo[r] && t < a->hi[r], see1 = two && t >= a->lo[r + 1] && t < a->hi[r + 1];
                v16f v[16] = {{0}};
                row_regs(v, vr[jj] + hh * a->v_sh, a->dtype, d, tmp, NV);
                const float p0 = S[16 * row + jj], p1 = two ? S[16 * (row + 1) + jj] : 0.0f;
                if (see0 && see1) {
#pragma GCC unroll 16
                    for (int i = 0; i < NV; i++) A[i] += p0 * v[i], B[i] += p1 * v[i];
                } else if (see0) {
#pragma GCC unroll 16
                    for (int i = 0; i < NV; i++) A[i] += p0 * v[i];
                } else if (see1) {
#pragma GCC unroll 16
                    for (int i = 0; i < NV; i++) B[i] += p1 * v[i];
                }
            }
#pragma GCC unroll 16
            for (int i = 0; i < NV; i++) {
                ST(o0 + 16 * i, A[i]);
                if (two) ST(o1 + 16 * i, B[i]);
            }
        }
}

/* Row addresses of keys [j0, j0 + n) for the item's first head. */
static inline void key_rows(const fa_dec_args *a, int64_t j0, int n, const char **kr, const char **vr) {
    for (int jj = 0; jj < n; jj++) {
        const int64_t t = j0 + jj;
        if (a->bt) {
            const int64_t pg = a->bt[t / a->page_size], off = t % a->page_size;
            kr[jj] = a->kbase + pg * a->k_sp + off * a->k_ss;
            vr[jj] = a->vbase + pg * a->v_sp + off * a->v_ss;
        } else {
            kr[jj] = a->kbase + t * a->k_ss;
            vr[jj] = a->vbase + t * a->v_ss;
        }
    }
}

void FA_DEC_ATTEND_NAME(const fa_dec_args *a) {
    const char *kr[FA_DEC_BC], *vr[FA_DEC_BC];
    for (int64_t j0 = a->k0; j0 < a->k1; j0 += FA_DEC_BC) {
        const int n = (int)(a->k1 - j0 < FA_DEC_BC ? a->k1 - j0 : FA_DEC_BC);
        key_rows(a, j0, n, kr, vr);
        /* head dims 1..256 in 1..16 vectors: the common ones with their count fixed at compile time */
        switch (a->dp / 16) {
        case 2: chunk(a, j0, n, kr, vr, 2); break;
        case 4: chunk(a, j0, n, kr, vr, 4); break;
        case 8: chunk(a, j0, n, kr, vr, 8); break;
        case 16: chunk(a, j0, n, kr, vr, 16); break;
        default: chunk(a, j0, n, kr, vr, a->dp / 16); break;
        }
    }
}
