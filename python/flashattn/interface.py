"""flash-attn's call signatures over flashattn: torch tensors (CPU or CUDA, with autograd and torch.compile) or
numpy arrays (CPU, forward; backward through flashattn.backward)."""
import sys

from . import _capi, _compat, _kvcache


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


def _more(seqused_q, seqused_k, attention_chunk, q_descale, k_descale, v_descale):
    """The arguments beyond FA2's as the front ends take them: None when none is set (the common call)."""
    if seqused_q is None and seqused_k is None and not attention_chunk and q_descale is None and k_descale is None \
            and v_descale is None:
        return None
    if isinstance(attention_chunk, bool) or int(attention_chunk) != attention_chunk or attention_chunk < 0:
        raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, f"FA_ERR_INVALID_ARGUMENT: attention_chunk="
                                         f"{attention_chunk!r}: expected an int >= 0 (0 = off)")
    return seqused_q, seqused_k, int(attention_chunk), q_descale, k_descale, v_descale


def _run(q, k, v, cu_seqlens_q, cu_seqlens_k, opts, return_lse, probs=False, sinks=None, more=None):
    front = _attention(q)
    if more is None:
        out, lse = front(q, k, v, cu_seqlens_q, cu_seqlens_k, opts, return_lse or probs, sinks)
    else:
        out, lse = front(q, k, v, cu_seqlens_q, cu_seqlens_k, opts, return_lse or probs, sinks, more)
    if probs:  # flash-attn's return_attn_probs: (out, lse, S_dmask); S_dmask exists only with dropout
        return out, lse, None
    return (out, lse) if return_lse else out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_lse=False, *, algo="auto", learnable_sink=None,
                    attention_chunk=0, q_descale=None, k_descale=None, v_descale=None, **extra):
    """Attention over [batch, seqlen, heads, head_dim] q, k, v (k/v heads may divide q heads: GQA/MQA); v may have a
    head_dim of its own (MLA's 192 / 128), which out then has.

    softmax_scale None = 1/sqrt(q's head_dim); causal is bottom-right aligned; window_size (left, right), -1 unbounded;
    softcap 0 = off; algo "auto", "standard", "flash1", "flash2" or "flash3" (CUDA, Hopper; its backward is
    the one "auto" picks: FLASH3's at head_dim 64, 128, 256 (varlen and seqused too), else FLASH2's);
    deterministic applies to the backward.
    dropout_p and alibi_slopes exist for flash-attn's positional order and must stay 0.0 / None.
    learnable_sink (FA4's name): None, or a float32 [heads] tensor/array on q's device, one logit per query head
    that joins every row's softmax denominator and attends to nothing (gpt-oss); a torch tensor that requires grad
    receives its gradient through autograd (docs/numerics.md, "Attention sinks").
    attention_chunk (FA3's, Llama 4's chunked local attention): 0 = off, n > 0 = a query sees only the keys of its
    own chunk of n positions (as its diagonal; combined with causal and the window).
    q_descale/k_descale/v_descale (FA3's): float32 [batch, heads_k] for float8_e4m3fn q, k, v (torch; None = 1); the
    output is bfloat16; forward only (docs/python.md, "FP8").
    Returns out [batch, seqlen_q, heads, v's head_dim], or (out, lse) with lse float32 [batch, heads, seqlen_q]
    (natural log, the sink included; no gradient flows through it). extra: flash-attn's other keywords
    (_compat.py)."""
    _, probs = _compat.extra("flash_attn_func", extra) if extra else (None, False)
    opts = _capi.options(softmax_scale, causal, window_size, softcap, algo, deterministic, dropout_p, alibi_slopes)
    more = _more(None, None, attention_chunk, q_descale, k_descale, v_descale)
    return _run(q, k, v, None, None, opts + (0, 0), return_lse, probs, learnable_sink, more)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_lse=False, *, algo="auto", learnable_sink=None, seqused_q=None,
                           seqused_k=None, attention_chunk=0, q_descale=None, k_descale=None, v_descale=None,
                           **extra):
    """Packed variable-length batches: q [total_q, heads, head_dim], k/v [total_k, kv_heads, head_dim]; sequence i
    owns rows cu_seqlens_q[i]:cu_seqlens_q[i+1] of q (int32, n_seqs + 1 entries, on q's device). max_seqlen_q/k
    bound the sequences' lengths, as flash-attn's: on CUDA the library never reads cu_seqlens on the host, so the call
    neither copies nor synchronises and can be captured in a CUDA graph (None: read from cu_seqlens, which
    synchronises and cannot be captured). seqused_q/seqused_k (flash-attn's): None, or int32 [n_seqs] on q's device:
    sequence i is its first seqused_q[i] query rows against its first seqused_k[i] keys, the rest of its spans is
    padding (out 0, lse -inf, zero gradients). learnable_sink, attention_chunk, the FP8 descales ([n_seqs,
    heads_k]) and v's own head_dim as flash_attn_func's. Returns out [total_q, heads, v's head_dim], or (out, lse)
    with lse float32 [heads, total_q]. extra: flash-attn's other keywords (_compat.py)."""
    block_table = None
    if extra:
        renamed, probs = _compat.extra("flash_attn_varlen_func", extra, accepted=_compat.HINTS + ("block_table",),
                                       renames={"page_table": "block_table"})
        block_table = extra.get("block_table", renamed.get("block_table"))
        if "block_table" in extra and "page_table" in extra:
            raise TypeError("flash_attn_varlen_func() got block_table and page_table (its FA3 name)")
    else:
        probs = False
    opts = _capi.options(softmax_scale, causal, window_size, softcap, algo, deterministic, dropout_p, alibi_slopes)
    if block_table is not None:
        return _paged_prefill(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, seqused_k, block_table,
                              softmax_scale, causal, window_size, softcap, attention_chunk, learnable_sink,
                              return_lse or probs, probs, (seqused_q, q_descale, k_descale, v_descale))
    hints = (int(max_seqlen_q or 0), int(max_seqlen_k or 0))
    more = _more(seqused_q, seqused_k, attention_chunk, q_descale, k_descale, v_descale)
    return _run(q, k, v, cu_seqlens_q, cu_seqlens_k, opts + hints, return_lse, probs, learnable_sink, more)


