#!/usr/bin/env bash
# CPU tests and the many-core benchmark on the device host (`make test-cpu-device LOG_DIR=dir`; 16-core Xeon with
# AVX-512, avx512_bf16 and AMX): a CPU-only build, ctest under every FA_CPU_ISA level this CPU has (scalar, avx2,
# avx512f, avx512bf16, amx), then in one command our CLI against PyTorch's CPU SDPA (B=4, N=4k, d 64/128, causal and not,
# fp32 and bf16, forward and forward+backward, THREADS threads) and FLASH2's 1-thread vs THREADS-thread scaling.
# Exits non-zero when a test fails; the benchmark gates nothing. Runs in about 5 minutes on that host.
# Usage: scripts/test-cpu-device.sh LOG_DIR   Env: BUILD (default build-cpu-device), THREADS (default: nproc),
# REPS (default 3), CMP_ROUNDS (3: rounds of the comparison, ours and PyTorch alternating; 0 skips it),
# SCALE_ROUNDS (3: rounds of the scaling, 1 and THREADS threads alternating), BATCH (4) and SEQLEN (4096) of the
# comparison (smaller for a smoke run), SKIP_TESTS=1 / SKIP_BENCH=1.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${1:?usage: $0 LOG_DIR}
BUILD=${BUILD:-build-cpu-device}
THREADS=${THREADS:-$(nproc)}
REPS=${REPS:-3}
SCALE_ROUNDS=${SCALE_ROUNDS:-3}
CMP_ROUNDS=${CMP_ROUNDS:-3}
BATCH=${BATCH:-4}
SEQLEN=${SEQLEN:-4096}
mkdir -p "$LOG"
exec > >(tee "$LOG/summary.txt") 2>&1
start=$(date +%s)
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { for f in "$@"; do [[ " $flags " == *" $f "* ]] || return 1; done; }
levels="scalar"
has avx2 fma && levels+=" avx2"
has avx512f avx512bw avx512vl avx512dq && levels+=" avx512f"
has avx512f avx512bw avx512vl avx512dq avx512_bf16 && levels+=" avx512bf16"
has avx512_bf16 amx_tile amx_bf16 && levels+=" amx"
echo "== machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs, ISA levels: $levels"
echo "== topology: $(lscpu 2>/dev/null | grep -E '^(Thread|Core|Socket)|^CPU max MHz|^L2|^L3' | sed 's/  */ /g' | paste -sd';')"
echo "== commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (modified)')"
echo "== OpenBLAS: $(readlink -f /usr/lib/x86_64-linux-gnu/libopenblas.so.0 2>/dev/null || echo 'none found')"

