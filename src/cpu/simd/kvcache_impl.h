/* The body of the CPU KV-cache attend kernel (kvcache.h), written with GCC vector types of VW floats — the ISA's register
 * width: 16 (a zmm; the scalar build takes 16 too, as generic vectors), 8 on AVX2 (a ymm: 16-float vectors there
 * would be register pairs and spill) — so that each ISA file that includes it (with its -m flags and
 * -ffp-contract=fast) gets full-width loads and FMAs. Define FA_KV_KERNEL_NAME (the kernel's symbol) and
 * FA_KV_KERNEL_STATS (its name in fa_stats) before including.
 * docs/kvcache.md explains the loop order and the prefetching, with their measurements. */
#include "cpu/simd/kvcache.h"

#include "core/half.h"
#include "cpu/simd/portable.h"

#include <math.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX2__) && !defined(__AVX512F__)
#define VW 8
#else
#define VW 16
#endif
#define FA_KV_GROUP (2 * VW) /* the bf16 lane group of fa_kv_lane: two vectors */
/* bf16 rows on AVX-512 BF16: O += P V by vdpbf16ps, P rounded to bf16 (as a bf16 tensor-core product takes it; l sums
 * the fp32 P) against V rows interleaved by pairs of keys, half the instructions of converting V to fp32 */
#ifndef FA_KV_KEYPAIRS
#define FA_KV_KEYPAIRS 1 /* 0: V converted to fp32 as on the other ISAs (for A/B runs) */
#endif
#if defined(__AVX512BF16__) && FA_KV_KEYPAIRS
#define KEYPAIRS 1
#else
#define KEYPAIRS 0
#endif

typedef float vf __attribute__((vector_size(4 * VW)));
typedef int32_t vi __attribute__((vector_size(4 * VW)));
typedef uint32_t vu __attribute__((vector_size(4 * VW)));
typedef uint16_t vh __attribute__((vector_size(2 * VW)));

#define LD(p) (*(const vf *)(p))
#define ST(p, x) (*(vf *)(p) = (x))

/* x in every lane: one broadcast (a load's broadcast where x comes from memory); `x + (vf){0}` would add a zero
 * first, which the compiler may not fold (it changes −0). */
static inline __attribute__((always_inline)) vf vbcast(float x) {
#if VW == 8
    return _mm256_set1_ps(x);
#elif defined(__AVX512F__)
    return _mm512_set1_ps(x);
#else
    vf r;
    for (int i = 0; i < VW; i++) r[i] = x;
    return r;
#endif
}
#define AI static inline __attribute__((always_inline))

/* How a row's elements become fp32 vectors: a compile-time constant of the loops below (M_F8: E4M3 bytes, read as
 * their values · 2^-8, FA_KV_F8_SCALE) */
enum { M_F32, M_BF16, M_F16, M_F8, M_ANY };

/* Halves folded onto each other: after it, every lane of the low half holds op over both halves. */
#if VW == 16
#define FOLD(x, OP)                                                                                                    \
    x = OP(x, __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));                   \
    x = OP(x, __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));                   \
    x = OP(x, __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13))
#else
#define FOLD(x, OP)                                                                                                    \
    x = OP(x, __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3));                                                  \
    x = OP(x, __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5))
#endif
#define VADD(a, b) ((a) + (b))

static inline float hsum(vf x) {
    FOLD(x, VADD);
    return x[0] + x[1];
}

/* 2·VW bf16 -> their VW even elements and their VW odd ones in fp32 (exact): a 32-bit lane holds a pair, so one
 * shift and one mask convert it, with no widening shuffle (the lane order of fa_kv_lane) */
AI void bf16_pairs(const char *s, vf *even, vf *odd) {
    vu u;
    memcpy(&u, s, sizeof u);
    const vu e = u << 16, o = u & 0xffff0000u;
    memcpy(even, &e, sizeof e);
    memcpy(odd, &o, sizeof o);
}
static inline vf bf16_vec(const uint16_t *s) { /* VW bf16 -> fp32, in order */
    vh h;
    memcpy(&h, s, sizeof h);
    vu u = __builtin_convertvector(h, vu) << 16;
    vf f;
    memcpy(&f, &u, sizeof f);
    return f;
}
/* VW fp16 -> fp32 (exact; subnormals and inf/NaN included) */
static inline vf f16_vec(const uint16_t *s) {
#ifdef __AVX512F__
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s)); /* one vcvtph2ps instead of the bit algebra below */
#elif defined(__F16C__) && VW == 8
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)s));
#else
    vh h;
    memcpy(&h, s, sizeof h);
    vu u = __builtin_convertvector(h, vu);
    vu em = u & 0x7fffu, bits = em << 13;
    vf f;
    memcpy(&f, &bits, sizeof f);
    f *= 0x1p112f; /* rebias the exponent; subnormals come out exact */
    vu fb;
    memcpy(&fb, &f, sizeof fb);
    vu special = (vu)(em >= 0x7c00u); /* inf / NaN: all exponent bits set, mantissa kept */
    fb = (fb & ~special) | ((bits | 0x7f800000u) & special);
    fb |= (u & 0x8000u) << 16;
    memcpy(&f, &fb, sizeof f);
    return f;
#endif
}

