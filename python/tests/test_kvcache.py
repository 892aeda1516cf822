"""flash_attn_with_kvcache and merge_states against float64 math on the concatenated cache + new rows (causal
bottom-right, windows, softcap, GQA, rotary), paged against contiguous, the in-place append, torch.compile."""
import numpy as np
import pytest

from conftest import assert_close as _assert_close
from reference import attention

torch = pytest.importorskip("torch")
import flashattn  # noqa: E402
from flashattn import _capi, _torch_kvcache  # noqa: E402, F401  (registers torch.ops.flashattn.fwd_kvcache)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
HAVE_CUDA = torch.cuda.is_available() and _capi.backend_available(_capi.BACKEND_CUDA)
# CUDA decoding takes f16/bf16 at head_dim 64, 128, 256: the CUDA cases use those
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device or build"))]


def half(device, dtype="float32"):
    return "float16" if device == "cuda" and dtype == "float32" else dtype


def f64(t):
    return t.detach().cpu().to(torch.float64).numpy()


def assert_close(got, ref, dtype, name, factor=1.0):
    _assert_close(f64(got) if isinstance(got, torch.Tensor) else got, ref, dtype, name, factor)


def rotate(x, cos, sin, pos, interleaved):
    """x [S, H, D] float64 rotated at positions pos [S] on its first 2 * cos.shape[1] dimensions."""
    x = x.copy()
    c, s = cos[pos][:, None, :], sin[pos][:, None, :]
    r = 2 * cos.shape[1]
    if interleaved:
        a, b = x[..., 0:r:2].copy(), x[..., 1:r:2].copy()
        x[..., 0:r:2], x[..., 1:r:2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., : r // 2].copy(), x[..., r // 2: r].copy()
        x[..., : r // 2], x[..., r // 2: r] = a * c - b * s, a * s + b * c
    return x


def reference(q, k_cache, v_cache, k, v, seqlens, batch_idx=None, rotary=None, **opts):
    """out [B, Sq, H, D], lse [B, H, Sq] in float64: sequence b attends to its cache row's first seqlens[b] keys
    followed by its new rows (rotary: (cos, sin, interleaved) applied to q and the new keys; as flash-attn, q row i at
    seqlens[b] + i in a causal or windowed call, else every q row at seqlens[b])."""
    outs, lses = [], []
    sq = q.shape[1]
    for b in range(q.shape[0]):
        row = b if batch_idx is None else int(batch_idx[b])
        n = int(seqlens[b])
        qb, kb, vb = f64(q[b]), f64(k_cache[row, :n]), f64(v_cache[row, :n])
        if k is not None:
            kn = f64(k[b])
            if rotary is not None:
                cos, sin, inter = rotary
                pos = np.arange(n, n + sq)
                local = opts.get("causal") or tuple(opts.get("window", (-1, -1))) != (-1, -1)
                qb = rotate(qb, cos, sin, pos if local else np.full(sq, n), inter)
                kn = rotate(kn, cos, sin, pos, inter)
            kb, vb = np.concatenate([kb, kn]), np.concatenate([vb, f64(v[b])])
        o, lse = attention(qb[None], kb[None], vb[None], **opts)
        outs.append(o[0])
        lses.append(lse[0])
    return np.stack(outs), np.stack(lses)


def make(b, sq, hq, hk, d, cap, dtype, rows=None, seed=3, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen).to(dtype=DTYPES[dtype], device=device)  # noqa: E731
    rows = rows or b
    return r(b, sq, hq, d), r(rows, cap, hk, d), r(rows, cap, hk, d), r(b, sq, hk, d), r(b, sq, hk, d)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("causal,window,softcap", [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0),
                                                   (True, (7, -1), 0.0), (False, (5, 2), 6.0)])
@pytest.mark.parametrize("append", [True, False])
@pytest.mark.parametrize("device", DEVICES)
def test_against_reference(dtype, causal, window, softcap, append, device):
    if device == "cuda" and dtype == "float32":
        pytest.skip("CUDA decoding is f16/bf16")
    q, kc, vc, k, v = make(3, 4, 8, 2, 64, 48, dtype, device=device)
    seqlens = torch.tensor([0, 17, 44], dtype=torch.int32, device=device)
    if not append:
        k = v = None
        seqlens = torch.tensor([3, 17, 48], dtype=torch.int32, device=device)
    ref, ref_lse = reference(q, kc, vc, k, v, seqlens, causal=causal, window=window, softcap=softcap)
    out, lse = flashattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, causal=causal,
                                                 window_size=window, softcap=softcap, return_softmax_lse=True)
    assert out.dtype == q.dtype and out.shape == q.shape and lse.shape == (3, 8, 4)
    assert_close(out, ref, dtype, "out")
    fin = np.isfinite(ref_lse)
    assert np.array_equal(np.isfinite(f64(lse)), fin)
    assert_close(f64(lse)[fin], ref_lse[fin], "float32", "lse", factor=10)


