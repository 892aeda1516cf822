"""The lab's A/B table: per shape (algo, head_dim, causal, pass, seqlen), each build's best TFLOP/s over the rounds
in OUT/<name>.csv (flashattn bench --csv rows without the header), and each build's ratio to the first.
    python3 bench/lab/best_table.py OUT base variant...   (compare-trees.sh, ab-variants.sh)"""
import csv
import sys

COLS = "device,algo,dtype,batch,heads,seqlen_q,seqlen_k,head_dim,causal,pass,ms,gflops".split(",")


def best(path):
    out = {}
    for row in csv.reader(open(path)):
        r = dict(zip(COLS, row))
        try:
            g = float(r["gflops"])
        except (KeyError, ValueError):
            continue
        k = (r["algo"], r["head_dim"], r["causal"], r["pass"], int(r["seqlen_q"]))
        out[k] = max(out.get(k, 0.0), g)
    return out


def main(out, names):
    b = {n: best(f"{out}/{n}.csv") for n in names}
    base, rest = names[0], names[1:]
    print("| algo | d | causal | pass | seqlen | " + " | ".join(f"{n} TFLOP/s" for n in names) + " | " +
          " | ".join(f"{n}/{base}" for n in rest) + " |")
    print("|---" * (5 + len(names) + len(rest)) + "|")
    ratios = {n: [] for n in rest}
    for k in sorted(b[base]):
        if not all(k in b[n] for n in names):
            continue
        for n in rest:
            ratios[n].append(b[n][k] / b[base][k])
        vals = " | ".join(f"{b[n][k] / 1e3:.4g}" for n in names)
        rat = " | ".join(f"{b[n][k] / b[base][k]:.3f}" for n in rest)
        print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {k[4]} | {vals} | {rat} |")
    for n in rest:
        if ratios[n]:
            print(f"\n{len(ratios[n])} shapes: {n}/{base} min {min(ratios[n]):.3f}, max {max(ratios[n]):.3f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
