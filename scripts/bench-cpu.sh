#!/usr/bin/env bash
# CPU benchmark (`make bench`): the CPU backend against its targets and anchors in one run, on this machine.
# Protocol of docs/benchmarks.md: model dim 2048 (heads = 2048/d), batch·seqlen = 16k tokens, fp32 unless
# stated, warm-up, median of REPS; the algorithms of one configuration run interleaved (flashattn bench).
#
# OpenBLAS "at its best" for the STANDARD baseline, in this script only (never in tests or CI):
# OPENBLAS_CORETYPE=SkylakeX (Debian's 0.3.21 takes Zen for Haswell) and OPENBLAS_L2_SIZE unset; the library
# links the OpenMP build of OpenBLAS when it is the system's libopenblas (update-alternatives).
#
# Env: BUILD (default build-cpu-bench), OUT_DIR (default $BUILD/bench-cpu), REPS (default 4) x ROUNDS (default 3)
# = 12 timed reps per configuration, QUICK=1 (d=64 only, 3 x 2), TOKENS (batch·seqlen, default 16384), MEM_SEQLEN
# (default 65536); smaller values are for smoke runs. A full run takes about 15 minutes on 2 cores (seqlen 2k for
# the fp32/bf16/backward rows, 4k for the FLASH2 >= FLASH1 >= STANDARD row, 64k for the memory row).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-cpu-bench}
OUT=${OUT_DIR:-$BUILD/bench-cpu}
REPS=${REPS:-4}
ROUNDS=${ROUNDS:-3}
TOKENS=${TOKENS:-16384}
MEM_N=${MEM_SEQLEN:-65536}
DIMS=64,128
if [ "${QUICK:-0}" = 1 ]; then REPS=3; ROUNDS=2; DIMS=64; fi
mkdir -p "$OUT"
[ -f "$BUILD/CMakeCache.txt" ] || cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DFA_CUDA=OFF -DFA_BUILD_TESTS=OFF >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target flashattn_cli cpu_kernels >/dev/null
export OPENBLAS_CORETYPE=SkylakeX
unset OPENBLAS_L2_SIZE
FA="$BUILD/flashattn"
echo "== machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, $(date -u +%FT%TZ)"
echo "== load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (other jobs on these cores inflate the spread)"
echo "== OpenBLAS: $(readlink -f /usr/lib/x86_64-linux-gnu/libopenblas.so.0 2>/dev/null || echo '?'), OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE"

echo; echo "== peak: our micro-kernels and OpenBLAS sgemm (bench/lab/cpu_kernels --peak)"
"$BUILD/bench/lab/cpu_kernels" --peak | tee "$OUT/peak.txt"

bench() { # one flashattn bench command, ROUNDS times; the tables to the terminal and $OUT/$tag.r<k>.md
  local tag=$1; shift
  echo; echo "== $tag: flashattn bench $* --tokens $TOKENS --reps $REPS   (x $ROUNDS rounds, interleaved)"
  for r in $(seq 1 "$ROUNDS"); do
    "$FA" bench "$@" --tokens "$TOKENS" --reps "$REPS" | tee "$OUT/$tag.r$r.md" | grep -E '^\|' | tail -n +3
  done
}
# The VM is shared and drifts by up to 2x over minutes: every command runs ROUNDS times and the summary takes the
# median over the rounds; the algorithms of one configuration are interleaved rep by rep by the CLI, so ratios
# between algorithms are the robust figures, ratios between configurations (causal/non-causal, bf16/fp32,
# bwd/fwd) less so.
bench fwd_f32 --algo standard,flash2 --d "$DIMS" --seqlen 2048 --causal 0,1 --pass fwd
bench fwd_512 --algo standard,flash2 --d "$DIMS" --seqlen 512 --pass fwd
bench fwd_bf16 --algo flash2 --dtype f32,bf16 --d "$DIMS" --seqlen 2048 --pass fwd
bench bwd --algo standard,flash2 --d "$DIMS" --seqlen 2048 --pass fwd,bwd
bench order_4k --algo standard,flash1,flash2 --d 64 --seqlen 4096 --pass fwd

