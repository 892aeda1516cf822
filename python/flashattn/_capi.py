"""The C library through ctypes (contexts, errors, stats) and _ext (the forward and backward calls): statuses as
exceptions, one context per thread and device. docs/python.md says why this split and what a call costs."""
import ctypes
import os
import threading

from . import _ext

_HERE = os.path.dirname(os.path.abspath(__file__))
_LIB_PATH = os.environ.get("FLASHATTN_LIBRARY", os.path.join(_HERE, "libflashattn.so"))
lib = ctypes.CDLL(_LIB_PATH)

# fa_status values are pinned by the header.
(OK, ERR_INVALID_ARGUMENT, ERR_UNSUPPORTED, ERR_OUT_OF_MEMORY, ERR_BACKEND_UNAVAILABLE, ERR_DEVICE,
 ERR_INTERNAL) = range(7)
DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_F8_E4M3 = 0, 1, 2, 3
BACKEND_CPU, BACKEND_CUDA = 0, 1
ALGOS = {"auto": 0, "standard": 1, "flash1": 2, "flash2": 3, "flash3": 4}
# "flash3": the backward AUTO picks from the same out and LSE (FLASH3's at head_dim 64, 128, 256, varlen and seqused
# too, else FLASH2's)
BACKWARD_ALGO = {4: 0}


class FaStats(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_int), ("algo", ctypes.c_int), ("is_backward", ctypes.c_int),
                ("kernel", ctypes.c_char_p), ("block_q", ctypes.c_int), ("block_k", ctypes.c_int),
                ("threads", ctypes.c_int), ("flops", ctypes.c_double), ("slow_read_bytes", ctypes.c_int64),
                ("slow_write_bytes", ctypes.c_int64), ("extra_bytes", ctypes.c_int64)]


_P = ctypes.c_void_p
_proto = {
    "fa_version_string": (ctypes.c_char_p, []),
    "fa_status_string": (ctypes.c_char_p, [ctypes.c_int]),
    "fa_backend_available": (ctypes.c_int, [ctypes.c_int]),
    "fa_context_create": (ctypes.c_int, [ctypes.POINTER(_P), ctypes.c_int, ctypes.c_int]),
    "fa_create_error": (ctypes.c_char_p, []),
    "fa_context_destroy": (None, [_P]),
    "fa_context_last_error": (ctypes.c_char_p, [_P]),
    "fa_context_set_stream": (ctypes.c_int, [_P, _P]),
    "fa_attn_opts_init": (ctypes.c_int, [_P, ctypes.c_size_t]),
    "fa_forward": (ctypes.c_int, [_P] * 7),
    "fa_backward": (ctypes.c_int, [_P] * 11),
    "fa_last_stats": (ctypes.c_int, [_P, ctypes.POINTER(FaStats)]),
    "fa_kvcache_check": (ctypes.c_int, [_P]),
}
for _name, (_res, _args) in _proto.items():
    _fn = getattr(lib, _name)
    _fn.restype, _fn.argtypes = _res, _args


