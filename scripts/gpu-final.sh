#!/usr/bin/env bash
# One short device run (H200) that checks and measures the CUDA backend as committed, in under 4 minutes including
# the build:
#   0. PyTorch SDPA flash/cuDNN at the benchmark shapes, in the background while nvcc builds (the GPU is idle then)
#   1. the build (CLI + GPU test; ptxas registers/spills of every kernel in build.log)
#   2. our FLASH2 fwd+bwd at seqlen 4096, d 64/128, causal 0/1 (default tiles), plus the forward's previous d=128
#      default, 128x64 with 8 warps, through FA_CUDA_FLASH2_FWD_WARPS=8
#   3. tests/gpu/test_gpu (the full GPU test), then `flashattn check --device cuda` (150 random cases) as time allows
#   4. the GPU part of `flashattn report --quick` with the time left
# Every step runs under `timeout` against one deadline, so a hang costs only its step. Exit status: test_gpu's.
#
# Files (all under $OUT, 8 at most): build.log, test_gpu.log (+ flashattn check), ours.csv (+ config column),
# ours.err, torch.csv, torch.log, report-gpu.tar.gz, summary.md (also printed at the end).
# Env: OUT (default gpu-final-out), BUILD (default build-gpu-final), JOBS (default 16), BUDGET_S (default 235).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-gpu-final-out}
BUILD=${BUILD:-build-gpu-final}
JOBS=${JOBS:-16}
T0=$(date +%s)
DEADLINE=$((T0 + ${BUDGET_S:-235}))
mkdir -p "$OUT"
SUM="$OUT/summary.md"
: >"$SUM"
declare -a STEPS

