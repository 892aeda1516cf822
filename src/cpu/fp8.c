/* FP8 (E4M3) forward inputs on the CPU: q, k, v are widened to fp32 with their descales folded in, once per call,
 * into a buffer apart from the run's workspace (fa_workspace_in); the f32 problem then runs through any algorithm
 * exactly as an f32 call (STANDARD, FLASH1, FLASH2, the numerics contract, sinks), and an f16/bf16 out is written
 * from an fp32 staging copy with one rounding, as every algorithm rounds its fp32 O. So the CPU's FP8 result is the
 * fp32 attention of the dequantised inputs: the rounding reference an FP8 kernel is held to. The copy costs 4 bytes
 * per input element; the CPU has no FP8 arithmetic to gain from keeping 1. docs/numerics.md ("FP8"). */
#include "cpu/cpu.h"

#include "core/fp8.h"
#include "core/half.h"

#include <string.h>

static int64_t elems(const fa_tensor *t) { return t->batch * t->seqlen * t->heads * t->head_dim; }

/* A dense fp32 [batch, seqlen, heads, head_dim] tensor shaped like t over data. */
static fa_tensor dense_f32(const fa_tensor *t, float *data) {
    const fa_tensor r = {data, FA_DTYPE_F32, t->batch, t->seqlen, t->heads, t->head_dim,
                         t->seqlen * t->heads * t->head_dim, t->heads * t->head_dim, t->head_dim};
    return r;
}

/* Staged out: f16/bf16 results pass through fp32 (an f32 out is written in place). */
static int staged(const fa_problem *p) { return p->o.dtype != FA_DTYPE_F32; }

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

size_t fa_cpu_fp8_bytes(const fa_problem *p) {
    size_t n = round64((size_t)elems(&p->q) * 4) + round64((size_t)elems(&p->k) * 4) +
               round64((size_t)elems(&p->v) * 4);
    return n + (staged(p) ? round64((size_t)elems(&p->o) * 4) : 0);
}

void fa_cpu_fp8_problem(const fa_problem *p, void *buf, fa_problem *p32) {
    char *c = (char *)buf;
    float *part[4];
    const fa_tensor *t[4] = {&p->q, &p->k, &p->v, &p->o};
    for (int i = 0; i < 4; i++) { /* offsets only when planning (buf NULL): the pointers are never used then */
        part[i] = (float *)(void *)c;
        c += round64((size_t)elems(t[i]) * 4);
    }
    *p32 = *p;
    p32->dtype = FA_DTYPE_F32;
    p32->q = dense_f32(&p->q, part[0]);
    p32->k = dense_f32(&p->k, part[1]);
    p32->v = dense_f32(&p->v, part[2]);
    if (staged(p)) p32->o = dense_f32(&p->o, part[3]);
    p32->q_descale = p32->k_descale = p32->v_descale = NULL;
}

/* One (sequence, head) of src widened into dst: rows of the sequence, times the factor. */
static void widen_head(const fa_problem *p, const fa_tensor *src, const fa_tensor *dst, int is_k, int64_t b, int64_t h,
                       float factor, const float lut[256]) {
    const int64_t rows = is_k ? fa_seqlen_k(p, b) : fa_seqlen_q(p, b), d = src->head_dim;
    const uint8_t *s = (const uint8_t *)src->data + fa_row0(p, src, is_k, b, h);
    float *o = (float *)dst->data + fa_row0(p, dst, is_k, b, h);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t x = 0; x < d; x++) o[r * dst->stride_seq + x] = lut[s[r * src->stride_seq + x]] * factor;
}

void fa_cpu_fp8_widen(const fa_problem *p, const fa_problem *p32, int threads) {
    float lut[256];
    for (int i = 0; i < 256; i++) lut[i] = (float)fa_e4m3_to_f64((uint8_t)i); /* exact in fp32 */
    const int64_t group = p->hq / p->hk, nq = p->batch * p->hq, n = nq + 2 * p->batch * p->hk;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t it = 0; it < n; it++) {
        if (it < nq) { /* a query head takes its K/V head's factor */
            const int64_t b = it / p->hq, h = it % p->hq, f = b * p->hk + h / group;
            widen_head(p, &p->q, &p32->q, 0, b, h, p->q_descale ? p->q_descale[f] : 1.0f, lut);
            continue;
        }
        const int64_t j = (it - nq) % (p->batch * p->hk), b = j / p->hk, h = j % p->hk;
        const int is_v = it - nq >= p->batch * p->hk;
        const float *ds = is_v ? p->v_descale : p->k_descale;
        widen_head(p, is_v ? &p->v : &p->k, is_v ? &p32->v : &p32->k, 1, b, h, ds ? ds[b * p->hk + h] : 1.0f, lut);
    }
}

void fa_cpu_fp8_finish(const fa_problem *p, const fa_problem *p32, int threads) {
    if (!staged(p)) return;
    const fa_tensor *o = &p->o, *s = &p32->o;
    const int64_t rows = o->batch * o->seqlen * o->heads;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t b = r / (o->seqlen * o->heads), i = r / o->heads % o->seqlen, h = r % o->heads;
        const float *src = (const float *)s->data + b * s->stride_batch + i * s->stride_seq + h * s->stride_head;
        const int64_t dst = b * o->stride_batch + i * o->stride_seq + h * o->stride_head;
        for (int64_t x = 0; x < o->head_dim; x++) fa_store_elem(o->data, (int)o->dtype, dst + x, src[x]);
    }
}

void fa_cpu_fp8_traffic(const fa_problem *p, double *read, double *written) {
    const double in = (double)(elems(&p->q) + elems(&p->k) + elems(&p->v));
    *read += in;        /* the FP8 bytes */
    *written += 4 * in; /* their fp32 copies */
    if (staged(p)) {
        *read += 4.0 * (double)elems(&p->o);
        *written += (double)elems(&p->o) * (double)fa_dtype_size(p->o.dtype);
    }
}
