/* CPU tile micro-kernels: the small matrix products and softmax passes every algorithm is built from, on fp32 tiles in fast
 * memory (row-major, leading dimensions in floats). One table per ISA, picked once at context creation by
 * fa_cpu_kernels_select() (runtime CPUID dispatch: one binary runs on any x86-64). Results never depend on the
 * ISA beyond fp32 rounding order. */
#ifndef FA_CPU_KERNELS_H
#define FA_CPU_KERNELS_H

#include "flashattn.h"

#include <stddef.h>
#include <stdint.h>

/* Most a lazily maximised softmax exponent may exceed 0 (log2 units): P ≤ 2^8, ℓ stays far from overflow. */
#define FA_SOFTMAX_SLACK 8.0f

/* The runtime-dispatched kernel levels, narrowest first; each needs everything the one before it needs
 * (simd/dispatch.c checks them; FA_CPU_ISA=<name> pins one). */
typedef enum fa_cpu_isa {
    FA_CPU_ISA_SCALAR,     /* any CPU */
    FA_CPU_ISA_AVX2,       /* AVX2, FMA, F16C */
    FA_CPU_ISA_AVX512F,    /* AVX-512 F/BW/VL/DQ and FMA: bf16 widened by shifts, f16 by vcvtph2ps */
    FA_CPU_ISA_AVX512BF16, /* and AVX512_BF16: bf16 products on vdpbf16ps, rounding by vcvtne2ps2bf16 */
    FA_CPU_ISA_AMX,        /* and AMX-TILE/AMX-BF16, with the OS's and Linux's consent: bf16 products on tiles */
    FA_CPU_ISA_COUNT
} fa_cpu_isa;
/* The levels' names, each after `prefix`: the values of FA_CPU_ISA, the tables' .isa and the last part of every CPU
 * kernel name fa_stats reports (one list, so the three cannot drift apart). */
#define FA_CPU_ISA_NAMES(prefix) {prefix "scalar", prefix "avx2", prefix "avx512f", prefix "avx512bf16", prefix "amx"}

