#!/bin/sh
# A failure on some ranks only (a tensor only pipeline stage 1 reads has the wrong shape)
# ends every rank within seconds, non-zero, with the failing ranks naming the tensor, in a
# dry run and in a real one. And a config.json that implies smaller tensors than the file
# holds (every slice would fit inside them) is refused before anything is computed; one
# with fewer layers than the file runs, with one warning naming the first unused tensor
# (as transformers warns), and a model whose every tensor is used gets none.
. "$top_srcdir/tests/lib.sh"
[ "$PYTHON3" != no ] || skip "python3 not found"
"$PYTHON3" "$top_srcdir/tests/gen_tiny_model.py" "$TMP/m" || fail "gen_tiny_model.py"
# Swap the two dims of a layer-3 weight: the file stays valid, the shape does not fit.
"$PYTHON3" "$top_srcdir/tests/swap_tensor_shape.py" "$TMP/m/model.safetensors" model.layers.3.mlp.down_proj.weight ||
    fail "rewriting the header"
start=$(date +%s)
expect_fail 1 "model.layers.3.mlp.down_proj.weight" mpi 4 "$TPINFER" --model "$TMP/m" --dry-run --tp 2 --pp 2
elapsed=$(( $(date +%s) - start ))
[ $elapsed -le 30 ] || fail "took ${elapsed}s to end the job"
grep -q "tpinfer\[2/4" "$TMP/err" && grep -q "tpinfer\[3/4" "$TMP/err" || fail "stage-1 ranks did not report"
grep "down_proj" "$TMP/err" | grep -q "tpinfer\[[01]/4" && fail "stage-0 ranks reported an error they did not have"
grep -q "rank 2 (tp 0, pp 1)\|128 x 64\|64 x 128" "$TMP/err" || fail "message lacks the shapes"
printf 'Once upon a time\n' >"$TMP/p.txt"
expect_fail 1 "model.layers.3.mlp.down_proj.weight has 2-D shape" mpi 4 "$TPINFER" --model "$TMP/m" --tp 2 --pp 2 \
    --input "$TMP/p.txt" --output "$TMP/out.jsonl" --max-tokens 2
# intermediate_size 64 on weights of 128 (gen_tiny_model.py's): the slices [0, 64) would fit
"$PYTHON3" "$top_srcdir/tests/gen_tiny_model.py" "$TMP/small" || fail "gen_tiny_model.py"
"$PYTHON3" - "$TMP/small/config.json" <<'PY' || fail "editing config.json"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["intermediate_size"] > 64, c["intermediate_size"]
c["intermediate_size"] = 64
json.dump(c, open(sys.argv[1], "w"))
PY
expect_fail 1 "but config.json implies 2-D 64 x" "$TPINFER" --model "$TMP/small" --input "$TMP/p.txt" \
    --output "$TMP/small.jsonl" --max-tokens 2
grep -q '"text"' "$TMP/small.jsonl" 2>/dev/null && fail "a completion was written from the wrong tensors"
"$PYTHON3" "$top_srcdir/tests/gen_tiny_model.py" "$TMP/biases" --attention-bias --mlp-bias || fail "gen_tiny_model.py"
mpi 2 "$TPINFER" --model "$TMP/biases" --tp 2 --input "$TMP/p.txt" --output "$TMP/biases.jsonl" --max-tokens 2 \
    2>"$TMP/err" || { cat "$TMP/err"; fail "the model with biases"; }
grep -q "not used by its config.json" "$TMP/err" && { cat "$TMP/err"; fail "a warning of unused tensors where all are used"; }
"$PYTHON3" - "$TMP/biases/config.json" <<'PY' || fail "editing config.json"
import json, sys
c = json.load(open(sys.argv[1]))
c["num_hidden_layers"] -= 1
json.dump(c, open(sys.argv[1], "w"))
PY
layer=$(( $("$PYTHON3" -c 'import json, sys; print(json.load(open(sys.argv[1]))["num_hidden_layers"])' \
    "$TMP/biases/config.json") ))
mpi 2 "$TPINFER" --model "$TMP/biases" --tp 2 --input "$TMP/p.txt" --output "$TMP/fewer.jsonl" --max-tokens 2 \
    2>"$TMP/err" || { cat "$TMP/err"; fail "fewer layers than the file: not run"; }
[ "$(grep -c "tensor(s) of .* are not used by its config.json (num_hidden_layers $layer), the first model.layers.$layer\." \
    "$TMP/err")" -eq 1 ] || { cat "$TMP/err"; fail "no single warning naming the unused layer"; }
exit 0
