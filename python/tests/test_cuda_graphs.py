"""CUDA graph capture of the binding's calls (flash_attn_func, flash_attn_varlen_func with max_seqlen_q/k, and
flash_attn_with_kvcache with its append), replayed on new inputs written into the captured buffers: the replays
equal eager calls. Skipped without CUDA (scripts/test-gpu.sh runs `pytest -k cuda`)."""
import pytest

torch = pytest.importorskip("torch")
import flashattn  # noqa: E402
from flashattn import _capi  # noqa: E402

HAVE_CUDA = torch.cuda.is_available() and _capi.backend_available(_capi.BACKEND_CUDA)
pytestmark = pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device or build")


def capture(fn):
    """fn() captured in a CUDA graph after a warm-up on a side stream (workspace grown before capture)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def randn(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def test_cuda_graph_plain():
    q, k, v = randn(2, 128, 8, 128), randn(2, 128, 8, 128), randn(2, 128, 8, 128)
    g, out = capture(lambda: flashattn.flash_attn_func(q, k, v, causal=True))
    for _ in range(2):
        q.copy_(randn(*q.shape)), k.copy_(randn(*k.shape)), v.copy_(randn(*v.shape))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, flashattn.flash_attn_func(q, k, v, causal=True))


def test_cuda_graph_varlen():
    cu = torch.tensor([0, 37, 37, 200], dtype=torch.int32, device="cuda")
    q, k, v = randn(200, 8, 64), randn(200, 2, 64), randn(200, 2, 64)
    call = lambda: flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 163, 163, causal=True)  # noqa: E731
    g, out = capture(call)
    for lens in ([0, 100, 150, 200], [0, 1, 40, 200]):
        cu.copy_(torch.tensor(lens, dtype=torch.int32))  # new lengths within the bounds
        q.copy_(randn(*q.shape))
        g.replay()
        torch.cuda.synchronize()
        want = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 198, 198, causal=True)
        assert torch.equal(out, want)


def test_cuda_graph_kvcache():
    q, kn, vn = randn(4, 1, 8, 128), randn(4, 1, 2, 128), randn(4, 1, 2, 128)
    kc, vc = randn(4, 512, 2, 128), randn(4, 512, 2, 128)
    seqlens = torch.tensor([0, 10, 200, 511], dtype=torch.int32, device="cuda")
    call = lambda: flashattn.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens, causal=True)  # noqa
    g, out = capture(call)
    for step in range(3):
        seqlens.copy_(torch.tensor([step, 10 + step, 200 + step, 500 + step], dtype=torch.int32))
        q.copy_(randn(*q.shape)), kn.copy_(randn(*kn.shape)), vn.copy_(randn(*vn.shape))
        g.replay()
        torch.cuda.synchronize()
        kc2, vc2 = kc.clone(), vc.clone()
        want = flashattn.flash_attn_with_kvcache(q, kc2, vc2, kn, vn, cache_seqlens=seqlens, causal=True)
        assert torch.equal(out, want) and torch.equal(kc, kc2)
    flashattn.kvcache_check("cuda")
