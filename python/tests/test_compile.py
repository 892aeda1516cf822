"""The custom ops under torch.library.opcheck and torch.compile(fullgraph=True)."""
import pytest

torch = pytest.importorskip("torch")
import flashattn  # noqa: E402
from flashattn import _capi, _torch  # noqa: E402, F401  (_torch registers torch.ops.flashattn)

HAVE_CUDA = torch.cuda.is_available() and _capi.backend_available(_capi.BACKEND_CUDA)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device or build"))]


def qkv(device, b, sq, sk, hq, hk, d, dtype):
    gen = torch.Generator().manual_seed(11)
    return [torch.randn(shape, generator=gen).to(dtype=dtype, device=device).requires_grad_()
            for shape in ((b, sq, hq, d), (b, sk, hk, d), (b, sk, hk, d))]


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    dtype = torch.float32 if device == "cpu" else torch.float16
    q, k, v = qkv(device, 2, 9, 12, 4, 2, 64, dtype)
    # fwd's arguments: q, k, v, cu_seqlens_q, cu_seqlens_k, scale, causal, window_left, window_right, softcap, algo,
    # deterministic
    torch.library.opcheck(torch.ops.flashattn.fwd.default, (q, k, v, None, None, 0.0, True, -1, -1, 0.0, 0, False))
    torch.library.opcheck(torch.ops.flashattn.fwd.default, (q.transpose(1, 2).contiguous().transpose(1, 2), k, v,
                                                            None, None, 0.5, False, 3, 1, 4.0, 0, True))
    cu_q = torch.tensor([0, 4, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 7, 12], dtype=torch.int32)
    qv, kv, vv = (t.detach()[0].requires_grad_() for t in (q, k, v))
    torch.library.opcheck(torch.ops.flashattn.fwd.default, (qv, kv, vv, cu_q, cu_k, 0.0, True, -1, -1, 0.0, 0, False))
    out, lse = torch.ops.flashattn.fwd(q, k, v, None, None, 0.0, True, -1, -1, 0.0, 0, False)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.flashattn.bwd.default, (dout, q.detach(), k.detach(), v.detach(), out.detach(),
                                                            lse.detach(), None, None, 0.0, True, -1, -1, 0.0, 0,
                                                            False))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v = qkv(device, 2, 17, 17, 4, 2, 32 if device == "cpu" else 64, dtype)
    w = torch.randn(q.shape[-1], q.shape[-1], device=device, dtype=dtype)

    def layer(q, k, v):
        out, lse = flashattn.flash_attn_func(q @ w, k, v, causal=True, softcap=8.0, return_lse=True)
        return (out * out).sum() + lse.sum()

    compiled = torch.compile(layer, fullgraph=True)  # a graph break raises instead of falling back
    loss = compiled(q, k, v)
    loss.backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    loss_eager = layer(q, k, v)
    loss_eager.backward()
    assert torch.allclose(loss, loss_eager, rtol=1e-5 if dtype == torch.float32 else 2e-2)
    for g, t in zip(grads, (q, k, v)):
        assert torch.allclose(g, t.grad, rtol=1e-4, atol=1e-5 if dtype == torch.float32 else 2e-2)


def test_eager_without_grad_skips_nothing():
    """The no-autograd fast path and the dispatched op give the same bits."""
    q, k, v = (t.detach() for t in qkv("cpu", 1, 8, 8, 2, 2, 16, torch.float32))
    with torch.no_grad():
        fast = flashattn.flash_attn_func(q, k, v, causal=True)
    op, _ = torch.ops.flashattn.fwd(q, k, v, None, None, 0.0, True, -1, -1, 0.0, 0, False)
    assert torch.equal(fast, op)
