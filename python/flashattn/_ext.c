/* The hot call from Python: tensors to fa_tensor views and one fa_forward/fa_backward, in C (ctypes spent ~15 µs
 * per call here; docs/python.md has the measurement). The module links nothing: _capi.py loads libflashattn with
 * ctypes and hands over the entry points, so the C library exists once in the process. No torch headers:
 * torch tensors arrive as (data_ptr, dtype, shape, strides) tuples, numpy arrays through the buffer protocol. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "flashattn.h"

typedef fa_status (*fwd_fn)(fa_context *, const fa_attn_opts *, const fa_tensor *, const fa_tensor *,
                            const fa_tensor *, const fa_tensor *, float *);
typedef fa_status (*bwd_fn)(fa_context *, const fa_attn_opts *, const fa_tensor *, const fa_tensor *,
                            const fa_tensor *, const fa_tensor *, const float *, const fa_tensor *, const fa_tensor *,
                            const fa_tensor *, const fa_tensor *);

typedef fa_status (*opts_init_fn)(fa_attn_opts *, size_t);
typedef fa_status (*kv_opts_init_fn)(fa_kv_opts *, size_t);
typedef fa_status (*kvcache_fn)(fa_context *, const fa_attn_opts *, const fa_kv_opts *, const fa_tensor *,
                                const fa_kvcache *, const fa_tensor *, const fa_tensor *, const fa_tensor *, float *);
typedef fa_status (*merge_fn)(fa_context *, int, const fa_tensor *, const float *const *, const fa_tensor *, float *);

static opts_init_fn g_opts_init;
static fwd_fn g_forward;
static bwd_fn g_backward;
static kv_opts_init_fn g_kv_opts_init;
static kvcache_fn g_kvcache;
static merge_fn g_merge;
static PyObject *g_invalid, *g_unsupported; /* flashattn.InvalidArgumentError, flashattn.UnsupportedError */

static int fail(fa_status status, const char *fmt, const char *name, long long value) {
    char msg[256];
    PyObject *cls = status == FA_ERR_UNSUPPORTED ? g_unsupported : g_invalid;
    PyOS_snprintf(msg, sizeof msg, fmt, name, value);
    PyObject *err = PyObject_CallFunction(cls, "is", (int)status, msg);
    if (err) {
        PyErr_SetObject(cls, err);
        Py_DECREF(err);
    }
    return -1;
}

/* One tensor: a (data, dtype, (b, s, h, d), (sb, ss, sh, sd)) tuple, or an array with the buffer protocol (4-d
 * [b, s, h, d], or 3-d [total, h, d] for varlen). buf is released by the caller when buf->obj is set. */
