"""attention_chunk (FA3's; Llama 4's chunked local attention): a query sees only the keys of its own chunk of
attention_chunk positions, on top of causal and the window — flash_attn_func, flash_attn_varlen_func and
flash_attn_with_kvcache against float64 math, torch (CPU, CUDA when present; gradients) and numpy."""
import numpy as np
import pytest
from conftest import assert_close

torch = pytest.importorskip("torch")
import flashattn  # noqa: E402
import reference  # noqa: E402
from flashattn import _capi  # noqa: E402

HAVE_CUDA = torch.cuda.is_available() and _capi.backend_available(_capi.BACKEND_CUDA)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device or build"))]


def f64(t):
    return t.detach().to("cpu", torch.float64).numpy()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("algo", ["standard", "flash1", "flash2", "auto"])
@pytest.mark.parametrize("chunk,kw", [(8, dict()), (8, dict(causal=True)), (5, dict(causal=True, window_size=(3, -1))),
                                      (1, dict(causal=True)), (100, dict(causal=True)), (6, dict(window_size=(4, 4)))])
def test_chunk_against_reference(device, algo, chunk, kw):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    name = "float32" if device == "cpu" else "bfloat16"
    gen = torch.Generator().manual_seed(3)
    for b, sq, sk, hq, hk in [(2, 33, 33, 4, 2), (1, 13, 40, 2, 1), (1, 40, 13, 2, 2)]:
        r = lambda *s: torch.randn(*s, generator=gen).to(dtype=dtype, device=device).requires_grad_()  # noqa: E731
        q, k, v = r(b, sq, hq, 64), r(b, sk, hk, 64), r(b, sk, hk, 64)
        out, lse = flashattn.flash_attn_func(q, k, v, attention_chunk=chunk, return_lse=True, algo=algo, **kw)
        rk = dict(causal=kw.get("causal", False), window=kw.get("window_size", (-1, -1)), chunk=chunk)
        ref, ref_lse = reference.attention(f64(q), f64(k), f64(v), **rk)
        assert_close(f64(out), ref, name, f"out {sq}x{sk}")
        assert np.array_equal(np.isinf(f64(lse)), np.isinf(ref_lse))
        dout = torch.randn(out.shape, generator=gen).to(dtype=dtype, device=device)
        out.backward(dout)
        for t, rr, n in zip((q, k, v), reference.attention_backward(f64(dout), f64(q), f64(k), f64(v), **rk),
                            ("dq", "dk", "dv")):
            assert_close(f64(t.grad), rr, name, f"{n} {sq}x{sk}", factor=2)


def test_chunk_varlen_numpy_and_compile():
    gen = np.random.default_rng(8)
    lq, lk = [20, 0, 9], [25, 4, 9]
    q = gen.standard_normal((sum(lq), 2, 16)).astype(np.float32)
    k = gen.standard_normal((sum(lk), 1, 16)).astype(np.float32)
    v = gen.standard_normal((sum(lk), 1, 16)).astype(np.float32)
    cq, ck = (np.concatenate([[0], np.cumsum(s)]).astype(np.int32) for s in (lq, lk))
    out, lse = flashattn.flash_attn_varlen_func(q, k, v, cq, ck, causal=True, attention_chunk=4, return_lse=True)
    for s in range(3):
        if lq[s] == 0:
            continue
        ref, _ = reference.attention(q[None, cq[s]:cq[s + 1]], k[None, ck[s]:ck[s + 1]], v[None, ck[s]:ck[s + 1]],
                                     causal=True, chunk=4)
        assert_close(out[cq[s]:cq[s + 1]], ref[0], "float32", f"seq {s}")
    dq, dk, dv = flashattn.backward(np.ones_like(out), q, k, v, out, lse, causal=True, cu_seqlens_q=cq,
                                    cu_seqlens_k=ck, attention_chunk=4)
    assert np.isfinite(dq).all() and np.isfinite(dk).all()
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    f = lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True, attention_chunk=4)  # noqa: E731
    assert torch.equal(torch.compile(f, fullgraph=True)(tq[None], tk[None], tv[None]), f(tq[None], tk[None], tv[None]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("append", [True, False])
def test_chunk_kvcache(device, append):
    dtype = torch.float32 if device == "cpu" else torch.float16
    gen = torch.Generator().manual_seed(4)
    r = lambda *s: torch.randn(*s, generator=gen).to(dtype=dtype, device=device)  # noqa: E731
    q, kc, vc, kn, vn = r(3, 4, 4, 64), r(3, 60, 2, 64), r(3, 60, 2, 64), r(3, 4, 2, 64), r(3, 4, 2, 64)
    seqlens = torch.tensor([0, 17, 50], dtype=torch.int32, device=device)
    kc0, vc0 = kc.clone(), vc.clone()
    out = flashattn.flash_attn_with_kvcache(q, kc, vc, kn if append else None, vn if append else None,
                                            cache_seqlens=seqlens, causal=True, attention_chunk=8)
    name = "float32" if device == "cpu" else "float16"
    for b in range(3):
        n = int(seqlens[b])
        kb, vb = f64(kc0[b, :n]), f64(vc0[b, :n])
        if append:
            kb, vb = np.concatenate([kb, f64(kn[b])]), np.concatenate([vb, f64(vn[b])])
        if len(kb) == 0:  # no key: out 0
            assert not out[b].any()
            continue
        ref, _ = reference.attention(f64(q[b:b + 1]), kb[None], vb[None], causal=True, chunk=8)
        assert_close(f64(out[b:b + 1]), ref, name, f"seq {b}")


def test_chunk_errors():
    q = torch.randn(1, 4, 2, 16)
    with pytest.raises(flashattn.InvalidArgumentError, match="attention_chunk"):
        flashattn.flash_attn_func(q, q, q, attention_chunk=-2)
    with pytest.raises(flashattn.InvalidArgumentError, match="k_descale: given with a torch.float32 cache"):
        flashattn.flash_attn_with_kvcache(q, q, q, k_descale=torch.ones(1, 2))