@pytest.mark.parametrize("num_splits", [0, 1, 3])
def test_batch_idx_scale_splits_int_seqlens(num_splits):
    q, kc, vc, k, v = make(2, 1, 4, 4, 32, 40, "float32", rows=5)
    idx = torch.tensor([4, 1], dtype=torch.int32)
    out = flashattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=30, cache_batch_idx=idx,
                                           softmax_scale=0.3, causal=True, num_splits=num_splits)
    ref, _ = reference(q, kc, vc, k, v, [30, 30], batch_idx=idx, scale=0.3, causal=True)
    assert_close(out, ref, "float32", "out")


def test_seqlens_none_is_the_whole_cache():
    q, kc, vc, _, _ = make(2, 2, 4, 1, 32, 24, "float32")
    out = flashattn.flash_attn_with_kvcache(q, kc, vc, causal=True)
    ref, _ = reference(q, kc, vc, None, None, [24, 24], causal=True)
    assert_close(out, ref, "float32", "out")


@pytest.mark.parametrize("device", DEVICES)
def test_append_writes_exactly_the_new_rows(device):
    q, kc, vc, k, v = make(3, 5, 4, 2, 64, 32, "bfloat16", rows=4, device=device)
    idx = torch.tensor([3, 0, 2], dtype=torch.int32, device=device)
    seqlens = torch.tensor([0, 11, 27], dtype=torch.int32, device=device)
    kc0, vc0 = kc.clone(), vc.clone()
    flashattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, cache_batch_idx=idx, causal=True)
    want_k, want_v = kc0.clone(), vc0.clone()
    for b in range(3):
        r, n = int(idx[b]), int(seqlens[b])
        want_k[r, n:n + 5], want_v[r, n:n + 5] = k[b], v[b]
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    assert seqlens.tolist() == [0, 11, 27]  # not advanced


def paged(kc, vc, page_size, seed=5):
    """The contiguous cache [B, cap, H, D] scattered into shuffled pages, and its block table."""
    b, cap = kc.shape[:2]
    per = cap // page_size
    perm = torch.randperm(b * per + 3, generator=torch.Generator().manual_seed(seed))[: b * per]
    table = perm.reshape(b, per).to(dtype=torch.int32, device=kc.device)
    kp = torch.zeros((b * per + 3, page_size) + kc.shape[2:], dtype=kc.dtype, device=kc.device)
    vp = torch.zeros_like(kp)
    for i in range(b):
        for j in range(per):
            kp[table[i, j]] = kc[i, j * page_size:(j + 1) * page_size]
            vp[table[i, j]] = vc[i, j * page_size:(j + 1) * page_size]
    return kp, vp, table