static int get_view(PyObject *o, const char *name, int writable, fa_tensor *t, Py_buffer *buf) {
    long long st[4], sh[4];
    buf->obj = NULL;
    if (PyTuple_Check(o)) {
        PyObject *shape, *strides;
        unsigned long long data;
        int dtype;
        if (!PyArg_ParseTuple(o, "KiOO", &data, &dtype, &shape, &strides)) return -1;
        if (!PyArg_ParseTuple(shape, "LLLL", &sh[0], &sh[1], &sh[2], &sh[3])) return -1;
        if (!PyArg_ParseTuple(strides, "LLLL", &st[0], &st[1], &st[2], &st[3])) return -1;
        t->data = (void *)(uintptr_t)data;
        t->dtype = (fa_dtype)dtype;
    } else {
        if (PyObject_GetBuffer(o, buf, PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
        const char *f = buf->format;
        if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
        if (f[0] == 'f' && !f[1]) t->dtype = FA_DTYPE_F32;
        else if (f[0] == 'e' && !f[1]) t->dtype = FA_DTYPE_F16;
        else return fail(FA_ERR_UNSUPPORTED, "FA_ERR_UNSUPPORTED: %s: dtype is not float32, float16 or bfloat16; "
                         "flashattn does not cast", name, 0);
        if (buf->ndim != 4 && buf->ndim != 3)
            return fail(FA_ERR_INVALID_ARGUMENT, "FA_ERR_INVALID_ARGUMENT: %s: expected 4 dimensions (3 for varlen), "
                        "got %lld", name, buf->ndim);
        int off = 4 - buf->ndim;
        sh[0] = 1;
        st[0] = 0;
        for (int i = 0; i < buf->ndim; i++) {
            if (buf->strides[i] % buf->itemsize)
                return fail(FA_ERR_INVALID_ARGUMENT, "FA_ERR_INVALID_ARGUMENT: %s: a stride of %lld bytes is not "
                            "whole elements", name, (long long)buf->strides[i]);
            sh[off + i] = buf->shape[i];
            st[off + i] = buf->strides[i] / buf->itemsize;
        }
        t->data = buf->buf;
    }
    if (st[3] != 1 && sh[3] > 1)
        return fail(FA_ERR_INVALID_ARGUMENT, "FA_ERR_INVALID_ARGUMENT: %s: head_dim must be contiguous (stride 1), "
                    "got stride %lld; flashattn does not copy its inputs", name, st[3]);
    t->batch = sh[0], t->seqlen = sh[1], t->heads = sh[2], t->head_dim = sh[3];
    t->stride_batch = st[0], t->stride_seq = st[1], t->stride_head = st[2];
    return 0;
}

/* opts: (scale, causal, window_left, window_right, softcap, algo, deterministic, cu_q, cu_k, n_seqs
 * [, max_seqlen_q, max_seqlen_k [, sinks, d_sinks [, seqused_q, seqused_k [, q_descale, k_descale, v_descale
 * [, attention_chunk]]]]]); the arrays as addresses (0 = NULL) */
static int get_opts(PyObject *o, fa_attn_opts *opts) {
    unsigned long long cu_q, cu_k, sinks = 0, d_sinks = 0, used_q = 0, used_k = 0, qd = 0, kd = 0, vd = 0;
    int algo;
    g_opts_init(opts, sizeof *opts);
    if (!PyArg_ParseTuple(o, "fpiifipKKL|LLKKKKKKKi", &opts->scale, &opts->causal, &opts->window_left,
                          &opts->window_right, &opts->softcap, &algo, &opts->deterministic, &cu_q, &cu_k,
                          &opts->n_seqs, &opts->max_seqlen_q, &opts->max_seqlen_k, &sinks, &d_sinks, &used_q, &used_k,
                          &qd, &kd, &vd, &opts->attention_chunk))
        return -1;
    opts->algo = (fa_algo)algo;
    opts->cu_seqlens_q = (const int32_t *)(uintptr_t)cu_q;
    opts->cu_seqlens_k = (const int32_t *)(uintptr_t)cu_k;
    opts->sinks = (const float *)(uintptr_t)sinks;
    opts->d_sinks = (float *)(uintptr_t)d_sinks;
    opts->seqused_q = (const int32_t *)(uintptr_t)used_q;
    opts->seqused_k = (const int32_t *)(uintptr_t)used_k;
    opts->q_descale = (const float *)(uintptr_t)qd;
    opts->k_descale = (const float *)(uintptr_t)kd;
    opts->v_descale = (const float *)(uintptr_t)vd;
    return 0;
}

static PyObject *run(PyObject *args, int backward) {
    enum { MAXT = 8 };
    static const char *names[MAXT] = {"q", "k", "v", "out", "dout", "dq", "dk", "dv"};
    const int n = backward ? 8 : 4;
    PyObject *obj[MAXT], *opts_obj;
    unsigned long long ctx;
    PyObject *lse_obj;
    Py_buffer lse_buf = {0};
    void *lse = NULL;
    fa_attn_opts opts;
    fa_tensor t[MAXT];
    Py_buffer buf[MAXT];
    int got = 0, rc = -1;
    fa_status st = FA_OK;
    if (backward) {
        if (!PyArg_ParseTuple(args, "KOOOOOOOOOO", &ctx, &opts_obj, &obj[0], &obj[1], &obj[2], &obj[3], &lse_obj,
                              &obj[4], &obj[5], &obj[6], &obj[7]))
            return NULL;
    } else if (!PyArg_ParseTuple(args, "KOOOOOO", &ctx, &opts_obj, &obj[0], &obj[1], &obj[2], &obj[3], &lse_obj)) {
        return NULL;
    }
    if (get_opts(opts_obj, &opts) < 0) return NULL;
    if (PyLong_Check(lse_obj)) {
        lse = PyLong_AsVoidPtr(lse_obj);
        if (PyErr_Occurred()) return NULL;
    } else {
        if (PyObject_GetBuffer(lse_obj, &lse_buf, PyBUF_C_CONTIGUOUS | (backward ? 0 : PyBUF_WRITABLE)) < 0)
            return NULL;
        lse = lse_buf.buf;
    }
    for (; got < n; got++)
        if (get_view(obj[got], names[got], backward ? got >= 5 : got == 3, &t[got], &buf[got]) < 0) {
            if (buf[got].obj) PyBuffer_Release(&buf[got]);
            goto done;
        }
    Py_BEGIN_ALLOW_THREADS
    if (backward)
        st = g_backward((fa_context *)(uintptr_t)ctx, &opts, &t[0], &t[1], &t[2], &t[3], (const float *)lse,
                        &t[4], &t[5], &t[6], &t[7]);
    else
        st = g_forward((fa_context *)(uintptr_t)ctx, &opts, &t[0], &t[1], &t[2], &t[3], (float *)lse);
    Py_END_ALLOW_THREADS
    rc = 0;
done:
    for (int i = 0; i < got; i++)
        if (buf[i].obj) PyBuffer_Release(&buf[i]);
    if (lse_buf.obj) PyBuffer_Release(&lse_buf);
    return rc < 0 ? NULL : PyLong_FromLong((long)st);
}

/* kv: (seqlens, block_table, max_pages, block_table_stride, batch_idx, cache_rows, num_splits, rotary_cos,
 * rotary_sin, rotary_seqlen, rotary_dim, rotary_interleaved [, cache_leftpad [, k_descale, v_descale]]); every array
 * as an address (0 = NULL). */
static int get_kv(PyObject *o, fa_kvcache *c, fa_kv_opts *kv) {
    unsigned long long seqlens, table, idx, cos, sin, leftpad = 0, kds = 0, vds = 0;
    g_kv_opts_init(kv, sizeof *kv);
    if (!PyArg_ParseTuple(o, "KKLLKLiKKLii|KKK", &seqlens, &table, &c->max_pages, &c->block_table_stride, &idx,
                          &c->cache_rows, &kv->num_splits, &cos, &sin, &kv->rotary_seqlen, &kv->rotary_dim,
                          &kv->rotary_interleaved, &leftpad, &kds, &vds))
        return -1;
    kv->cache_leftpad = (const int32_t *)(uintptr_t)leftpad;
    kv->k_descale = (const float *)(uintptr_t)kds;
    kv->v_descale = (const float *)(uintptr_t)vds;
    c->seqlens = (const int32_t *)(uintptr_t)seqlens;
    c->block_table = (const int32_t *)(uintptr_t)table;
    c->batch_idx = (const int32_t *)(uintptr_t)idx;
    kv->rotary_cos = (const float *)(uintptr_t)cos;
    kv->rotary_sin = (const float *)(uintptr_t)sin;
    return 0;
}

/* kvcache(ctx, opts, kv, q, k_cache, v_cache, k_new or None, v_new or None, out, lse address) -> fa_status */
static PyObject *py_kvcache(PyObject *self, PyObject *args) {
    (void)self;
    enum { NT = 6 };
    static const char *names[NT] = {"q", "k_cache", "v_cache", "k", "v", "out"};
    PyObject *obj[NT], *opts_obj, *kv_obj;
    unsigned long long ctx, lse;
    fa_attn_opts opts;
    fa_kv_opts kv;
    fa_kvcache cache = {0};
    fa_tensor t[NT];
    Py_buffer buf[NT];
    int got = 0, rc = -1;
    fa_status st = FA_OK;
    if (!PyArg_ParseTuple(args, "KOOOOOOOOK", &ctx, &opts_obj, &kv_obj, &obj[0], &obj[1], &obj[2], &obj[3],
                          &obj[4], &obj[5], &lse))
        return NULL;
    if (get_opts(opts_obj, &opts) < 0 || get_kv(kv_obj, &cache, &kv) < 0) return NULL;
    const int append = obj[3] != Py_None;
    for (; got < NT; got++) {
        buf[got].obj = NULL;
        if (obj[got] == Py_None) continue;
        if (get_view(obj[got], names[got], got == 5 || (append && (got == 1 || got == 2)), &t[got], &buf[got]) < 0) {
            if (buf[got].obj) PyBuffer_Release(&buf[got]);
            goto done;
        }
    }
    cache.k = t[1];
    cache.v = t[2];
    Py_BEGIN_ALLOW_THREADS
    st = g_kvcache((fa_context *)(uintptr_t)ctx, &opts, &kv, &t[0], &cache, append ? &t[3] : NULL,
                   obj[4] != Py_None ? &t[4] : NULL, &t[5], (float *)(uintptr_t)lse);
    Py_END_ALLOW_THREADS
    rc = 0;
done:
    for (int i = 0; i < got; i++)
        if (buf[i].obj) PyBuffer_Release(&buf[i]);
    return rc < 0 ? NULL : PyLong_FromLong((long)st);
}

/* merge(ctx, outs sequence, lse addresses sequence, out, lse address) -> fa_status. Any number of states (flash-attn's
 * combine goes to 133 splits): their views on the heap. */
static PyObject *py_merge(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *outs_obj, *lses_obj, *out_obj;
    unsigned long long ctx, lse;
    fa_tensor *t = NULL, out;
    Py_buffer *buf = NULL, out_buf = {0};
    const float **lses = NULL;
    Py_ssize_t got = 0;
    int rc = -1;
    fa_status st = FA_OK;
    if (!PyArg_ParseTuple(args, "KOOOK", &ctx, &outs_obj, &lses_obj, &out_obj, &lse)) return NULL;
    Py_ssize_t n = PySequence_Size(outs_obj);
    if (n < 0) return NULL;
    if (n < 1 || n > INT_MAX || PySequence_Size(lses_obj) != n) {
        if (!PyErr_Occurred())
            fail(FA_ERR_INVALID_ARGUMENT, "FA_ERR_INVALID_ARGUMENT: %s: expected 1 or more states with one lse each, "
                 "got %lld", "outs", (long long)n);
        return NULL;
    }
    t = PyMem_Malloc(sizeof *t * (size_t)n);
    buf = PyMem_Malloc(sizeof *buf * (size_t)n);
    lses = PyMem_Malloc(sizeof *lses * (size_t)n);
    if (!t || !buf || !lses) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PySequence_GetItem(lses_obj, i);
        if (!a) goto done;
        lses[i] = (const float *)PyLong_AsVoidPtr(a);
        Py_DECREF(a);
        if (PyErr_Occurred()) goto done;
    }
    for (; got < n; got++) {
        PyObject *a = PySequence_GetItem(outs_obj, got);
        if (!a) goto done;
        int bad = get_view(a, "outs", 0, &t[got], &buf[got]);
        Py_DECREF(a);
        if (bad < 0) {
            if (buf[got].obj) PyBuffer_Release(&buf[got]);
            goto done;
        }
    }
    if (get_view(out_obj, "out", 1, &out, &out_buf) < 0) goto done;
    Py_BEGIN_ALLOW_THREADS
    st = g_merge((fa_context *)(uintptr_t)ctx, (int)n, t, lses, &out, (float *)(uintptr_t)lse);
    Py_END_ALLOW_THREADS
    rc = 0;
done:
    for (Py_ssize_t i = 0; i < got; i++)
        if (buf[i].obj) PyBuffer_Release(&buf[i]);
    if (out_buf.obj) PyBuffer_Release(&out_buf);
    PyMem_Free(t), PyMem_Free(buf), PyMem_Free(lses);
    return rc < 0 ? NULL : PyLong_FromLong((long)st);
}

static PyObject *py_forward(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, 0);
}

