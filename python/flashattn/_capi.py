"""The C library through ctypes: struct layouts, prototypes, statuses as exceptions, one context per thread and device.

Tensors reach this layer as plain views, (data pointer, dtype code, shape, strides in elements), so numpy and torch
share every line below; docs/python.md says why ctypes and what a call costs.
"""
import ctypes
import os
import threading

_HERE = os.path.dirname(os.path.abspath(__file__))
_LIB_PATH = os.environ.get("FLASHATTN_LIBRARY", os.path.join(_HERE, "libflashattn.so"))
lib = ctypes.CDLL(_LIB_PATH)

# fa_status values are pinned by the header.
OK, ERR_INVALID_ARGUMENT, ERR_UNSUPPORTED, ERR_OUT_OF_MEMORY, ERR_BACKEND_UNAVAILABLE, ERR_DEVICE, ERR_INTERNAL = range(7)
DTYPE_F32, DTYPE_F16, DTYPE_BF16 = 0, 1, 2
BACKEND_CPU, BACKEND_CUDA = 0, 1
ALGOS = {"auto": 0, "standard": 1, "flash1": 2, "flash2": 3}


class FaTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("batch", ctypes.c_int64),
                ("seqlen", ctypes.c_int64), ("heads", ctypes.c_int64), ("head_dim", ctypes.c_int64),
                ("stride_batch", ctypes.c_int64), ("stride_seq", ctypes.c_int64), ("stride_head", ctypes.c_int64)]


class FaAttnOpts(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("scale", ctypes.c_float), ("causal", ctypes.c_int),
                ("window_left", ctypes.c_int), ("window_right", ctypes.c_int), ("softcap", ctypes.c_float),
                ("algo", ctypes.c_int), ("block_q", ctypes.c_int), ("block_k", ctypes.c_int),
                ("deterministic", ctypes.c_int), ("cu_seqlens_q", ctypes.c_void_p),
                ("cu_seqlens_k", ctypes.c_void_p), ("n_seqs", ctypes.c_int64)]


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
    "fa_attn_opts_init": (ctypes.c_int, [ctypes.POINTER(FaAttnOpts), ctypes.c_size_t]),
    "fa_forward": (ctypes.c_int, [_P] * 7),
    "fa_backward": (ctypes.c_int, [_P] * 11),
    "fa_last_stats": (ctypes.c_int, [_P, ctypes.POINTER(FaStats)]),
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
    """One fa_context with the argument structs of its calls, reused call after call (a context serves one
    thread at a time, so they are never shared)."""

    def __init__(self, backend, device):
        handle = _P()
        st = lib.fa_context_create(ctypes.byref(handle), backend, device)
        if st != OK:
            raise error(st, lib.fa_create_error().decode())
        self.handle = handle.value
        self.stream = None
        self.opts = FaAttnOpts()
        lib.fa_attn_opts_init(ctypes.byref(self.opts), ctypes.sizeof(FaAttnOpts))
        self.tensors = [FaTensor() for _ in range(8)]
        self.ptrs = [ctypes.addressof(t) for t in self.tensors]
        self.opts_ptr = ctypes.addressof(self.opts)
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

    def set_opts(self, o, cu_q=None, cu_k=None, n_seqs=0):
        """o: an Options tuple; cu_q/cu_k: host int32 pointers for varlen."""
        p = self.opts
        p.scale, p.causal, p.window_left, p.window_right, p.softcap, p.algo, p.deterministic = o
        p.cu_seqlens_q, p.cu_seqlens_k, p.n_seqs = cu_q, cu_k, n_seqs

    def set_tensor(self, i, view):
        """view: (data, dtype, (b, s, h, d), (stride_b, stride_s, stride_h, stride_d)); returns the struct's address."""
        data, dtype, shape, strides = view
        if strides[3] != 1 and shape[3] > 1:
            raise InvalidArgumentError(ERR_INVALID_ARGUMENT, f"FA_ERR_INVALID_ARGUMENT: head_dim must be contiguous "
                                       f"(stride 1), got stride {strides[3]}; flashattn does not copy its inputs")
        t = self.tensors[i]
        t.data, t.dtype = data, dtype
        t.batch, t.seqlen, t.heads, t.head_dim = shape
        t.stride_batch, t.stride_seq, t.stride_head = strides[0], strides[1], strides[2]
        return self.ptrs[i]

    def forward(self, q, k, v, out, lse_ptr):
        st = lib.fa_forward(self.handle, self.opts_ptr, self.set_tensor(0, q), self.set_tensor(1, k),
                            self.set_tensor(2, v), self.set_tensor(3, out), lse_ptr)
        if st != OK:
            self.fail(st)

    def backward(self, q, k, v, out, lse_ptr, dout, dq, dk, dv):
        st = lib.fa_backward(self.handle, self.opts_ptr, self.set_tensor(0, q), self.set_tensor(1, k),
                             self.set_tensor(2, v), self.set_tensor(3, out), lse_ptr, self.set_tensor(4, dout),
                             self.set_tensor(5, dq), self.set_tensor(6, dk), self.set_tensor(7, dv))
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


def options(softmax_scale, causal, window_size, softcap, algo, deterministic, dropout_p=0.0, alibi_slopes=None):
    """The Python-level options as the tuple Context.set_opts takes; flash-attn arguments flashattn lacks are
    accepted only at their no-op values."""
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
