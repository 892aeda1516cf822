"""flashattn: exact attention (standard, FlashAttention-1, FlashAttention-2) from Python. docs/python.md is the guide."""
from ._capi import (BackendUnavailableError, DeviceError, FlashAttnError, InternalError, InvalidArgumentError,
                    OutOfMemoryError, UnsupportedError, version)
from .interface import backward, flash_attn_func, flash_attn_varlen_func, last_stats

__version__ = version().split()[0]

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "backward", "last_stats", "version", "FlashAttnError",
           "InvalidArgumentError", "UnsupportedError", "OutOfMemoryError", "BackendUnavailableError", "DeviceError",
           "InternalError"]
