#!/bin/sh
# Model directories with a file missing or files that do not belong together: --model
# naming a file or nothing, or a directory without config.json or tokenizer.json, or a checkpoint
# without a tensor the architecture needs, is one clear error
# before any output is made; a config.json that implies smaller tensors than
# the file holds (every slice would fit inside them) is refused before anything is
# computed; one with fewer layers than the file runs, with one warning naming the first
# unused tensor (as transformers warns), and a model whose every tensor is used gets none;
# a tokenizer whose ids pass the model's vocab_size fails those requests (an error record
# saying so, the others done), never embeds zeros; weights holding NaN end the job with
# exit 1 (not 2, a usage error) and a message that says what to do; ranks whose copies of the
# model differ (weights of the same shapes, config, tokenizer) stop before any output, saying
# which part differs.
. "$top_srcdir/tests/lib.sh"
[ "$PYTHON3" != no ] || skip "python3 not found"
printf 'Once upon a time\n' >"$TMP/p.txt"
expect_fail 1 "--model $TMP/p.txt is not a directory (give a Hugging Face model directory" "$TPINFER" \
    --model "$TMP/p.txt" --input "$TMP/p.txt" --output "$TMP/o.jsonl"
expect_fail 1 "--model $TMP/none: No such file or directory (give a Hugging Face model directory" "$TPINFER" \
    --model "$TMP/none" --input "$TMP/p.txt" --output "$TMP/o.jsonl"
"$PYTHON3" "$top_srcdir/tests/gen_tiny_model.py" "$TMP/notok" || fail "gen_tiny_model.py"
rm "$TMP/notok/tokenizer.json"
expect_fail 1 "tokenizer.json: No such file or directory (the model directory needs a Hugging Face tokenizer.json)" \
    "$TPINFER" --model "$TMP/notok" --input "$TMP/p.txt" --output "$TMP/o.jsonl"
[ -e "$TMP/o.jsonl" ] && fail "a refused run left an output behind"
# a directory without config.json says what to give
mkdir -p "$TMP/empty"
expect_fail 1 "--model $TMP/empty has no config.json: give the directory of a Hugging Face model as downloaded" \
    "$TPINFER" --model "$TMP/empty" --input "$TMP/p.txt" --output "$TMP/o.jsonl"
[ -e "$TMP/o.jsonl" ] && fail "a refused run left an output behind"
# a tokenizer.json holding a lone UTF-16 surrogate (not JSON that any parser accepts) is refused,
# naming the file and the place, before any output is made
"$PYTHON3" "$top_srcdir/tests/gen_tiny_model.py" "$TMP/surrogate" || fail "gen_tiny_model.py"
"$PYTHON3" - "$TMP/surrogate/tokenizer.json" <<'PY' || fail "editing tokenizer.json"
import sys
s = open(sys.argv[1]).read()
j = s.index("{", s.index('"vocab"')) + 1
open(sys.argv[1], "w").write(s[:j] + '"\\ud800x": 999999,' + s[j:])
PY
expect_fail 1 "tokenizer.json: invalid JSON at line" "$TPINFER" --model "$TMP/surrogate" --input "$TMP/p.txt" \
    --output "$TMP/o.jsonl"
