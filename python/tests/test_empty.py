"""Zero extents are valid calls (docs/python.md): batch 0, seqlen_q 0, seqlen_k 0, varlen batches without keys (FA3's
test at seqlen 4096 makes every key sequence empty) or without sequences, KV-cache calls without sequences or keys.
torch gives such tensors a NULL data pointer; the outputs are out = 0, lse = -inf and zero gradients."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import flashattn  # noqa: E402
from flashattn import _capi  # noqa: E402

HAVE_CUDA = torch.cuda.is_available() and _capi.backend_available(_capi.BACKEND_CUDA)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device or build"))]
DT = {"cpu": torch.float32, "cuda": torch.float16}


def leaf(shape, device):
    return torch.randn(shape).to(DT[device]).to(device).requires_grad_()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b,sq,sk", [(0, 5, 7), (2, 0, 7), (2, 5, 0), (0, 0, 0)])
@pytest.mark.parametrize("algo", ["auto", "flash2", "standard"])
def test_zero_extents(device, b, sq, sk, algo):
    q, k, v = leaf((b, sq, 4, 64), device), leaf((b, sk, 2, 64), device), leaf((b, sk, 2, 64), device)
    out, lse = flashattn.flash_attn_func(q, k, v, causal=True, return_lse=True, algo=algo)
    assert out.shape == q.shape and lse.shape == (b, 4, sq)
    assert torch.count_nonzero(out) == 0 and bool(torch.all(lse == -float("inf")))
    out.backward(torch.ones_like(out))
    for t in (q, k, v):
        assert t.grad.shape == t.shape and torch.count_nonzero(t.grad) == 0


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_without_keys(device):
    """FA3's varlen test at seqlen 4096, batch 2: every key sequence empty (total_k = 0)."""
    q = leaf((9, 4, 64), device)
    k, v = leaf((0, 2, 64), device), leaf((0, 2, 64), device)
    cu_q = torch.tensor([0, 4, 9], dtype=torch.int32, device=device)
    cu_k = torch.zeros(3, dtype=torch.int32, device=device)
    out, lse = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 0, causal=True, return_lse=True)
    assert torch.count_nonzero(out) == 0 and bool(torch.all(lse == -float("inf")))
    out.sum().backward()
    assert torch.count_nonzero(q.grad) == 0 and k.grad.shape == (0, 2, 64)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_without_sequences(device):
    q, k = leaf((0, 4, 64), device), leaf((0, 2, 64), device)
    cu = torch.zeros(1, dtype=torch.int32, device=device)
    out = flashattn.flash_attn_varlen_func(q, k, k, cu, cu, 0, 0)
    assert out.shape == (0, 4, 64)


@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_empty(device):
    dt = DT[device] if device == "cpu" else torch.float16
    cache = torch.zeros(2, 8, 2, 64, dtype=dt, device=device)
    # no sequence
    q = torch.zeros(0, 1, 4, 64, dtype=dt, device=device)
    out, lse = flashattn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=torch.zeros(0, dtype=torch.int32,
                                                 device=device), return_softmax_lse=True)
    assert out.shape == (0, 1, 4, 64) and lse.shape == (0, 4, 1)
    # a cache of no keys: out = 0, lse = -inf
    empty = torch.zeros(2, 0, 2, 64, dtype=dt, device=device)
    q = torch.randn(2, 1, 4, 64).to(dt).to(device)
    out, lse = flashattn.flash_attn_with_kvcache(q, empty, empty, cache_seqlens=0, return_softmax_lse=True)
    assert torch.count_nonzero(out) == 0 and bool(torch.all(lse == -float("inf")))


def test_numpy_zero_extents():
    q = np.zeros((2, 3, 4, 8), np.float32)
    k = np.zeros((2, 0, 2, 8), np.float32)
    out, lse = flashattn.flash_attn_func(q, k, k, return_lse=True)
    assert not out.any() and np.all(lse == -np.inf)
    dq, dk, dv = flashattn.backward(np.ones_like(out), q, k, k, out, lse)
    assert not dq.any() and dk.shape == k.shape
