"""PyTorch SDPA (cuDNN and flash backends) on the protocol shapes, timed like the lab (median of 20 samples of
10 calls after warm-up, CUDA events), then one table beside the lab's CSV."""
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F


def bench(backend, B, S, H, D, causal):
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    try:
        with sdpa_kernel(backend):
            for _ in range(3):
                F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
            torch.cuda.synchronize()
            ts = []
            for _ in range(20):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(10):
                    F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
                e1.record()
                e1.synchronize()
                ts.append(e0.elapsed_time(e1) / 10)
    except RuntimeError as e:
        print("  %s failed: %s" % (backend, str(e).splitlines()[0]), file=sys.stderr)
        return float("nan")
    ts.sort()
    return ts[len(ts) // 2]


def main():
    ours = {}
    for line in open(sys.argv[1]).read().splitlines()[1:]:
        sched, d, c, s, b, h, ms, tf = line.split(",")
        ours.setdefault((int(d), int(c), int(s)), {})[sched] = float(tf)
    print("device: %s, torch %s, cuDNN %s" % (torch.cuda.get_device_name(), torch.__version__,
                                             torch.backends.cudnn.version()))
    print("FLASH3 schedules: s0 serial, s1 intra-warpgroup overlap, s2 overlap + ping-pong, s3 = s2 with the wide "
          "key block, F3 = fa3_fwd (its default choice); ratios for F3")
    print("| d | causal | seqlen | s0 | s1 | s2 | s3 | F3 | cuDNN | torch-flash | F3/cuDNN | F3/flash |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (d, c, s), sc in ours.items():
        tf = sc["s4"]
        B, H = 16384 // s, 2048 // d
        flops = 4.0 * B * H * s * s * d / (2.0 if c else 1.0)
        r = {}
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            ms = bench(be, B, s, H, d, c)
            r[name] = flops / (ms * 1e-3) / 1e12
        print("| %d | %d | %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f | %.2f |" % (
            d, c, s, sc["s0"], sc["s1"], sc["s2"], sc["s3"], tf, r["cudnn"], r["flash"], tf / r["cudnn"],
            tf / r["flash"]), flush=True)


main()