class FlashAttnError(Exception):
    """A failed flashattn call: .status is the fa_status value, the message is the library's."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class InvalidArgumentError(FlashAttnError, ValueError):
    pass


class CacheIndexError(InvalidArgumentError, RuntimeError):
    """A KV cache's length, block-table entry or cache_batch_idx out of range: a ValueError like every invalid
    argument here, and the RuntimeError flash-attn raises for a block table too small for cache_seqlens."""


class UnsupportedError(FlashAttnError, NotImplementedError):
    pass


class OutOfMemoryError(FlashAttnError, MemoryError):
    pass


class BackendUnavailableError(FlashAttnError, RuntimeError):
    pass


class DeviceError(FlashAttnError, RuntimeError):
    pass


class InternalError(FlashAttnError, RuntimeError):
    pass


_ext.init(*(ctypes.cast(f, _P).value for f in (lib.fa_attn_opts_init, lib.fa_forward, lib.fa_backward,
                                                lib.fa_kv_opts_init, lib.fa_forward_kvcache, lib.fa_merge_states)),
          InvalidArgumentError, UnsupportedError)

_ERRORS = {ERR_INVALID_ARGUMENT: InvalidArgumentError, ERR_UNSUPPORTED: UnsupportedError,
           ERR_OUT_OF_MEMORY: OutOfMemoryError, ERR_BACKEND_UNAVAILABLE: BackendUnavailableError,
           ERR_DEVICE: DeviceError, ERR_INTERNAL: InternalError}


def error(status, message):
    """The exception for a status, its text 'FA_ERR_...: message'."""
    name = lib.fa_status_string(status).decode()
    return _ERRORS.get(status, InternalError)(status, f"{name}: {message}")


def version():
    return lib.fa_version_string().decode()


def backend_available(backend):
    return bool(lib.fa_backend_available(backend))


class Context:
    """One fa_context. Its calls go through _ext (tensors as numpy arrays or (data, dtype, shape, strides) tuples);
    a context serves one thread at a time."""

    def __init__(self, backend, device):
        handle = _P()
        st = lib.fa_context_create(ctypes.byref(handle), backend, device)
        if st != OK:
            raise error(st, lib.fa_create_error().decode())
        self.handle = handle.value
        self.stream = None
        self._destroy = lib.fa_context_destroy

    def __del__(self):
        if getattr(self, "handle", None):
            self._destroy(self.handle)
            self.handle = None

    def fail(self, status):
        raise error(status, lib.fa_context_last_error(self.handle).decode())

    def set_stream(self, stream):
        if stream != self.stream:
            st = lib.fa_context_set_stream(self.handle, stream or None)
            if st != OK:
                self.fail(st)
            self.stream = stream

    def forward(self, opts, q, k, v, out, lse):
        """opts: options() + (cu_seqlens_q, cu_seqlens_k addresses or 0, n_seqs); lse: an address or an array."""
        st = _ext.forward(self.handle, opts, q, k, v, out, lse)
        if st:
            self.fail(st)

    def backward(self, opts, q, k, v, out, lse, dout, dq, dk, dv):
        st = _ext.backward(self.handle, opts, q, k, v, out, lse, dout, dq, dk, dv)
        if st:
            self.fail(st)

    def kvcache(self, opts, kv, q, k_cache, v_cache, k, v, out, lse):
        """kv as _ext.kvcache takes it; k, v None when nothing is appended; lse an address (0 = none)."""
        st = _ext.kvcache(self.handle, opts, kv, q, k_cache, v_cache, k, v, out, lse)
        if st:
            self.fail(st)

    def merge(self, outs, lses, out, lse):
        st = _ext.merge(self.handle, outs, lses, out, lse)
        if st:
            self.fail(st)

    def kvcache_check(self):
        """Raise CacheIndexError if a KV-cache call since the last check met an index out of range (CUDA: the kernels
        clamp it and record it; waits for the context's stream). The CPU checks before it runs: nothing to report."""
        st = lib.fa_kvcache_check(self.handle)
        if st == ERR_INVALID_ARGUMENT:
            msg = lib.fa_context_last_error(self.handle).decode()
            raise CacheIndexError(st, f"{lib.fa_status_string(st).decode()}: {msg}")
        if st != OK:
            self.fail(st)

    def stats(self):
        s = FaStats()
        if lib.fa_last_stats(self.handle, ctypes.byref(s)) != OK:
            return None
        names = {v: k for k, v in ALGOS.items()}
        return {"backend": "cuda" if s.backend == BACKEND_CUDA else "cpu", "algo": names.get(s.algo, "?"),
                "is_backward": bool(s.is_backward), "kernel": (s.kernel or b"").decode(), "block_q": s.block_q,
                "block_k": s.block_k, "threads": s.threads, "flops": s.flops, "slow_read_bytes": s.slow_read_bytes,
                "slow_write_bytes": s.slow_write_bytes, "extra_bytes": s.extra_bytes}


_local = threading.local()


def context(backend=BACKEND_CPU, device=0):
    """This thread's context for (backend, device): CPU contexts use all cores (OMP_NUM_THREADS when set)."""
    cache = getattr(_local, "contexts", None)
    if cache is None:
        cache = _local.contexts = {}
    key = (backend, device)
    ctx = cache.get(key)
    if ctx is None:
        ctx = cache[key] = Context(backend, 0 if backend == BACKEND_CPU else device)
    return ctx


_options = {}  # (softmax_scale, causal, window_size, softcap, algo, deterministic) -> options(); a few kinds a run


def options(softmax_scale, causal, window_size, softcap, algo, deterministic, dropout_p=0.0, alibi_slopes=None):
    """The Python-level options as a tuple (cu_seqlens and n_seqs are appended per call); flash-attn arguments
    flashattn lacks are accepted only at their no-op values. Cached by argument values (a dict lookup is ~4x
    cheaper than the conversions)."""
    if not dropout_p and alibi_slopes is None:
        key = (softmax_scale, causal, window_size, softcap, algo, deterministic)
        try:
            return _options[key]
        except KeyError:
            if len(_options) < 256:
                _options[key] = _options_of(softmax_scale, causal, window_size, softcap, algo, deterministic)
                return _options[key]
        except TypeError:  # an unhashable argument (a window_size list): convert it
            pass
    return _options_of(softmax_scale, causal, window_size, softcap, algo, deterministic, dropout_p, alibi_slopes)


def _options_of(softmax_scale, causal, window_size, softcap, algo, deterministic, dropout_p=0.0, alibi_slopes=None):
    if dropout_p:
        raise UnsupportedError(ERR_UNSUPPORTED, f"FA_ERR_UNSUPPORTED: dropout_p={dropout_p}: flashattn has no dropout")
    if alibi_slopes is not None:
        raise UnsupportedError(ERR_UNSUPPORTED, "FA_ERR_UNSUPPORTED: alibi_slopes: flashattn has no ALiBi")
    if isinstance(algo, str):
        if algo not in ALGOS:
            raise InvalidArgumentError(ERR_INVALID_ARGUMENT, f"FA_ERR_INVALID_ARGUMENT: algo={algo!r}: expected one "
                                       f"of {', '.join(ALGOS)}")
        algo = ALGOS[algo]
    left, right = window_size
    return (float(softmax_scale or 0.0), bool(causal), int(left), int(right), float(softcap), int(algo),
            bool(deterministic))
