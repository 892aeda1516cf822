/* Shared by the CUDA kernels: the launch parameters, sequence/mask helpers, and warp-level tile GEMMs built on
 * mma.cuh. Shared-memory tiles are row-major with rows padded by 8 elements (16 bytes): ldmatrix reads of 8
 * consecutive rows then hit 8 different 16-byte bank groups (row stride ≡ 16 B mod 128 B), conflict-free without
 * a swizzle, and 16-byte cp.async writes stay aligned. */
#ifndef FA_CUDA_COMMON_CUH
#define FA_CUDA_COMMON_CUH

#include "mma.cuh"
#include "core/visible.h"
#include "cuda/packed.cuh"
#include "cuda/params.h"

#include <math.h>

#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

/* Where sequence b lives: its lengths and the element offsets of (b, head) in each tensor family. */
struct fa_seq {
    int sq, sk;
    int64_t qrow, krow; /* first row of the sequence in the packed tensors (varlen), else 0 */
    int64_t stat0;      /* index of row 0 of (b, h) in the fp32 [b, hq, sq] row statistics (LSE, D) */
};

FA_DEV fa_seq fa_get_seq(const fa_cuda_params &p, int b, int h) {
    fa_seq s;
    if (p.cu_q) {
        s.sq = fa_packed_seq(p.cu_q, p.used_q, b, p.total_q, p.sq, &s.qrow);
        s.sk = fa_packed_seq(p.cu_k, p.used_k, b, p.total_k, p.sk, &s.krow);
        s.stat0 = (int64_t)h * p.total_q + s.qrow;
    } else {
        s.qrow = 0;
        s.krow = 0;
        s.sq = p.sq;
        s.sk = p.sk;
        s.stat0 = ((int64_t)b * p.hq + h) * p.total_q;
    }
    return s;
}
/* Element offset of row 0 of (b, h) in a tensor with strides (sb, ss, sh); row0 = packed first row (varlen). */
FA_DEV int64_t fa_off(const fa_cuda_params &p, int64_t sb, int64_t ss, int64_t sh, int b, int64_t row0, int h) {
    return (p.cu_q ? row0 * ss : (int64_t)b * sb) + (int64_t)h * sh;
}

/* ---- the mask in the kernels ----
 * The rule is core/visible.h's (key j visible to query i iff diag − wl <= j <= diag + wr, diag = i + sk − sq, a
 * bound dropped when its window is −1; causal is wr = 0; with attention_chunk c > 0 also j in diag's chunk
 * [fa_chunk_start32(diag, c), + c)). These are its forms in the kernels: each gives the same keys as
 * fa_visible_keys32 / fa_visible_block32 (+ fa_chunk_keys32) for every valid window, but without their clamps
 * (lo >= 0, hi >= lo) where the caller does not need them — written through visible.h, the clamps changed the SASS
 * of every flash kernel (register allocation across the whole loop; docs/cuda-kernels.md). */

/* The start of diag's chunk (p.chunk > 0) by the host's magic number, no division; a negative diag gives −chunk, whose
 * chunk holds no key (the same keys as fa_chunk_start32's, and as monotone in diag). */
FA_DEV int fa_chunk0(const fa_cuda_params &p, int diag) {
    if (diag < 0) return -p.chunk;
    const unsigned q = p.chunk_mul ? __umulhi((unsigned)diag, p.chunk_mul) >> p.chunk_shift : (unsigned)diag;
    return (int)q * p.chunk;
}
/* Key j is visible to query i (by the window; fa_in_chunk adds attention_chunk). */
FA_DEV bool fa_visible(const fa_cuda_params &p, int i, int j, int sq, int sk) {
    int diag = i + sk - sq;
    return j < sk && (p.wl < 0 || j >= diag - p.wl) && (p.wr < 0 || j <= diag + p.wr);
}
/* Keys visible to query row i: [*lo, *hi] (closed; *lo may be negative, empty when *hi < *lo). */
FA_DEV void fa_row_keys(const fa_cuda_params &p, int i, int sq, int sk, int *lo, int *hi) {
    const int diag = i + sk - sq;
    *lo = p.wl >= 0 ? diag - p.wl : 0;
    *hi = p.wr >= 0 ? min(sk - 1, diag + p.wr) : sk - 1;
}
/* The start c0 of query row i's chunk (attention_chunk; its keys [c0, c0 + chunk)): kept apart from fa_row_keys so
 * that a masked step applies it in a pass of its own, after the window's bounds are dead, and opaque so that the
 * starts are not hoisted out of the K/V loop as live registers (p.chunk > 0 only). */
