"""learnable_sink (FA4's name for opts.sinks): out, lse and the gradients of q, k, v and the sink against torch
autograd through a plain float64 reference — flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache, the
numpy front end, the custom ops under opcheck and torch.compile, and the argument's checks."""
import numpy as np
import pytest
from conftest import assert_close
from reference import torch_attention

torch = pytest.importorskip("torch")
import flashattn  # noqa: E402
from flashattn import _capi  # noqa: E402

HAVE_CUDA = torch.cuda.is_available() and _capi.backend_available(_capi.BACKEND_CUDA)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device or build"))]
CASES = {"cpu": [("float32", 16), ("bfloat16", 40)], "cuda": [("float16", 64), ("bfloat16", 128)]}
OPTIONS = [dict(), dict(causal=True), dict(window_size=(5, 1), softcap=4.0), dict(softmax_scale=0.3, causal=True)]


def reference(q, k, v, sink, **kw):
    """out [B, Sq, H, D] and lse [B, H, Sq] in float64 with torch ops, differentiable in q, k, v and sink."""
    return torch_attention(q, k, v, sink, **kw)


def make(shape, dtype, device, gen, scale=1.0):
    t = torch.randn(shape, generator=gen, dtype=torch.float32) * scale
    return t.to(dtype=getattr(torch, dtype), device=device)


def f64(t):
    return t.detach().to("cpu", torch.float64).numpy()


def sinks_of(h, device, gen):
    return (torch.rand(h, generator=gen) * 4 - 1).to(device).requires_grad_()


def check_grads(got, want, dtype, tag):
    for name, g, r in zip(("dq", "dk", "dv", "d_sink"), got, want):
        assert g is not None, f"{name} {tag}: no gradient"
        assert_close(f64(g), f64(r), "float32" if name == "d_sink" and dtype == "float32" else dtype,
                     f"{name} {tag}", factor=4 if name == "d_sink" else 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("algo", ["standard", "flash1", "flash2", "auto"])
@pytest.mark.parametrize("kw", OPTIONS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()) or "plain")
def test_func(device, algo, kw):
    gen = torch.Generator().manual_seed(3)
    for dtype, d in CASES[device]:
        # Sq = Sk; Sq < Sk with GQA; Sq > Sk with MQA (causal: the first rows see no key, all weight on the sink)
        for b, sq, sk, hq, hk in [(2, 19, 19, 4, 4), (1, 11, 30, 6, 2), (1, 29, 9, 4, 1)]:
            q, k, v = (make(s, dtype, device, gen).requires_grad_() for s in
                       ((b, sq, hq, d), (b, sk, hk, d), (b, sk, hk, d)))
            sink = sinks_of(hq, device, gen)
            out, lse = flashattn.flash_attn_func(q, k, v, return_lse=True, algo=algo, learnable_sink=sink, **kw)
            q64, k64, v64, s64 = (t.detach().to(torch.float64).requires_grad_() for t in (q, k, v, sink))
            ref, ref_lse = reference(q64, k64, v64, s64, **kw)
            tag = f"{algo} {dtype} d={d} {b}x{sq}x{sk}x{hq}/{hk}"
            assert_close(f64(out), f64(ref), dtype, f"out {tag}")
            assert_close(f64(lse), f64(ref_lse), "float32", f"lse {tag}", factor=10)
            dout = make(out.shape, dtype, device, gen)
            out.backward(dout)
            ref.backward(dout.to(torch.float64))
            check_grads((q.grad, k.grad, v.grad, sink.grad), (q64.grad, k64.grad, v64.grad, s64.grad), dtype, tag)


@pytest.mark.parametrize("device", DEVICES)
def test_sink_only_grad(device):
    """Only the sink requires grad: autograd still records the call, and the sink's gradient matches."""
    gen = torch.Generator().manual_seed(5)
    dtype, d = CASES[device][0]
    q, k, v = (make((1, 13, 4, d), dtype, device, gen) for _ in range(3))
    sink = sinks_of(4, device, gen)
    out = flashattn.flash_attn_func(q, k, v, causal=True, learnable_sink=sink)
    s64 = sink.detach().double().requires_grad_()
    ref, _ = reference(q, k, v, s64, causal=True)
    dout = make(out.shape, dtype, device, gen)
    out.backward(dout)
    ref.backward(dout.double())
    assert_close(f64(sink.grad), f64(s64.grad), "float32" if dtype == "float32" else dtype, "d_sink", factor=4)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen(device):
    """Packed sequences, one with no keys (its rows are all sink: out 0, lse the sink)."""
    gen = torch.Generator().manual_seed(9)
    dtype, d = CASES[device][0]
    lq, lk, hq, hk = [5, 0, 9, 3], [7, 4, 0, 11], 4, 2
    cu_q = torch.tensor([0] + list(np.cumsum(lq)), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(np.cumsum(lk)), dtype=torch.int32, device=device)
    q = make((sum(lq), hq, d), dtype, device, gen).requires_grad_()
    k, v = (make((sum(lk), hk, d), dtype, device, gen).requires_grad_() for _ in range(2))
    sink = sinks_of(hq, device, gen)
    out, lse = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=True, return_lse=True,
                                                learnable_sink=sink)
    q64, k64, v64, s64 = (t.detach().to(torch.float64).requires_grad_() for t in (q, k, v, sink))
    outs, lses = [], []
    for i in range(len(lq)):
        a, e, c, f = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        o, l = reference(q64[None, a:e], k64[None, c:f], v64[None, c:f], s64, causal=True)
        outs.append(o[0]), lses.append(l[0])
    ref, ref_lse = torch.cat(outs), torch.cat(lses, dim=1)
    assert_close(f64(out), f64(ref), dtype, "varlen out")
    assert_close(f64(lse), f64(ref_lse), "float32", "varlen lse", factor=10)
    assert torch.equal(lse[:, int(cu_q[2]):int(cu_q[3])].cpu(), sink.detach().cpu()[:, None].expand(hq, lq[2]))
    dout = make(out.shape, dtype, device, gen)
    out.backward(dout)
    ref.backward(dout.double())
    check_grads((q.grad, k.grad, v.grad, sink.grad), (q64.grad, k64.grad, v64.grad, s64.grad), dtype, "varlen")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_kvcache(device, num_splits):
    """Decoding with the sink: forward only, against the reference over each sequence's keys after the append."""
    gen = torch.Generator().manual_seed(13)
    dtype = "float32" if device == "cpu" else "bfloat16"
    b, cap, hq, hk, d, sq = 3, 96, 8, 2, 64, 2
    q = make((b, sq, hq, d), dtype, device, gen)
    k_cache, v_cache = (make((b, cap, hk, d), dtype, device, gen) for _ in range(2))
    k_new, v_new = (make((b, sq, hk, d), dtype, device, gen) for _ in range(2))
    lens = torch.tensor([0, 40, cap - sq], dtype=torch.int32, device=device)
    sink = sinks_of(hq, device, gen).detach()
    out, lse = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens, causal=True,
                                                 num_splits=num_splits, return_softmax_lse=True,
                                                 learnable_sink=sink)
    for i in range(b):
        n = int(lens[i]) + sq
        ref, ref_lse = reference(q[i:i + 1], k_cache[i:i + 1, :n], v_cache[i:i + 1, :n], sink, causal=True)
        assert_close(f64(out[i:i + 1]), f64(ref), dtype, f"kvcache out {i}")
        assert_close(f64(lse[i:i + 1]), f64(ref_lse), "float32", f"kvcache lse {i}", factor=10)