@pytest.mark.parametrize("page_size", [1, 8, 16])
@pytest.mark.parametrize("device", DEVICES)
def test_paged_equals_contiguous(page_size, device):
    q, kc, vc, k, v = make(3, 3, 6, 3, 64, 64, "float16", device=device)
    seqlens = torch.tensor([5, 61, 30], dtype=torch.int32, device=device)
    kp, vp, table = paged(kc, vc, page_size)
    opts = dict(cache_seqlens=seqlens, causal=True, softcap=5.0, num_splits=1, return_softmax_lse=True)
    out_c, lse_c = flashattn.flash_attn_with_kvcache(q, kc, vc, k, v, **opts)
    out_p, lse_p = flashattn.flash_attn_with_kvcache(q, kp, vp, k, v, block_table=table, **opts)
    assert torch.equal(out_c, out_p) and torch.equal(lse_c, lse_p)
    kp2, vp2, _ = paged(kc, vc, page_size)  # kc/vc now hold the appended rows: the pages must hold the same
    assert torch.equal(kp, kp2) and torch.equal(vp, vp2)
    out_h = flashattn.flash_attn_with_kvcache(q, kp, vp, block_table=table, cache_seqlens=seqlens + 3, causal=True)
    ref, _ = reference(q, kc, vc, None, None, seqlens + 3, causal=True)
    assert_close(out_h, ref, "float16", "out")


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("rotary_dim", [16, 64])
@pytest.mark.parametrize("device", DEVICES)
def test_rotary(interleaved, rotary_dim, device, causal):
    dtype = half(device)
    q, kc, vc, k, v = make(2, 3, 4, 2, 64, 40, dtype, device=device)
    seqlens = torch.tensor([4, 30], dtype=torch.int32, device=device)
    pos = torch.arange(64, dtype=torch.float64)[:, None]
    freq = 10000.0 ** (-torch.arange(rotary_dim // 2, dtype=torch.float64) / (rotary_dim // 2))
    cos, sin = torch.cos(pos * freq).float().to(device), torch.sin(pos * freq).float().to(device)
    kc0 = kc.clone()
    out = flashattn.flash_attn_with_kvcache(q, kc, vc, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
                                           causal=causal, rotary_interleaved=interleaved)
    rot = (f64(cos), f64(sin), interleaved)
    ref, _ = reference(q, kc0, vc, k, v, seqlens, rotary=rot, causal=causal)
    assert_close(out, ref, dtype, "out")
    for b in range(2):  # the rotated keys are what is stored
        n = int(seqlens[b])
        want = rotate(f64(k[b]), rot[0], rot[1], np.arange(n, n + 3), interleaved)
        assert_close(kc[b, n:n + 3], want, dtype, "appended k")


def test_numpy_matches_torch():
    q, kc, vc, k, v = make(2, 2, 4, 2, 32, 32, "float32")
    seqlens = torch.tensor([9, 20], dtype=torch.int32)
    a = [t.numpy().copy() for t in (q, kc, vc, k, v)]
    out_t, lse_t = flashattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, causal=True,
                                                     return_softmax_lse=True)
    out_n, lse_n = flashattn.flash_attn_with_kvcache(*a, cache_seqlens=seqlens.numpy(), causal=True,
                                                     return_softmax_lse=True)
    assert isinstance(out_n, np.ndarray)
    assert np.array_equal(out_n, out_t.numpy()) and np.array_equal(lse_n, lse_t.numpy())
    assert np.array_equal(a[1], kc.numpy()) and np.array_equal(a[2], vc.numpy())
    kp, vp, table = paged(torch.from_numpy(a[1]), torch.from_numpy(a[2]), 8)
    out_p = flashattn.flash_attn_with_kvcache(q.numpy(), kp.numpy(), vp.numpy(), cache_seqlens=seqlens.numpy() + 2,
                                             block_table=table.numpy(), causal=True)
    ref, _ = reference(q, kc, vc, None, None, seqlens + 2, causal=True)
    assert_close(out_p, ref, "float32", "out")


@pytest.mark.parametrize("front", ["torch", "numpy", pytest.param("cuda", marks=DEVICES[1].marks)])
def test_merge_states(front):
    dtype = half(front)
    q, kc, vc, _, _ = make(2, 3, 4, 2, 64, 40, dtype, device="cuda" if front == "cuda" else "cpu")
    parts = [(kc[:, :15], vc[:, :15]), (kc[:, 15:], vc[:, 15:])]
    conv = (lambda t: t.contiguous().numpy()) if front == "numpy" else (lambda t: t)
    outs, lses = [], []
    for kk, vv in parts:
        o, l = flashattn.flash_attn_func(conv(q), conv(kk), conv(vv), return_lse=True)
        outs.append(o)
        lses.append(l)
    out, lse = flashattn.merge_states(outs, lses)
    ref, ref_lse = attention(f64(q), f64(kc), f64(vc))
    assert_close(out, ref, dtype, "out")
    assert_close(f64(lse) if front == "cuda" else np.asarray(lse), ref_lse, "float32", "lse", factor=10)


def test_opcheck():
    q, kc, vc, k, v = make(2, 2, 4, 2, 32, 32, "float32")
    seqlens = torch.tensor([3, 20], dtype=torch.int32)
    table_args = (None, None, seqlens, None, None, 0.0, True, -1, -1, 0.0, True, 0)
    torch.library.opcheck(torch.ops.flashattn.fwd_kvcache.default, (q, kc, vc, k, v) + table_args)
    torch.library.opcheck(torch.ops.flashattn.fwd_kvcache.default, (q, kc, vc, None, None) + table_args)
    o, l = flashattn.flash_attn_func(q, kc, vc, return_lse=True)
    torch.library.opcheck(torch.ops.flashattn.merge_states.default, ([o, o], [l, l]))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_sees_the_append(device):
    q, kc, vc, k, v = make(2, 1, 4, 2, 64, 16, half(device), device=device)
    seqlens = torch.tensor([2, 9], dtype=torch.int32, device=device)
    kc_e, vc_e = kc.clone(), vc.clone()

    def step(q, kc, vc, k, v, seqlens):
        out = flashattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, causal=True)
        return out * 2.0, kc.sum(), vc[:, 0].clone()  # reads of the cache after the call see the appended rows

    compiled = torch.compile(step, fullgraph=True)
    got = compiled(q, kc, vc, k, v, seqlens)
    want = step(q, kc_e, vc_e, k, v, seqlens)
    assert torch.equal(kc, kc_e) and torch.equal(vc, vc_e)
    for g, w in zip(got, want):
        tol = 1e-5 if device == "cpu" else 2e-3
        assert torch.allclose(g, w, rtol=tol, atol=tol)


