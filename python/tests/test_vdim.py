"""v with a head_dim of its own (dv != dqk; MLA's 192 / 128, and 576 / 512 to decode): flash_attn_func,
flash_attn_varlen_func and flash_attn_with_kvcache, out with v's head_dim, the gradients of q, k, v against torch
autograd through a plain float64 reference; the numpy front end; the custom ops under opcheck and torch.compile."""
import numpy as np
import pytest
from conftest import assert_close
from reference import torch_attention

torch = pytest.importorskip("torch")
import flashattn  # noqa: E402
from flashattn import _capi  # noqa: E402

HAVE_CUDA = torch.cuda.is_available() and _capi.backend_available(_capi.BACKEND_CUDA)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device or build"))]
# (dtype, dqk, dv): each side larger; on CUDA the pair the mma.sync kernels take, and one only STANDARD runs
PAIRS = {"cpu": [("float32", 24, 16), ("bfloat16", 32, 48)],
         "cuda": [("bfloat16", 192, 128), ("float16", 64, 40)]}
OPTIONS = [dict(), dict(causal=True), dict(window_size=(5, 1), softcap=4.0), dict(softmax_scale=0.3, causal=True)]


def reference(q, k, v, **kw):
    """out [B, Sq, H, dv] and lse [B, H, Sq] in float64 with torch ops, differentiable in q, k, v."""
    return torch_attention(q, k, v, None, **kw)


def make(shape, dtype, device, gen):
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype=getattr(torch, dtype), device=device)


def f64(t):
    return t.detach().to("cpu", torch.float64).numpy()


def check_lse(got, ref, tag):
    """lse against the reference: -inf exactly where a row sees no key, within the bound elsewhere."""
    got, ref = f64(got), f64(ref)
    empty = np.isneginf(ref)
    assert np.array_equal(np.isneginf(got), empty), f"lse {tag}: -inf rows differ"
    assert_close(got[~empty], ref[~empty], "float32", f"lse {tag}", factor=10)


