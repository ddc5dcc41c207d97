#!/bin/sh
# Model files that do not belong together: a config.json that implies smaller tensors than
# the file holds (every slice would fit inside them) is refused before anything is
# computed; one with fewer layers than the file runs, with one warning naming the first
# unused tensor (as transformers warns), and a model whose every tensor is used gets none;
# a tokenizer whose ids pass the model's vocab_size fails those requests (an error record
# saying so, the others done), never embeds zeros.
. "$top_srcdir/tests/lib.sh"
[ "$PYTHON3" != no ] || skip "python3 not found"
printf 'Once upon a time\n' >"$TMP/p.txt"
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

# the generated tokenizer has 306 ids (256 bytes, 2 specials, 48 merges); a model of 272
"$PYTHON3" "$top_srcdir/tests/gen_tiny_model.py" "$TMP/v272" --vocab 272 || fail "gen_tiny_model.py --vocab 272"
cat >"$TMP/in.jsonl" <<'JSONL'
{"id": "text", "prompt": "the cat sat on the mat and the dog"}
{"id": "ids", "prompt_token_ids": [1, 100, 200, 255], "max_tokens": 3}
{"id": "bytes", "prompt": "\u00ff\u00fe", "max_tokens": 3}
JSONL
expect_fail 1 "1 request(s) failed" "$TPINFER" --model "$TMP/v272" --input "$TMP/in.jsonl" --output "$TMP/v.jsonl" \
    --max-tokens 3
grep '"id":"text"' "$TMP/v.jsonl" | grep '"invalid_request"' |
    grep -q "outside the model's vocabulary of 272 (config.json's vocab_size): tokenizer.json does not belong" ||
    { cat "$TMP/v.jsonl"; fail "no error record saying why for the text prompt"; }
for id in ids bytes; do
    grep "\"id\":\"$id\"" "$TMP/v.jsonl" | grep -q '"completion_tokens":3' ||
        { cat "$TMP/v.jsonl"; fail "request $id was not completed"; }
done
exit 0