typedef struct fa_cpu_kernels {
    const char *isa; /* the level's name (FA_CPU_ISA_NAMES) */
    fa_cpu_isa id;
    /* C[m][n] (acc ? += : =) Σ_p A[i·rsa + p·csa] · B[p·ldb + j]: A·B with (rsa, csa) = (lda, 1), Aᵀ·B with
     * (1, lda). The register-blocked workhorse; B rows are vectors, A elements are broadcast. */
    void (*gemm_nn)(int m, int n, int k, const float *A, ptrdiff_t rsa, ptrdiff_t csa, const float *B, int ldb,
                    float *C, int ldc, int acc);
    /* C[m][n] = A[m][k] · B[n][k]ᵀ on row-major operands (STANDARD's S = Qi Kjᵀ, dP = dOi Vjᵀ; the softcap
     * backward tile): Bᵀ is packed inside, so the caller keeps no transposed copy. */
    void (*gemm_abt)(int m, int n, int k, const float *A, int lda, const float *B, int ldb, float *C, int ldc);
    /* dst[c·ldd + r] = mul · src[r·lds + c] for r < rows, c < cols (transpose-pack a tile). */
    void (*pack_t)(int rows, int cols, const float *src, int lds, float *dst, int ldd, float mul);
    /* One online-softmax step on a transposed score tile Sᵀ[nk keys][nq queries] (raw scores, not scaled);
     * c = scale · log2(e). Per query column q: m_new = max(m[q], max_r S[r][q]); S[r][q] ← 2^(c·(S[r][q] − m_new))
     * (so S becomes Pᵀ); alpha[q] = 2^(c·(m[q] − m_new)); l[q] ← alpha[q]·l[q] + Σ_r P; m[q] ← m_new.
     * A column whose maximum is −∞ subtracts 0 instead (gives P = 0, alpha = 0, never NaN). */
    void (*softmax_step_t)(int nk, int nq, float *S, int lds, float c, float *m, float *l, float *alpha);
    /* Sᵀ = K Qᵀ fused with the online-softmax step, for blocks without masked scores (no −∞; FLASH2 forward):
     * S[r][q] ← 2^(c·Σ_p K[r·ldk + p]·QT[p·ldqt + q] − c·m[q]) for r < nk, q < nq (so S is Pᵀ), ℓ[q] += Σ_r S[r][q],
     * where m[q] is a reference maximum raised (to the largest score seen) only when a score exceeds it by more than
     * FA_SOFTMAX_SLACK/c; when it is, ℓ[q] and the P already written are scaled by 2^(c·(m_old − m_new)) and
     * alpha[q] is the product of those factors (1 where m[q] stayed). Returns 1 if any m[q] rose (the caller then
     * scales O by alpha), else 0. NULL in tables without it: compose gemm_nn + softmax_step_t instead. */
    int (*qk_softmax_t)(int nk, int nq, int d, const float *K, int ldk, const float *QT, int ldqt, float *S, int lds,
                        float c, float *m, float *l, float *alpha);
    /* S[r][j] ← e^(S[r][j]·c − sub[r])  (backward: P = exp(scale·S − LSE); the exponent is rounded once) */
    void (*exp_rows)(int rows, int cols, float *S, int lds, float c, const float *sub);
    /* dP[r][j] ← scale · P[r][j] · (dP[r][j] − D[r])  (backward: dS, pre-scaled) */
    void (*ds_rows)(int rows, int cols, const float *P, int ldp, float *dP, int ldd, const float *D, float scale);
    /* O[r][j] *= alpha[r] */
    void (*scale_rows)(int rows, int cols, float *O, int ldo, const float *alpha);
    /* D[r] = Σ_x a[r·lda + x]·b[r·ldb + x] for r < rows, as one FMA chain per row in x order (backward: D =
     * rowsum(dO ∘ O) with the rounding of the tile products' dot products, so that dP − D is exactly 0 where O = V) */
    void (*rowdots)(int rows, int n, const float *a, int lda, const float *b, int ldb, float *D);

    /* bf16: operands are 32-bit words holding two bf16 along the reduction dimension (low half first).
     * bf16_dot = 1 when gemm_bf16 is a hardware dot product (vdpbf16ps); the portable one emulates it. */
    int bf16_dot;
    /* C[m][n] (acc ? += : =) Σ_p Σ_{h=0,1} A[i·rsa + p·csa].h · B[p·ldb + j].h over kp word pairs. */
    void (*gemm_bf16)(int m, int n, int kp, const uint32_t *A, ptrdiff_t rsa, ptrdiff_t csa, const uint32_t *B,
                      int ldb, float *C, int ldc, int acc);
    /* dst[c·ldd + r] = src[r·lds + c] on 32-bit words. */
    void (*pack_t32)(int rows, int cols, const uint32_t *src, int lds, uint32_t *dst, int ldd);
    /* dst[w·ldd + j] = (bf16(src[2w][j]), bf16(src[2w+1][j])) for 2w < nk (odd nk pairs the last row with 0). */
    void (*pairs_f32_bf16)(int nk, int n, const float *src, int lds, uint32_t *dst, int ldd);
    /* The same for bf16 rows. */
    void (*pairs_bf16)(int nk, int n, const uint16_t *src, int lds, uint32_t *dst, int ldd);
    /* bf16_tiles = 1 when gemm_bf16 runs on matrix tiles (AMX TDPBF16PS): its A operand is then read fastest as
     * rows (csa = 1), so the bf16 FLASH2 forward keeps S = Qi Kjᵀ row-major (algo/flash2_amx.c). */
    int bf16_tiles;
    /* One online-softmax step on a row-major score tile S[rows][cols] (raw scores, read only), P written as bf16
     * pairs along the keys: per row r, m_new = max(m[r], max_j S[r][j]); P = 2^(c·(S − m_new)) (a row whose maximum
     * is −∞ subtracts 0); P[r·ldp + w] = (bf16 P[r][2w], bf16 P[r][2w+1]) for 2w < cols (odd cols: the last word
     * pairs with 0); alpha[r] = 2^(c·(m[r] − m_new)); l[r] ← alpha[r]·l[r] + Σ_j P (fp32, before rounding). */
    void (*softmax_rows_bf16)(int rows, int cols, const float *S, int lds, float c, float *m, float *l, float *alpha,
                              uint32_t *P, int ldp);
    /* dst[r·ldd + w] = (bf16 src[r][2w], bf16 src[r][2w+1]) for 2w < cols (odd cols: the last word pairs with 0):
     * fp32 rows as the A operand of gemm_bf16 (pairs along the row). */
    void (*rows_f32_bf16)(int rows, int cols, const float *src, int lds, uint32_t *dst, int ldd);

    /* KV-cache attention (simd/kvcache.h): one work item of fa_forward_kvcache, built from simd/kvcache_impl.h in
     * its own file per ISA (simd/kvcache_<isa>.c, with the flags its vector code needs). */
    const struct fa_kv_kernel *kvcache;
} fa_cpu_kernels;