FA_DEV int fa_row_chunk(const fa_cuda_params &p, int i, int sq, int sk) {
    return fa_chunk0(p, (int)fa_opaque((uint32_t)(i + sk - sq)));
}
/* Key j is in query i's chunk (true without attention_chunk): fa_visible's rule with the chunk, where a kernel
 * masks element by element. */
FA_DEV bool fa_in_chunk(const fa_cuda_params &p, int i, int j, int sq, int sk) {
    return p.chunk <= 0 || (unsigned)(j - fa_row_chunk(p, i, sq, sk)) < (unsigned)p.chunk;
}
/* Keys visible to any query row of [r0, r1) (r1 > r0): [*lo, *hi), empty when *hi <= *lo (fa_visible_block32). */
FA_DEV void fa_key_span(const fa_cuda_params &p, int r0, int r1, int sq, int sk, int *lo, int *hi) {
    int l = 0, h = sk;
    if (p.wl >= 0) l = max(0, r0 + sk - sq - p.wl);
    if (p.wr >= 0) h = min(sk, r1 - 1 + sk - sq + p.wr + 1);
    fa_chunk_keys32(r0 + sk - sq, r1 - 1 + sk - sq, p.chunk, &l, &h);
    *lo = l;
    *hi = h;
}
/* Query rows that see any key of [c0, c1): [*lo, *hi) (the transpose: the rows whose window meets the keys). */
FA_DEV void fa_query_span(const fa_cuda_params &p, int c0, int c1, int sq, int sk, int *lo, int *hi) {
    int l = 0, h = sq;
    if (p.wr >= 0) l = max(0, c0 - sk + sq - p.wr);
    if (p.wl >= 0) h = min(sq, c1 - 1 - sk + sq + p.wl + 1);
    fa_chunk_queries32(c0, c1, sq, sk, p.chunk, &l, &h);
    *lo = l;
    *hi = h;
}
/* True when every (row, key) of [r0, r1) x [c0, c1) is visible (no per-element mask needed). */
FA_DEV bool fa_block_full(const fa_cuda_params &p, int r0, int r1, int c0, int c1, int sq, int sk) {
    if (c1 > sk) return false;
    if (p.wl >= 0 && c0 < (r1 - 1) + sk - sq - p.wl) return false;
    if (p.wr >= 0 && c1 - 1 > r0 + sk - sq + p.wr) return false;
    if (p.chunk > 0) { /* every row's chunk holds the keys: from the last row's start to the first row's end */
        const int s0 = fa_chunk0(p, r0 + sk - sq), s1 = fa_chunk0(p, r1 - 1 + sk - sq);
        if (c0 < s1 || c1 > s0 + p.chunk) return false;
    }
    return true;
}

/* softcap: s <- c·tanh(s·scale/c), k = scale/c (p.softcap_scale); the exp2 then uses log2(e) (p.scale_log2 is
 * set so on the host). */
FA_DEV float fa_softcap(float s, float k, float cap) { return cap * tanhf(s * k); }

/* ---- tile movement: ROWS x D elements, global rows `stride` apart -> shared rows LD apart ----
 * RPI = NTHR / CPR whole rows per pass (CPR = D/8 16-byte chunks a row): thread tid < RPI·CPR moves the chunk
 * tid % CPR of rows tid / CPR + it·RPI (every thread for D = 32, 64, 128, 256; 120 of 128 or 252 of 256 for D = 96,
 * whose 12 chunks do not divide the thread counts). The global row step goes through fa_opaque64, so each row's
 * address is one 64-bit add where it is used: otherwise nvcc hoisted one offset per row (and per tile) out of the
 * kernels' loops into registers of its own, and the FLASH1 backward spilled them. Whole rows per pass at D = 96:
 * dealing its chunks out in order costs a division and a 64-bit multiply per chunk.
 * Otherwise (fewer rows than one pass covers, D a power of two) the chunks are dealt out in order, c = it·NTHR + tid
 * -> row c / CPR, chunk c % CPR. FULL: every row is valid (rows_valid unused): no per-row check or zero-fill
 * select. */
