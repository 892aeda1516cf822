#!/bin/sh
# flashattn CLI: bad arguments exit 2 with a message naming the argument; help exits 0; the CSV columns are exact;
# a configuration that does not fit prints an oom row instead of crashing; io shows STANDARD > FLASH1 > FLASH2.
# usage: test_cli.sh path/to/flashattn
set -u
# under AddressSanitizer a too-large allocation must return NULL (the library then reports FA_ERR_OUT_OF_MEMORY)
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1"
BIN=$1
fail() { echo "FAIL: $*"; exit 1; }
TMP=$(mktemp -d) || fail "mktemp"
trap 'rm -rf "$TMP"' EXIT
expect_usage() { # expect_usage WORD-IN-MESSAGE ARGS...
    word=$1; shift
    msg=$("$BIN" "$@" 2>&1 >/dev/null); rc=$?
    [ "$rc" -eq 2 ] || fail "'flashattn $*' exited $rc, expected 2"
    echo "$msg" | grep -q -- "$word" || fail "'flashattn $*' message does not name '$word': $msg"
}
expect_usage "command" bogus
expect_usage "--d" bench --d 0
expect_usage "--d" bench --d 64,,128
expect_usage "--algo" bench --algo flash9
expect_usage "--seqlen" bench --seqlen
expect_usage "--seqlen" bench --seqlen abc
expect_usage "--dtype" bench --dtype f64
expect_usage "--causal" bench --causal 2
expect_usage "--reps" bench --reps 0
expect_usage "--until-ci" bench --until-ci -1
expect_usage "--max-seconds" bench --mode kvcache --max-seconds x
expect_usage "--frobnicate" bench --frobnicate
expect_usage "--mode" bench --mode bogus
expect_usage "--seqlen-k" bench --mode kvcache --seqlen-k 0
expect_usage "--heads-q" bench --mode decode --heads-q 0   # a former spelling: the message names it as given
expect_usage "--algo" bench --mode kvcache --algo flash2
expect_usage "--huge-pages" bench --mode kvcache --huge-pages 2
expect_usage "--d" io --seqlen 64
expect_usage "--seqlen" io --d 64
expect_usage "--sram" io --seqlen 64 --d 64 --sram 1K --block-q 16
expect_usage "--sram" io --seqlen 64 --d 64 --sram lots
expect_usage "--count" check --count -1
expect_usage "--device" check --device tpu
expect_usage "--out" report --out ""
expect_usage "--bogus" report --bogus
# --opt=value is --opt value; a directory that cannot be created is an argument error like the others
expect_usage "--d" bench --d=0
expect_usage "--seqlen" bench --seqlen=abc
expect_usage "--out" report --out "$TMP/missing/dir" --quick
"$BIN" bench --d=16 --seqlen=16 --tokens=32 --heads=1 --reps=1 --csv >/dev/null 2>&1 || fail "bench --d=16 (--opt=value) exited $?"
"$BIN" >/dev/null 2>&1; [ $? -eq 2 ] || fail "no command should exit 2"
for c in "" bench check io report; do
    # shellcheck disable=SC2086
    "$BIN" $c --help >/dev/null || fail "flashattn $c --help exited $?"
done
h=$("$BIN" --help)
for w in FLASH3 KV-cache; do echo "$h" | grep -q "$w" || fail "flashattn --help does not mention $w"; done
h=$("$BIN" bench --help)
for w in "--mode attention" "--mode kvcache" "--seqlen-k LIST" "--heads-k LIST" "--page LIST" "--algo LIST"; do
    echo "$h" | grep -q -- "$w" || fail "flashattn bench --help does not list '$w'"
done
"$BIN" bench --mode kvcache --help >/dev/null || fail "bench --mode kvcache --help exited $?"

# --mode kvcache: the attention mode's spellings, and the former ones (--mode decode) give the same rows
kv_new=$("$BIN" bench --mode kvcache --device cpu --dtype f32 --d 16 --batch 2 --seqlen-k 64 --heads 4 --heads-k 2 \
    --seqlen 1,2 --reps 1 --warmup 0 --threads 1 --csv) || fail "bench --mode kvcache exited $?"
kv_old=$("$BIN" bench --mode decode --device cpu --dtype f32 --head-dim 16 --batch 2 --cache 64 --heads-q 4 --heads-k 2 \
    --seqlen-new 1,2 --reps 1 --warmup 0 --threads 1 --csv) || fail "bench --mode decode exited $?"
[ "$(echo "$kv_new" | wc -l)" -eq 3 ] || fail "bench --mode kvcache: expected a header and 2 rows: $kv_new"
echo "$kv_new" | tail -n +2 | grep -q ',ok,' || fail "bench --mode kvcache: no ok row: $kv_new"
[ "$(echo "$kv_new" | cut -d, -f1-11)" = "$(echo "$kv_old" | cut -d, -f1-11)" ] ||
    fail "--mode decode with the former flags differs from --mode kvcache: $kv_old vs $kv_new"
# --huge-pages 1: the same row in huge-page buffers, its last column 1
kv_huge=$("$BIN" bench --mode kvcache --device cpu --dtype f32 --d 16 --batch 2 --seqlen-k 64 --heads 4 --heads-k 2 \
    --reps 1 --warmup 0 --threads 1 --huge-pages 1 --csv) || fail "bench --mode kvcache --huge-pages 1 exited $?"
echo "$kv_huge" | tail -n +2 | grep -q ',ok,.*,1$' || fail "bench --mode kvcache --huge-pages 1: no ok row ending in 1: $kv_huge"

