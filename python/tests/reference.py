"""float64 attention for the tests: the masks, softcap and GQA of include/flashattn.h written out plainly (numpy), and
the same with torch ops for autograd's gradients."""
import math

import numpy as np


def visible(sq, sk, causal, window, chunk=0):
    """[sq, sk] bool: key j visible from query i (bottom-right aligned, as the header defines); chunk > 0: only the
    keys of the diagonal's chunk (attention_chunk)."""
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    i = np.arange(sq)[:, None] + (sk - sq)
    j = np.arange(sk)[None, :]
    m = np.ones((sq, sk), dtype=bool)
    if left >= 0:
        m &= j >= i - left
    if right >= 0:
        m &= j <= i + right
    if chunk:
        m &= (j // chunk) == (i // chunk)  # floor division: negative diagonals see no key
    return m


def scores(q, k, scale, softcap):
    """q [B, Sq, H, D], k [B, Sk, H, D] (heads already repeated) in float64 -> S [B, H, Sq, Sk] after softcap."""
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    return softcap * np.tanh(s / softcap) if softcap else s


def attention(q, k, v, scale=None, causal=False, window=(-1, -1), softcap=0.0, chunk=0):
    """out [B, Sq, H, D] and lse [B, H, Sq] in float64 for numpy q, k, v of any float dtype."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    g = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else scale
    s = scores(q, k, scale, softcap)
    m = visible(q.shape[1], k.shape[1], causal, window, chunk)
    s = np.where(m, s, -np.inf)
    mx = s.max(axis=-1, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    e = np.exp(s - mx)
    l = e.sum(axis=-1, keepdims=True)
    p = np.where(l > 0, e / np.where(l > 0, l, 1.0), 0.0)
    out = np.einsum("bhqk,bkhd->bqhd", p, v)
    with np.errstate(divide="ignore"):
        lse = np.where(l[..., 0] > 0, np.log(np.where(l[..., 0] > 0, l[..., 0], 1.0)) + mx[..., 0], -np.inf)
    return out, lse


def attention_backward(dout, q, k, v, scale=None, causal=False, window=(-1, -1), softcap=0.0, chunk=0):
    """dq, dk, dv in float64 (dk/dv summed over the query heads that share a K/V head)."""
    q, k, v, dout = (np.asarray(a, dtype=np.float64) for a in (q, k, v, dout))
    hk = k.shape[2]
    g = q.shape[2] // hk
    kr, vr = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else scale
    raw = np.einsum("bqhd,bkhd->bhqk", q, kr) * scale
    s = softcap * np.tanh(raw / softcap) if softcap else raw
    m = visible(q.shape[1], k.shape[1], causal, window, chunk)
    s = np.where(m, s, -np.inf)
    mx = s.max(axis=-1, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    e = np.exp(s - mx)
    l = e.sum(axis=-1, keepdims=True)
    p = np.where(l > 0, e / np.where(l > 0, l, 1.0), 0.0)
    dv = np.einsum("bhqk,bqhd->bkhd", p, dout)
    dp = np.einsum("bqhd,bkhd->bhqk", dout, vr)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    if softcap:
        ds = ds * (1.0 - np.tanh(raw / softcap) ** 2)
    dq = np.einsum("bhqk,bkhd->bqhd", ds, kr) * scale
    dk = np.einsum("bhqk,bqhd->bkhd", ds, q) * scale
    b, sk, _, d = k.shape
    return dq, dk.reshape(b, sk, hk, g, d).sum(axis=3), dv.reshape(b, sk, hk, g, d).sum(axis=3)


def torch_attention(q, k, v, sink=None, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0):
    """out [B, Sq, H, dv] and lse [B, H, Sq] in float64 with torch ops, differentiable in q, k, v (and sink): v may
    have its own head_dim; the sink (None or [H]) is one more logit per head in every row's softmax, whose value is
    nothing. A row that sees no key (and has no sink) gives out 0, lse -inf."""
    import torch

    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    b, sq, hq, d = q.shape
    sk, g = k.shape[1], hq // k.shape[2]
    k, v = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    scale = 1 / math.sqrt(d) if softmax_scale is None else softmax_scale  # q's head_dim
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    seen = torch.from_numpy(visible(sq, sk, causal, window_size)).to(s.device)
    s = s.masked_fill(~seen, -math.inf)
    if sink is not None:
        s = torch.cat([s, sink.to(torch.float64).view(1, hq, 1, 1).expand(b, hq, sq, 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.masked_fill(lse == -math.inf, 0)[..., None])[..., :sk]
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse
