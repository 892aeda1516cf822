/* Tensors of the tests: a view (any layout, padded strides, an offset, broadcast) into an allocation that is
 * poisoned with NaN, so a kernel that reads padding or leaves an element unwritten is caught. */
#include "tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"

const char *t_layout_name(t_layout l) {
    switch (l) {
    case T_BSHD: return "bshd";
    case T_BHSD: return "bhsd";
    case T_STRIDED: return "strided";
    case T_BCAST: return "bcast";
    }
    return "?";
}

static size_t esize(fa_dtype dt) { return dt == FA_DTYPE_F32 ? 4 : dt == FA_DTYPE_F8_E4M3 ? 1 : 2; }

t_buf t_buf_new(fa_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d, t_layout lay) {
    return t_buf_new_r(&t_default_rng, dt, b, s, h, d, lay);
}

t_buf t_buf_new_r(t_rng *r, fa_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d, t_layout lay) {
    t_buf x;
    memset(&x, 0, sizeof x);
    int64_t sb, ss, sh, off = 0, elems;
    switch (lay) {
    case T_BHSD:
        ss = d, sh = s * d, sb = h * s * d;
        elems = b * sb;
        break;
    case T_STRIDED: {
        int64_t ph = t_rng_int(r, 1, 5), ps = t_rng_int(r, 0, 7), pb = t_rng_int(r, 0, 9);
        off = t_rng_int(r, 0, 7);
        if (t_rng_int(r, 0, 1)) { /* seq outer, head inner (padded bshd) */
            sh = d + ph, ss = h * sh + ps, sb = s * ss + pb;
        } else { /* head outer, seq inner (padded bhsd) */
            ss = d + ph, sh = s * ss + ps, sb = h * sh + pb;
        }
        elems = off + (b - 1) * sb + (s - 1) * ss + (h - 1) * sh + d + t_rng_int(r, 0, 5);
        break;
    }
    case T_BCAST:
        sh = d, ss = h * d, sb = 0;
        elems = s * h * d;
        break;
    case T_BSHD:
    default:
        sh = d, ss = h * d, sb = s * h * d;
        elems = b * sb;
        break;
    }
    if (elems < 1) elems = 1;
    x.mem_elems = (size_t)elems;
    x.mem_bytes = (size_t)elems * esize(dt);
    x.mem = malloc(x.mem_bytes);
    x.in_view = calloc((size_t)elems, 1);
    if (!x.mem || !x.in_view) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    x.offset = (size_t)off * esize(dt);
    x.t.data = x.mem + x.offset;
    x.t.dtype = dt;
    x.t.batch = b, x.t.seqlen = s, x.t.heads = h, x.t.head_dim = d;
    x.t.stride_batch = sb, x.t.stride_seq = ss, x.t.stride_head = sh;
    for (int64_t ib = 0; ib < b; ib++)
        for (int64_t is = 0; is < s; is++)
            for (int64_t ih = 0; ih < h; ih++)
                for (int64_t i = 0; i < d; i++) x.in_view[off + ib * sb + is * ss + ih * sh + i] = 1;
    t_buf_poison(&x);
    return x;
}

void t_buf_free(t_buf *x) {
    free(x->mem);
    free(x->in_view);
    memset(x, 0, sizeof *x);
}

void t_buf_poison(t_buf *x) {
    size_t es = esize(x->t.dtype);
    for (size_t i = 0; i < x->mem_elems; i++) t_store_nan(x->mem + i * es, x->t.dtype);
}

static int64_t t_index(const fa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t i) {
    return b * t->stride_batch + s * t->stride_seq + h * t->stride_head + i;
}
double t_get(const fa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t i) {
    return t_load(t->data, t->dtype, t_index(t, b, s, h, i));
}
void t_set(const fa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t i, double v) {
    t_store(t->data, t->dtype, t_index(t, b, s, h, i), v);
}

void t_buf_randn(t_buf *x, double sigma) { t_buf_randn_r(&t_default_rng, x, sigma); }

void t_buf_randn_r(t_rng *r, t_buf *x, double sigma) {
    const fa_tensor *t = &x->t;
    int64_t nb = t->stride_batch == 0 ? 1 : t->batch;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t s = 0; s < t->seqlen; s++)
            for (int64_t h = 0; h < t->heads; h++)
                for (int64_t i = 0; i < t->head_dim; i++) t_set(t, b, s, h, i, sigma * t_rng_randn(r));
}

int64_t t_buf_check_written(const t_buf *x) {
    size_t es = esize(x->t.dtype);
    unsigned char nan_bits[4];
    t_store_nan(nan_bits, x->t.dtype);
    int64_t bad = 0;
    for (size_t i = 0; i < x->mem_elems; i++) {
        const unsigned char *p = x->mem + i * es;
        if (x->in_view[i]) {
            if (!isfinite(t_load(x->mem, x->t.dtype, (int64_t)i))) bad++;
        } else if (memcmp(p, nan_bits, es) != 0) {
            bad++;
        }
    }
    return bad;
}

double t_max_diff(const fa_tensor *t, const double *ref) {
    double m = 0;
    int64_t n = 0;
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seqlen; s++)
            for (int64_t h = 0; h < t->heads; h++)
                for (int64_t i = 0; i < t->head_dim; i++, n++) {
                    double e = fabs(t_get(t, b, s, h, i) - ref[n]);
                    if (!(e <= m)) m = isnan(e) ? INFINITY : e;
                }
    return m;
}

double t_max_abs(const double *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(x[i]) && fabs(x[i]) > m) m = fabs(x[i]);
    return m;
}

int t_all_finite(const double *x, int64_t n, int neg_inf_ok) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]) && !(neg_inf_ok && x[i] == -INFINITY)) return 0;
    return 1;
}

double t_max_diff_f(const float *a, const double *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isinf(a[i]) && isinf(b[i]) && (a[i] < 0) == (b[i] < 0)) continue;
        double e = fabs((double)a[i] - b[i]);
        if (!(e <= m)) m = isnan(e) ? INFINITY : e;
    }
    return m;
}

