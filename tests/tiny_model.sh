#!/bin/sh
# The model a fresh clone generates (float32 single file, bfloat16 in 3 shards) passes
# the dry run at every grid of 1, 2 and 4 ranks; no ../shared needed.
. "$top_srcdir/tests/lib.sh"
[ "$PYTHON3" != no ] || skip "python3 not found"
"$PYTHON3" "$top_srcdir/tests/gen_tiny_model.py" "$TMP/f32" || fail "gen f32"
"$PYTHON3" "$top_srcdir/tests/gen_tiny_model.py" "$TMP/bf16" --dtype bfloat16 --shards 3 || fail "gen bf16"
cmp -s "$TMP/f32/tokenizer.json" "$TMP/bf16/tokenizer.json" || fail "generator not deterministic"
"$TPINFER" --model "$TMP/f32" --dry-run >"$TMP/a" || fail "dry-run f32"
"$TPINFER" --model "$TMP/bf16" --dry-run >"$TMP/b" || fail "dry-run bf16 shards"
grep -q "3 file(s)" "$TMP/b" || fail "sharded model not read through its index"
for grid in "1 1" "2 1" "1 2" "2 2" "4 1" "1 4"; do
    set -- $grid
    mpi $(($1 * $2)) "$TPINFER" --model "$TMP/bf16" --dry-run --tp "$1" --pp "$2" >"$TMP/g" 2>"$TMP/e" ||
        { cat "$TMP/e"; fail "dry-run tp $1 pp $2"; }
    grep -q "world $(($1 * $2)) = dp 1 x pp $2 x tp $1" "$TMP/g" || fail "grid tp $1 pp $2"
done
exit 0
