"""numpy arrays on the CPU, without torch: forward and backward. Arrays reach _ext through the buffer protocol
(float32, float16); ml_dtypes.bfloat16 arrays, which have no buffer format, as (data, dtype, shape, strides)."""
import numpy as np

from . import _capi

_F32, _F16 = np.dtype(np.float32), np.dtype(np.float16)


def _arg(a, name):
    if not isinstance(a, np.ndarray):
        raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, f"FA_ERR_INVALID_ARGUMENT: {name}: expected a "
                                         f"numpy array or a torch tensor, got {type(a).__name__}")
    dt = a.dtype
    if dt is _F32 or dt is _F16 or dt == _F32 or dt == _F16:  # identity first: dtype.name costs ~2 us
        return a
    if dt.name != "bfloat16":
        raise _capi.UnsupportedError(_capi.ERR_UNSUPPORTED, f"FA_ERR_UNSUPPORTED: {name}: dtype {a.dtype} is not "
                                     f"supported (float32, float16, bfloat16); flashattn does not cast")
    if a.ndim not in (3, 4) or any(s % 2 for s in a.strides):
        raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, f"FA_ERR_INVALID_ARGUMENT: {name}: expected a "
                                         f"3-d or 4-d array of whole-element strides, got shape {a.shape} strides "
                                         f"{a.strides}")
    shape, strides = a.shape, tuple(s // 2 for s in a.strides)
    if a.ndim == 3:
        shape, strides = (1,) + shape, (0,) + strides
    return a.ctypes.data, _capi.DTYPE_BF16, shape, strides


def _lse_shape(q):
    return (q.shape[0], q.shape[2], q.shape[1]) if q.ndim == 4 else (q.shape[1], q.shape[0])


def _opts(cu_q, cu_k, opts):
    """_ext's options: opts (the 7 of _capi.options, then max_seqlen_q/k) with the cu_seqlens addresses and n_seqs
    before the two bounds."""
    if (cu_q is None) != (cu_k is None):
        raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, "FA_ERR_INVALID_ARGUMENT: cu_seqlens_q and "
                                         "cu_seqlens_k are given together or not at all")
    if cu_q is None:
        return opts[:7] + (0, 0, 0) + opts[7:]
    for a, name in ((cu_q, "cu_seqlens_q"), (cu_k, "cu_seqlens_k")):
        if not isinstance(a, np.ndarray) or a.dtype != np.int32 or a.ndim != 1 or not a.flags.c_contiguous:
            raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, f"FA_ERR_INVALID_ARGUMENT: {name}: expected "
                                             f"a contiguous 1-d int32 array")
    if cu_q.size != cu_k.size or cu_q.size < 1:
        raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, f"FA_ERR_INVALID_ARGUMENT: cu_seqlens_q has "
                                         f"{cu_q.size} entries, cu_seqlens_k {cu_k.size}: expected n_seqs + 1 each")
    return opts[:7] + (cu_q.ctypes.data, cu_k.ctypes.data, cu_q.size - 1) + opts[7:]


def sinks_address(sinks, q):
    """learnable_sink as the C API reads it (opts.sinks): a contiguous float32 [heads_q] array; its address."""
    heads = q.shape[-2]
    if (not isinstance(sinks, np.ndarray) or sinks.dtype != _F32 or sinks.shape != (heads,)
            or not sinks.flags.c_contiguous):
        got = f"{sinks.dtype} {sinks.shape}" if isinstance(sinks, np.ndarray) else type(sinks).__name__
        raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, f"FA_ERR_INVALID_ARGUMENT: learnable_sink: "
                                         f"expected a contiguous float32 [{heads}] array (one per query head), got "
                                         f"{got}; flashattn does not cast")
    return sinks.ctypes.data


