"""flashattn: exact attention (standard, FlashAttention-1, FlashAttention-2) from Python; docs/python.md is the guide.

torch is imported only when the caller has imported it (numpy users never load it); torch.ops.flashattn.fwd/bwd
exist once flashattn._torch is imported, which the first call with torch tensors does too."""
import sys
from ._capi import (BackendUnavailableError, DeviceError, FlashAttnError, InternalError, InvalidArgumentError,
                    OutOfMemoryError, UnsupportedError, version)
from .interface import backward, flash_attn_func, flash_attn_varlen_func, last_stats

__version__ = version().split()[0]

if "torch" in sys.modules:
    from . import _torch  # noqa: F401  (registers torch.ops.flashattn)

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "backward", "last_stats", "version", "FlashAttnError",
           "InvalidArgumentError", "UnsupportedError", "OutOfMemoryError", "BackendUnavailableError", "DeviceError",
           "InternalError"]
