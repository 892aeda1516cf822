"""torch tensors on the CPU and (when present) on CUDA: outputs and gradients against float64 math."""
import numpy as np
import pytest
from conftest import assert_close

torch = pytest.importorskip("torch")
import flashattn  # noqa: E402
import reference  # noqa: E402
from flashattn import _capi  # noqa: E402

HAVE_CUDA = torch.cuda.is_available() and _capi.backend_available(_capi.BACKEND_CUDA)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device or build"))]
# CUDA runs FLASH1/FLASH2 for f16/bf16 at head_dim 32/64/96/128 (FLASH2 also 256), STANDARD anything.
CASES = {"cpu": [("float32", 16), ("float16", 40), ("bfloat16", 8)], "cuda": [("float16", 64), ("bfloat16", 128)]}
OPTIONS = [dict(), dict(causal=True), dict(window_size=(6, 2)), dict(causal=True, window_size=(4, -1)),
           dict(softcap=3.0), dict(softmax_scale=0.3, causal=True, softcap=5.0)]


def make(shape, dtype, device, gen):
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype=getattr(torch, dtype), device=device)


def f64(t):
    return t.detach().to("cpu", torch.float64).numpy()


def ref_kwargs(kw):
    return dict(scale=kw.get("softmax_scale"), causal=kw.get("causal", False), window=kw.get("window_size", (-1, -1)),
                softcap=kw.get("softcap", 0.0))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("algo", ["standard", "flash1", "flash2"])
@pytest.mark.parametrize("kw", OPTIONS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()) or "plain")
def test_forward_backward(device, algo, kw):
    gen = torch.Generator().manual_seed(7)
    for dtype, d in CASES[device]:
        shapes = [(2, 21, 21, 4, 4), (1, 13, 37, 6, 2), (1, 37, 13, 4, 1)]  # Sq = Sk, Sq < Sk + GQA, Sq > Sk + MQA
        for b, sq, sk, hq, hk in shapes:
            q = make((b, sq, hq, d), dtype, device, gen).requires_grad_()
            k = make((b, sk, hk, d), dtype, device, gen).requires_grad_()
            v = make((b, sk, hk, d), dtype, device, gen).requires_grad_()
            out, lse = flashattn.flash_attn_func(q, k, v, return_lse=True, algo=algo, **kw)
            ref, ref_lse = reference.attention(f64(q), f64(k), f64(v), **ref_kwargs(kw))
            tag = f"{dtype} d={d} {b}x{sq}x{sk}x{hq}/{hk}"
            assert out.dtype == q.dtype and out.shape == q.shape and lse.shape == (b, hq, sq)
            assert_close(f64(out), ref, dtype, f"out {tag}")
            lse64 = f64(lse)
            assert np.array_equal(np.isinf(lse64), np.isinf(ref_lse)), f"lse -inf rows {tag}"
            fin = np.isfinite(ref_lse)
            assert_close(lse64[fin], ref_lse[fin], "float32", f"lse {tag}", factor=10)
            dout = make(out.shape, dtype, device, gen)
            out.backward(dout)
            refs = reference.attention_backward(f64(dout), f64(q), f64(k), f64(v), **ref_kwargs(kw))
            for name, t, r in zip(("dq", "dk", "dv"), (q, k, v), refs):
                assert t.grad.dtype == t.dtype and t.grad.shape == t.shape
                assert_close(f64(t.grad), r, dtype, f"{name} {tag}", factor=2)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen(device):
    gen = torch.Generator().manual_seed(3)
    dtype, d = CASES[device][0]
    lens_q, lens_k = [5, 0, 31, 9], [7, 3, 31, 1]
    cu_q = torch.tensor([0] + np.cumsum(lens_q).tolist(), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + np.cumsum(lens_k).tolist(), dtype=torch.int32, device=device)
    q = make((sum(lens_q), 4, d), dtype, device, gen).requires_grad_()
    k = make((sum(lens_k), 2, d), dtype, device, gen).requires_grad_()
    v = make((sum(lens_k), 2, d), dtype, device, gen).requires_grad_()
    out, lse = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                                return_lse=True)
    assert out.shape == q.shape and lse.shape == (4, sum(lens_q))
    dout = make(out.shape, dtype, device, gen)
    out.backward(dout)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for s in range(len(lens_q)):
        a, b, c, e = cq[s], cq[s + 1], ck[s], ck[s + 1]
        qs, ks, vs = f64(q)[None, a:b], f64(k)[None, c:e], f64(v)[None, c:e]
        ref, ref_lse = reference.attention(qs, ks, vs, causal=True)
        assert_close(f64(out)[a:b], ref[0], dtype, f"out of sequence {s}")
        fin = np.isfinite(ref_lse[0])
        assert_close(f64(lse)[:, a:b][fin], ref_lse[0][fin], "float32", f"lse of sequence {s}", factor=10)
        dq, dk, dv = reference.attention_backward(f64(dout)[None, a:b], qs, ks, vs, causal=True)
        assert_close(f64(q.grad)[a:b], dq[0], dtype, f"dq of sequence {s}", factor=2)
        assert_close(f64(k.grad)[c:e], dk[0], dtype, f"dk of sequence {s}", factor=2)
        assert_close(f64(v.grad)[c:e], dv[0], dtype, f"dv of sequence {s}", factor=2)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_views_round_trip(device):
    """BHSD memory and sliced heads go in as views (no copy); results and gradients match the contiguous call."""
    gen = torch.Generator().manual_seed(5)
    dtype, d = CASES[device][-1]
    base_q = make((2, 4, 29, d), dtype, device, gen).requires_grad_()  # SDPA layout
    base_kv = make((2, 33, 2, 6, d), dtype, device, gen).requires_grad_()  # packed K/V, 6 heads of which 2 used
    q = base_q.transpose(1, 2)
    k, v = base_kv[:, :, 0, 1:3], base_kv[:, :, 1, 3:5]
    assert not q.is_contiguous() and not k.is_contiguous()
    out = flashattn.flash_attn_func(q, k, v, causal=True)
    qc, kc, vc = (t.detach().contiguous().requires_grad_() for t in (q, k, v))
    out_c = flashattn.flash_attn_func(qc, kc, vc, causal=True)
    assert torch.equal(out, out_c)
    dout = make(out.shape, dtype, device, gen)
    out.backward(dout)
    out_c.backward(dout)
    assert torch.equal(base_q.grad.transpose(1, 2), qc.grad)
    assert torch.equal(base_kv.grad[:, :, 0, 1:3], kc.grad) and torch.equal(base_kv.grad[:, :, 1, 3:5], vc.grad)
    assert torch.count_nonzero(base_kv.grad[:, :, 0, 0]) == 0
    # an expanded gradient (out.sum()) has head_dim stride 0: autograd's own tensor, made contiguous internally
    qc.grad = None
    out_c2 = flashattn.flash_attn_func(qc, kc, vc, causal=True)
    out_c2.sum().backward()
    assert qc.grad is not None and torch.isfinite(qc.grad).all()