/* The table of this process: the highest level the CPU supports, or the one FA_CPU_ISA names. FA_OK with *out set
 * and `why` saying what was picked and why (the features that allow it, and what the next level up lacks);
 * FA_ERR_INVALID_ARGUMENT (FA_CPU_ISA is not a level's name) or FA_ERR_UNSUPPORTED (this CPU, its OS or Linux do not
 * allow the named level) with *out NULL and the reason in `why`, naming FA_CPU_ISA. Never a silent fallback: a test
 * or benchmark that pins a level runs that level or fails. The amx level is allowed only where CPUID reports
 * AMX-TILE and AMX-BF16, the OS enables the tile state (XCR0) and Linux grants this process its use
 * (arch_prctl ARCH_REQ_XCOMP_PERM, requested here). */
fa_status fa_cpu_kernels_select(const fa_cpu_kernels **out, char *why, size_t why_len);
/* Level l's table if this process can run it, else NULL with *lack naming the first feature missing (the lab and the
 * selector enumerate the levels with it). */
const fa_cpu_kernels *fa_cpu_kernels_level(fa_cpu_isa l, const char **lack);
extern const fa_cpu_kernels fa_cpu_kernels_scalar;
#if defined(__x86_64__) || defined(__i386__)
extern const fa_cpu_kernels fa_cpu_kernels_avx2;       /* simd/avx2.c, -mavx2 -mfma */
extern const fa_cpu_kernels fa_cpu_kernels_avx512f;    /* simd/avx512.c, AVX-512 F/BW/VL/DQ */
extern const fa_cpu_kernels fa_cpu_kernels_avx512bf16; /* simd/avx512.c's fp32 entries, simd/avx512bf16.c's bf16 ones */
extern const fa_cpu_kernels fa_cpu_kernels_amx;        /* the avx512bf16 table with simd/amx.c's tile gemm_bf16 */
/* simd/avx512bf16.c: the bf16 entries on AVX512_BF16 (the kernels.h contracts of the same names). */
void fa_avx512bf16_gemm_bf16(int m, int n, int kp, const uint32_t *A, ptrdiff_t rsa, ptrdiff_t csa, const uint32_t *B,
                             int ldb, float *C, int ldc, int acc);
void fa_avx512bf16_pairs_f32_bf16(int nk, int n, const float *src, int lds, uint32_t *dst, int ldd);
void fa_avx512bf16_softmax_rows_bf16(int rows, int cols, const float *S, int lds, float c, float *m, float *l,
                                     float *alpha, uint32_t *P, int ldp);
void fa_avx512bf16_rows_f32_bf16(int rows, int cols, const float *src, int lds, uint32_t *dst, int ldd);
/* simd/amx.c: C (acc ? += : =) A·B on bf16 pairs with TDPBF16PS (the gemm_bf16 contract). Only after
 * fa_cpu_amx_usable() returned 1 in this process. */
void fa_amx_gemm_bf16(int m, int n, int kp, const uint32_t *A, ptrdiff_t rsa, ptrdiff_t csa, const uint32_t *B,
                      int ldb, float *C, int ldc, int acc);
/* simd/dispatch.c: 1 if this CPU, its OS and this process may run AMX-BF16 tiles (requests the permission); else 0
 * with *lack saying which of the three refused. */
int fa_cpu_amx_usable(const char **lack);
#endif

#endif
