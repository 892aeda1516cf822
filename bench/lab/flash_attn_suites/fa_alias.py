"""flash-attn's module names over flashattn, to run flash-attention's own test suites against the binding.

A pytest plugin (`-p fa_alias`, with this folder on PYTHONPATH) that, before the suites are collected, puts in
sys.modules:
  flash_attn                        flashattn's FA2-style calls; its __path__ is the sdist's flash_attn folder, so the
                                    pure-Python helpers the suite imports (bert_padding, layers.rotary) are the sdist's
  flash_attn.flash_attn_interface   the same calls, and _get_block_size_n (the suite's dropout-mask helper)
  flash_attn_interface              FA3's hopper interface: its signatures (softmax_scale 4th, qv, descales, ...)
FLASH_ATTN_SRC names the unpacked sdist (README.md here). Every argument flashattn does not have is refused by
flashattn itself before any call (UnsupportedError), so a refusal is a failure whose message names the argument;
count.py tells refusals from wrong results."""
import os
import sys
import types

import flashattn

_SRC = os.environ.get("FLASH_ATTN_SRC", "")


def _fa2_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
              alibi_slopes=None, deterministic=False, return_attn_probs=False):
    return flashattn.flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, tuple(window_size), softcap,
                                     alibi_slopes, deterministic, return_attn_probs=return_attn_probs)


def _fa2_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                return_attn_probs=False, block_table=None):
    return flashattn.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                            dropout_p, softmax_scale, causal, tuple(window_size), softcap,
                                            alibi_slopes, deterministic, return_attn_probs=return_attn_probs,
                                            block_table=block_table)


def _fa2_qkvpacked(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                   alibi_slopes=None, deterministic=False, return_attn_probs=False):
    return flashattn.flash_attn_qkvpacked_func(qkv, dropout_p, softmax_scale, causal, tuple(window_size), softcap,
                                               alibi_slopes, deterministic, return_attn_probs=return_attn_probs)


def _fa2_kvpacked(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                  alibi_slopes=None, deterministic=False, return_attn_probs=False):
    return flashattn.flash_attn_kvpacked_func(q, kv, dropout_p, softmax_scale, causal, tuple(window_size), softcap,
                                              alibi_slopes, deterministic, return_attn_probs=return_attn_probs)


def _fa2_varlen_qkvpacked(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                          window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                          return_attn_probs=False):
    return flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p, softmax_scale, causal,
                                                      tuple(window_size), softcap, alibi_slopes, deterministic,
                                                      return_attn_probs=return_attn_probs)


def _fa2_varlen_kvpacked(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                         softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                         deterministic=False, return_attn_probs=False):
    return flashattn.flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                     dropout_p, softmax_scale, causal, tuple(window_size), softcap,
                                                     alibi_slopes, deterministic,
                                                     return_attn_probs=return_attn_probs)


def _fa2_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                 cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None, causal=False,
                 window_size=(-1, -1), softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                 return_softmax_lse=False):
    return flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                             cache_batch_idx, block_table, softmax_scale, causal, tuple(window_size),
                                             softcap, rotary_interleaved, num_splits, return_softmax_lse,
                                             cache_leftpad=cache_leftpad, alibi_slopes=alibi_slopes)


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """The suite converts dropout masks with it; flashattn has no dropout, so any block size will do."""
    return 128


def _fa3_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None, v_descale=None,
              window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False,
              sm_margin=0, return_attn_probs=False):
    out = flashattn.flash_attn_func(q, k, v, 0.0, softmax_scale, causal, tuple(window_size), softcap, None,
                                    deterministic, return_attn_probs, qv=qv, q_descale=q_descale,
                                    k_descale=k_descale, v_descale=v_descale, attention_chunk=attention_chunk,
                                    num_splits=num_splits, pack_gqa=pack_gqa, sm_margin=sm_margin)
    return out


def _fa3_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None, seqused_k=None,
                softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None, v_descale=None,
                window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1, pack_gqa=None,
                deterministic=False, sm_margin=0, return_attn_probs=False):
    return flashattn.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, 0.0,
                                            softmax_scale, causal, tuple(window_size), softcap, None, deterministic,
                                            return_attn_probs, seqused_q=seqused_q, seqused_k=seqused_k, qv=qv,
                                            q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                                            attention_chunk=attention_chunk, num_splits=num_splits,
                                            pack_gqa=pack_gqa, sm_margin=sm_margin)


def _fa3_qkvpacked(qkv, softmax_scale=None, causal=False, q_descale=None, k_descale=None, v_descale=None,
                   window_size=(-1, -1), attention_chunk=0, softcap=0.0, deterministic=False, num_heads_q=None,
                   sm_margin=0):
    return flashattn.flash_attn_qkvpacked_func(qkv, 0.0, softmax_scale, causal, tuple(window_size), softcap, None,
                                               deterministic, num_heads_q=num_heads_q, q_descale=q_descale,
                                               k_descale=k_descale, v_descale=v_descale,
                                               attention_chunk=attention_chunk, sm_margin=sm_margin)


