"""PyTorch: two custom ops (flashattn::fwd, flashattn::bwd) with fake kernels and autograd, so the calls work under
autograd, torch.compile(fullgraph=True) and torch.library.opcheck; torch tensors reach the C library as views
(data_ptr and strides), never copied."""
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _capi

_DTYPES = {torch.float32: _capi.DTYPE_F32, torch.float16: _capi.DTYPE_F16, torch.bfloat16: _capi.DTYPE_BF16}
_FP8 = getattr(torch, "float8_e4m3fn", None)
if _FP8 is not None:
    _DTYPES[_FP8] = _capi.DTYPE_F8_E4M3


def _view(t, name):
    code = _DTYPES.get(t.dtype)
    if code is None:
        raise _capi.UnsupportedError(_capi.ERR_UNSUPPORTED, f"FA_ERR_UNSUPPORTED: {name}: dtype {t.dtype} is not "
                                     f"supported (float32, float16, bfloat16; float8_e4m3fn for a forward's q, k, "
                                     f"v); flashattn does not cast")
    if t.dim() == 4:
        return t.data_ptr(), code, t.shape, t.stride()
    if t.dim() == 3:  # varlen: [total, heads, head_dim] as one batch of `total` rows
        s = t.stride()
        return t.data_ptr(), code, (1,) + tuple(t.shape), (0,) + s
    raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, f"FA_ERR_INVALID_ARGUMENT: {name}: expected a 4-d "
                                     f"[batch, seqlen, heads, head_dim] tensor (3-d [total, heads, head_dim] for "
                                     f"varlen), got shape {tuple(t.shape)}")


def _context(q, tensors):
    dev = q.device
    for name, t in tensors:
        if t.device != dev:
            raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, f"FA_ERR_INVALID_ARGUMENT: {name} is on "
                                             f"{t.device}, q on {dev}: all tensors must be on one device")
    if dev.type == "cpu":
        return _capi.context(_capi.BACKEND_CPU, 0)
    if dev.type != "cuda":
        raise _capi.UnsupportedError(_capi.ERR_UNSUPPORTED, f"FA_ERR_UNSUPPORTED: device {dev}: flashattn runs on "
                                     f"the CPU and on CUDA")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    ctx = _capi.context(_capi.BACKEND_CUDA, index)
    ctx.set_stream(_raw_stream(index))
    return ctx


# the current stream's cudaStream_t without making a torch.cuda.Stream object (a few us a call)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda index: torch.cuda.current_stream(index).cuda_stream)


def _invalid(msg):
    return _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, "FA_ERR_INVALID_ARGUMENT: " + msg)


def _seqlens(cu, name, device):
    """cu_seqlens as contiguous int32 on the call's device: the C API reads them on the host for a CPU context and on
    the device for CUDA (a CPU tensor given to a CUDA call is copied up: not capturable)."""
    if cu.dtype != torch.int32 or cu.dim() != 1:
        raise _invalid(f"{name}: expected a 1-d int32 tensor, got {cu.dtype} of shape {tuple(cu.shape)}")
    if cu.device != device:
        cu = cu.to(device)
    return cu.contiguous()


def _bound(cu, given, name):
    """max_seqlen_q/k: the caller's, else the longest sequence of cu (a CUDA tensor's read waits for the stream and
    is not possible while a graph is captured)."""
    if given:
        return int(given)
    if cu.numel() < 2:
        return 0
    if cu.is_cuda and torch.cuda.is_current_stream_capturing():
        raise _invalid(f"max_seqlen_{name}: None while a CUDA graph is captured; pass the longest sequence's length "
                       f"(the library does not read cu_seqlens on the host)")
    return int((cu[1:] - cu[:-1]).max())


