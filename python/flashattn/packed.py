"""flash-attn's packed calls: q, k, v (or k, v) stacked in one tensor. Each is the unpacked call on views of the
packed tensor, so nothing is copied on the way in, and autograd puts the gradients into the packed tensor's slots
(torch); numpy arrays get the forward as the unpacked calls do."""
from . import _capi
from .interface import flash_attn_func, flash_attn_varlen_func


def _packed(t, name, ndim, axis, n, layout):
    """t's n slots along axis, as views; an InvalidArgumentError naming t when it is not shaped as layout."""
    shape = tuple(getattr(t, "shape", ()))
    if len(shape) != ndim or shape[axis] != n:
        raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, f"FA_ERR_INVALID_ARGUMENT: {name}: expected "
                                         f"{layout}, got shape {shape}")
    index = (slice(None),) * axis
    return tuple(t[index + (i,)] for i in range(n))


def _heads_split(qkv, num_heads_q, ndim):
    """FA3's qkvpacked GQA layout: [..., heads_q + 2 * heads_k, head_dim], split after num_heads_q heads."""
    shape = tuple(getattr(qkv, "shape", ()))
    hk2 = shape[-2] - num_heads_q if len(shape) == ndim else -1
    if len(shape) != ndim or num_heads_q < 1 or hk2 < 2 or hk2 % 2:
        raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, f"FA_ERR_INVALID_ARGUMENT: qkv: with "
                                         f"num_heads_q={num_heads_q} expected {ndim} dimensions [..., num_heads_q + 2 "
                                         f"* kv_heads, head_dim], got shape {shape}")
    hk, index = hk2 // 2, (slice(None),) * (ndim - 2)
    return (qkv[index + (slice(0, num_heads_q),)], qkv[index + (slice(num_heads_q, num_heads_q + hk),)],
            qkv[index + (slice(num_heads_q + hk, None),)])


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_lse=False, *, algo="auto",
                              num_heads_q=None, **extra):
    """flash_attn_func on qkv [batch, seqlen, 3, heads, head_dim] (FA3's num_heads_q=n: [batch, seqlen,
    n + 2 * kv_heads, head_dim]); gradients land in qkv."""
    if num_heads_q is None:
        q, k, v = _packed(qkv, "qkv", 5, 2, 3, "[batch, seqlen, 3, heads, head_dim]")
    else:
        q, k, v = _heads_split(qkv, int(num_heads_q), 4)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_lse, algo=algo, **extra)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_lse=False, *, algo="auto",
                             **extra):
    """flash_attn_func on q [batch, seqlen_q, heads, head_dim] and kv [batch, seqlen_k, 2, kv_heads, head_dim];
    gradients land in kv."""
    k, v = _packed(kv, "kv", 5, 2, 2, "[batch, seqlen_k, 2, kv_heads, head_dim]")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_lse, algo=algo, **extra)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen=None, dropout_p=0.0, softmax_scale=None,
                                     causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                     deterministic=False, return_lse=False, *, algo="auto", num_heads_q=None,
                                     **extra):
    """flash_attn_varlen_func on qkv [total, 3, heads, head_dim] (num_heads_q=n: [total, n + 2 * kv_heads,
    head_dim]) with one cu_seqlens for queries and keys; gradients land in qkv."""
    if num_heads_q is None:
        q, k, v = _packed(qkv, "qkv", 4, 1, 3, "[total, 3, heads, head_dim]")
    else:
        q, k, v = _heads_split(qkv, int(num_heads_q), 3)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, deterministic, return_lse, algo=algo,
                                  **extra)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                                    dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                                    softcap=0.0, alibi_slopes=None, deterministic=False, return_lse=False, *,
                                    algo="auto", **extra):
    """flash_attn_varlen_func on q [total_q, heads, head_dim] and kv [total_k, 2, kv_heads, head_dim]; gradients
    land in kv."""
    k, v = _packed(kv, "kv", 4, 1, 2, "[total_k, 2, kv_heads, head_dim]")
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_lse, algo=algo, **extra)