cmake -S . -B "$BUILD" -DFA_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >"$LOG/cmake.log" 2>&1 || { echo "cmake failed"; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" >"$LOG/build.log" 2>&1 || { tail -30 "$LOG/build.log"; echo "build failed"; exit 1; }
grep -E "warning" "$LOG/build.log" | head -10
cmake --build "$BUILD" -j "$(nproc)" --target cpu_kernels >>"$LOG/build.log" 2>&1
FA="$BUILD/flashattn"

status=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  # the kernel lab's check: every entry of the table of each level this CPU has against a float64 loop
  if "$BUILD/bench/lab/cpu_kernels" --check >"$LOG/kernels.log" 2>&1; then
    echo "== kernel check ($levels): $(tail -1 "$LOG/kernels.log")"
  else
    status=1; echo "== kernel check: FAILED"; tail -20 "$LOG/kernels.log"
  fi
  # the default tests under each level (the per-level variants pin their own level: excluded here);
  # the narrower levels with 8 random cases per sweep, as ctest's variants, the best level with the full sweeps
  best=${levels##* }
  for isa in $levels; do
    random=$([ "$isa" = "$best" ] && echo "${FA_TEST_RANDOM:-}" || echo 8)
    if env FA_CPU_ISA=$isa ${random:+FA_TEST_RANDOM=$random} FA_TEST_THREADS=4 ctest --test-dir "$BUILD" -j "$(( $(nproc) / 4 > 1 ? $(nproc) / 4 : 1 ))" \
         -E '_(scalar|avx2|avx512f|avx512bf16|amx)$' --output-on-failure --timeout 600 >"$LOG/ctest-$isa.log" 2>&1; then
      echo "== ctest FA_CPU_ISA=$isa: $(grep -E 'tests passed' "$LOG/ctest-$isa.log")"
    else
      status=1; echo "== ctest FA_CPU_ISA=$isa: FAILED"; grep -E "Failed|FAIL|\*\*\*" "$LOG/ctest-$isa.log" | head -20
    fi
  done
  echo "== tests took $(( $(date +%s) - start )) s"
fi

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  echo; echo "== peak (flashattn bench --peak; $THREADS threads)"
  "$FA" bench --peak --threads "$THREADS" --algo flash2 --batch 1 --heads 1 --seqlen 256 --reps 1 2>&1 | tee "$LOG/peak.txt" | head -4
  [ "$CMP_ROUNDS" -gt 0 ] || echo "== CMP_ROUNDS=0: no comparison with PyTorch"
  if [ "$CMP_ROUNDS" -gt 0 ]; then
  echo; echo "== ours: FLASH2, B=$BATCH N=$SEQLEN, fp32 and bf16, fwd and bwd, $THREADS threads; PyTorch's CPU SDPA on the" \
    "same shapes; $CMP_ROUNDS rounds alternating (medians)"
  "$FA" bench --algo flash2 --batch "$BATCH" --seqlen "$SEQLEN" --d 64,128 --causal 0 --dtype bf16 --pass fwd,bwd \
    --threads "$THREADS" --reps 1 --json 2>/dev/null | grep -o '"kernel": *"[^"]*"' | sort -u | sed 's/^/   kernel: /'
  have_torch=0; python3 -c "import torch" 2>/dev/null && have_torch=1
  ours=() theirs=()
  for r in $(seq 1 "$CMP_ROUNDS"); do
    "$FA" bench --algo flash2 --batch "$BATCH" --seqlen "$SEQLEN" --d 64,128 --causal 0,1 --dtype f32,bf16 --pass fwd,bwd \
      --threads "$THREADS" --reps "$REPS" --csv >"$LOG/ours.r$r.csv" 2>>"$LOG/ours.err"
    ours+=("$LOG/ours.r$r.csv")
    [ $have_torch = 1 ] || continue
    python3 scripts/bench_cpu_torch.py run --out "$LOG/torch.r$r.csv" --batch "$BATCH" --seqlen "$SEQLEN" --d 64,128 \
      --causal 0,1 --dtype f32,bf16 --threads "$THREADS" --reps "$REPS" >"$LOG/torch.r$r.log" 2>&1 || tail -5 "$LOG/torch.r$r.log"
    theirs+=("$LOG/torch.r$r.csv")
  done
  if [ $have_torch = 1 ]; then
    head -1 "$LOG/torch.r1.log"
    python3 scripts/bench_cpu_torch.py merge "$(IFS=,; echo "${ours[*]}")" "$(IFS=,; echo "${theirs[*]}")" | tee "$LOG/vs-torch.md"
  else
    echo "(no PyTorch here: our rows only)"; cat "${ours[@]}"
  fi
  fi
  echo; echo "== FLASH2 scaling: 1 vs $THREADS threads, fp32 fwd, B=1 N=$SEQLEN (heads 2048/d), $SCALE_ROUNDS rounds alternating"
  : >"$LOG/scaling.jsonl"; : >"$LOG/scaling-peak.txt"
  for r in $(seq 1 "$SCALE_ROUNDS"); do
    "$FA" bench --peak --threads "$THREADS" --algo flash2 --batch 1 --heads 1 --seqlen 256 --reps 1 2>&1 |
      sed -n 's/.*fp32 micro-kernel \([0-9.]*\) GFLOP\/s (\([0-9.]*\) on 1 thread).*/\2 \1/p' >>"$LOG/scaling-peak.txt"
    for t in 1 "$THREADS"; do # alternating, so that a slow minute does not fall on one side only
      "$FA" bench --algo flash2 --batch 1 --seqlen "$SEQLEN" --d 64,128 --causal 0,1 --threads "$t" --reps "$REPS" \
        --json 2>>"$LOG/scaling.err" | python3 -c 'import json, sys; [print(json.dumps(r)) for r in json.load(sys.stdin)]' \
        >>"$LOG/scaling.jsonl"
    done
  done
  python3 - "$LOG/scaling.jsonl" "$LOG/scaling-peak.txt" <<'EOF'
import json, statistics, sys
pk = [tuple(map(float, l.split())) for l in open(sys.argv[2]) if len(l.split()) == 2]
if pk:
    a, b = statistics.median(x[0] for x in pk), statistics.median(x[1] for x in pk)
    print("  the fp32 micro-kernel alone (register-blocked, no memory traffic): 1 thread %.1f GFLOP/s, all %.1f -> %.1fx"
          " (the machine's own compute scaling)" % (a, b, b / a))
v = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("status") == "ok":
        v.setdefault((r["head_dim"], r["causal"]), {}).setdefault(r["threads"], []).append(r["gflops"])
for (d, c), byt in sorted(v.items()):
    many = [t for t in byt if t > 1]
    if 1 not in byt or not many: continue
    t = max(many)
    a, b = statistics.median(byt[1]), statistics.median(byt[t])
    print("  d=%d causal=%d: 1 thread %.1f GFLOP/s (%.1f-%.1f), %d threads %.1f (%.1f-%.1f) -> %.1fx (target >= 12x)" %
          (d, c, a, min(byt[1]), max(byt[1]), t, b, min(byt[t]), max(byt[t]), b / a))
EOF
fi
echo; echo "== done in $(( $(date +%s) - start )) s, status $status; logs in $LOG"
exit $status
