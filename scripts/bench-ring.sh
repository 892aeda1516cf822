#!/usr/bin/env bash
# Ring attention over NCCL on the GPUs of one host (e.g. 2 H200s): zigzag causal bf16 d = 128 at 32k-128k
# tokens in total, forward and forward + backward: time per call, efficiency against W x the one-GPU rate (one GPU
# on the whole sequence), and the model's two terms per step measured apart (one block's attention, one step's
# exchange), as one markdown table (docs/ring.md). Then the 2-rank NCCL tests (tests/gpu/test_gpu_ring).
# Env: BUILD (default build-cuda), OUT_DIR (default $BUILD/bench-ring), WORLD (default 2), SEQLENS (default
#      32768,65536,131072), HEADS (default 16: model dim 2048), D (default 128), CAUSAL (default 1), REPS (default 10).
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on these machines: never enable it
BUILD=${BUILD:-build-cuda}
OUT_DIR=${OUT_DIR:-$BUILD/bench-ring}
mkdir -p "$OUT_DIR"
if [ ! -x "$BUILD/bench/ring/bench_ring" ]; then
  cmake -S . -B "$BUILD" -DFA_CUDA=ON -DFA_NCCL=ON -DCMAKE_BUILD_TYPE=Release >"$OUT_DIR/cmake.log"
  cmake --build "$BUILD" -j "$(nproc)" >"$OUT_DIR/build.log" 2>&1
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader || true
nvidia-smi topo -m 2>/dev/null | head -6 || true
"$BUILD/bench/ring/bench_ring" "${WORLD:-2}" "${SEQLENS:-32768,65536,131072}" "${HEADS:-16}" "${D:-128}" \
  "${CAUSAL:-1}" "${REPS:-10}" | tee "$OUT_DIR/table.md"
echo
echo "== test_gpu_ring (2 ranks over NCCL against one-GPU attention)"
"$BUILD/tests/gpu/test_gpu_ring" 2>&1 | tee "$OUT_DIR/test_gpu_ring.log" | grep -E "FAIL|checks|nccl" | head -20
