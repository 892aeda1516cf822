#include "cpu/tile_io.h"

#include "half.h"

#include <string.h>

void fa_tile_load(float *dst, int ld_dst, const void *src, fa_dtype dt, int64_t ld_src, int rows, int cols, fa_io *io) {
    for (int r = 0; r < rows; r++) {
        float *d = dst + (int64_t)r * ld_dst;
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

void fa_tile_store(void *dst, fa_dtype dt, int64_t ld_dst, const float *src, int ld_src, int rows, int cols, fa_io *io) {
    for (int r = 0; r < rows; r++) {
        const float *s = src + (int64_t)r * ld_src;
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
