#!/usr/bin/env bash
# flash-attention's FA2 and FA3 test suites, unchanged, against the binding through fa_alias (README.md here), on a
# GPU machine in one command: a seeded sample of each suite, counted by count.py.
# Env: SDIST (flash-attn's sdist, default .whl/flash_attn-2.8.3.tar.gz), BUILD (default build-cuda), OUT_DIR (default
#      $BUILD/fa-suites), SAMPLE (cases per suite, default 2000), SEED (default 0), TIMEOUT (seconds per suite, 240).
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 1
BUILD=${BUILD:-build-cuda}
OUT_DIR=${OUT_DIR:-$BUILD/fa-suites}
SDIST=${SDIST:-.whl/flash_attn-2.8.3.tar.gz}
LOG_DIR=$OUT_DIR
PY=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
if [ ! -f "$BUILD/libflashattn.so" ]; then
  cmake -S . -B "$BUILD" -DFA_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD" -j "$(nproc)" --target flashattn >/dev/null
fi
. scripts/py-tree.sh
py_cuda || { echo "flashattn with CUDA does not import (torch, Python headers, $BUILD/libflashattn.so)"; exit 1; }
"$PY" -c "import einops" 2>/dev/null || "$PY" -m pip install -q --no-index --find-links .whl einops >/dev/null 2>&1
SRC="$OUT_DIR/src"
rm -rf "$SRC" && mkdir -p "$SRC" && tar xzf "$SDIST" -C "$SRC" --strip-components=1 || exit 1
export FLASH_ATTN_SRC="$PWD/$SRC" PYTHONPATH="$PWD/bench/lab/flash_attn_suites:$PYTHONPATH"
export FA_SUITE_SAMPLE=${SAMPLE:-2000} FA_SUITE_SEED=${SEED:-0}
status=0
OUT=$PWD/$OUT_DIR
for suite in fa2:tests/test_flash_attn.py fa3:hopper/test_flash_attn.py; do
  name=${suite%%:*} file=${suite#*:}
  (cd "$SRC/$(dirname "$file")" && timeout "${TIMEOUT:-240}" "$PY" -m pytest -p fa_alias -p no:cacheprovider -q \
    "$(basename "$file")" --junitxml="$OUT/$name.xml" >"$OUT/$name.log" 2>&1)
  echo "== $name ($FA_SUITE_SAMPLE cases of the suite, seed $FA_SUITE_SEED): $(tail -1 "$OUT/$name.log")"
  if [ -f "$OUT/$name.xml" ]; then "$PY" bench/lab/flash_attn_suites/count.py "$OUT/$name.xml"; else status=1; fi
done
exit $status