def _paged_prefill(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, seqused_k, block_table,
                   softmax_scale, causal, window_size, softcap, attention_chunk, learnable_sink, return_lse, probs,
                   refused):
    """flash_attn_varlen_func with block_table (FA3: page_table; vLLM's chunked prefill over a paged cache): k_cache,
    v_cache [num_pages, page_size, kv_heads, head_dim]; sequence i's keys are its first seqused_k[i] (else
    cu_seqlens_k[i+1] - cu_seqlens_k[i]) keys of its block-table row. It is the KV-cache path's call — packed queries
    against a paged cache, nothing appended (docs/python.md, "Paged prefill") — forward only. On CUDA, whose
    decoding kernel takes no packed queries yet, the pages are gathered into one contiguous copy first (torch
    indexing, capturable; block-table entries clamped into the cache) and the varlen forward runs on it with
    seqused_k."""
    for name, value in zip(("seqused_q", "q_descale", "k_descale", "v_descale"), refused):
        if value is not None:
            raise _capi.UnsupportedError(_capi.ERR_UNSUPPORTED, f"FA_ERR_UNSUPPORTED: flash_attn_varlen_func: {name} "
                                         f"with block_table (a paged cache) is not offered")
    if seqused_k is None:
        if cu_seqlens_k is None:
            raise _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, "FA_ERR_INVALID_ARGUMENT: block_table: give "
                                             "seqused_k or cu_seqlens_k (the keys of each sequence)")
        seqused_k = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(q, torch.Tensor) and q.is_cuda:
        from ._torch_kvcache import gather_pages
        k, v, cu_k = gather_pages(k_cache, v_cache, block_table)
        return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_k, max_seqlen_q, k.shape[0] // block_table.shape[0],
                                      softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                                      softcap=softcap, return_lse=return_lse, seqused_k=seqused_k.to(torch.int32),
                                      attention_chunk=attention_chunk, learnable_sink=learnable_sink)
    if torch is not None and isinstance(q, torch.Tensor):
        seqused_k = seqused_k.to(torch.int32).contiguous()
        if torch.is_grad_enabled() and q.requires_grad:
            raise _capi.UnsupportedError(_capi.ERR_UNSUPPORTED, "FA_ERR_UNSUPPORTED: flash_attn_varlen_func: "
                                         "block_table: the paged forward has no backward")
    else:
        import numpy as np
        seqused_k = np.ascontiguousarray(seqused_k, dtype=np.int32)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqused_k, block_table=block_table,
                                       softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                                       softcap=softcap, return_softmax_lse=True, learnable_sink=learnable_sink,
                                       attention_chunk=attention_chunk, cu_seqlens_q=cu_seqlens_q,
                                       max_seqlen_q=max_seqlen_q)
    if probs:
        return out, lse, None
    return (out, lse) if return_lse else out


