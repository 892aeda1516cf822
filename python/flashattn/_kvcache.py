"""flash_attn_with_kvcache's argument rules shared by the torch and numpy front ends (docs/python.md)."""
from . import _capi


def invalid(msg):
    return _capi.InvalidArgumentError(_capi.ERR_INVALID_ARGUMENT, "FA_ERR_INVALID_ARGUMENT: " + msg)


def cache_index(msg):
    return _capi.CacheIndexError(_capi.ERR_INVALID_ARGUMENT, "FA_ERR_INVALID_ARGUMENT: " + msg)


def capacity(k_cache_shape, block_table_shape):
    """Keys per sequence: the cache's seqlen, or a paged cache's max_pages x page_size."""
    return int(k_cache_shape[1]) * (1 if block_table_shape is None else int(block_table_shape[1]))


def check_capacity(longest, seqlen_new, k_cache_shape, block_table_shape):
    """The host's check of the cache lengths against the capacity, from the shapes (flash-attn's: a RuntimeError
    naming block_table); longest: the largest cache_seqlens entry."""
    if block_table_shape is not None:
        pages, page = int(block_table_shape[1]), int(k_cache_shape[1])
        if longest + seqlen_new > pages * page:
            raise cache_index(f"block_table: cache_seqlens up to {longest} plus {seqlen_new} new keys exceed the "
                              f"capacity of its {pages} pages of {page} keys ({pages * page}); give block_table more "
                              f"columns")
    elif longest + seqlen_new > int(k_cache_shape[1]):
        raise cache_index(f"k_cache: cache_seqlens up to {longest} plus {seqlen_new} new keys exceed its seqlen "
                          f"{int(k_cache_shape[1])}")


def unsupported(msg):
    return _capi.UnsupportedError(_capi.ERR_UNSUPPORTED, "FA_ERR_UNSUPPORTED: " + msg)


def check_pairs(k, v, rotary_cos, rotary_sin):
    """k/v and the rotary tables come in pairs. (Query rows rotate where flash-attn's do: the library follows it,
    docs/kvcache.md "Rotary".)"""
    if (k is None) != (v is None):
        raise invalid("k and v are given together or not at all")
    if (rotary_cos is None) != (rotary_sin is None):
        raise invalid("rotary_cos and rotary_sin are given together or not at all")


def options(softmax_scale, causal, window_size, softcap, sinks=0, chunk=0, varlen=(0, 0, 0, 0)):
    """fa_attn_opts as _ext takes it (algo auto); sinks: learnable_sink's address, 0 = none; chunk: attention_chunk
    (0 = off); varlen: (cu_seqlens_q, cu_seqlens_k_new addresses, n_seqs, max_seqlen_q), zeros = none."""
    cu_q, cu_new, n_seqs, max_q = varlen
    opts = _capi.options(softmax_scale, causal, window_size, softcap, 0, False) + (cu_q, cu_new, n_seqs)
    if chunk:
        return opts + (max_q, 0, sinks, 0, 0, 0, 0, 0, 0, int(chunk))
    return opts + (max_q, 0, sinks, 0) if sinks or max_q else opts


def check_index(ok, shape, name, ndim, batch=None):
    """An int32 index array: ok says dtype int32, the device of q and a unit last stride."""
    if not ok or len(shape) != ndim:
        raise invalid(f"{name}: expected a {ndim}-d int32 array on q's device with contiguous rows, got shape "
                      f"{tuple(shape)}; flashattn does not cast")
    if batch is not None and shape[0] != batch:
        raise invalid(f"{name}: expected {batch} entries (one per sequence of q), got {shape[0]}")


def check_rotary(cos_shape, sin_shape, ok, head_dim):
    """(rotary_seqlen, rotary_dim) of float32 [rotary_seqlen, rotary_dim / 2] tables."""
    if not ok or len(cos_shape) != 2 or tuple(cos_shape) != tuple(sin_shape):
        raise invalid(f"rotary_cos/rotary_sin: expected two contiguous float32 [seqlen_ro, rotary_dim / 2] tables of "
                      f"one shape, got {tuple(cos_shape)} and {tuple(sin_shape)}; flashattn does not cast")
    return int(cos_shape[0]), 2 * int(cos_shape[1])