/* VW E4M3 bytes -> fp32, exact and branch-free: normal numbers rebiased in the integer bits (7 -> 127), subnormals
 * m·2^-9 from an exact int conversion (no fp32 subnormal, so DAZ cannot touch them), 0x7f a NaN, then the sign. */
typedef uint8_t vb8 __attribute__((vector_size(VW)));
static inline vf e4m3_vec(const uint8_t *s) {
    vb8 b;
    memcpy(&b, s, sizeof b);
    const vu u = __builtin_convertvector(b, vu), a = u & 0x7f;
    const vf sub = __builtin_convertvector((vi)a, vf) * 0x1p-9f;
    vu x, sb;
    memcpy(&sb, &sub, sizeof sb);
    const vu is_sub = (vu)(a < 8), is_nan = (vu)(a == 0x7f);
    x = (sb & is_sub) | (((a << 20) + (120u << 23)) & ~is_sub);
    x = (x & ~is_nan) | (0x7fc00000u & is_nan);
    x |= (u & 0x80) << 24;
    vf r;
    memcpy(&r, &x, sizeof r);
    return r;
}

/* VW E4M3 bytes -> their values · 2^-8 (FA_KV_F8_SCALE, folded into the descales by the caller), exact. With F16C
 * or AVX-512, the byte sign-extended to 16 bits and shifted left by 7 holds the sign at bit 15 and the magnitude at
 * bits 13..7: an fp16 of that value · 2^-8 (E4M3 subnormals land on fp16 subnormals, which vcvtph2ps converts
 * exactly whatever MXCSR says) once bit 14, a second copy of the sign, is cleared — or set for 0x7f/0xff (NaN), whose
 * magnitude +1 carries into it: bit 14 := bit 14 of t XOR bit 14 of t + 0x80. Five ops a vector, no table. */
static inline vf e4m3_vec8(const uint8_t *s) {
#if defined(__AVX512F__) || (defined(__F16C__) && VW == 8)
#if VW == 16
    const vh w = (vh)_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)s));
#else
    const vh w = (vh)_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)s));
#endif
    const vh t = w << 7, h = t ^ ((t + 0x80u) & 0x4000u);
#if VW == 16
    return _mm512_cvtph_ps((__m256i)h);
#else
    return _mm256_cvtph_ps((__m128i)h);
#endif
#else
    return e4m3_vec(s) * 0x1p-8f;
#endif
}

/* AVX2: 2·VW E4M3 bytes -> two vectors, the integer steps on all 16 at once (a ymm of fp16) */
#if VW == 8 && defined(__F16C__)
#define F8_STEP 2 /* row_vecs converts E4M3 vectors in pairs */
AI void e4m3_pair8(const uint8_t *s, vf *lo, vf *hi) {
    typedef uint16_t vh16 __attribute__((vector_size(32)));
    const vh16 w = (vh16)_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)s));
    const vh16 t = w << 7, h = t ^ ((t + 0x80u) & 0x4000u);
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128((__m256i)h));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256((__m256i)h, 1));
}
#else
#define F8_STEP 1
#endif
/* The vectors row_vecs takes at once in MODE: bf16 pairs; E4M3 pairs on AVX2 */
#define VSTEP(MODE) ((MODE) == M_BF16 ? 2 : (MODE) == M_F8 ? F8_STEP : 1)

/* One row of d elements -> fp32 dst[dp] in order, zero-padded (M_ANY: any dtype, any d; E4M3 as M_F8 reads it). */
static void row_to_f32(float *restrict dst, const char *src, fa_dtype dt, int d, int dp) {
    int i = 0;
    if (dt == FA_DTYPE_F32) {
        for (; i + VW <= d; i += VW) memcpy(dst + i, (const float *)src + i, 4 * VW);
    } else if (dt == FA_DTYPE_BF16) {
        for (; i + VW <= d; i += VW) ST(dst + i, bf16_vec((const uint16_t *)src + i));
    } else if (dt == FA_DTYPE_F8_E4M3) { /* an FP8 cache: exact · 2^-8, the descales are folded into q and O outside */
        /* by vectors (e4m3_vec8), the tail by e4m3_vec's steps per element */
        const uint8_t *s8 = (const uint8_t *)src;
        for (; i + VW <= d; i += VW) ST(dst + i, e4m3_vec8(s8 + i));
        for (; i < d; i++) {
            const uint32_t u = s8[i], a = u & 0x7f, nb = (a << 20) + (120u << 23);
            float fn, x;
            memcpy(&fn, &nb, sizeof fn);
            x = a < 8 ? (float)(int)a * 0x1p-9f : fn;
            x = a == 0x7f ? NAN : x;
            uint32_t xb;
            memcpy(&xb, &x, sizeof xb);
            xb |= (u & 0x80) << 24;
            memcpy(&x, &xb, sizeof x);
            dst[i] = x * 0x1p-8f;
        }
    } else {
        for (; i + VW <= d; i += VW) ST(dst + i, f16_vec((const uint16_t *)src + i));
    }
    for (; i < d; i++) dst[i] = fa_load_elem(src, (int)dt, i);
    for (; i < dp; i++) dst[i] = 0;
}

/* Vectors [v0, v0 + nv) of one K or V row (d elements, padded to dp) in the kernel's lane order (v0 and nv
 * multiples of VSTEP(MODE)). */
