"""FP8 (torch.float8_e4m3fn) q, k, v with flash-attn's q_descale / k_descale / v_descale ([batch, heads_k] float32)
through flash_attn_func and flash_attn_varlen_func: the forward against float64 math on the dequantized inputs (out
bfloat16), every CPU algorithm; the backward and the KV cache refused clearly; CUDA refuses FP8 for now."""
import numpy as np
import pytest
from conftest import assert_close

torch = pytest.importorskip("torch")
import flashattn  # noqa: E402
import reference  # noqa: E402
from flashattn import _capi  # noqa: E402

FP8 = getattr(torch, "float8_e4m3fn", None)
pytestmark = pytest.mark.skipif(FP8 is None, reason="torch without float8_e4m3fn")
HAVE_CUDA = torch.cuda.is_available() and _capi.backend_available(_capi.BACKEND_CUDA)


def quantize(x, heads_k):
    """x [b, s, h, d] float32 -> (fp8, descale [b, heads_k]): one scale per (batch, K/V head group)."""
    b, s, h, d = x.shape
    g = x.reshape(b, s, heads_k, h // heads_k, d)
    amax = g.abs().amax(dim=(1, 3, 4)).clamp(min=1e-12)
    scale = (amax / 448.0).to(torch.float32)
    q = (g / scale[:, None, :, None, None]).reshape(b, s, h, d).to(FP8)
    return q, scale


def dequant(x8, scale, heads_k):
    b, s, h, d = x8.shape
    g = x8.to(torch.float64).reshape(b, s, heads_k, h // heads_k, d) * scale.double()[:, None, :, None, None]
    return g.reshape(b, s, h, d).numpy()


@pytest.mark.parametrize("algo", ["standard", "flash1", "flash2", "auto"])
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_forward(algo, causal):
    g = torch.Generator().manual_seed(9)
    q32, k32, v32 = (torch.randn(2, s, h, 64, generator=g) * 3 for s, h in ((13, 4), (29, 2), (29, 2)))
    (q, qd), (k, kd), (v, vd) = quantize(q32, 2), quantize(k32, 2), quantize(v32, 2)
    out, lse = flashattn.flash_attn_func(q, k, v, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd, algo=algo,
                                         return_lse=True)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape and lse.shape == (2, 4, 13)
    ref, ref_lse = reference.attention(dequant(q, qd, 2), dequant(k, kd, 2), dequant(v, vd, 2), causal=causal)
    assert_close(out.to(torch.float64).numpy(), ref, "bfloat16", "out")
    assert_close(lse.double().numpy(), ref_lse, "float32", "lse", factor=10)


def test_fp8_varlen_and_refusals():
    g = torch.Generator().manual_seed(4)
    q, qd = quantize(torch.randn(1, 20, 2, 32, generator=g), 1)
    k, kd = quantize(torch.randn(1, 25, 1, 32, generator=g), 1)
    cq = torch.tensor([0, 8, 20], dtype=torch.int32)
    ck = torch.tensor([0, 10, 25], dtype=torch.int32)
    desc = torch.stack([qd[0], qd[0]])  # [n_seqs, heads_k]
    out = flashattn.flash_attn_varlen_func(q[0], k[0], k[0], cq, ck, 12, 15, q_descale=desc)
    assert out.dtype == torch.bfloat16 and out.shape == q[0].shape
    with pytest.raises(flashattn.InvalidArgumentError, match="q_descale: expected a float32 \\[2, 1\\]"):
        flashattn.flash_attn_varlen_func(q[0], k[0], k[0], cq, ck, q_descale=qd)
    with pytest.raises(flashattn.InvalidArgumentError, match="descales go with float8_e4m3fn"):
        flashattn.flash_attn_func(torch.randn(1, 4, 2, 32), torch.randn(1, 4, 2, 32), torch.randn(1, 4, 2, 32),
                                  q_descale=torch.ones(1, 2))
    with pytest.raises(flashattn.InvalidArgumentError, match="k_descale: given with a torch.float32 cache"):
        flashattn.flash_attn_with_kvcache(torch.randn(1, 1, 2, 32), torch.randn(1, 8, 2, 32),
                                          torch.randn(1, 8, 2, 32), k_descale=torch.ones(1, 2))


def test_fp8_backward_refused():
    g = torch.Generator().manual_seed(1)
    q, qd = quantize(torch.randn(1, 6, 2, 32, generator=g), 2)
    q.requires_grad_()
    out = flashattn.flash_attn_func(q, q, q, q_descale=qd, k_descale=qd, v_descale=qd)
    assert torch.isfinite(out.float()).all()
    with pytest.raises(flashattn.UnsupportedError, match="FP8 inputs are forward only"):
        out.float().sum().backward()


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device or build")
def test_fp8_cuda_refused_with_a_reason():
    q = torch.zeros(1, 4, 2, 64, device="cuda").to(FP8)
    with pytest.raises(flashattn.UnsupportedError):
        flashattn.flash_attn_func(q, q, q)
