"""numpy arrays on the CPU, without torch: flash_attn_with_kvcache (the cache arrays are written in place) and
merge_states."""
import numpy as np

from . import _capi, _kvcache
from ._numpy import _arg, sinks_address


def _index(a, name, ndim, batch=None):
    ok = isinstance(a, np.ndarray) and a.ndim == ndim and a.dtype == np.int32 and a.strides[-1] == 4
    _kvcache.check_index(ok, getattr(a, "shape", ()), name, ndim, batch)
    return a.ctypes.data


def kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, block_table,
            softmax_scale, causal, window_left, window_right, softcap, rotary_interleaved, num_splits,
            learnable_sink=None, attention_chunk=0, cache_leftpad=None, cu_seqlens_q=None, cu_seqlens_k_new=None,
            max_seqlen_q=0, k_descale=None, v_descale=None):
    """(out, lse) as the torch front end's, for numpy arrays."""
    for name, t in (("k_descale", k_descale), ("v_descale", v_descale)):
        if t is not None:
            raise _kvcache.unsupported(f"{name}: FP8 caches are offered for torch tensors (numpy has no "
                                       f"float8_e4m3fn)")
    ctx = _capi.context(_capi.BACKEND_CPU, 0)
    args = [_arg(q, "q"), _arg(k_cache, "k_cache"), _arg(v_cache, "v_cache"),
            None if k is None else _arg(k, "k"), None if v is None else _arg(v, "v")]
    if q.ndim != (3 if cu_seqlens_q is not None else 4):
        raise _kvcache.invalid(f"q: expected a 4-d [batch, seqlen_q, heads, head_dim] array (3-d with cu_seqlens_q), "
                               f"got shape {q.shape}")
    _kvcache.check_pairs(k, v, rotary_cos, rotary_sin)
    batch = q.shape[0]
    cus = [None if a is None else _index(a, n, 1) for a, n in ((cu_seqlens_q, "cu_seqlens_q"),
                                                               (cu_seqlens_k_new, "cu_seqlens_k_new"))]
    if cus[0] is not None or cus[1] is not None:
        batch = (cu_seqlens_q if cu_seqlens_q is not None else cu_seqlens_k_new).shape[0] - 1
    varlen = (cus[0] or 0, cus[1] or 0, batch if cus[0] or cus[1] else 0, int(max_seqlen_q or 0) if cus[0] else 0)
    if block_table is not None:
        table = _index(block_table, "block_table", 2)
        max_pages, table_stride, rows = block_table.shape[1], block_table.strides[0] // 4, block_table.shape[0]
        capacity = max_pages * k_cache.shape[1]
    else:
        table, max_pages, table_stride, rows, capacity = 0, 0, 0, 0, k_cache.shape[1]
    if cache_seqlens is None:  # flash-attn: every sequence fills its whole cache
        cache_seqlens = np.full(batch, capacity, dtype=np.int32)
    seqlens = _index(cache_seqlens, "cache_seqlens", 1, batch)
    idx = 0 if cache_batch_idx is None else _index(cache_batch_idx, "cache_batch_idx", 1, batch)
    cos = sin = rot_seqlen = rot_dim = 0
    if rotary_cos is not None:
        ok = all(isinstance(t, np.ndarray) and t.dtype == np.float32 and t.flags.c_contiguous
                 for t in (rotary_cos, rotary_sin))
        rot_seqlen, rot_dim = _kvcache.check_rotary(np.shape(rotary_cos), np.shape(rotary_sin), ok, q.shape[-1])
        cos, sin = rotary_cos.ctypes.data, rotary_sin.ctypes.data
    lp = 0 if cache_leftpad is None else _index(cache_leftpad, "cache_leftpad", 1, batch)
    kv = (seqlens, table, max_pages, table_stride, idx, rows, num_splits, cos, sin, rot_seqlen, rot_dim,
          int(rotary_interleaved), lp)
    out = np.empty(q.shape[:-1] + v_cache.shape[-1:], dtype=q.dtype)  # v's head_dim (MLA: 576 / 512)
    lse = np.empty((q.shape[1], q.shape[0]) if q.ndim == 3 else (batch, q.shape[2], q.shape[1]), dtype=np.float32)
    sinks = 0 if learnable_sink is None else sinks_address(learnable_sink, q)
    opts = _kvcache.options(softmax_scale, causal, (window_left, window_right), softcap, sinks, attention_chunk,
                            varlen)
    ctx.kvcache(opts, kv, *args, _arg(out, "out"), lse.ctypes.data)
    return out, lse


def merge(outs, lses):
    outs, lses = list(outs), list(lses)
    if not outs or len(outs) != len(lses):
        raise _kvcache.invalid(f"merge_states: expected as many lse as outs (1 or more), got {len(outs)} and {len(lses)}")
    o0 = outs[0]
    if not isinstance(o0, np.ndarray) or o0.ndim != 4:
        raise _kvcache.invalid("outs[0]: expected a 4-d [batch, seqlen, heads, head_dim] array")
    shape = (o0.shape[0], o0.shape[2], o0.shape[1])
    for i, a in enumerate(lses):
        if not isinstance(a, np.ndarray) or a.dtype != np.float32 or a.shape != shape or not a.flags.c_contiguous:
            raise _kvcache.invalid(f"lses[{i}]: expected a contiguous float32 array of shape {shape}")
    views = [_arg(a, f"outs[{i}]") for i, a in enumerate(outs)]
    out = np.empty(o0.shape, dtype=o0.dtype)
    lse = np.empty(shape, dtype=np.float32)
    _capi.context(_capi.BACKEND_CPU, 0).merge(views, [a.ctypes.data for a in lses], _arg(out, "out"), lse.ctypes.data)
    return out, lse


def longest(seqlens):
    """The largest entry of a 1-d int32 cache_seqlens array; None when it is not one (the call's checks name it)."""
    if not isinstance(seqlens, np.ndarray) or seqlens.ndim != 1 or seqlens.dtype != np.int32 or not seqlens.size:
        return None
    return int(seqlens.max())


def full_seqlens(q, n, batch=None):
    return np.full(q.shape[0] if batch is None else batch, n, dtype=np.int32)