def test_numpy():
    """The numpy front end: forward and flashattn.backward with learnable_sink (d_sink returned fourth)."""
    rng = np.random.default_rng(17)
    q = rng.standard_normal((2, 10, 4, 16), dtype=np.float32)
    k, v, dout = (rng.standard_normal(s, dtype=np.float32) for s in ((2, 14, 2, 16), (2, 14, 2, 16), q.shape))
    sink = rng.uniform(-1, 3, 4).astype(np.float32)
    out, lse = flashattn.flash_attn_func(q, k, v, causal=True, return_lse=True, learnable_sink=sink)
    dq, dk, dv, ds = flashattn.backward(dout, q, k, v, out, lse, causal=True, learnable_sink=sink)
    t = [torch.from_numpy(a).double().requires_grad_() for a in (q, k, v, sink)]
    ref, ref_lse = reference(*t, causal=True)
    ref.backward(torch.from_numpy(dout).double())
    assert_close(out, f64(ref), "float32", "numpy out")
    assert_close(lse, f64(ref_lse), "float32", "numpy lse", factor=10)
    for name, g, r in zip(("dq", "dk", "dv", "d_sink"), (dq, dk, dv, ds), t):
        assert_close(g, f64(r.grad), "float32", f"numpy {name}", factor=4)
    out_kv = flashattn.flash_attn_with_kvcache(q, k.copy(), v.copy(), causal=True, learnable_sink=sink)
    assert_close(out_kv, f64(ref), "float32", "numpy kvcache out")


def test_arguments():
    """The sink's checks name learnable_sink: dtype (no cast), shape, device-less objects; nothing is computed."""
    q = torch.randn(1, 4, 2, 8)
    for bad in (torch.zeros(2, dtype=torch.float64), torch.zeros(3), torch.zeros(1, 2), [0.0, 0.0]):
        with pytest.raises(flashattn.InvalidArgumentError, match="learnable_sink"):
            flashattn.flash_attn_func(q, q, q, learnable_sink=bad)
    with pytest.raises(flashattn.InvalidArgumentError, match="learnable_sink"):
        flashattn.flash_attn_with_kvcache(q, q.clone(), q.clone(), learnable_sink=torch.zeros(3))
    with pytest.raises(flashattn.InvalidArgumentError, match="learnable_sink"):
        flashattn.flash_attn_func(q.numpy(), q.numpy(), q.numpy(), learnable_sink=np.zeros(2))


def test_opcheck_and_compile():
    gen = torch.Generator().manual_seed(21)
    q, k, v = (make(s, "float32", "cpu", gen).requires_grad_() for s in ((2, 9, 4, 32), (2, 12, 2, 32),
                                                                         (2, 12, 2, 32)))
    sink = sinks_of(4, "cpu", gen)
    args = (q, k, v, None, None, 0.0, True, -1, -1, 0.0, 0, False, 0, 0, sink)
    torch.library.opcheck(torch.ops.flashattn.fwd.default, args)
    out, lse = torch.ops.flashattn.fwd(*args)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.flashattn.bwd.default, (dout, q.detach(), k.detach(), v.detach(), out.detach(),
                                                            lse.detach(), None, None, 0.0, True, -1, -1, 0.0, 0,
                                                            False, 0, 0, sink.detach()))

    def layer(q, k, v, sink):
        return (flashattn.flash_attn_func(q, k, v, causal=True, learnable_sink=sink) ** 2).sum()

    loss = torch.compile(layer, fullgraph=True)(q, k, v, sink)
    loss.backward()
    grads = [t.grad.clone() for t in (q, k, v, sink)]
    for t in (q, k, v, sink):
        t.grad = None
    layer(q, k, v, sink).backward()
    for g, t in zip(grads, (q, k, v, sink)):
        assert torch.allclose(g, t.grad, rtol=1e-4, atol=1e-5)