def _opts(cu_q, cu_k, device, opts):
    """_ext's options from opts (the 7 of _capi.options, then max_seqlen_q/k): the cu_seqlens addresses and n_seqs,
    then the bounds; and the tensors to keep alive for the call."""
    if (cu_q is None) != (cu_k is None):
        raise _invalid("cu_seqlens_q and cu_seqlens_k are given together or not at all")
    if cu_q is None:
        return opts[:7] + (0, 0, 0) + opts[7:], ()
    cu_q, cu_k = _seqlens(cu_q, "cu_seqlens_q", device), _seqlens(cu_k, "cu_seqlens_k", device)
    if cu_q.numel() != cu_k.numel() or cu_q.numel() < 1:
        raise _invalid(f"cu_seqlens_q has {cu_q.numel()} entries, cu_seqlens_k {cu_k.numel()}: expected n_seqs + 1 "
                       f"each")
    bounds = (_bound(cu_q, opts[7], "q"), _bound(cu_k, opts[8], "k"))
    return opts[:7] + (cu_q.data_ptr(), cu_k.data_ptr(), cu_q.numel() - 1) + bounds, (cu_q, cu_k)


def _used(t, name, n_seqs, device):
    """seqused_q/k (flash-attn's): int32 [n_seqs] on the call's device, contiguous; flashattn does not cast."""
    if t is None:
        return None
    if (not isinstance(t, Tensor) or t.dtype != torch.int32 or t.dim() != 1 or t.shape[0] != n_seqs
            or t.device != device):
        got = f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, Tensor) else type(t).__name__
        raise _invalid(f"{name}: expected an int32 [{n_seqs}] tensor (one per sequence of cu_seqlens) on {device}, "
                       f"got {got}; flashattn does not cast")
    return t.contiguous()


def _descale(t, name, q, k, batch):
    """q/k/v_descale (flash-attn's): float32 [batch, heads_k] on q's device, for float8_e4m3fn q, k, v."""
    if t is None:
        return None
    if q.dtype != _FP8 or _FP8 is None:
        raise _invalid(f"{name}: given with q of dtype {q.dtype}; descales go with float8_e4m3fn q, k, v")
    shape = (batch, k.shape[-2])
    if not isinstance(t, Tensor) or t.dtype != torch.float32 or tuple(t.shape) != shape or t.device != q.device:
        got = f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, Tensor) else type(t).__name__
        raise _invalid(f"{name}: expected a float32 {list(shape)} tensor ([batch, heads_k]) on {q.device}, got {got}; "
                       f"flashattn does not cast")
    return t.contiguous()


def _more(opts, keep, q, k, cu_q, sinks, d_sinks, more):
    """opts (with cu_seqlens and bounds) extended with the sinks, seqused_q/k, FP8 descales and attention_chunk:
    more = (seqused_q, seqused_k, attention_chunk, q_descale, k_descale, v_descale) or None. Returns (opts, keep)."""
    if more is None:
        if sinks is None:
            return opts, keep
        return opts + (sinks.data_ptr(), d_sinks.data_ptr() if d_sinks is not None else 0), keep + (sinks,)
    used_q, used_k, chunk, qd, kd, vd = more
    n_seqs = opts[9]
    if (used_q is not None or used_k is not None) and cu_q is None:
        raise _invalid("seqused_q/k: given without cu_seqlens (they give the used rows of a packed batch's sequences)")
    used = [_used(t, n, n_seqs, q.device) for t, n in ((used_q, "seqused_q"), (used_k, "seqused_k"))]
    batch = n_seqs if cu_q is not None else q.shape[0]
    scales = [_descale(t, n, q, k, batch) for t, n in ((qd, "q_descale"), (kd, "k_descale"), (vd, "v_descale"))]
    arrays = [sinks, d_sinks] + used + scales
    opts = opts + tuple(0 if t is None else t.data_ptr() for t in arrays) + (int(chunk or 0),)
    return opts, keep + tuple(t for t in arrays if t is not None)


def _out_dtype(q):
    """The output dtype: q's, or bfloat16 for FP8 inputs (flash-attn's)."""
    return torch.bfloat16 if _FP8 is not None and q.dtype == _FP8 else q.dtype


