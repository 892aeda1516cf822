#!/usr/bin/env bash
# GPU tests of the CUDA backend (needs an H200 / sm_90 GPU): build with CUDA, run tests/gpu/test_gpu (every
# algorithm against the float64 oracle, poisoned outputs), tests/gpu/test_gpu_kvcache (KV-cache decoding, with memcheck
# and racecheck on small shapes), tests/gpu/test_gpu_empty (zero extents, with memcheck and racecheck),
# `flashattn check --device cuda` (random cases), then
# compute-sanitizer memcheck and racecheck on small shapes, tests/gpu/test_gpu_nonfinite (the numerics contract), and
# memcheck over `flashattn check --device cuda` on MEMCHECK_COUNT (default 200) random cases; tests/gpu/test_gpu_ring
# runs ring attention (the one-GPU loopback; 2 ranks over NCCL when 2 GPUs are present, NCCL_NVLS_ENABLE=0).
# Exits non-zero on any failure.
# Env: STAGES (default "tests sanitizers python": which parts run), BUILD (default build-cuda), JOBS (default nproc),
# LOG_DIR (copies of the logs), SANITIZERS (default
# "memcheck racecheck"; empty = none), SAN_TESTS / SAN_SHARDS (a part of the sanitizer stage, below), SKIP_BUILD=1
# (run the binaries already in BUILD, e.g. built on another machine).
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on these machines (docs/ring.md)
# the FLASH3 backward's (192, 128) row, off by default until it has run on a GPU: the tests take it
export FA_CUDA_FLASH3_BWD_PAIRS=${FA_CUDA_FLASH3_BWD_PAIRS:-1}
# the FLASH3 backward's dQ converted in its main kernel, off by default until it has run on a GPU: the tests take it
export FA_CUDA_FLASH3_BWD_FUSED_DQ=${FA_CUDA_FLASH3_BWD_FUSED_DQ:-1}
BUILD=${BUILD:-build-cuda}
JOBS=${JOBS:-$(nproc)}
LOG_DIR=${LOG_DIR:-$BUILD/gpu-logs}
mkdir -p "$LOG_DIR"
if [ -z "${SKIP_BUILD:-}" ]; then
  cmake -S . -B "$BUILD" -DFA_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$LOG_DIR/cmake.log"
  cmake --build "$BUILD" -j "$JOBS" 2>&1 | tee "$LOG_DIR/build.log" | grep -E "error|warning|spill" || true
fi
test -x "$BUILD/tests/gpu/test_gpu"
test -x "$BUILD/tests/gpu/test_gpu_nonfinite"
test -x "$BUILD/tests/gpu/test_gpu_kvcache"
test -x "$BUILD/tests/gpu/test_gpu_ring"
test -x "$BUILD/tests/gpu/test_gpu_empty"
test -x "$BUILD/tests/gpu/test_gpu_sinks"
test -x "$BUILD/tests/gpu/test_gpu_merge"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader || true

status=0
# STAGES: which parts run (default all three), e.g. STAGES=tests, then STAGES="sanitizers python" on the same build
has_stage() { case " ${STAGES:-tests sanitizers python} " in *" $1 "*) return 0 ;; esac; return 1; }
# run_test NAME PATTERN LINES: tests/gpu/NAME, its log under LOG_DIR, the matching lines shown; a failure fails the run
run_test() {
    local rc=0
    "$BUILD/tests/gpu/$1" >"$LOG_DIR/$1.log" 2>&1 || rc=$?
    grep -E "$2" "$LOG_DIR/$1.log" | head -"$3" || true
    [ "$rc" -eq 0 ] || { echo "$1: exit status $rc"; status=1; }
}
if has_stage tests; then
echo "== test_gpu"
run_test test_gpu "FAIL|fail|error|summary|passed|seed" 60
tail -3 "$LOG_DIR/test_gpu.log"

echo "== test_gpu_kvcache (KV-cache decoding, docs/kvcache.md)"
run_test test_gpu_kvcache "FAIL|checks|seed" 40

echo "== test_gpu_sinks (learnable sinks: docs/numerics.md, Attention sinks)"
run_test test_gpu_sinks "FAIL|checks|seed" 40

echo "== test_gpu_merge (fa_merge_states: any number of states, head_dim up to 512)"
run_test test_gpu_merge "FAIL|checks|seed" 40
echo "== test_gpu_fp8 (fa_quantize_fp8 against the CPU's bits; the FP8 forward's refusal: docs/numerics.md, FP8)"
run_test test_gpu_fp8 "FAIL|checks|seed" 40

