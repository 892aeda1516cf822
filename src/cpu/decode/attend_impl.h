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

#define FA_DEC_SAT 0x1p126f /* scores saturate here (the numerics contract: finite inputs never give NaN) */

#define AI static inline __attribute__((always_inline))

/* Rows of one head for one chunk of n keys from j0, Kj / Vj already in fp32, with NV = dp / 16 vectors per row: a
 * compile-time constant after inlining, so a q row and an O row live in NV registers each and the products run as NV
 * independent chains. */
AI void head_chunk(const fa_dec_args *a, int hh, int64_t j0, int n, const float *kbad, const int NV) {
    const int R = a->R, dp = a->dp;
    const float *Kc = a->Kc + (size_t)hh * FA_DEC_BC * dp, *Vc = a->Vc + (size_t)hh * FA_DEC_BC * dp;
    const size_t r0 = (size_t)hh * R;
    /* S = Qi Kjᵀ on each row's visible keys (log2 units, saturated) */
    for (int r = 0; r < R; r++) {
        const int64_t lo = a->lo[r] > j0 ? a->lo[r] : j0, hi = a->hi[r] < j0 + n ? a->hi[r] : j0 + n;
        float *restrict s = a->S + (r0 + r) * FA_DEC_BC;
        v16f q[16] = {{0}};
#pragma GCC unroll 16
        for (int i = 0; i < NV; i++) q[i] = LD(a->qs + (r0 + r) * dp + 16 * i);
        const float qbad = a->qbad[r0 + r];
        for (int64_t t = lo; t < hi; t++) {
            const int jj = (int)(t - j0);
            const float *k = Kc + (size_t)jj * dp;
            v16f s0 = q[0] * LD(k), s1 = {0};
#pragma GCC unroll 16
            for (int i = 1; i < NV; i++) {
                if (i & 1) s1 += q[i] * LD(k + 16 * i);
                else s0 += q[i] * LD(k + 16 * i);
            }
            float x = hsum16(s0 + s1);
            if (a->softcap_mul != 0) x = a->softcap_mul * tanhf(x);
            x = x > FA_DEC_SAT ? FA_DEC_SAT : x < -FA_DEC_SAT ? -FA_DEC_SAT : x;
            s[jj] = x + kbad[jj] + qbad;
        }
    }
    /* online softmax: m_new = max(m, rowmax(S)); P = 2^(S - m_new); l = 2^(m - m_new) l + rowsum(P);
     * O = 2^(m - m_new) O + P Vj */
    for (int r = 0; r < R; r++) {
        const int64_t lo = a->lo[r] > j0 ? a->lo[r] : j0, hi = a->hi[r] < j0 + n ? a->hi[r] : j0 + n;
        if (hi <= lo) continue;
        const int ja = (int)(lo - j0), jb = (int)(hi - j0);
        const size_t row = r0 + r;
        float *restrict s = a->S + row * FA_DEC_BC;
        float mx = a->m[row], nan = 0;
        for (int jj = ja; jj < jb; jj++) {
            mx = s[jj] > mx ? s[jj] : mx;
            nan += s[jj] * 0.0f;
        }
        float *restrict o = a->O + row * dp;
        v16f acc[16] = {{0}};
#pragma GCC unroll 16
        for (int i = 0; i < NV; i++) acc[i] = LD(o + 16 * i);
        if (mx > a->m[row]) {
            const float alpha = fa_port_exp2(a->m[row] - mx);
            a->l[row] *= alpha;
#pragma GCC unroll 16
            for (int i = 0; i < NV; i++) acc[i] *= alpha;
            a->m[row] = mx;
        }
        float sum = 0;
        for (int jj = ja; jj < jb; jj++) {
            s[jj] = fa_port_exp2(s[jj] - mx);
            sum += s[jj];
        }
        a->l[row] += sum + nan;
        for (int jj = ja; jj < jb; jj++) {
            const float pj = s[jj];
            const float *v = Vc + (size_t)jj * dp;
#pragma GCC unroll 16
            for (int i = 0; i < NV; i++) acc[i] += pj * LD(v + 16 * i);
        }
#pragma GCC unroll 16
        for (int i = 0; i < NV; i++) ST(o + 16 * i, acc[i]);
    }
}

static void heads_chunk(const fa_dec_args *a, int hh, int64_t j0, int n, const float *kbad) {
    /* head dims 1..256 in 1..16 vectors: the common ones with their count fixed at compile time */
    switch (a->dp / 16) {
    case 2: head_chunk(a, hh, j0, n, kbad, 2); break;
    case 4: head_chunk(a, hh, j0, n, kbad, 4); break;
    case 8: head_chunk(a, hh, j0, n, kbad, 8); break;
    case 16: head_chunk(a, hh, j0, n, kbad, 16); break;
    default: head_chunk(a, hh, j0, n, kbad, a->dp / 16); break;
    }
}

/* Row addresses of keys [j0, j0 + n) for head 0. */
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
    const int d = a->d, dp = a->dp, nh = a->nh;
    const int64_t row_bytes = (int64_t)d * (int64_t)fa_dtype_size(a->dtype);
    const char *kr[FA_DEC_BC], *vr[FA_DEC_BC], *pk[FA_DEC_BC], *pv[FA_DEC_BC];
    float kbad[16][FA_DEC_BC];
    for (int64_t j0 = a->k0; j0 < a->k1; j0 += FA_DEC_BC) {
        const int n = (int)(a->k1 - j0 < FA_DEC_BC ? a->k1 - j0 : FA_DEC_BC);
        key_rows(a, j0, n, kr, vr);
        /* the next chunk's rows into L1: pages and head strides can defeat the hardware prefetcher */
        const int64_t jn = j0 + FA_DEC_BC;
        const int nn = jn < a->k1 ? (int)(a->k1 - jn < FA_DEC_BC ? a->k1 - jn : FA_DEC_BC) : 0;
        key_rows(a, jn, nn, pk, pv);
        for (int jj = 0; jj < nn; jj++)
            for (int hh = 0; hh < nh; hh++)
                for (int64_t c = 0; c < row_bytes; c += 64) {
                    __builtin_prefetch(pk[jj] + hh * a->k_sh + c, 0, 3);
                    __builtin_prefetch(pv[jj] + hh * a->v_sh + c, 0, 3);
                }
        /* Kj of every head, in key order; kbad is NaN for a key row with a NaN/inf */
        for (int jj = 0; jj < n; jj++)
            for (int hh = 0; hh < nh; hh++)
                kbad[hh][jj] = row_to_f32(a->Kc + ((size_t)hh * FA_DEC_BC + jj) * dp, kr[jj] + hh * a->k_sh, a->dtype,
                                          d, dp);
        for (int jj = 0; jj < n; jj++)
            for (int hh = 0; hh < nh; hh++)
                (void)row_to_f32(a->Vc + ((size_t)hh * FA_DEC_BC + jj) * dp, vr[jj] + hh * a->v_sh, a->dtype, d, dp);
        for (int hh = 0; hh < nh; hh++) heads_chunk(a, hh, j0, n, kbad[hh]);
    }
}