def check_grads(got, want, dtype, tag):
    for name, g, r in zip(("dq", "dk", "dv"), got, want):
        assert g is not None and g.shape == r.shape, f"{name} {tag}: no gradient or the wrong shape"
        assert_close(f64(g), f64(r), dtype, f"{name} {tag}", factor=2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("algo", ["standard", "flash1", "flash2", "auto"])
@pytest.mark.parametrize("kw", OPTIONS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()) or "plain")
def test_func(device, algo, kw):
    if device == "cuda" and algo == "flash1":
        pytest.skip("CUDA's flash1 takes one head_dim")
    pairs = PAIRS[device]
    if device == "cuda" and algo == "flash2":  # the pair CUDA's FLASH2 builds, forward and backward
        pairs = [p for p in pairs if p[1:] == (192, 128)]
    gen = torch.Generator().manual_seed(3)
    for dtype, d, dv in pairs:
        # Sq = Sk; Sq < Sk with GQA; Sq > Sk with MQA (causal: the first rows see no key)
        for b, sq, sk, hq, hk in [(2, 19, 19, 4, 4), (1, 11, 30, 6, 2), (1, 29, 9, 4, 1)]:
            q, k, v = (make(s, dtype, device, gen).requires_grad_() for s in
                       ((b, sq, hq, d), (b, sk, hk, d), (b, sk, hk, dv)))
            out, lse = flashattn.flash_attn_func(q, k, v, return_lse=True, algo=algo, **kw)
            assert out.shape == (b, sq, hq, dv) and out.dtype == q.dtype
            q64, k64, v64 = (t.detach().to(torch.float64).requires_grad_() for t in (q, k, v))
            ref, ref_lse = reference(q64, k64, v64, **kw)
            tag = f"{algo} {dtype} d={d}/{dv} {b}x{sq}x{sk}x{hq}/{hk}"
            assert_close(f64(out), f64(ref), dtype, f"out {tag}")
            check_lse(lse, ref_lse, tag)
            dout = make(out.shape, dtype, device, gen)
            out.backward(dout)
            ref.backward(dout.to(torch.float64))
            check_grads((q.grad, k.grad, v.grad), (q64.grad, k64.grad, v64.grad), dtype, tag)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen(device):
    """Packed sequences (one without keys, one without queries), v of its own head_dim, gradients."""
    gen = torch.Generator().manual_seed(9)
    dtype, d, dv = PAIRS[device][0]
    lq, lk, hq, hk = [5, 0, 9, 3], [7, 4, 0, 11], 4, 2
    cu_q = torch.tensor([0] + list(np.cumsum(lq)), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(np.cumsum(lk)), dtype=torch.int32, device=device)
    q = make((sum(lq), hq, d), dtype, device, gen).requires_grad_()
    k = make((sum(lk), hk, d), dtype, device, gen).requires_grad_()
    v = make((sum(lk), hk, dv), dtype, device, gen).requires_grad_()
    out, lse = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=True, return_lse=True)
    assert out.shape == (sum(lq), hq, dv)
    q64, k64, v64 = (t.detach().to(torch.float64).requires_grad_() for t in (q, k, v))
    outs, lses = [], []
    for i in range(len(lq)):
        a, e, c, f = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        o, l = reference(q64[None, a:e], k64[None, c:f], v64[None, c:f], causal=True)
        outs.append(o[0]), lses.append(l[0])
    ref, ref_lse = torch.cat(outs), torch.cat(lses, dim=1)
    assert_close(f64(out), f64(ref), dtype, "varlen out")
    check_lse(lse, ref_lse, "varlen")
    dout = make(out.shape, dtype, device, gen)
    out.backward(dout)
    ref.backward(dout.double())
    check_grads((q.grad, k.grad, v.grad), (q64.grad, k64.grad, v64.grad), dtype, "varlen")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_kvcache(device, paged, num_splits):
    """Decoding against a cache whose v has its own head_dim: MLA's absorbed (576, 512) with one K/V head, and a
    smaller pair with GQA and an append (on CUDA the pairs its kernel builds); against the reference over each
    sequence's keys after the append."""
    gen = torch.Generator().manual_seed(13)
    dtype = "float32" if device == "cpu" else "bfloat16"
    small = (64, 40) if device == "cpu" else (192, 128)
    for b, cap, hq, hk, d, dv, sq, append in [(2, 64, 16, 1, 576, 512, 1, False), (3, 96, 8, 2, *small, 2, True)]:
        q = make((b, sq, hq, d), dtype, device, gen)
        k_cache, v_cache = make((b, cap, hk, d), dtype, device, gen), make((b, cap, hk, dv), dtype, device, gen)
        k_new, v_new = (make((b, sq, hk, d), dtype, device, gen), make((b, sq, hk, dv), dtype, device, gen)) \
            if append else (None, None)
        lens = torch.tensor([0 if append else 1, 40, cap - sq][:b], dtype=torch.int32, device=device)
        kw, kc, vc = {}, k_cache, v_cache
        if paged:  # pages of 16 keys, the block table in reverse order
            per = cap // 16
            kc, vc = (t.reshape(b * per, 16, hk, t.shape[-1]) for t in (k_cache, v_cache))
            kw["block_table"] = torch.arange(b * per - 1, -1, -1, dtype=torch.int32, device=device).reshape(b, per)
            kc, vc = kc.flip(0).contiguous(), vc.flip(0).contiguous()
        out, lse = flashattn.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, causal=True,
                                                     num_splits=num_splits, return_softmax_lse=True, **kw)
        assert out.shape == (b, sq, hq, dv)
        if append:
            for i in range(b):
                at = int(lens[i])
                k_cache[i, at:at + sq], v_cache[i, at:at + sq] = k_new[i], v_new[i]
        for i in range(b):
            n = int(lens[i]) + (sq if append else 0)
            ref, ref_lse = reference(q[i:i + 1], k_cache[i:i + 1, :n], v_cache[i:i + 1, :n], causal=True)
            tag = f"kvcache {d}/{dv} paged={paged} splits={num_splits} seq {i}"
            assert_close(f64(out[i:i + 1]), np.nan_to_num(f64(ref)), dtype, f"out {tag}")
            assert_close(f64(lse[i:i + 1]), f64(ref_lse), "float32", f"lse {tag}", factor=10)