def _fa3_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                 cache_batch_idx=None, cache_leftpad=None, page_table=None, cu_seqlens_q=None, cu_seqlens_k_new=None,
                 max_seqlen_q=None, rotary_seqlens=None, q_descale=None, k_descale=None, v_descale=None,
                 softmax_scale=None, causal=False, window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                 rotary_interleaved=True, scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0,
                 return_softmax_lse=False):
    return flashattn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, None, softmax_scale,
        causal, tuple(window_size), softcap, rotary_interleaved, num_splits, return_softmax_lse, qv=qv,
        cache_leftpad=cache_leftpad, page_table=page_table, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k_new=cu_seqlens_k_new, max_seqlen_q=max_seqlen_q, rotary_seqlens=rotary_seqlens,
        q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, attention_chunk=attention_chunk,
        scheduler_metadata=scheduler_metadata, pack_gqa=pack_gqa, sm_margin=sm_margin)


def _fa3_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """FA3's combine of num_splits partial states, out_partial [splits, ..., seqlen, heads, d] fp32 and lse_partial
    [splits, ..., seqlen, heads], through flashattn.merge_states (lses as [batch, heads, seqlen])."""
    if out is not None:
        raise flashattn.UnsupportedError(2, "FA_ERR_UNSUPPORTED: flash_attn_combine: out= is not offered")
    squeeze = out_partial.dim() == 4  # varlen: [splits, total, heads, d]
    if squeeze:
        out_partial, lse_partial = out_partial.unsqueeze(1), lse_partial.unsqueeze(1)
    outs = list(out_partial.unbind(0))
    lses = [l.transpose(1, 2).contiguous() for l in lse_partial.unbind(0)]
    o, lse = flashattn.merge_states(outs, lses)
    o, lse = o.to(out_dtype or out_partial.dtype), lse.transpose(1, 2)
    return (o[0], lse[0]) if squeeze else (o, lse)


def _module(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    return m


FA2 = dict(flash_attn_func=_fa2_func, flash_attn_varlen_func=_fa2_varlen, flash_attn_qkvpacked_func=_fa2_qkvpacked,
           flash_attn_kvpacked_func=_fa2_kvpacked, flash_attn_varlen_qkvpacked_func=_fa2_varlen_qkvpacked,
           flash_attn_varlen_kvpacked_func=_fa2_varlen_kvpacked, flash_attn_with_kvcache=_fa2_kvcache)
FA3 = dict(flash_attn_func=_fa3_func, flash_attn_varlen_func=_fa3_varlen, flash_attn_qkvpacked_func=_fa3_qkvpacked,
           flash_attn_with_kvcache=_fa3_kvcache, flash_attn_combine=_fa3_combine,
           get_scheduler_metadata=lambda *args, **kwargs: None)


def install():
    """Put the three modules in sys.modules (idempotent)."""
    if getattr(sys.modules.get("flash_attn"), "__flashattn_alias__", False):
        return
    interface = _module("flash_attn.flash_attn_interface", _get_block_size_n=_get_block_size_n, **FA2)
    pkg = _module("flash_attn", flash_attn_interface=interface, __version__="2.8.3", __flashattn_alias__=True, **FA2)
    pkg.__path__ = [os.path.join(_SRC, "flash_attn")] if _SRC else []
    sys.modules.update({"flash_attn": pkg, "flash_attn.flash_attn_interface": interface,
                        "flash_attn_interface": _module("flash_attn_interface", **FA3)})
    if _SRC:  # the hopper suite imports its helpers (padding, test_util) as top-level modules
        sys.path.insert(0, os.path.join(_SRC, "hopper"))


def _pretend_hopper():
    """On a machine without a GPU: the suites read the device's capability when imported; answer as an H100 would,
    so that collection can be checked there (every test then needs CUDA and fails or skips)."""
    import torch
    if torch.cuda.is_available():
        return
    props = types.SimpleNamespace(major=9, minor=0, name="no GPU (fa_alias)", multi_processor_count=132,
                                  total_memory=80 << 30)
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    torch.cuda.get_device_properties = lambda device=None: props


def pytest_configure(config):
    install()
    _pretend_hopper()



def pytest_collection_modifyitems(config, items):
    """FA_SUITE_SAMPLE=N (with FA_SUITE_SEED, default 0): run a seeded sample of N of the collected cases, in their
    collected order, and deselect the rest (the suites hold hundreds of thousands)."""
    n = int(os.environ.get("FA_SUITE_SAMPLE", "0"))
    if n <= 0 or n >= len(items):
        return
    import random
    keep = set(random.Random(int(os.environ.get("FA_SUITE_SEED", "0"))).sample(range(len(items)), n))
    config.hook.pytest_deselected(items=[it for i, it in enumerate(items) if i not in keep])
    items[:] = [it for i, it in enumerate(items) if i in keep]
