#!/usr/bin/env bash
# Compare compile-time variants of the CUDA kernels on the H200 in one command: each variant is a name and extra
# nvcc flags (e.g. a -D switch a kernel reads), built in parallel (scripts/build-variants.sh: build-v-<name>), then
# the FLASH2 backward of each is timed, interleaved ROUNDS times, optionally beside PyTorch's flash backward at the
# same shapes.
# Prints TFLOP/s per shape x variant. Env: VARIANTS ("base=;x=-DFOO=1", default "base="), SEQLENS, DIMS, PASSES
# (bwd), ROUNDS (2), OUT (results; build logs go to build-v-<name>/), TORCH (1 = also PyTorch), EXTRA (more bench
# arguments, e.g. "--block-q 0,64"), TEST_VARIANTS (names: run the small GPU test set on these).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
VARIANTS=${VARIANTS:-base=}; SEQLENS=${SEQLENS:-2048,4096,16384}; DIMS=${DIMS:-64,128}; PASSES=${PASSES:-bwd}
ROUNDS=${ROUNDS:-2}; OUT=${OUT:-bwd-variants}; TORCH=${TORCH:-1}
mkdir -p "$OUT"
IFS=';' read -ra VS <<<"$VARIANTS"
VARIANTS="$VARIANTS" bash scripts/build-variants.sh
: >"$OUT/variants.csv"
for r in $(seq 1 "$ROUNDS"); do
  for nv in "${VS[@]}"; do
    n=${nv%%=*}
    [ -x "build-v-$n/flashattn" ] || continue
    timeout 300 "build-v-$n/flashattn" bench --device cuda --dtype bf16 --algo flash2 --d "$DIMS" --seqlen "$SEQLENS" \
      --causal 0,1 --pass "$PASSES" --reps 10 --warmup 2 ${EXTRA:-} --csv 2>>"$OUT/bench.err" | tail -n +2 |
      sed "s/^/$n,r$r,/" >>"$OUT/variants.csv"
  done
done
if [ "$TORCH" = 1 ]; then
  timeout 300 python3 scripts/bench_gpu_torch.py run --out "$OUT/torch.csv" --d "$DIMS" --seqlen "$SEQLENS" \
    --causal 0,1 --pass "$PASSES" --reps 10 >"$OUT/torch.log" 2>&1
fi
python3 - "$OUT" <<'PY'
import csv, sys, collections, os
out = sys.argv[1]
res = collections.defaultdict(list)  # (pass, d, seqlen, causal, block_q?, variant) -> TFLOP/s per round
for row in open(os.path.join(out, "variants.csv")):
    f = row.strip().split(",")
    v, p, d, s, c, g = f[0], f[11], f[9], f[7], f[10], f[13]
    try: res[(p, int(d), int(s), int(c), v)].append(float(g) / 1000)
    except ValueError: pass
torch = {}
if os.path.exists(os.path.join(out, "torch.csv")):
    for r in csv.DictReader(open(os.path.join(out, "torch.csv"))):
        if r["algo"] == "torch-flash" and r["tflops"] and r["tflops"][0].isdigit():
            torch[(r["pass"], int(r["d"]), int(r["seqlen"]), int(r["causal"]))] = float(r["tflops"])
vs = list(dict.fromkeys(k[4] for k in res))
print("TFLOP/s, max over rounds (rounds)  pass d seqlen causal | " + " | ".join(vs) + " | torch-flash")
for sh in sorted({k[:4] for k in res}):
    cells = ["%.1f (%s)" % (max(x), "/".join("%.0f" % y for y in x)) if x else "-"
             for x in (res.get(sh + (v,), []) for v in vs)]
    t = torch.get(sh)
    print("%s %3d %6d %d | %s | %s" % (sh + (" | ".join(cells), "%.1f" % t if t else "-")))
PY
for n in ${TEST_VARIANTS:-}; do
  echo "== test_gpu (small) variant $n"
  FA_GPU_TEST_SMALL=1 timeout 200 "build-v-$n/tests/gpu/test_gpu" >"$OUT/test-$n.log" 2>&1; echo "rc=$?"
  tail -2 "$OUT/test-$n.log"
done
