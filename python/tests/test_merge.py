"""merge_states with flash_attn_combine's shapes: up to 133 states and head_dim 512 (flash-attn's combine tests), fp32
partials, some states empty (lse -inf), against float64 math on the same values; numpy and torch alike."""
import numpy as np
import pytest

from conftest import assert_close

torch = pytest.importorskip("torch")
import flashattn  # noqa: E402
from flashattn import _capi  # noqa: E402

HAVE_CUDA = torch.cuda.is_available() and _capi.backend_available(_capi.BACKEND_CUDA)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device or build"))]


def reference(outs, lses):
    o = np.stack([np.asarray(x, dtype=np.float64) for x in outs])         # [n, b, s, h, d]
    l = np.stack([np.asarray(x, dtype=np.float64) for x in lses])         # [n, b, h, s]
    m = l.max(axis=0)
    w = np.where(np.isneginf(l), 0.0, np.exp(l - np.where(np.isneginf(m), 0.0, m)))
    s = w.sum(axis=0)
    lse = np.where(s > 0, m + np.log(np.where(s > 0, s, 1.0)), -np.inf)
    w = np.where(s > 0, w / np.where(s > 0, s, 1.0), 0.0).transpose(0, 1, 3, 2)[..., None]  # [n, b, s, h, 1]
    return (w * o).sum(axis=0), lse


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,d", [(1, 64), (33, 128), (133, 512), (70, 257)])
def test_many_states(device, n, d):
    gen = np.random.default_rng(n * 1000 + d)
    b, s, h = 2, 3, 2
    outs = [gen.standard_normal((b, s, h, d)).astype(np.float32) for _ in range(n)]
    lses = [(gen.uniform(-6, 6, (b, h, s)) if gen.integers(7) else np.full((b, h, s), -np.inf)).astype(np.float32)
            for _ in range(n)]
    ref, ref_lse = reference(outs, lses)
    if device == "cpu" and n % 2:  # the numpy front
        out, lse = flashattn.merge_states(outs, lses)
    else:
        out, lse = flashattn.merge_states([torch.from_numpy(x).to(device) for x in outs],
                                          [torch.from_numpy(x).to(device) for x in lses])
        out, lse = out.cpu().numpy(), lse.cpu().numpy()
    assert_close(out, ref, "float32", "out")
    empty = np.isneginf(ref_lse)
    assert (np.isneginf(lse) == empty).all()
    assert_close(np.where(empty, 0, lse), np.where(empty, 0, ref_lse), "float32", "lse", factor=10)
