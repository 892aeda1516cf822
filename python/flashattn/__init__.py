"""flashattn: exact attention (standard, FlashAttention-1, FlashAttention-2) from Python; docs/python.md is the guide.

torch is imported only when the caller has imported it (numpy users never load it); torch.ops.flashattn.fwd, bwd,
fwd_kvcache and merge_states exist once flashattn is imported after torch, or after the first call with torch
tensors; the SDPA provider "flashattn" (flashattn.sdpa) is registered with torch once flashattn.sdpa is imported,
which importing flashattn after torch does."""
import sys
from ._capi import (BackendUnavailableError, CacheIndexError, DeviceError, FlashAttnError, InternalError,
                    InvalidArgumentError, OutOfMemoryError, UnsupportedError, version)
from .interface import (backward, flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache, kvcache_check,
                        last_stats, merge_states)
from .packed import (flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_kvpacked_func,
                     flash_attn_varlen_qkvpacked_func)

__version__ = version().split()[0]

if "torch" in sys.modules:
    from . import _torch, _torch_kvcache, sdpa  # noqa: F401  (register torch.ops.flashattn and the SDPA provider)

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "kvcache_check", "merge_states",
           "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func", "backward", "last_stats", "version", "FlashAttnError", "InvalidArgumentError", "CacheIndexError",
           "UnsupportedError", "OutOfMemoryError", "BackendUnavailableError", "DeviceError", "InternalError"]