AI void row_vecs(vf *x, const char *src, int v0, int nv, const int MODE, const fa_kv_args *a, int d, int dp,
                 float *tmp) {
    if (MODE == M_BF16) {
#pragma GCC unroll 16
        for (int i = 0; i < nv; i += 2) bf16_pairs(src + 2 * VW * (v0 + i), &x[i], &x[i + 1]);
    } else if (MODE == M_F16) {
#pragma GCC unroll 16
        for (int i = 0; i < nv; i++) x[i] = f16_vec((const uint16_t *)src + VW * (v0 + i));
    } else if (MODE == M_F32) {
#pragma GCC unroll 16
        for (int i = 0; i < nv; i++) memcpy(&x[i], (const float *)src + VW * (v0 + i), 4 * VW);
    } else if (MODE == M_F8) {
#if VW == 8 && defined(__F16C__)
#pragma GCC unroll 16
        for (int i = 0; i < nv; i += 2) e4m3_pair8((const uint8_t *)src + VW * (v0 + i), &x[i], &x[i + 1]);
#else
#pragma GCC unroll 16
        for (int i = 0; i < nv; i++) x[i] = e4m3_vec8((const uint8_t *)src + VW * (v0 + i));
#endif
    } else {
        /* only the piece's elements: the callers walk a row piece by piece, and converting the whole row for each
         * piece cost an FP8 cache (which only this path reads) 4x its conversions at d = 128 */
        const int off = VW * v0, n = d - off < VW * nv ? d - off : VW * nv;
        (void)dp;
        row_to_f32(tmp, src + (size_t)off * fa_dtype_size(a->dtype), a->dtype, n > 0 ? n : 0, VW * nv);
        for (int i = 0; i < nv; i++) x[i] = LD(tmp + VW * i);
    }
}

#define FA_KV_SAT 0x1p126f /* scores saturate here (the numerics contract: finite inputs never give NaN) */

static inline vf vsel(vi m, vf a, vf b) { /* m ? a : b, lane by lane (m all ones or zero) */
    vi x;
    memcpy(&x, &a, sizeof x);
    vi y;
    memcpy(&y, &b, sizeof y);
    x = (x & m) | (y & ~m);
    vf r;
    memcpy(&r, &x, sizeof r);
    return r;
}

/* 2^x lane by lane: fa_port_exp2's reduction and polynomial (simd/portable.h), so every ISA gets the same values. */
static inline vf vexp2(vf x) {
    const vf z = {0}, lo = z - 126.0f, hi = z + 127.0f;
    vf y = vsel(x > -126.0f, x, lo);
    y = vsel(y < 127.0f, y, hi);
    const vf n = (y + 12582912.0f) - 12582912.0f;
    const vf f = y - n;
    vf p = f * 1.338130212e-03f + 9.666368365e-03f;
    p = p * f + 5.550381169e-02f;
    p = p * f + 2.402234972e-01f;
    p = p * f + 6.931471825e-01f;
    p = p * f + 1.0f;
    const vi e = (__builtin_convertvector(n, vi) + 127) << 23;
    vf sc;
    memcpy(&sc, &e, sizeof sc);
    return vsel(x > -126.0f, p * sc, z);
}

#define VMAX(a, b) vsel((a) > (b), (a), (b))
static inline float hmax(vf x) { /* a shuffle tree (a NaN lane may or may not win: the row is NaN anyway) */
    FOLD(x, VMAX);
    return x[0] > x[1] ? x[0] : x[1];
}

#if VW == 16
/* Sixteen lane sums at once: lane L of the result is the sum of the lanes of x[SUM_SRC(L)] (30 shuffles and 15 adds:
 * two per dot product, where one sum at a time takes four and an extraction). */
