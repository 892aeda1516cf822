/* Counted tile transfers (tile_io.h): converting copies between the tensors and fp32 tiles, with row prefetch. */
#include "cpu/tiles/tile_io.h"

#include "core/half.h"

#include <string.h>

void fa_tile_load(float *dst, int ld_dst, const void *src, fa_dtype dt, int64_t ld_src, int rows, int cols, fa_io *io) {
    const size_t es = fa_dtype_size(dt);
    /* in unsigned arithmetic: a one-row view may have any stride (2^62 included); rows > 1 fit by validation */
    const int64_t ld_bytes = (int64_t)((uint64_t)ld_src * es);
    fa_prefetch_rows(src, ld_bytes, 0, rows < FA_PF_ROWS ? rows : FA_PF_ROWS, (size_t)cols * es, 0);
    for (int r = 0; r < rows; r++) {
        float *d = dst + (int64_t)r * ld_dst;
        if (r + FA_PF_ROWS < rows)
            fa_prefetch_rows(src, ld_bytes, r + FA_PF_ROWS, r + FA_PF_ROWS + 1, (size_t)cols * es, 0);
        if (dt == FA_DTYPE_F32) {
            memcpy(d, (const float *)src + r * ld_src, (size_t)cols * sizeof(float));
        } else if (dt == FA_DTYPE_BF16) {
            const uint16_t *s = (const uint16_t *)src + r * ld_src;
            for (int c = 0; c < cols; c++) d[c] = fa_bf16_to_f32(s[c]);
        } else {
            const uint16_t *s = (const uint16_t *)src + r * ld_src;
            for (int c = 0; c < cols; c++) d[c] = fa_f16_to_f32(s[c]);
        }
    }
    io->read += (int64_t)rows * cols * (int64_t)fa_dtype_size(dt);
}

void fa_tile_load_max(float *dst, int ld_dst, const void *src, fa_dtype dt, int64_t ld_src, int rows, int cols,
                      fa_io *io, uint32_t *maxbits) {
    fa_tile_load(dst, ld_dst, src, dt, ld_src, rows, cols, io);
    /* 16 independent lanes: one dependent chain of unsigned maxima took a quarter of a FLASH2 forward at N 128 */
    int32_t acc[16] = {0}, mx = (int32_t)*maxbits;
    for (int r = 0; r < rows; r++)
        fa_absmax_bits((const int32_t *)(const void *)(dst + (int64_t)r * ld_dst), cols, acc, &mx);
    *maxbits = (uint32_t)fa_absmax_fold(acc, mx);
}

void fa_tile_store(void *dst, fa_dtype dt, int64_t ld_dst, const float *src, int ld_src, int rows, int cols, fa_io *io) {
    const size_t es = fa_dtype_size(dt);
    /* in unsigned arithmetic: a one-row view may have any stride (2^62 included); rows > 1 fit by validation */
    const int64_t ld_bytes = (int64_t)((uint64_t)ld_dst * es);
    fa_prefetch_rows(dst, ld_bytes, 0, rows < FA_PF_ROWS ? rows : FA_PF_ROWS, (size_t)cols * es, 1);
    for (int r = 0; r < rows; r++) {
        const float *s = src + (int64_t)r * ld_src;
        if (r + FA_PF_ROWS < rows)
            fa_prefetch_rows(dst, ld_bytes, r + FA_PF_ROWS, r + FA_PF_ROWS + 1, (size_t)cols * es, 1);
        if (dt == FA_DTYPE_F32) {
            memcpy((float *)dst + r * ld_dst, s, (size_t)cols * sizeof(float));
        } else if (dt == FA_DTYPE_BF16) {
            uint16_t *d = (uint16_t *)dst + r * ld_dst;
            for (int c = 0; c < cols; c++) d[c] = fa_f32_to_bf16(s[c]);
        } else {
            uint16_t *d = (uint16_t *)dst + r * ld_dst;
            for (int c = 0; c < cols; c++) d[c] = fa_f32_to_f16(s[c]);
        }
    }
    io->written += (int64_t)rows * cols * (int64_t)fa_dtype_size(dt);
}

void fa_vec_load(float *dst, const float *src, int n, fa_io *io) {
    memcpy(dst, src, (size_t)n * sizeof(float));
    io->read += (int64_t)n * 4;
}

void fa_vec_store(float *dst, const float *src, int n, fa_io *io) {
    memcpy(dst, src, (size_t)n * sizeof(float));
    io->written += (int64_t)n * 4;
}

void fa_tile_load_bf16(uint16_t *dst, int ld_dst, const uint16_t *src, int64_t ld_src, int rows, int cols, fa_io *io) {
    for (int r = 0; r < rows; r++) memcpy(dst + (int64_t)r * ld_dst, src + r * ld_src, (size_t)cols * 2);
    io->read += (int64_t)rows * cols * 2;
}
