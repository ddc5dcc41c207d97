#!/bin/sh
# --dry-run under mpirun over the grids the issue names: rank reports in order, layers
# split contiguously, totals; a shape the grid cannot split is one clear error.
. "$top_srcdir/tests/lib.sh"
need_shared
m="$MODELS/tiny-llama3"

run() { np=$1; shift; mpi "$np" "$TPINFER" --model "$m" --dry-run "$@" >"$TMP/out" 2>"$TMP/err" ||
    { cat "$TMP/err"; fail "dry-run -np $np $*"; }; }

run 4 --tp 2 --pp 2
for r in 0 1 2 3; do grep -q "^rank $r: " "$TMP/out" || fail "no report of rank $r"; done
[ "$(grep '^rank ' "$TMP/out" | cut -d: -f1 | tr -d '\n')" = "rank 0rank 1rank 2rank 3" ] || fail "reports out of order"
grep -A1 "^rank 0: dp 0/1  pp 0/2  tp 0/2" "$TMP/out" | grep -q "layers      \[0, 2)  + embedding" || fail "rank 0 layers"
grep -A1 "^rank 3: dp 0/1  pp 1/2  tp 1/2" "$TMP/out" | grep -q "layers      \[2, 4)  + final norm, LM head" || fail "rank 3 layers"
grep -q "world 4 = dp 1 x pp 2 x tp 2" "$TMP/out" || fail "totals line"

# tiny-llama3 has 2 KV heads: at tp 4 each is held by two ranks
run 4 --tp 4
grep -A2 "^rank 3: " "$TMP/out" | grep -q "KV heads \[1, 2) (replicated)" || fail "KV replication at tp 4"

# dp 2 x tp 2: each replica reads the same bytes
run 4 --tp 2
t4=$(sed -n 's/.*weights read by all ranks: .*(\([0-9]*\) bytes).*/\1/p' "$TMP/out")
run 2 --tp 2
t2=$(sed -n 's/.*weights read by all ranks: .*(\([0-9]*\) bytes).*/\1/p' "$TMP/out")
[ "$t4" -eq $((2 * t2)) ] || fail "dp 2 reads $t4 bytes, not twice $t2"

# heads 8 over --tp 3: every rank fails the same way, rank 0 says it once
expect_fail 2 "not divisible by --tp 3" mpi 3 "$TPINFER" --model "$m" --dry-run --tp 3
[ "$(grep -c 'divisible' "$TMP/err")" -eq 1 ] || fail "shape error said more than once"
# more stages than layers (tiny-llama3 has 4)
expect_fail 2 "--pp 5" mpi 5 "$TPINFER" --model "$m" --dry-run --pp 5
exit 0
