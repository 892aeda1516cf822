"""flash-attn's packed calls (gradients into the packed tensor) and its other argument names: FA3's hints accepted
and without effect, page_table as block_table, and what flashattn does not offer refused before any call."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import flashattn  # noqa: E402


def randn(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def grads(out, leaves, seed=9):
    return torch.autograd.grad(out, leaves, randn(*out.shape, seed=seed))


def test_qkvpacked_equals_unpacked_and_grads_land_in_qkv():
    qkv = randn(2, 13, 3, 4, 16).requires_grad_()
    out, lse = flashattn.flash_attn_qkvpacked_func(qkv, causal=True, softcap=4.0, return_lse=True)
    q, k, v = (qkv.detach()[:, :, i].clone().requires_grad_() for i in range(3))
    want, want_lse = flashattn.flash_attn_func(q, k, v, causal=True, softcap=4.0, return_lse=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    (dqkv,) = grads(out, (qkv,))
    for i, g in enumerate(grads(want, (q, k, v))):
        assert torch.equal(dqkv[:, :, i], g), i


def test_kvpacked_gqa():
    q, kv = randn(1, 9, 6, 32).requires_grad_(), randn(1, 17, 2, 2, 32, seed=1).requires_grad_()
    out = flashattn.flash_attn_kvpacked_func(q, kv, window_size=(5, 1))
    k, v = (kv.detach()[:, :, i].clone().requires_grad_() for i in range(2))
    qq = q.detach().clone().requires_grad_()
    want = flashattn.flash_attn_func(qq, k, v, window_size=(5, 1))
    assert torch.equal(out, want)
    dq, dkv = grads(out, (q, kv))
    wq, wk, wv = grads(want, (qq, k, v))
    assert torch.equal(dq, wq) and torch.equal(dkv[:, :, 0], wk) and torch.equal(dkv[:, :, 1], wv)


def test_varlen_packed():
    cu = torch.tensor([0, 4, 4, 11], dtype=torch.int32)
    qkv = randn(11, 3, 2, 8).requires_grad_()
    out = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu, 7, causal=True)
    q, k, v = (qkv.detach()[:, i].clone().requires_grad_() for i in range(3))
    want = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, causal=True)
    assert torch.equal(out, want)
    (dqkv,) = grads(out, (qkv,))
    for i, g in enumerate(grads(want, (q, k, v))):
        assert torch.equal(dqkv[:, i], g)
    cu_k = torch.tensor([0, 2, 9, 9], dtype=torch.int32)
    kv = randn(9, 2, 1, 8, seed=2).requires_grad_()
    out = flashattn.flash_attn_varlen_kvpacked_func(q, kv, cu, cu_k, 7, 7)
    want = flashattn.flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu, cu_k, 7, 7)
    assert torch.equal(out, want)
    assert grads(out, (kv,))[0].shape == kv.shape


def test_fa3_qkvpacked_num_heads_q():
    qkv = randn(1, 10, 6 + 2 * 2, 16).requires_grad_()
    out = flashattn.flash_attn_qkvpacked_func(qkv, causal=True, num_heads_q=6)
    want = flashattn.flash_attn_func(qkv[:, :, :6], qkv[:, :, 6:8], qkv[:, :, 8:], causal=True)
    assert torch.equal(out, want)
    with pytest.raises(flashattn.InvalidArgumentError, match="qkv: with num_heads_q=5"):
        flashattn.flash_attn_qkvpacked_func(qkv, num_heads_q=5)


def test_numpy_packed():
    qkv = randn(1, 7, 3, 2, 8).numpy()
    out = flashattn.flash_attn_qkvpacked_func(qkv)
    assert np.array_equal(out, flashattn.flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]))


@pytest.mark.parametrize("bad", [randn(2, 5, 2, 4, 16), randn(2, 5, 3, 4)])
def test_packed_shape_errors(bad):
    with pytest.raises(flashattn.InvalidArgumentError, match=r"qkv: expected \[batch, seqlen, 3, heads, head_dim\]"):
        flashattn.flash_attn_qkvpacked_func(bad)


def test_hints_change_nothing():
    q, k, v = randn(1, 9, 4, 16), randn(1, 9, 2, 16, seed=1), randn(1, 9, 2, 16, seed=2)
    want = flashattn.flash_attn_func(q, k, v, causal=True)
    got = flashattn.flash_attn_func(q, k, v, causal=True, num_splits=3, pack_gqa=True, scheduler_metadata=object(),
                                    sm_margin=8)
    assert torch.equal(got, want)
    out, lse, s_dmask = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(out, want) and lse.shape == (1, 4, 9) and s_dmask is None
    cu = torch.tensor([0, 9], dtype=torch.int32)
    assert torch.equal(flashattn.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 9, 9, causal=True, pack_gqa=False,
                                                        num_splits=2), want[0])


def test_page_table_is_block_table():
    q = randn(2, 1, 4, 16)
    kc, vc = randn(6, 4, 2, 16, seed=1), randn(6, 4, 2, 16, seed=2)
    table = torch.tensor([[5, 0, 3], [1, 2, 4]], dtype=torch.int32)
    seqlens = torch.tensor([9, 12], dtype=torch.int32)
    want = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table)
    got = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, page_table=table, pack_gqa=True,
                                            scheduler_metadata=torch.zeros(4, dtype=torch.int32), sm_margin=0)
    assert torch.equal(got, want)
    with pytest.raises(TypeError, match="page_table"):
        flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, page_table=table, block_table=table)


NOT_OFFERED = [("flash_attn_func", dict(dropout_p=0.1), "dropout_p"),
               ("flash_attn_func", dict(alibi_slopes=torch.ones(4)), "alibi_slopes"),
               ("flash_attn_func", dict(qv=torch.ones(1)), "qv"),
               ("flash_attn_qkvpacked_func", dict(dropout_p=0.5), "dropout_p"),
               ("flash_attn_with_kvcache", dict(qv=torch.ones(1)), "qv"),
               ("flash_attn_with_kvcache", dict(rotary_seqlens=torch.ones(1)), "rotary_seqlens")]


@pytest.mark.parametrize("fn,kw,name", NOT_OFFERED, ids=[f"{f}-{n}" for f, _, n in NOT_OFFERED])
def test_not_offered_refused_before_any_call(fn, kw, name):
    q, kc = randn(1, 4, 4, 16), randn(1, 8, 4, 16)
    k, before = randn(1, 1, 4, 16), kc.clone()
    cu = torch.tensor([0, 4], dtype=torch.int32)
    args = {"flash_attn_func": (q, q, q), "flash_attn_varlen_func": (q[0], q[0], q[0], cu, cu, 4, 4),
            "flash_attn_qkvpacked_func": (torch.stack([q] * 3, 2),),
            "flash_attn_with_kvcache": (q, kc, kc.clone(), k, k, None, None, 2)}[fn]
    with pytest.raises(flashattn.UnsupportedError, match=f"{name}[:=]"):
        getattr(flashattn, fn)(*args, **kw)
    assert torch.equal(kc, before)  # nothing appended
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such'"):
        getattr(flashattn, fn)(*args, no_such=1)
