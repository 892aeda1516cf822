"""flash_attn_with_kvcache beyond one query-row count: k/v with a number of rows other than q's, cache_leftpad,
packed queries (cu_seqlens_q, max_seqlen_q) and packed new keys (cu_seqlens_k_new); and paged prefill —
flash_attn_varlen_func with block_table / page_table and seqused_k (vLLM's chunked prefill) — against float64 math
(torch and numpy on the CPU; CUDA: paged prefill through its gathered copy, the others refused with a reason)."""
import numpy as np
import pytest
from conftest import assert_close

torch = pytest.importorskip("torch")
import flashattn  # noqa: E402
import reference  # noqa: E402
from flashattn import _capi  # noqa: E402

HAVE_CUDA = torch.cuda.is_available() and _capi.backend_available(_capi.BACKEND_CUDA)
CUDA = pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device or build")


def f64(t):
    return t.detach().to("cpu", torch.float64).numpy() if isinstance(t, torch.Tensor) else np.asarray(t, np.float64)


def seq_ref(q, keys, vals, **kw):
    """out [S, H, D] of one sequence (float64)."""
    if len(keys) == 0:
        return np.zeros(q.shape)
    return reference.attention(q[None], keys[None], vals[None], **kw)[0][0]


@pytest.mark.parametrize("sq,sn", [(4, 1), (1, 5), (3, 3)])
@pytest.mark.parametrize("leftpad", [False, True])
def test_rows_and_leftpad(sq, sn, leftpad):
    g = torch.Generator().manual_seed(2)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    q, kc, vc, kn, vn = r(3, sq, 4, 32), r(3, 40, 2, 32), r(3, 40, 2, 32), r(3, sn, 2, 32), r(3, sn, 2, 32)
    seqlens = torch.tensor([0, 12, 30], dtype=torch.int32)
    lp = torch.tensor([0, 5, 30], dtype=torch.int32) if leftpad else None
    kc0, vc0 = kc.clone(), vc.clone()
    out = flashattn.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens, causal=True, cache_leftpad=lp)
    for b in range(3):
        n, p = int(seqlens[b]), int(lp[b]) if leftpad else 0
        keys = np.concatenate([f64(kc0[b, p:n]), f64(kn[b])])
        vals = np.concatenate([f64(vc0[b, p:n]), f64(vn[b])])
        assert_close(f64(out[b]), seq_ref(f64(q[b]), keys, vals, causal=True), "float32", f"seq {b}")
        assert torch.equal(kc[b, n:n + sn], kn[b])


def test_varlen_queries_and_new_keys():
    g = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    lq, ln = [3, 0, 6], [2, 4, 6]
    cq = torch.tensor([0, 3, 3, 9], dtype=torch.int32)
    cn = torch.tensor([0, 2, 6, 12], dtype=torch.int32)
    q, kc, vc, kn, vn = r(9, 4, 32), r(3, 30, 2, 32), r(3, 30, 2, 32), r(12, 2, 32), r(12, 2, 32)
    seqlens = torch.tensor([5, 0, 17], dtype=torch.int32)
    kc0, vc0 = kc.clone(), vc.clone()
    out, lse = flashattn.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens, causal=True,
                                                 window_size=(4, -1), cu_seqlens_q=cq, cu_seqlens_k_new=cn,
                                                 max_seqlen_q=6, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (4, 9)
    for b in range(3):
        if lq[b] == 0:
            continue
        n = int(seqlens[b])
        keys = np.concatenate([f64(kc0[b, :n]), f64(kn[cn[b]:cn[b + 1]])])
        vals = np.concatenate([f64(vc0[b, :n]), f64(vn[cn[b]:cn[b + 1]])])
        want = seq_ref(f64(q[cq[b]:cq[b + 1]]), keys, vals, causal=True, window=(4, -1))
        assert_close(f64(out[cq[b]:cq[b + 1]]), want, "float32", f"seq {b}")
    # numpy gives the same
    kc2, vc2 = kc0.numpy().copy(), vc0.numpy().copy()
    got = flashattn.flash_attn_with_kvcache(q.numpy(), kc2, vc2, kn.numpy(), vn.numpy(), cache_seqlens=seqlens.numpy(),
                                            causal=True, window_size=(4, -1), cu_seqlens_q=cq.numpy(),
                                            cu_seqlens_k_new=cn.numpy(), max_seqlen_q=6)
    assert np.array_equal(got, out.numpy())


def paged(kc, page, seed=1):
    """A contiguous cache [B, cap, h, d] as shuffled pages and its block table."""
    b, cap = kc.shape[0], kc.shape[1]
    per = cap // page
    perm = torch.randperm(b * per, generator=torch.Generator().manual_seed(seed))
    pages = torch.empty(b * per, page, *kc.shape[2:], dtype=kc.dtype, device=kc.device)
    pages[perm] = kc.reshape(b * per, page, *kc.shape[2:])
    return pages, perm.reshape(b, per).to(torch.int32).to(kc.device)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("name", ["block_table", "page_table"])
def test_paged_prefill(device, name):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(5)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype=dtype, device=device)  # noqa: E731
    lq, used = [5, 0, 12], [20, 7, 48]
    cq = torch.tensor([0, 5, 5, 17], dtype=torch.int32, device=device)
    q, kc, vc = r(17, 4, 64), r(3, 48, 2, 64), r(3, 48, 2, 64)
    kp, table = paged(kc, 16)
    vp, _ = paged(vc, 16)
    seqused = torch.tensor(used, dtype=torch.int32, device=device)
    out = flashattn.flash_attn_varlen_func(q, kp, vp, cq, None, 12, 48, causal=True, seqused_k=seqused,
                                           **{name: table})
    name_dt = "float32" if device == "cpu" else "bfloat16"
    for b in range(3):
        if lq[b]:
            want = seq_ref(f64(q[cq[b]:cq[b + 1]]), f64(kc[b, :used[b]]), f64(vc[b, :used[b]]), causal=True)
            assert_close(f64(out[cq[b]:cq[b + 1]]), want, name_dt, f"seq {b}")
    # FA2's form: the key lengths from cu_seqlens_k
    ck = torch.tensor([0, 20, 27, 75], dtype=torch.int32, device=device)
    assert torch.equal(flashattn.flash_attn_varlen_func(q, kp, vp, cq, ck, 12, 48, causal=True, block_table=table),
                       out)


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device or build")
def test_cuda_refuses_with_a_reason():
    q, kc = torch.randn(2, 3, 4, 64, device="cuda", dtype=torch.float16), torch.zeros(2, 32, 2, 64, device="cuda",
                                                                                     dtype=torch.float16)
    with pytest.raises(flashattn.UnsupportedError, match="cache_leftpad"):
        flashattn.flash_attn_with_kvcache(q, kc, kc.clone(), cache_seqlens=4,
                                          cache_leftpad=torch.zeros(2, dtype=torch.int32, device="cuda"))
