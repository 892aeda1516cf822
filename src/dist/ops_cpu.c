#define _POSIX_C_SOURCE 200809L /* posix_memalign */
/* The ring's element operations on host memory (CPU contexts). Linear in the shard, against the quadratic
 * attention of each step, so plain loops. */
#include "dist/ring.h"
#include "core/half.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static fa_status cpu_alloc(fa_context *ctx, size_t bytes, void **p) {
    *p = NULL;
    size_t size = (bytes + 4095) & ~(size_t)4095;
    if (posix_memalign(p, 4096, size ? size : 4096) != 0 || !*p) {
        *p = NULL;
        return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "ring: cannot allocate %zu bytes for the ring's buffers", bytes);
    }
    return FA_OK;
}

static void cpu_release(void *p, int device) {
    (void)device;
    free(p);
}

static fa_status cpu_zero(fa_context *ctx, void *p, size_t bytes) {
    (void)ctx;
    memset(p, 0, bytes);
    return FA_OK;
}

static fa_status cpu_copy(fa_context *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    memcpy(dst, src, bytes);
    return FA_OK;
}

static fa_status cpu_sync(fa_context *ctx) {
    (void)ctx;
    return FA_OK;
}

static fa_status cpu_pack(fa_context *ctx, const fa_tensor *t, void *dst) {
    (void)ctx;
    const size_t es = fa_dtype_size(t->dtype), row = (size_t)t->head_dim * es;
    char *o = dst;
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seqlen; s++)
            for (int64_t h = 0; h < t->heads; h++, o += row)
                memcpy(o, (const char *)t->data + (b * t->stride_batch + s * t->stride_seq + h * t->stride_head) * (int64_t)es,
                       row);
    return FA_OK;
}

/* One row of the running state merged with a block's row by LSE: O = (e^(La−M) O + e^(ls−M) o) / Σ, L = M + log Σ. */
static void merge_row(float *Or, float *Lr, const void *o, fa_dtype dt, int64_t off, float ls, int64_t D) {
    const float la = *Lr;
    if (isnan(la) || isnan(ls)) {
        for (int64_t e = 0; e < D; e++) Or[e] = NAN;
        *Lr = NAN;
        return;
    }
    const float M = la > ls ? la : ls;
    if (M == -INFINITY) return; /* neither sees a key: O stays 0, L −inf */
    const float wa = expf(la - M), ws = expf(ls - M), inv = 1.0f / (wa + ws);
    for (int64_t e = 0; e < D; e++) Or[e] = (wa * Or[e] + ws * fa_load_elem(o, dt, off + e)) * inv;
    *Lr = M + logf(wa + ws);
}

static fa_status cpu_merge(fa_context *ctx, float *O, float *L, int64_t B, int64_t S, int64_t H, int64_t D,
                           const void *o, const float *l, fa_dtype dt, int64_t row0, int64_t n, int first) {
    (void)ctx;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < n; i++)
            for (int64_t h = 0; h < H; h++) {
                float *Or = O + ((b * S + row0 + i) * H + h) * D, *Lr = L + (b * H + h) * S + row0 + i;
                const int64_t off = ((b * n + i) * H + h) * D;
                const float ls = l[(b * H + h) * n + i];
                if (first) {
                    for (int64_t e = 0; e < D; e++) Or[e] = fa_load_elem(o, dt, off + e);
                    *Lr = ls;
                } else {
                    merge_row(Or, Lr, o, dt, off, ls, D);
                }
            }
    return FA_OK;
}

static fa_status cpu_accum(fa_context *ctx, float *acc, int64_t B, int64_t S, int64_t H, int64_t D, const void *x,
                           fa_dtype dt, int64_t row0, int64_t n) {
    (void)ctx;
    const int64_t row = H * D;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < n; i++) {
            float *a = acc + (b * S + row0 + i) * row;
            const int64_t off = (b * n + i) * row;
            for (int64_t e = 0; e < row; e++) a[e] += fa_load_elem(x, dt, off + e);
        }
    return FA_OK;
}

static fa_status cpu_round(fa_context *ctx, const float *src, const fa_tensor *t) {
    (void)ctx;
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seqlen; s++)
            for (int64_t h = 0; h < t->heads; h++, src += t->head_dim) {
                const int64_t o = b * t->stride_batch + s * t->stride_seq + h * t->stride_head;
                for (int64_t e = 0; e < t->head_dim; e++) fa_store_elem(t->data, t->dtype, o + e, src[e]);
            }
    return FA_OK;
}

static fa_status cpu_lse_rows(fa_context *ctx, float *dst, const float *src, int64_t BH, int64_t S, int64_t row0,
                              int64_t n) {
    (void)ctx;
    for (int64_t r = 0; r < BH; r++) memcpy(dst + r * n, src + r * S + row0, sizeof(float) * (size_t)n);
    return FA_OK;
}

static const fa_ring_ops cpu_ops = {cpu_alloc, cpu_release, cpu_zero,  cpu_copy,  cpu_sync,
                                    cpu_pack,  cpu_merge,   cpu_accum, cpu_round, cpu_lse_rows};

const fa_ring_ops *fa_ring_ops_cpu(void) { return &cpu_ops; }