echo "== test_gpu_empty (zero extents: docs/api.md, Empty calls)"
run_test test_gpu_empty "FAIL|checks|seed" 40

echo "== test_gpu_ring (ring attention, docs/ring.md)"
run_test test_gpu_ring "FAIL|checks|seed|nccl|rank" 40

echo "== test_gpu_nonfinite (the numerics contract, docs/numerics.md)"
run_test test_gpu_nonfinite "FAIL|checks|: row|packed row" 30

echo "== flashattn check --device cuda"
if "$BUILD/flashattn" check --device cuda --count "${CHECK_COUNT:-300}" >"$LOG_DIR/check.log" 2>&1; then
  tail -3 "$LOG_DIR/check.log"
else
  status=1
  grep -iE "fail|error" "$LOG_DIR/check.log" | head -20
  tail -3 "$LOG_DIR/check.log"
fi

fi # STAGES tests
if ! has_stage sanitizers; then
  :
elif command -v compute-sanitizer >/dev/null; then
  # Every sanitizer run at once (SAN_JOBS at a time): they spend their time in the tool, not on the GPU. test_gpu's
  # small set is split into TEST_GPU_SHARDS (FA_GPU_TEST_SHARD) runs per tool; SAN_TESTS (default every test below)
  # and SAN_SHARDS (default all: e.g. "0 1" of 8) pick a part, so that a slow tool's run can be split over calls.
  SAN_JOBS=${SAN_JOBS:-$(nproc)}
  SHARDS=${TEST_GPU_SHARDS:-4}
  san_names=()
  san_pids=()
  san() { # san LOG [VAR=VALUE...] CMD...: one sanitizer run in the background, its log under LOG_DIR
    local log=$1
    shift
    while [ "$(jobs -rp | wc -l)" -ge "$SAN_JOBS" ]; do sleep 0.2; done
    env "$@" >"$LOG_DIR/$log" 2>&1 &
    san_names+=("$log")
    san_pids+=($!)
  }
  for tool in ${SANITIZERS-memcheck racecheck}; do
    for t in ${SAN_TESTS:-test_gpu test_gpu_kvcache test_gpu_empty test_gpu_sinks test_gpu_merge test_gpu_fp8}; do
      if [ "$t" = test_gpu ]; then
        for i in ${SAN_SHARDS:-$(seq 0 $((SHARDS - 1)))}; do
          san "sanitizer-$tool-$t.$i.log" FA_GPU_TEST_SMALL=1 FA_GPU_TEST_SHARD="$i/$SHARDS" \
            compute-sanitizer --tool "$tool" --error-exitcode 3 "$BUILD/tests/gpu/$t"
        done
      else
        san "sanitizer-$tool-$t.log" FA_GPU_TEST_SMALL=1 compute-sanitizer --tool "$tool" --error-exitcode 3 \
          "$BUILD/tests/gpu/$t"
      fi
    done
  done
  case " ${SANITIZERS-memcheck racecheck} " in *" memcheck "*)
    san sanitizer-memcheck-check.log compute-sanitizer --tool memcheck --error-exitcode 3 "$BUILD/flashattn" check \
      --device cuda --count "${MEMCHECK_COUNT:-200}" ;;
  esac
  for i in "${!san_pids[@]}"; do
    log=${san_names[$i]}
    echo "== compute-sanitizer: ${log%.log} (small shapes)"
    if wait "${san_pids[$i]}"; then
      grep -E "ERROR SUMMARY|RACECHECK SUMMARY|checks|passed" "$LOG_DIR/$log" | tail -2
    else
      status=1
      grep -E "=========|FAIL|fail" "$LOG_DIR/$log" | head -30
    fi
  done
else
  echo "compute-sanitizer not found: memcheck/racecheck skipped"
fi
# ---- Python binding (python/) on CUDA: the package's CUDA tests (scripts/py-tree.sh: installed, or from the tree) ----
PY=${PYTHON:-python3}
. scripts/py-tree.sh
if ! has_stage python; then
  :
elif py_cuda; then
  echo "== pytest python/tests -k cuda"
  "$PY" -m pytest -q -p no:cacheprovider python/tests -k cuda 2>&1 | tee "$LOG_DIR/pytest-cuda.log" | tail -5
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
else
  echo "python package with CUDA not importable by $PY (torch, Python headers): its CUDA tests skipped"
fi

echo "test-gpu: $([ $status -eq 0 ] && echo PASSED || echo FAILED)"
exit $status