def _kv_front(q, name):
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(q, torch.Tensor):
        from . import _torch_kvcache as front
    else:
        from . import _numpy_kvcache as front
    return getattr(front, name)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0, rotary_interleaved=True, num_splits=0,
                            return_softmax_lse=False, *, learnable_sink=None, attention_chunk=0, cache_leftpad=None,
                            cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, q_descale=None,
                            k_descale=None, v_descale=None, **extra):
    """Decoding against a KV cache, as flash-attn's: q [batch, seqlen_q, heads, head_dim]; k_cache/v_cache
    [batch_cache, seqlen_cache, kv_heads, head_dim], or paged [num_pages, page_size, kv_heads, head_dim] with
    block_table int32 [batch, max_pages]. k/v [batch, seqlen_new, kv_heads, head_dim], when given, are written into
    the cache in place at cache_seqlens (rotated first with rotary_cos/rotary_sin, float32 [seqlen_ro, rotary_dim /
    2]) and attended to; cache_seqlens (int32 [batch] or an int; None = the whole cache) is not advanced.
    cache_batch_idx int32 [batch] picks the cache row of each sequence. causal/window are bottom-right aligned over
    the keys after the append, and so is attention_chunk (FA3's: a query sees only the keys of its own chunk of
    attention_chunk positions; 0 = off). num_splits 0 = heuristic. learnable_sink: None or float32 [heads] on q's
    device (as flash_attn_func's; no gradient here). An FP8 cache (torch.float8_e4m3fn k_cache and v_cache, torch on
    the CPU; CUDA refuses it with the C library's reason) takes k_descale/v_descale, float32 [batch, kv_heads] (None =
    1): element x of sequence b, head h stands for x * descale[b, h]; new rows k/v (q's dtype) are quantised with it.
    q_descale is refused: decoding reads a 16/32-bit q.
    k/v may have a number of rows other than q's (speculative decoding, chunked prefill): row i of sequence b is key
    cache_seqlens[b] + i, and query row i sees the keys up to i + L - seqlen_q (L: the keys after the append).
    cache_leftpad int32 [batch]: sequence b's keys start at that cache position (the mask aligns to them).
    cu_seqlens_q (int32 [batch + 1], with max_seqlen_q) packs q [total_q, heads, head_dim] (out alike, lse [heads,
    total_q]); cu_seqlens_k_new packs k/v [total_new, kv_heads, head_dim]. These four run on the CPU (CUDA refuses
    them with a reason for now). v_cache (and v) may have a head_dim of their own, up to 512 against q/k's 576 (MLA
    decoding); out has it. Returns out, or (out, lse) with lse float32 [batch, heads, seqlen_q].
    Lengths past the capacity raise CacheIndexError (a ValueError and, as flash-attn's, a RuntimeError naming
    block_table): checked on the host for an int cache_seqlens, for a paged cache (reading the longest length, as
    flash-attn does; not while a CUDA graph is captured) and on the CPU; on CUDA otherwise the kernels clamp every
    index out of range and record it, and kvcache_check(device) raises it (docs/python.md).
    extra: FA3's other keywords (page_table is block_table; _compat.py)."""
    if q_descale is not None:
        raise _capi.UnsupportedError(_capi.ERR_UNSUPPORTED, "FA_ERR_UNSUPPORTED: flash_attn_with_kvcache: q_descale: "
                                     "decoding takes q as float32, float16 or bfloat16 (an FP8 cache's descales are "
                                     "k_descale and v_descale)")
    chunk = _more(None, None, attention_chunk, None, None, None)
    if extra:
        renamed, _ = _compat.extra("flash_attn_with_kvcache", extra, renames={"page_table": "block_table"})
        if "block_table" in renamed:
            if block_table is not None:
                raise TypeError("flash_attn_with_kvcache() got block_table and page_table (its FA3 name)")
            block_table = renamed["block_table"]
    if getattr(k_cache, "ndim", 0) == 4:
        # lengths past the capacity, from the shapes (flash-attn raises a RuntimeError naming block_table): host
        # lengths (None: every cache full) cost nothing; a paged cache's tensor is read as flash-attn reads it
        table = None if block_table is None else block_table.shape
        if cache_seqlens is None or isinstance(cache_seqlens, int):
            longest = _kvcache.capacity(k_cache.shape, table) if cache_seqlens is None else cache_seqlens
        else:
            longest = _kv_front(q, "longest")(cache_seqlens) if table is not None else None
        if longest is not None:
            _kvcache.check_capacity(longest, k.shape[1] if getattr(k, "ndim", 0) == 4 else 0, k_cache.shape, table)
    if isinstance(cache_seqlens, int):
        cu = cu_seqlens_q if cu_seqlens_q is not None else cu_seqlens_k_new
        cache_seqlens = _kv_front(q, "full_seqlens")(q, cache_seqlens, None if cu is None else cu.shape[0] - 1)
    left, right = window_size
    front = _kv_front(q, "kvcache")
    args = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, block_table,
            float(softmax_scale or 0.0), bool(causal), int(left), int(right), float(softcap), bool(rotary_interleaved),
            int(num_splits), learnable_sink, chunk[2] if chunk else 0)
    if cache_leftpad is None and cu_seqlens_q is None and cu_seqlens_k_new is None and k_descale is None \
            and v_descale is None:
        out, lse = front(*args)
    else:
        out, lse = front(*args, cache_leftpad, cu_seqlens_q, cu_seqlens_k_new, int(max_seqlen_q or 0), k_descale,
                         v_descale)
    return (out, lse) if return_softmax_lse else out


