#!/usr/bin/env bash
# The same-command speed check of a CUDA KV-cache change against its base (H200): `flashattn bench --mode kvcache` of
# two builds of the CLI, the builds alternating over ROUNDS, then one table of GB/s of K+V read per shape, median
# (min-max) over the rounds, new/old, and the read-only anchor the CLI measures beside each row. Both builds must
# know `--mode kvcache` and its flags (a base from before that rename knows `--mode decode --cache --heads-q`).
# Usage: bench/lab/kvcache-trees.sh OLD_BUILD NEW_BUILD OUT_DIR
# Env: BATCH (1,16,64), CACHE (1024,8192,65536), PAGES (0,16,256), HEADS_Q (32), HEADS_K (8), ROUNDS (3),
#      REPS (20), FLUSH (read), APPEND (1).
set -uo pipefail
cd "$(dirname "$0")/../.."
OLD=${1:?usage: $0 OLD_BUILD NEW_BUILD OUT_DIR}
NEW=${2:?usage: $0 OLD_BUILD NEW_BUILD OUT_DIR}
OUT=${3:?usage: $0 OLD_BUILD NEW_BUILD OUT_DIR}
mkdir -p "$OUT"
args=(bench --mode kvcache --device cuda --dtype bf16 --d 128 --batch "${BATCH:-1,16,64}"
      --seqlen-k "${CACHE:-1024,8192,65536}" --page "${PAGES:-0,16,256}" --heads "${HEADS_Q:-32}"
      --heads-k "${HEADS_K:-8}" --reps "${REPS:-20}" --warmup 3 --append "${APPEND:-1}" --flush "${FLUSH:-read}" --csv)
for r in $(seq 1 "${ROUNDS:-3}"); do
  "$OLD/flashattn" "${args[@]}" >"$OUT/r$r-old.csv" 2>>"$OUT/old.err"
  "$NEW/flashattn" "${args[@]}" >"$OUT/r$r-new.csv" 2>>"$OUT/new.err"
done
python3 - "$OUT" <<'PY'
import collections, csv, glob, statistics, sys
v = collections.defaultdict(list)
for fn in glob.glob(sys.argv[1] + "/r*-*.csv"):
    tag = fn.rsplit("-", 1)[1][:-4]
    for r in csv.DictReader(open(fn)):
        if r.get("status") != "ok":
            continue
        k = (int(r["batch"]), int(r["cache"]), int(r["heads_q"]), int(r["heads_k"]), int(r["page"]))
        v[k + (tag,)].append(float(r["kv_gbs"]))
        v[k + ("read",)].append(float(r["read_gbs"] or 0))
med = statistics.median
print("| batch | cache | hq/hk | page | old GB/s | new GB/s | new/old | read-only |")
print("|---|---|---|---|---|---|---|---|")
for k in sorted({k[:5] for k in v}):
    a, b = v.get(k + ("old",)), v.get(k + ("new",))
    if not a or not b:
        continue
    print("| %d | %d | %d/%d | %d | %.0f (%.0f-%.0f) | %.0f (%.0f-%.0f) | %.3f | %.0f |" % (
        k + (med(a), min(a), max(a), med(b), min(b), max(b), med(b) / med(a), med(v[k + ("read",)]))))
PY
