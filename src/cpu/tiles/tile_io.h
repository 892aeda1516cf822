/* Counted tile transfers between slow memory (the caller's tensors, the context workspace standing in for HBM)
 * and fast memory (fp32 tiles small enough for L1/L2). Every algorithm moves data through these, so
 * fa_last_stats reports exactly the bytes each algorithm moved. A transfer counts rows · cols · element size. */
#ifndef FA_CPU_TILES_TILE_IO_H
#define FA_CPU_TILES_TILE_IO_H

#include "flashattn.h"

#include <stddef.h>
#include <stdint.h>

/* uncertified: a run whose tile loads bound every input it reads (fa_tile_load_max; fa_cpu_algo.certifies) counts
 * the work items whose bounds do not certify the fp32 result; with none, the numerics contract needs no scan of its
 * own (cpu.h). */
typedef struct fa_io {
    int64_t read, written;
    int32_t uncertified;
    char pad[44]; /* one counter set per cache line: threads keep their own */
} fa_io;
_Static_assert(sizeof(fa_io) == 64, "one cache line per thread's counters");

/* Rows of a strided tensor are often a page apart (BSHD: heads·d elements), each a TLB miss and a DRAM access the
 * hardware prefetchers do not follow: readers touch the rows FA_PF_ROWS ahead (docs/cpu-kernels.md). */
#define FA_PF_ROWS 8
static inline void fa_prefetch_rows(const char *p, int64_t ld_bytes, int64_t from, int64_t to, size_t bytes, int rw) {
    for (int64_t r = from; r < to; r++)
        for (size_t x = 0; x < bytes; x += 64) {
            if (rw) __builtin_prefetch(p + r * ld_bytes + x, 1);
            else __builtin_prefetch(p + r * ld_bytes + x, 0);
        }
}

/* The bits of |x| for the n fp32 elements of row folded into acc (16 lanes) and *mx (the tail) by maximum. |x| orders
 * as its bits with the sign cleared, NaN and inf above every finite value; cleared, the bits fit a signed int, whose
 * max the baseline ISA has (the unsigned one is emulated), and the 16 lanes are independent chains. */
static inline void fa_absmax_bits(const int32_t *row, int64_t n, int32_t acc[16], int32_t *mx) {
    int64_t x = 0;
    for (; x + 16 <= n; x += 16)
        for (int k = 0; k < 16; k++) {
            const int32_t a = row[x + k] & 0x7fffffff;
            acc[k] = a > acc[k] ? a : acc[k];
        }
    for (; x < n; x++) {
        const int32_t a = row[x] & 0x7fffffff;
        *mx = a > *mx ? a : *mx;
    }
}
/* The maximum of fa_absmax_bits' lanes and its tail. */
static inline int32_t fa_absmax_fold(const int32_t acc[16], int32_t mx) {
    for (int k = 0; k < 16; k++) mx = acc[k] > mx ? acc[k] : mx;
    return mx;
}

/* dst[r][c] = (float) src[r · ld_src + c] for r < rows, c < cols; ld_dst/ld_src in elements. */
void fa_tile_load(float *dst, int ld_dst, const void *src, fa_dtype dt, int64_t ld_src, int rows, int cols, fa_io *io);
/* fa_tile_load, and *maxbits = max(*maxbits, the fp32 bits of max |dst|): ≥ 0x7f800000 when an element is NaN/inf. */
void fa_tile_load_max(float *dst, int ld_dst, const void *src, fa_dtype dt, int64_t ld_src, int rows, int cols,
                      fa_io *io, uint32_t *maxbits);
/* Rows of bf16 into a fast tile, unconverted (counted as fa_tile_load counts them). */
void fa_tile_load_bf16(uint16_t *dst, int ld_dst, const uint16_t *src, int64_t ld_src, int rows, int cols, fa_io *io);
/* dst[r · ld_dst + c] = src[r][c] rounded to dt. */
void fa_tile_store(void *dst, fa_dtype dt, int64_t ld_dst, const float *src, int ld_src, int rows, int cols, fa_io *io);
/* Vectors of fp32 state in slow memory (ℓ, m, LSE, D). */
void fa_vec_load(float *dst, const float *src, int n, fa_io *io);
void fa_vec_store(float *dst, const float *src, int n, fa_io *io);

#endif
