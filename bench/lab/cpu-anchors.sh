#!/usr/bin/env bash
# FLASH2 fp32 forward against the CPU anchors, interleaved in one command: our kernels at each ISA level this CPU
# has (FA_CPU_ISA), a plain OpenBLAS attention (STANDARD through BLAS: QKᵀ sgemm, softmax, PV sgemm) with the
# OpenMP and the pthread OpenBLAS builds (each at its best core type: SkylakeX for the AVX-512 rows, Haswell for
# the AVX2 rows), and ggml's CPU flash_attn_ext (bench/lab/ggml_fa.c) when GGML_FA names its binary.
# Protocol of docs/benchmarks.md (16k tokens, heads = 2048/d); every round runs every row once; the table takes
# the median over ROUNDS. Usage: bench/lab/cpu-anchors.sh BUILD OUT_DIR
# Env: DIMS (64,128), SEQLENS (2048), CAUSAL (0,1), ROUNDS (3), REPS (3), GGML_FA, OLD_BUILD (a second build of
# the CLI, e.g. the base of a change: its FLASH2 rows are added as "old").
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:?usage: $0 BUILD OUT_DIR}
OUT=${2:?usage: $0 BUILD OUT_DIR}
DIMS=${DIMS:-64,128}; SEQLENS=${SEQLENS:-2048}; CAUSAL=${CAUSAL:-0,1}; ROUNDS=${ROUNDS:-3}; REPS=${REPS:-3}
mkdir -p "$OUT"
: >"$OUT/rows.csv"
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { for f in "$@"; do [[ " $flags " == *" $f "* ]] || return 1; done; }
isas="avx2"
has avx512f avx512bw avx512vl avx512dq && isas+=" avx512f"
has avx512f avx512bw avx512vl avx512dq avx512_bf16 && isas+=" avx512bf16"
omp=/usr/lib/x86_64-linux-gnu/openblas-openmp
echo "== $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, ISA levels $isas; load $(cut -d' ' -f1-3 /proc/loadavg)"
row() { # tag, then a command printing our CSV rows; appends "tag,d,seqlen,causal,gflops"
  local tag=$1; shift
  "$@" 2>/dev/null | awk -F, -v t="$tag" 'NR > 1 && $12 + 0 > 0 { print t "," $8 "," $6 "," $9 "," $12 }' >>"$OUT/rows.csv"
}
for r in $(seq 1 "$ROUNDS"); do
  for d in ${DIMS//,/ }; do
    for s in ${SEQLENS//,/ }; do
      for c in ${CAUSAL//,/ }; do
        args=(bench --d "$d" --seqlen "$s" --causal "$c" --reps "$REPS" --csv)
        for isa in $isas; do
          core=$([ "$isa" = avx2 ] && echo Haswell || echo SkylakeX)
          row "flash2.$isa" env FA_CPU_ISA=$isa "$BUILD/flashattn" "${args[@]}" --algo flash2
          [ -n "${OLD_BUILD:-}" ] && row "old.flash2.$isa" env FA_CPU_ISA=$isa "$OLD_BUILD/flashattn" "${args[@]}" --algo flash2
          row "blas-pthread.$isa" env FA_CPU_ISA=$isa OPENBLAS_CORETYPE=$core "$BUILD/flashattn" "${args[@]}" --algo standard
          [ -d "$omp" ] && row "blas-openmp.$isa" env FA_CPU_ISA=$isa OPENBLAS_CORETYPE=$core LD_LIBRARY_PATH=$omp \
            "$BUILD/flashattn" "${args[@]}" --algo standard
        done
        if [ -n "${GGML_FA:-}" ]; then
          "$GGML_FA" "$d" "$s" "$c" "$REPS" "$(nproc)" | sed 's/.*, \([0-9.]*\) GFLOP.*/\1/' |
            awk -v d="$d" -v s="$s" -v c="$c" '{ print "ggml," d "," s "," c "," $1 }' >>"$OUT/rows.csv"
        fi
      done
    done
  done
done
python3 - "$OUT/rows.csv" <<'EOF'
import csv, statistics, sys
v = {}
for tag, d, s, c, g in csv.reader(open(sys.argv[1])):
    v.setdefault((int(d), int(s), int(c)), {}).setdefault(tag, []).append(float(g))
tags = sorted({t for x in v.values() for t in x})
print("GFLOP/s, medians over the rounds (per-round values in the CSV)")
print("| d | seqlen | causal | " + " | ".join(tags) + " |")
print("|---|---|---|" + "---|" * len(tags))
for k in sorted(v):
    print("| %d | %d | %d | " % k + " | ".join("%.1f" % statistics.median(v[k][t]) if t in v[k] else "-" for t in tags) + " |")
print()
for k in sorted(v):
    m = {t: statistics.median(x) for t, x in v[k].items()}
    for isa in ("avx2", "avx512f", "avx512bf16"):
        f = m.get("flash2." + isa)
        if not f: continue
        blas = max([m[t] for t in m if t.startswith("blas-") and t.endswith(isa)] or [0])
        line = "d=%d N=%d causal=%d %s: FLASH2 %.1f" % (k + (isa, f))
        if blas: line += ", %.2fx the best plain OpenBLAS attention (target 1.3)" % (f / blas)
        if "ggml" in m: line += ", %.2fx ggml (target 2)" % (f / m["ggml"])
        if "old.flash2." + isa in m: line += ", %.2fx the old build" % (f / m["old.flash2." + isa])
        print(line)
EOF
