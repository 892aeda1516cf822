"""flash_attn_with_kvcache from FP8 (torch.float8_e4m3fn) caches with k_descale / v_descale (float32 [batch,
kv_heads], flash-attn's), on the CPU and on CUDA: against plain torch math on the dequantised cache in float64
(contiguous and paged, with and without the append, whose new rows the library quantises with the descale), and the
argument errors. CUDA decodes f16 and bf16 queries at its built head dims (64, 128 here)."""
import numpy as np
import pytest

from conftest import assert_close

torch = pytest.importorskip("torch")
import flashattn  # noqa: E402
from flashattn import _capi  # noqa: E402

FP8 = getattr(torch, "float8_e4m3fn", None)
pytestmark = pytest.mark.skipif(FP8 is None, reason="this torch has no float8_e4m3fn")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
HAVE_CUDA = torch.cuda.is_available() and _capi.backend_available(_capi.BACKEND_CUDA)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device or build"))]


def quantised(x, descale):
    """x [rows, s, kv_heads, d] / descale [rows, kv_heads] as E4M3 (descales are powers of two: the division is
    exact, so torch's rounding is the library's)."""
    return (x.float() / descale[:, None, :, None]).to(FP8)


def dequantised(x8, descale):
    return x8.to(torch.float64) * descale[:, None, :, None].to(torch.float64)


def torch_reference(q, kf, vf, scale, causal):
    """out [b, sq, h, d] float64 from plain torch: q [b, sq, h, d], kf/vf [b, n, kv_heads, d] float64, GQA by
    repetition, causal bottom-right."""
    q = q.to(torch.float64)
    g = q.shape[2] // kf.shape[2]
    k, v = kf.repeat_interleave(g, dim=2), vf.repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        sq, n = q.shape[1], k.shape[1]
        seen = torch.arange(n)[None, :] <= torch.arange(sq)[:, None] + (n - sq)
        s = s.masked_fill(~seen, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("append", [False, True])
@pytest.mark.parametrize("page", [0, 16])
@pytest.mark.parametrize("d", [128, 64, 40])
def test_against_dequantised_cache(device, dtype, append, page, d):
    if device == "cuda" and (dtype == "float32" or d == 40):
        pytest.skip("CUDA KV-cache attention: f16 / bf16 queries, head dims 64, 80, 96, 128, 256")
    gen = torch.Generator().manual_seed(7)
    b, sq, hq, hk, cap, n = 2, 2, 8, 2, 64, 45
    q = torch.randn(b, sq, hq, d, generator=gen).to(DTYPES[dtype])
    kd = torch.pow(2.0, torch.randint(-6, -2, (b, hk), generator=gen).float())
    vd = torch.pow(2.0, torch.randint(-6, -2, (b, hk), generator=gen).float())
    k8 = quantised(torch.randn(b, cap, hk, d, generator=gen), kd)
    v8 = quantised(torch.randn(b, cap, hk, d, generator=gen), vd)
    kn = vn = None
    if append:
        kn = torch.randn(b, sq, hk, d, generator=gen).to(DTYPES[dtype])
        vn = torch.randn(b, sq, hk, d, generator=gen).to(DTYPES[dtype])
    ref_k, ref_v = dequantised(k8, kd), dequantised(v8, vd)  # before the append writes into k8, v8
    if append:  # the library quantises the new rows with the sequence's descale, as quantised() does
        kq, vq = quantised(kn, kd), quantised(vn, vd)
        ref_k[:, n:n + sq], ref_v[:, n:n + sq] = dequantised(kq, kd), dequantised(vq, vd)
    L = n + sq if append else n
    seqlens = torch.full((b,), n if append else L, dtype=torch.int32)
    kc, vc, table = k8, v8, None
    if page:  # the same cache as pages of 16 in a shuffled order
        per = cap // page
        perm = torch.randperm(b * per, generator=gen)
        table = perm.reshape(b, per).to(torch.int32)
        kc = torch.empty(b * per, page, hk, d, dtype=FP8)
        vc = torch.empty_like(kc)
        kc.view(torch.uint8)[perm] = k8.view(torch.uint8).reshape(b * per, page, hk, d)
        vc.view(torch.uint8)[perm] = v8.view(torch.uint8).reshape(b * per, page, hk, d)

    def dev(x):
        return None if x is None else x.to(device)

    kc, vc = dev(kc), dev(vc)  # written by the append: read back below
    out = flashattn.flash_attn_with_kvcache(dev(q), kc, vc, dev(kn), dev(vn), cache_seqlens=dev(seqlens),
                                           block_table=dev(table), causal=True, k_descale=dev(kd), v_descale=dev(vd))
    ref = torch_reference(q, ref_k[:, :L], ref_v[:, :L], d ** -0.5, causal=True)
    assert out.dtype == q.dtype and out.shape == q.shape and out.device == kc.device
    assert_close(out.cpu().to(torch.float64).numpy(), ref.numpy(), dtype, "out")
    kc = kc.cpu()
    if append:  # the new rows, quantised, and nothing else of the cache written
        got_k = kc.view(torch.uint8)[table.long()].reshape(b, cap, hk, d) if page else kc.view(torch.uint8)
        want = k8.view(torch.uint8).clone() if page else None
        if not page:
            assert torch.equal(got_k[:, n:n + sq], kq.view(torch.uint8))
        else:
            want[:, n:n + sq] = kq.view(torch.uint8)
            assert torch.equal(got_k, want)


def test_descales_default_to_one():
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 1, 4, 64, generator=gen)
    one = torch.ones(1, 2)
    k8 = quantised(torch.randn(1, 20, 2, 64, generator=gen), one)
    v8 = quantised(torch.randn(1, 20, 2, 64, generator=gen), one)
    a = flashattn.flash_attn_with_kvcache(q, k8, v8, k_descale=one, v_descale=one)
    b = flashattn.flash_attn_with_kvcache(q, k8, v8)
    assert torch.equal(a, b)


