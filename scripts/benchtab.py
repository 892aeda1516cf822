"""Shared by the PyTorch reference scripts (bench_gpu_torch.py, bench_kvcache_torch.py, bench_cpu_torch.py): the
`run` / `merge` command line and the ratio and worst-ratio helpers of their tables (benchmark only)."""
import csv
import statistics
import sys


def write_csv(path, header, rows):
    """The rows a run measured, under their header."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def ratio(a, b):
    """a / b to two places, or '-' when either is missing."""
    return "-" if a is None or b is None or b == 0 else "%.2f" % (a / b)


def keep_worst(worst, key, a, ref):
    """worst[key] = the smallest a / ref seen (skipped when either is missing)."""
    if a is not None and ref:
        worst[key] = min(worst.get(key, a / ref), a / ref)


def cuda_median_ms(step, reps, before=None):
    """One warm-up call of step, then the median over reps of its time by CUDA events (before() runs untimed ahead
    of each, e.g. an L2 flush)."""
    import torch
    step()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if before:
            before()
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        step()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def main(doc, run, merge):
    """`SCRIPT run ARGS...` or `SCRIPT merge OURS.csv TORCH.csv`; anything else prints doc and exits 2."""
    if len(sys.argv) >= 2 and sys.argv[1] == "run":
        run(sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "merge":
        merge(sys.argv[2], sys.argv[3])
    else:
        print(doc)
        sys.exit(2)
