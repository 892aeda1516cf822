"""What a flashattn call costs in Python beyond its C call, beside PyTorch's SDPA, on the CPU or a CUDA GPU.

    OMP_NUM_THREADS=1 python bench/lab/py_call_cost.py [--shape 1,128,8,128] [--reps 300] [--device cuda] [--profile]

Times (thread CPU time, best of 5 rounds of --reps calls; fp32 on the CPU, bf16 on CUDA, where the thread time is
the host's cost of a call: the kernels run asynchronously, and a second column gives the wall time per call of the
round, synchronised at its end): the C call as _ext makes it with preallocated outputs, flash_attn_func without and
with autograd recording, and F.scaled_dot_product_attention on the [B, H, S, D] view of the same memory; the
binding's overhead is a call's time minus the C call's. --profile adds cProfile's table of the Python layer of
flash_attn_func (no grad) at a tiny shape, where nothing but the layer is left."""
import argparse
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F

import flashattn
from flashattn import _capi, _torch


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def best_us(fn, reps, dev, rounds=5):
    """(thread CPU µs, wall µs) per call: the best round of each"""
    for _ in range(min(reps, 20)):
        fn()
    sync(dev)
    best, wall = float("inf"), float("inf")
    for _ in range(rounds):
        w0, t0 = time.perf_counter_ns(), time.thread_time_ns()
        for _ in range(reps):
            fn()
        t1 = time.thread_time_ns()
        sync(dev)
        best = min(best, (t1 - t0) / reps / 1e3)
        wall = min(wall, (time.perf_counter_ns() - w0) / reps / 1e3)
    return best, wall


def rows(shape, reps, dev):
    b, s, h, d = shape
    gen = torch.Generator().manual_seed(0)
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    q, k, v = (torch.randn(b, s, h, d, generator=gen).to(dev, dt) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # SDPA's [B, H, S, D] view of the same memory
    qg = q.clone().requires_grad_()
    qgt = qg.transpose(1, 2)
    out, lse = torch.empty_like(q), torch.empty(b, h, s, device=dev)
    ctx = _capi.context(_capi.BACKEND_CUDA if dev == "cuda" else _capi.BACKEND_CPU, 0)
    opts = _capi.options(None, False, (-1, -1), 0.0, "auto", False)[:7] + (0, 0, 0, 0, 0)
    views = [_torch._view(t, "t") for t in (q, k, v, out)]
    with torch.no_grad():
        c = best_us(lambda: ctx.forward(opts, *views, lse.data_ptr()), reps, dev)
        table = [("C call (_ext.forward, outputs preallocated)", c),
                 ("flash_attn_func, no grad", best_us(lambda: flashattn.flash_attn_func(q, k, v), reps, dev)),
                 ("SDPA, no grad", best_us(lambda: F.scaled_dot_product_attention(qt, kt, vt), reps, dev))]
    table += [("flash_attn_func, q requires grad", best_us(lambda: flashattn.flash_attn_func(qg, k, v), reps, dev)),
              ("SDPA, q requires grad", best_us(lambda: F.scaled_dot_product_attention(qgt, kt, vt), reps, dev))]
    return c, table


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="1,128,8,128", help="B,S,H,D")
    p.add_argument("--reps", type=int, default=300)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--profile", action="store_true")
    a = p.parse_args()
    print(f"flashattn {flashattn.version()}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    for shape in ([int(x) for x in a.shape.split(",")], [1, 16, 1, 64]):
        c, table = rows(shape, a.reps if shape[1] > 16 else 20 * a.reps, a.device)
        dt = "bf16 on CUDA" if a.device == "cuda" else "fp32 on the CPU"
        print(f"\n[B, S, H, D] = {shape}, {dt}, us per call (thread CPU time and wall time, best of 5)")
        print("| call | us (thread) | above the C call | us (wall) |")
        print("|---|---|---|---|")
        for name, (us, wall) in table:
            print(f"| {name} | {us:.1f} | {us - c[0]:+.1f} | {wall:.1f} |")
    if a.profile:
        q = torch.randn(1, 16, 1, 64)
        with torch.no_grad():
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(20000):
                flashattn.flash_attn_func(q, q, q)
            prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
