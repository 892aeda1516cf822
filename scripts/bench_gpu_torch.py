#!/usr/bin/env python3
"""PyTorch SDPA reference timings for scripts/bench-gpu.sh (benchmark only: never used by the library or tests), and
the real FlashAttention-3 forward (PyPI fa3-fwd, `from fa3_fwd_interface import flash_attn_func`) where it imports.

  bench_gpu_torch.py run  --out torch.csv [--d 64,128] [--seqlen 512,...] [--causal 0,1] [--pass fwd,bwd]
                          [--fp8 128,256]  (FA3's e4m3 forward at these head dims too, as "fa3-e4m3")
                          [--dv 128] [--heads 16] [--tokens 16384]  (V's own head dim, e.g. d 192 with dv 128; heads
                          instead of 2048/d; batch = tokens/seqlen)
  bench_gpu_torch.py merge ours.csv torch.csv     -> one table: TFLOP/s of every algorithm and the ratios

Protocol of docs/benchmarks.md: model dim 2048 (heads = 2048/d), batch*seqlen = 16384, bf16, layout
[B, H, S, D]; warm-up, then the median of --reps runs timed with CUDA events. FLOPs 4*B*H*S*S*D (halved when
causal), backward = 2.5 x forward; the backward is timed alone (out.backward on a retained graph)."""
import csv
import subprocess

from benchtab import cuda_median_ms, keep_worst, main, ratio, write_csv


def flops(b, h, s, d, causal, pas, dv=None):
    f = 2.0 * b * h * s * s * (d + (d if dv is None else dv))  # QKᵀ over d, PV over dv
    if causal:
        f /= 2
    return f * (2.5 if pas == "bwd" else 1.0)


