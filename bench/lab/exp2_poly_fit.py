#!/usr/bin/env python3
"""The coefficients of fa3_exp2_poly (src/cuda/wgmma/exp2_poly.h): p(f) = 1 + c1 f + c2 f^2 + c3 f^3 ~ 2^f on [0, 1],
minimax in the relative error |p(f)/2^f - 1| by the Remez exchange, with p(0) = 1 held (2^n exact at integers).
Pure Python (no numpy); prints the coefficients as float32 literals and the fit's error in double. The measured
error of the float32 code is tests/test_exp2_poly.c's. Run: python3 bench/lab/exp2_poly_fit.py"""
import math
import struct

DEG = 3
GRID = [i / 20000 for i in range(1, 20001)]  # (0, 1]: e(0) = 0 by construction


def solve(a, b):
    """Gaussian elimination with partial pivoting."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        for r in range(c + 1, n):
            f = m[r][c] / m[c][c]
            for k in range(c, n + 1):
                m[r][k] -= f * m[c][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x


def rel_err(c, f):
    p = 1.0 + sum(ci * f ** (i + 1) for i, ci in enumerate(c))
    return p / 2.0 ** f - 1.0


def remez():
    ref = [(k + 1) / (DEG + 1) for k in range(DEG + 1)]  # DEG unknowns + the level E: DEG + 1 points in (0, 1]
    for _ in range(30):
        # c1 f + ... + cD f^D - (-1)^k E 2^f = 2^f - 1 at each reference point
        a = [[f ** (i + 1) for i in range(DEG)] + [-((-1) ** k) * 2.0 ** f] for k, f in enumerate(ref)]
        sol = solve(a, [2.0 ** f - 1.0 for f in ref])
        c = sol[:DEG]
        # new reference: the extremum of each run of one sign of the error
        e = [rel_err(c, f) for f in GRID]
        runs, cur = [], [0]
        for i in range(1, len(GRID)):
            if (e[i] >= 0) == (e[cur[0]] >= 0):
                cur.append(i)
            else:
                runs.append(cur)
                cur = [i]
        runs.append(cur)
        ext = [max(r, key=lambda i: abs(e[i])) for r in runs]
        while len(ext) > DEG + 1:  # drop the smallest end extremum
            ext.pop(0 if abs(e[ext[0]]) < abs(e[ext[-1]]) else -1)
        if len(ext) < DEG + 1:
            break
        ref = [GRID[i] for i in ext]
    return c, max(abs(x) for x in e)


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


if __name__ == "__main__":
    c, err = remez()
    c32 = [f32(x) for x in c]
    err32 = max(abs(rel_err(c32, f)) for f in GRID)
    for i, x in enumerate(c32):
        print(f"c{i + 1} = {x:.9g}f  ({x.hex()})")
    print(f"minimax relative error {err:.3e} = 2^{math.log2(err):.2f}; with float32 coefficients {err32:.3e} "
          f"= 2^{math.log2(err32):.2f} (exact arithmetic)")
