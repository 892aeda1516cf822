"""PyTorch: flashattn::fwd_kvcache (appends k/v into the cache in place, declared with mutates_args so
torch.compile and functionalization see it) and flashattn::merge_states; inference only, no autograd."""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _capi, _kvcache
from ._torch import _FP8, _context, _lse_shape, _plain_eager, _sinks, _view


def _index(t, name, ndim, batch=None):
    """An int32 index tensor's address (its device was checked with the others)."""
    ok = t.dim() == ndim and t.dtype == torch.int32 and t.stride(-1) == 1
    _kvcache.check_index(ok, t.shape, name, ndim, batch)
    return t.data_ptr()


def _descale(t, name, k_cache, batch):
    """k_descale/v_descale (flash-attn's): float32 [batch, kv_heads] for a float8_e4m3fn cache (its device was
    checked with the others); the contiguous tensor the library reads."""
    if t is None:
        return None
    if _FP8 is None or k_cache.dtype != _FP8:
        raise _kvcache.invalid(f"{name}: given with a {k_cache.dtype} cache; descales go with a float8_e4m3fn cache")
    shape = (batch, k_cache.shape[-2])
    if not isinstance(t, Tensor) or t.dtype != torch.float32 or tuple(t.shape) != shape:
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
        raise _kvcache.invalid(f"{name}: expected a float32 {list(shape)} tensor ([batch, kv_heads]), got {got}; "
                               f"flashattn does not cast")
    return t.contiguous()


def _run(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, block_table,
         softmax_scale, causal, window_left, window_right, softcap, rotary_interleaved, num_splits,
         learnable_sink=None, attention_chunk=0, cache_leftpad=None, cu_seqlens_q=None, cu_seqlens_k_new=None,
         max_seqlen_q=0, k_descale=None, v_descale=None):
    named = (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v), ("rotary_cos", rotary_cos),
             ("rotary_sin", rotary_sin), ("cache_seqlens", cache_seqlens), ("cache_batch_idx", cache_batch_idx),
             ("block_table", block_table), ("learnable_sink", learnable_sink), ("cache_leftpad", cache_leftpad),
             ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k_new", cu_seqlens_k_new), ("k_descale", k_descale),
             ("v_descale", v_descale))
    if q.is_cpu and all(t is None or t.is_cpu for _, t in named):
        ctx = _capi.context(_capi.BACKEND_CPU, 0)
    else:
        ctx = _context(q, [(n, t) for n, t in named if t is not None])
    if q.dim() != (3 if cu_seqlens_q is not None else 4):
        raise _kvcache.invalid(f"q: expected a 4-d [batch, seqlen_q, heads, head_dim] tensor (3-d [total_q, heads, "
                               f"head_dim] with cu_seqlens_q), got shape {tuple(q.shape)}")
    _kvcache.check_pairs(k, v, rotary_cos, rotary_sin)
    dev = q.device
    cus = [None if t is None else _index(t, n, 1) for t, n in ((cu_seqlens_q, "cu_seqlens_q"),
                                                               (cu_seqlens_k_new, "cu_seqlens_k_new"))]
    batch = q.shape[0]
    if cus[0] is not None or cus[1] is not None:
        batch = (cu_seqlens_q if cu_seqlens_q is not None else cu_seqlens_k_new).shape[0] - 1
    varlen = (cus[0] or 0, cus[1] or 0, batch if cus[0] or cus[1] else 0,
              int(max_seqlen_q or 0) if cus[0] else 0)
    if block_table is not None:
        table = _index(block_table, "block_table", 2)
        max_pages, table_stride, rows = block_table.shape[1], block_table.stride(0), block_table.shape[0]
        capacity = max_pages * k_cache.shape[1]
    else:
        table, max_pages, table_stride, rows, capacity = 0, 0, 0, 0, k_cache.shape[1]
    if cache_seqlens is None:  # flash-attn: every sequence fills its whole cache
        cache_seqlens = torch.full((batch,), capacity, dtype=torch.int32, device=dev)
    seqlens = _index(cache_seqlens, "cache_seqlens", 1, batch)
    idx = 0 if cache_batch_idx is None else _index(cache_batch_idx, "cache_batch_idx", 1, batch)
    cos = sin = rot_seqlen = rot_dim = 0
    if rotary_cos is not None:
        ok = all(t.dtype == torch.float32 and t.is_contiguous() for t in (rotary_cos, rotary_sin))
        rot_seqlen, rot_dim = _kvcache.check_rotary(rotary_cos.shape, rotary_sin.shape, ok, q.shape[-1])
        cos, sin = rotary_cos.data_ptr(), rotary_sin.data_ptr()
    lp = 0 if cache_leftpad is None else _index(cache_leftpad, "cache_leftpad", 1, batch)
    scales = [_descale(t, n, k_cache, batch) for t, n in ((k_descale, "k_descale"), (v_descale, "v_descale"))]
    kv = (seqlens, table, max_pages, table_stride, idx, rows, num_splits, cos, sin, rot_seqlen, rot_dim,
          int(rotary_interleaved), lp) + tuple(0 if t is None else t.data_ptr() for t in scales)
    out = q.new_empty(tuple(q.shape[:-1]) + (v_cache.shape[-1],))  # v's head_dim (MLA: 576 / 512)
    lse = torch.empty(_lse_shape(q), dtype=torch.float32, device=dev)
    sinks = None if learnable_sink is None else _sinks(learnable_sink, q)
    opts = _kvcache.options(softmax_scale, causal, (window_left, window_right), softcap,
                            0 if sinks is None else sinks.data_ptr(), attention_chunk, varlen)
    ctx.kvcache(opts, kv, _view(q, "q"), _view(k_cache, "k_cache"), _view(v_cache, "v_cache"),
                None if k is None else _view(k, "k"), None if v is None else _view(v, "v"), _view(out, "out"),
                lse.data_ptr())
    return out, lse


