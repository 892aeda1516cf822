"""flashattn as PyTorch SDPA's flash backend (torch >= 2.11): after

    import flashattn.sdpa
    torch.nn.attention.activate_flash_attention_impl("flashattn")

every call that torch.nn.functional.scaled_dot_product_attention sends to its flash backend on CUDA (and the aten flash
ops under it: torch.nn.attention.varlen, nested tensors) runs flashattn's forward and backward. A call flashattn does
not do (dropout, ALiBi, a head_dim or GPU the library's plan refuses, ...) runs PyTorch's own flash kernel, which the
provider kept when it was activated, with a warning naming the reason once per reason; `fallbacks` counts them.
docs/python.md, "PyTorch SDPA provider", says what it covers."""
import collections
import warnings

import torch

from . import _capi
from ._torch import _context, _opts, _view

NAME = "flashattn"

# reason -> calls that ran PyTorch's kernel instead (since import)
fallbacks = collections.Counter()
# aten op -> calls flashattn ran (since import): counted here because autograd runs the backward on a thread of its
# own, whose flashattn.last_stats the caller's thread does not see
calls = collections.Counter()


class _Fallback(Exception):
    """A call flashattn does not do; the message is the reason."""


def _refuse(**args):
    """The first argument the library has no equivalent for, as a reason, or None."""
    for name, value in args.items():
        if name == "dropout_p" and value:
            return f"dropout_p={value}: flashattn has no dropout"
        if name == "return_debug_mask" and value:
            return "return_debug_mask=True: flashattn does not return the attention matrix"
        if name in ("alibi_slopes", "seqused_k", "block_table") and value is not None:
            return f"{name}: not offered by the SDPA provider"
        if name == "scale" and value is not None and value == 0.0:
            return "scale=0.0: flashattn reads 0 as 1/sqrt(head_dim)"
    return None


def _window(w):
    return -1 if w is None else int(w)


def _lse_shape(q, varlen):
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


def _forward(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, window_left, window_right, out):
    """flashattn's forward into out (q's shape, any strides): q/k/v [B, S, H, D] (or varlen [total, H, D] with
    cu_q/cu_k); returns the float32 LSE. Raises _Fallback for what the library's plan refuses."""
    if v.shape[-1] != q.shape[-1]:
        raise _Fallback(f"value head_dim {v.shape[-1]} differs from query's {q.shape[-1]}")
    try:
        ctx = _context(q, (("key", k), ("value", v)))
        opts, keep = _opts(cu_q, cu_k, q.device, (float(scale or 0.0), bool(causal), _window(window_left),
                                                  _window(window_right), 0.0, 0, False, int(max_q or 0),
                                                  int(max_k or 0)))
        lse = torch.empty(_lse_shape(q, cu_q is not None), dtype=torch.float32, device=q.device)
        ctx.forward(opts, _view(q, "query"), _view(k, "key"), _view(v, "value"), _view(out, "out"), lse.data_ptr())
    except (_capi.UnsupportedError, _capi.BackendUnavailableError) as e:
        raise _Fallback(str(e)) from None
    del keep
    return lse


def _backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, causal, window_left, window_right):
    """flashattn's gradients (dq, dk, dv shaped and strided as q, k, v); layouts as _forward's."""
    try:
        ctx = _context(q, (("key", k), ("value", v), ("out", out), ("logsumexp", lse), ("grad_out", dout)))
        if lse.dtype != torch.float32 or tuple(lse.shape) != _lse_shape(q, cu_q is not None):
            raise _Fallback(f"logsumexp {lse.dtype} {tuple(lse.shape)} is not the flash layout")
        lse = lse.contiguous()
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        opts, keep = _opts(cu_q, cu_k, q.device, (float(scale or 0.0), bool(causal), _window(window_left),
                                                  _window(window_right), 0.0, 0,
                                                  torch.are_deterministic_algorithms_enabled(), int(max_q or 0),
                                                  int(max_k or 0)))
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        views = [_view(t, n) for t, n in ((q, "query"), (k, "key"), (v, "value"), (out, "out"), (dout, "grad_out"),
                                          (dq, "grad_query"), (dk, "grad_key"), (dv, "grad_value"))]
        ctx.backward(opts, *views[:4], lse.data_ptr(), *views[4:])
    except (_capi.UnsupportedError, _capi.BackendUnavailableError) as e:
        raise _Fallback(str(e)) from None
    del keep
    return dq, dk, dv


def _aux(q):
    """rng_state, unused (philox offset) and debug_attn_mask as the flash ops return them without dropout."""
    return (torch.empty((2,), dtype=torch.uint64, device=q.device),
            torch.empty((), dtype=torch.uint64, device=q.device), torch.empty(0, dtype=q.dtype, device=q.device))


def _bshd(*tensors):
    return tuple(t.transpose(1, 2) for t in tensors)


# The kernels: each runs flashattn or returns None for the caller to fall back; arguments as the aten schemas.

