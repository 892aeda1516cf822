"""flash-attn's seqused_q / seqused_k in flash_attn_varlen_func (FA3's names): sequence i is its first seqused_q[i]
query rows against its first seqused_k[i] keys; the rest of each span is padding (out 0, lse -inf, zero gradients).
Against float64 math per sequence, torch (CPU, CUDA when present; autograd, torch.compile) and numpy."""
import numpy as np
import pytest
from conftest import assert_close

torch = pytest.importorskip("torch")
import flashattn  # noqa: E402
import reference  # noqa: E402
from flashattn import _capi  # noqa: E402

HAVE_CUDA = torch.cuda.is_available() and _capi.backend_available(_capi.BACKEND_CUDA)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device or build"))]

SPANS_Q, SPANS_K = [7, 0, 12, 9], [10, 5, 3, 16]
USED_Q, USED_K = [5, 0, 12, 0], [10, 2, 0, 9]


def f64(t):
    return t.detach().to("cpu", torch.float64).numpy()


def cu(lens, device):
    return torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device=device)


def packed_reference(q, k, v, dout, used_q, used_k, **kw):
    """out, lse [H, total], dq, dk, dv of the packed batch in float64, padding rows and keys zero."""
    q64, k64, v64, do64 = f64(q), f64(k), f64(v), f64(dout)
    out, lse = np.zeros_like(q64), np.full((q.shape[1], q.shape[0]), -np.inf)
    dq, dk, dv = np.zeros_like(q64), np.zeros_like(k64), np.zeros_like(v64)
    q0 = k0 = 0
    for sq, sk, uq, uk in zip(SPANS_Q, SPANS_K, used_q, used_k):
        if uq and uk:
            qs, ks, vs, dos = (a[None, s0:s0 + n] for a, s0, n in
                               ((q64, q0, uq), (k64, k0, uk), (v64, k0, uk), (do64, q0, uq)))
            o, l = reference.attention(qs, ks, vs, **kw)
            out[q0:q0 + uq], lse[:, q0:q0 + uq] = o[0], l[0]
            g = reference.attention_backward(dos, qs, ks, vs, **kw)
            dq[q0:q0 + uq], dk[k0:k0 + uk], dv[k0:k0 + uk] = g[0][0], g[1][0], g[2][0]
        q0, k0 = q0 + sq, k0 + sk
    return out, lse, dq, dk, dv


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(causal=True, window=(3, -1))],
                         ids=["plain", "causal", "causal-window"])
@pytest.mark.parametrize("which", ["q", "k", "both"])
def test_seqused_against_reference(device, kw, which):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    gen = torch.Generator().manual_seed(11)
    d, hq, hk = 64, 4, 2
    r = lambda *s: torch.randn(*s, generator=gen).to(dtype=dtype, device=device).requires_grad_()  # noqa: E731
    q, k, v = r(sum(SPANS_Q), hq, d), r(sum(SPANS_K), hk, d), r(sum(SPANS_K), hk, d)
    uq = USED_Q if which != "k" else SPANS_Q
    uk = USED_K if which != "q" else SPANS_K
    args = dict(seqused_q=torch.tensor(uq, dtype=torch.int32, device=device) if which != "k" else None,
                seqused_k=torch.tensor(uk, dtype=torch.int32, device=device) if which != "q" else None)
    out, lse = flashattn.flash_attn_varlen_func(q, k, v, cu(SPANS_Q, device), cu(SPANS_K, device), max(SPANS_Q),
                                                max(SPANS_K), causal=kw.get("causal", False),
                                                window_size=kw.get("window", (-1, -1)), return_lse=True, **args)
    dout = torch.randn(out.shape, generator=gen).to(dtype=dtype, device=device)
    out.backward(dout)
    ref = packed_reference(q, k, v, dout, uq, uk, **kw)
    name = "float32" if dtype == torch.float32 else "bfloat16"
    assert_close(f64(out), ref[0], name, "out")
    l64 = f64(lse)
    assert np.array_equal(np.isinf(l64), np.isinf(ref[1]))
    fin = np.isfinite(ref[1])
    assert_close(l64[fin], ref[1][fin], "float32", "lse", factor=10)
    for t, rr, n in zip((q, k, v), ref[2:], ("dq", "dk", "dv")):
        assert_close(f64(t.grad), rr, name, n, factor=2)


def test_seqused_numpy_and_compile():
    gen = np.random.default_rng(5)
    q = gen.standard_normal((sum(SPANS_Q), 2, 16)).astype(np.float32)
    k = gen.standard_normal((sum(SPANS_K), 2, 16)).astype(np.float32)
    v = gen.standard_normal((sum(SPANS_K), 2, 16)).astype(np.float32)
    cq, ck = (np.concatenate([[0], np.cumsum(s)]).astype(np.int32) for s in (SPANS_Q, SPANS_K))
    uq, uk = np.array(USED_Q, dtype=np.int32), np.array(USED_K, dtype=np.int32)
    out, lse = flashattn.flash_attn_varlen_func(q, k, v, cq, ck, causal=True, seqused_q=uq, seqused_k=uk,
                                                return_lse=True)
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    want = flashattn.flash_attn_varlen_func(tq, tk, tv, torch.from_numpy(cq), torch.from_numpy(ck), causal=True,
                                            seqused_q=torch.from_numpy(uq), seqused_k=torch.from_numpy(uk))
    assert np.array_equal(out, want.numpy())
    dq, dk, dv = flashattn.backward(np.ones_like(out), q, k, v, out, lse, causal=True, cu_seqlens_q=cq,
                                    cu_seqlens_k=ck, seqused_q=uq, seqused_k=uk)
    assert not dq[5:7].any() and not dk[17:20].any()  # padding rows, padding keys

    def f(q, k, v, cq, ck, uq, uk):
        return flashattn.flash_attn_varlen_func(q, k, v, cq, ck, max(SPANS_Q), max(SPANS_K), causal=True,
                                                seqused_q=uq, seqused_k=uk)
    got = torch.compile(f, fullgraph=True)(tq, tk, tv, torch.from_numpy(cq), torch.from_numpy(ck),
                                           torch.from_numpy(uq), torch.from_numpy(uk))
    assert torch.equal(got, want)


def test_seqused_errors():
    q = torch.randn(sum(SPANS_Q), 2, 16)
    k = torch.randn(sum(SPANS_K), 2, 16)
    cq, ck = cu(SPANS_Q, "cpu"), cu(SPANS_K, "cpu")
    with pytest.raises(flashattn.InvalidArgumentError, match="seqused_k: expected an int32 \\[4\\]"):
        flashattn.flash_attn_varlen_func(q, k, k, cq, ck, seqused_k=torch.ones(4))
    with pytest.raises(flashattn.InvalidArgumentError, match="seqused_q\\[0\\] = 8"):
        flashattn.flash_attn_varlen_func(q, k, k, cq, ck, seqused_q=torch.tensor([8, 0, 0, 0], dtype=torch.int32))
    with pytest.raises(flashattn.InvalidArgumentError, match="without cu_seqlens"):
        flashattn._torch.attention(q[None], k[None], k[None], None, None, flashattn._capi.options(
            None, False, (-1, -1), 0.0, "auto", False) + (0, 0), True, None,
            (torch.zeros(1, dtype=torch.int32), None, 0, None, None, None))
