#!/bin/sh
# Bad flags: one line from rank 0 naming the flag, exit 2 on every rank, nobody left
# waiting; --help and --version exit 0.
. "$top_srcdir/tests/lib.sh"

"$TPINFER" --help >"$TMP/help" || fail "--help exited $?"
grep -q -- "--tensor-parallel-size, --tp N" "$TMP/help" || fail "--help lacks --tp"
grep -q "(default: 1)" "$TMP/help" || fail "--help shows no defaults"
"$TPINFER" --version | grep -q "^tpinfer [0-9]" || fail "--version"

expect_fail 2 "--tp: '2x' is not allowed" "$TPINFER" --model m --dry-run --tp 2x
expect_fail 2 "--tp: '0' is not allowed" "$TPINFER" --model m --dry-run --tp 0
expect_fail 2 "--max-num-seqs: '99999999999999999999' is not allowed" \
    "$TPINFER" --model m --dry-run --max-num-seqs 99999999999999999999
expect_fail 2 "unknown option '--bogus'" "$TPINFER" --model m --bogus
expect_fail 2 "needs a value" "$TPINFER" --model
expect_fail 2 "--model is required" "$TPINFER" --dry-run
expect_fail 2 "--input is required" "$TPINFER" --model m
expect_fail 2 "--gpu-memory-utilization: '2' is not allowed" "$TPINFER" --model m --dry-run --gpu-memory-utilization 2
expect_fail 2 "--dtype: 'fp8'" "$TPINFER" --model m --dry-run --dtype fp8

# Under mpirun: every rank exits 2, only rank 0 speaks.
expect_fail 2 "--pp: '-1' is not allowed" mpi 3 "$TPINFER" --model m --dry-run --pp -1
n=$(grep -c "is not allowed" "$TMP/err")
[ "$n" -eq 1 ] || fail "expected one error line from 3 ranks, got $n"
mpi 2 "$TPINFER" --help >"$TMP/help2" || fail "--help under mpirun"
[ "$(grep -c '^Usage:' "$TMP/help2")" -eq 1 ] || fail "--help printed by more than rank 0"

# A world that the grid cannot use is a usage error, said once.
expect_fail 2 "start a multiple of 2 ranks" mpi 3 "$TPINFER" --model m --dry-run --tp 2
[ "$(grep -c 'multiple of 2' "$TMP/err")" -eq 1 ] || fail "grid error said more than once"
expect_fail 2 "needs 4 ranks but 2 were started" mpi 2 "$TPINFER" --model m --dry-run --tp 2 --pp 2
exit 0