def _sdpa_forward(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    reason = _refuse(dropout_p=dropout_p, return_debug_mask=return_debug_mask, scale=scale)
    if reason:
        raise _Fallback(reason)
    out = torch.empty_like(query)  # [B, H, S, D] in the query's memory order, as PyTorch's kernel and meta give
    q, k, v, o = _bshd(query, key, value, out)
    lse = _forward(q, k, v, None, None, 0, 0, scale, is_causal, None, None, o)
    return (out, lse, None, None, query.shape[2], key.shape[2]) + _aux(query)


def _sdpa_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                   is_causal, philox_seed, philox_offset, *, scale=None):
    reason = _refuse(dropout_p=dropout_p, scale=scale)
    if reason:
        raise _Fallback(reason)
    q, k, v, o, go = _bshd(query, key, value, out, grad_out)
    dq, dk, dv = _backward(go, q, k, v, o, logsumexp, None, None, 0, 0, scale, is_causal, None, None)
    return _bshd(dq, dk, dv)


def _flash_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask,
                   *, scale=None, window_size_left=None, window_size_right=None, seqused_k=None, alibi_slopes=None,
                   block_table=None, num_splits=None):
    reason = _refuse(dropout_p=dropout_p, return_debug_mask=return_debug_mask, scale=scale, alibi_slopes=alibi_slopes,
                     seqused_k=seqused_k, block_table=block_table)
    if reason:
        raise _Fallback(reason)
    out = torch.empty_like(query)
    lse = _forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, scale, is_causal, window_size_left,
                   window_size_right, out)  # num_splits: a hint
    return (out, lse) + _aux(query)


def _flash_forward_inplace(out, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                           return_debug_mask, *, scale=None, window_size_left=None, window_size_right=None,
                           seqused_k=None, alibi_slopes=None, block_table=None, num_splits=None):
    reason = _refuse(dropout_p=dropout_p, return_debug_mask=return_debug_mask, scale=scale, alibi_slopes=alibi_slopes,
                     seqused_k=seqused_k, block_table=block_table)
    if reason:
        raise _Fallback(reason)
    if out.shape != query.shape or out.dtype != query.dtype:
        raise _Fallback(f"out {out.dtype} {tuple(out.shape)} is not shaped as query")
    return _forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, scale, is_causal, window_size_left,
                    window_size_right, out)


def _flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                    is_causal, rng_state, unused, *, scale=None, window_size_left=None, window_size_right=None):
    reason = _refuse(dropout_p=dropout_p, scale=scale)
    if reason:
        raise _Fallback(reason)
    if cum_seq_q is not None and cum_seq_q.numel() == 0:  # the dense path passes empty tensors, not None
        cum_seq_q = cum_seq_k = None
    return _backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, scale,
                     is_causal, window_size_left, window_size_right)


KERNELS = {"_scaled_dot_product_flash_attention": _sdpa_forward,
           "_scaled_dot_product_flash_attention_backward": _sdpa_backward,
           "_flash_attention_forward": _flash_forward,
           "_flash_attention_forward_no_dropout_inplace": _flash_forward_inplace,
           "_flash_attention_backward": _flash_backward}


def _kernel(op, fn, original):
    def run(keyset, *args, **kwargs):
        try:
            result = fn(*args, **kwargs)
            calls[op] += 1
            return result
        except _Fallback as e:
            reason = str(e)
        fallbacks[reason] += 1
        if original is None:
            raise _capi.UnsupportedError(_capi.ERR_UNSUPPORTED, f"FA_ERR_UNSUPPORTED: aten::{op}: {reason}, and "
                                         f"PyTorch has no kernel of its own to fall back to")
        warnings.warn(f"flashattn SDPA provider: aten::{op} runs PyTorch's kernel: {reason}", stacklevel=2)
        return original.call_boxed(keyset, *args, **kwargs)
    run.__name__ = f"flashattn_{op}"
    return run


class Handle:
    """What activation returns to torch's registry: remove() puts PyTorch's kernels back."""

    def __init__(self, library):
        self.library = library

    def remove(self):
        if self.library is not None:
            self.library._destroy()
            self.library = None


def register(dispatch_key="CUDA"):
    """Put flashattn's kernels in place of PyTorch's flash kernels for dispatch_key (the registry's activation calls
    this with "CUDA"; the tests also use "CPU", where PyTorch has none). Returns the Handle that undoes it."""
    lib = torch.library.Library("aten", "IMPL")
    for op, fn in KERNELS.items():
        if not hasattr(torch.ops.aten, op):  # an op this torch does not have (e.g. the in-place forward before 2.15)
            continue
        try:
            original = torch.library.get_kernel(f"aten::{op}", dispatch_key)
        except RuntimeError:  # no kernel for that key
            original = None
        lib.impl(op, _kernel(op, fn, original), dispatch_key, with_keyset=True, allow_override=True)
    return Handle(lib)


def available():
    """True when this torch has the flash-attention registry (torch >= 2.11)."""
    try:
        import torch.nn.attention
    except ImportError:  # torch before 2.2 has no torch.nn.attention
        return False
    return hasattr(torch.nn.attention, "register_flash_attention_impl")


def activate():
    """torch.nn.attention.activate_flash_attention_impl("flashattn"), with a clear error before torch 2.11."""
    if not available():
        raise _capi.UnsupportedError(_capi.ERR_UNSUPPORTED, f"FA_ERR_UNSUPPORTED: the SDPA provider needs "
                                     f"torch.nn.attention.register_flash_attention_impl (torch >= 2.11); this is "
                                     f"torch {torch.__version__}")
    torch.nn.attention.activate_flash_attention_impl(NAME)


if available():
    torch.nn.attention.register_flash_attention_impl(NAME, register_fn=register)