template <typename T, int ROWS, int D, int LD, int NTHR, bool FULL = false>
FA_DEV void fa_load_tile(T *s, const T *g, int64_t stride, int rows_valid, int tid) {
    constexpr int CPR = D / 8, RPI = NTHR / CPR;
    static_assert(RPI > 0, "a pass must cover a row");
    if constexpr (NTHR % CPR != 0 || ROWS % RPI == 0) {
        constexpr int PASSES = (ROWS + RPI - 1) / RPI;
        if (RPI * CPR == NTHR || tid < RPI * CPR) {
            const int r0 = (int)((unsigned)tid / CPR), cc = (int)((unsigned)tid % CPR) * 8;
            const int64_t step = fa_opaque64(RPI * stride);
            const T *gr = g + r0 * stride + cc;
#pragma unroll
            for (int it = 0; it < PASSES; ++it) {
                const int r = it * RPI + r0;
                if (ROWS % RPI == 0 || it + 1 < PASSES || r < ROWS) {
                    const bool ok = FULL || r < rows_valid;
                    fa_cp_async16(s + r * LD + cc, ok ? (const void *)gr : (const void *)g, ok ? 16 : 0);
                }
                gr += step;
            }
        }
    } else {
        constexpr int TOTAL = ROWS * CPR;
        const int64_t st = fa_opaque64(stride); /* each row's offset computed where used, not hoisted */
#pragma unroll
        for (int it = 0; it < (TOTAL + NTHR - 1) / NTHR; ++it) {
            const int c = it * NTHR + tid, r = (int)((unsigned)c / CPR), cc = (int)((unsigned)c % CPR) * 8;
            if (TOTAL % NTHR == 0 || c < TOTAL) {
                const bool ok = FULL || r < rows_valid;
                fa_cp_async16(s + r * LD + cc, ok ? (const void *)(g + r * st + cc) : (const void *)g, ok ? 16 : 0);
            }
        }
    }
}
/* shared rows -> global rows (16-byte stores), rows >= rows_valid skipped; the same two chunk orders. */
template <typename T, int ROWS, int D, int LD, int NTHR>
FA_DEV void fa_store_tile(T *g, int64_t stride, const T *s, int rows_valid, int tid) {
    constexpr int CPR = D / 8;
    if constexpr (NTHR % CPR == 0) {
        constexpr int RPI = NTHR / CPR;
        const int r0 = (int)((unsigned)tid / CPR), cc = (int)((unsigned)tid % CPR) * 8;
        const int64_t step = fa_opaque64(RPI * stride);
        T *gr = g + r0 * stride + cc;
#pragma unroll
        for (int it = 0; it < (ROWS + RPI - 1) / RPI; ++it) {
            const int r = it * RPI + r0;
            if (r < ROWS && r < rows_valid) *(uint4 *)gr = *(const uint4 *)(s + r * LD + cc);
            gr += step;
        }
    } else {
        constexpr int TOTAL = ROWS * CPR;
#pragma unroll
        for (int it = 0; it < (TOTAL + NTHR - 1) / NTHR; ++it) {
            const int c = it * NTHR + tid, r = (int)((unsigned)c / CPR), cc = (int)((unsigned)c % CPR) * 8;
            if ((TOTAL % NTHR == 0 || c < TOTAL) && r < rows_valid)
                *(uint4 *)(g + r * stride + cc) = *(const uint4 *)(s + r * LD + cc);
        }
    }
}

/* ---- warp-level GEMMs on shared-memory tiles ----
 * acc[MT][NT] are 16x8 fp32 C tiles. */

/* The default after(k) of fa_warp_gemm_abt: nothing. */
struct fa_no_op {
    FA_DEV void operator()(int) const {}
};
/* acc += A · Bᵀ; A: MT·16 rows x K (row-major, lda), B: NT·8 rows x K (row-major, ldb).  (S = Q Kᵀ, dP = dO Vᵀ)
 * after(k) runs after the MMAs of k-step k are issued: independent work placed there (in program order) overlaps
 * with them. */
template <typename T, int MT, int NT, int K, int LDA, int LDB, class After = fa_no_op>
FA_DEV void fa_warp_gemm_abt(float (&acc)[MT][NT][4], const T *A, const T *B, int lane, After after = {}) {
    static_assert(NT % 2 == 0, "NT must be even");
    const uint32_t a0 = fa_opaque(fa_smem_addr(A + (lane & 15) * LDA + (lane >> 4) * 8));
    const uint32_t b0 = fa_opaque(fa_smem_addr(B + ((lane & 7) + ((lane >> 4) << 3)) * LDB + ((lane >> 3) & 1) * 8));
#pragma unroll
    for (int k = 0; k < K / 16; ++k) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) fa_ldmatrix_x4(a[mi], a0 + (mi * 16 * LDA + k * 16) * 2);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            uint32_t b[4];
            fa_ldmatrix_x4(b, b0 + (np * 16 * LDB + k * 16) * 2);
