/* The CPU decode kernel's interface: one work item is one (sequence, K/V head, key range) with all R query rows that
 * read that K/V head (GQA rows x new rows), so K and V are read from slow memory once per K/V head. The kernel walks
 * the keys in chunks of FA_DEC_BC: Kj, Vj converted to fp32 in fast memory, S = Qi Kjᵀ on each row's visible keys,
 * the online softmax (m, l in log2 units) and O += P Vj. One copy per ISA (attend_*.c include attend_impl.h with
 * their own flags); docs/decoding.md. */
#ifndef FA_CPU_DECODE_ATTEND_H
#define FA_CPU_DECODE_ATTEND_H

#include "flashattn.h"

#include <stdint.h>

#define FA_DEC_BC 16    /* keys per chunk: Kj, Vj of every head of the item in fp32 (8 heads x 16 x 128 x 4 B = 64 KB each) */
#define FA_DEC_LANES 16 /* fp32 rows are padded to a multiple of 16 (one zmm) */

typedef struct fa_dec_args {
    int R, nh, d, dp;           /* rows per head, K/V heads, head_dim, padded head_dim */
    fa_dtype dtype;
    const float *qs;            /* nh·R x dp: q rows pre-multiplied (scale·log2 e, or scale/softcap), zero-padded */
    const float *qbad;          /* nh·R: 0, or NaN for a q row with a NaN/inf (the numerics contract) */
    const int64_t *lo, *hi;     /* R: keys [lo, hi) row r of every head sees inside this item */
    int64_t k0, k1;             /* keys of the item: the union of the rows' ranges */
    const char *kbase, *vbase;  /* head 0: contiguous: key 0 of the cache row; paged: page 0, row 0 */
    int64_t k_ss, v_ss;         /* bytes between consecutive key rows (of a page) */
    int64_t k_sh, v_sh;         /* bytes between heads */
    int64_t k_sp, v_sp;         /* paged: bytes between pages */
    const int32_t *bt;          /* paged: this sequence's block-table row; NULL = contiguous */
    int64_t page_size;
    float softcap_mul;          /* 0 = off; else s = softcap_mul · tanh(q·k) (softcap · log2 e) */
    float *Kc, *Vc, *S;         /* scratch: nh x FA_DEC_BC x dp (twice), nh·R x FA_DEC_BC (64-byte aligned) */
    float *O, *m, *l;           /* nh·R x dp, nh·R, nh·R: the running state (O = 0, m = -inf, l = 0 at the start) */
} fa_dec_args;

typedef void (*fa_dec_attend_fn)(const fa_dec_args *a);
void fa_dec_attend_scalar(const fa_dec_args *a);
#if defined(__x86_64__) || defined(__i386__)
void fa_dec_attend_avx2(const fa_dec_args *a);
void fa_dec_attend_avx512(const fa_dec_args *a);
#endif

#endif