def run(args):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    opts = dict(d="64,128", seqlen="512,1024,2048,4096,8192,16384", causal="0,1", **{"pass": "fwd,bwd"}, reps="10",
                out="torch.csv", tokens="16384", fp8="", dv="", heads="")
    i = 0
    while i < len(args):
        opts[args[i].lstrip("-")] = args[i + 1]
        i += 2
    reps = int(opts["reps"])
    backends = [("torch-flash", SDPBackend.FLASH_ATTENTION), ("torch-cudnn", SDPBackend.CUDNN_ATTENTION)]
    try:  # Dao-AILab's FlashAttention-3 forward (PyPI fa3-fwd), when installed: the FLASH3 forward's anchor
        from fa3_fwd_interface import flash_attn_func as fa3
    except ImportError as ex:
        fa3 = None
        print("fa3: absent (%s)" % ex, flush=True)
    rows = []
    dims = [int(x) for x in opts["d"].split(",")]
    fp8_only = [int(x) for x in opts["fp8"].split(",") if x and int(x) not in dims]
    for d in dims + fp8_only:  # an FP8 head dim outside --d: the forward only, for the FP8 table's anchors
        passes = opts["pass"].split(",") if d in dims else ["fwd"]
        h = int(opts["heads"]) if opts["heads"] else 2048 // d
        dv = int(opts["dv"]) if opts["dv"] else d
        for s in map(int, opts["seqlen"].split(",")):
            b = max(1, int(opts["tokens"]) // s)
            for causal in map(int, opts["causal"].split(",")):
                q, k, v = (torch.randn(b, h, s, x, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                           for x in (d, d, dv))
                dout = torch.randn(b, h, s, dv, device="cuda", dtype=torch.bfloat16)
                for name, be in backends:
                    for pas in passes:
                        try:
                            with sdpa_kernel([be]):
                                def fwd():
                                    return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
                                out = fwd()
                                if pas == "bwd":
                                    def step():
                                        q.grad = k.grad = v.grad = None
                                        out.backward(dout, retain_graph=True)
                                else:
                                    def step():
                                        fwd()
                                ms = cuda_median_ms(step, reps)
                                tf = flops(b, h, s, d, causal, pas, dv) / ms / 1e9
                                rows.append([name, d, s, causal, pas, b, h, "%.4f" % ms, "%.1f" % tf, dv])
                        except Exception as ex:  # a backend that refuses a shape
                            rows.append([name, d, s, causal, pas, b, h, "error", str(ex).split("\n")[0][:60], dv])
                        print(",".join(map(str, rows[-1])), flush=True)
                if fa3 is not None and dv == d and "fwd" in passes:  # the real FA3 forward, [B, S, H, D]
                    qt, kt, vt = (x.detach().transpose(1, 2).contiguous() for x in (q, k, v))
                    try:
                        ms = cuda_median_ms(lambda: fa3(qt, kt, vt, causal=bool(causal)), reps)
                        rows.append(["fa3", d, s, causal, "fwd", b, h, "%.4f" % ms,
                                     "%.1f" % (flops(b, h, s, d, causal, "fwd") / ms / 1e9)])
                    except Exception as ex:
                        rows.append(["fa3", d, s, causal, "fwd", b, h, "error", str(ex).split("\n")[0][:60]])
                    print(",".join(map(str, rows[-1])), flush=True)
                    if str(d) in opts["fp8"].split(","):  # FA3's e4m3 forward (descales 1, out bf16)
                        q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (qt, kt, vt))
                        try:
                            ms = cuda_median_ms(lambda: fa3(q8, k8, v8, causal=bool(causal)), reps)
                            rows.append(["fa3-e4m3", d, s, causal, "fwd", b, h, "%.4f" % ms,
                                         "%.1f" % (flops(b, h, s, d, causal, "fwd") / ms / 1e9)])
                        except Exception as ex:
                            rows.append(["fa3-e4m3", d, s, causal, "fwd", b, h, "error",
                                         str(ex).split("\n")[0][:60]])
                        print(",".join(map(str, rows[-1])), flush=True)
                        del q8, k8, v8
                    del qt, kt, vt
                del q, k, v, dout
                torch.cuda.empty_cache()
    rows = [r if len(r) == 10 else r + [r[1]] for r in rows]  # FA3's rows: dv = d
    write_csv(opts["out"], ["algo", "d", "seqlen", "causal", "pass", "batch", "heads", "ms", "tflops", "dv"], rows)


def gpu_name():
    """The GPU the table was measured on (nvidia-smi's name; merge runs where the benchmark ran)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout.strip().splitlines()
        return out[0] if out else "GPU"
    except (OSError, subprocess.SubprocessError):
        return "GPU"


def merge(ours_csv, torch_csv):
    val = {}  # (algo, d, seqlen, causal, pass) -> TFLOP/s or None
    with open(ours_csv) as f:
        for r in csv.DictReader(f):
            try:
                tf = float(r["gflops"]) / 1e3
            except (ValueError, KeyError):
                tf = None
            algo = r["algo"] + ("-e4m3" if r["dtype"].startswith("f8") else "")
            val[(algo, int(r["head_dim"]), int(r["seqlen_q"]), int(r["causal"]), r["pass"])] = tf
    with open(torch_csv) as f:
        for r in csv.DictReader(f):
            try:
                tf = float(r["tflops"])
            except ValueError:
                tf = None
            val[(r["algo"], int(r["d"]), int(r["seqlen"]), int(r["causal"]), r["pass"])] = tf
    keys = sorted({k[1:] for k in val}, key=lambda k: (k[3], k[0], k[2], k[1]))
    cols = ["standard", "flash1", "flash2", "flash3", "torch-flash", "torch-cudnn", "fa3"]

    def fmt(x):
        return "-" if x is None else "%.1f" % x

    print("TFLOP/s, bf16, %s (one run; ratios from the same run; best = the faster of FLASH3 and FLASH2)" % gpu_name())
    print("| pass | d | causal | seqlen | standard | flash1 | flash2 | flash3 | torch-flash | torch-cudnn | FA3 "
          "| best/torch-flash | best/cuDNN | F3/FA3 | F3/F2 | F2/F1 | F1/std |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    worst = {}
    for (d, s, c, p) in keys:
        v = [val.get((a, d, s, c, p)) for a in cols]
        best = max([x for x in v[2:4] if x is not None], default=None)
        print("| %s | %d | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            p, d, c, s, *map(fmt, v), ratio(best, v[4]), ratio(best, v[5]), ratio(v[3], v[6]), ratio(v[3], v[2]),
            ratio(v[2], v[1]), ratio(v[1], v[0])))
        for name, ref in (("torch-flash", v[4]), ("cuDNN", v[5]), ("FA3", v[6])):
            keep_worst(worst, (p, name), best, ref)
    for (p, name), r in sorted(worst.items()):
        print("worst best/%s over the %s rows: %.2f" % (name, p, r))
    fp8 = sorted({k[1:] for k in val if k[0].endswith("-e4m3")}, key=lambda k: (k[0], k[2], k[1]))
    if fp8:  # the FP8 forward beside FA3's and beside our bf16 FLASH3
        print()
        print("FP8 forward, e4m3 in, bf16 out, TFLOP/s (same run)")
        print("| d | causal | seqlen | flash3 bf16 | flash3 e4m3 | FA3 e4m3 | e4m3/FA3-e4m3 | e4m3/bf16 |")
        print("|---|---|---|---|---|---|---|---|")
        for (d, s, c, p) in fp8:
            a, b, f = (val.get((n, d, s, c, p)) for n in ("flash3", "flash3-e4m3", "fa3-e4m3"))
            print("| %d | %d | %d | %s | %s | %s | %s | %s |" % (d, c, s, fmt(a), fmt(b), fmt(f), ratio(b, f),
                                                                 ratio(b, a)))

if __name__ == "__main__":
    main(__doc__, run, merge)