#pragma unroll
            for (int mi = 0; mi < MT; ++mi) {
                fa_mma<T>(acc[mi][2 * np], a[mi], b[0], b[1]);
                fa_mma<T>(acc[mi][2 * np + 1], a[mi], b[2], b[3]);
            }
        }
        after(k);
    }
}

/* C tiles (MT x 2KT of 16x8) -> A fragments (MT x KT of 16x16), packed to T. */
template <typename T, int MT, int KT>
FA_DEV void fa_acc_to_a(uint32_t (&a)[MT][KT][4], const float (&c)[MT][2 * KT][4]) {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int kt = 0; kt < KT; ++kt) {
            a[mi][kt][0] = fa_pack2<T>(c[mi][2 * kt][0], c[mi][2 * kt][1]);
            a[mi][kt][1] = fa_pack2<T>(c[mi][2 * kt][2], c[mi][2 * kt][3]);
            a[mi][kt][2] = fa_pack2<T>(c[mi][2 * kt + 1][0], c[mi][2 * kt + 1][1]);
            a[mi][kt][3] = fa_pack2<T>(c[mi][2 * kt + 1][2], c[mi][2 * kt + 1][3]);
        }
}

/* acc += A · B; A in registers (MT x KT fragments), B: KT·16 rows (k) x NT·8 cols (n), row-major (ldb), read with
 * ldmatrix.trans.  (O += P V, dV += Pᵀ dO, dK += dSᵀ Q, dQ += dS K) */
template <typename T, int MT, int NT, int KT, int LDB>
FA_DEV void fa_warp_gemm_rb(float (&acc)[MT][NT][4], const uint32_t (&a)[MT][KT][4], const T *B, int lane) {
    static_assert(NT % 2 == 0, "NT must be even");
    const uint32_t b0 = fa_opaque(fa_smem_addr(B + ((lane & 7) + ((lane >> 3) & 1) * 8) * LDB + (lane >> 4) * 8));
#pragma unroll
    for (int kt = 0; kt < KT; ++kt)
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            uint32_t b[4];
            fa_ldmatrix_x4_trans(b, b0 + (kt * 16 * LDB + np * 16) * 2);
#pragma unroll
            for (int mi = 0; mi < MT; ++mi) {
                fa_mma<T>(acc[mi][2 * np], a[mi][kt], b[0], b[1]);
                fa_mma<T>(acc[mi][2 * np + 1], a[mi][kt], b[2], b[3]);
            }
        }
}

/* acc += A · B with A in shared memory too, B: K rows x NT·8 cols (row-major, ldb, read with ldmatrix.trans).
 * AT = false: A is MT·16 rows x K (row-major, lda)       (dVj += Pᵀ dOi, dKj += dSᵀ Qi, Pᵀ and dSᵀ stored by keys)
 * AT = true:  A is stored transposed, K rows x MT·16 cols (dQi += dS Kj, dS read from the same dSᵀ tile) */
template <typename T, bool AT, int MT, int NT, int K, int LDA, int LDB>
FA_DEV void fa_warp_gemm_sb(float (&acc)[MT][NT][4], const T *A, const T *B, int lane) {
    const int mat = lane >> 3;
    const uint32_t a0 = fa_opaque(fa_smem_addr(AT ? A + ((lane & 7) + ((mat >> 1) << 3)) * LDA + (mat & 1) * 8
                                                  : A + (lane & 15) * LDA + (lane >> 4) * 8));
#pragma unroll
    for (int k = 0; k < K / 16; ++k) {
        uint32_t a[MT][1][4];
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
            if (AT)
                fa_ldmatrix_x4_trans(a[mi][0], a0 + (k * 16 * LDA + mi * 16) * 2);
            else
                fa_ldmatrix_x4(a[mi][0], a0 + (mi * 16 * LDA + k * 16) * 2);
        }
        fa_warp_gemm_rb<T, MT, NT, 1, LDB>(acc, a, B + k * 16 * LDB, lane);
    }
}

#endif
