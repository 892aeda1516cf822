"""python -m flashattn.bench: flashattn beside torch.nn.functional.scaled_dot_product_attention on the same inputs
(CPU, and CUDA when present), median time of forward and forward + backward; then the per-call cost of the binding
at a tiny shape. `--help` lists the options."""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import flashattn
from flashattn import _capi, _ext


def _sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _median_ms(fn, device, warmup, reps):
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _case(device, dtype, b, s, h, d, causal, algo, backward, warmup, reps):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, generator=gen).to(device=device, dtype=dtype).requires_grad_(backward)
               for _ in range(3))
    dout = torch.randn(b, s, h, d, generator=gen).to(device=device, dtype=dtype)
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_(backward) for t in (q, k, v))  # SDPA's [B, H, S, D] view

    def ours():
        out = flashattn.flash_attn_func(q, k, v, causal=causal, algo=algo)
        if backward:
            out.backward(dout)

    def sdpa():
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        if backward:
            out.backward(dout.transpose(1, 2))

    with torch.set_grad_enabled(backward):
        t_ours = _median_ms(ours, device, warmup, reps)
        kernel = (flashattn.last_stats(device) or {}).get("kernel", "?")
        t_sdpa = _median_ms(sdpa, device, warmup, reps)
    return kernel, t_ours, t_sdpa


def _overhead(reps=3000):
    """us per call at [1, 16, 1, 64] fp32 on the CPU: the C call as _ext makes it with preallocated outputs, then
    the public functions with numpy and torch inputs. CPU time of this thread (run with OMP_NUM_THREADS=1), so a
    busy machine does not count its waits."""
    import numpy as np
    q = np.random.default_rng(0).standard_normal((1, 16, 1, 64)).astype(np.float32)
    out, lse = np.empty_like(q), np.empty((1, 1, 16), np.float32)
    ctx = _capi.context()
    opts = _capi.options(None, False, (-1, -1), 0.0, "auto", False) + (0, 0, 0)
    qt = torch.from_numpy(q)
    qg = qt.clone().requires_grad_()

    def best(fn):
        fn()
        runs = []
        for _ in range(5):
            t0 = time.thread_time()
            for _ in range(reps):
                fn()
            runs.append((time.thread_time() - t0) / reps * 1e6)
        return min(runs)

    rows = [("C call (_ext, outputs preallocated)", best(lambda: _ext.forward(ctx.handle, opts, q, q, q, out, lse))),
            ("flash_attn_func, numpy", best(lambda: flashattn.flash_attn_func(q, q, q)))]
    with torch.no_grad():
        rows.append(("flash_attn_func, torch, no grad", best(lambda: flashattn.flash_attn_func(qt, qt, qt))))
        rows.append(("torch.ops.flashattn.fwd (dispatcher)", best(
            lambda: torch.ops.flashattn.fwd(qt, qt, qt, None, None, 0.0, False, -1, -1, 0.0, 0, False))))
        rows.append(("torch SDPA, no grad", best(lambda: F.scaled_dot_product_attention(qt, qt, qt))))
    rows.append(("flash_attn_func, torch, q requires grad", best(lambda: flashattn.flash_attn_func(qg, qt, qt))))
    rows.append(("torch SDPA, q requires grad", best(lambda: F.scaled_dot_product_attention(qg, qt, qt))))
    # decoding: one query row against q's 16 rows as the cache (nothing appended)
    q1, l1, seqlens = q[:, :1].copy(), np.empty((1, 1, 1), np.float32), np.array([16], np.int32)
    o1 = np.empty_like(q1)
    kv = (seqlens.ctypes.data, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1)
    q1t, st = torch.from_numpy(q1), torch.from_numpy(seqlens)
    rows += [("decode: C call (_ext.kvcache, outputs preallocated)",
              best(lambda: _ext.kvcache(ctx.handle, opts, kv, q1, q, q, None, None, o1, l1.ctypes.data))),
             ("decode: flash_attn_with_kvcache, numpy",
              best(lambda: flashattn.flash_attn_with_kvcache(q1, q, q, cache_seqlens=seqlens))),
             ("decode: flash_attn_with_kvcache, torch",
              best(lambda: flashattn.flash_attn_with_kvcache(q1t, qt, qt, cache_seqlens=st)))]
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m flashattn.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="all", help="cpu, cuda, or all (cuda only when present)")
    p.add_argument("--seqlen", default=None, help="comma list (default: CPU 256,1024; CUDA 1024,4096)")
    p.add_argument("--batch-heads", default="2x8", help="BxH, e.g. 2x8")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--algo", default="auto", help="flashattn algorithm: auto, standard, flash1, flash2, flash3")
    p.add_argument("--reps", type=int, default=0, help="timed repetitions (default: CPU 5, CUDA 30)")
    p.add_argument("--no-overhead", action="store_true", help="skip the per-call cost table")
    a = p.parse_args(argv)
    b, h = (int(x) for x in a.batch_heads.lower().split("x"))
    devices = ["cpu", "cuda"] if a.device == "all" else [a.device]
    devices = [d for d in devices if d == "cpu" or (torch.cuda.is_available()
                                                    and _capi.backend_available(_capi.BACKEND_CUDA))]
    print(f"flashattn {flashattn.version()}, torch {torch.__version__}, CPU threads {torch.get_num_threads()}"
          + (f", GPU {torch.cuda.get_device_name()}" if "cuda" in devices else ""))
    print("| device | dtype | B | S | H | D | causal | pass | kernel | flashattn ms | SDPA ms | SDPA / flashattn |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for device in devices:
        cuda = device == "cuda"
        dtype = torch.float16 if cuda else torch.float32
        seqlens = [int(s) for s in (a.seqlen or ("1024,4096" if cuda else "256,1024")).split(",")]
        reps = a.reps or (30 if cuda else 5)
        for s in seqlens:
            for causal in (False, True):
                for backward in (False, True):
                    kernel, t_ours, t_sdpa = _case(device, dtype, b, s, h, a.head_dim, causal, a.algo, backward,
                                                   2 if not cuda else 5, reps)
                    print(f"| {device} | {str(dtype).replace('torch.', '')} | {b} | {s} | {h} | {a.head_dim} | "
                          f"{int(causal)} | {'fwd+bwd' if backward else 'fwd'} | {kernel} | {t_ours:.3f} | "
                          f"{t_sdpa:.3f} | {t_sdpa / t_ours:.2f} |")
    if not a.no_overhead:
        print("\nper call, [1, 16, 1, 64] fp32 forward (decode: [1, 1, 1, 64] against 16 cached keys) on the CPU "
              "(thread CPU time, best of 5 runs):")
        print("| call | us |")
        print("|---|---|")
        for name, us in _overhead():
            print(f"| {name} | {us:.2f} |")


if __name__ == "__main__":
    main()