def _more(opts, cu_q, sinks, d_sinks, more):
    """opts extended with sinks, d_sinks, seqused_q/k and attention_chunk (more: interface._more's tuple or None);
    FP8 needs torch tensors (numpy has no float8_e4m3fn)."""
    if more is None:
        return opts if sinks is None else opts + (sinks, d_sinks)
    used_q, used_k, chunk, qd, kd, vd = more
    for t, name in ((qd, "q_descale"), (kd, "k_descale"), (vd, "v_descale")):
        if t is not None:
            raise _capi.UnsupportedError(_capi.ERR_UNSUPPORTED, f"FA_ERR_UNSUPPORTED: {name}: FP8 inputs are offered "
                                         f"for torch tensors (numpy has no float8_e4m3fn)")
    if (used_q is not None or used_k is not None) and cu_q is None:
        raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, "FA_ERR_INVALID_ARGUMENT: seqused_q/k: given "
                                         "without cu_seqlens (they give the used rows of a packed batch's sequences)")
    n_seqs = opts[9]
    used = []
    for t, name in ((used_q, "seqused_q"), (used_k, "seqused_k")):
        if t is not None and (not isinstance(t, np.ndarray) or t.dtype != np.int32 or t.shape != (n_seqs,)
                              or not t.flags.c_contiguous):
            raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, f"FA_ERR_INVALID_ARGUMENT: {name}: expected "
                                             f"a contiguous int32 [{n_seqs}] array (one per sequence)")
        used.append(0 if t is None else t.ctypes.data)
    return opts + (sinks, d_sinks, used[0], used[1], 0, 0, 0, int(chunk))


def _addresses(opts, q):
    """_more's (..., sinks array, d_sinks array, ...) as addresses."""
    if len(opts) <= 12:
        return opts
    sinks, d_sinks = opts[12], opts[13]
    return opts[:12] + (0 if sinks is None else sinks_address(sinks, q),
                        0 if d_sinks is None else d_sinks.ctypes.data) + opts[14:]


def forward(q, k, v, cu_seqlens_q, cu_seqlens_k, opts, need_lse=True, sinks=None, more=None):
    """(out, lse): out with q's rows and dtype and v's head_dim (C order), lse float32 [B, H, Sq] ([H, total_q] for
    varlen), or None when need_lse is False. sinks: learnable_sink or None; more: interface._more's tuple or None."""
    ctx = _capi.context(_capi.BACKEND_CPU, 0)
    args = _arg(q, "q"), _arg(k, "k"), _arg(v, "v")
    opts = _addresses(_more(_opts(cu_seqlens_q, cu_seqlens_k, opts), cu_seqlens_q, sinks, None, more), q)
    out = np.empty(q.shape[:-1] + v.shape[-1:], dtype=q.dtype)  # v's head_dim
    lse = np.empty(_lse_shape(q), dtype=np.float32) if need_lse else None
    ctx.forward(opts, *args, _arg(out, "out"), 0 if lse is None else lse)
    return out, lse


def backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, opts, sinks=None, more=None):
    """(dq, dk, dv), shaped and typed as q, k, v; with sinks (learnable_sink), (dq, dk, dv, d_sinks)."""
    ctx = _capi.context(_capi.BACKEND_CPU, 0)
    if (not isinstance(lse, np.ndarray) or lse.dtype != np.float32 or lse.shape != _lse_shape(q)
            or not lse.flags.c_contiguous):
        raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, f"FA_ERR_INVALID_ARGUMENT: lse: expected the "
                                         f"forward's contiguous float32 array of shape {_lse_shape(q)}")
    args = [_arg(a, n) for a, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (dout, "dout"))]
    dq, dk, dv = np.empty(q.shape, q.dtype), np.empty(k.shape, k.dtype), np.empty(v.shape, v.dtype)
    d_sinks = None if sinks is None else np.empty(q.shape[-2], dtype=np.float32)
    opts = _addresses(_more(_opts(cu_seqlens_q, cu_seqlens_k, opts), cu_seqlens_q, sinks, d_sinks, more), q)
    ctx.backward(opts, *args[:4], lse, args[4], _arg(dq, "dq"), _arg(dk, "dk"), _arg(dv, "dv"))
    return (dq, dk, dv) if sinks is None else (dq, dk, dv, d_sinks)
