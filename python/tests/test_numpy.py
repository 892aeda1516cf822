"""numpy arrays on the CPU, without torch."""
import subprocess
import sys

import numpy as np
import pytest
from conftest import assert_close

import flashattn
import reference


def qkv(rng, b, sq, sk, hq, hk, d, dtype=np.float32):
    return (rng.standard_normal((b, sq, hq, d)).astype(dtype), rng.standard_normal((b, sk, hk, d)).astype(dtype),
            rng.standard_normal((b, sk, hk, d)).astype(dtype))


@pytest.mark.parametrize("algo", ["standard", "flash1", "flash2"])
@pytest.mark.parametrize("causal,window,softcap", [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0),
                                                   (False, (5, 3), 0.0), (True, (-1, -1), 2.0)])
def test_forward_backward(rng, algo, causal, window, softcap):
    q, k, v = qkv(rng, 2, 19, 27, 4, 2, 16)
    kw = dict(causal=causal, window_size=window, softcap=softcap, algo=algo)
    out, lse = flashattn.flash_attn_func(q, k, v, return_lse=True, **kw)
    ref, ref_lse = reference.attention(q, k, v, causal=causal, window=window, softcap=softcap)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (2, 4, 19)
    assert_close(out, ref, "float32", "out")
    assert_close(lse, ref_lse, "float32", "lse")
    dout = rng.standard_normal(out.shape).astype(np.float32)
    grads = flashattn.backward(dout, q, k, v, out, lse, causal=causal, window_size=window, softcap=softcap, algo=algo)
    refs = reference.attention_backward(dout, q, k, v, causal=causal, window=window, softcap=softcap)
    for name, g, r in zip(("dq", "dk", "dv"), grads, refs):
        assert_close(g, r, "float32", name, factor=2)


def test_float16_and_strided_views(rng):
    base = rng.standard_normal((2, 4, 23, 32)).astype(np.float16)  # [B, H, S, D] memory, viewed as BSHD
    q = base.transpose(0, 2, 1, 3)
    k = rng.standard_normal((2, 40, 6, 32)).astype(np.float16)[:, ::2, 1:3]  # every other row, heads 1..2
    v = np.ascontiguousarray(k)
    out = flashattn.flash_attn_func(q, k, v, causal=True)
    same = flashattn.flash_attn_func(np.ascontiguousarray(q), np.ascontiguousarray(k), v, causal=True)
    np.testing.assert_array_equal(out, same)
    assert_close(out, reference.attention(q, k, v, causal=True)[0], "float16", "out")


def test_varlen(rng):
    lens_q, lens_k = [3, 0, 17, 8], [5, 4, 17, 1]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = rng.standard_normal((cu_q[-1], 4, 8)).astype(np.float32)
    k = rng.standard_normal((cu_k[-1], 2, 8)).astype(np.float32)
    v = rng.standard_normal((cu_k[-1], 2, 8)).astype(np.float32)
    out, lse = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                                return_lse=True)
    assert out.shape == q.shape and lse.shape == (4, cu_q[-1])
    for s in range(len(lens_q)):
        a, b, c, d = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        ref, ref_lse = reference.attention(q[None, a:b], k[None, c:d], v[None, c:d], causal=True)
        assert_close(out[a:b], ref[0], "float32", f"out of sequence {s}")
        assert_close(np.where(np.isinf(lse[:, a:b]), 0, lse[:, a:b]), np.where(np.isinf(ref_lse[0]), 0, ref_lse[0]),
                     "float32", f"lse of sequence {s}")
        assert np.array_equal(np.isinf(lse[:, a:b]), np.isinf(ref_lse[0]))


def test_bfloat16_through_ml_dtypes(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v = (a.astype(ml_dtypes.bfloat16) for a in qkv(rng, 1, 9, 9, 2, 2, 16))
    out = flashattn.flash_attn_func(q, k, v)
    assert out.dtype == q.dtype
    assert_close(out.astype(np.float32), reference.attention(q, k, v)[0], "bfloat16", "out")


def test_errors():
    q = np.zeros((1, 4, 2, 8), np.float32)
    with pytest.raises(ValueError, match="heads"):
        flashattn.flash_attn_func(q, np.zeros((1, 4, 3, 8), np.float32), np.zeros((1, 4, 3, 8), np.float32))
    with pytest.raises(NotImplementedError, match="float64"):
        flashattn.flash_attn_func(q.astype(np.float64), q, q)
    with pytest.raises(ValueError, match="head_dim must be contiguous"):
        flashattn.flash_attn_func(np.zeros((1, 4, 2, 16), np.float32)[..., ::2], q, q)


def test_without_torch():
    code = ("import sys, numpy as np, flashattn; q = np.ones((1, 3, 1, 4), np.float32); "
            "o = flashattn.flash_attn_func(q, q, q); assert 'torch' not in sys.modules; print(float(o.sum()))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(res.stdout) == pytest.approx(12.0)


def test_kvcache(rng):
    q, kc, vc = qkv(rng, 2, 2, 24, 4, 2, 16)
    kn, vn = kc[:, :2].copy() * 0.5, vc[:, :2].copy() * 0.5
    seqlens = np.array([3, 20], np.int32)
    kc0 = kc.copy()
    out = flashattn.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens, causal=True)
    for b, n in enumerate(seqlens):
        keys, vals = kc[b, :n + 2], vc[b, :n + 2]
        assert np.array_equal(keys[n:], kn[b]) and np.array_equal(vals[n:], vn[b])
        assert np.array_equal(np.delete(kc[b], np.s_[n:n + 2], axis=0), np.delete(kc0[b], np.s_[n:n + 2], axis=0))
        ref = reference.attention(q[b:b + 1], keys[None], vals[None], causal=True)[0]
        assert_close(out[b:b + 1], ref, "float32", f"out of sequence {b}")


def test_kvcache_without_torch():
    code = ("import sys, numpy as np, flashattn; q = np.ones((1, 1, 2, 8), np.float32); "
            "kc = np.zeros((1, 4, 1, 8), np.float32); vc = kc.copy(); "
            "o = flashattn.flash_attn_with_kvcache(q, kc, vc, q[:, :, :1], q[:, :, :1], cache_seqlens=2); "
            "assert 'torch' not in sys.modules; print(float(o.sum()), float(kc.sum()))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # 3 keys: two zero rows, then the ones row appended at key 2 (score 8/sqrt(8)); the cache gains 8 ones
    o, k = map(float, res.stdout.split())
    assert k == 8.0
    assert o == pytest.approx(2 * 8 * (np.exp(8 / np.sqrt(8)) / (2 + np.exp(8 / np.sqrt(8)))), rel=1e-5)
