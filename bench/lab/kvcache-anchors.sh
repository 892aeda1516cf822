#!/usr/bin/env bash
# CPU decoding against its anchors, interleaved in one command: `flashattn bench --mode kvcache` of BUILD (and of
# OLD_BUILD, e.g. the base of a change), the memcpy and read-only passes that bench measures beside each row, and
# ggml's ggml_flash_attn_ext on the same shapes (bench/lab/ggml_kvcache.c, f16 and bf16 K/V). Every round runs every
# row once, the tools alternating; the table gives the median and the range over ROUNDS of GB/s of K+V read.
# Usage: bench/lab/kvcache-anchors.sh BUILD OUT_DIR
# Env: DTYPES (bf16,f16), HEADS (32/8 8/8: heads_q/heads_k), BATCH (1,4), CACHE (32768), ROUNDS (3), REPS (10),
# THREADS (all cores), HUGE (1: --huge-pages 1, the cache and the anchors' buffers in transparent huge pages), ISAS (CPU levels to pin with FA_CPU_ISA, each a row "new.<level>"; unset: the level the
# library picks, row "new"), OLD_BUILD (its rows "old.<level>" or "old"), GGML_KVCACHE (its binary) or GGML_DIR + GGML_BUILD (a ggml source tree and
# its CPU build, to build it). OLD_BUILD must know `--mode kvcache` and its flags (older builds: `--mode decode`).
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:?usage: $0 BUILD OUT_DIR}
OUT=${2:?usage: $0 BUILD OUT_DIR}
DTYPES=${DTYPES:-bf16,f16}; HEADS=${HEADS:-32/8 8/8}; BATCH=${BATCH:-1,4}; CACHE=${CACHE:-32768}
ROUNDS=${ROUNDS:-3}; REPS=${REPS:-10}; THREADS=${THREADS:-$(nproc)}
isas=${ISAS:-picked}
mkdir -p "$OUT"
: >"$OUT/rows.csv"
if [ -z "${GGML_KVCACHE:-}" ] && [ -n "${GGML_DIR:-}" ] && [ -n "${GGML_BUILD:-}" ]; then
  GGML_KVCACHE=$OUT/ggml_kvcache
  cc -O2 -std=c11 -I"$GGML_DIR/include" bench/lab/ggml_kvcache.c -o "$GGML_KVCACHE" "$GGML_BUILD/src/libggml.a" \
    "$GGML_BUILD/src/libggml-cpu.a" "$GGML_BUILD/src/libggml-base.a" -lstdc++ -lgomp -lm -lpthread || exit 1
fi
echo "== $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, $THREADS threads;" \
  "load $(cut -d' ' -f1-3 /proc/loadavg)"
fa() { # tag, binary, dtype, batch, cache, hq, hk: appends "tag,dtype,batch,cache,hq,hk,gbs" and the anchors
  "$2/flashattn" bench --mode kvcache --dtype "$3" --batch "$4" --seqlen-k "$5" --heads "$6" --heads-k "$7" \
    --threads "$THREADS" --reps "$REPS" ${HUGE:+--huge-pages "$HUGE"} --csv 2>/dev/null | awk -F, -v t="$1" 'NR > 1 && $16 == "ok" {
      k = $2 "," $3 "," $4 "," $6 "," $7; print t "," k "," $13; print "memcpy," k "," $14; print "read," k "," $15 }' \
    >>"$OUT/rows.csv"
}
for r in $(seq 1 "$ROUNDS"); do
  for dt in ${DTYPES//,/ }; do
    for b in ${BATCH//,/ }; do
      for n in ${CACHE//,/ }; do
        for h in $HEADS; do
          hq=${h%/*} hk=${h#*/}
          for isa in ${isas//,/ }; do # picked: the level the library picks (FA_CPU_ISA empty)
            [ "$isa" = picked ] && isa=""
            x=${isa:+.$isa}
            FA_CPU_ISA=$isa fa "new$x" "$BUILD" "$dt" "$b" "$n" "$hq" "$hk"
            [ -n "${OLD_BUILD:-}" ] && FA_CPU_ISA=$isa fa "old$x" "$OLD_BUILD" "$dt" "$b" "$n" "$hq" "$hk"
          done
          if [ -n "${GGML_KVCACHE:-}" ]; then
            "$GGML_KVCACHE" "$dt" "$b" "$n" "$hq" "$hk" "$REPS" "$THREADS" | sed 's/.*, \([0-9.]*\) GB\/s.*/\1/' |
              awk -v k="$dt,$b,$n,$hq,$hk" '{ print "ggml," k "," $1 }' >>"$OUT/rows.csv"
          fi
        done
      done
    done
  done
done
python3 - "$OUT/rows.csv" <<'EOF'
import csv, statistics, sys
v = {}
for tag, dt, b, n, hq, hk, g in csv.reader(open(sys.argv[1])):
    v.setdefault((dt, int(b), int(n), int(hq), int(hk)), {}).setdefault(tag, []).append(float(g))
news = sorted({t for x in v.values() for t in x if t.startswith("new")})
olds = sorted({t for x in v.values() for t in x if t.startswith("old")})
tags = news + olds + [t for t in ("memcpy", "read", "ggml") if any(t in x for x in v.values())]
fmt = lambda x: "%.1f (%.1f-%.1f)" % (statistics.median(x), min(x), max(x))
print("GB/s of K+V read: median (min-max) over the rounds; memcpy and read: the anchors measured in each bench row")
rs = [(a, c) for a in news for c in ("memcpy", "ggml", "old" + a[3:]) if c in tags]
print("| dtype | batch | cache | hq/hk | " + " | ".join(tags) + " | " + " | ".join("%s/%s" % r for r in rs) + " |")
print("|---|---|---|---|" + "---|" * (len(tags) + len(rs)))
for k in sorted(v):
    m = {t: statistics.median(x) for t, x in v[k].items()}
    ratio = lambda a, c: "%.2f" % (m[a] / m[c]) if a in m and c in m and m[c] > 0 else "-"
    print("| %s | %d | %d | %d/%d | " % k + " | ".join(fmt(v[k][t]) if t in v[k] else "-" for t in tags) +
          " | " + " | ".join(ratio(*r) for r in rs) + " |")
EOF
