#!/bin/bash
# Build (unless a prebuilt ./lab runs here), check, sanitize a small case, time, and compare with PyTorch SDPA.
# Logs go to $OUT when set. Usage: bash run.sh [test|bench|all]
set -u
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/flash3-out}
mkdir -p "$OUT"
what=${1:-all}
SRC=src; [ -d src ] || SRC=../../../src
if ! ./lab 2>&1 | grep -q usage; then
    echo "building lab"
    nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xptxas -warn-spills -DFA3_LAB_SCHEDULES -I"$SRC" \
        -o lab lab.cu "$SRC"/cuda/sm90/flash3_fwd.cu 2>&1 | tee "$OUT/build.log" || exit 1
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
rc=0
timeout 20 ./lab small > "$OUT/small.log" 2>&1; src=$?
tail -4 "$OUT/small.log"
if [ $src -eq 124 ]; then echo "HANG in lab small"; exit 124; fi
if [ "$what" = all ] || [ "$what" = test ]; then
    timeout 120 ./lab test 2>&1 | tee "$OUT/test.log" | grep -E "FAIL|failed|device" ; rc=${PIPESTATUS[0]}
    if command -v compute-sanitizer > /dev/null; then
        timeout 90 compute-sanitizer --tool memcheck ./lab small > "$OUT/memcheck.log" 2>&1
        tail -1 "$OUT/memcheck.log"
        for tool in racecheck synccheck; do
            timeout 60 compute-sanitizer --tool $tool ./lab small > "$OUT/$tool.log" 2>&1
            echo "$tool: $(tail -1 "$OUT/$tool.log")"
        done
    fi
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
    timeout 90 ./lab bench "$OUT/flash3.csv" > "$OUT/bench.log" 2>&1 || { tail "$OUT/bench.log"; exit 1; }
    timeout 150 python3 sdpa.py "$OUT/flash3.csv" 2>&1 | tee "$OUT/table.md"
fi
exit $rc