def _sinks(sinks, q):
    """learnable_sink as the C API reads it (opts.sinks): float32 [heads_q] on q's device; flashattn does not cast.
    Returns a contiguous tensor (the caller keeps it alive for the call)."""
    heads = q.shape[-2]
    if (not isinstance(sinks, Tensor) or sinks.dtype != torch.float32 or sinks.dim() != 1
            or sinks.shape[0] != heads or sinks.device != q.device):
        got = (f"{sinks.dtype} {tuple(sinks.shape)} on {sinks.device}" if isinstance(sinks, Tensor)
               else type(sinks).__name__)
        raise _invalid(f"learnable_sink: expected a float32 [{heads}] tensor (one per query head) on {q.device}, got "
                       f"{got}; flashattn does not cast")
    return sinks.contiguous()


def _out_shape(q, v):
    """out has q's rows and v's head_dim (which may differ from q's and k's: MLA's 192 / 128)."""
    return tuple(q.shape[:-1]) + (v.shape[-1],)


def _lse_shape(q):
    s = q.shape
    return (s[0], s[2], s[1]) if len(s) == 4 else (s[1], s[0])


def _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right, softcap, algo,
             deterministic, max_seqlen_q=0, max_seqlen_k=0, sinks=None, seqused_q=None, seqused_k=None,
             attention_chunk=0, q_descale=None, k_descale=None, v_descale=None):
    more = _pack_more(seqused_q, seqused_k, attention_chunk, q_descale, k_descale, v_descale)
    return _forward_call(q, k, v, cu_seqlens_q, cu_seqlens_k, (softmax_scale, causal, window_left, window_right,
                                                               softcap, algo, deterministic, max_seqlen_q,
                                                               max_seqlen_k), True, sinks, more)


def _pack_more(*more):
    """(seqused_q, seqused_k, attention_chunk, q_descale, k_descale, v_descale), or None when all are unset."""
    return None if all(t is None or (not isinstance(t, Tensor) and not t) for t in more) else more


def _forward_call(q, k, v, cu_seqlens_q, cu_seqlens_k, opts, need_lse=True, sinks=None, more=None):
    """(out, lse) with opts as _capi.options returns; need_lse False: lse None, not computed (the C API takes NULL:
    one allocation, ~2 us, less). sinks: learnable_sink or None; more: as _more takes it."""
    if q.is_cpu and k.is_cpu and v.is_cpu:
        ctx = _capi.context(_capi.BACKEND_CPU, 0)
    else:
        ctx = _context(q, (("k", k), ("v", v)))
    opts, keep = _opts(cu_seqlens_q, cu_seqlens_k, q.device, opts)
    if sinks is not None:
        sinks = _sinks(sinks, q)
    opts, keep = _more(opts, keep, q, k, cu_seqlens_q, sinks, None, more)
    views = _view(q, "q"), _view(k, "k"), _view(v, "v")
    out = torch.empty(_out_shape(q, v), dtype=_out_dtype(q), device=q.device)
    lse = q.new_empty(_lse_shape(q), dtype=torch.float32) if need_lse else None
    ctx.forward(opts, *views, _view(out, "out"), lse.data_ptr() if need_lse else 0)
    del keep
    return out, lse


@torch.library.custom_op("flashattn::fwd", mutates_args=())
def fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
        softmax_scale: float, causal: bool, window_left: int, window_right: int, softcap: float, algo: int,
        deterministic: bool, max_seqlen_q: int = 0, max_seqlen_k: int = 0, sinks: Optional[Tensor] = None,
        seqused_q: Optional[Tensor] = None, seqused_k: Optional[Tensor] = None, attention_chunk: int = 0,
        q_descale: Optional[Tensor] = None, k_descale: Optional[Tensor] = None,
        v_descale: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    return _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right, softcap,
                    algo, deterministic, max_seqlen_q, max_seqlen_k, sinks, seqused_q, seqused_k, attention_chunk,
                    q_descale, k_descale, v_descale)


@fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right, softcap, algo,
      deterministic, max_seqlen_q=0, max_seqlen_k=0, sinks=None, seqused_q=None, seqused_k=None, attention_chunk=0,
      q_descale=None, k_descale=None, v_descale=None):
    return (torch.empty(_out_shape(q, v), dtype=_out_dtype(q), device=q.device),
            q.new_empty(_lse_shape(q), dtype=torch.float32))


def _backward_call(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_seqlens_q: Optional[Tensor],
        cu_seqlens_k: Optional[Tensor], softmax_scale: float, causal: bool, window_left: int, window_right: int,
        softcap: float, algo: int, deterministic: bool, max_seqlen_q: int = 0, max_seqlen_k: int = 0,
        sinks: Optional[Tensor] = None, seqused_q: Optional[Tensor] = None, seqused_k: Optional[Tensor] = None,
        attention_chunk: int = 0) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, d_sinks); d_sinks is empty without sinks."""
    ctx = _context(q, (("k", k), ("v", v), ("out", out), ("lse", lse), ("dout", dout)))
    if lse.dtype != torch.float32 or not lse.is_contiguous() or tuple(lse.shape) != _lse_shape(q):
        raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, f"FA_ERR_INVALID_ARGUMENT: lse: expected the "
                                         f"forward's contiguous float32 {_lse_shape(q)}, got {lse.dtype} "
                                         f"{tuple(lse.shape)} strides {lse.stride()}")
    opts, keep = _opts(cu_seqlens_q, cu_seqlens_k, q.device, (softmax_scale, causal, window_left, window_right,
                                                              softcap, algo, deterministic, max_seqlen_q,
                                                              max_seqlen_k))
    if sinks is not None:  # opts.sinks and opts.d_sinks: the C backward writes the sinks' gradient
        sinks = _sinks(sinks, q)
        d_sinks = torch.empty(sinks.shape, dtype=torch.float32, device=q.device)
    else:
        d_sinks = None
    more = _pack_more(seqused_q, seqused_k, attention_chunk, None, None, None)
    opts, keep = _more(opts, keep, q, k, cu_seqlens_q, sinks, d_sinks, more)
    if d_sinks is None:
        d_sinks = q.new_empty((0,), dtype=torch.float32)
    views = [_view(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (dout, "dout"))]
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    ctx.backward(opts, *views[:4], lse.data_ptr(), views[4], _view(dq, "dq"), _view(dk, "dk"), _view(dv, "dv"))
    del keep
    return dq, dk, dv, d_sinks


bwd = torch.library.custom_op("flashattn::bwd", mutates_args=())(_backward_call)


@bwd.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right,
      softcap, algo, deterministic, max_seqlen_q=0, max_seqlen_k=0, sinks=None, seqused_q=None, seqused_k=None,
      attention_chunk=0):
    d_sinks = q.new_empty((0,) if sinks is None else sinks.shape, dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), d_sinks


# inputs: q, k, v, cu_seqlens_q, cu_seqlens_k, the 9 options (scale ... max_seqlen_k), sinks, seqused_q,
# seqused_k, attention_chunk, q_descale, k_descale, v_descale
_N_OPTS = 9
_N_MORE = 6


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k = inputs[:5]
    out, lse = output
    rest = tuple(inputs[5 + _N_OPTS:]) + (None,) * (1 + _N_MORE)
    sinks, used_q, used_k, chunk, q_descale = rest[:5]
    if q_descale is not None or (_FP8 is not None and q.dtype == _FP8):
        ctx.fp8 = True  # refused when the backward runs: FP8 is forward only
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, sinks, used_q, used_k)
    ctx.opts = inputs[5:5 + _N_OPTS]
    ctx.chunk = int(chunk or 0)
    ctx.mark_non_differentiable(lse)


def _gradients(ctx, dout, run_bwd):
    if getattr(ctx, "fp8", False):
        raise _capi.UnsupportedError(_capi.ERR_UNSUPPORTED, "FA_ERR_UNSUPPORTED: q: dtype float8_e4m3fn: FP8 inputs "
                                     "are forward only (flashattn has no FP8 backward)")
    q, k, v, out, lse, cu_q, cu_k, sinks, used_q, used_k = ctx.saved_tensors
    # The incoming gradient is autograd's tensor, not the caller's: an expanded one (out.sum()) has head_dim stride 0.
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    opts = list(ctx.opts)
    opts[5] = _capi.BACKWARD_ALGO.get(opts[5], opts[5])  # (scale, causal, wl, wr, softcap, algo, deterministic)
    dq, dk, dv, d_sinks = run_bwd(dout, q, k, v, out, lse, cu_q, cu_k, *opts, sinks, used_q, used_k, ctx.chunk)
    return (dq, dk, dv) + (None,) * (2 + len(ctx.opts)) + (None if sinks is None else d_sinks,) + (None,) * _N_MORE


def _backward(ctx, dout, dlse):
    return _gradients(ctx, dout, bwd)


fwd.register_autograd(_backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """The op's forward and backward without the dispatcher, for plain eager calls that autograd records: the custom
    op's autograd node costs ~60 us a call at tiny shapes (docs/python.md). Same saved tensors, same backward."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, *opts):
        out, lse = _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, *opts)
        _setup_context(ctx, (q, k, v, cu_seqlens_q, cu_seqlens_k) + opts, (out, lse))
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        return _gradients(ctx, dout, _backward_call)