left() { echo $((DEADLINE - $(date +%s))); }
# step NAME CAP RESERVE CMD...: runs CMD under timeout min(CAP, time left - RESERVE); records status and seconds.
step() {
  local name=$1 cap=$2 reserve=$3
  shift 3
  local t=$(($(left) - reserve))
  [ "$t" -gt "$cap" ] && t=$cap
  if [ "$t" -lt 5 ]; then
    STEPS+=("| $name | skipped (no time left) | 0 |")
    echo "== $name: skipped (no time left)"
    return 99
  fi
  echo "== $name (timeout ${t}s)"
  local s0 rc
  s0=$(date +%s)
  timeout --kill-after=5 "$t" "$@"
  rc=$?
  local msg="rc=$rc"
  [ $rc -eq 0 ] && msg="ok"
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && msg="TIMEOUT after ${t}s"
  STEPS+=("| $name | $msg | $(($(date +%s) - s0)) |")
  echo "== $name: $msg ($(($(date +%s) - s0)) s)"
  return $rc
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | head -2 || true

# 0. PyTorch SDPA (flash and cuDNN backends) at the benchmark shapes, in the background during the build (the GPU
#    is idle then; the timings are CUDA events around whole kernels)
( step torch 80 0 env PYTHONUNBUFFERED=1 python3 scripts/bench_gpu_torch.py run --out "$OUT/torch.csv" --d 64,128 \
    --seqlen 4096 --causal 0,1 --pass fwd,bwd --reps 10 >"$OUT/torch.log" 2>&1
  printf '%s\n' "${STEPS[@]}" >"$BUILD.torch-step" ) &
TORCH_PID=$!

# 1. build (only the CLI and the GPU test; -Xptxas -v puts every kernel's registers and spills in the log)
build() {
  cmake -S . -B "$BUILD" -DFA_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_FLAGS=-Xptxas=-v &&
    cmake --build "$BUILD" -j "$JOBS" --target flashattn_cli test_gpu
}
step build 150 90 bash -c "$(declare -f build); BUILD='$BUILD' JOBS='$JOBS' build" >"$OUT/build.log" 2>&1
BUILD_OK=$?
grep -E "error|warning" "$OUT/build.log" | grep -v "ptxas info" | head -20

# the GPU is ours alone from here on
wait "$TORCH_PID" 2>/dev/null
[ -f "$BUILD.torch-step" ] && mapfile -t -O "${#STEPS[@]}" STEPS <"$BUILD.torch-step" && rm -f "$BUILD.torch-step"

# 2. our FLASH2 at seqlen 4096 (protocol shapes: model dim 2048, 16k tokens): default tiles, then the previous
#    d=128 forward default (8 warps) for the comparison
if [ $BUILD_OK -eq 0 ]; then
  bench_ours() {
    local common=(--device cuda --dtype bf16 --algo flash2 --seqlen 4096 --causal "0,1" --reps 10 --warmup 2 --csv)
    "$BUILD/flashattn" bench "${common[@]}" --d 64,128 --pass fwd,bwd | awk -F, -v c=default \
      'NR==1{print $0",config"; next} {print $0","c}' >"$OUT/ours.csv"
    FA_CUDA_FLASH2_FWD_WARPS=8 "$BUILD/flashattn" bench "${common[@]}" --d 128 --pass fwd | awk -F, \
      -v c=d128-fwd-8warps 'NR>1{print $0","c}' >>"$OUT/ours.csv"
  }
  step bench_ours 45 60 bash -c "$(declare -f bench_ours); BUILD='$BUILD' OUT='$OUT' bench_ours" 2>"$OUT/ours.err"
fi

# 3. the full GPU test (every algorithm against the float64 oracle; all FLASH2 forward tiles incl. the 8-warp row)
TEST_RC=skipped
CHECK_RC=skipped
if [ $BUILD_OK -eq 0 ]; then
  step test_gpu 150 0 "$BUILD/tests/gpu/test_gpu" >"$OUT/test_gpu.log" 2>&1
  TEST_RC=$?
  grep -E "FAIL|fail|error" "$OUT/test_gpu.log" | head -20
  tail -3 "$OUT/test_gpu.log"
  # random cases against the oracle (softcap, GQA, varlen, layouts...), with what time is left; same log file
  step check 40 20 "$BUILD/flashattn" check --device cuda --dtype bf16,f16 --count 150 >>"$OUT/test_gpu.log" 2>&1
  CHECK_RC=$?
  tail -2 "$OUT/test_gpu.log"
fi

# 4. the report's GPU part (quick sizes), packed into one file
if [ $BUILD_OK -eq 0 ]; then
  rm -rf "$BUILD/report-gpu"
  mkdir -p "$BUILD/report-gpu"
  step report 90 2 "$BUILD/flashattn" report --quick --no-cpu --no-plots --out "$BUILD/report-gpu" \
    >"$BUILD/report-gpu/run.log" 2>&1
  tar -czf "$OUT/report-gpu.tar.gz" -C "$BUILD" report-gpu 2>/dev/null || true
fi

# Summary: steps, spills from ptxas, test verdict, the benchmark table with the ratio to PyTorch's flash backend.
{
  echo "# gpu-final $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo
  echo "| step | status | s |"
  echo "|---|---|---|"
  printf '%s\n' "${STEPS[@]}"
  echo
  echo "total wall: $(($(date +%s) - T0)) s"
  echo
  echo "ptxas: $(grep -c 'Compiling entry function' "$OUT/build.log" 2>/dev/null) kernels compiled;" \
    "spill warnings: $(grep -c 'Registers are spilled' "$OUT/build.log" 2>/dev/null)"
  grep "Registers are spilled" "$OUT/build.log" 2>/dev/null | head -10
  python3 - "$OUT/build.log" <<'PY'
import re, shutil, subprocess, sys
rows, cur = {}, None
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"Compiling entry function '(\S+)'", line)
    if m:
        cur = m.group(1)
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and cur:
        rows.setdefault(cur, {})["spill"] = "%s/%s" % m.groups()
    m = re.search(r"Used (\d+) registers", line)
    if m and cur:
        rows.setdefault(cur, {})["regs"] = m.group(1)
names = [n for n in rows if "flash" in n and "bfloat16" in n]
dem = names
if names and shutil.which("c++filt"):
    dem = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
if names:
    print("\n| kernel (bf16; f16 alike) | regs | spill st/ld B |\n|---|---|---|")
for n, d in sorted(zip(names, dem), key=lambda x: x[1]):
    print("| %s | %s | %s |" % (d.replace("(fa_cuda_params)", ""), rows[n].get("regs", "?"), rows[n].get("spill", "?")))
PY
  echo
  echo "test_gpu: rc=$TEST_RC; $(grep -E '^test_gpu: [0-9]+ checks' "$OUT/test_gpu.log" 2>/dev/null | tail -1)"
  echo "flashattn check --device cuda: rc=$CHECK_RC (0 = every case passed; see the end of test_gpu.log)"
  echo
  python3 - "$OUT/ours.csv" "$OUT/torch.csv" <<'EOF'
import csv, sys
ours, torch = {}, {}
try:
    for r in csv.DictReader(open(sys.argv[1])):
        try:
            ours[(r["config"], int(r["head_dim"]), int(r["causal"]), r["pass"])] = (float(r["ms"]), float(r["gflops"]) / 1e3)
        except (ValueError, KeyError):
            pass
except OSError:
    pass
try:
    for r in csv.DictReader(open(sys.argv[2])):
        try:
            torch[(r["algo"], int(r["d"]), int(r["causal"]), r["pass"])] = float(r["tflops"])
        except (ValueError, KeyError):
            pass
except OSError:
    pass
print("FLASH2 vs PyTorch SDPA, bf16, seqlen 4096, 16k tokens, model dim 2048 (TFLOP/s; one run)")
print()
print("| pass | d | causal | config | ms | FLASH2 | torch-flash | torch-cudnn | F2/torch-flash |")
print("|---|---|---|---|---|---|---|---|---|")
for (cfg, d, c, p) in sorted(ours, key=lambda k: (k[3] != "fwd", k[1], k[2], k[0] != "default")):
    ms, tf = ours[(cfg, d, c, p)]
    tfl, tcu = torch.get(("torch-flash", d, c, p)), torch.get(("torch-cudnn", d, c, p))
    f = lambda x: "-" if x is None else "%.1f" % x
    print("| %s | %d | %d | %s | %.3f | %.1f | %s | %s | %s |" % (
        p, d, c, cfg, ms, tf, f(tfl), f(tcu), "-" if not tfl else "%.2f" % (tf / tfl)))
if not ours:
    print("(no FLASH2 rows: see ours.err)")
EOF
} >"$SUM"
cat "$SUM"
[ "$TEST_RC" = 0 ]
