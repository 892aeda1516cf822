"""flash-attn's call signatures over flashattn: torch tensors (CPU or CUDA, with autograd and torch.compile) or
numpy arrays (CPU, forward; backward through flashattn.backward)."""
import sys

from . import _capi


_front = {}  # "torch" / "numpy": the front end's call, imported on first use (an import statement costs ~0.5 us)


def _attention(q):
    torch = sys.modules.get("torch")
    kind = "torch" if torch is not None and isinstance(q, torch.Tensor) else "numpy"
    fn = _front.get(kind)
    if fn is None:
        if kind == "torch":
            from ._torch import attention as fn
        else:
            from ._numpy import forward as fn
        _front[kind] = fn
    return fn


def _run(q, k, v, cu_seqlens_q, cu_seqlens_k, opts, return_lse):
    out, lse = _attention(q)(q, k, v, cu_seqlens_q, cu_seqlens_k, opts)
    return (out, lse) if return_lse else out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_lse=False, *, algo="auto"):
    """Attention over [batch, seqlen, heads, head_dim] q, k, v (k/v heads may divide q heads: GQA/MQA).

    softmax_scale None = 1/sqrt(head_dim); causal is bottom-right aligned; window_size (left, right), -1 unbounded;
    softcap 0 = off; algo "auto", "standard", "flash1", "flash2" or "flash3" (CUDA, Hopper; its backward is
    FLASH2's); deterministic applies to the backward.
    dropout_p and alibi_slopes exist for flash-attn's positional order and must stay 0.0 / None.
    Returns out [batch, seqlen_q, heads, head_dim], or (out, lse) with lse float32 [batch, heads, seqlen_q]
    (natural log; no gradient flows through it)."""
    opts = _capi.options(softmax_scale, causal, window_size, softcap, algo, deterministic, dropout_p, alibi_slopes)
    return _run(q, k, v, None, None, opts, return_lse)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_lse=False, *, algo="auto"):
    """Packed variable-length batches: q [total_q, heads, head_dim], k/v [total_k, kv_heads, head_dim]; sequence i
    owns rows cu_seqlens_q[i]:cu_seqlens_q[i+1] of q (int32, n_seqs + 1 entries; on CUDA they are copied to the host,
    which synchronises). max_seqlen_q/k are accepted for flash-attn's signature; the library reads the lengths from
    cu_seqlens. Returns out [total_q, heads, head_dim], or (out, lse) with lse float32 [heads, total_q]."""
    del max_seqlen_q, max_seqlen_k
    opts = _capi.options(softmax_scale, causal, window_size, softcap, algo, deterministic, dropout_p, alibi_slopes)
    return _run(q, k, v, cu_seqlens_q, cu_seqlens_k, opts, return_lse)


def backward(dout, q, k, v, out, lse, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
             deterministic=False, cu_seqlens_q=None, cu_seqlens_k=None, *, algo="auto"):
    """The gradients (dq, dk, dv) for numpy arrays: q, k, v, out, lse as given to / returned by the forward with the
    same options. (torch tensors get theirs from autograd.)"""
    from . import _numpy
    opts = _capi.options(softmax_scale, causal, window_size, softcap, algo, deterministic)
    return _numpy.backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, opts)


def last_stats(device="cpu"):
    """What this thread's last successful call on device ("cpu", "cuda", "cuda:1") did: a dict of fa_stats
    (kernel, algo, block sizes, FLOPs, slow-memory bytes), or None before the first call."""
    device = str(device)
    if device == "cpu":
        return _capi.context(_capi.BACKEND_CPU, 0).stats()
    index = int(device.split(":")[1]) if ":" in device else 0
    return _capi.context(_capi.BACKEND_CUDA, index).stats()
