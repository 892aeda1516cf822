/* The body of the CPU decode kernel (attend.h), written with GCC vector types of 16 floats so that each ISA file
 * that includes it (with its -m flags and -ffp-contract=fast) gets full-width loads and FMAs. Define
 * FA_DEC_ATTEND_NAME before including. */
#include "cpu/decode/attend.h"

#include "core/half.h"
#include "cpu/simd/portable.h"

#include <math.h>
#include <string.h>

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));

#define LD(p) (*(const v16f *)(p))
#define ST(p, x) (*(v16f *)(p) = (x))

static inline float hsum16(v16f x) {
    x += __builtin_shuffle(x, (v16i){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
    x += __builtin_shuffle(x, (v16i){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
    x += __builtin_shuffle(x, (v16i){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
    x += __builtin_shuffle(x, (v16i){1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
    return x[0];
}

/* 16 fp16 / bf16 bit patterns -> fp32 (exact; fp16 subnormals and inf/NaN included) */
static inline v16f bf16x16(const uint16_t *s) {
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

static inline float dotp(const float *restrict a, const float *restrict b, int dp) {
    v16f s0 = {0}, s1 = {0};
    int i = 0;
    for (; i + 32 <= dp; i += 32) {
        s0 += LD(a + i) * LD(b + i);
        s1 += LD(a + i + 16) * LD(b + i + 16);
    }
    if (i < dp) s0 += LD(a + i) * LD(b + i);
    return hsum16(s0 + s1);
}

#define FA_DEC_SAT 0x1p126f /* scores saturate here (the numerics contract: finite inputs never give NaN) */

void FA_DEC_ATTEND_NAME(const fa_dec_args *a) {
    const int R = a->R, dp = a->dp, d = a->d;
    const int64_t page = a->page_size;
    for (int64_t j0 = a->k0; j0 < a->k1; j0 += FA_DEC_BC) {
        const int n = (int)(a->k1 - j0 < FA_DEC_BC ? a->k1 - j0 : FA_DEC_BC);
        const char *kr[FA_DEC_BC], *vr[FA_DEC_BC];
        for (int jj = 0; jj < n; jj++) {
            const int64_t t = j0 + jj;
            if (a->bt) {
                const int64_t pg = a->bt[t / page], off = t % page;
                kr[jj] = a->kbase + pg * a->k_sp + off * a->k_ss;
                vr[jj] = a->vbase + pg * a->v_sp + off * a->v_ss;
            } else {
                kr[jj] = a->kbase + t * a->k_ss;
                vr[jj] = a->vbase + t * a->v_ss;
            }
        }
        /* Kj to fp32; kbad[jj] is NaN for a key with a NaN/inf */
        float kbad[FA_DEC_BC];
        for (int jj = 0; jj < n; jj++) kbad[jj] = row_to_f32(a->Kc + (size_t)jj * dp, kr[jj], a->dtype, d, dp);
        /* S = Qi Kjᵀ on each row's visible keys (log2 units, saturated) */
        for (int r = 0; r < R; r++) {
            const int64_t lo = a->lo[r] > j0 ? a->lo[r] : j0, hi = a->hi[r] < j0 + n ? a->hi[r] : j0 + n;
            float *restrict s = a->S + (size_t)r * FA_DEC_BC;
            const float *q = a->qs + (size_t)r * dp;
            for (int64_t t = lo; t < hi; t++) {
                const int jj = (int)(t - j0);
                float x = dotp(q, a->Kc + (size_t)jj * dp, dp);
                if (a->softcap_mul != 0) x = a->softcap_mul * tanhf(x);
                x = x > FA_DEC_SAT ? FA_DEC_SAT : x < -FA_DEC_SAT ? -FA_DEC_SAT : x;
                s[jj] = x + kbad[jj] + a->qbad[r];
            }
        }
        /* Vj to fp32 */
        for (int jj = 0; jj < n; jj++) (void)row_to_f32(a->Vc + (size_t)jj * dp, vr[jj], a->dtype, d, dp);
        /* online softmax: m_new = max(m, rowmax(S)); P = 2^(S - m_new); l = 2^(m - m_new) l + rowsum(P);
         * O = 2^(m - m_new) O + P Vj */
        for (int r = 0; r < R; r++) {
            const int64_t lo = a->lo[r] > j0 ? a->lo[r] : j0, hi = a->hi[r] < j0 + n ? a->hi[r] : j0 + n;
            if (hi <= lo) continue;
            const int ja = (int)(lo - j0), jb = (int)(hi - j0);
            float *restrict s = a->S + (size_t)r * FA_DEC_BC;
            float mx = a->m[r], nan = 0;
            for (int jj = ja; jj < jb; jj++) {
                mx = s[jj] > mx ? s[jj] : mx;
                nan += s[jj] * 0.0f;
            }
            float *restrict o = a->O + (size_t)r * dp;
            if (mx > a->m[r]) {
                const float alpha = fa_port_exp2(a->m[r] - mx);
                a->l[r] *= alpha;
                for (int i = 0; i < dp; i += 16) ST(o + i, LD(o + i) * alpha);
                a->m[r] = mx;
            }
            float sum = 0;
            for (int jj = ja; jj < jb; jj++) {
                s[jj] = fa_port_exp2(s[jj] - mx);
                sum += s[jj];
            }
            a->l[r] += sum + nan;
            for (int i = 0; i < dp; i += 16) {
                v16f acc = LD(o + i);
                for (int jj = ja; jj < jb; jj++) acc += s[jj] * LD(a->Vc + (size_t)jj * dp + i);
                ST(o + i, acc);
            }
        }
    }
}