@pytest.mark.parametrize("device", DEVICES)
def test_eager_autograd_matches_the_op(device):
    """Eager calls that autograd records run through an autograd.Function beside the op (no dispatcher): the same
    out, lse and gradients, bit for bit, as the op's own autograd."""
    gen = torch.Generator().manual_seed(11)
    dtype, d = CASES[device][0]
    leaves = [make((2, 19, 4, d), dtype, device, gen).requires_grad_() for _ in range(3)]
    dout = make((2, 19, 4, d), dtype, device, gen)
    out, lse = flashattn.flash_attn_func(*leaves, causal=True, return_lse=True)
    assert type(out.grad_fn).__name__.startswith("_EagerAttention")
    out.backward(dout)
    grads = [t.grad for t in leaves]
    again = [t.detach().clone().requires_grad_() for t in leaves]
    out2, lse2 = torch.ops.flashattn.fwd(*again, None, None, 0.0, True, -1, -1, 0.0, 0, False)
    assert "Eager" not in type(out2.grad_fn).__name__
    out2.backward(dout)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)
    for g, t in zip(grads, again):
        assert torch.equal(g, t.grad)


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device or build")
def test_cuda_current_stream():
    """Work is queued on torch's current stream: the result is ready after that stream syncs, on any device."""
    gen = torch.Generator().manual_seed(9)
    q, k, v = (make((2, 256, 8, 64), "float16", "cuda", gen) for _ in range(3))
    expected = flashattn.flash_attn_func(q, k, v, causal=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = flashattn.flash_attn_func(q, k, v, causal=True)
    stream.synchronize()
    assert torch.equal(out, expected)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                            is_causal=True).transpose(1, 2)
    assert (out.float() - sdpa.float()).abs().max().item() < 1e-2
    if torch.cuda.device_count() > 1:
        q1, k1, v1 = (t.to("cuda:1") for t in (q, k, v))
        assert torch.equal(flashattn.flash_attn_func(q1, k1, v1, causal=True).cpu(), expected.cpu())


def test_varlen_bounds_are_checked_on_the_cpu():
    """max_seqlen_q/k bound the sequences: the CPU reads cu_seqlens and refuses a bound below the longest."""
    q = torch.zeros(7, 2, 16)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    out = flashattn.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4)
    assert out.shape == q.shape
    with pytest.raises(ValueError, match="max_seqlen"):
        flashattn.flash_attn_varlen_func(q, q, q, cu, cu, 3, 4)


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device or build")
def test_cuda_varlen_graph_capture():
    """A varlen call on CUDA with device cu_seqlens and max_seqlen_q/k copies nothing to the host, so torch captures
    it in a CUDA graph (forward and backward); a replay after the lengths change in place equals the eager call."""
    gen = torch.Generator().manual_seed(13)
    q = make((101, 4, 64), "float16", "cuda", gen).requires_grad_()
    k = make((127, 2, 64), "float16", "cuda", gen).requires_grad_()
    v = make((127, 2, 64), "float16", "cuda", gen).requires_grad_()
    dout = make((101, 4, 64), "float16", "cuda", gen)
    cu_q = torch.tensor([0, 37, 37, 101], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 50, 63, 127], dtype=torch.int32, device="cuda")

    def step():
        q.grad = k.grad = v.grad = None
        out = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 64, 64, causal=True)
        out.backward(dout)
        return out

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up: sizes the workspace, as torch's graph recipe asks
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_g = step()
        grads_g = (q.grad, k.grad, v.grad)
    cu_q.copy_(torch.tensor([0, 64, 100, 101], dtype=torch.int32))
    cu_k.copy_(torch.tensor([0, 13, 77, 127], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    replayed = [out_g.clone()] + [g.clone() for g in grads_g]
    eager = step()
    for name, a, b in zip(("out", "dq", "dk", "dv"), replayed, [eager, q.grad, k.grad, v.grad]):
        assert torch.equal(a, b), f"{name}: the replay differs from the eager call"
    with pytest.raises(ValueError, match="max_seqlen_q"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            flashattn.flash_attn_varlen_func(q.detach(), k.detach(), v.detach(), cu_q, cu_k)
