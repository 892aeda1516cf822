"""flashattn as SDPA's flash backend (flashattn.sdpa). On the CPU: the registry entry, activation and restore of the
CUDA kernels, and the kernels themselves registered for the CPU key (where PyTorch has none), called through the
aten flash ops with autograd and torch.compile. On CUDA: F.scaled_dot_product_attention itself, a Hugging
Face-style module, torch.compile, and the fall-back to PyTorch's kernel."""
import math
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import flashattn  # noqa: E402
from flashattn import _capi  # noqa: E402

sdpa = pytest.importorskip("flashattn.sdpa")
if not sdpa.available():
    pytest.skip("torch has no flash-attention registry (torch < 2.11)", allow_module_level=True)
from torch.nn.attention import (SDPBackend, activate_flash_attention_impl, current_flash_attention_impl,  # noqa: E402
                                list_flash_attention_impls, restore_flash_attention_impl, sdpa_kernel)

HAVE_CUDA = torch.cuda.is_available() and _capi.backend_available(_capi.BACKEND_CUDA)
cuda_only = pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device or build")
OPS = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
       "_flash_attention_forward", "_flash_attention_backward")


def kernel_of(op, key):
    """The registration line of op's kernel for key in the dispatcher's table."""
    lines = torch._C._dispatch_dump(f"aten::{op}").splitlines()
    return next(line for line in lines if line.startswith(f"{key}:"))


def test_registered_activate_restore():
    assert sdpa.NAME in list_flash_attention_impls()
    before = {op: kernel_of(op, "CUDA") for op in OPS}
    assert not any("sdpa.py" in line for line in before.values())
    activate_flash_attention_impl("flashattn")
    try:
        assert current_flash_attention_impl() == "flashattn"
        for op in OPS:
            assert "flashattn/sdpa.py" in kernel_of(op, "CUDA"), op
    finally:
        restore_flash_attention_impl()
    assert current_flash_attention_impl() is None
    assert {op: kernel_of(op, "CUDA") for op in OPS} == before


@pytest.fixture
def on_cpu():
    """The provider's kernels for the CPU key (PyTorch has no CPU kernel for these ops)."""
    handle = sdpa.register("CPU")
    try:
        yield
    finally:
        handle.remove()
    with pytest.raises(NotImplementedError):
        torch.ops.aten._scaled_dot_product_flash_attention(*[torch.zeros(1, 1, 1, 8)] * 3)


def bhsd(b, h, s, d, dtype, gen, hk=None):
    return torch.randn(b, hk or h, s, d, generator=gen).to(dtype).requires_grad_()


def math_attention(q, k, v, causal, scale):
    """out and lse in float64 through the math backend and plain ops, GQA by repeating K/V heads."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, scale=scale)
    s = q @ kk.transpose(-1, -2) * (scale or 1 / math.sqrt(q.shape[-1]))
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    return out, torch.logsumexp(s, -1).detach(), (q, k, v)


TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def close(got, ref, dtype, what, factor=1.0):
    err = (got.double() - ref.double()).abs().max().item()
    bound = factor * TOL[dtype] * max(1.0, ref.abs().max().item())
    assert err <= bound, f"{what}: {err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal,scale,heads", [(False, None, (4, 4)), (True, 0.3, (4, 2)), (True, None, (6, 1))])
def test_sdpa_op_cpu(on_cpu, dtype, causal, scale, heads):
    gen = torch.Generator().manual_seed(3)
    q, k, v = bhsd(2, heads[0], 19, 16, dtype, gen), bhsd(2, 0, 19, 16, dtype, gen, heads[1]), \
        bhsd(2, 0, 19, 16, dtype, gen, heads[1])
    res = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
    out, lse = res[0], res[1]
    assert out.shape == q.shape and out.stride() == q.stride() and lse.shape == (2, heads[0], 19)
    assert res[4] == 19 and res[5] == 19 and res[6].dtype == torch.uint64 and res[8].numel() == 0
    ref, ref_lse, leaves = math_attention(q, k, v, causal, scale)
    close(out, ref, dtype, "out")
    close(lse, ref_lse, torch.float32, "lse", factor=10)
    dout = torch.randn(out.shape, generator=gen).to(dtype)
    out.backward(dout)
    ref.backward(dout.double())
    for name, t, r in zip(("dq", "dk", "dv"), (q, k, v), leaves):
        assert t.grad.shape == t.shape and t.grad.dtype == dtype
        close(t.grad, r.grad, dtype, name, factor=2)


def test_flash_varlen_op_cpu(on_cpu):
    """aten::_flash_attention_forward with cu_seqlens (torch.nn.attention.varlen's op): the same bits as
    flashattn.flash_attn_varlen_func, and its gradients."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(n, 4, 32, generator=gen).requires_grad_() for n in (12, 15, 15))
    cu_q, cu_k = torch.tensor([0, 5, 12], dtype=torch.int32), torch.tensor([0, 9, 15], dtype=torch.int32)
    out, lse, *_ = torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, 7, 9, 0.0, True, False,
                                                            window_size_left=4, window_size_right=None)
    want, want_lse = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 9, causal=True, window_size=(4, -1),
                                                      return_lse=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    dout = torch.randn(out.shape, generator=gen)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    wants = torch.autograd.grad(want, (q, k, v), dout)
    for g, w in zip(grads, wants):
        assert torch.equal(g, w)


