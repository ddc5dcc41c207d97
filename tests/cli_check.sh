#!/bin/sh
# tpinfer --check under mpirun on the CPU backend (MPI all-reduce on host buffers): rank
# lines in order, one sweep table per TP group with the sizes asked for, no wrong
# elements, a bus bandwidth; --tp 1 skips the sweep; a bad --check-max-bytes is a usage
# error. Needs no model.
. "$top_srcdir/tests/lib.sh"

run() { np=$1; shift; mpi "$np" "$TPINFER" --check "$@" >"$TMP/out" 2>"$TMP/err" ||
    { cat "$TMP/err" "$TMP/out"; fail "--check -np $np $*"; }; }

run 4 --tp 2 --backend cpu --check-max-bytes 64KiB
[ "$(grep '^rank ' "$TMP/out" | cut -d: -f1 | tr -d '\n')" = "rank 0rank 1rank 2rank 3" ] ||
    { cat "$TMP/out"; fail "rank lines missing or out of order"; }
grep -q "^rank 2: dp 1/2  pp 0/1  tp 0/2  host " "$TMP/out" || fail "rank 2's grid place"
grep -q "world 4 = dp 2 x pp 1 x tp 2" "$TMP/out" || fail "header line"
[ "$(grep -c '^TP group [0-9]* (dp [0-9]*, pp [0-9]*; world ranks' "$TMP/out")" -eq 2 ] ||
    { cat "$TMP/out"; fail "not two TP group tables"; }
grep -q "^TP group 1 (dp 1, pp 0; world ranks 2-3)" "$TMP/out" || fail "TP group 1's table"
# the table rows: size count type iters time algbw busbw #wrong
awk '$3 == "float" && NF == 8' "$TMP/out" >"$TMP/rows"
[ "$(wc -l <"$TMP/rows")" -eq 10 ] || { cat "$TMP/out"; fail "not 5 sizes x 2 groups"; }
for g in 1 2; do
    [ "$(awk -v g=$g 'NR > (g - 1) * 5 && NR <= g * 5 { printf "%s ", $1 }' "$TMP/rows")" = \
        "4096 8192 16384 32768 65536 " ] || { cat "$TMP/rows"; fail "sizes of table $g"; }
done
# (a loaded machine can make the smallest sizes print a bandwidth of 0.00: the largest must not)
awk '$2 * 4 != $1 || $8 != 0 || !($7 >= 0) || !($5 > 0) { bad = 1 } $1 == 65536 && !($7 > 0) { bad = 1 }
     END { exit bad }' "$TMP/rows" ||
    { cat "$TMP/rows"; fail "a row with wrong elements, no time or no bus bandwidth"; }
grep -q "^check: OK" "$TMP/out" || { cat "$TMP/out"; fail "no 'check: OK'"; }

# --tp 1: nothing to all-reduce
run 2 --tp 1 --backend cpu
grep -q "All-reduce sweep skipped" "$TMP/out" || { cat "$TMP/out"; fail "--tp 1 does not say the sweep is skipped"; }
awk '$3 == "float"' "$TMP/out" | grep -q . && fail "--tp 1 printed a sweep"
[ "$(grep -c '^rank ' "$TMP/out")" -eq 2 ] || fail "--tp 1: rank lines"

# --pp with --tp: one group per (dp, pp) place; a size that is not a power of two stops
# the doubling below it
run 4 --tp 2 --pp 2 --backend cpu --check-max-bytes 10000
grep -q "^TP group 1 (dp 0, pp 1; world ranks 2-3)" "$TMP/out" || { cat "$TMP/out"; fail "--pp 2 groups"; }
[ "$(awk '$3 == "float" { print $1 }' "$TMP/out" | sort -un | tr '\n' ' ')" = "4096 8192 " ] ||
    { cat "$TMP/out"; fail "--check-max-bytes 10000 sizes"; }

# usage errors: one line, exit 2, no model needed
expect_fail 2 "--check-max-bytes: '12x' is not allowed" "$TPINFER" --check --check-max-bytes 12x
expect_fail 2 "--check-max-bytes: '100' is not allowed" "$TPINFER" --check --check-max-bytes 100
[ "$(wc -l <"$TMP/err")" -eq 1 ] || { cat "$TMP/err"; fail "the usage error is not one line"; }
expect_fail 2 "--check-max-bytes: the value is empty" "$TPINFER" --check --check-max-bytes=
expect_fail 2 "start a multiple of 2 ranks" mpi 3 "$TPINFER" --check --tp 2 --backend cpu
exit 0