if [ -n "${GGML_DIR:-}" ]; then # ggml's CPU flash attention on the same shapes (GGML_DIR: a ggml source tree)
  echo; echo "== ggml: ggml_flash_attn_ext (f32, tiled path) vs FLASH2 fp32 fwd, seqlen 2048, alternating"
  if [ ! -x "$BUILD/ggml/ggml_fa" ]; then
    cmake -S "$GGML_DIR" -B "$BUILD/ggml" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_BUILD_TESTS=OFF \
      -DGGML_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_OPENMP=ON >/dev/null
    cmake --build "$BUILD/ggml" -j "$(nproc)" >"$OUT/ggml-build.log" 2>&1
    cc -O2 -std=c11 -I"$GGML_DIR/include" bench/lab/ggml_fa.c -o "$BUILD/ggml/ggml_fa" "$BUILD/ggml/src/libggml.a" \
      "$BUILD/ggml/src/libggml-cpu.a" "$BUILD/ggml/src/libggml-base.a" -lstdc++ -lgomp -lm -lpthread
  fi
  for r in $(seq 1 "$ROUNDS"); do
    for d in $(echo "$DIMS" | tr , ' '); do
      for c in 0 1; do
        "$BUILD/ggml/ggml_fa" "$d" 2048 "$c" "$REPS" "$(nproc)" | tee -a "$OUT/ggml.txt"
        "$FA" bench --algo flash2 --d "$d" --seqlen 2048 --causal "$c" --tokens "$TOKENS" --reps "$REPS" --csv \
          | tail -n +2 | tee -a "$OUT/ggml_flash2.csv"
      done
    done
  done
fi

echo; echo "== memory: seqlen $MEM_N, d 64, 1 head, f32, FLASH2 (/usr/bin/time -v max RSS)"
io_mb() { awk -v n="$MEM_N" -v d=64 -v k="$1" 'BEGIN { printf "%.1f", k * n * d * 4 / 1e6 + n * 4 / 1e6 }'; }
for pass in fwd bwd; do
  /usr/bin/time -v "$FA" bench --algo flash2 --batch 1 --heads 1 --d 64 --seqlen "$MEM_N" --pass "$pass" --reps 1 \
    --warmup 0 >"$OUT/mem_$pass.md" 2>"$OUT/mem_$pass.time" || true
  rss_kb=$(awk -F: '/Maximum resident set size/ { gsub(/ /, "", $2); print $2 }' "$OUT/mem_$pass.time")
  tensors=$([ "$pass" = fwd ] && io_mb 4 || io_mb 8) # q,k,v,o (+ dO, dQ, dK, dV) and LSE
  extra=$(grep -E '^\| flash2' "$OUT/mem_$pass.md" | awk -F'|' '{ gsub(/ /, "", $16); print $16 }')
  awk -v r="$rss_kb" -v t="$tensors" -v e="$extra" -v p="$pass" 'BEGIN {
    printf "  %s: max RSS %.1f MB, inputs+outputs %.1f MB -> %.1f MB beyond them (library workspace: %s MB)\n",
           p, r * 1024 / 1e6, t, r * 1024 / 1e6 - t, e }'
done
awk -v n="$MEM_N" 'BEGIN { printf "  (STANDARD would materialise S: %d^2 x 4 B = %.1f GB per head)\n", n, n * n * 4 / 1e9 }'

echo; echo "== summary (GFLOP/s from the tables above; ratios within one command)"
python3 - "$OUT" <<'EOF'
import re, sys, os
out = sys.argv[1]
import glob, statistics
def rows(tag):
    """Rows of every round of a command, GFLOP/s = median over the rounds."""
    allr = {}
    for fn in sorted(glob.glob(os.path.join(out, tag + ".r*.md"))):
        for r in rows1(fn):
            allr.setdefault((r["algo"], r["dtype"], r["S"], r["d"], r["causal"], r["pass_"]), []).append(r)
    res = []
    for k, lst in allr.items():
        r = dict(lst[0])
        r["gf"] = statistics.median(x["gf"] for x in lst)
        r["rounds"] = ", ".join("%.0f" % x["gf"] for x in lst)
        res.append(r)
    return res
def rows1(fn):
    r = []
    for line in open(fn):
        c = [x.strip() for x in line.split("|")]
        if len(c) < 18 or c[1] not in ("standard", "flash1", "flash2"): continue
        try:
            r.append(dict(algo=c[1], kernel=c[2], dtype=c[3], B=int(c[4]), H=int(c[5]), S=int(c[6]), d=int(c[8]),
                          causal=c[9] == "yes", pass_=c[10], ms=float(c[11]), gf=float(c[13]), extra=float(c[15]),
                          rd=float(c[16]), wr=float(c[17])))
        except ValueError:
            pass
    return r