static PyObject *py_backward(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, 1);
}

static PyObject *py_init(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long i, f, b, ki, kc, m;
    PyObject *invalid, *unsupported;
    if (!PyArg_ParseTuple(args, "KKKKKKOO", &i, &f, &b, &ki, &kc, &m, &invalid, &unsupported)) return NULL;
    g_opts_init = (opts_init_fn)(uintptr_t)i;
    g_forward = (fwd_fn)(uintptr_t)f;
    g_backward = (bwd_fn)(uintptr_t)b;
    g_kv_opts_init = (kv_opts_init_fn)(uintptr_t)ki;
    g_kvcache = (kvcache_fn)(uintptr_t)kc;
    g_merge = (merge_fn)(uintptr_t)m;
    Py_XSETREF(g_invalid, Py_NewRef(invalid));
    Py_XSETREF(g_unsupported, Py_NewRef(unsupported));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"init", py_init, METH_VARARGS,
     "init(addresses of fa_attn_opts_init, fa_forward, fa_backward, fa_kv_opts_init, fa_forward_kvcache, "
     "fa_merge_states; InvalidArgumentError, UnsupportedError)"},
    {"forward", py_forward, METH_VARARGS, "forward(ctx, opts, q, k, v, out, lse address or array) -> fa_status"},
    {"backward", py_backward, METH_VARARGS,
     "backward(ctx, opts, q, k, v, out, lse address or array, dout, dq, dk, dv) -> fa_status"},
    {"kvcache", py_kvcache, METH_VARARGS,
     "kvcache(ctx, opts, kv, q, k_cache, v_cache, k or None, v or None, out, lse address) -> fa_status"},
    {"merge", py_merge, METH_VARARGS, "merge(ctx, outs, lse addresses, out, lse address) -> fa_status"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ext", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__ext(void) { return PyModule_Create(&module); }