#define SUM_SRC(L) (4 * ((L) & 3) + ((L) >> 2))
AI vf sum_lanes(const vf *x) {
    vf y[8], z[4], w[2];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++)
        y[k] = __builtin_shufflevector(x[2 * k], x[2 * k + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector(x[2 * k], x[2 * k + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        z[k] = __builtin_shufflevector(y[2 * k], y[2 * k + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
               __builtin_shufflevector(y[2 * k], y[2 * k + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
#pragma GCC unroll 2
    for (int k = 0; k < 2; k++)
        w[k] = __builtin_shufflevector(z[2 * k], z[2 * k + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
               __builtin_shufflevector(z[2 * k], z[2 * k + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    return __builtin_shufflevector(w[0], w[1], 0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30) +
           __builtin_shufflevector(w[0], w[1], 1, 3, 17, 19, 5, 7, 21, 23, 9, 11, 25, 27, 13, 15, 29, 31);
}
#else
/* Eight lane sums at once: lane L of the result is the sum of the lanes of x[SUM_SRC(L)] (L's 3 bits reversed). */
#define SUM_SRC(L) (((L) & 1) << 2 | ((L) & 2) | ((L) >> 2 & 1))
AI vf sum_lanes(const vf *x) {
    vf y[4], z[2];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        y[k] = __builtin_shufflevector(x[2 * k], x[2 * k + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
               __builtin_shufflevector(x[2 * k], x[2 * k + 1], 4, 5, 6, 7, 12, 13, 14, 15);
#pragma GCC unroll 2
    for (int k = 0; k < 2; k++)
        z[k] = __builtin_shufflevector(y[2 * k], y[2 * k + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
               __builtin_shufflevector(y[2 * k], y[2 * k + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    return __builtin_shufflevector(z[0], z[1], 0, 8, 2, 10, 4, 12, 6, 14) +
           __builtin_shufflevector(z[0], z[1], 1, 9, 3, 11, 5, 13, 7, 15);
}
#endif

/* The next chunk's rows, prefetched a few lines at a time (a burst of them makes the demand loads behind it
 * wait). Where the item's heads are adjacent in memory, the whole rows (all heads) in address order: each head's
 * slice of rows alone is too scattered for the hardware prefetchers. K's rows first, spread over the QKᵀ steps, then
 * V's over the PV steps: K and V lines at the same offset back to back can fall on one DRAM bank, and QKᵀ without
 * prefetches would leave the memory idle for part of the chunk. Else head hh's K and V rows over its own PV loop. */
/* Most of the next chunk's K lines a QKᵀ step prefetches (the rest go over the PV steps, before V's): MHA has few
 * QKᵀ steps per chunk, and all its K lines at once would hold up the demand loads. */
#ifndef FA_KV_QK_PF_MAX
#define FA_KV_QK_PF_MAX 16
#endif
/* Where the PV steps' lines go: L1 on AVX2, where that measured faster than L2 (docs/kvcache.md); L2 else. The
 * QKᵀ steps' go to L2. */
#ifndef FA_KV_PF_LOCALITY
#define FA_KV_PF_LOCALITY (VW == 8 ? 3 : 2)
#endif
/* The next chunk's rows as runs of rows adjacent in memory (K's runs, then V's; a contiguous cache's chunk is one
 * run of each), walked a line at a time by a cursor of one pointer: a line costs a prefetch, an add and a compare,
 * where per-row bookkeeping was a visible share of the kernel. */
typedef struct pf_run { const char *a, *z; } pf_run;
typedef struct pf_rows {
    const pf_run *run;
    int n, nk;       /* runs; the first nk are K's */
    int per;         /* lines per PV key step */
    int i;           /* the cursor: run i (n: done), at p, up to z */
    const char *p, *z;
    int64_t ok, ov;  /* the offset of the head it prefetches in K's and V's rows */
} pf_rows;
AI void pf_next(pf_rows *pf) { /* the cursor to the start of the next run (or done) */
    if (++pf->i < pf->n) {
        const int64_t o = pf->i < pf->nk ? pf->ok : pf->ov;
        pf->p = pf->run[pf->i].a + o, pf->z = pf->run[pf->i].z + o;
    }
}
AI void pf_lines_at(pf_rows *pf, int count, const int L2) { /* L2: t1 always */
    for (int i = 0; i < count && pf->p < pf->z; i++) {
        if (L2) __builtin_prefetch(pf->p, 0, 2);
        else __builtin_prefetch(pf->p, 0, FA_KV_PF_LOCALITY);
        if ((pf->p += 64) >= pf->z) pf_next(pf);
    }
}
AI void pf_lines(pf_rows *pf, int count) { pf_lines_at(pf, count, 0); }
/* The cursor at the start of head hh's runs (hh = 0: whole rows). */
AI void pf_start(pf_rows *pf, const fa_kv_args *a, int hh) {
    pf->ok = hh * a->k_sh, pf->ov = hh * a->v_sh, pf->i = -1, pf->p = pf->z = NULL;
    pf_next(pf);
}
/* Rows of `bytes` at rows[0..n) merged into runs at out; returns their count. */
static inline int pf_runs(const char *const *rows, int n, int bytes, pf_run *out) {
    int m = 0;
    for (int j = 0; j < n; j++) {
        if (m && out[m - 1].z == rows[j]) out[m - 1].z += bytes;
        else out[m].a = rows[j], out[m].z = rows[j] + bytes, m++;
    }
    return m;
}

/* S = Qi Kjᵀ for rows [r0, r0 + NR) of head hh and the chunk's keys: NR·NK = VW raw dots per group of NK keys,
 * each key's vectors converted once for the NR rows, the group's VW sums in one sum_lanes. */
AI void qk(const fa_kv_args *a, const char *const *kr, int n, int hh, int r0, const int NR, const int MODE, float *tmp,
          pf_rows *pf, int cnt) {
    const int NK = VW / NR, NV = a->dp / VW, dp = a->dp, STEP = VSTEP(MODE);
    const float *q = a->qs + ((size_t)hh * a->R + r0) * dp;
    float *S = a->S + ((size_t)hh * a->R + r0) * FA_KV_BC;
    for (int j0 = 0; j0 < n; j0 += NK) {
        if (cnt) pf_lines_at(pf, cnt, 1);
        vf acc[VW] = {{0}}; /* acc[r·NK + j]: row r0 + r, key j0 + j */
#ifdef __AVX512BF16__
        if (MODE == M_BF16) { /* bf16 K rows as they are: one vdpbf16ps per row and 32 elements (two with hi + lo) */
            const uint16_t *qb = a->qb + ((size_t)hh * a->R + r0) * 2 * dp;
            for (int i = 0; i < NV; i += 2)
#pragma GCC unroll 16
                for (int j = 0; j < NK; j++) {
                    const __m512bh k = (__m512bh)_mm512_loadu_si512(kr[j0 + j] + hh * a->k_sh + 2 * VW * i);
#pragma GCC unroll 16
                    for (int r = 0; r < NR; r++) {
                        const uint16_t *q0 = qb + (size_t)r * 2 * dp + VW * i;
                        __m512 x = (__m512)acc[r * NK + j];
                        x = _mm512_dpbf16_ps(x, (__m512bh)_mm512_loadu_si512(q0), k);
                        if (a->qb_parts == 2) x = _mm512_dpbf16_ps(x, (__m512bh)_mm512_loadu_si512(q0 + dp), k);
                        acc[r * NK + j] = (vf)x;
                    }
                }
        } else
#endif
        if (MODE == M_ANY) {
            for (int j = 0; j < NK; j++) {
                row_to_f32(tmp, kr[j0 + j] + hh * a->k_sh, a->dtype, a->d, dp);
                for (int i = 0; i < NV; i++)
#pragma GCC unroll 16
                    for (int r = 0; r < NR; r++) acc[r * NK + j] += LD(q + r * dp + VW * i) * LD(tmp + VW * i);
            }
        } else {
            for (int i = 0; i < NV; i += STEP) /* a loop, not unrolled: the VW sums stay in registers */
#pragma GCC unroll 16
                for (int j = 0; j < NK; j++) {
                    vf k[2];
                    row_vecs(k, kr[j0 + j] + hh * a->k_sh, i, STEP, MODE, a, a->d, dp, tmp);
#pragma GCC unroll 16
                    for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
                        for (int s = 0; s < STEP; s++) acc[r * NK + j] += LD(q + r * dp + VW * (i + s)) * k[s];
                }
        }
        vf x[VW];
#pragma GCC unroll 16
        for (int L = 0; L < VW; L++) x[SUM_SRC(L)] = acc[L];
        vf w = sum_lanes(x);
#ifdef __AVX512BF16__
        if (MODE == M_BF16) w *= a->qb_mul;
#endif
#pragma GCC unroll 16
        for (int r = 0; r < NR; r++) memcpy(S + r * FA_KV_BC + j0, (const float *)&w + r * NK, sizeof(float) * NK);
    }
}

/* The online softmax of row `row` on its FA_KV_BC scores, VW at a time. A non-finite visible dot (a NaN/inf in the
 * key row, or q·k beyond fp32) makes l NaN, so the row's state fails the contract's check and is recomputed; then
 * softcap, saturation, q's NaN flag and −inf for the keys the row does not see; m_new = max(m, rowmax(S));
 * P = 2^(S − m_new); l = 2^(m − m_new) l + rowsum(P), kept by lane in Lv (summed once, at the end of the item);
 * O = 2^(m − m_new) O. S is left holding P (as bf16 pairs where PV takes them so). */
AI void softmax_row(const fa_kv_args *a, int row, int64_t j0, int n, const int MODE) {
    const int r = row % a->R, NS = FA_KV_BC / VW;
    const int64_t lo = a->lo[r] > j0 ? a->lo[r] : j0, hi = a->hi[r] < j0 + n ? a->hi[r] : j0 + n;
    const vf z = {0};
    if (hi <= lo) { /* P = 0: the rows of a group share pv's key loop */
        for (int s = 0; s < NS; s++) ST(a->S + (size_t)row * FA_KV_BC + VW * s, z);
        return;
    }
    vi lane;
    for (int i = 0; i < VW; i++) lane[i] = i;
    float *S = a->S + (size_t)row * FA_KV_BC, *Lv = a->Lv + (size_t)row * 16;
    vf Sv[FA_KV_BC / VW], nan = z, mxv = z - INFINITY;
    const vf qbad = vbcast(a->qbad[row]);
#pragma GCC unroll 4
    for (int s = 0; s < NS; s++) {
        vf x = LD(S + VW * s);
        const vi vis = (lane + VW * s >= (int)(lo - j0)) & (lane + VW * s < (int)(hi - j0));
        nan += vsel(vis, x * 0.0f, z);
        if (a->softcap_mul != 0)
            for (int jj = 0; jj < VW; jj++) x[jj] = a->softcap_mul * tanhf(x[jj]);
        x = vsel(x > FA_KV_SAT, z + FA_KV_SAT, vsel(x < -FA_KV_SAT, z - FA_KV_SAT, x)) + qbad;
        Sv[s] = vsel(vis, x, z - INFINITY);
        mxv = vsel(Sv[s] > mxv, Sv[s], mxv);
    }
    const float mx = hmax(mxv);
    vf lv = LD(Lv) + nan;
    if (mx > a->m[row]) {
        const float alpha = fa_port_exp2(a->m[row] - mx);
        const vf av = vbcast(alpha);
        lv *= av;
        float *o = a->O + (size_t)row * a->dvp;
        for (int i = 0; i < a->dvp; i += VW) ST(o + i, LD(o + i) * av);
        a->m[row] = mx;
    }
    const vf mv = vbcast(a->m[row]);
    const int pairs = KEYPAIRS && MODE == M_BF16; /* PV takes P as bf16 pairs (pv_keys) */
    vf P[FA_KV_BC / VW];
#pragma GCC unroll 4
    for (int s = 0; s < NS; s++) {
        P[s] = vexp2(Sv[s] - mv);
        lv += P[s];
        if (!pairs) ST(S + VW * s, P[s]);
    }
#if KEYPAIRS
    if (pairs) /* the row's P as bf16, in key order: one 32-bit pair per pair of keys, over S's first half */
        for (int s = 0; s < NS; s += 2)
            _mm512_store_si512(S + s / 2 * VW, (__m512i)_mm512_cvtne2ps_pbh((__m512)P[s + 1], (__m512)P[s]));
#endif
    ST(Lv, lv);
}

/* O_r += p_r,j v_j for keys [ja, jb) and the NW-vector piece at v0 of rows r0.. of A, prefetching pf's next lines.
 * A key row r does not see has p_r,j = 0 (its score is −inf); a NaN or inf in such a v_j still makes that
 * row's O NaN, which the state check after the kernel finds and recomputes (cpu/algo/kvcache.c), so the loop needs
 * no visibility test. */
AI void pv_keys(const fa_kv_args *a, const char *const *vr, int hh, const float *P, vf *A, int ja, int jb,
                int v0, const int NR, const int NW, const int MODE, float *tmp, pf_rows *pf) {
    pf_rows c = pf ? *pf : (pf_rows){0}; /* the cursor in registers over the loop (through memory, each step would
                                            wait for the last one's store) */
#if KEYPAIRS
    if (MODE == M_BF16) { /* keys j, j + 1 at once (from an even j: a key outside [ja, jb) has p = 0) */
        const uint32_t *Pb = (const uint32_t *)P; /* pair j / 2 of row r: Pb[r · FA_KV_BC + j / 2] */
        for (int jj = ja & ~1; jj < jb; jj += 2) {
            if (pf) pf_lines(&c, 2 * c.per);
            const char *x0 = vr[jj] + hh * a->v_sh + 2 * VW * v0, *x1 = vr[jj + 1] + hh * a->v_sh + 2 * VW * v0;
            vf v[16];
#pragma GCC unroll 8
            for (int i = 0; i < NW; i += 2) { /* 32 elements of rows j and j + 1: (v_j, v_j+1) pairs in two vectors */
                const __m512i x = _mm512_loadu_si512(x0 + 2 * VW * i), y = _mm512_loadu_si512(x1 + 2 * VW * i);
                v[i] = (vf)_mm512_unpacklo_epi16(x, y);
                v[i + 1] = (vf)_mm512_unpackhi_epi16(x, y);
            }
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const __m512bh p = (__m512bh)_mm512_set1_epi32((int)Pb[r * FA_KV_BC + jj / 2]);
#pragma GCC unroll 16
                for (int i = 0; i < NW; i++) A[r * NW + i] = (vf)_mm512_dpbf16_ps((__m512)A[r * NW + i], p, (__m512bh)v[i]);
            }
        }
        if (pf) *pf = c;
        return;
    }
#endif
    int jj = ja;
#if VW == 16
    /* two keys a step where both rows' vectors fit the registers beside the accumulators: the row addresses, the
       prefetch cursor and the loop cost once per two keys (each accumulator still adds key j, then j + 1) */
    if (MODE != M_ANY && NR * NW + 2 * NW <= 30)
        for (; jj + 2 <= jb; jj += 2) {
            if (pf) pf_lines(&c, 2 * c.per);
            vf v[16], w[16];
            row_vecs(v, vr[jj] + hh * a->v_sh, v0, NW, MODE, a, a->dv, a->dvp, tmp);
            row_vecs(w, vr[jj + 1] + hh * a->v_sh, v0, NW, MODE, a, a->dv, a->dvp, tmp);
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const vf p = vbcast(P[r * FA_KV_BC + jj]), q = vbcast(P[r * FA_KV_BC + jj + 1]);
#pragma GCC unroll 16
                for (int i = 0; i < NW; i++) A[r * NW + i] = A[r * NW + i] + p * v[i] + q * w[i];
            }
        }
#endif
    for (; jj < jb; jj++) {
        if (pf) pf_lines(&c, c.per);
        vf v[16];
        row_vecs(v, vr[jj] + hh * a->v_sh, v0, NW, MODE, a, a->dv, a->dvp, tmp);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const vf p = vbcast(P[r * FA_KV_BC + jj]);
#pragma GCC unroll 16
            for (int i = 0; i < NW; i++) A[r * NW + i] += p * v[i];
        }
    }
    if (pf) *pf = c;
}

/* The pieces [v0, v1) of d, NW vectors each (a compile-time width, so that the accumulators are registers):
 * rows r0.. of O loaded, the keys added, stored back. */
AI void pv_span(const fa_kv_args *a, const char *const *vr, int hh, const float *P, float *O, int ja, int jb,
                int v0, int v1, const int NR, const int NW, const int MODE, float *tmp, pf_rows *pf) {
    const int dp = a->dvp;
    for (; v0 + NW <= v1; v0 += NW) {
        vf A[16]; /* NR x NW <= 16 accumulators, flat: an array of 64 vectors was kept on the stack (spilled) */
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
#pragma GCC unroll 16
            for (int i = 0; i < NW; i++) A[r * NW + i] = LD(O + r * dp + VW * (v0 + i));
        pv_keys(a, vr, hh, P, A, ja, jb, v0, NR, NW, MODE, tmp, pf);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
#pragma GCC unroll 16
            for (int i = 0; i < NW; i++) ST(O + r * dp + VW * (v0 + i), A[r * NW + i]);
    }
}

/* Vectors of d per piece of PV for a group of NR rows: with 32 zmm, 16 accumulators for 4 rows and 8 for 1 or 2;
 * with 16 ymm, 8 accumulators whatever NR (with the V vectors and p, the register file is full). */
#define PV_WIDTH(NR) (VW == 16 ? ((NR) == 4 ? 4 : 8) : 8 / (NR))

/* O += P Vj for rows [r0, r0 + NR) of head hh over the keys any of them sees: their O in registers over W vectors
 * of d at a time (PV_WIDTH), so each V row is converted once per group of rows. */
AI void pv(const fa_kv_args *a, const char *const *vr, int hh, int r0, int64_t j0, int n, const int NR,
           const int MODE, float *tmp, pf_rows *pf) {
    const int W = PV_WIDTH(NR), NV = a->dvp / VW, dp = a->dvp;
    int ja = FA_KV_BC, jb = 0;
    for (int r = 0; r < NR; r++) {
        const int64_t l = a->lo[r0 + r] - j0, h = a->hi[r0 + r] - j0;
        const int lo = l > 0 ? (int)l : 0, hi = h < n ? (int)h : n;
        if (hi > lo && lo < ja) ja = lo;
        if (hi > lo && hi > jb) jb = hi;
    }
    if (jb <= ja) return;
    const float *P = a->S + ((size_t)hh * a->R + r0) * FA_KV_BC;
    float *O = a->O + ((size_t)hh * a->R + r0) * dp;
    /* pieces of W (or 4) vectors where they divide d's vector count, then VSTEP (pairs: bf16; E4M3 on AVX2) */
    if (NV % W == 0) {
        pv_span(a, vr, hh, P, O, ja, jb, 0, NV, NR, W, MODE, tmp, pf);
    } else {
        const int P4 = VW == 16 ? 4 : 2, n4 = NV / P4 * P4;
        pv_span(a, vr, hh, P, O, ja, jb, 0, n4, NR, P4, MODE, tmp, pf);
        pv_span(a, vr, hh, P, O, ja, jb, n4, NV, NR, VSTEP(MODE), MODE, tmp, pf);
    }
}

/* One chunk of n <= FA_KV_BC keys from j0 (kr, vr: FA_KV_BC row addresses, the ones past n repeat a valid row;
 * kn, vn: the nn rows of the next chunk): S = Qi Kjᵀ and the online softmax for every head, then O += P Vj for every
 * head, rows in groups of 4, 2, 1. K's rows of the chunk are all read before V's: V loads of one head between the K
 * loads of the next would break both streams and cost DRAM rate (docs/kvcache.md). The row format MODE is a
 * compile-time constant after inlining; d is not (only the piece widths of pv are). */
AI void chunk(const fa_kv_args *a, int64_t j0, int n, const char *const *kr, const char *const *vr,
              const char *const *kn, const char *const *vn, int nn, const int MODE) {
    const int NV = a->dvp / VW, es = (int)fa_dtype_size(a->dtype);
    const int R = a->R, k_bytes = a->d * es, v_bytes = a->dv * es;
    /* PV key steps of a head: (groups of rows) x (pieces of dv) x keys */
    const int groups = R / 4 + (R % 4) / 2 + (R % 2), W = PV_WIDTH(R >= 4 ? 4 : R >= 2 ? 2 : 1);
    const int sites = groups * ((NV + W - 1) / W) * n;
    _Alignas(64) float tmp[FA_KV_MAX_D];
    /* the prefetch of the next chunk (pf_rows): whole rows (all heads), K's spread over every head's QKᵀ steps, into
     * L2 on every ISA (into L1, MHA's many lines per QKᵀ step held up the demand loads), and V's over every head's
     * PV steps; or each head's own K and V rows over its own PV steps, the cursor restarting per head */
    const int whole = a->nh > 1 && a->k_sh == k_bytes && a->v_sh == v_bytes;
    const int kb = whole ? k_bytes * a->nh : k_bytes, vb = whole ? v_bytes * a->nh : v_bytes;
    const int steps = whole ? sites * a->nh : sites;
    const int klines = nn * ((kb + 63) / 64), vlines = nn * ((vb + 63) / 64);
    /* QKᵀ steps of all heads: a group of NR rows takes n / (VW / NR) steps, so R rows about n · R / VW */
    const int qsteps = a->nh * ((R * n + VW - 1) / VW);
    int qc = whole ? (klines + qsteps - 1) / qsteps : 0;
    if (qc > FA_KV_QK_PF_MAX) qc = FA_KV_QK_PF_MAX;
    const int left = whole && klines > qc * qsteps ? klines - qc * qsteps : 0; /* K's lines the QKᵀ steps leave */
    pf_run runs[2 * FA_KV_BC];
    const int nk = pf_runs(kn, nn, kb, runs);
    pf_rows pf = {runs, nk + pf_runs(vn, nn, vb, runs + nk), nk,
                  ((whole ? vlines : klines + vlines) + left + steps - 1) / steps, 0, NULL, NULL, 0, 0};
    pf_start(&pf, a, 0);
    for (int hh = 0; hh < a->nh; hh++) {
        for (int r = 0; r < R;) {
            if (R - r >= 4) qk(a, kr, n, hh, r, 4, MODE, tmp, &pf, qc), r += 4;
            else if (R - r >= 2) qk(a, kr, n, hh, r, 2, MODE, tmp, &pf, qc), r += 2;
            else qk(a, kr, n, hh, r, 1, MODE, tmp, &pf, qc), r += 1;
        }
        for (int r = 0; r < R; r++) softmax_row(a, hh * R + r, j0, n, MODE);
    }
    for (int hh = 0; hh < a->nh; hh++) {
        if (!whole) pf_start(&pf, a, hh);
        for (int r = 0; r < R;) {
            if (R - r >= 4) pv(a, vr, hh, r, j0, n, 4, MODE, tmp, &pf), r += 4;
            else if (R - r >= 2) pv(a, vr, hh, r, j0, n, 2, MODE, tmp, &pf), r += 2;
            else pv(a, vr, hh, r, j0, n, 1, MODE, tmp, &pf), r += 1;
        }
        if (!whole || hh == a->nh - 1) pf_lines(&pf, 1 << 30);
    }
}

/* Row addresses of keys [j0, j0 + n) for the item's first head; the entries past n repeat the last row. */
static inline void key_rows(const fa_kv_args *a, int64_t j0, int n, const char **kr, const char **vr) {
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
    for (int jj = n; jj < FA_KV_BC; jj++) kr[jj] = kr[n - 1], vr[jj] = vr[n - 1];
}

/* How many chunks ahead the prefetches run: one for 16/32-bit rows; an E4M3 chunk is half the bytes, so two keep
 * as many lines in flight (the kernel is bound by them on a Zen 4, docs/kvcache.md) */
#ifndef FA_KV_F8_AHEAD
#define FA_KV_F8_AHEAD 2
#endif
/* Keys per chunk: FA_KV_BC, or half of it where FA_KV_BC keys' K and V rows would span more than FA_KV_SPAN bytes.
 * The chunk being read and the next one being prefetched share the L2: MHA 32/32 bf16 rows are 8 KB of K and 8 KB of
 * V a key, so two chunks of 32 keys are 1 MB, a Zen 4's whole L2, and the prefetched lines evicted the ones about to
 * be read (docs/kvcache.md). Not below 16: a QKᵀ group of one row takes VW keys (16 on AVX-512). */
#ifndef FA_KV_SPAN
#define FA_KV_SPAN (256 << 10)
#endif
#define FA_KV_PF_AHEAD(MODE) ((MODE) == M_F8 ? FA_KV_F8_AHEAD : 1)

/* The keys of the item chunk by chunk, with the row format and vector count fixed at compile time. */
AI void walk(const fa_kv_args *a, const int MODE) {
    const char *kr[FA_KV_BC], *vr[FA_KV_BC], *kp[FA_KV_BC], *vp[FA_KV_BC]; /* this chunk, the next one */
    const vf z = {0};
    for (int row = 0; row < a->R * a->nh; row++) {
        vf l = z;
        l[0] = a->l[row];
        ST(a->Lv + (size_t)row * 16, l);
    }
    const int BC = FA_KV_BC * (a->k_ss + a->v_ss) > FA_KV_SPAN ? FA_KV_BC / 2 : FA_KV_BC;
    for (int64_t j0 = a->k0; j0 < a->k1; j0 += BC) {
        const int n = (int)(a->k1 - j0 < BC ? a->k1 - j0 : BC);
        const int64_t jp = j0 + FA_KV_PF_AHEAD(MODE) * BC;
        const int np = (int)(a->k1 - jp < BC ? (a->k1 > jp ? a->k1 - jp : 0) : BC);
        key_rows(a, j0, n, kr, vr);
        if (np) key_rows(a, jp, np, kp, vp);
        chunk(a, j0, n, kr, vr, kp, vp, np, MODE);
    }
    for (int row = 0; row < a->R * a->nh; row++) a->l[row] = hsum(LD(a->Lv + (size_t)row * 16));
}

/* One function per row format (MODE a constant in each), not one function holding all four. */
#define FA_KV_NOINLINE static __attribute__((noinline))
FA_KV_NOINLINE void walk_f32(const fa_kv_args *a) { walk(a, M_F32); }
FA_KV_NOINLINE void walk_bf16(const fa_kv_args *a) { walk(a, M_BF16); }
FA_KV_NOINLINE void walk_f16(const fa_kv_args *a) { walk(a, M_F16); }
FA_KV_NOINLINE void walk_f8(const fa_kv_args *a) { walk(a, M_F8); }
FA_KV_NOINLINE void walk_any(const fa_kv_args *a) { walk(a, M_ANY); }

static void attend(const fa_kv_args *a) {
    /* fp32, bf16 and f16 rows converted by whole vectors where d and dv are their padded widths (the loops run to dp,
     * dvp: a row of d % 16 != 0 would be read past its end); any other pair through M_ANY */
    const int whole = a->d == a->dp && a->dv == a->dvp;
    if (whole && a->dtype == FA_DTYPE_F32) walk_f32(a);
    else if (whole && a->dtype == FA_DTYPE_F16) walk_f16(a);
    else if (whole && a->dtype == FA_DTYPE_F8_E4M3) walk_f8(a);
    else if (a->d % FA_KV_GROUP == 0 && a->dv % FA_KV_GROUP == 0 && a->dtype == FA_DTYPE_BF16) walk_bf16(a);
    else walk_any(a);
}

const fa_kv_kernel FA_KV_KERNEL_NAME = {attend, FA_KV_KERNEL_STATS, FA_KV_GROUP, KEYPAIRS};
