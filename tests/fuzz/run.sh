#!/usr/bin/env bash
# Bounded fuzzing run: run.sh [SECONDS] [HARNESS] [build.sh arguments]. Builds the harness (tests/fuzz/build.sh;
# HARNESS = fuzz_attn unless named, e.g. fuzz_kvcache) unless FUZZ_BIN is given, fuzzes for SECONDS (default 120)
# with one worker from a copy of its checked-in seed corpus (tests/fuzz/corpus for fuzz_attn, corpus-NAME for
# fuzz_NAME), prints libFuzzer's final stats. Exits non-zero on any finding (the reproducer is left in
# $BUILD/fuzz-artifacts/). Extra arguments go to build.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_TOTAL=${1:-120}
[ $# -gt 0 ] && shift
HARNESS=fuzz_attn
case "${1:-}" in fuzz_*) HARNESS=$1; shift ;; esac
BUILD=${BUILD:-build-fuzz}
BIN=${FUZZ_BIN:-$(tests/fuzz/build.sh "$HARNESS" "$@" | tail -1)}
if [ "$HARNESS" = fuzz_attn ]; then SEEDS=tests/fuzz/corpus WORK="$BUILD/fuzz-corpus"
else SEEDS="tests/fuzz/corpus-${HARNESS#fuzz_}" WORK="$BUILD/fuzz-corpus-${HARNESS#fuzz_}"; fi
mkdir -p "$WORK" "$BUILD/fuzz-artifacts"
cp "$SEEDS"/* "$WORK/"
# allocator_may_return_null: a huge workspace is FA_ERR_OUT_OF_MEMORY, not an ASan abort
ASAN_OPTIONS="allocator_may_return_null=1:detect_leaks=1:${ASAN_OPTIONS:-}" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}" OMP_NUM_THREADS=1 \
    "$BIN" -max_total_time="$SECONDS_TOTAL" -max_len=256 -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$BUILD/fuzz-artifacts/" "$WORK"
