"""numpy arrays on the CPU, without torch: forward and backward through the same views as torch tensors."""
import numpy as np

from . import _capi


def _dtype_code(a, name):
    if a.dtype == np.float32:
        return _capi.DTYPE_F32
    if a.dtype == np.float16:
        return _capi.DTYPE_F16
    if a.dtype.name == "bfloat16":  # ml_dtypes.bfloat16, when the caller uses it
        return _capi.DTYPE_BF16
    raise _capi.UnsupportedError(_capi.ERR_UNSUPPORTED, f"FA_ERR_UNSUPPORTED: {name}: dtype {a.dtype} is not "
                                 f"supported (float32, float16, bfloat16); flashattn does not cast")


def _view(a, name):
    if not isinstance(a, np.ndarray):
        raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, f"FA_ERR_INVALID_ARGUMENT: {name}: expected a "
                                         f"numpy array or a torch tensor, got {type(a).__name__}")
    code = _dtype_code(a, name)
    size = a.itemsize
    if any(s % size for s in a.strides):
        raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, f"FA_ERR_INVALID_ARGUMENT: {name}: strides "
                                         f"{a.strides} bytes are not whole elements of {size} bytes")
    strides = tuple(s // size for s in a.strides)
    if a.ndim == 4:
        return a.ctypes.data, code, a.shape, strides
    if a.ndim == 3:
        return a.ctypes.data, code, (1,) + a.shape, (0,) + strides
    raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, f"FA_ERR_INVALID_ARGUMENT: {name}: expected a 4-d "
                                     f"[batch, seqlen, heads, head_dim] array (3-d [total, heads, head_dim] for "
                                     f"varlen), got shape {a.shape}")


def _lse_shape(q):
    return (q.shape[0], q.shape[2], q.shape[1]) if q.ndim == 4 else (q.shape[1], q.shape[0])


def _set_opts(ctx, cu_q, cu_k, opts):
    if (cu_q is None) != (cu_k is None):
        raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, "FA_ERR_INVALID_ARGUMENT: cu_seqlens_q and "
                                         "cu_seqlens_k are given together or not at all")
    if cu_q is None:
        ctx.set_opts(opts)
        return ()
    cu = []
    for a, name in ((cu_q, "cu_seqlens_q"), (cu_k, "cu_seqlens_k")):
        if not isinstance(a, np.ndarray) or a.dtype != np.int32 or a.ndim != 1 or not a.flags.c_contiguous:
            raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, f"FA_ERR_INVALID_ARGUMENT: {name}: expected "
                                             f"a contiguous 1-d int32 array")
        cu.append(a)
    if cu[0].size != cu[1].size or cu[0].size < 1:
        raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, f"FA_ERR_INVALID_ARGUMENT: cu_seqlens_q has "
                                         f"{cu[0].size} entries, cu_seqlens_k {cu[1].size}: expected n_seqs + 1 each")
    ctx.set_opts(opts, cu[0].ctypes.data, cu[1].ctypes.data, cu[0].size - 1)
    return cu


def forward(q, k, v, cu_seqlens_q, cu_seqlens_k, opts):
    """(out, lse): out shaped and typed as q (C order), lse float32 [B, H, Sq] ([H, total_q] for varlen)."""
    ctx = _capi.context(_capi.BACKEND_CPU, 0)
    views = _view(q, "q"), _view(k, "k"), _view(v, "v")
    _set_opts(ctx, cu_seqlens_q, cu_seqlens_k, opts)
    out = np.empty(q.shape, dtype=q.dtype)
    lse = np.empty(_lse_shape(q), dtype=np.float32)
    ctx.forward(*views, _view(out, "out"), lse.ctypes.data)
    return out, lse


def backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, opts):
    """(dq, dk, dv), shaped and typed as q, k, v."""
    ctx = _capi.context(_capi.BACKEND_CPU, 0)
    if (not isinstance(lse, np.ndarray) or lse.dtype != np.float32 or lse.shape != _lse_shape(q)
            or not lse.flags.c_contiguous):
        raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, f"FA_ERR_INVALID_ARGUMENT: lse: expected the "
                                         f"forward's contiguous float32 array of shape {_lse_shape(q)}")
    views = [_view(a, n) for a, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (dout, "dout"))]
    _set_opts(ctx, cu_seqlens_q, cu_seqlens_k, opts)
    dq, dk, dv = np.empty(q.shape, q.dtype), np.empty(k.shape, k.dtype), np.empty(v.shape, v.dtype)
    ctx.backward(*views[:4], lse.ctypes.data, views[4], _view(dq, "dq"), _view(dk, "dk"), _view(dv, "dv"))
    return dq, dk, dv