hdr=$("$BIN" bench --seqlen 32 --tokens 64 --heads 2 --d 16 --reps 2 --csv | head -1)
[ "$hdr" = "device,algo,dtype,batch,heads,seqlen_q,seqlen_k,head_dim,causal,pass,ms,gflops,peak_extra_mb,slow_read_mb,slow_write_mb,head_dim_v,sinks" ] ||
    fail "CSV header: $hdr"
# --sinks 0,1: every algorithm without and with sinks (interleaved, one group), forward and backward (d_sinks);
# --dv: v's own head dim, its FLOPs 2·(d + dv) per pair (16 x 16 pairs, 2 heads: 2·(16 + 8)·2·256)
out=$("$BIN" bench --seqlen 16 --tokens 16 --heads 2 --d 16 --dv 8,16 --sinks 0,1 --pass fwd,bwd --reps 2 --csv) ||
    fail "bench --sinks --dv exited $?"
[ "$(echo "$out" | tail -n +2 | wc -l)" -eq 24 ] && ! echo "$out" | grep -q ',skip,\|,oom,\|,error,' ||
    fail "bench --sinks 0,1 --dv 8,16 --pass fwd,bwd: expected 24 measured rows: $out"
[ "$(echo "$out" | awk -F, 'NR > 1 && $16 == 8 && $17 == 1' | wc -l)" -eq 6 ] ||
    fail "bench --sinks --dv: columns head_dim_v, sinks: $out"
out=$("$BIN" bench --seqlen 16 --tokens 16 --heads 2 --d 16 --dv 8 --algo flash2 --reps 1 --json) ||
    fail "bench --dv --json exited $?"
echo "$out" | grep -q '"flops": 24576,' || fail "bench --dv 8: FLOPs are not 2*(d+dv) per pair: $out"
echo "$out" | grep -q '"head_dim_v": 8, "sinks": 0' || fail "bench --json: no head_dim_v/sinks: $out"
rows=$("$BIN" bench --seqlen 32,48 --tokens 96 --heads 2 --d 16 --causal 0,1 --pass fwd,bwd --dtype f32,bf16 --reps 2 --csv | tail -n +2 | wc -l)
[ "$rows" -eq 48 ] || fail "product of lists gave $rows rows, expected 48"
out=$("$BIN" bench --seqlen 4096 --tokens 4096 --heads 1 --d 64 --mem-limit 1 --csv 2>/dev/null); rc=$?
[ "$rc" -eq 1 ] || fail "bench over --mem-limit exited $rc, expected 1"
echo "$out" | grep -q ',oom,' || fail "no oom row: $out"
out=$("$BIN" bench --seqlen 64 --tokens 64 --heads 3 --gqa 2 --d 16 --reps 2 --csv 2>/dev/null)
echo "$out" | grep -q ',skip,' || fail "no skip row for --gqa 2 with 3 heads: $out"
out=$("$BIN" bench --peak --algo flash2 --seqlen 32 --tokens 64 --heads 2 --d 16 --reps 2) || fail "bench --peak exited $?"
# positive, not >= 1: a Debug sanitizer build on loaded cores measures well under 1 GFLOP/s
echo "$out" | grep -Eq 'peak \(cpu.*fp32 micro-kernel ([1-9][0-9.]*|0\.[0-9]*[1-9][0-9]*) GFLOP/s' ||
    fail "bench --peak: no positive fp32 peak: $out"
echo "$out" | grep -q '% peak' || fail "bench --peak: no % peak column: $out"

# --until-ci: at least --reps, more while a median's 95 % interval is wider, at most 64 (the reps column says how many)
out=$("$BIN" bench --seqlen 32 --tokens 64 --heads 2 --d 16 --reps 3 --until-ci 0.001 --max-seconds 30 --json) ||
    fail "bench --until-ci exited $?"
echo "$out" | grep -q '"reps": 64,' || fail "bench --until-ci 0.001: expected 64 repetitions: $out"
echo "$out" | grep -q '"ms_ci_lo"' || fail "bench --json: no ms_ci_lo: $out"
# a spent --max-seconds stops it after the --reps (a time budget, not the interval: one preempted call of a busy
# machine can widen any interval)
out=$("$BIN" bench --seqlen 32 --tokens 64 --heads 2 --d 16 --reps 3 --until-ci 0.001 --max-seconds 0.000001 --json)
echo "$out" | grep -q '"reps": 3,' || fail "bench --max-seconds: expected the 3 --reps: $out"
# FA_CPU_ISA names a level or fails: never a silent fallback
out=$(FA_CPU_ISA=avx512 "$BIN" bench --seqlen 32 --tokens 64 --heads 2 --d 16 --reps 1 2>&1); rc=$?
[ "$rc" -eq 1 ] && echo "$out" | grep -q 'FA_CPU_ISA=avx512 is not a CPU kernel level' ||
    fail "bench with FA_CPU_ISA=avx512: exit $rc, $out"
"$BIN" bench --seqlen 32 --tokens 64 --heads 2 --d 16 --reps 1 | grep -q 'kernels [a-z0-9]*: ' ||
    fail "bench does not name the kernel level and why"

"$BIN" io --seqlen 64 --d 16 --sram 8K >/dev/null || fail "io --sram 8K exited $?"
"$BIN" io --seqlen 1024 --d 64 --csv >"$TMP/io.csv" || fail "io exited $?"
awk -F, 'NR > 1 { t[$1] = $13 } END { if (!(t["standard"] > t["flash1"] && t["flash1"] > t["flash2"])) exit 1 }' "$TMP/io.csv" ||
    fail "io: expected STANDARD > FLASH1 > FLASH2 bytes: $(cat "$TMP/io.csv")"
"$BIN" check --count 30 --seed 7 >"$TMP/check.txt" || { cat "$TMP/check.txt"; fail "check --count 30 failed"; }
echo "PASS"
