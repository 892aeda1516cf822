#!/bin/sh
# Each CPU kernel level's object files hold only instructions of that level (docs/cpu-kernels.md, "Runtime
# dispatch"), read from their disassembly: the avx512f files (simd/avx512.c, simd/kvcache_avx512f.c) no AVX512_BF16
# and no AMX instruction, so they run on the AVX-512 CPUs without them; the avx2 files no AVX-512 register; every
# file outside simd/'s ISA files no AVX register at all (they run before the CPUID check, on any x86-64).
# usage: check_level_instructions.sh OBJDUMP OBJECT...
set -u
OBJDUMP=$1
shift
fail=0
seen=""
# mnemonics of the object's disassembly that match the extended regex $2, counted
count() { "$OBJDUMP" -d --no-show-raw-insn "$1" | grep -cE "$2"; }
for o in "$@"; do
    case "$(basename "$o")" in
    avx512.c.o | kvcache_avx512f.c.o) bad='\b(vdpbf16ps|vcvtne2ps2bf16|vcvtneps2bf16|tdp[a-z0-9]+|tile[a-z]+|ldtilecfg|sttilecfg)\b'
        what="AVX512_BF16/AMX instructions"; seen="$seen $(basename "$o")" ;;
    avx2.c.o | kvcache_avx2.c.o) bad='%(zmm[0-9]+|k[0-7])\b|%[xy]mm(1[6-9]|2[0-9]|3[01])\b'
        what="AVX-512 registers"; seen="$seen $(basename "$o")" ;;
    avx512bf16.c.o | kvcache_avx512bf16.c.o | amx.c.o) continue ;;
    *) bad='%[yz]mm[0-9]+'; what="AVX registers (a baseline file)" ;;
    esac
    n=$(count "$o" "$bad")
    if [ "$n" -ne 0 ]; then
        echo "FAIL: $(basename "$o"): $n lines with $what:"
        "$OBJDUMP" -d --no-show-raw-insn "$o" | grep -E "$bad" | head -5
        fail=1
    fi
done
for want in avx512.c.o kvcache_avx512f.c.o avx2.c.o kvcache_avx2.c.o; do
    case "$seen" in *" $want"*) ;; *) echo "FAIL: no $want among the objects"; fail=1 ;; esac
done
[ "$fail" -eq 0 ] && echo "PASS: every level's objects hold only its instructions"
exit "$fail"