def _untraced(q, k, v):
    """True when no compile or trace, tensor subclass, mode or functorch transform is active."""
    return (not torch.compiler.is_compiling() and type(q) is Tensor and type(k) is Tensor and type(v) is Tensor
            and not torch._C._is_torch_function_mode_enabled() and torch._C._len_torch_dispatch_stack() == 0
            and torch._C._functorch.peek_interpreter_stack() is None)


def _records_grad(q, k, v):
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def _plain_eager(q, k, v):
    """True when the op would only run its CPU/CUDA kernel: untraced and nothing for autograd to record. The
    dispatcher then adds ~12 us a call for nothing (docs/python.md)."""
    return _untraced(q, k, v) and not _records_grad(q, k, v)


def attention(q, k, v, cu_seqlens_q, cu_seqlens_k, opts, need_lse=True, sinks=None, more=None):
    """(out, lse) for torch tensors; opts as _capi.options returns, then max_seqlen_q/k; sinks: learnable_sink (a
    float32 [heads_q] tensor that receives its gradient) or None; more: None or (seqused_q, seqused_k,
    attention_chunk, q_descale, k_descale, v_descale). Untraced calls skip the dispatcher (with autograd recording,
    through _EagerAttention); traced ones go through the op. need_lse False: lse may be None."""
    if sinks is not None and not isinstance(sinks, Tensor):
        _sinks(sinks, q)  # raises, naming learnable_sink (the op's schema would raise a RuntimeError)
    if more is not None:
        for t, name in zip(more[:2] + more[3:], ("seqused_q", "seqused_k", "q_descale", "k_descale", "v_descale")):
            if t is not None and not isinstance(t, Tensor):
                raise _invalid(f"{name}: expected a torch tensor, got {type(t).__name__}")
    tail = (sinks,) + (tuple(more) if more is not None else ())
    if _untraced(q, k, v) and (sinks is None or type(sinks) is Tensor):
        if _records_grad(q, k, v) or (sinks is not None and torch.is_grad_enabled() and sinks.requires_grad):
            return _EagerAttention.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, *opts, *tail)
        return _forward_call(q, k, v, cu_seqlens_q, cu_seqlens_k, opts, need_lse, sinks, more)
    return fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, *opts, *tail)