@torch.library.custom_op("flashattn::fwd_kvcache", mutates_args=("k_cache", "v_cache"))
def fwd_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor], v: Optional[Tensor],
                rotary_cos: Optional[Tensor], rotary_sin: Optional[Tensor], cache_seqlens: Optional[Tensor],
                cache_batch_idx: Optional[Tensor], block_table: Optional[Tensor], softmax_scale: float, causal: bool,
                window_left: int, window_right: int, softcap: float, rotary_interleaved: bool,
                num_splits: int, learnable_sink: Optional[Tensor] = None, attention_chunk: int = 0,
                cache_leftpad: Optional[Tensor] = None, cu_seqlens_q: Optional[Tensor] = None,
                cu_seqlens_k_new: Optional[Tensor] = None, max_seqlen_q: int = 0,
                k_descale: Optional[Tensor] = None, v_descale: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    return _run(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, block_table,
                softmax_scale, causal, window_left, window_right, softcap, rotary_interleaved, num_splits,
                learnable_sink, attention_chunk, cache_leftpad, cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q,
                k_descale, v_descale)


@fwd_kvcache.register_fake
def _(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, block_table, softmax_scale,
      causal, window_left, window_right, softcap, rotary_interleaved, num_splits, learnable_sink=None,
      attention_chunk=0, cache_leftpad=None, cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=0,
      k_descale=None, v_descale=None):
    return (q.new_empty(tuple(q.shape[:-1]) + (v_cache.shape[-1],)),
            q.new_empty(_lse_shape(q), dtype=torch.float32))


def kvcache(q, k_cache, v_cache, *args):
    """(out, lse) for torch tensors; args in fwd_kvcache's order after v_cache."""
    if _plain_eager(q, k_cache, v_cache):
        return _run(q, k_cache, v_cache, *args)
    return fwd_kvcache(q, k_cache, v_cache, *args)


def _merge_run(outs, lses):
    if not outs or len(outs) != len(lses):
        raise _kvcache.invalid(f"merge_states: expected as many lse as outs (1 or more), got {len(outs)} and {len(lses)}")
    o0 = outs[0]
    if o0.dim() != 4:
        raise _kvcache.invalid(f"outs[0]: expected a 4-d [batch, seqlen, heads, head_dim] tensor, got shape "
                               f"{tuple(o0.shape)}")
    ctx = _context(o0, [(f"outs[{i}]", t) for i, t in enumerate(outs)] + [(f"lses[{i}]", t) for i, t in
                                                                        enumerate(lses)])
    shape = (o0.shape[0], o0.shape[2], o0.shape[1])
    for i, t in enumerate(lses):
        if t.dtype != torch.float32 or not t.is_contiguous() or tuple(t.shape) != shape:
            raise _kvcache.invalid(f"lses[{i}]: expected a contiguous float32 {shape}, got {t.dtype} "
                                   f"{tuple(t.shape)}")
    out = torch.empty_like(o0, memory_format=torch.contiguous_format)
    lse = torch.empty(shape, dtype=torch.float32, device=o0.device)
    ctx.merge([_view(t, f"outs[{i}]") for i, t in enumerate(outs)], [t.data_ptr() for t in lses], _view(out, "out"),
              lse.data_ptr())
    return out, lse


@torch.library.custom_op("flashattn::merge_states", mutates_args=())
def merge_states(outs: List[Tensor], lses: List[Tensor]) -> Tuple[Tensor, Tensor]:
    return _merge_run(outs, lses)


@merge_states.register_fake
def _(outs, lses):
    o0 = outs[0]
    return (torch.empty_like(o0, memory_format=torch.contiguous_format),
            o0.new_empty((o0.shape[0], o0.shape[2], o0.shape[1]), dtype=torch.float32))


def merge(outs, lses):
    outs, lses = list(outs), list(lses)
    if outs and all(_plain_eager(t, t, t) for t in outs):
        return _merge_run(outs, lses)
    return merge_states(outs, lses)


def longest(seqlens):
    """The largest entry of a 1-d int32 cache_seqlens tensor, read on the host (a CUDA tensor's read waits for the
    stream, as flash-attn's check does); None when it cannot be read — while a CUDA graph is captured, where the
    kernels clamp and record instead — or is not such a tensor (the call's own checks name it)."""
    if not isinstance(seqlens, torch.Tensor) or seqlens.dim() != 1 or seqlens.dtype != torch.int32 or not len(seqlens):
        return None
    if seqlens.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    return int(seqlens.max())


def gather_pages(k_cache, v_cache, block_table):
    """A paged cache's pages as contiguous packed k, v [batch x max_pages x page_size, kv_heads, head_dim] with
    cu_seqlens_k (sequence b at b x capacity): the CUDA paged prefill's first version (interface._paged_prefill).
    Entries are clamped into the cache, so that a bad one reads a wrong page, never outside."""
    pages = block_table.long().clamp(0, k_cache.shape[0] - 1)
    b, cap = block_table.shape[0], block_table.shape[1] * k_cache.shape[1]
    k = k_cache[pages].reshape(b * cap, k_cache.shape[2], k_cache.shape[3])
    v = v_cache[pages].reshape(b * cap, v_cache.shape[2], v_cache.shape[3])
    cu = torch.arange(0, (b + 1) * cap, cap, dtype=torch.int32, device=k_cache.device)
    return k, v, cu


def full_seqlens(q, n, batch=None):
    """An int cache_seqlens as the int32 [batch] tensor the library reads, on q's device (batch: q's, or the packed
    call's)."""
    return torch.full((q.shape[0] if batch is None else batch,), n, dtype=torch.int32, device=q.device)
