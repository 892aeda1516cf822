/* The CPU KV-cache attend kernel's interface: one work item is one (sequence, K/V heads, key range) with all R query
 * rows that read each K/V head (GQA rows x new rows), so K and V are read from slow memory once per K/V head. The
 * kernel walks the keys in chunks of FA_KV_BC, head by head: S = Qi Kjᵀ on each row's visible keys (Kj converted to
 * fp32 in registers), the online softmax (m, l in log2 units) and O += P Vj. One copy per ISA (kvcache_*.c include
 * kvcache_impl.h with their own flags), reached through the context's kernel table (fa_cpu_kernels.kvcache);
 * docs/kvcache.md. */
#ifndef FA_CPU_SIMD_KVCACHE_H
#define FA_CPU_SIMD_KVCACHE_H

#include "flashattn.h"

#include <stdint.h>

#define FA_KV_BC 32    /* keys per chunk: two score vectors per row */
#define FA_KV_LANES 16 /* fp32 rows are padded to a multiple of 16 (one zmm) */
#define FA_KV_F8_SCALE 256.0f /* the kernels read an E4M3 element as its value · 2^-8 (its bits as an fp16's):
                                  the caller multiplies the descales by this */
#define FA_KV_MAX_D 576 /* the longest row, q/k's or v's (FA_MAX_KV_HEAD_DIM): the kernels' row buffers */

typedef struct fa_kv_args {
    int R, nh, d, dp;           /* rows per head, K/V heads, q/k's head_dim, padded */
    int dv, dvp;                /* v's head_dim (out's), padded */
    fa_dtype dtype;
    const float *qs;            /* nh·R x dp: q rows pre-multiplied (scale·log2 e, or scale/softcap), zero-padded,
                                   in fa_kv_lane order */
    const uint16_t *qb;         /* bf16 rows (NULL otherwise): nh·R x 2·dp, q in element order as bf16: the raw q
                                   (qb_parts 1, exact; the sums times qb_mul = qmul), or with rotary the pre-multiplied
                                   q as hi then lo (qb_parts 2, qb_mul 1) — for dot products of bf16 pairs */
    int qb_parts;
    float qb_mul;
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
    float *S, *Lv;              /* scratch: nh·R x FA_KV_BC, nh·R x 16 (64-byte aligned) */
    float *O, *m, *l;           /* nh·R x dvp (fa_kv_lane order), nh·R, nh·R: the running state (O = 0, m = -inf,
                                   l = 0 at the start) */
} fa_kv_args;

/* One ISA's kernel (fa_cpu_kernels.kvcache): the function, and the order of the bf16 lanes of its fp32 rows
 * (fa_kv_lane), both fixed by the flags its file is built with. */
typedef struct fa_kv_kernel {
    void (*attend)(const fa_kv_args *a);
    const char *name; /* the kernel name fa_stats reports, cpu.kvcache.<level it was built for> */
    int group;    /* elements per lane group: twice the vector width */
    int keypairs; /* 1: O += P V by vdpbf16ps on V rows interleaved by pairs of keys (the vpunpck{l,h}wd order) */
} fa_kv_kernel;

/* Where element c of a row sits in kernel k's fp32 rows (qs and O) of a call with head dims d (q/k) and dv (v).
 * bf16 rows with both a multiple of the group (the kernel's bf16 mode): each group of elements is two vectors, the
 * even elements then the odd ones (a 32-bit lane holds a bf16 pair, converted by one shift or one mask); with
 * keypairs (group 32) the vectors of vpunpcklwd and vpunpckhwd instead, elements 0-3, 8-11, 16-19, 24-27 then the
 * other fours. Every other row in order. */
static inline int64_t fa_kv_lane(const fa_kv_kernel *k, fa_dtype dt, int64_t d, int64_t dv, int64_t c) {
    const int64_t g = k->group, w = c & (g - 1), base = c & ~(g - 1);
    if (dt != FA_DTYPE_BF16 || d % g || dv % g) return c;
    if (k->keypairs) return base | (w >> 2 & 1) * 16 | (w >> 3) * 4 | (w & 3);
    return base | (w & 1) * (g / 2) | w >> 1;
}
extern const fa_kv_kernel fa_kv_kernel_scalar;
#if defined(__x86_64__) || defined(__i386__)
extern const fa_kv_kernel fa_kv_kernel_avx2;       /* 8-float vectors: a ymm */
extern const fa_kv_kernel fa_kv_kernel_avx512f;    /* 16-float vectors: a zmm; bf16 widened by shifts */
extern const fa_kv_kernel fa_kv_kernel_avx512bf16; /* and bf16 rows on vdpbf16ps (the amx table's as well) */
#endif

#endif
