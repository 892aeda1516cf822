/* fa_quantize_fp8 on the CPU: one work item per (batch, head group, row block). Pass 1 takes the block's amax over
 * its (rotated) rows, pass 2 rotates the rows again and rounds x / descale to E4M3; per_tensor runs pass 1 for every
 * item first and shares the maximum. Rows are recomputed rather than kept: the rotation is O(d log d) per row, and
 * nothing needs a buffer beyond one row. The arithmetic is core/fp8.h's, the same as the CUDA kernel's. */
#include "cpu/cpu.h"

#include "core/fp8.h"
#include "core/half.h"

/* Row (b, s, h) of x widened to double, and rotated when asked. */
static void load_row(const fa_quant_problem *q, int64_t b, int64_t s, int64_t h, double *row) {
    const fa_tensor *x = &q->x;
    const int64_t base = b * x->stride_batch + s * x->stride_seq + h * x->stride_head;
    for (int64_t j = 0; j < x->head_dim; j++) row[j] = fa_load_elem(x->data, (int)x->dtype, base + j);
    if (q->hadamard) fa_hadamard_row(row, x->head_dim, q->seed);
}

/* The rows of item it: batch b, heads [h0, h0 + group), rows [s0, s1). */
static void item_rows(const fa_quant_problem *q, int64_t it, int64_t *b, int64_t *h0, int64_t *s0, int64_t *s1) {
    const int64_t groups = q->x.heads / q->group, blk = it % q->nblk;
    *b = it / (groups * q->nblk);
    *h0 = it / q->nblk % groups * q->group;
    *s0 = blk * q->block_rows;
    *s1 = *s0 + q->block_rows < q->x.seqlen ? *s0 + q->block_rows : q->x.seqlen;
}

static float item_amax(const fa_quant_problem *q, int64_t it) {
    int64_t b, h0, s0, s1;
    item_rows(q, it, &b, &h0, &s0, &s1);
    double row[FA_MAX_HEAD_DIM], amax = 0;
    for (int64_t s = s0; s < s1; s++)
        for (int64_t h = h0; h < h0 + q->group; h++) {
            load_row(q, b, s, h, row);
            for (int64_t j = 0; j < q->x.head_dim; j++)
                if (isfinite(row[j]) && fabs(row[j]) > amax) amax = fabs(row[j]);
        }
    return (float)amax;
}

static void item_write(const fa_quant_problem *q, int64_t it, float descale) {
    int64_t b, h0, s0, s1;
    item_rows(q, it, &b, &h0, &s0, &s1);
    const fa_tensor *y = &q->y;
    double row[FA_MAX_HEAD_DIM];
    for (int64_t s = s0; s < s1; s++)
        for (int64_t h = h0; h < h0 + q->group; h++) {
            load_row(q, b, s, h, row);
            uint8_t *dst = (uint8_t *)y->data + b * y->stride_batch + s * y->stride_seq + h * y->stride_head;
            for (int64_t j = 0; j < y->head_dim; j++) dst[j] = fa_f64_to_e4m3(row[j] / (double)descale);
        }
}

fa_status fa_cpu_quantize(fa_context *ctx, const fa_quant_problem *q) {
    const int64_t items = q->x.batch * (q->x.heads / q->group) * q->nblk;
    if (q->per_tensor) {
        /* the items' fp32 amaxes into descale first (nothing can fail now), then their maximum everywhere */
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->threads)
        for (int64_t it = 0; it < items; it++) q->descale[it] = item_amax(q, it);
        float amax = 0;
        for (int64_t it = 0; it < items; it++) amax = q->descale[it] > amax ? q->descale[it] : amax;
        const float d = fa_fp8_descale(amax);
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->threads)
        for (int64_t it = 0; it < items; it++) {
            q->descale[it] = d;
            item_write(q, it, d);
        }
        return FA_OK;
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->threads)
    for (int64_t it = 0; it < items; it++) {
        const float d = fa_fp8_descale(item_amax(q, it));
        q->descale[it] = d;
        item_write(q, it, d);
    }
    return FA_OK;
}
