#!/usr/bin/env python3
"""Summarise the split-KV kernel's per-CTA stamps (a build with -DFA_DEC_STAMPS, run with FA_DEC_STAMPS_FILE=FILE;
src/cuda/decode/stamps.cuh). For each launch shape in FILE, the calls after the first (a warm-up): microseconds from
the first CTA's start to each point, min / median / max over the CTAs, the key loop's own length, and for the global
merge the last CTA of each row tile from its state written to its exit, by phase.
Usage: python3 bench/lab/decode-stamps.py FILE [CALLS]"""
import statistics
import sys

POINTS = ["start", "q", "tile0", "loop", "state", "exit", "counted", "lse", "parts"]
START, Q, TILE0, LOOP, STATE, EXIT, COUNTED, LSE, PARTS, SM = range(10)


def calls_of(path):
    calls, cur = [], None
    for line in open(path):
        if line.startswith("call"):
            cur = {"hdr": line.split(None, 1)[1].strip(), "ctas": []}
            calls.append(cur)
        elif cur is not None and line.strip():
            cur["ctas"].append([int(v) for v in line.split()[1:]])
    return calls


def spread(v):
    v = sorted(v)
    return "%.1f / %.1f / %.1f" % (v[0], statistics.median(v), v[-1]) if v else "-"


def main():
    path = sys.argv[1]
    most = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    shapes = {}
    for c in calls_of(path):
        shapes.setdefault(c["hdr"], []).append(c)
    for hdr, calls in shapes.items():
        print("## " + hdr)
        splits = int(hdr.split("splits=")[1].split()[0])
        for c in calls[1:1 + most]:
            ctas = c["ctas"]
            t0 = min(x[START] for x in ctas)
            # a stamp older than the call's first start is left over from an earlier call (a point this CTA skipped)
            at = lambda x, i: (x[i] - t0) / 1000.0 if x[i] >= t0 else None
            cols = []
            for i, name in enumerate(POINTS[:EXIT + 1]):
                cols.append("%s %s" % (name, spread([at(x, i) for x in ctas if at(x, i) is not None])))
            loops = [(x[LOOP] - x[TILE0]) / 1000.0 for x in ctas if x[TILE0] >= t0 and x[LOOP] >= x[TILE0]]
            cols.append("loop length %s" % spread(loops))
            print("- " + " | ".join(cols))
            if splits > 1 and "cluster=0" in hdr:
                tiles = {}
                for i, x in enumerate(ctas):
                    tiles.setdefault(i // splits, []).append(x)
                phase = {"count": [], "lse": [], "parts": [], "sum": [], "whole": []}
                for xs in tiles.values():
                    last = max(xs, key=lambda x: x[EXIT])
                    if min(last[COUNTED], last[LSE], last[PARTS]) < t0:
                        continue
                    phase["count"].append((last[COUNTED] - last[STATE]) / 1000.0)
                    phase["lse"].append((last[LSE] - last[COUNTED]) / 1000.0)
                    phase["parts"].append((last[PARTS] - last[LSE]) / 1000.0)
                    phase["sum"].append((last[EXIT] - last[PARTS]) / 1000.0)
                    phase["whole"].append((last[EXIT] - last[STATE]) / 1000.0)
                print("  merging CTAs (state to exit): " + " | ".join("%s %s" % (k, spread(v)) for k, v in phase.items()))


if __name__ == "__main__":
    main()