def test_errors():
    q, kc, vc, k, v = make(2, 2, 4, 2, 32, 16, "float32")
    seqlens = torch.tensor([1, 2], dtype=torch.int32)
    call = flashattn.flash_attn_with_kvcache
    with pytest.raises(flashattn.InvalidArgumentError, match="cache_seqlens"):
        call(q, kc, vc, k, v, cache_seqlens=seqlens.long())
    with pytest.raises(flashattn.InvalidArgumentError, match="cache_seqlens"):
        call(q, kc, vc, k, v, cache_seqlens=torch.tensor([1, 2, 3], dtype=torch.int32))
    with pytest.raises(flashattn.InvalidArgumentError, match="cache_seqlens"):
        call(q, kc, vc, k, v, cache_seqlens=torch.tensor(1, dtype=torch.int32))
    with pytest.raises(flashattn.InvalidArgumentError, match="one device"):
        call(q, kc, vc, k, v, cache_seqlens=seqlens.to("meta"))
    with pytest.raises(flashattn.InvalidArgumentError, match="k and v"):
        call(q, kc, vc, k, None, cache_seqlens=seqlens)
    with pytest.raises(flashattn.InvalidArgumentError, match="block_table"):
        call(q, kc, vc, cache_seqlens=seqlens, block_table=torch.zeros((2, 2), dtype=torch.int64))
    with pytest.raises(flashattn.UnsupportedError, match="dtype"):
        call(q.double(), kc.double(), vc.double(), cache_seqlens=seqlens)
    with pytest.raises(flashattn.InvalidArgumentError, match="head_dim must be contiguous"):
        call(q, kc.transpose(2, 3).contiguous().transpose(2, 3)[..., :2, :], vc, cache_seqlens=seqlens)
    cos = torch.ones(32, 8)
    with pytest.raises(flashattn.InvalidArgumentError, match="rotary"):
        call(q, kc, vc, k, v, rotary_cos=cos.half(), rotary_sin=cos.half(), cache_seqlens=seqlens, causal=True)
    kc0 = kc.clone()
    with pytest.raises(flashattn.InvalidArgumentError, match="FA_ERR_INVALID_ARGUMENT"):  # 15 + 2 > capacity 16
        call(q, kc, vc, k, v, cache_seqlens=torch.tensor([1, 15], dtype=torch.int32))
    assert torch.equal(kc, kc0)  # nothing written on error
    with pytest.raises(flashattn.InvalidArgumentError, match="cache_seqlens"):
        call(q.numpy(), kc.numpy(), vc.numpy(), cache_seqlens=[1, 2])
    with pytest.raises(flashattn.InvalidArgumentError, match="merge_states"):
        flashattn.merge_states([q], [])


