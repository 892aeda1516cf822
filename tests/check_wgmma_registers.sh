#!/usr/bin/env bash
# The FLASH3 (wgmma) kernels as ptxas builds them: no register spills, and no wgmma serialised for want of registers
# (ptxas info C7512: each wgmma then waits for the last, which cost the backward 0.6x of its speed). Compiles each
# source with `-Xptxas -v` for sm_90a and fails on either; needs no GPU. -D arguments go to nvcc (a build
# variant of a compile-time switch).
#   check_wgmma_registers.sh NVCC SOURCE_DIR [-DNAME=VALUE...] FILE.cu...
set -uo pipefail
nvcc=$1 src=$2
shift 2
defs=()
while [ $# -gt 0 ] && [ "${1#-D}" != "$1" ]; do defs+=("$1"); shift; done
status=0
for f in "$@"; do
    log=$("$nvcc" -std=c++17 -O3 -DNDEBUG -DFA_HAVE_CUDA=1 ${defs[@]+"${defs[@]}"} --expt-relaxed-constexpr \
        -I"$src/include" -I"$src/src" -gencode arch=compute_90a,code=sm_90a -Xptxas -v,-warn-spills -c "$f" \
        -o /dev/null 2>&1) || {
        echo "$f: nvcc failed"; echo "$log" | tail -20; status=1; continue; }
    bad=$(echo "$log" | grep -E "C7512|serialized|[1-9][0-9]* bytes spill" | sort -u)
    if [ -n "$bad" ]; then
        echo "$f:"; echo "$bad"; status=1
    else
        echo "$f: $(echo "$log" | grep -c 'Compiling entry') kernels, no spill, no serialised wgmma"
    fi
done
exit $status
