#!/usr/bin/env python3
"""PyTorch SDPA decoding timings for scripts/bench-kvcache-gpu.sh (benchmark only: never used by the library or tests).

  bench_kvcache_torch.py run --out torch.csv [--batch 1,16,64] [--cache 1024,8192,65536] [--heads 8/8,32/8]
                             [--d 128] [--reps 20] [--flush read|write]
  bench_kvcache_torch.py merge ours.csv torch.csv   -> one table: TB/s of K+V read, ours (contiguous and paged)
                                                       against cuDNN and torch-flash, and the ratios

One new query row per sequence against a cache of `cache` keys, bf16, q [B, Hq, 1, D], K/V [B, Hk, L, D]
(contiguous, SDPA's own layout), no mask (a single new row sees every key), GQA through enable_gqa=True. Each
repetition first reads a 256 MB buffer (beyond the H200's L2, as `flashattn bench --mode kvcache` does; --flush write:
writes it, which leaves dirty lines for the timed call to write back, as `--flush write` there), then times the call
with CUDA events; the median of --reps. GB/s counts K and V once (2 * B * L * Hk * D * 2 bytes), the same
count as our CLI."""
import csv

from benchtab import cuda_median_ms, keep_worst, main, ratio, write_csv


def run(args):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    opts = dict(batch="1,16,64", cache="1024,8192,65536", heads="8/8,32/8", d="128", reps="20", out="torch.csv",
                flush="read")
    i = 0
    while i < len(args):
        opts[args[i].lstrip("-")] = args[i + 1]
        i += 2
    reps, d = int(opts["reps"]), int(opts["d"])
    backends = [("torch-cudnn", SDPBackend.CUDNN_ATTENTION), ("torch-flash", SDPBackend.FLASH_ATTENTION)]
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    flush.fill_(1)
    before = (lambda: flush.fill_(1)) if opts["flush"] == "write" else (lambda: flush.sum())
    rows = []
    for hs in opts["heads"].split(","):
        hq, hk = map(int, hs.split("/"))
        for b in map(int, opts["batch"].split(",")):
            for L in map(int, opts["cache"].split(",")):
                q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(b, hk, L, d, device="cuda", dtype=torch.bfloat16)
                v = torch.randn(b, hk, L, d, device="cuda", dtype=torch.bfloat16)
                kv_bytes = 2.0 * b * L * hk * d * 2
                for name, be in backends:
                    try:
                        with sdpa_kernel([be]):
                            ms = cuda_median_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hk),
                                                reps, before=before)
                        rows.append([name, b, L, hq, hk, d, "%.4f" % ms, "%.1f" % (kv_bytes / ms / 1e6)])
                    except Exception as ex:  # a backend that refuses a shape
                        rows.append([name, b, L, hq, hk, d, "error", str(ex).split("\n")[0][:60]])
                    print(",".join(map(str, rows[-1])), flush=True)
                del q, k, v
                torch.cuda.empty_cache()
    write_csv(opts["out"], ["algo", "batch", "cache", "heads_q", "heads_k", "d", "ms", "kv_gbs"], rows)


def merge(ours_csv, torch_csv):
    val = {}  # (impl, batch, cache, hq, hk) -> GB/s or None
    appends, layouts = set(), set()
    with open(ours_csv) as f:
        for r in csv.DictReader(f):
            appends.add(r.get("append", "1"))
            layouts.add(r.get("layout", "bshd"))
            try:
                g = float(r["kv_gbs"]) if r["status"] == "ok" else None
            except (ValueError, KeyError):
                g = None
            impl = "ours" if int(r["page"]) == 0 else "ours-p%d" % int(r["page"])
            val[(impl, int(r["batch"]), int(r["cache"]), int(r["heads_q"]), int(r["heads_k"]))] = g
    with open(torch_csv) as f:
        for r in csv.DictReader(f):
            try:
                g = float(r["kv_gbs"])
            except ValueError:
                g = None
            val[(r["algo"], int(r["batch"]), int(r["cache"]), int(r["heads_q"]), int(r["heads_k"]))] = g
    keys = sorted({k[1:] for k in val}, key=lambda k: (k[2] / k[3], k[0], k[1]))
    cols = ["ours", "ours-p16", "ours-p256", "torch-cudnn", "torch-flash"]

    def fmt(x):
        return "-" if x is None else "%.2f" % (x / 1e3)

    print("TB/s of K+V read, bf16, d = 128, one new row per sequence (one run; ratios from the same run); ours %s"
          % ("appends the new row in the call" if appends == {"1"} else "appends nothing (--append 0)"
             if appends == {"0"} else "mixed --append"))
    print("Our cache's layout: %s; PyTorch's K and V: [batch, heads, seq, d]"
          % " ".join("[.., heads, seq, d]" if x == "bhsd" else "[.., seq, heads, d]" for x in sorted(layouts)))
    print("| batch | cache | hq/hk | ours | ours page 16 | ours page 256 | cuDNN | torch-flash | ours/cuDNN "
          "| ours/torch-flash | p16/contig | p256/contig |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    worst = {}
    for (b, L, hq, hk) in keys:
        v = [val.get((c, b, L, hq, hk)) for c in cols]
        print("| %d | %d | %d/%d | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            b, L, hq, hk, *map(fmt, v), ratio(v[0], v[3]), ratio(v[0], v[4]), ratio(v[1], v[0]), ratio(v[2], v[0])))
        for name, a, ref in (("ours/cuDNN", v[0], v[3]), ("ours/torch-flash", v[0], v[4]),
                             ("page16/contiguous", v[1], v[0]), ("page256/contiguous", v[2], v[0])):
            keep_worst(worst, name, a, ref)
    for name, r in sorted(worst.items()):
        print("worst %s over the table: %.2f" % (name, r))


if __name__ == "__main__":
    main(__doc__, run, merge)