def test_errors():
    q = torch.randn(2, 1, 4, 32)
    k8 = torch.zeros(2, 8, 2, 32).to(FP8)
    with pytest.raises(flashattn.InvalidArgumentError, match=r"k_descale: expected a float32 \[2, 2\] tensor"):
        flashattn.flash_attn_with_kvcache(q, k8, k8, k_descale=torch.ones(2))
    with pytest.raises(flashattn.InvalidArgumentError, match="v_descale: expected a float32"):
        flashattn.flash_attn_with_kvcache(q, k8, k8, v_descale=torch.ones(2, 2, dtype=torch.float64))
    with pytest.raises(flashattn.InvalidArgumentError, match="descales go with a float8_e4m3fn cache"):
        flashattn.flash_attn_with_kvcache(q, q.new_zeros(2, 8, 2, 32), q.new_zeros(2, 8, 2, 32),
                                          k_descale=torch.ones(2, 2))
    with pytest.raises(flashattn.UnsupportedError, match="q_descale"):
        flashattn.flash_attn_with_kvcache(q, k8, k8, q_descale=torch.ones(2, 2))
    with pytest.raises(flashattn.InvalidArgumentError, match=r"k_descale\[1\]\[0\]"):  # the C library's check
        flashattn.flash_attn_with_kvcache(q, k8, k8, k_descale=torch.tensor([[1.0, 1.0], [0.0, 1.0]]))
    with pytest.raises(flashattn.UnsupportedError, match="numpy"):
        flashattn.flash_attn_with_kvcache(q.numpy(), q.numpy(), q.numpy(), k_descale=np.ones((2, 2), np.float32))


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device or build")
def test_cuda_matches_the_cpu():
    """The same call on both devices (GQA, 3 new rows, 700 keys in splits): CUDA's out within bf16's rounding of the
    CPU's, the appended bytes equal (one rounding rule)."""
    gen = torch.Generator().manual_seed(11)
    b, sq, hq, hk, d, cap, n = 3, 3, 16, 4, 128, 800, 700
    q = torch.randn(b, sq, hq, d, generator=gen).to(torch.bfloat16)
    kd, vd = torch.rand(b, hk, generator=gen) * 0.03 + 0.02, torch.rand(b, hk, generator=gen) * 0.03 + 0.02
    k8 = quantised(torch.randn(b, cap, hk, d, generator=gen), kd)
    v8 = quantised(torch.randn(b, cap, hk, d, generator=gen), vd)
    kn = torch.randn(b, sq, hk, d, generator=gen).to(torch.bfloat16)
    vn = torch.randn(b, sq, hk, d, generator=gen).to(torch.bfloat16)
    seqlens = torch.tensor([n, 5, 0], dtype=torch.int32)
    outs, caches = [], []
    for device in ("cpu", "cuda"):
        kc, vc = k8.clone().to(device), v8.clone().to(device)
        outs.append(flashattn.flash_attn_with_kvcache(q.to(device), kc, vc, kn.to(device), vn.to(device),
                                                      cache_seqlens=seqlens.to(device), causal=True,
                                                      k_descale=kd.to(device), v_descale=vd.to(device),
                                                      num_splits=3).cpu())
        caches.append((kc.cpu().view(torch.uint8), vc.cpu().view(torch.uint8)))
    assert_close(outs[1].to(torch.float64).numpy(), outs[0].to(torch.float64).numpy(), "bfloat16", "out")
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
