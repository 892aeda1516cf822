#!/bin/sh
# The report's numbers are those of `flashattn bench` / `flashattn io` for the same settings:
# runs `flashattn report --smoke`, re-runs every command of its reproduce.txt with --csv, and compares row by row:
# configuration columns and counted bytes (slow_read_mb, slow_write_mb, peak_extra_mb; all io columns) exactly,
# times within timing noise (a factor of 5 plus 25 ms, up to 3 tries; one thread, so a busy machine's descheduled
# OpenMP threads do not stall the calls). Also: >= 4 PNGs when gnuplot is
# installed, and a complete report with tables when plots are off.
# usage: test_report.sh path/to/flashattn WORKDIR
set -u
# under AddressSanitizer a too-large allocation must return NULL (the library then reports FA_ERR_OUT_OF_MEMORY)
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1"
# one thread everywhere (our calls use --threads 1; this keeps BLAS inside STANDARD from starting its own team)
export OMP_NUM_THREADS=1
BIN=$1
OUT=$2
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$OUT" && mkdir -p "$OUT" || fail "cannot create $OUT"

"$BIN" report --smoke --threads 1 --out "$OUT/r" >"$OUT/summary.txt" 2>"$OUT/progress.txt" || fail "report exited $?"
R="$OUT/r"
test -s "$R/index.md" || fail "no index.md"
grep -q '^## Claims' "$R/index.md" || fail "no claims table"
grep -q 'holds\|does not hold\|depends\|partly' "$R/index.md" || fail "no verdicts"
# every verdict is one of the kinds, and the measured ones carry their 95 % interval
awk '/^\| # \| claim/ { t = 1; next } t && !/^\|/ { t = 0 } t && /^\| [0-9]/' "$R/index.md" >"$OUT/claims.md"
n_claims=$(wc -l <"$OUT/claims.md")
n_kinds=$(grep -c '| \*\*\(holds here\|does not hold here\|depends\|partly\|not settled\)\*\*\|| not measured' "$OUT/claims.md")
[ "$n_claims" -gt 0 ] && [ "$n_claims" -eq "$n_kinds" ] || fail "$n_kinds of $n_claims claims have a verdict kind"
grep -q '95 % interval' "$R/index.md" || fail "no 95 % intervals in the claims"
test -s "$R/reproduce.txt" || fail "no reproduce.txt"

grep -v '^#' "$R/reproduce.txt" | cut -f1 | sort -u >"$OUT/csvs"
while read -r csv; do
    grep -v '^#' "$R/reproduce.txt" | awk -F'\t' -v c="$csv" '$1 == c { print $2 }' >"$OUT/$csv.cmds"
    tail -n +2 "$R/$csv" >"$OUT/$csv.report"
    a=$(wc -l <"$OUT/$csv.report")
    [ "$a" -gt 0 ] || fail "$csv: no rows"
    # times may differ by noise: up to 3 runs of the commands; anything else must match on the first
    attempt=1
    while :; do
        : >"$OUT/$csv.again"
        while read -r args; do
            # shellcheck disable=SC2086
            "$BIN" $args --csv 2>/dev/null | tail -n +2 >>"$OUT/$csv.again"
        done <"$OUT/$csv.cmds"
        b=$(wc -l <"$OUT/$csv.again")
        [ "$a" -eq "$b" ] || fail "$csv: report has $a rows, the commands gave $b"
        case "$csv" in
        io_*)
            cmp -s "$OUT/$csv.report" "$OUT/$csv.again" || {
                diff "$OUT/$csv.report" "$OUT/$csv.again" | head
                fail "$csv: io rows differ"
            }
            echo "$csv: $a rows identical"
            break
            ;;
        esac
        # bench columns: configuration 1-10 and counted bytes 13-15 exact, ms (11) within noise or the same status;
        # bench --mode kvcache columns: 1-11 (configuration, kernel) and the status (16) exact, ms (12) within noise
        case "$csv" in
        kvcache_*) same="1 2 3 4 5 6 7 8 9 10 11 16" ms=12 ;;
        *) same="1 2 3 4 5 6 7 8 9 10 13 14 15" ms=11 ;;
        esac
        paste -d'|' "$OUT/$csv.report" "$OUT/$csv.again" | awk -F'|' -v f="$csv" -v same="$same" -v ms="$ms" '
            BEGIN { ns = split(same, cols, " ") }
            {
                n = split($1, r, ","); m = split($2, b, ",");
                for (k = 1; k <= ns; k++) { i = cols[k]; if (r[i] != b[i]) { print f ": row " NR " column " i ": " r[i] " vs " b[i]; bad = 1 } }
                if (r[ms] ~ /^[0-9.]+$/ && b[ms] ~ /^[0-9.]+$/) {
                    x = r[ms] + 0; y = b[ms] + 0;
                    if (x > 5 * y + 25 || y > 5 * x + 25) { print f ": row " NR " ms " x " vs " y " (noise?)"; slow = 1 }
                } else if (r[ms] != b[ms]) { print f ": row " NR " status " r[ms] " vs " b[ms]; bad = 1 }
                rows++
            }
            END { if (bad) exit 1; if (slow) exit 2; print f ": " rows " rows match" }'
        rc=$?
        [ "$rc" -eq 0 ] && break
        [ "$rc" -eq 1 ] && fail "$csv differs from flashattn bench"
        attempt=$((attempt + 1))
        [ "$attempt" -le 3 ] || fail "$csv: times differ beyond noise in 3 runs"
        echo "$csv: timing differs, running the commands again ($attempt/3)"
    done
done <"$OUT/csvs"

if command -v gnuplot >/dev/null 2>&1; then
    n=$(ls "$R"/*.png 2>/dev/null | wc -l)
    [ "$n" -ge 4 ] || fail "only $n PNG plots with gnuplot installed"
    echo "plots: $n PNG"
fi
"$BIN" report --smoke --threads 1 --no-plots --out "$OUT/np" >/dev/null 2>&1 || fail "report --no-plots exited $?"
grep -q 'no plots' "$OUT/np/index.md" || fail "--no-plots report does not say how to get the plots"
grep -q '^| # | claim' "$OUT/np/index.md" || fail "--no-plots report has no claims table"
echo "PASS"
