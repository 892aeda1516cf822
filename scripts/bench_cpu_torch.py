#!/usr/bin/env python3
"""PyTorch CPU SDPA reference timings for scripts/test-cpu-device.sh (benchmark only: never used by the library
or the tests).

  bench_cpu_torch.py run --out torch.csv [--batch 4] [--seqlen 4096] [--d 64,128] [--causal 0,1]
                         [--dtype f32,bf16] [--threads 16] [--reps 3]
  bench_cpu_torch.py merge ours.csv[,...] torch.csv[,...]   -> one table: GFLOP/s forward, ms forward+backward, the
                         ratios (several CSVs per side: rounds of the same command, their medians)

Protocol of docs/benchmarks.md: heads = 2048/d, layout [B, H, S, D]; warm-up, then the median of --reps runs.
Forward FLOPs 4*B*H*S*S*D (halved when causal). "fwdbwd" is one forward plus one backward, timed together as a
training step runs them; ours is the sum of the medians of our fwd and bwd rows of the same command."""
import csv
import statistics
import time

from benchtab import main, write_csv


def flops(b, h, s, d, causal):
    f = 4.0 * b * h * s * s * d
    return f / 2 if causal else f


def run(args):
    import torch
    import torch.nn.functional as F

    opts = dict(batch="4", seqlen="4096", d="64,128", causal="0,1", dtype="f32,bf16", threads="16", reps="3",
                out="torch.csv")
    i = 0
    while i < len(args):
        opts[args[i].lstrip("-")] = args[i + 1]
        i += 2
    torch.set_num_threads(int(opts["threads"]))
    reps = int(opts["reps"])
    types = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    print("torch %s, %d threads, %s" % (torch.__version__, torch.get_num_threads(),
                                        torch.backends.cpu.get_cpu_capability()), flush=True)
    rows = []
    for dt in opts["dtype"].split(","):
        for d in map(int, opts["d"].split(",")):
            h = 2048 // d
            for s in map(int, opts["seqlen"].split(",")):
                b = int(opts["batch"])
                for causal in map(int, opts["causal"].split(",")):
                    q, k, v = (torch.randn(b, h, s, d, dtype=types[dt], requires_grad=True) for _ in range(3))
                    dout = torch.randn(b, h, s, d, dtype=types[dt])
                    for pas in ("fwd", "fwdbwd"):
                        def step():
                            if pas == "fwd":
                                with torch.no_grad():
                                    F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
                            else:
                                q.grad = k.grad = v.grad = None
                                F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)).backward(dout)
                        try:
                            step()
                            times = []
                            for _ in range(reps):
                                t0 = time.perf_counter()
                                step()
                                times.append((time.perf_counter() - t0) * 1e3)
                            ms = statistics.median(times)
                            gf = flops(b, h, s, d, causal) * (3.5 if pas == "fwdbwd" else 1.0) / ms / 1e6
                            rows.append(["torch", dt, d, s, causal, pas, b, h, "%.3f" % ms, "%.1f" % gf])
                        except Exception as ex:  # a dtype or shape this build refuses
                            rows.append(["torch", dt, d, s, causal, pas, b, h, "error", str(ex).split("\n")[0][:60]])
                        print(",".join(map(str, rows[-1])), flush=True)
                    del q, k, v, dout
    write_csv(opts["out"], ["algo", "dtype", "d", "seqlen", "causal", "pass", "batch", "heads", "ms", "gflops"], rows)


def merge(ours_csvs, torch_csvs):
    """Each argument one CSV or several, comma-separated (rounds of the same command): the median over them."""
    runs, shape = {}, {}  # (who, dtype, d, seqlen, causal, pass) -> [ms]; (dtype, d, seqlen, causal) -> (batch, heads)
    for path in ours_csvs.split(","):
        one = {}
        with open(path) as f:
            for r in csv.DictReader(f):
                try:
                    key = (r["dtype"], int(r["head_dim"]), int(r["seqlen_q"]), int(r["causal"]))
                    one[("ours",) + key + (r["pass"],)] = float(r["ms"])
                    shape[key] = (int(r["batch"]), int(r["heads"]))
                except (ValueError, KeyError):
                    pass
        for key in list(one):  # fwd + bwd of the same round
            if key[5] == "fwd" and key[:5] + ("bwd",) in one:
                one[key[:5] + ("fwdbwd",)] = one[key] + one[key[:5] + ("bwd",)]
        for key, x in one.items():
            runs.setdefault(key, []).append(x)
    for path in torch_csvs.split(","):
        with open(path) as f:
            for r in csv.DictReader(f):
                try:
                    key = (r["dtype"], int(r["d"]), int(r["seqlen"]), int(r["causal"]))
                    runs.setdefault(("torch",) + key + (r["pass"],), []).append(float(r["ms"]))
                    shape[key] = (int(r["batch"]), int(r["heads"]))
                except ValueError:
                    pass
    ms = {k: statistics.median(v) for k, v in runs.items()}
    print("medians over %d round(s) of ours and %d of PyTorch" % (len(ours_csvs.split(",")), len(torch_csvs.split(","))))
    keys = sorted({k[1:5] for k in ms})
    print("| dtype | d | seqlen | causal | fwd GFLOP/s ours | torch | ours/torch | fwd+bwd ms ours | torch | "
          "torch/ours |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (dt, d, s, c) in keys:
        b, h = shape[(dt, d, s, c)]
        fo, ft = ms.get(("ours", dt, d, s, c, "fwd")), ms.get(("torch", dt, d, s, c, "fwd"))
        bo, bt = ms.get(("ours", dt, d, s, c, "fwdbwd")), ms.get(("torch", dt, d, s, c, "fwdbwd"))
        g = lambda x: "-" if x is None else "%.0f" % (flops(b, h, s, d, c) / x / 1e6)
        m = lambda x: "-" if x is None else "%.1f" % x
        rf = "-" if fo is None or ft is None else "%.2f" % (ft / fo)
        rb = "-" if bo is None or bt is None else "%.2f" % (bt / bo)
        print("| %s | %d | %d | %d | %s | %s | %s | %s | %s | %s |" % (dt, d, s, c, g(fo), g(ft), rf, m(bo), m(bt), rb))
    print("\n(ratios > 1: ours is faster; the issue's targets: fp32 >= 1.3, bf16 >= 1.2)")


if __name__ == "__main__":
    main(__doc__, run, merge)