def test_compile_cpu(on_cpu):
    """torch.compile traces the aten op (PyTorch's meta kernel) and runs the provider's kernel: same loss and
    gradients as eager."""
    gen = torch.Generator().manual_seed(9)
    q, k, v = (bhsd(1, 2, 11, 16, torch.float32, gen) for _ in range(3))

    def loss(q, k, v):
        out = torch.ops.aten._scaled_dot_product_flash_attention(q * 2, k, v, 0.0, True, False)[0]
        return (out * out).sum()

    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    got = compiled(q, k, v)
    grads = torch.autograd.grad(got, (q, k, v))
    want = loss(q, k, v)
    wants = torch.autograd.grad(want, (q, k, v))
    assert torch.allclose(got, want, rtol=1e-6)
    for g, w in zip(grads, wants):
        assert torch.allclose(g, w, rtol=1e-5, atol=1e-6)


def test_refusals_cpu(on_cpu):
    """What flashattn does not do falls back; without a PyTorch kernel (the CPU) that is an error naming the reason,
    counted in sdpa.fallbacks."""
    q = torch.randn(1, 2, 8, 16)
    before = sum(sdpa.fallbacks.values())
    with pytest.raises(NotImplementedError, match="dropout_p=0.1: flashattn has no dropout"):
        torch.ops.aten._scaled_dot_product_flash_attention(q, q, q, 0.1)
    with pytest.raises(NotImplementedError, match="return_debug_mask"):
        torch.ops.aten._scaled_dot_product_flash_attention(q, q, q, 0.0, False, True)
    with pytest.raises(NotImplementedError, match="dtype torch.float64"):
        torch.ops.aten._scaled_dot_product_flash_attention(q.double(), q.double(), q.double())
    with pytest.raises(NotImplementedError, match="alibi_slopes"):
        torch.ops.aten._flash_attention_forward(q[0], q[0], q[0], None, None, 8, 8, 0.0, False, False,
                                                alibi_slopes=torch.ones(2))
    assert sum(sdpa.fallbacks.values()) == before + 4


def test_activate_message_without_registry(monkeypatch):
    monkeypatch.delattr(torch.nn.attention, "register_flash_attention_impl")
    with pytest.raises(NotImplementedError, match="torch >= 2.11"):
        sdpa.activate()


# ---- CUDA: F.scaled_dot_product_attention itself ----

@pytest.fixture
def active():
    sdpa.activate()
    try:
        yield
    finally:
        restore_flash_attention_impl()


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal,gqa", [(False, False), (True, False), (True, True)])
def test_sdpa_cuda(active, dtype, causal, gqa):
    gen = torch.Generator().manual_seed(1)
    hk = 2 if gqa else 8
    q, k, v = (torch.randn(2, h, 300, 128, generator=gen).to("cuda", dtype).requires_grad_() for h in (8, hk, hk))
    before = dict(sdpa.fallbacks)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    assert flashattn.last_stats("cuda")["kernel"], "flashattn ran nothing"
    ref, _, leaves = math_attention(q.cpu(), k.cpu(), v.cpu(), causal, None)
    close(out.cpu(), ref, dtype, "out")
    dout = torch.randn(out.shape, generator=gen).to("cuda", dtype)
    ran = sum(n for op, n in sdpa.calls.items() if op.endswith("_backward"))
    out.backward(dout)  # on autograd's own thread: its last_stats are not this thread's
    assert sum(n for op, n in sdpa.calls.items() if op.endswith("_backward")) == ran + 1, "the backward was not ours"
    ref.backward(dout.cpu().double())
    for name, t, r in zip(("dq", "dk", "dv"), (q, k, v), leaves):
        close(t.grad.cpu(), r.grad, dtype, name, factor=2)
    assert dict(sdpa.fallbacks) == before


class HFAttention(torch.nn.Module):
    """The shape of a Hugging Face attention layer with attn_implementation="sdpa": projections, [B, H, S, D] views,
    F.scaled_dot_product_attention, the output projection."""

    def __init__(self, hidden, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, hidden // heads
        self.q_proj = torch.nn.Linear(hidden, heads * self.d, bias=False)
        self.k_proj = torch.nn.Linear(hidden, kv_heads * self.d, bias=False)
        self.v_proj = torch.nn.Linear(hidden, kv_heads * self.d, bias=False)
        self.o_proj = torch.nn.Linear(heads * self.d, hidden, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.d).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


@cuda_only
@pytest.mark.parametrize("compiled", [False, True])
def test_hf_module_cuda(compiled):
    torch.manual_seed(0)
    layer = HFAttention(512, 8, 2).to("cuda", torch.bfloat16)
    x = torch.randn(2, 257, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with sdpa_kernel(SDPBackend.MATH):
        ref = layer(x)
        ref_grads = torch.autograd.grad(ref.float().square().sum(), [x] + list(layer.parameters()))
    sdpa.activate()
    try:
        run = torch.compile(layer, fullgraph=True) if compiled else layer
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = run(x)
            grads = torch.autograd.grad(out.float().square().sum(), [x] + list(layer.parameters()))
        assert flashattn.last_stats("cuda")["kernel"]
    finally:
        restore_flash_attention_impl()
    close(out.float(), ref.float(), torch.bfloat16, "out", factor=2)
    for g, r in zip(grads, ref_grads):
        close(g.float(), r.float(), torch.bfloat16, "grad", factor=4)


@cuda_only
def test_fallback_cuda(active):
    """dropout runs PyTorch's own flash kernel, with a warning naming the reason."""
    q = torch.randn(1, 4, 64, 64, device="cuda", dtype=torch.float16)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    assert out.shape == q.shape and torch.isfinite(out).all()
    assert any("flashattn has no dropout" in str(w.message) for w in seen)
