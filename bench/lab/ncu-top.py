#!/usr/bin/env python3
"""Summarise an Nsight Compute source page (ncu -i R --page source --print-source sass --csv): the instructions
with the most warp-stall samples, and the samples summed per opcode. Usage: ncu-top.py FILE.csv [N]"""
import csv, collections, sys

rows = list(csv.reader(open(sys.argv[1], newline="")))
n = int(sys.argv[2]) if len(sys.argv) > 2 else 25
hi = next(i for i, r in enumerate(rows) if any("Source" == c.strip() for c in r))
head = [c.strip() for c in rows[hi]]
src = head.index("Source")
samp = next(i for i, c in enumerate(head) if c.startswith("Warp Stall Sampling (All"))
body = [r for r in rows[hi + 1:] if len(r) > samp]
def num(x):
    try: return float(x.replace(",", ""))
    except ValueError: return 0.0
tot = sum(num(r[samp]) for r in body) or 1
print("columns:", ", ".join(head[:12]), "...")
print("total samples %.0f; top %d instructions:" % (tot, n))
for r in sorted(body, key=lambda r: -num(r[samp]))[:n]:
    print("%6.2f%%  %s" % (100 * num(r[samp]) / tot, r[src].strip()[:90]))
per = collections.Counter()
for r in body:
    t = r[src].strip().split()
    op = (t[1] if t and t[0].startswith("@") and len(t) > 1 else t[0] if t else "?").split(".")[0]
    per[op] += num(r[samp])
print("per opcode:", ", ".join("%s %.1f%%" % (k, 100 * v / tot) for k, v in per.most_common(14)))