def kvcache_check(device="cuda"):
    """Raise CacheIndexError if a flash_attn_with_kvcache call on device ("cuda", "cuda:1") since the last check met
    a length, block-table entry or cache_batch_idx out of range, which the CUDA kernels clamp and record (no host
    synchronisation in the call); waits for this thread's stream of that device. The CPU checks before it runs."""
    device = str(device)
    if device == "cpu":
        return
    index = int(device.split(":")[1]) if ":" in device else 0
    _capi.context(_capi.BACKEND_CUDA, index).kvcache_check()


def merge_states(outs, lses):
    """Merge attention states of the same queries over disjoint key sets (fa_merge_states): outs n tensors/arrays
    [batch, seqlen, heads, head_dim] of one dtype, lses their float32 [batch, heads, seqlen] LSEs (1 <= n <= 32).
    Returns (out, lse) of the union of the key sets."""
    outs = list(outs)
    return _kv_front(outs[0] if outs else None, "merge")(outs, lses)


def backward(dout, q, k, v, out, lse, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
             deterministic=False, cu_seqlens_q=None, cu_seqlens_k=None, *, algo="auto", learnable_sink=None,
             seqused_q=None, seqused_k=None, attention_chunk=0):
    """The gradients (dq, dk, dv) for numpy arrays: q, k, v, out, lse as given to / returned by the forward with the
    same options; with learnable_sink, (dq, dk, dv, d_learnable_sink). (torch tensors get theirs from autograd.)"""
    from . import _numpy
    opts = _capi.options(softmax_scale, causal, window_size, softcap, algo, deterministic)
    more = _more(seqused_q, seqused_k, attention_chunk, None, None, None)
    return _numpy.backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, opts + (0, 0), learnable_sink, more)


def last_stats(device="cpu"):
    """What this thread's last successful call on device ("cpu", "cuda", "cuda:1") did: a dict of fa_stats
    (kernel, algo, block sizes, FLOPs, slow-memory bytes), or None before the first call."""
    device = str(device)
    if device == "cpu":
        return _capi.context(_capi.BACKEND_CPU, 0).stats()
    index = int(device.split(":")[1]) if ":" in device else 0
    return _capi.context(_capi.BACKEND_CUDA, index).stats()