grep -q "invalid Unicode" "$TMP/err" || { cat "$TMP/err"; fail "the message does not say what is wrong in tokenizer.json"; }
[ -e "$TMP/o.jsonl" ] && fail "a refused run left an output behind"
# a tensor config.json's architecture needs is missing (renamed in the header, its length kept):
# exit 1, naming it and what to check
"$PYTHON3" "$top_srcdir/tests/gen_tiny_model.py" "$TMP/lacks" || fail "gen_tiny_model.py"
"$PYTHON3" - "$TMP/lacks/model.safetensors" <<'PY' || fail "renaming a tensor"
import struct, sys
with open(sys.argv[1], "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = f.read(n)
    old = b"model.layers.0.mlp.up_proj.weight"
    assert old in h
    f.seek(8)
    f.write(h.replace(old, b"model.layers.0.mlp.up_prOj.weight", 1))
PY
expect_fail 1 'the model has no tensor "model.layers.0.mlp.up_proj.weight", which config.json'"'"'s architecture needs: a shard missing' \
    "$TPINFER" --model "$TMP/lacks" --input "$TMP/p.txt" --output "$TMP/lacks.jsonl"
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
expect_fail 4 "1 request(s) failed" "$TPINFER" --model "$TMP/v272" --input "$TMP/in.jsonl" --output "$TMP/v.jsonl" \
    --max-tokens 3 --status-file "$TMP/v.status"
# exit 4 (1 is a fatal error); the status file says the same
grep -q '"status": "completed"' "$TMP/v.status" && grep -q '"failed": 1' "$TMP/v.status" ||
    { cat "$TMP/v.status"; fail "the status file of a run with a failed request"; }
grep '"id":"text"' "$TMP/v.jsonl" | grep '"invalid_request"' |
    grep -q "beyond the model's embedding (config.json's vocab_size 272): a token added to tokenizer.json" ||
    { cat "$TMP/v.jsonl"; fail "no error record saying why for the text prompt"; }
for id in ids bytes; do
    grep "\"id\":\"$id\"" "$TMP/v.jsonl" | grep -q '"completion_tokens":3' ||
        { cat "$TMP/v.jsonl"; fail "request $id was not completed"; }
done
# NaN in the final norm's weights: every logit is NaN (greedy on the device's argmax, and sampled)
"$PYTHON3" "$top_srcdir/tests/gen_tiny_model.py" "$TMP/nan" || fail "gen_tiny_model.py"
"$PYTHON3" - "$TMP/nan/model.safetensors" <<'PY' || fail "writing NaN into model.norm.weight"
import json, struct, sys
with open(sys.argv[1], "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    t = json.loads(f.read(n))["model.norm.weight"]
    size = {"F32": 4, "BF16": 2, "F16": 2}[t["dtype"]]
    nan = {"F32": b"\x00\x00\xc0\x7f", "BF16": b"\xc0\x7f", "F16": b"\x00\x7e"}[t["dtype"]]
    begin, end = t["data_offsets"]
    f.seek(8 + n + begin)
    f.write(nan * ((end - begin) // size))
PY
for temp in 0 0.8; do
    rm -f "$TMP/nan.jsonl"*
    expect_fail 1 "of logits has NaN" "$TPINFER" --model "$TMP/nan" --input "$TMP/p.txt" --output "$TMP/nan.jsonl" \
        --max-tokens 2 --temperature $temp --status-file "$TMP/nan.status"
    grep -q '"status": "failed"' "$TMP/nan.status" || { cat "$TMP/nan.status"; fail "the status file of a fatal error"; }
    grep -q "the model computed NaN or Inf: its weights may hold such values.*(--dtype bfloat16 or float32))" "$TMP/err" ||
        { cat "$TMP/err"; fail "temperature $temp: the NaN failure does not say what to do"; }
done
# ranks whose copies of the model differ (a node's own stale copy): each part named, before
# any output; copies alike in another directory run
[ -n "${MPIRUN:-}" ] && [ "$MPIRUN" != no ] || exit 0
"$PYTHON3" "$top_srcdir/tests/gen_tiny_model.py" "$TMP/r0" || fail "gen_tiny_model.py"
for v in same weights config tokenizer template; do cp -r "$TMP/r0" "$TMP/r$v"; done
printf '{{ messages }}' >"$TMP/rtemplate/chat_template.jinja" # a chat template the other copy lacks
"$PYTHON3" - "$TMP" <<'PY' || fail "making the differing copies"
import json, struct, sys
t = sys.argv[1]
with open(t + "/rweights/model.safetensors", "r+b") as f:  # the same shapes, other values
    d = bytearray(f.read())
    n = struct.unpack("<Q", d[:8])[0]
    for i in range(8 + n, len(d), 2):
        d[i] ^= 1
    f.seek(0)
    f.write(d)
c = json.load(open(t + "/rconfig/config.json"))
c["num_hidden_layers"] -= 1
json.dump(c, open(t + "/rconfig/config.json", "w"))
with open(t + "/rtokenizer/tokenizer_config.json", "a") as f:
    f.write("\n")
PY
# pair OTHER: rank 0 on r0, rank 1 on rOTHER, --tp 2
pair() {
    rm -f "$TMP/pair.jsonl"*
    mpi 1 "$TPINFER" --model "$TMP/r0" --backend cpu --tp 2 --input "$TMP/p.txt" --output "$TMP/pair.jsonl" \
        --max-tokens 2 : -np 1 "$TPINFER" --model "$TMP/r$1" --backend cpu --tp 2 --input "$TMP/p.txt" \
        --output "$TMP/pair.jsonl" --max-tokens 2 >"$TMP/pair.out" 2>"$TMP/err"
}
pair same || { cat "$TMP/err"; fail "two ranks on copies alike"; }
for v in weights:"weights (safetensors)" config:"config.json / generation_config.json" \
    tokenizer:"tokenizer.json / tokenizer_config.json / chat templates" \
    template:"tokenizer.json / tokenizer_config.json / chat templates"; do
    rc=0
    pair "${v%%:*}" || rc=$?
    [ $rc -eq 2 ] || { cat "$TMP/err"; fail "copies of other ${v%%:*}: exit $rc, wanted 2"; }
    grep -q "rank 1 reads another model in $TMP/r${v%%:*} than rank 0 does: its ${v#*:} differ" "$TMP/err" ||
        { cat "$TMP/err"; fail "copies of other ${v%%:*}: the message"; }
    [ ! -e "$TMP/pair.jsonl" ] || fail "copies of other ${v%%:*}: an output was made"
done
exit 0