def get(rs, **k):
    for r in rs:
        if all(r[a] == b for a, b in k.items()): return r
    return None
f = rows("fwd_f32")
print("GFLOP/s are medians over the rounds (each round: median of REPS); per-round values in brackets.")
print("FLASH2 fp32 fwd vs STANDARD (%s), non-causal / causal:" % (get(f, algo="standard") or {}).get("kernel", "?"))
for d in sorted({r["d"] for r in f}):
    for S in sorted({r["S"] for r in f}):
        for c in (False, True):
            a, s = get(f, algo="flash2", d=d, S=S, causal=c), get(f, algo="standard", d=d, S=S, causal=c)
            if a and s:
                print("  d=%3d S=%5d %-10s flash2 %6.1f [%s]  standard %6.1f [%s]  -> %.2fx (target %.1fx)" %
                      (d, S, "causal" if c else "non-causal", a["gf"], a["rounds"], s["gf"], s["rounds"], a["gf"] / s["gf"],
                       1.2 if d == 128 else 1.1))
print("FLASH2 causal / non-causal GFLOP/s (target >= 0.8):")
for d in sorted({r["d"] for r in f}):
    for S in sorted({r["S"] for r in f}):
        a, b = get(f, algo="flash2", d=d, S=S, causal=True), get(f, algo="flash2", d=d, S=S, causal=False)
        if a and b: print("  d=%3d S=%5d  %.1f / %.1f = %.2f" % (d, S, a["gf"], b["gf"], a["gf"] / b["gf"]))
g = rows("fwd_bf16")
print("FLASH2 bf16 / fp32 forward (target >= 1.5):")
for d in sorted({r["d"] for r in g}):
    a, b = get(g, d=d, dtype="bf16"), get(g, d=d, dtype="f32")
    if a and b: print("  d=%3d  %.1f / %.1f = %.2fx (kernel %s)" % (d, a["gf"], b["gf"], a["gf"] / b["gf"], a["kernel"]))
w = rows("bwd")
print("FLASH2 backward / forward GFLOP/s (target >= 0.55), and vs STANDARD backward:")
for d in sorted({r["d"] for r in w}):
    a, b = get(w, algo="flash2", d=d, pass_="bwd"), get(w, algo="flash2", d=d, pass_="fwd")
    s = get(w, algo="standard", d=d, pass_="bwd")
    if a and b:
        print("  d=%3d  bwd %.1f / fwd %.1f = %.2f%s" % (d, a["gf"], b["gf"], a["gf"] / b["gf"],
              ("   (standard bwd %.1f -> %.2fx)" % (s["gf"], a["gf"] / s["gf"])) if s else ""))
t = rows("fwd_512")
print("seqlen 512, FLASH2 vs STANDARD (target >= 1.0):")
for d in sorted({r["d"] for r in t}):
    a, s = get(t, algo="flash2", d=d), get(t, algo="standard", d=d)
    if a and s: print("  d=%3d  %.1f vs %.1f = %.2fx" % (d, a["gf"], s["gf"], a["gf"] / s["gf"]))
o = rows("order_4k")
print("seqlen 4k, d=64: GFLOP/s and counted slow-memory MB (read + written):")
for r in o:
    print("  %-8s %6.1f GFLOP/s  %9.0f MB read  %9.0f MB written  extra %.1f MB" % (r["algo"], r["gf"], r["rd"], r["wr"], r["extra"]))
EOF
if [ -f "$OUT/ggml.txt" ]; then
  echo "FLASH2 vs ggml_flash_attn_ext, fp32 fwd, seqlen 2048 (medians over rounds; target >= 2.3x):"
  for d in $(echo "$DIMS" | tr , ' '); do
    for c in 0 1; do
      g=$(grep "d=$d causal=$c " "$OUT/ggml.txt" | sed 's/.*ms, \([0-9.]*\) GFLOP.*/\1/' | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
      f=$(awk -F, -v d="$d" -v c="$c" '$8 == d && $9 == c { print $12 }' "$OUT/ggml_flash2.csv" | sort -n |
          awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
      awk -v d="$d" -v c="$c" -v f="$f" -v g="$g" 'BEGIN { printf "  d=%3d causal=%d  flash2 %.1f  ggml %.1f  -> %.2fx\n", d, c, f, g, f / g }'
    done
  done
fi
echo; echo "tables and logs: $OUT"
