"""Library statuses become exceptions carrying the library's message; nothing is copied or cast silently."""
import pytest

from flashattn import _capi
import flashattn

torch = pytest.importorskip("torch")


def test_status_classes():
    expect = {_capi.ERR_INVALID_ARGUMENT: ValueError, _capi.ERR_UNSUPPORTED: NotImplementedError,
              _capi.ERR_OUT_OF_MEMORY: MemoryError, _capi.ERR_BACKEND_UNAVAILABLE: RuntimeError,
              _capi.ERR_DEVICE: RuntimeError, _capi.ERR_INTERNAL: RuntimeError}
    for status, cls in expect.items():
        e = _capi.error(status, "why")
        assert isinstance(e, cls) and isinstance(e, flashattn.FlashAttnError) and e.status == status
        assert str(e) == f"{_capi.lib.fa_status_string(status).decode()}: why"


def test_invalid_argument_carries_the_library_message():
    q = torch.zeros(1, 4, 4, 8)
    with pytest.raises(ValueError, match=r"FA_ERR_INVALID_ARGUMENT: .*heads") as info:
        flashattn.flash_attn_func(q, torch.zeros(1, 4, 3, 8), torch.zeros(1, 4, 3, 8))
    assert isinstance(info.value, flashattn.InvalidArgumentError)
    with pytest.raises(ValueError, match="head_dim"):
        flashattn.flash_attn_func(q, torch.zeros(1, 4, 4, 9), torch.zeros(1, 4, 4, 8))
    with pytest.raises(ValueError, match="softcap"):
        flashattn.flash_attn_func(q, q, q, softcap=-1.0)
    with pytest.raises(ValueError, match="algo"):
        flashattn.flash_attn_func(q, q, q, algo="flash9")


def test_nothing_is_copied_or_cast():
    q = torch.zeros(1, 4, 4, 8)
    with pytest.raises(ValueError, match="head_dim must be contiguous"):
        flashattn.flash_attn_func(torch.zeros(1, 4, 4, 16)[..., ::2], q, q)
    with pytest.raises(NotImplementedError, match="float64"):
        flashattn.flash_attn_func(q.double(), q, q)
    with pytest.raises(ValueError, match="int32"):
        flashattn.flash_attn_varlen_func(q[0], q[0], q[0], torch.tensor([0, 4]), torch.tensor([0, 4]), 4, 4)
    with pytest.raises(ValueError, match="one device"):
        flashattn.flash_attn_func(q, q.to("meta"), q)


def test_unsupported_options():
    q = torch.zeros(1, 4, 4, 8)
    with pytest.raises(NotImplementedError, match="dropout"):
        flashattn.flash_attn_func(q, q, q, 0.1)
    with pytest.raises(NotImplementedError, match="alibi"):
        flashattn.flash_attn_func(q, q, q, alibi_slopes=torch.zeros(4))


def test_out_of_memory():
    """STANDARD materialises S: 2^20 x 2^20 scores (4 TiB) from stride-0 inputs that take no memory."""
    n = 1 << 20
    x = torch.zeros(1, 1, 1, 1).expand(1, n, 1, 1)
    with pytest.raises(MemoryError, match="FA_ERR_OUT_OF_MEMORY"):
        flashattn.flash_attn_func(x, x, x, algo="standard")


@pytest.mark.skipif(_capi.backend_available(_capi.BACKEND_CUDA), reason="CUDA is available here")
def test_backend_unavailable():
    with pytest.raises(RuntimeError, match="FA_ERR_BACKEND_UNAVAILABLE") as info:
        _capi.context(_capi.BACKEND_CUDA, 0)
    assert isinstance(info.value, flashattn.BackendUnavailableError)


def test_unsupported_on_cuda():
    if not (torch.cuda.is_available() and _capi.backend_available(_capi.BACKEND_CUDA)):
        pytest.skip("no CUDA device or build")
    q = torch.zeros(1, 64, 2, 72, device="cuda", dtype=torch.float16)
    with pytest.raises(NotImplementedError, match="FA_ERR_UNSUPPORTED"):
        flashattn.flash_attn_func(q, q, q, algo="flash2")