def test_numpy():
    """The numpy front end: forward, flashattn.backward and decoding with v of its own head_dim."""
    rng = np.random.default_rng(17)
    q = rng.standard_normal((2, 10, 4, 24), dtype=np.float32)
    k = rng.standard_normal((2, 14, 2, 24), dtype=np.float32)
    v = rng.standard_normal((2, 14, 2, 40), dtype=np.float32)
    dout = rng.standard_normal((2, 10, 4, 40), dtype=np.float32)
    out, lse = flashattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert out.shape == (2, 10, 4, 40)
    dq, dk, dv = flashattn.backward(dout, q, k, v, out, lse, causal=True)
    t = [torch.from_numpy(a).double().requires_grad_() for a in (q, k, v)]
    ref, ref_lse = reference(*t, causal=True)
    ref.backward(torch.from_numpy(dout).double())
    assert_close(out, f64(ref), "float32", "numpy out")
    check_lse(torch.from_numpy(lse), ref_lse, "numpy")
    for name, g, r in zip(("dq", "dk", "dv"), (dq, dk, dv), t):
        assert g.shape == r.shape
        assert_close(g, f64(r.grad), "float32", f"numpy {name}", factor=2)
    out_kv = flashattn.flash_attn_with_kvcache(q, k.copy(), v.copy(), causal=True)
    assert_close(out_kv, f64(ref), "float32", "numpy kvcache out")


def test_arguments():
    """A v head_dim the library does not take is FA_ERR_UNSUPPORTED naming v; nothing is computed."""
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(flashattn.UnsupportedError, match="v: head_dim 300"):
        flashattn.flash_attn_func(q, q, torch.randn(1, 4, 2, 300))
    with pytest.raises(flashattn.UnsupportedError, match="cache.v: head_dim 520"):
        flashattn.flash_attn_with_kvcache(torch.randn(1, 1, 2, 8), q.clone(), torch.randn(1, 4, 2, 520))


def test_opcheck_and_compile():
    gen = torch.Generator().manual_seed(21)
    q, k, v = (make(s, "float32", "cpu", gen).requires_grad_() for s in ((2, 9, 4, 32), (2, 12, 2, 32),
                                                                         (2, 12, 2, 24)))
    args = (q, k, v, None, None, 0.0, True, -1, -1, 0.0, 0, False)
    torch.library.opcheck(torch.ops.flashattn.fwd.default, args)
    out, lse = torch.ops.flashattn.fwd(*args)
    assert out.shape == (2, 9, 4, 24)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.flashattn.bwd.default, (dout, q.detach(), k.detach(), v.detach(), out.detach(),
                                                            lse.detach(), None, None, 0.0, True, -1, -1, 0.0, 0,
                                                            False))
    cache_k, cache_v = torch.randn(2, 16, 2, 32), torch.randn(2, 16, 2, 24)
    lens = torch.tensor([3, 16], dtype=torch.int32)
    torch.library.opcheck(torch.ops.flashattn.fwd_kvcache.default,
                          (q.detach()[:, :1], cache_k, cache_v, None, None, None, None, lens, None, None, 0.0, False,
                           -1, -1, 0.0, True, 0))

    def layer(q, k, v):
        return (flashattn.flash_attn_func(q, k, v, causal=True) ** 2).sum()

    loss = torch.compile(layer, fullgraph=True)(q, k, v)
    loss.backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    layer(q, k, v).backward()
    for g, t in zip(grads, (q, k, v)):
        assert torch.allclose(g, t.grad, rtol=1e-4, atol=1e-5)
