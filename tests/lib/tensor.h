/* Test tensors: a view in one of several layouts into an allocation whose every element starts as NaN. */
#ifndef FA_TESTLIB_TENSOR_H
#define FA_TESTLIB_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"
#include "rng.h"

typedef enum t_layout {
    T_BSHD,     /* contiguous [b, s, h, d] */
    T_BHSD,     /* contiguous [b, h, s, d] */
    T_STRIDED,  /* a view into a larger buffer: padded strides, an offset, a random dimension order */
    T_BCAST     /* inputs only: stride_batch = 0 (every batch reads batch 0's memory) */
} t_layout;
const char *t_layout_name(t_layout l);

typedef struct t_buf {
    fa_tensor t;            /* the view */
    unsigned char *mem;     /* the whole allocation */
    size_t mem_bytes;
    size_t offset;          /* bytes from mem to t.data */
    unsigned char *in_view; /* per element of mem: 1 if the view addresses it */
    size_t mem_elems;
} t_buf;

/* A new view, poisoned; T_STRIDED draws its padding from the default stream (t_buf_new) or from r. */
t_buf t_buf_new(fa_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d, t_layout lay);
t_buf t_buf_new_r(t_rng *r, fa_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d, t_layout lay);
void t_buf_free(t_buf *x);
/* Whole allocation := the dtype's NaN (padding included, so reading it poisons the result). */
void t_buf_poison(t_buf *x);
/* Every element of the view := sigma · N(0, 1), rounded to the dtype. Padding stays NaN. */
void t_buf_randn(t_buf *x, double sigma);
void t_buf_randn_r(t_rng *r, t_buf *x, double sigma);
/* Element [b, s, h, i] of the view. */
double t_get(const fa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t i);
void t_set(const fa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t i, double x);
/* After a call wrote the (poisoned) view: number of view elements that are not finite plus the number of padding
 * elements that changed. 0 = every element written, nothing outside the view touched. */
int64_t t_buf_check_written(const t_buf *x);
/* max over the view of |t - ref| (ref contiguous [b, s, h, d]); +inf if any is NaN. */
double t_max_diff(const fa_tensor *t, const double *ref);
double t_max_abs(const double *x, int64_t n);
/* 1 if every x[i] is finite (-inf allowed with neg_inf_ok: an LSE of a row without keys). */
int t_all_finite(const double *x, int64_t n, int neg_inf_ok);
/* NaN-aware max |a - b| over n floats; matching infinities count as equal. */
double t_max_diff_f(const float *a, const double *b, int64_t n);

#endif