@pytest.mark.parametrize("page_size", [16, 64, 256])
@pytest.mark.parametrize("device", DEVICES)
def test_block_table_bounds(page_size, device):
    """flash-attn's test_flash_attn_kvcache_paged_block_table_bounds: a block table of one column, a length one past
    its capacity or a full cache plus a new key, raises a RuntimeError naming block_table (the host reads the
    longest length, as flash-attn does); nothing is written."""
    dt = "bfloat16"
    q, kc, vc, k, v = make(2, 1, 4, 2, 64, page_size, dt, device=device)
    kp, vp, table = paged(kc, vc, page_size)
    assert table.shape == (2, 1)
    kp0 = kp.clone()
    for lens, new in (([3, page_size + 1], None), ([3, page_size], (k, v)), (page_size, (k, v))):
        seqlens = lens if isinstance(lens, int) else torch.tensor(lens, dtype=torch.int32, device=device)
        kn, vn = new if new else (None, None)
        with pytest.raises(RuntimeError, match="block_table") as info:
            flashattn.flash_attn_with_kvcache(q, kp, vp, kn, vn, cache_seqlens=seqlens, block_table=table)
        assert isinstance(info.value, flashattn.CacheIndexError) and isinstance(info.value, ValueError)
        assert torch.equal(kp, kp0)
    flashattn.kvcache_check(device)  # nothing recorded: the host refused before any launch


def test_contiguous_bounds_on_the_cpu():
    """The CPU checks every index before it runs: a length past the capacity is an error naming it."""
    q, kc, vc, _, _ = make(2, 1, 4, 2, 32, 16, "float32")
    with pytest.raises(ValueError, match=r"cache\.seqlens\[1\]"):
        flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.tensor([3, 17], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="k_cache"):  # an int length: checked on the host from the shapes
        flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=17)
    flashattn.kvcache_check("cpu")


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device or build")
def test_cuda_clamps_and_records():
    """CUDA, a contiguous cache with a device length past the capacity: the call runs without a host synchronisation,
    the kernels clamp the length (nothing out of bounds) and record it; kvcache_check raises it once. Inside a CUDA
    graph too: the paged call's host check is skipped while capturing, the replay's fault is recorded."""
    q, kc, vc, k, v = make(2, 1, 4, 2, 64, 32, "float16", device="cuda")
    seqlens = torch.tensor([3, 40], dtype=torch.int32, device="cuda")
    flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens)
    with pytest.raises(RuntimeError, match=r"cache\.seqlens\[1\] = 40") as info:
        flashattn.kvcache_check("cuda")
    assert isinstance(info.value, flashattn.CacheIndexError)
    flashattn.kvcache_check("cuda")  # cleared
    kp, vp, table = paged(kc, vc, 16)
    lens = torch.tensor([3, 5], dtype=torch.int32, device="cuda")
    flashattn.flash_attn_with_kvcache(q, kp, vp, k, v, cache_seqlens=lens, block_table=table)  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashattn.flash_attn_with_kvcache(q, kp, vp, k, v, cache_seqlens=lens, block_table=table)
    lens.fill_(32)  # full caches plus a new key
    graph.replay()
    with pytest.raises(RuntimeError, match="cache.seqlens"):
        flashattn.kvcache_check("cuda")
