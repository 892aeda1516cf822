"""What a flashattn call costs in Python beyond its C call, beside PyTorch's SDPA, on the CPU.

    OMP_NUM_THREADS=1 python bench/lab/py_call_cost.py [--shape 1,128,8,128] [--reps 300] [--profile]

Times (thread CPU time, best of 5 rounds of --reps calls, fp32): the C call as _ext makes it with preallocated
outputs, flash_attn_func without and with autograd recording, and F.scaled_dot_product_attention on the [B, H, S, D]
view of the same memory; the binding's overhead is a call's time minus the C call's. --profile adds cProfile's
table of the Python layer of flash_attn_func (no grad) at a tiny shape, where nothing but the layer is left."""
import argparse
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F

import flashattn
from flashattn import _capi, _torch


def best_us(fn, reps, rounds=5):
    for _ in range(min(reps, 20)):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.thread_time_ns()
        for _ in range(reps):
            fn()
        best = min(best, (time.thread_time_ns() - t0) / reps / 1e3)
    return best


def rows(shape, reps):
    b, s, h, d = shape
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, generator=gen) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # SDPA's [B, H, S, D] view of the same memory
    qg = q.clone().requires_grad_()
    qgt = qg.transpose(1, 2)
    out, lse = torch.empty_like(q), torch.empty(b, h, s)
    ctx = _capi.context(_capi.BACKEND_CPU, 0)
    opts = _capi.options(None, False, (-1, -1), 0.0, "auto", False)[:7] + (0, 0, 0, 0, 0)
    views = [_torch._view(t, "t") for t in (q, k, v, out)]
    with torch.no_grad():
        c = best_us(lambda: ctx.forward(opts, *views, lse.data_ptr()), reps)
        table = [("C call (_ext.forward, outputs preallocated)", c),
                 ("flash_attn_func, no grad", best_us(lambda: flashattn.flash_attn_func(q, k, v), reps)),
                 ("SDPA, no grad", best_us(lambda: F.scaled_dot_product_attention(qt, kt, vt), reps))]
    table += [("flash_attn_func, q requires grad", best_us(lambda: flashattn.flash_attn_func(qg, k, v), reps)),
              ("SDPA, q requires grad", best_us(lambda: F.scaled_dot_product_attention(qgt, kt, vt), reps))]
    return c, table


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="1,128,8,128", help="B,S,H,D")
    p.add_argument("--reps", type=int, default=300)
    p.add_argument("--profile", action="store_true")
    a = p.parse_args()
    print(f"flashattn {flashattn.version()}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    for shape in ([int(x) for x in a.shape.split(",")], [1, 16, 1, 64]):
        c, table = rows(shape, a.reps if shape[1] > 16 else 20 * a.reps)
        print(f"\n[B, S, H, D] = {shape}, fp32, us per call (thread CPU time, best of 5)")
        print("| call | us | above the C call |")
        print("|---|---|---|")
        for name, us in table:
            print(f"| {name} | {us:.1f} | {us - c:+.1f} |")
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
